"""The expert-parallel dispatch and combine in the layout model (planner/layout_perf.py's `ep` term): how many copies of
each token a dispatcher sends over NVLink and over InfiniBand, and how much of that time Megatron-Core's combined 1F1B
schedule hides. Dispatchers (--moe-token-dispatcher-type, --moe-flex-dispatcher-backend), L an EP group's ranks per
node, G its size:
  alltoall  MoEAlltoAllTokenDispatcher: one all-to-all sends a token once per selected expert, k copies, k / G to each
            rank on average, (L - 1) of them over NVLink and G - L over InfiniBand (this project's alltoall the same).
  allgather MoEAllGatherTokenDispatcher: a token goes to every other rank: L - 1 copies over NVLink, G - L over IB.
  deepep, hybridep  the flex dispatcher's backends send a token once to each node holding one of its experts (RDMA, to
            the rank of the same local index), which forwards it once over NVLink to each rank there holding one
            (DeepEP's README; Megatron-Core's moe/README.md: "removes redundant tokens during cross-node
            communication"); a rank receives a token once however many experts it selected there (DeepEP #58).
Routing: Bridge's benchmarks force-balance the tokens (moe_router_force_load_balancing: RandomSTE), so a token's k
experts are a uniform draw of k of E, or under group-limited routing k / group_topk from each of group_topk uniformly
drawn groups (`_p_untouched`); the expected counts are exact for those draws, an EP rank holding E / G contiguous
experts (Megatron's expert grid keeps EP ranks consecutive: parallel_state.py orders expert-TP fastest, then EP).
Overlap (--overlap-moe-expert-parallel-comm with --delay-wgrad-compute; combined_1f1b.py): one micro-batch's forward
runs beside another's backward, so each pass's all-to-alls hide behind the other's compute and only the excess is
exposed. The forwards before the first backward (and as many backwards at the end) have no partner: schedules.py's
get_pp_rank_microbatches gives the first pipeline rank (PP - 1) x 2 + (VP - 1) x PP + 1 of them (the overlap needs
interleaving with PP > 1); with no pipeline the first forward and last backward run alone. Theirs are exposed whole."""

from __future__ import annotations

import itertools
from functools import lru_cache
from math import comb
from typing import Optional

DISPATCHERS = ("alltoall", "allgather", "deepep", "hybridep")


@lru_cache(maxsize=None)
def _p_untouched(held: tuple[int, ...], experts: int, topk: int, groups: int, group_topk: int) -> float:
    """Probability that none of a token's experts lies in a set of experts, the set holding `held[i]` experts of the
    i-th group it meets. Without group-limited routing (one group of every expert) the k experts are a uniform draw;
    with it each of the token's group_topk groups gives it k / group_topk of its experts, a uniform draw inside the
    group: Megatron ranks the groups by the sum of their top k / group_topk scores (moe_utils.py group_limited_topk),
    so a chosen group is one whose best experts are the token's. The top k over the chosen groups takes one more or one
    fewer from a group at times, which reaches fewer ranks: against a simulation of Megatron's router
    (tests/planner/test_layout_ep.py) the copies are within 2% where a group is a node's experts (DeepSeek-V3's
    node-limited routing at EP 64) and up to 6% over where groups and nodes do not align."""
    group_size = experts // groups
    per_group = topk // group_topk
    met = len(held)
    total = 0.0
    for chosen in range(0, min(met, group_topk) + 1):
        # `chosen` of the met groups among the token's group_topk groups, the rest from the groups it does not meet
        ways_rest = comb(groups - met, group_topk - chosen)
        if ways_rest == 0:
            continue
        for subset in itertools.combinations(held, chosen):
            missed = 1.0
            for inside in subset:
                missed *= comb(group_size - inside, per_group) / comb(group_size, per_group)
            total += ways_rest * missed
    return total / comb(groups, group_topk)


def _hit_probability(first: int, count: int, experts: int, topk: int, groups: int, group_topk: int) -> float:
    """Probability that a token selects at least one of the experts first .. first + count - 1."""
    group_size = experts // groups
    held = []
    for group in range(first // group_size, (first + count - 1) // group_size + 1):
        low, high = max(first, group * group_size), min(first + count, (group + 1) * group_size)
        held.append(high - low)
    return 1.0 - _p_untouched(tuple(sorted(held)), experts, topk, groups, group_topk)


@lru_cache(maxsize=None)
def copies_per_token(dispatcher: str, experts: int, topk: int, group: int, ranks_per_node: int,
                     groups: Optional[int] = None, group_topk: Optional[int] = None) -> tuple[float, float]:
    """(NVLink copies, InfiniBand copies) a rank sends per token it dispatches (and receives back per token in the
    combine) over an EP group of `group` consecutive ranks, `ranks_per_node` of them per node (module docstring)."""
    if group <= 1:
        return 0.0, 0.0
    local = min(group, ranks_per_node)
    if dispatcher == "alltoall":
        return topk * (local - 1) / group, topk * (group - local) / group
    if dispatcher == "allgather":
        return float(local - 1), float(group - local)
    if dispatcher not in DISPATCHERS:
        raise ValueError(f"dispatcher {dispatcher!r}: one of {', '.join(DISPATCHERS)}")
    groups, group_topk = (groups, group_topk) if groups and group_topk else (1, 1)
    per_rank, nodes = experts // group, group // local
    rank_hit = sum(_hit_probability(r * per_rank, per_rank, experts, topk, groups, group_topk)
                   for r in range(group)) / group
    node_hit = sum(_hit_probability(n * per_rank * local, per_rank * local, experts, topk, groups, group_topk)
                   for n in range(nodes)) / nodes
    # over NVLink: the other ranks of this node it selects, and on each other node the ranks it selects besides the
    # one the RDMA copy lands on (which forwards it); over RDMA: one copy per other node it selects
    return nodes * (local - 1) * rank_hit, (nodes - 1) * node_hit


def unpaired_fraction(pp: int, vp: int, micro_batches: int) -> float:
    """The share of a step's forward (and backward) passes the combined 1F1B schedule runs with no partner pass on the
    first pipeline rank (module docstring)."""
    if pp <= 1:
        return min(1.0, 1.0 / micro_batches)
    chunks = micro_batches * vp
    warmup = (pp - 1) * 2 + (vp - 1) * pp + 1 if vp > 1 else pp - 1  # (PP > 1 without VP: not a Megatron run)
    return min(1.0, warmup / chunks)


def exposed_ep_seconds(ep_s: float, compute_s: float, overlap: bool, unpaired: float) -> float:
    """The all-to-all time a step does not hide: all of it without the overlap; with it, the unpaired passes' share
    whole and the rest beyond the compute it runs beside."""
    if not overlap:
        return ep_s
    paired = 1.0 - unpaired
    return ep_s * unpaired + max(0.0, ep_s * paired - compute_s * paired)
