"""Mixtral and Qwen2-MoE folders in through --init-from-hf (issue 51 item 4, the import); first Mixtral: transformers' MixtralForCausalLM
(transformers/models/mixtral/modeling_mixtral.py: MixtralSparseMoeBlock routes each token to
num_experts_per_tok experts by a softmax over all router logits whose top k are renormalized, which is
Megatron-Core's softmax over the top k logits (router.py topk_routing_with_score_function, pre-softmax off),
and each expert is SwiGLU: w2(silu(w1 x) * w3 x)) built with random weights and saved by transformers; our
model initialized from it gives transformers' logits and, on one batch, its loss, to 1e-5 relative."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from arguments.config import PretrainConfig
from arguments.hf_config import read_hf_config
from arguments.hf_folder import architecture_settings
from base.errors import ConfigError
from base.options import replace_settings
from checkpoint.hf.source import initialize_from_hf
from gpt.model import GPTModel
from parallel.state import ParallelState
from tests.checkpoint.hf_random import fill_random
from tests.zero_harness import ZeroHarness

CPU = ParallelState(device=torch.device("cpu"))
VOCAB = 300
EXPERTS, TOPK, FFN = 4, 2, 48


def mixtral_folder(path: Path, **overrides) -> Path:
    from transformers import MixtralConfig, MixtralForCausalLM

    config = MixtralConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=FFN, num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=16,
                           rms_norm_eps=1e-6, num_local_experts=EXPERTS, num_experts_per_tok=TOPK,
                           bos_token_id=None, eos_token_id=None, pad_token_id=None, **overrides)
    model = MixtralForCausalLM(config)
    fill_random(model, seed=3, scale=0.1)
    model.save_pretrained(str(path))
    return path


def run_config(folder: Path) -> PretrainConfig:
    config = PretrainConfig()
    settings = {name: given.value for name, given in architecture_settings(read_hf_config(folder)).items()}
    model = replace_settings(config.model, **{**settings, "seq_length": 16, "hidden_dropout": 0.0,
                                                 "attention_dropout": 0.0, "vocab_size": VOCAB})
    return dataclasses.replace(config, model=model, zero=dataclasses.replace(config.zero, stage=1))


def test_a_mixtral_folder_gives_transformers_logits_and_iteration_one_loss(tmp_path):
    from transformers import MixtralForCausalLM

    folder = mixtral_folder(tmp_path / "mixtral")
    config = run_config(folder)
    assert (config.model.experts.num_experts, config.model.experts.router_topk, config.model.experts.ffn_hidden_size) == \
           (EXPERTS, TOPK, FFN)
    model = GPTModel(config.model, CPU)
    optimizer = ZeroHarness.from_config(model, config, CPU, blocks=model.blocks)
    initialize_from_hf(optimizer, model, folder, config.model, CPU)
    tokens = torch.randint(0, VOCAB, (4, 17), generator=torch.Generator().manual_seed(1))
    theirs = MixtralForCausalLM.from_pretrained(str(folder), attn_implementation="eager", dtype=torch.float32).eval()
    with torch.no_grad():
        their_logits = theirs(tokens[:, :-1]).logits
        their_loss = F.cross_entropy(their_logits.reshape(-1, VOCAB), tokens[:, 1:].reshape(-1)).item()
    model.eval()
    with torch.no_grad():
        ours = model(tokens[:, :-1])
    assert (ours - their_logits).abs().max() <= 1e-5
    model.train()
    our_loss = model(tokens[:, :-1], tokens[:, 1:]).mean().item()   # iteration 1's loss, before any update
    assert our_loss == pytest.approx(their_loss, rel=1e-5)


def test_a_mixtral_with_router_jitter_is_refused_in_one_line(tmp_path):
    folder = mixtral_folder(tmp_path / "jitter", router_jitter_noise=0.1)
    with pytest.raises(ConfigError, match="router_jitter_noise 0.1") as error:
        architecture_settings(read_hf_config(folder))
    assert "\n" not in str(error.value)


def test_a_mixtral_launch_with_init_from_hf_trains_and_its_first_loss_is_transformers(tmp_path, monkeypatch):
    """pretrain_gpt.py --init-from-hf on a Mixtral folder with no tokenizer and no shape flag (the folder is the
    model, tests/checkpoint/test_hf_folder_is_the_model.py): iteration 1's logged loss is transformers' loss on
    that iteration's batch."""
    import json
    import math

    from transformers import MixtralConfig, MixtralForCausalLM

    import pretrain_gpt
    import training.prepare
    from tests.checkpoint.test_hf_folder_is_the_model import POSITIONS, RUN, transformers_loss
    from tests.checkpoint.test_hf_folder_is_the_model import VOCAB as FOLDER_VOCAB

    config = MixtralConfig(vocab_size=FOLDER_VOCAB, hidden_size=64, intermediate_size=FFN, num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=POSITIONS,
                           rms_norm_eps=1e-6, num_local_experts=EXPERTS, num_experts_per_tok=TOPK,
                           bos_token_id=None, eos_token_id=None, pad_token_id=None)
    model = MixtralForCausalLM(config)
    fill_random(model, seed=5, scale=0.2)
    folder = tmp_path / "hf"
    model.save_pretrained(str(folder))
    built = []
    build_data = training.prepare.build_data
    monkeypatch.setattr("training.prepare.build_data", lambda *args: built.append(build_data(*args)) or built[-1])
    metrics = tmp_path / "m.jsonl"
    assert pretrain_gpt.main(["--init-from-hf", str(folder), *RUN, "--data-cache-dir", str(tmp_path / "cache"),
                              "--metrics-file", str(metrics)]) == 0
    record = json.loads(metrics.read_text().splitlines()[0])
    tokens = next(iter(built[0].make_train_loader(0)))["tokens"]
    theirs = transformers_loss(folder, tokens)
    assert math.isclose(record["loss"], theirs, rel_tol=1e-5), (record["loss"], theirs)


