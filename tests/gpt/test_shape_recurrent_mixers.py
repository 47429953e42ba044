"""The model's shape (gpt/shape.py) of `M` (Mamba-2) and `G` (Gated DeltaNet) layers against independent counts:
the parameters against the meta model's own and transformers' NemotronH and Qwen3-Next on the same sizes, the
forward FLOPs against torch's FlopCounterMode over the meta model.

What is counted (gpt/shape.py ScanShape): the projections, the depthwise convolution and the chunked scans' matmuls,
as FlopCounterMode counts them; the elementwise work and G's triangular solves are not, in either. The backward is
3x the forward in the model's accounting; FlopCounterMode's backward matmuls read 0.95x (M) and 1.11x (G) twice the
forward's (the scan's einsums need no gradient of their causal masks; G's triangular solves' gradients are matmuls),
so the check there is a band. Its count of a depthwise conv's backward ignores the groups (a dense conv's), so the
conv is left out of that band."""

from __future__ import annotations

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from arguments.parser import parse_config
from gpt.model import GPTModel
from gpt.shape import ScanShape, model_shape
from parallel.state import ParallelState
from training.metrics import forward_flops_per_token, parameter_count

META = ParallelState(device=torch.device("meta"))
COMMON = ["--hidden-size", "64", "--num-attention-heads", "4", "--seq-length", "256",
          "--max-position-embeddings", "256",
          "--micro-batch-size", "1", "--global-batch-size", "1", "--vocab-size", "1000", "--tokenizer-type",
          "NullTokenizer", "--mock-data", "--normalization", "RMSNorm", "--disable-bias-linear",
          "--untie-embeddings-and-output-weights", "--hidden-dropout", "0", "--attention-dropout", "0"]
# Nemotron-H's blocks: Mamba-2 and attention mixers, squared-ReLU MLPs, one-part blocks (`M` alone, `-` alone)
NEMOTRON_H = ["--hybrid-layer-pattern", "M-M*-M--M-", "--mamba-num-heads", "8", "--mamba-head-dim", "16",
              "--mamba-num-groups", "2", "--mamba-state-dim", "16", "--ffn-hidden-size", "96", "--squared-relu",
              "--group-query-attention", "--num-query-groups", "2", "--kv-channels", "16",
              "--position-embedding-type", "none"]
GDN_SIZES = ["--swiglu", "--linear-num-key-heads", "2", "--linear-num-value-heads", "4", "--linear-key-head-dim", "16",
             "--linear-value-head-dim", "8"]
GATED_ATTENTION = ["--attention-output-gate", "--qk-layernorm", "--apply-layernorm-1p", "--group-query-attention",
                   "--num-query-groups", "2", "--kv-channels", "16", "--position-embedding-type", "rope",
                   "--rotary-percent", "0.5"]
# Qwen3-Next's: Gated DeltaNet and gated attention with q/k norms, each before an MoE layer with a gated shared expert
QWEN3_NEXT = ["--hybrid-layer-pattern", "GEGE*E", *GDN_SIZES, *GATED_ATTENTION, "--num-experts", "4",
              "--moe-router-topk", "2", "--moe-ffn-hidden-size", "32", "--moe-shared-expert-intermediate-size", "48",
              "--moe-shared-expert-gate"]
# the same mixers before dense MLPs, for the FLOPs (the meta device's MoE routing adds the router's matmul)
QWEN3_NEXT_DENSE = ["--hybrid-layer-pattern", "G-G-*-", *GDN_SIZES, *GATED_ATTENTION]
# the GPT flags' G layers (every layer but each second, Megatron-Core's get_linear_attention_pattern)
GDN_FLAGS = ["--num-layers", "4", "--experimental-attention-variant", "gated_delta_net", "--linear-attention-freq", "2",
             *GDN_SIZES]


def model_of(flags):
    return parse_config([*COMMON, *flags]).model


def meta_parameters(config) -> int:
    return sum(p.numel() for p in GPTModel(config, META).parameters())


@pytest.mark.parametrize("flags", [NEMOTRON_H, QWEN3_NEXT, GDN_FLAGS], ids=["nemotron-h", "qwen3-next", "gdn-flags"])
def test_parameters_of_m_and_g_layers_are_the_meta_models(flags):
    config = model_of(flags)
    assert parameter_count(config, config.padded_vocab_size()) == meta_parameters(config)


