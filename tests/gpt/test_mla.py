"""Megatron-LM's --multi-latent-attention (gpt/mla.py) against transformers' DeepseekV3Attention (5.24,
transformers/models/deepseek_v3/modeling_deepseek_v3.py) on the same weights, and its wiring.

Megatron-Core's MLASelfAttention (github:NVIDIA/Megatron-LM megatron/core/transformer/multi_latent_attention.py,
get_query_key_value_tensors) and DeepseekV3Attention compute the same thing: linear_q_down_proj = q_a_proj,
q_layernorm = q_a_layernorm, linear_q_up_proj = q_b_proj (or linear_q_proj = q_proj), linear_kv_down_proj =
kv_a_proj_with_mqa ([kv_lora_rank | qk_pos_emb_head_dim]), kv_layernorm = kv_a_layernorm, linear_kv_up_proj =
kv_b_proj ([head][nope | v]), linear_proj = o_proj; rotary on the positional dims after de-interleaving
(rope_utils._apply_rotary_pos_emb_bshd with mla_rotary_interleaved; DeepSeek's apply_rotary_pos_emb_interleave);
YaRN's frequencies and concentration (yarn_rotary_pos_embedding.py; transformers' _compute_yarn_parameters) and
the softmax scale mscale(factor, mscale_all_dim)^2 / sqrt(q_head_dim) (MultiLatentAttention.__init__;
yarn_apply_mscale). Megatron's norms exist only under --qk-layernorm (mla_qk_norm_config.py
QKNormConfigResolver), and without --q-lora-rank its query norm is over the hidden state, fused into
linear_q_proj: the reference gets that norm in front of its q_proj.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from arguments.parser import parse_config
from base.errors import ConfigError
from base.options import replace_settings
from gpt.model import build_gpt_model
from gpt.shape import model_shape
from parallel.state import ParallelState
from tests.distributed import run_distributed
from tests.gpt.test_llama_blocks import tiny_config
from tests.reliability_helpers import metrics_records, train

SINGLE = ParallelState(device=torch.device("cpu"))
MLA = dict(multi_latent_attention=True, kv_lora_rank=16, qk_head_dim=8, qk_pos_emb_head_dim=4, v_head_dim=12,
           qk_layernorm=True, normalization="RMSNorm", position_embedding_type="rope", add_bias_linear=False)


def mla_config(**overrides):
    return tiny_config(**{**MLA, **overrides})


def deepseek_attention(ours, config, rope_parameters):
    """transformers' DeepseekV3Attention with `ours`' weights, its rotary embedding, and a causal mask."""
    from transformers import DeepseekV3Config
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import (
        DeepseekV3Attention,
        DeepseekV3RMSNorm,
        DeepseekV3RotaryEmbedding,
    )

    hf_config = DeepseekV3Config(
        hidden_size=config.hidden_size, num_attention_heads=config.num_attention_heads,
        num_key_value_heads=config.num_attention_heads, q_lora_rank=config.mla.q_lora_rank,
        kv_lora_rank=config.mla.kv_lora_rank, qk_nope_head_dim=config.mla.qk_head_dim,
        qk_rope_head_dim=config.mla.qk_pos_emb_head_dim, v_head_dim=config.mla.v_head_dim, attention_bias=False,
        rms_norm_eps=config.norms.layernorm_epsilon, max_position_embeddings=config.max_position_embeddings,
        rope_parameters=rope_parameters, rope_interleave=True, attention_dropout=0.0)
    hf_config._attn_implementation = "eager"
    theirs = DeepseekV3Attention(hf_config, layer_idx=0).eval()
    with torch.no_grad():
        if config.mla.q_lora_rank is None:
            norm = DeepseekV3RMSNorm(config.hidden_size, eps=config.norms.layernorm_epsilon).double()
            norm.weight.copy_(ours.q_layernorm.weight)
            theirs.q_proj.weight.copy_(ours.linear_q_proj.weight)
            theirs.q_proj = nn.Sequential(norm, theirs.q_proj)  # Megatron's norm fused into linear_q_proj
        else:
            theirs.q_a_proj.weight.copy_(ours.linear_q_down_proj.weight)
            theirs.q_a_layernorm.weight.copy_(ours.q_layernorm.weight)
            theirs.q_b_proj.weight.copy_(ours.linear_q_up_proj.weight)
        theirs.kv_a_proj_with_mqa.weight.copy_(ours.linear_kv_down_proj.weight)
        theirs.kv_a_layernorm.weight.copy_(ours.kv_layernorm.weight)
        theirs.kv_b_proj.weight.copy_(ours.linear_kv_up_proj.weight)
        theirs.o_proj.weight.copy_(ours.linear_proj.weight)
    return theirs, DeepseekV3RotaryEmbedding(hf_config)


def check_against_deepseek(config, rope_parameters):
    model = build_gpt_model(config, SINGLE, seed=7, dtype=torch.float64).eval()  # fp64: rounding far below 1e-5
    ours = model.blocks[0].attention
    generator = torch.Generator().manual_seed(3)
    with torch.no_grad():  # weights far from init's 0.02 (scores that are not all alike) and gains away from 1
        for name, parameter in ours.named_parameters():
            if "layernorm" in name:
                parameter.uniform_(0.5, 1.5, generator=generator)
            else:
                parameter.normal_(0.0, 0.3, generator=generator)
    theirs, rotary = deepseek_attention(ours, config, rope_parameters)
    theirs.double()
    x = torch.randn(2, config.seq_length, config.hidden_size, generator=torch.Generator().manual_seed(1),
                    dtype=torch.float64)
    seq = config.seq_length
    causal = torch.full((seq, seq), float("-inf")).triu(1)[None, None]
    positions = torch.arange(seq)[None].expand(2, -1)
    with torch.no_grad():
        expected, _ = theirs(x, rotary(x, positions), causal)
        torch.testing.assert_close(ours(x), expected, rtol=0, atol=1e-5)
    return ours, x, expected


@pytest.mark.parametrize("q_lora_rank", [24, None])
@pytest.mark.parametrize("rope_type", [None, "rope"])  # MLA's default (yarn) at --rotary-scaling-factor 1 is rope
def test_mla_equals_transformers_deepseek_v3_attention(q_lora_rank, rope_type):
    config = mla_config(q_lora_rank=q_lora_rank, rope_type=rope_type, rotary_base=10000.0)
    ours, x, expected = check_against_deepseek(config, {"rope_type": "default", "rope_theta": 10000.0})
    # the comparison can fail: without the rotary positions the output differs
    with torch.no_grad():
        ours.config = mla_config(q_lora_rank=q_lora_rank, rope_type=rope_type, rotary_base=10.0)
        assert (ours(x) - expected).abs().max() > 1e-2


def test_mla_yarn_equals_transformers_deepseek_v3_yarn():
    """The functional tests' DeepSeek-V3 proxy: --rotary-scaling-factor 40 --mscale 1.0 --mscale-all-dim 1.0, YaRN
    with MLATransformerConfig's beta_fast 32, beta_slow 1, original_max_position_embeddings 4096."""
    config = mla_config(q_lora_rank=24, rotary_scaling_factor=40.0, mscale=1.0, mscale_all_dim=1.0, seq_length=64,
                        max_position_embeddings=64, qk_pos_emb_head_dim=64)
    rope = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 40.0, "mscale": 1.0, "mscale_all_dim": 1.0,
            "original_max_position_embeddings": 4096, "beta_fast": 32, "beta_slow": 1}
    ours, x, expected = check_against_deepseek(config, rope)
    # plain rope at factor 40 (no YaRN blend, no softmax mscale) differs
    with torch.no_grad():
        ours.config, ours.softmax_scale = replace_settings(config, rope_type="rope"), 1 / math.sqrt(72)
        assert (ours(x) - expected).abs().max() > 1e-2


