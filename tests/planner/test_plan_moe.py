"""Issue 51 item 7: the planner plans a mixture of experts (planner/moe_plan.py, planner/dry_run.py).

Each expected figure here is hand-computed from the stated routing and the model's shapes, not read back from the
code under test:
- the dispatchers' exchanges under expert parallelism, for uniform routing: Megatron-Core's
  MoEAlltoAllTokenDispatcher (megatron/core/transformer/moe/token_dispatcher.py) sends each of a rank's T x K rows to
  the rank of its expert, forward (dispatch, then combine back) and the same again in backward; with every expert
  equally likely, (EP - 1) / EP of the rows leave. MoEAllGatherTokenDispatcher gathers the tokens, probs and
  choices over the EP group and reduce-scatters the combined output;
- the experts' own states: fp32 ZeRO stage 1 over an expert data-parallel group of 1 holds parameters, gradients,
  master and two moments of each local expert's parameters, 20 bytes each;
- the worst case: dropless, every token of the EP group routes its k choices to this rank's experts; with
  --moe-expert-capacity-factor each source rank keeps at most moe_utils.get_capacity(T x k, E, factor) =
  ceil(T x k / E x factor) rows an expert (megatron/core/transformer/moe/moe_utils.py get_capacity).
"""

from __future__ import annotations

import math

from arguments.parser import parse_config
from planner.dry_run import Cluster, dry_run
from planner.plan import format_plan

LAYERS, HIDDEN, FFN, EXPERTS, TOPK, MICRO, SEQ, EP = 2, 64, 256, 4, 2, 2, 64, 2
TOKENS = MICRO * SEQ  # a rank's tokens a micro-batch
MOE = ["--num-layers", str(LAYERS), "--hidden-size", str(HIDDEN), "--num-attention-heads", "4",
       "--seq-length", str(SEQ), "--max-position-embeddings", str(SEQ), "--micro-batch-size", str(MICRO),
       "--global-batch-size", str(MICRO * EP), "--tokenizer-vocab-size", "512", "--zero-stage", "1",
       "--num-experts", str(EXPERTS), "--moe-router-topk", str(TOPK), "--moe-ffn-hidden-size", str(FFN),
       "--expert-model-parallel-size", str(EP)]


def plan_of(*extra, target="cpu"):
    config = parse_config([*MOE, *extra])
    return dry_run(config, Cluster(EP, 8, device_type=target), 512), config


def test_the_alltoall_dispatchers_rows_that_leave_a_rank_are_counted_for_uniform_routing():
    plan, _ = plan_of("--moe-token-dispatcher-type", "alltoall")
    leaving = TOKENS * TOPK * (EP - 1) // EP  # rows whose expert lives on the other EP rank
    exchanges = 4  # dispatch and combine, forward and backward
    assert plan.comm_bytes["ep"]["all_to_all"] == LAYERS * exchanges * leaving * HIDDEN * 4


def test_the_allgather_dispatchers_gathers_and_reduce_scatters_are_counted():
    plan, _ = plan_of("--moe-token-dispatcher-type", "allgather")
    # EP 2: a ring all-gather sends a rank's own piece once, a reduce-scatter the other rank's half of the sum.
    gathers = TOKENS * HIDDEN * 4 + TOKENS * TOPK * 4 + TOKENS * TOPK * 8  # tokens, probs, choices (int64)
    gathers += TOKENS * HIDDEN * 4  # backward of the combine's reduce-scatter: the output gradient gathered
    scatters = TOKENS * HIDDEN * 4  # the combined output
    scatters += TOKENS * HIDDEN * 4 + TOKENS * TOPK * 4  # backward of the tokens' and probs' gathers
    assert plan.comm_bytes["ep"]["all_gather"] == LAYERS * gathers
    assert plan.comm_bytes["ep"]["reduce_scatter"] == LAYERS * scatters


