"""The expert-parallel dispatch and combine in the layout model: the copies of each token a dispatcher sends over NVLink
and over InfiniBand under force-balanced routing, and what the combined 1F1B schedule hides."""

from __future__ import annotations

import itertools
from functools import lru_cache
from math import comb
from typing import Optional

DISPATCHERS = ("alltoall", "allgather", "deepep", "hybridep")


@lru_cache(maxsize=None)
def _p_untouched(held: tuple[int, ...], experts: int, topk: int, groups: int, group_topk: int) -> float:
    """Probability that none of a token's experts lies in a set holding `held[i]` experts of each group it meets
    (uniform routing, or group-limited; within 2-6% of a simulation of Megatron's router)."""
    group_size = experts // groups
    per_group = topk // group_topk
    met = len(held)
    total = 0.0
    for chosen in range(0, min(met, group_topk) + 1):
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
    group_size = experts // groups
    held = []
    for group in range(first // group_size, (first + count - 1) // group_size + 1):
        low, high = max(first, group * group_size), min(first + count, (group + 1) * group_size)
        held.append(high - low)
    return 1.0 - _p_untouched(tuple(sorted(held)), experts, topk, groups, group_topk)


@lru_cache(maxsize=None)
def copies_per_token(dispatcher: str, experts: int, topk: int, group: int, ranks_per_node: int,
                     groups: Optional[int] = None, group_topk: Optional[int] = None) -> tuple[float, float]:
    """(NVLink, InfiniBand) copies a rank sends per dispatched token over `group` consecutive ranks: one per selected
    expert (alltoall), per rank (allgather) or per selected node (deepep, hybridep)."""
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
    return nodes * (local - 1) * rank_hit, (nodes - 1) * node_hit


def unpaired_fraction(pp: int, vp: int, micro_batches: int) -> float:
    """The share of passes the combined 1F1B schedule runs without a partner on the first pipeline rank."""
    if pp <= 1:
        return min(1.0, 1.0 / micro_batches)
    chunks = micro_batches * vp
    warmup = (pp - 1) * 2 + (vp - 1) * pp + 1 if vp > 1 else pp - 1
    return min(1.0, warmup / chunks)


def exposed_ep_seconds(ep_s: float, compute_s: float, overlap: bool, unpaired: float) -> float:
    """The all-to-all time a step does not hide."""
    if not overlap:
        return ep_s
    paired = 1.0 - unpaired
    return ep_s * unpaired + max(0.0, ep_s * paired - compute_s * paired)