def test_mla_without_qk_layernorm_has_no_latent_norms():
    """QKNormConfigResolver._resolve_disabled_qk_layernorm: q_layernorm and kv_layernorm are IdentityOp."""
    model = build_gpt_model(mla_config(q_lora_rank=24, qk_layernorm=False), SINGLE, seed=7)
    names = [name for name, _ in model.blocks[0].attention.named_parameters()]
    assert names == ["linear_q_down_proj.weight", "linear_q_up_proj.weight", "linear_kv_down_proj.weight",
                     "linear_kv_up_proj.weight", "linear_proj.weight"]


def test_mla_shape_counts_its_parameters_and_flops():
    """Parameters and matmul FLOPs read from the model (gpt/shape.py): the projections' sizes written out."""
    config = mla_config(q_lora_rank=24)
    h, n, q_head = 64, 4, 8 + 4
    projections = [(h, 24), (24, n * q_head), (h, 16 + 4), (16, n * (8 + 12)), (n * 12, h)]
    shape = model_shape(config)
    model = build_gpt_model(config, SINGLE, seed=7)
    block = sum(p.numel() for p in model.blocks[0].parameters())
    assert shape.parameters_per_block == block
    # the latent norms (24, 16), the two RMSNorms, the MLP without biases (--disable-bias-linear)
    assert block == sum(i * o for i, o in projections) + 24 + 16 + 2 * h + 2 * h * 4 * h
    mlp = 2 * 2 * h * 4 * h
    # scores over q_head dims, context over v_head dims, per head and key position
    attention = 2 * n * q_head * config.seq_length + 2 * n * 12 * config.seq_length
    assert shape.block_forward_flops_per_token() == 2 * sum(i * o for i, o in projections) + mlp + attention


