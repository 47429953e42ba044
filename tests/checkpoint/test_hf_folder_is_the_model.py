"""`--init-from-hf DIR` takes the model from the folder (issue 49): a tiny LlamaForCausalLM and a
GPT2LMHeadModel saved by transformers with no tokenizer train with no shape flag, and iteration 1's loss
equals transformers' loss on the same batch. The folder is read with the flags (arguments/hf_folder.py),
so a flag that disagrees with it is one line before any data work; one that agrees is taken.

The real pair: transformers' `from_pretrained` builds the model from config.json alone, and
Megatron-Bridge's AutoBridge does too (src/megatron/bridge/models/llama/llama_bridge.py,
LlamaBridge.provider_bridge, which also makes the folder's vocab_size the model's whatever the tokenizer).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

import pretrain_gpt
from arguments.config import ConfigError
from arguments.config_sources import FOLDER
from arguments.parser import parse_arguments
from arguments.print_config import format_config
from base.options import setting_value
from data.corpus import default_corpus_documents
from data.tokenizer import load_tokenizer, train_tokenizer
from tests.checkpoint.hf_random import fill_random
from training.late_checks import LATE_CHECKS

VOCAB = 320  # the embedded corpus's BPE is trained to fit it (the folder has no tokenizer)
POSITIONS = 32  # shorter than the tiny preset's 128-token sequence: the sequence is cut to it
RUN = ["--train-iters", "1", "--eval-iters", "0", "--micro-batch-size", "2", "--global-batch-size", "2",
       "--log-interval", "1", "--device", "cpu", "--hidden-dropout", "0", "--attention-dropout", "0"]


def random_weights(model: torch.nn.Module, seed: int) -> None:
    fill_random(model, seed, scale=0.2)


def llama_folder(path: Path) -> Path:
    """GQA with 2 groups, an untied output, no biases, head_dim 24 at hidden 64 (so --kv-channels too)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=24, max_position_embeddings=POSITIONS,
                         rms_norm_eps=1e-6, rope_parameters={"rope_type": "default", "rope_theta": 5e5},
                         tie_word_embeddings=False, bos_token_id=None, eos_token_id=None, pad_token_id=None)
    model = LlamaForCausalLM(config)
    random_weights(model, seed=3)
    model.save_pretrained(str(path))
    return path


def gpt2_folder(path: Path) -> Path:
    """3 layers, an inner size that is not 4h, and exact GeLU (our --activation gelu)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(vocab_size=VOCAB, n_embd=48, n_layer=3, n_head=4, n_inner=80, n_positions=POSITIONS,
                        activation_function="gelu", layer_norm_epsilon=1e-6, bos_token_id=None, eos_token_id=None)
    model = GPT2LMHeadModel(config)
    random_weights(model, seed=4)
    model.save_pretrained(str(path))
    return path


FOLDERS = {"llama": llama_folder, "gpt2": gpt2_folder}


@pytest.fixture(scope="module", params=sorted(FOLDERS))
def folder(request, tmp_path_factory) -> Path:
    return FOLDERS[request.param](tmp_path_factory.mktemp(request.param) / "hf")


def transformers_loss(folder: Path, tokens: torch.Tensor) -> float:
    """transformers' mean next-token cross entropy of `tokens` (the batch's rows of seq_length + 1 ids)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(folder), attn_implementation="eager", dtype=torch.float32).eval()
    with torch.no_grad():
        logits = model(tokens[:, :-1]).logits
    return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1)).item()


