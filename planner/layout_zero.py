"""ZeRO stages 2 and 3 as choices of the layout search: which stages a layout may run, their
memory and their data-parallel communication, as this project runs them (zero/, docs/zero.md).

The search (planner/layout_search.py) chooses per layout among plain DDP (stage 0), Megatron's distributed
optimizer (stage 1, `--use-distributed-optimizer`; priced in planner/layout_perf.py) and this project's
`--zero-stage 2` and `--zero-stage 3`, priced here:

  stage 2  the optimizer state and the fp32 gradients 1/DP. No full gradient exists, so every micro-batch
           reduce-scatters its gradients as backward produces them (zero/grad_reducer.py,
           PartitionedGradients: "This must happen every micro-batch"), overlapped with that backward
           (--overlap-grad-reduce, on by default); the 16-bit parameters are all-gathered once after the
           step, hidden behind the next forward with --overlap-param-gather (zero/param_storage.py). Per
           step: m reduce-scatters and one all-gather, against stage 1's one and one (the ZeRO paper's 2 Psi
           per step, Rajbhandari et al. 2020 section 7.2.1, is the m = 1 case). Memory: one reduce bucket of
           --reduce-bucket-size elements (5e8 by default, capped at the rank's parameters; a bucket fills
           after the previous one's reduction is waited for, zero/grad_reducer.py _bucket_for) and one
           reduce-scatter output of its shard: below 5e8 parameters a rank holds a whole fp32 gradient in its
           bucket, as stage 1 holds its gradient buffer, so stage 2 saves memory only above it.
  stage 3  parameters 1/DP too. One chunk per transformer block and one root chunk (embeddings, final norm,
           an untied output layer) are all-gathered before their forward and again before their backward,
           every micro-batch, and the gradients reduce-scattered every micro-batch (zero/stage3.py): 3 Psi
           per micro-batch, the ZeRO paper's 3 Psi per step (section 7.2.2) times m. The next chunks are
           prefetched within --stage3-prefetch-bucket-size elements (5e7; always at least the next one), so
           a gather is hidden behind the compute of the chunks before it, except where a pass opens: the
           root chunk's gather opens both the forward (its pre-hook runs first) and the backward (the output
           layer's gradient needs it first), and the first block's follows only the embedding lookup, so
           those are exposed every micro-batch. In backward the gathers and the reduce-scatters share the
           link. Memory: 16-bit parameters, fp32 gradients and optimizer state all 1/DP; gathered: the root
           chunk (gathered for the whole forward), the block in use and the blocks the prefetch window holds;
           two reduce buckets of the largest chunk (the root chunk's gradients arrive at both ends of the backward,
           its tied or untied output layer's first, while each block's bucket fills and reduces: BufferPool
           holds two) and one reduce-scatter output.
           Refused with pipeline parallelism here (arguments/config.py: DeepSpeed's pipeline engine refuses
           ZeRO-2/3; stage 3's per-block gathers are not wired to stages), so the search pairs it with PP 1.

At data-parallel size 1 (and an expert data-parallel size 1) every stage is the same run as plain DDP: the
search lists such a layout once, as plain DDP.

Megatron-LM's own switches for sharded gradients and parameters (--use-megatron-fsdp with
--data-parallel-sharding-strategy optim_grads / optim_grads_params, --use-torch-fsdp2) are translated here to
the same stages (arguments/megatron/flags.py, _resolve_fsdp); the search prints --zero-stage 2 / 3 because
what it prices is this project's implementation of them (its chunks, buckets and prefetch), and because
--use-torch-fsdp2 would also need an untied output layer (Megatron's validate_args).
"""

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