def test_mla_flags_parse_and_what_is_not_built_is_refused():
    config = parse_config(["--multi-latent-attention", "--q-lora-rank", "32", "--kv-lora-rank", "16",
                           "--qk-head-dim", "8", "--qk-pos-emb-head-dim", "4", "--v-head-dim", "8",
                           "--rotary-scaling-factor", "40", "--mscale", "1.0", "--mscale-all-dim", "1.0",
                           "--rope-type", "yarn"]).model
    assert (config.mla.multi_latent_attention, config.mla.q_lora_rank, config.mla.kv_lora_rank, config.positions.rotary_scaling_factor,
            config.positions.mscale_all_dim, config.mla.rope_type) == (True, 32, 16, 40.0, 1.0, "yarn")
    with pytest.raises(ConfigError, match="--multi-latent-attention with --attention-output-gate is not implemented"):
        parse_config(["--multi-latent-attention", "--attention-output-gate"])
    with pytest.raises(ConfigError, match="--qk-pos-emb-head-dim 3 must be even"):
        parse_config(["--multi-latent-attention", "--qk-pos-emb-head-dim", "3"])
    with pytest.raises(ConfigError, match="--multi-latent-attention with --clip-qkv is not implemented"):
        parse_config(["--multi-latent-attention", "--clip-qkv", "8"])


def test_mla_trains_a_tiny_model_for_two_iterations(corpus_cache, tmp_path):
    outcome = train(corpus_cache, tmp_path, "--train-iters", "2", "--multi-latent-attention", "--q-lora-rank", "32",
                    "--kv-lora-rank", "16", "--qk-head-dim", "16", "--qk-pos-emb-head-dim", "8", "--v-head-dim", "16",
                    "--qk-layernorm", "--normalization", "RMSNorm", "--position-embedding-type", "rope",
                    "--rotary-scaling-factor", "40", "--mscale", "1.0", "--mscale-all-dim", "1.0")
    assert outcome.code == 0, outcome.err[-3000:]
    losses = [record["loss"] for record in metrics_records(tmp_path / "metrics.jsonl") if "loss" in record]
    assert len(losses) == 2 and all(math.isfinite(loss) for loss in losses)


def test_mla_refusals_rope_type_and_hf_export():
    # megatron/training/argument_utils.py: 'Common attention only support rope_type="rope"'
    with pytest.raises(ConfigError, match="--rope-type yarn is multi-latent attention's"):
        parse_config(["--rope-type", "yarn"])
    from checkpoint.hf.folders import check_convertible

    # a dense MLA model is a DeepseekV3 of dense layers; its query without --q-lora-rank has a norm q_proj lacks
    with pytest.raises(ConfigError, match="as a DeepseekV3ForCausalLM this one would need --q-lora-rank"):
        check_convertible(mla_config(swiglu=True), "the Hugging Face export")