def transformers_parameters(hf_config, model_class) -> int:
    with torch.device("meta"):
        return sum(p.numel() for p in model_class(hf_config).parameters())


def test_parameters_equal_transformers_nemotron_h():
    transformers = pytest.importorskip("transformers")
    hf = transformers.NemotronHConfig(
        vocab_size=1024, hidden_size=64, hybrid_override_pattern="M-M*-M--M-", num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, intermediate_size=96, mamba_num_heads=8, mamba_head_dim=16, n_groups=2,
        ssm_state_size=16, conv_kernel=4, tie_word_embeddings=False)
    config = model_of(NEMOTRON_H)
    assert config.padded_vocab_size() == hf.vocab_size
    assert parameter_count(config) == transformers_parameters(hf, transformers.NemotronHForCausalLM)


def test_parameters_equal_transformers_qwen3_next():
    transformers = pytest.importorskip("transformers")
    hf = transformers.Qwen3NextConfig(
        vocab_size=1024, hidden_size=64, num_hidden_layers=3, layer_types=["linear_attention"] * 2 + ["full_attention"],
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, linear_num_key_heads=2, linear_num_value_heads=4,
        linear_key_head_dim=16, linear_value_head_dim=8, linear_conv_kernel_dim=4, num_experts=4, num_experts_per_tok=2,
        moe_intermediate_size=32, shared_expert_intermediate_size=48, tie_word_embeddings=False)
    config = model_of(QWEN3_NEXT)
    assert config.padded_vocab_size() == hf.vocab_size
    assert parameter_count(config) == transformers_parameters(hf, transformers.Qwen3NextForCausalLM)


def counted_flops(config) -> tuple[dict, dict]:
    """FlopCounterMode's forward and backward counts by op over one sequence through the meta model."""
    model = GPTModel(config, META)
    tokens = torch.zeros(1, config.seq_length, dtype=torch.long, device="meta")
    with FlopCounterMode(display=False) as forward:
        loss = model(tokens).float().sum()
    with FlopCounterMode(display=False) as backward:
        loss.backward()
    return ({str(op): flops for op, flops in counter.get_flop_counts()["Global"].items()}
            for counter in (forward, backward))


@pytest.mark.parametrize("flags", [NEMOTRON_H, QWEN3_NEXT_DENSE, GDN_FLAGS],
                         ids=["nemotron-h", "qwen3-next-dense", "gdn-flags"])
@pytest.mark.parametrize("seq", [256, 32])  # whole chunks, and one padded chunk
def test_forward_flops_of_m_and_g_layers_are_the_counters(flags, seq):
    """Each M and G layer's projections, conv and scan, its one-part blocks, the other layers: FlopCounterMode's forward
    (attention's square by SDPA's math decomposition on the meta device) within a FLOP per token and layer (the conv's
    padded outputs over the sequence, rounded down per token). Its backward's matmuls are about twice the forward's."""
    config = model_of([*flags, "--seq-length", str(seq), "--max-position-embeddings", str(seq)])
    blocks, logits = forward_flops_per_token(config, config.padded_vocab_size())
    forward, backward = counted_flops(config)
    assert sum(forward.values()) - config.num_layers * seq <= (blocks + logits) * seq <= sum(forward.values())
    matmuls = ("aten.mm", "aten.bmm", "aten.addmm")
    ratio = sum(backward.get(op, 0) for op in matmuls) / sum(forward.get(op, 0) for op in matmuls)
    assert 1.8 < ratio < 2.3, (forward, backward)


def test_scan_flops_follow_the_chunk_and_sizes():
    """A G layer's scan at the default sizes (key and value heads 128 wide, chunk 64): 4 x 64 x 128 + 2 x 64 x 128 +
    6 x 128^2 FLOPs per token and value head; Megatron's estimate (training.py gdn_layer_flops) has 8 x 128^2."""
    config = model_of(["--num-layers", "2", "--experimental-attention-variant", "gated_delta_net",
                       "--linear-attention-freq", "2", "--swiglu", "--hidden-size", "256"])
    (gdn,) = model_shape(config).other_mixers
    assert isinstance(gdn.scan, ScanShape) and gdn.scan.chunk == 64
    assert gdn.scan.chunk_flops_per_token == 32 * (4 * 64 * 128 + 2 * 64 * 128 + 6 * 128 * 128)