def test_a_folder_trains_with_no_shape_flag_and_its_first_loss_is_transformers(folder, tmp_path, monkeypatch):
    """Before: refused after the data was prepared, asking for every shape flag and a tokenizer."""
    import training.prepare

    built = []
    build_data = training.prepare.build_data
    monkeypatch.setattr("training.prepare.build_data", lambda *args: built.append(build_data(*args)) or built[-1])
    metrics = tmp_path / "m.jsonl"
    assert pretrain_gpt.main(["--init-from-hf", str(folder), *RUN, "--data-cache-dir", str(tmp_path / "cache"),
                              "--metrics-file", str(metrics)]) == 0
    record = json.loads(metrics.read_text().splitlines()[0])
    assert record["iteration"] == 1
    # the batch of iteration 1: the first micro-batch of a fresh train loader, as the run built it
    tokens = next(iter(built[0].make_train_loader(0)))["tokens"]
    assert tokens.shape == (2, POSITIONS + 1)  # the tiny preset's 128 cut to the folder's positions
    theirs = transformers_loss(folder, tokens)
    assert math.isclose(record["loss"], theirs, rel_tol=1e-5), (record["loss"], theirs)
    # the embedded corpus's tokenizer was trained to fit the folder's vocabulary
    tokenizer_dirs = list((tmp_path / "cache").glob(f"pydoc-topics-v{VOCAB}-*"))
    assert len(tokenizer_dirs) == 1


def test_print_config_names_the_folder_key_of_each_value(folder, capsys):
    parsed = parse_arguments(["--init-from-hf", str(folder)])
    shown = format_config(parsed)
    config_json = folder / "config.json"
    if folder.parent.name.startswith("llama"):
        expected = {"num_layers": (2, "num_hidden_layers"), "kv_channels": (24, "head_dim"),
                    "num_query_groups": (2, "num_key_value_heads"), "rotary_base": (5e5, "rope_parameters.rope_theta"),
                    "untie_embeddings_and_output_weights": (True, "tie_word_embeddings"),
                    "add_bias_linear": (False, "attention_bias")}
    else:
        expected = {"num_layers": (3, "n_layer"), "hidden_size": (48, "n_embd"), "ffn_hidden_size": (80, "n_inner"),
                    "activation": ("gelu", "activation_function"), "layernorm_epsilon": (1e-6, "layer_norm_epsilon")}
    model, sources = parsed.config.model, parsed.config.sources
    for name, (value, key) in expected.items():
        assert setting_value(model, name) == value, name
        assert sources[name].kind == FOLDER and sources[name].describe() == f"{config_json}: {key}", name
        assert f"{config_json}: {key}" in shown
    assert model.seq_length == POSITIONS and "is longer than the folder's positions" in sources["seq_length"].describe()
    assert parsed.config.data.tokenizer_vocab_size == VOCAB  # no tokenizer in the folder: the corpus's BPE fits it
    assert any(f"{folder} has no tokenizer: the embedded corpus's byte-level BPE is trained with at most its "
               f"vocab_size, {VOCAB} tokens" in note for note in parsed.notes)  # said once at the start


