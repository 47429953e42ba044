"""GraniteMoeShared (families/granitemoeshared) both ways: transformers' own tiny random model read by --init-from-hf
gives transformers' logits, and its export is the folder's tensors again; a multiplier no block here applies is
refused in one line (issue 114 item 3)."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from safetensors.torch import load_file

from arguments.config import PretrainConfig
from arguments.hf_config import read_hf_config
from arguments.hf_folder import architecture_settings
from base.errors import ConfigError
from base.options import replace_settings
from checkpoint.hf.folders import to_hf_state_dict, write_hf_folder
from checkpoint.hf.source import initialize_from_hf
from gpt.model import GPTModel
from parallel.state import ParallelState
from tests.checkpoint.moe_family_folders import VOCAB, family_folder
from tests.zero_harness import ZeroHarness

CPU = ParallelState(device=torch.device("cpu"))


def run_config(folder) -> PretrainConfig:
    """The run --init-from-hf makes of the folder (dropout off), at ZeRO 1."""
    config = PretrainConfig()
    settings = {name: given.value for name, given in architecture_settings(read_hf_config(folder)).items()}
    model = replace_settings(config.model, **settings, seq_length=16, hidden_dropout=0.0, attention_dropout=0.0,
                             vocab_size=VOCAB)
    return dataclasses.replace(config, model=model, zero=dataclasses.replace(config.zero, stage=1))


def with_fields(folder, **fields):
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, **fields}))
    return folder


# 0.25 is 1/sqrt(head_dim) (Megatron's scale); 0.3 crosses as --softmax-scale
@pytest.mark.parametrize("attention_multiplier, softmax_scale", [(0.25, None), (0.3, 0.3)])
def test_transformers_granitemoeshared_reads_with_its_logits_and_exports_as_the_same_folder(
        tmp_path, attention_multiplier, softmax_scale):
    from transformers import AutoModelForCausalLM

    folder = with_fields(family_folder("granitemoeshared", tmp_path / "hf"), attention_multiplier=attention_multiplier)
    config = run_config(folder)
    model_config = config.model
    assert model_config.moe.shared_expert_intermediate_size == 48 and not model_config.moe.shared_expert_gate
    assert not model_config.moe.router_pre_softmax and model_config.attention.softmax_scale == softmax_scale
    model = GPTModel(model_config, CPU)
    initialize_from_hf(ZeroHarness.from_config(model, config, CPU, blocks=model.blocks), model, folder, model_config,
                       CPU)
    theirs = AutoModelForCausalLM.from_pretrained(str(folder), attn_implementation="eager", dtype=torch.float32)
    tokens = torch.randint(0, VOCAB, (2, 12), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ours, their_logits = model.eval()(tokens)[..., :VOCAB], theirs.eval()(tokens).logits
    assert float((ours - their_logits).abs().max()) <= 1e-6 * float(their_logits.abs().max())

    state = {name: parameter.detach() for name, parameter in model.named_parameters()}
    write_hf_folder(tmp_path / "out", to_hf_state_dict(state, model_config), model_config)
    written, saved = load_file(str(tmp_path / "out" / "model.safetensors")), load_file(str(folder / "model.safetensors"))
    assert sorted(written) == sorted(saved)
    assert all(torch.equal(written[name], saved[name]) for name in saved), \
        [name for name in saved if not torch.equal(written[name], saved[name])]
    assert json.loads((tmp_path / "out" / "config.json").read_text())["attention_multiplier"] == attention_multiplier


@pytest.mark.parametrize("fields, named", [
    ({"embedding_multiplier": 12.0}, "embedding_multiplier 12.0 (the embeddings here are not scaled)"),
    ({"residual_multiplier": 0.22, "logits_scaling": 6.0}, "residual_multiplier 0.22 (each block's branches join the "
                                                           "residual unscaled); logits_scaling 6.0"),
])
def test_a_multiplier_no_block_here_applies_is_refused_in_one_line(tmp_path, fields, named):
    folder = with_fields(family_folder("granitemoeshared", tmp_path / "hf"), **fields)
    with pytest.raises(ConfigError) as error:
        architecture_settings(read_hf_config(folder))
    assert named in str(error.value) and "\n" not in str(error.value), str(error.value)