@pytest.mark.parametrize("experts", [{}, {"num_experts": 4}], ids=["dense", "moe"])
def test_a_pattern_mixing_attention_and_mla_is_refused_by_the_hf_export_in_one_line(experts):
    """No transformers class holds `*` and `+` layers in one model: the MoE one is not claimed as a DeepseekV3 (whose
    every layer is MLA, as the all-`+` pattern's is), and the export refuses both, naming the pattern."""
    from checkpoint.hf.folders import check_convertible
    from families.registry import family_of

    swiglu = dict(swiglu=True, **experts)
    all_mla = mla_config(**swiglu, hybrid_layer_pattern="+-+E" if experts else "+-+-")
    if experts:
        assert family_of(all_mla).model_type == "deepseek_v3"
    mixed = mla_config(**swiglu, hybrid_layer_pattern="*-+E" if experts else "*-+-")
    assert family_of(mixed) is None
    with pytest.raises(ConfigError, match=r"--hybrid-layer-pattern \*-\+. is not implemented: its `\*` \(attention\) "
                                          r"and `\+` \(MLA\) layers in one model are no transformers class") as raised:
        check_convertible(mixed, "the Hugging Face export")
    assert "\n" not in str(raised.value)


def _tp2_against_tp1(rank, world_size, sequence_parallel):
    from gpt.parallel_plan import tensor_parallel_plan
    from parallel.config import ParallelismConfig
    from parallel.state import destroy, initialize
    from tests.gpt.test_llama_blocks import check_gradients_are_tp1_slices, tokens_for

    state = initialize("cpu", tensor_parallel_size=2)
    try:
        differences = {}
        for q_lora_rank in (24, None):
            config = mla_config(q_lora_rank=q_lora_rank, swiglu=True)
            plan = tensor_parallel_plan(state, ParallelismConfig(tensor_model_parallel_size=2,
                                                                 sequence_parallel=sequence_parallel))
            ours = build_gpt_model(config, state, seed=11, plan=plan)
            reference = build_gpt_model(config, SINGLE, seed=11)
            tokens = tokens_for(config)
            with torch.no_grad():
                differences[q_lora_rank] = (ours(tokens[:, :-1], tokens[:, 1:])
                                            - reference(tokens[:, :-1], tokens[:, 1:])).abs().max().item()
            check_gradients_are_tp1_slices(ours, reference, tokens, state)
        return differences
    finally:
        destroy(state)


@pytest.mark.parametrize("sequence_parallel", [False, True])
def test_mla_at_tp2_equals_tp1(sequence_parallel):
    """Megatron-Core's MLASelfAttention under TP: heads split (linear_q_up_proj / linear_q_proj and linear_kv_up_proj
    column-parallel, linear_proj row-parallel); the down projections duplicated, under sequence parallelism on the
    rank's slice with k_pos_emb gathered along the sequence (_qkv_down_projection, get_query_key_value_tensors).
    Per-token losses equal the TP 1 model's (<= 1e-6) and each rank's gradients are its slices of TP 1's (the
    replicated down projections' and latent norms' whole)."""
    for per_rank in run_distributed(_tp2_against_tp1, 2, sequence_parallel, timeout=300):
        assert all(difference <= 1e-6 for difference in per_rank.values()), per_rank


MLA_FLAGS = ["--num-layers", "2", "--multi-latent-attention", "--q-lora-rank", "32", "--kv-lora-rank", "16",
             "--qk-head-dim", "16", "--qk-pos-emb-head-dim", "8", "--v-head-dim", "16", "--qk-layernorm",
             "--normalization", "RMSNorm", "--position-embedding-type", "rope", "--disable-bias-linear",
             "--rotary-scaling-factor", "40", "--mscale", "1.0", "--mscale-all-dim", "1.0", "--seed", "5",
             "--hidden-dropout", "0", "--attention-dropout", "0"]


def test_an_mla_run_saved_and_resumed_continues_exactly(corpus_cache_300, tmp_path):
    """The MLA projections and latent norms are parameters under their own names: a save at iteration 2 resumes to
    the straight run's losses, bitwise."""
    from tests.reliability_helpers import TINY, straight_and_resumed

    argv = TINY + MLA_FLAGS + ["--train-iters", "4", "--data-cache-dir", corpus_cache_300]
    straight, split, _ = straight_and_resumed(argv, tmp_path, exit_interval=2)
    assert len(straight) == 4
    assert [(r["iteration"], r["loss"]) for r in straight] == [(r["iteration"], r["loss"]) for r in split]