def test_transformers_fused_experts_read_as_the_per_expert_names_it_saves(tmp_path):
    """transformers 5 holds a Mixtral's experts fused (mlp.experts.gate_up_proj, mlp.experts.down_proj) and writes
    them per expert (block_sparse_moe.experts.<e>.w1/w3/w2): a file in either form reads as the same tensors."""
    from safetensors.torch import load_file
    from transformers import MixtralForCausalLM

    from families.common.llama_shaped import canonical_names

    folder = mixtral_folder(tmp_path / "mixtral")
    saved = canonical_names(load_file(str(folder / "model.safetensors")), "mixtral")
    fused = MixtralForCausalLM.from_pretrained(str(folder), dtype=torch.float32).state_dict()
    assert any(name.endswith("mlp.experts.gate_up_proj") for name in fused)
    from_fused = canonical_names(fused, "mixtral")
    assert sorted(from_fused) == sorted(saved)
    assert all(torch.equal(from_fused[name], saved[name]) for name in saved)


# ---- Qwen2-MoE ------------------------------------------------------------------------------------------------

def qwen2_moe_folder(path: Path, **overrides) -> Path:
    from transformers import Qwen2MoeConfig, Qwen2MoeForCausalLM

    settings = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=80, moe_intermediate_size=FFN,
                    shared_expert_intermediate_size=40, num_hidden_layers=3, num_attention_heads=4,
                    num_key_value_heads=2, max_position_embeddings=16, rms_norm_eps=1e-6, num_experts=EXPERTS,
                    num_experts_per_tok=TOPK, bos_token_id=None, eos_token_id=None, pad_token_id=None)
    model = Qwen2MoeForCausalLM(Qwen2MoeConfig(**{**settings, **overrides}))
    fill_random(model, seed=4, scale=0.1)
    model.save_pretrained(str(path))
    return path