def test_the_experts_states_are_planned_as_their_own_line():
    plan, config = plan_of()
    per_expert = 2 * HIDDEN * FFN + FFN + HIDDEN  # two matrices and their biases (GPT's default)
    local = LAYERS * (EXPERTS // EP) * per_expert
    assert plan.moe.expert_parameters_local == local
    assert plan.moe.expert_data_parallel_size == 1
    # fp32 at stage 1 over an expert DP group of one: parameters, gradients, master, two moments; flat buffers
    # round each part up a little (alignment)
    assert math.isclose(plan.moe.expert_state_bytes["total"], 20 * local, rel_tol=1e-3)
    assert plan.moe.expert_state_bytes["total"] < plan.model_state_bytes["total"]
    text = format_plan(plan, Cluster(EP, 8, device_type="cpu"), config, "test")
    assert "of these four, the experts' (2 of 4 a layer at EP 2, 132,352 parameters; ZeRO over expert DP 1)" in text


def test_dropless_worst_case_is_every_token_of_the_ep_group_to_this_ranks_experts():
    plan, config = plan_of()
    moe = plan.moe
    assert moe.balanced_rows == TOKENS * TOPK  # EP 2: half of each rank's rows, from each of 2 ranks
    assert moe.dispatched_tokens == EP * TOKENS
    assert moe.worst_rows == EP * TOKENS * min(TOPK, EXPERTS // EP)
    assert moe.worst_expert_rows == EP * TOKENS  # a token picks an expert once
    # what the experts save a row: the grouped matmuls' row inputs (the rows, the activation's output), the
    # activation's input, and for each of the two biases the int64 row index its repeat_interleave (an
    # index_select) keeps for backward; and the grouped matmuls' int32 offsets, one a local expert (a layer's, not a
    # row's: gpt/moe/experts.py keeps them as torch's grouped_mm does)
    per_row = (HIDDEN + 2 * FFN) * 4 + 2 * 8 + (EXPERTS // EP) * 4 / moe.balanced_rows
    assert moe.saved_bytes_per_row == per_row
    assert moe.layers_held == LAYERS  # no activation checkpointing: every layer's saved tensors live at the peak
    assert moe.worst_extra_bytes == (moe.worst_rows - moe.balanced_rows) * per_row * LAYERS
    text = format_plan(plan, Cluster(EP, 8, device_type="cpu"), config, "test")
    assert "dropless: all tokens to this rank's experts, stated as such" in text
    assert "total with the worst-case routing" in text


def test_a_capacity_factor_bounds_the_worst_case_by_megatrons_capacity():
    plan, _ = plan_of("--moe-expert-capacity-factor", "1.0")
    capacity = math.ceil(TOKENS * TOPK / EXPERTS * 1.0)  # get_capacity(num_tokens * topk, experts, factor)
    assert plan.moe.capacity == capacity
    assert plan.moe.worst_expert_rows == EP * capacity
    assert plan.moe.worst_rows == (EXPERTS // EP) * EP * capacity


def test_with_activation_checkpointing_one_layers_experts_are_recomputed_at_a_time():
    plan, _ = plan_of("--checkpoint-activations")
    assert plan.moe.layers_held == 1
    # the forward saves nothing there; the recompute in backward saves what a plain forward does
    assert plan.moe.saved_bytes_per_row == (HIDDEN + 2 * FFN) * 4 + 2 * 8 + (EXPERTS // EP) * 4 / plan.moe.balanced_rows


def test_under_block_recompute_the_layers_not_recomputed_hold_their_experts_rows():
    """--recompute-method block over 3 MoE layers (Megatron-Core's first N layers of a chunk, tests/training/
    test_block_recompute.py): the layers past the first N keep their experts' rows at the end of the forward; the
    first ones are recomputed after those are freed, one at a time."""
    def held(*extra):
        return plan_of("--num-layers", "3", *extra)[0].moe.layers_held

    block = ("--checkpoint-activations", "--recompute-method", "block", "--checkpoint-num-layers")
    assert [held(), held(*block, "1"), held(*block, "2"), held(*block, "3"), held("--checkpoint-activations")] == \
        [3, 2, 1, 1, 1]


def test_the_backward_working_set_counts_the_experts_own_width_and_rows_and_the_shared_experts():
    """An MoE block's MLP backward holds its experts' activation gradients (one expert's --moe-ffn-hidden-size,
    features per row as gpt/shape.py reads the dense MLP's) for the rows its matmul takes at once, and the shared
    expert's (Megatron-Core's SharedExpertMLP, --moe-shared-expert-intermediate-size) for every token. Uniform
    routing at EP 2: each expert gets TOKENS x EP x k / E rows; on a CPU in fp32 F.grouped_mm runs this rank's
    experts as one matmul (gpt/moe/experts.py can_group), so all its rows at once. The plan counted the dense
    MLP's ffn (4 x hidden) on the rank's TOKENS instead."""
    moe_ffn, shared = 96, 512
    local_rows = (EXPERTS // EP) * TOKENS * EP * TOPK // EXPERTS
    boundaries = TOKENS * HIDDEN * 4
    plan, _ = plan_of("--moe-ffn-hidden-size", str(moe_ffn))
    assert plan.gradient_working_bytes - plan.logits_bytes - boundaries == local_rows * moe_ffn * 4
    plan, _ = plan_of("--moe-ffn-hidden-size", str(moe_ffn), "--moe-shared-expert-intermediate-size", str(shared))
    assert plan.gradient_working_bytes - plan.logits_bytes - boundaries == max(local_rows * moe_ffn, TOKENS * shared) * 4
