"""ZeRO stages 2 and 3 as choices of the layout search: which stages a layout may run, their memory and their
data-parallel communication as this project runs them (stage 3 refused with PP)."""

from __future__ import annotations

from typing import Protocol

from zero.config import ZeroConfig

REDUCE_BUCKET_ELEMENTS = ZeroConfig.reduce_bucket_size
STAGE3_PREFETCH_ELEMENTS = ZeroConfig.stage3_prefetch_bucket_size
PARAMETER_BYTES, GRADIENT_BYTES, OPTIMIZER_BYTES = 2, 4, 12  # bf16 parameters, fp32 gradients, master + moments


class ShardingLayout(Protocol):
    tp: int
    pp: int
    ep: int
    stage: int


class ChunkCounts(Protocol):
    layers: int
    root_parameters: int
    block_dense_parameters: int
    block_expert_parameters: int


def zero_stages(dp_group: int, expert_dp_group: int, pp: int) -> tuple[int, ...]:
    """The stages the search tries: the distributed optimizer, plain DDP, stage 2, and stage 3 without PP."""
    if dp_group <= 1 and expert_dp_group <= 1:
        return (0,)
    return (1, 0, 2) + ((3,) if pp == 1 else ())


def zero_label(stage: int) -> str:
    return {0: "none", 1: "distributed optimizer (ZeRO-1)", 2: "ZeRO-2 (--zero-stage 2)",
            3: "ZeRO-3 (--zero-stage 3)"}[stage]


def chunk_elements(counts: ChunkCounts, layout: ShardingLayout) -> tuple[float, float]:
    return (counts.root_parameters / layout.tp,
            counts.block_dense_parameters / layout.tp + counts.block_expert_parameters / layout.ep)


def gathered_chunk_elements(counts: ChunkCounts, layout: ShardingLayout) -> float:
    """Stage 3's gathered parameters at the forward's peak: the root chunk, the block in use and the prefetch window."""
    root, block = chunk_elements(counts, layout)
    ahead = min(max(1, int(STAGE3_PREFETCH_ELEMENTS // block)) if block else 0, max(counts.layers - 1, 0))
    return root + (1 + ahead) * block


def sharded_state_bytes(counts: ChunkCounts, layout: ShardingLayout, dense: float, experts: float,
                        dp_group: int, expert_dp_group: int) -> float:
    """Stage 2's or 3's model states, buffers and gathered chunks on one rank, for its `dense` and `experts` parameters
    before data-parallel sharding."""
    shard = dense / dp_group + experts / expert_dp_group
    states = shard * (GRADIENT_BYTES + OPTIMIZER_BYTES)
    if layout.stage == 3:
        states += shard * PARAMETER_BYTES + gathered_chunk_elements(counts, layout) * PARAMETER_BYTES
        root, block = chunk_elements(counts, layout)
        buckets = [(max(root, counts.block_dense_parameters / layout.tp), 2, dp_group)]
        if experts:
            buckets.append((counts.block_expert_parameters / layout.ep, 1, expert_dp_group))
    else:
        states += (dense + experts) * PARAMETER_BYTES
        buckets = [(min(REDUCE_BUCKET_ELEMENTS, part), 1, group)
                   for part, group in ((dense, dp_group), (experts, expert_dp_group)) if part]
    buffers = sum(bucket * (count + 1 / group) for bucket, count, group in buckets)
    return states + buffers * GRADIENT_BYTES


def sharded_dp_seconds(stage: int, parameters: float, group: int, opening_elements: float, link_bandwidth: float,
                       value_bytes: int, micro_batches: int, forward_s: float, backward_s: float,
                       hidden: bool) -> float:
    """The exposed data-parallel time per step of stage 2 or 3: what the collectives add beyond the compute `forward_s`
    and `backward_s` hides (nothing hides where ranks share cores), stage 3's pass openings always exposed."""
    share = (group - 1) / group * parameters / link_bandwidth
    m = micro_batches
    reduce_s = m * share * GRADIENT_BYTES
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
    """Elements stage 3 gathers, exposed, where its passes open."""
    root, _ = chunk_elements(counts, layout)
    if experts:
        return counts.block_expert_parameters / layout.ep
    return 2 * root + counts.block_dense_parameters / layout.tp