def test_a_disagreeing_flag_is_one_line_before_any_data_work(folder, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("training.prepare.build_data", lambda *args: pytest.fail("data work started"))
    capsys.readouterr()
    cache = tmp_path / "cache"
    code = pretrain_gpt.main(["--init-from-hf", str(folder), "--num-layers", "5", "--qk-layernorm", *RUN,
                              "--data-cache-dir", str(cache), "--metrics-file", str(tmp_path / "m.jsonl")])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "Traceback" not in err
    key = "num_hidden_layers" if folder.parent.name.startswith("llama") else "n_layer"
    assert "--num-layers 5 on the command line disagrees with the folder's --num-layers" in err
    assert f"{folder / 'config.json'}: {key}" in err and "--qk-layernorm on the command line" in err
    assert not cache.exists() and not (tmp_path / "m.jsonl").exists()


def test_a_flag_equal_to_the_folders_value_is_taken(folder):
    layers = "2" if folder.parent.name.startswith("llama") else "3"
    parsed = parse_arguments(["--init-from-hf", str(folder), "--num-layers", layers, "--seq-length", "16"],
                             late_checks=LATE_CHECKS)
    source = parsed.config.sources["num_layers"]
    assert parsed.config.model.num_layers == int(layers) and source.agrees_with.startswith(str(folder))
    assert parsed.config.model.seq_length == 16  # a sequence within the folder's positions is the run's choice


def test_a_longer_sequence_typed_than_the_folders_positions_names_where_they_came_from(tmp_path):
    folder = gpt2_folder(tmp_path / "gpt2")
    with pytest.raises(ConfigError) as error:
        parse_arguments(["--init-from-hf", str(folder), "--seq-length", "64"])
    assert "--seq-length 64 is larger than --max-position-embeddings 32" in str(error.value)
    assert f"comes from {folder / 'config.json'}: n_positions" in str(error.value)


# ---- the tokenizer --------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def folder_with_tokenizer(tmp_path_factory) -> Path:
    """A Llama folder holding its tokenizer (tokenizer.json, vocab.json, merges.txt) of fewer tokens than
    its vocab_size, as Qwen's folders hold."""
    folder = llama_folder(tmp_path_factory.mktemp("with-tokenizer") / "hf")
    train_tokenizer(default_corpus_documents()[::5], 300).save(str(folder))
    return folder


def test_the_folders_tokenizer_is_the_runs(folder_with_tokenizer, tmp_path):
    config = parse_arguments(["--init-from-hf", str(folder_with_tokenizer)]).config
    assert config.data.tokenizer_file == str(folder_with_tokenizer / "tokenizer.json")
    assert config.sources["tokenizer_file"].kind == FOLDER
    # the model keeps the folder's 320 rows, the tokenizer's 300 ids fit in them
    metrics = tmp_path / "m.jsonl"
    assert pretrain_gpt.main(["--init-from-hf", str(folder_with_tokenizer), *RUN, "--data-cache-dir",
                              str(tmp_path / "cache"), "--metrics-file", str(metrics)]) == 0
    assert load_tokenizer(tokenizer_file=config.data.tokenizer_file).vocab_size == 300
    assert math.isfinite(json.loads(metrics.read_text().splitlines()[0])["loss"])


def test_an_explicit_tokenizer_wins_over_the_folders_and_the_start_line_says_so(folder_with_tokenizer, tmp_path):
    """Issue 60: an explicit tokenizer wins over the folder's, as Megatron-LM reads only its tokenizer flags (before:
    one that was not the folder's was refused); it must still fit the folder's vocab_size."""
    same = tmp_path / "copy" / "tokenizer.json"
    same.parent.mkdir()
    same.write_bytes((folder_with_tokenizer / "tokenizer.json").read_bytes())
    for given in (folder_with_tokenizer / "tokenizer.json", same):
        parsed = parse_arguments(["--init-from-hf", str(folder_with_tokenizer), "--tokenizer-file", str(given)])
        assert parsed.config.data.tokenizer_file == str(given)
        assert not any("the tokenizer is the one given" in note for note in parsed.notes)  # it is the folder's
    other = tmp_path / "other"
    train_tokenizer(default_corpus_documents()[1::7], 310).save(str(other))
    parsed = parse_arguments(["--init-from-hf", str(folder_with_tokenizer), "--tokenizer-file",
                              str(other / "tokenizer.json")])
    assert parsed.config.data.tokenizer_file == str(other / "tokenizer.json")
    assert f"> the tokenizer is the one given ({other / 'tokenizer.json'}), not the folder's " \
           f"({folder_with_tokenizer / 'tokenizer.json'})" in "\n".join(parsed.notes)
    larger = tmp_path / "larger"
    train_tokenizer(default_corpus_documents()[1::3], 400).save(str(larger))
    with pytest.raises(ConfigError, match=f"has 400 tokens, more than .*config.json: vocab_size {VOCAB}"):
        parse_arguments(["--init-from-hf", str(folder_with_tokenizer), "--tokenizer-file",
                         str(larger / "tokenizer.json")])


def test_a_folder_too_small_for_the_corpus_tokenizer_is_refused_naming_the_flags(tmp_path):
    from transformers import GPT2Config, GPT2LMHeadModel

    folder = tmp_path / "small"
    GPT2LMHeadModel(GPT2Config(vocab_size=100, n_embd=16, n_layer=1, n_head=2, n_positions=16, bos_token_id=None,
                               eos_token_id=None)).save_pretrained(str(folder))
    with pytest.raises(ConfigError) as error:
        parse_arguments(["--init-from-hf", str(folder)])
    assert "has no tokenizer" in str(error.value) and "--tokenizer-file" in str(error.value)
    # data tokenized elsewhere: NullTokenizer's ids and its end-of-document id fill the folder's 100 rows
    config = parse_arguments(["--init-from-hf", str(folder), "--data-path", "x", "--tokenizer-type",
                              "NullTokenizer"]).config
    assert config.model.vocab_size == 99 and config.sources["vocab_size"].kind == FOLDER
    with pytest.raises(ConfigError, match="makes 101 token ids"):
        parse_arguments(["--init-from-hf", str(folder), "--data-path", "x", "--tokenizer-type", "NullTokenizer",
                         "--vocab-size", "100"])


def test_a_folder_our_blocks_cannot_compute_is_refused_with_the_flags(tmp_path):
    folder = llama_folder(tmp_path / "llama")
    written = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**written, "hidden_act": "gelu"}))
    with pytest.raises(ConfigError) as error:
        parse_arguments(["--init-from-hf", str(folder), "--lr", "nan"])
    message = str(error.value)
    assert "\n" not in message and "hidden_act 'gelu'" in message and "cannot be represented" in message
    assert "--lr" in message  # with the other flags' problems, in one round


