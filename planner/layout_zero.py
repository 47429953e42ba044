"""ZeRO stages 2 and 3 as choices of the layout search: which stages a layout may run, their
memory and their data-parallel communication, as this project runs them (zero/, docs/zero.md).

Beside plain DDP and Megatron's distributed optimizer (planner/layout_perf.py), this project's `--zero-stage 2` and
`3`, priced here (docs/planning.md, "ZeRO stages 2 and 3 in the search", has the measured comparison):
  stage 2  optimizer state and fp32 gradients 1/DP. No full gradient exists, so every micro-batch reduce-scatters its
           gradients behind its backward (zero/grad_reducer.py PartitionedGradients); the 16-bit parameters are
           all-gathered once after the step, behind the next forward with --overlap-param-gather: m reduce-scatters
           and one all-gather a step (the ZeRO paper's 2 Psi, section 7.2.1, is m = 1). Memory: one reduce bucket of
           --reduce-bucket-size elements (5e8, capped at the rank's parameters) and one reduce-scatter output.
  stage 3  parameters 1/DP too. Each block's chunk and the root chunk are gathered before their forward and again
           before their backward, and gradients reduce-scattered, every micro-batch (zero/stage3.py): 3 Psi per
           micro-batch (section 7.2.2). Prefetch within --stage3-prefetch-bucket-size (5e7) hides a gather behind
           the chunks before it, except where a pass opens (the root chunk in forward and backward, the first block
           in forward). Memory: the root chunk, the block in use and the prefetch window gathered, two reduce buckets
           of the largest chunk (BufferPool) and one reduce-scatter output. Refused with PP (arguments/config.py), so
           the search pairs it with PP 1.
At DP 1 every stage is plain DDP's run: listed once. Megatron-LM's --use-megatron-fsdp / --use-torch-fsdp2 translate
to these stages (arguments/megatron/flags.py); the search prints --zero-stage: it prices this project's implementation."""

from __future__ import annotations

from typing import Protocol

from zero.config import ZeroConfig

REDUCE_BUCKET_ELEMENTS = ZeroConfig.reduce_bucket_size
STAGE3_PREFETCH_ELEMENTS = ZeroConfig.stage3_prefetch_bucket_size
PARAMETER_BYTES, GRADIENT_BYTES, OPTIMIZER_BYTES = 2, 4, 12  # bf16 parameters, fp32 gradients, master + moments


class ShardingLayout(Protocol):  # planner/layout_perf.py's Layout
    tp: int
    pp: int
    ep: int
    stage: int


class ChunkCounts(Protocol):  # planner/layout_perf.py's ModelCounts
    layers: int
    root_parameters: int
    block_dense_parameters: int
    block_expert_parameters: int


def zero_stages(dp_group: int, expert_dp_group: int, pp: int) -> tuple[int, ...]:
    """The stages the search tries for one layout: the distributed optimizer, plain DDP, and this project's
    stages 2 and 3 (3 only without pipeline parallelism); plain DDP alone where nothing is data-parallel."""
    if dp_group <= 1 and expert_dp_group <= 1:
        return (0,)
    return (1, 0, 2) + ((3,) if pp == 1 else ())


def zero_label(stage: int) -> str:
    return {0: "none", 1: "distributed optimizer (ZeRO-1)", 2: "ZeRO-2 (--zero-stage 2)",
            3: "ZeRO-3 (--zero-stage 3)"}[stage]


def chunk_elements(counts: ChunkCounts, layout: ShardingLayout) -> tuple[float, float]:
    """Stage 3's root chunk and largest block chunk on one rank, in elements (a block's experts are split by
    EP, the rest by TP)."""
    return (counts.root_parameters / layout.tp,
            counts.block_dense_parameters / layout.tp + counts.block_expert_parameters / layout.ep)