@pytest.mark.slow
def test_mla_at_tp2_with_sp_and_zero3_trains_as_tp1(corpus_cache_300, tmp_path):
    """pretrain_gpt.py end to end: TP 2 with --sequence-parallel under ZeRO-3 (the replicated down projections are
    ordinary parameters to ZeRO) logs the TP 1 run's losses, to fp32 rounding."""
    from tests.distributed import free_port
    from tests.reliability_helpers import TINY
    from tests.training.test_moe_training import launch_rank

    common = TINY + MLA_FLAGS + ["--train-iters", "3", "--data-cache-dir", corpus_cache_300]
    tp1 = tmp_path / "tp1.jsonl"
    assert train(corpus_cache_300, tmp_path, *MLA_FLAGS, "--train-iters", "3", "--metrics-file", str(tp1)).code == 0
    tp2 = tmp_path / "tp2.jsonl"
    argv = common + ["--tensor-model-parallel-size", "2", "--sequence-parallel", "--zero-stage", "3",
                     "--metrics-file", str(tp2)]
    run_distributed(launch_rank, 2, [argv], [free_port()], timeout=600)

    def losses(path):
        return [r["loss"] for r in metrics_records(path) if "loss" in r and "split" not in r]

    assert len(losses(tp1)) == 3
    assert losses(tp2) == pytest.approx(losses(tp1), rel=1e-5, abs=0)


def test_mla_pads_the_values_only_where_a_fused_cuda_kernel_may_run_and_padding_changes_nothing():
    """SDPA's flash kernel takes one head width for q, k and v; MLA's values are narrower (v_head_dim 128 beside
    qk 128 + 64): on CUDA they are zero-padded and the context cut back (Megatron-Core pads V for its THD kernels,
    multi_latent_attention.py _prepare_mla_core_attention_value). The padded computation is exact (checked here on
    the CPU, where the default path pads nothing)."""
    from gpt.mla import mla_core_attention, value_needs_padding

    assert value_needs_padding("auto", "cuda", 192, 128) and value_needs_padding("flash", "cuda", 192, 128)
    assert not value_needs_padding("unfused", "cuda", 192, 128) and not value_needs_padding("auto", "cpu", 192, 128)
    assert not value_needs_padding("flash", "cuda", 128, 128)
    generator = torch.Generator().manual_seed(4)
    q, k = (torch.randn(2, 3, 7, 12, generator=generator, dtype=torch.float64) for _ in range(2))
    v = torch.randn(2, 3, 7, 5, generator=generator, dtype=torch.float64)
    plain = mla_core_attention(q, k, v, 0.3, 0.0, None, pad_value=False)
    padded = mla_core_attention(q, k, v, 0.3, 0.0, None, pad_value=True)
    assert padded.shape == plain.shape == (2, 3, 7, 5)
    torch.testing.assert_close(padded, plain, rtol=0, atol=1e-12)



# ---- context parallelism: CP 2 (and 4) train to the CP 1 run's losses --------------------------------------------

CP_ITERS = 3
_Q_LORA = MLA_FLAGS.index("--q-lora-rank")
NO_Q_LORA = MLA_FLAGS[:_Q_LORA] + MLA_FLAGS[_Q_LORA + 2:]
FOUR_HEADS = ["--num-attention-heads", "4"]  # a2a+p2p's all-to-all splits each rank's heads over 2
# the values zero-padded to the query width for SDPA's flash kernel (gpt/mla.py value_needs_padding), as on CUDA
FLASH = ["--attention-backend", "flash"]
CP_RUNS = {  # name: (world, its reference at CP 1, the flags beside MLA_FLAGS or NO_Q_LORA)
    "p2p": (2, "cp1", ["--context-parallel-size", "2", "--cp-comm-type", "p2p"]),
    "all_gather": (2, "cp1", ["--context-parallel-size", "2", "--cp-comm-type", "all_gather"]),
    "a2a": (2, "cp1", ["--context-parallel-size", "2", "--cp-comm-type", "a2a"]),
    "p2p-no-q-lora": (2, "cp1-no-q-lora", ["--context-parallel-size", "2", "--cp-comm-type", "p2p"]),
    "all_gather-no-q-lora": (2, "cp1-no-q-lora", ["--context-parallel-size", "2", "--cp-comm-type", "all_gather"]),
    "a2a-no-q-lora": (2, "cp1-no-q-lora", ["--context-parallel-size", "2", "--cp-comm-type", "a2a"]),
    "all_gather-flash": (2, "cp1-flash", ["--context-parallel-size", "2", "--cp-comm-type", "all_gather", *FLASH]),
    "a2a-flash": (2, "cp1-flash", ["--context-parallel-size", "2", "--cp-comm-type", "a2a", *FLASH]),
    "tp2-sp-p2p": (4, "cp1", ["--context-parallel-size", "2", "--cp-comm-type", "p2p",
                              "--tensor-model-parallel-size", "2", "--sequence-parallel"]),
    "a2a+p2p": (4, "cp1-4-heads", ["--context-parallel-size", "4", "--cp-comm-type", "a2a+p2p",
                                   "--hierarchical-context-parallel-sizes", "2", "2", *FOUR_HEADS]),
}
CP_REFERENCES = {"cp1": [], "cp1-no-q-lora": [], "cp1-4-heads": FOUR_HEADS, "cp1-flash": FLASH}


