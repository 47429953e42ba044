"""An export keeps the token ids of the folder a run started from: a tiny Llama 3, Qwen3-MoE, Gemma 2 and Mistral
folder (made by transformers, its tokenizer of the family's shape beside config.json) trains one iteration under
`--init-from-hf`, and `scripts/tools/convert_to_hf.py`'s config.json holds the folder's bos, eos and pad ids and its
generation_config.json; Qwen3-MoE's router_aux_loss_coef is the run's --moe-aux-loss-coeff and is written back.
A run whose tokenizer came without a model writes the ids that tokenizer declares."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.checkpoint.test_hf_folder_is_the_model import RUN
from tests.data.hf_tokenizer_shapes import SHAPES, build_tokenizer_folder

VOCAB, POSITIONS = 640, 32  # room for the metaspace shapes' 256 byte pieces
COMMON = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=POSITIONS, rms_norm_eps=1e-6)
# family -> (config class, model class, tokenizer shape, settings beyond COMMON); ids: {key: a token, or a list}
FOLDERS = {
    "llama3": ("LlamaConfig", "LlamaForCausalLM", "llama3", dict(rope_theta=5e5),
               dict(bos_token_id="<|begin_of_text|>", eos_token_id="<|end_of_text|>", pad_token_id=None)),
    # Qwen3's released ids: bos the <|endoftext|> its tokenizer names no bos_token for, eos a list
    "qwen3_moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM", "gpt2",
                  dict(head_dim=24, moe_intermediate_size=32, num_experts=4, num_experts_per_tok=2, norm_topk_prob=True,
                       router_aux_loss_coef=0.003),
                  dict(bos_token_id="<|endoftext|>", eos_token_id=["<|endoftext|>", "a"], pad_token_id="<|endoftext|>")),
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM", "gemma", dict(head_dim=16, query_pre_attn_scalar=16),
               dict(bos_token_id="<bos>", eos_token_id="<eos>", pad_token_id="<pad>")),
    "mistral": ("MistralConfig", "MistralForCausalLM", "mistral", dict(sliding_window=None),
                dict(bos_token_id="<s>", eos_token_id="</s>", pad_token_id=None)),
}


def hf_folder(path: Path, family: str) -> Path:
    """The family's folder: model.save_pretrained (config.json, generation_config.json, weights) and its tokenizer."""
    import transformers
    from tokenizers import Tokenizer

    config_class, model_class, shape, extra, ids = FOLDERS[family]
    build_tokenizer_folder(path, shape)
    tokenizer = Tokenizer.from_file(str(path / "tokenizer.json"))

    def token_id(token):
        return [token_id(t) for t in token] if isinstance(token, list) else \
            None if token is None else tokenizer.token_to_id(token)
    config = getattr(transformers, config_class)(**COMMON, **extra, **{key: token_id(t) for key, t in ids.items()})
    getattr(transformers, model_class)(config).save_pretrained(str(path))
    return path


def token_ids(folder: Path) -> dict:
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(str(folder))
    return {key: getattr(config, key, None) for key in ("bos_token_id", "eos_token_id", "pad_token_id")}


@pytest.mark.parametrize("family", sorted(FOLDERS))
def test_the_export_writes_the_folders_token_ids_and_generation_config(family, tmp_path):
    import pretrain_gpt
    from scripts.tools import convert_to_hf

    folder = hf_folder(tmp_path / "hf", family)
    source = token_ids(folder)
    assert source["bos_token_id"] is not None and source["eos_token_id"] is not None
    assert pretrain_gpt.main(["--init-from-hf", str(folder), *RUN, "--data-cache-dir", str(tmp_path / "cache"),
                              "--save", str(tmp_path / "ckpt"), "--save-interval", "1"]) == 0
    assert convert_to_hf.main([str(tmp_path / "ckpt"), str(tmp_path / "out")]) == 0
    assert token_ids(tmp_path / "out") == source
    generation = json.loads((tmp_path / "out" / "generation_config.json").read_text())
    assert generation == json.loads((folder / "generation_config.json").read_text())
    if family == "qwen3_moe":  # the folder's coefficient trained the run and is written back
        metadata = json.loads((tmp_path / "ckpt" / "iter_0000001" / "metadata.json").read_text())
        assert metadata["config"]["model"]["moe_aux_loss_coeff"] == 0.003
        assert json.loads((tmp_path / "out" / "config.json").read_text())["router_aux_loss_coef"] == 0.003


def test_a_typed_aux_loss_coefficient_overrides_the_folders_and_says_so(tmp_path):
    from arguments.parser import parse_arguments

    folder = hf_folder(tmp_path / "hf", "qwen3_moe")
    assert parse_arguments(["--init-from-hf", str(folder)]).config.model.moe.aux_loss_coeff == 0.003
    parsed = parse_arguments(["--init-from-hf", str(folder), "--moe-aux-loss-coeff", "0.0"])
    assert parsed.config.model.moe.aux_loss_coeff == 0.0
    assert [note for note in parsed.notes if "--moe-aux-loss-coeff 0.0 on the command line overrides the folder's "
            "--moe-aux-loss-coeff 0.003" in note and "router_aux_loss_coef" in note]


@pytest.mark.parametrize("shape", ["llama3", "gemma", "gpt2"])
def test_a_tokenizer_without_a_model_gives_the_ids_it_declares(shape, tmp_path):
    """A run not started from a folder: config.json's ids are the tokenizer's (a bos_token declared null: none)."""
    from tokenizers import Tokenizer

    from checkpoint.hf.export_ids import tokenizer_ids

    folder = build_tokenizer_folder(tmp_path / "tokenizer", shape)
    vocabulary = Tokenizer.from_file(str(folder / "tokenizer.json")).get_vocab(with_added_tokens=True)
    bos = SHAPES[shape].bos
    assert tokenizer_ids(folder) == {"bos_token_id": vocabulary[bos] if bos else None, "eos_token_id": vocabulary[SHAPES[shape].eos],
                                     "pad_token_id": None}


def test_initializer_range_is_read_and_a_switch_that_is_not_is_named(tmp_path):
    import transformers

    from arguments.parser import parse_arguments

    folder = hf_folder(tmp_path / "hf", "mistral")
    assert parse_arguments(["--init-from-hf", str(folder)]).config.model.init_method_std == 0.02
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "initializer_range": 0.006, "use_cache": False}))
    assert transformers.AutoConfig.from_pretrained(str(folder)).initializer_range == 0.006
    parsed = parse_arguments(["--init-from-hf", str(folder)])
    assert parsed.config.model.init_method_std == 0.006
    assert [note for note in parsed.notes if "use_cache false not read" in note] and \
        not [note for note in parsed.notes if "output_router_logits" in note]