def gathered_chunk_elements(counts: ChunkCounts, layout: ShardingLayout) -> float:
    """Stage 3's gathered parameters at the forward's peak: the root chunk, the block in use and the whole
    blocks the prefetch window takes ahead of it, at least one (zero/stage3.py, _prefetch)."""
    root, block = chunk_elements(counts, layout)
    ahead = min(max(1, int(STAGE3_PREFETCH_ELEMENTS // block)) if block else 0, max(counts.layers - 1, 0))
    return root + (1 + ahead) * block


def sharded_state_bytes(counts: ChunkCounts, layout: ShardingLayout, dense: float, experts: float,
                        dp_group: int, expert_dp_group: int) -> float:
    """Stage 2's or 3's model states, reduce buffers and (stage 3) gathered chunks on one rank. `dense` and
    `experts`: this rank's parameters before data-parallel sharding; each part is its own ZeRO (zero/experts.py),
    with its own buckets."""
    shard = dense / dp_group + experts / expert_dp_group
    states = shard * (GRADIENT_BYTES + OPTIMIZER_BYTES)
    if layout.stage == 3:
        states += shard * PARAMETER_BYTES + gathered_chunk_elements(counts, layout) * PARAMETER_BYTES
        root, block = chunk_elements(counts, layout)
        buckets = [(max(root, counts.block_dense_parameters / layout.tp), 2, dp_group)]
        if experts:  # the experts' own ZeRO has no root chunk: one block's experts at a time
            buckets.append((counts.block_expert_parameters / layout.ep, 1, expert_dp_group))
    else:
        states += (dense + experts) * PARAMETER_BYTES
        buckets = [(min(REDUCE_BUCKET_ELEMENTS, part), 1, group)
                   for part, group in ((dense, dp_group), (experts, expert_dp_group)) if part]
    # the bucket pool's buffers and one reduce-scatter output of a bucket's shard
    buffers = sum(bucket * (count + 1 / group) for bucket, count, group in buckets)
    return states + buffers * GRADIENT_BYTES


def sharded_dp_seconds(stage: int, parameters: float, group: int, opening_elements: float, link_bandwidth: float,
                       value_bytes: int, micro_batches: int, forward_s: float, backward_s: float,
                       hidden: bool) -> float:
    """The exposed data-parallel time per step of stage 2 or 3 for `parameters` elements of this rank reduced
    over `group` (the dense DP x CP group, or the expert DP group). `forward_s`, `backward_s`: the rank's compute
    per step the collectives can hide behind; `hidden` False where ranks share cores (nothing overlaps);
    `opening_elements`: stage 3's chunks gathered where a pass opens (stage3_opening_elements), exposed."""
    share = (group - 1) / group * parameters / link_bandwidth
    m = micro_batches
    reduce_s = m * share * GRADIENT_BYTES          # every micro-batch's reduce-scatter, fp32
    gather_s = share * value_bytes                 # stage 2: publishing after the step
    if stage == 2:
        if not hidden:
            return reduce_s + gather_s
        return max(0.0, reduce_s - backward_s) + max(0.0, gather_s - forward_s)
    gather_s *= m                                  # stage 3: one gather per pass per micro-batch
    if not hidden:
        return reduce_s + 2 * gather_s
    opening_s = m * (group - 1) / group * opening_elements * value_bytes / link_bandwidth
    return (opening_s + max(0.0, gather_s - opening_s / 2 - forward_s)
            + max(0.0, gather_s + reduce_s - opening_s / 2 - backward_s))


def stage3_opening_elements(counts: ChunkCounts, layout: ShardingLayout, experts: bool) -> float:
    """Elements stage 3 gathers where its passes open, exposed every micro-batch: the root chunk twice (forward
    and backward) and the first block in forward; of the experts' part, the first block's experts."""
    root, _ = chunk_elements(counts, layout)
    if experts:
        return counts.block_expert_parameters / layout.ep
    return 2 * root + counts.block_dense_parameters / layout.tp