def _cp_argv(corpus, directory, name, flags):
    from tests.reliability_helpers import TINY

    model = NO_Q_LORA if "no-q-lora" in name else MLA_FLAGS
    # weights 10x Megatron's default std: scores large enough that a position off shows in the loss; --report-memory
    # measures what each rank keeps for backward, for the planner's test
    return TINY + model + ["--train-iters", str(CP_ITERS), "--global-batch-size", "4", "--init-method-std", "0.2",
                           "--data-cache-dir", corpus, "--metrics-file", str(directory / f"{name}.jsonl"),
                           "--report-memory", *flags]


def _grid(rank, world_size, runs):
    """One grid for runs of one parallel layout (pretrain_gpt.py's initialize_grid), the runs one after the other."""
    import pretrain_gpt
    from parallel.state import destroy, initialize_grid

    state = initialize_grid("cpu", parse_config(runs[0]).parallel, timeout_minutes=5)
    try:
        for argv in runs:
            pretrain_gpt.run(parse_config(argv), state)
    finally:
        destroy(state)


@pytest.fixture(scope="module")
def cp_runs(corpus_cache_300, tmp_path_factory):
    """The CP 1 references in this process, then one launch per parallel layout (CP 2; TP 2 x CP 2; CP 4)."""
    import pretrain_gpt
    from tests.reliability_helpers import run_main

    directory = tmp_path_factory.mktemp("mla-cp")
    for name, flags in CP_REFERENCES.items():
        outcome = run_main(pretrain_gpt.main, _cp_argv(corpus_cache_300, directory, name, flags))
        assert outcome.code == 0, outcome.err[-3000:]
    layouts = {}
    for name, (world, _, flags) in CP_RUNS.items():
        argv = _cp_argv(corpus_cache_300, directory, name, flags)
        config = parse_config(argv)
        layouts.setdefault((world, config.parallel.tensor_model_parallel_size,
                            config.parallel.context_parallel_size), []).append(argv)
    for (world, _, _), runs in layouts.items():
        run_distributed(_grid, world, runs, timeout=600)
    return directory


def _losses_and_norms(directory, name):
    return [(r["loss"], r["grad_norm"]) for r in metrics_records(directory / f"{name}.jsonl")
            if "loss" in r and "split" not in r]


@pytest.mark.slow
@pytest.mark.parametrize("name", CP_RUNS)
def test_mla_under_context_parallelism_trains_to_the_cp1_losses(cp_runs, name):
    """Megatron-LM runs --multi-latent-attention under --context-parallel-size (TransformerEngine's context-parallel
    attention takes MLA's value width and softmax scale): each rank's chunks get the rotary angles of their global
    positions (YaRN at --rotary-scaling-factor 40, its concentration and MLA's mscale^2 scale), attention runs over
    the whole sequence by each --cp-comm-type, each of p2p, all_gather and a2a with and without --q-lora-rank, the
    last two with the values padded for the flash kernel too (against CP 1's padded run), beside TP 2 with
    --sequence-parallel. fp32, 3 iterations: the losses and gradient norms of one rank's run, relative 1e-6 (the ring
    merges partial softmaxes by log-sum-exp, the gathered and head-split calls reduce over keys in another order, and
    the gradients are summed over the CP ranks: not bitwise)."""
    reference = _losses_and_norms(cp_runs, CP_RUNS[name][1])
    got = _losses_and_norms(cp_runs, name)
    assert len(got) == len(reference) == CP_ITERS
    for iteration, ((loss, norm), (want_loss, want_norm)) in enumerate(zip(got, reference), start=1):
        assert abs(loss - want_loss) <= 1e-6 * abs(want_loss), f"{name} iteration {iteration}: {loss} vs {want_loss}"
        assert abs(norm - want_norm) <= 1e-6 * abs(want_norm), f"{name} iteration {iteration}: {norm} vs {want_norm}"