@pytest.mark.parametrize("overrides, layers", [
    ({}, (True, True, True)),
    # norm_topk_prob: the top k renormalized (--moe-router-pre-softmax off); layer 1 dense (mlp_only_layers)
    ({"norm_topk_prob": True, "mlp_only_layers": [1]}, (True, False, True)),
])
def test_a_qwen2_moe_folder_gives_transformers_logits_and_iteration_one_loss(tmp_path, overrides, layers):
    """transformers' Qwen2MoeSparseMoeBlock: the top k of a softmax over all experts (renormalized only with
    norm_topk_prob, as Megatron's --moe-router-pre-softmax leaves it un-normalized), plus a shared expert times
    sigmoid(shared_expert_gate(x)) (Megatron-Core's SharedExpertMLP with --moe-shared-expert-gate); q, k, v
    biases alone (--add-qkv-bias); mlp_only_layers dense (--moe-layer-freq as a list)."""
    from transformers import Qwen2MoeForCausalLM

    folder = qwen2_moe_folder(tmp_path / "qwen", **overrides)
    config = run_config(folder)
    assert config.model.moe_layers() == layers and config.model.attention.add_qkv_bias and not config.model.add_bias_linear
    assert config.model.experts.router_pre_softmax == (not overrides.get("norm_topk_prob", False))
    model = GPTModel(config.model, CPU)
    optimizer = ZeroHarness.from_config(model, config, CPU, blocks=model.blocks)
    initialize_from_hf(optimizer, model, folder, config.model, CPU)
    tokens = torch.randint(0, VOCAB, (4, 17), generator=torch.Generator().manual_seed(1))
    theirs = Qwen2MoeForCausalLM.from_pretrained(str(folder), attn_implementation="eager", dtype=torch.float32).eval()
    with torch.no_grad():
        their_logits = theirs(tokens[:, :-1]).logits
        their_loss = F.cross_entropy(their_logits.reshape(-1, VOCAB), tokens[:, 1:].reshape(-1)).item()
    model.eval()
    with torch.no_grad():
        ours = model(tokens[:, :-1])
    assert (ours - their_logits).abs().max() <= 1e-5
    model.train()
    assert model(tokens[:, :-1], tokens[:, 1:]).mean().item() == pytest.approx(their_loss, rel=1e-5)


# ---- the export -----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("family", ["mixtral", "qwen2_moe"])
def test_an_moe_checkpoint_exports_as_its_family_and_transformers_computes_our_logits(tmp_path, family):
    """Imported, trained 2 steps (every weight moves), saved, and written by scripts/tools/convert_to_hf.py: the folder
    loads as MixtralForCausalLM / Qwen2MoeForCausalLM and gives our logits within 1e-5."""
    import json

    from transformers import AutoModelForCausalLM

    from checkpoint.ours.sharded import save_checkpoint
    from scripts.tools import convert_to_hf

    folder = (mixtral_folder if family == "mixtral" else qwen2_moe_folder)(tmp_path / "source")
    config = run_config(folder)
    config = dataclasses.replace(config, optimizer=dataclasses.replace(config.optimizer, lr=1e-2))
    model = GPTModel(config.model, CPU)
    optimizer = ZeroHarness.from_config(model, config, CPU, blocks=model.blocks)
    initialize_from_hf(optimizer, model, folder, config.model, CPU)
    tokens = torch.randint(0, VOCAB, (4, 17), generator=torch.Generator().manual_seed(2))
    for _ in range(2):
        optimizer.zero_grad()
        loss = model(tokens[:, :-1], tokens[:, 1:]).mean()
        optimizer.backward(loss)
        optimizer.step()
    save_checkpoint(tmp_path / "ckpt", 2, 8, model, optimizer, None, config, CPU)
    assert convert_to_hf.main([str(tmp_path / "ckpt"), str(tmp_path / "out")]) == 0
    written = json.loads((tmp_path / "out" / "config.json").read_text())
    assert written["model_type"] == family
    theirs = AutoModelForCausalLM.from_pretrained(str(tmp_path / "out"), attn_implementation="eager",
                                                  dtype=torch.float32).eval()
    model.eval()
    with torch.no_grad():
        ours = model(tokens[:, :-1])
        assert (ours - theirs(tokens[:, :-1]).logits).abs().max() <= 1e-5
        # and the loss (issue 63: the export's loss within 1e-5 of ours), transformers' own loss on the same tokens
        our_loss = model(tokens[:, :-1], tokens[:, 1:]).mean().item()
    shifted = theirs(tokens, labels=tokens).loss.item()  # transformers shifts the labels itself
    assert shifted == pytest.approx(our_loss, rel=1e-5)


def test_an_moe_model_no_transformers_class_holds_is_refused_at_export_in_one_line():
    from families.common.llama_shaped import check_llama_shaped
    from gpt.model_config import ModelConfig

    llama_moe = ModelConfig.of(normalization="RMSNorm", swiglu=True, position_embedding_type="rope",
                            add_bias_linear=False, num_experts=4, moe_router_score_function="sigmoid",
                            moe_expert_capacity_factor=1.0)
    with pytest.raises(ConfigError) as error:
        check_llama_shaped(llama_moe, "the Hugging Face export")
    message = str(error.value)
    assert "as a MixtralForCausalLM" in message and "--moe-router-score-function softmax" in message
    assert "no --moe-expert-capacity-factor" in message and "\n" not in message
    with pytest.raises(ConfigError, match="--normalization RMSNorm"):  # GPT-2's blocks with experts
        check_llama_shaped(ModelConfig.of(num_experts=4), "the Hugging Face export")
