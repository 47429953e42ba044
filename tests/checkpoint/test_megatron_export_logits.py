"""Megatron-LM's own torch_dist saves of the DeepSeek-V3 and MoE-with-shared-expert models (tests/fixtures/megatron_*,
scripts/tools/megatron_checkpoint_fixtures.py) exported by `scripts/tools/convert_to_hf.py`: transformers' model of the
folder gives this project's logits on the checkpoint (`--load`'s weights) within 1e-6 of the largest |logit|, every
weight loaded (the routers' expert bias included) and an MTP layer written under the release's names, which transformers
does not load. A dense MLA model (this project's, random) is a DeepseekV3 whose every layer is dense, and reads back as
itself. What no family holds is refused in one line naming what it would need (issue 114 item 3)."""

from __future__ import annotations

import json

import pytest
import torch

from checkpoint.inference_load import inference_checkpoint, load_model_weights, open_source
from gpt.model import build_gpt_model
from parallel.state import ParallelState
from scripts.tools import convert_to_hf
from tests.checkpoint.test_megatron_checkpoint import FIXTURES

CPU = ParallelState(device=torch.device("cpu"))
LENGTHS = (16, 11, 5)
RUN = ["--seq-length", "16", "--micro-batch-size", "1", "--global-batch-size", "1", "--train-iters", "1",
       "--mock-data", "--tokenizer-type", "NullTokenizer", "--vocab-size", "126"]
# DeepSeek-V3's blocks (RMSNorm at its latent norms' epsilon, SwiGLU, no biases) with MLA's low-rank query, no experts
DENSE_MLA = RUN + ["--num-layers", "2", "--hidden-size", "16", "--num-attention-heads", "4",
                   "--max-position-embeddings", "16", "--swiglu", "--ffn-hidden-size", "32", "--disable-bias-linear",
                   "--normalization", "RMSNorm", "--norm-epsilon", "1e-6", "--untie-embeddings-and-output-weights",
                   "--multi-latent-attention", "--q-lora-rank", "8", "--kv-lora-rank", "8", "--qk-head-dim", "4",
                   "--qk-pos-emb-head-dim", "4", "--v-head-dim", "4", "--qk-layernorm", "--position-embedding-type",
                   "rope"]  # sequences of varied lengths, each its own forward (neither model takes a padding mask here)


def our_logits(name: str, sequences: list[torch.Tensor]) -> list[torch.Tensor]:
    """This project's model of the checkpoint, as generation and evaluation load it."""
    checkpoint = inference_checkpoint(FIXTURES / name)
    model = build_gpt_model(checkpoint.model, CPU, seed=0).eval()
    with open_source(checkpoint, CPU) as source:
        load_model_weights(source, model, CPU)
    with torch.no_grad():
        return [model(tokens[None])[0] for tokens in sequences]


@pytest.mark.parametrize("name,hf_class,mtp_layer", [
    ("megatron_deepseek_v3", "DeepseekV3ForCausalLM", 2),  # MLA (q LoRA, latent norms), shared expert, MTP, EP 2
    ("megatron_moe_ep2_dense_first_gated_shared", "Qwen2MoeForCausalLM", None),  # a gated shared expert, EP 2
    ("megatron_moe_ep2_shared", "GraniteMoeSharedForCausalLM", None),  # Megatron's default ungated shared expert
])
def test_transformers_logits_of_the_export_are_ours_on_the_checkpoint(tmp_path, name, hf_class, mtp_layer):
    from transformers import AutoModelForCausalLM

    out = tmp_path / "hf"
    assert convert_to_hf.main([str(FIXTURES / name), str(out)]) == 0
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == [hf_class]
    model, loading = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32, output_loading_info=True)
    assert loading["missing_keys"] == set() and loading["mismatched_keys"] == set(), loading
    # the MTP layer's weights are the release's model.layers.<num_layers>.*, which transformers leaves unloaded
    unloaded = {key.split(".")[2] for key in loading["unexpected_keys"]}
    assert unloaded == ({str(mtp_layer)} if mtp_layer is not None else set()), loading["unexpected_keys"]
    if mtp_layer is not None:
        assert config.get("num_nextn_predict_layers") == 1
        assert {"enorm", "hnorm", "eh_proj", "shared_head", "embed_tokens", "mlp", "self_attn"} <= \
            {key.split(".")[3] for key in loading["unexpected_keys"]}
    generator = torch.Generator().manual_seed(0)
    sequences = [torch.randint(0, config["vocab_size"], (length,), generator=generator) for length in LENGTHS]
    ours = our_logits(name, sequences)
    with torch.no_grad():
        theirs = [model.eval()(tokens[None]).logits[0] for tokens in sequences]
    for mine, hf in zip(ours, theirs):
        assert mine.shape == hf.shape
        assert float((mine - hf).abs().max()) <= 1e-6 * float(mine.abs().max())


@pytest.mark.parametrize("name,named", [
    # Megatron-LM's MLA fixtures keep GPT-2's blocks (LayerNorm, GeLU, biases): DeepseekV3's are RMSNorm and SwiGLU
    ("megatron_mla", "would need --normalization RMSNorm, --swiglu"),
    ("megatron_mla_q_lora", "would need --normalization RMSNorm, --swiglu"),
    # GPT-2's blocks with rotary positions are no transformers class here, with or without their MTP layer
    ("megatron_mtp", "would need --normalization RMSNorm, --swiglu"),
    ("megatron_hybrid_mtp", "would need --normalization RMSNorm, --swiglu"),
])
def test_what_no_family_holds_is_refused_in_one_line(tmp_path, capsys, name, named):
    assert convert_to_hf.main([str(FIXTURES / name), str(tmp_path / "hf")]) == 2
    err = capsys.readouterr().err.strip()
    assert named in err and len(err.splitlines()) == 1, err
    assert not (tmp_path / "hf").exists()


def test_a_dense_mla_model_exports_as_a_deepseek_v3_of_dense_layers_and_reads_back(tmp_path):
    from transformers import AutoModelForCausalLM

    from arguments.parser import parse_arguments, parse_config
    from checkpoint.hf.folders import to_hf_state_dict, write_hf_folder

    config = parse_config(DENSE_MLA).model
    model = build_gpt_model(config, CPU, seed=0).eval()
    with torch.no_grad():  # norms away from 1, so a gain left out or misplaced shows
        for name, parameter in model.named_parameters():
            if "layernorm" in name:
                parameter.add_(torch.randn(parameter.shape, generator=torch.Generator().manual_seed(1)) * 0.1)
    state = {name: parameter.detach() for name, parameter in model.named_parameters()}
    write_hf_folder(tmp_path / "hf", to_hf_state_dict(state, config), config)
    hf, loading = AutoModelForCausalLM.from_pretrained(tmp_path / "hf", dtype=torch.float32, output_loading_info=True)
    assert type(hf).__name__ == "DeepseekV3ForCausalLM" and hf.config.first_k_dense_replace == 2
    assert not loading["missing_keys"] and not loading["unexpected_keys"], loading
    tokens = torch.randint(0, 126, (1, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ours, theirs = model(tokens)[..., :126], hf.eval()(tokens).logits
    assert float((ours - theirs).abs().max()) <= 1e-6 * float(ours.abs().max())
    # the folder's 126 rows hold NullTokenizer's 125 ids and its end of document
    read = parse_arguments([*RUN[:-1], "125", "--init-from-hf", str(tmp_path / "hf")]).config.model
    assert read.moe is None and read.mla.q_lora_rank == 8 and read.mla.multi_latent_attention