def test_the_planner_counts_the_mla_rings_keys_and_values_at_their_own_widths():
    """The ring passes K (qk_head_dim + qk_pos_emb_head_dim wide) and V (v_head_dim) as one message per head: the
    planner's dry run (the model's own code on the meta device) and its performance model's K/V width both count
    MLA's widths, not one head width. Per layer and micro-batch a rank sends the message CP - 1 times in forward and
    again in backward, and its fp32 gradient accumulator CP times."""
    from planner.dry_run import Cluster, dry_run
    from planner.layout_perf import model_counts
    from tests.reliability_helpers import TINY

    config = parse_config(TINY + MLA_FLAGS + ["--context-parallel-size", "2", "--global-batch-size", "4"])
    model, micro, cp = config.model, config.training.micro_batch_size, 2
    steps = config.training.global_batch_size // micro
    widths = model.mla.qk_head_dim + model.mla.qk_pos_emb_head_dim + model.mla.v_head_dim
    assert model_counts(model).kv_width == model.num_attention_heads * widths == 2 * (24 + 16)
    message = micro * model.num_attention_heads * (model.seq_length // cp) * widths * 4  # fp32
    sent = dry_run(config, Cluster(2, 2, device_type="cpu"), 300).comm_bytes["cp"]["send"]
    assert sent == model.num_layers * steps * ((cp - 1) * message * 2 + cp * message)


def _saved_per_rank(directory, name) -> list[int]:
    """Each rank's peak saved-for-backward bytes over the first iteration (--report-memory's, zero/activations.py)."""
    (memory,) = [r["memory"] for r in metrics_records(directory / f"{name}.jsonl") if "memory" in r]
    return [rank["saved_activation_device_bytes"] + rank["saved_activation_host_bytes"] for rank in memory]


def _planned_saved(argv, world, rank, device_type="cpu") -> int:
    from data.corpus import prepare_default_corpus
    from planner.dry_run import Cluster, dry_run

    config = parse_config(argv)
    vocab = prepare_default_corpus(config.data.data_cache_dir, 300).vocab_size
    plan = dry_run(config, Cluster(world, world, device_type=device_type), vocab, rank=rank)
    return plan.saved_activation_bytes["device"] + plan.saved_activation_bytes["host"]


@pytest.mark.slow
def test_the_planner_plans_what_each_mla_cp_rank_keeps_for_backward(cp_runs, corpus_cache_300):
    """The planner's saved-for-backward bytes of each run above (its first and last rank) against its --report-memory:
    the dry run is the model's code on the meta device, so it keeps MLA's CP buffers at their widths (all_gather's
    gathered keys at qk_head_dim + qk_pos_emb_head_dim and values at v_head_dim, a2a's head-split q/k/v and its
    context at v_head_dim twice, the ring's q, k, v, output and log-sum-exp). Byte counts of shapes: equal, exactly.
    On a CPU under auto, SDPA's flash kernel takes no narrower values and the math path runs (planned so); a CUDA run
    pads the values (gpt/mla.py value_needs_padding), which the meta tensors do not say: the stand-in
    (planner/attention_kernel.py) pads them, so a CUDA plan (auto) keeps what the CPU run with --attention-backend
    flash, which pads them on every device, measured."""
    for name in [*CP_REFERENCES, *CP_RUNS]:
        world, flags = (CP_RUNS[name][0], CP_RUNS[name][2]) if name in CP_RUNS else (1, CP_REFERENCES[name])
        argv = _cp_argv(corpus_cache_300, cp_runs, name, flags)
        measured = _saved_per_rank(cp_runs, name)
        for rank in sorted({0, world - 1}):  # the first and the last CP rank (their chunks differ)
            assert _planned_saved(argv, world, rank) == measured[rank], (name, rank)
            if "flash" in name:
                auto = [arg for arg in argv if arg not in FLASH]
                assert _planned_saved(auto, world, rank, "cuda") == measured[rank], (name, rank, "cuda")