def test_a_folder_tokenizer_larger_than_its_vocabulary_is_refused_before_any_data_work(tmp_path, capsys, monkeypatch):
    """Its ids past vocab_size would have no embedding row: said with the flags, not after the corpus is built."""
    monkeypatch.setattr("training.prepare.build_data", lambda *args: pytest.fail("data work started"))
    folder = llama_folder(tmp_path / "hf")
    train_tokenizer(default_corpus_documents()[::5], 400).save(str(folder))
    capsys.readouterr()  # transformers' own lines while saving
    cache = tmp_path / "cache"
    assert pretrain_gpt.main(["--init-from-hf", str(folder), *RUN, "--data-cache-dir", str(cache)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert f"the tokenizer {folder / 'tokenizer.json'} has 400 tokens, more than {folder / 'config.json'}: " \
           f"vocab_size 320" in err
    assert not cache.exists()


def test_a_llamas_positions_may_be_raised_but_not_gpt2s_position_table(tmp_path):
    """Rotary positions have no weights, so a longer context is a flag; GPT-2's n_positions is a weight's shape."""
    llama = llama_folder(tmp_path / "llama")
    config = parse_arguments(["--init-from-hf", str(llama), "--max-position-embeddings", "64",
                              "--seq-length", "64"]).config
    assert (config.model.max_position_embeddings, config.model.seq_length) == (64, 64)
    gpt2 = gpt2_folder(tmp_path / "gpt2")
    with pytest.raises(ConfigError, match="--max-position-embeddings 64 on the command line disagrees with the "
                                          "folder's --max-position-embeddings 32"):
        parse_arguments(["--init-from-hf", str(gpt2), "--max-position-embeddings", "64", "--seq-length", "64"])


def test_a_tokenizer_given_for_a_folder_without_one_must_fit_its_vocabulary(tmp_path):
    folder = llama_folder(tmp_path / "hf")
    for size, fits in ((300, True), (400, False)):
        given = tmp_path / f"tokenizer-{size}"
        train_tokenizer(default_corpus_documents()[::5], size).save(str(given))
        argv = ["--init-from-hf", str(folder), "--tokenizer-file", str(given / "tokenizer.json")]
        if fits:
            assert parse_arguments(argv).config.data.tokenizer_file == str(given / "tokenizer.json")
            continue
        with pytest.raises(ConfigError, match=f"has {size} tokens, more than .*config.json: vocab_size {VOCAB}"):
            parse_arguments(argv)
