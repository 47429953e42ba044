"""DeepSpeed-MoE's gating (gpt/moe/deepspeed_gating.py), as Megatron-DeepSpeed's --num-experts builds it, against
hand computations of github:microsoft/DeepSpeed deepspeed/moe/sharded_moe.py (top1gating, top2gating, topkgating,
_capacity: `capacity = ceil(num_tokens / num_experts * capacity_factor)`, at least min_capacity; top-2 passes
capacity_factor * 2, top-k capacity_factor * k) on a small example: which tokens each expert keeps and drops, the
kept weights, and l_aux."""

from __future__ import annotations

import math

import pytest
import torch

from gpt.moe.deepspeed_gating import deepspeed_capacity, top1gating, top2gating, topkgating

LOGITS = [[2.0, 1.0, 0.5, -1.0],
          [0.1, 0.3, 2.5, 0.0],
          [1.5, 1.4, -0.5, 0.2],
          [-1.0, 0.0, 0.3, 1.2],
          [0.7, -0.3, 0.9, 0.8],
          [0.0, 2.0, 1.0, 0.5]]
T, E = 6, 4


def softmax(row):
    exps = [math.exp(v) for v in row]
    return [e / sum(exps) for e in exps]


def ranked(row):
    return sorted(range(len(row)), key=lambda e: -row[e])


def test_capacity_is_deepspeeds():
    assert deepspeed_capacity(6, 4, 1.0, 4) == 4          # ceil(1.5) = 2, raised to min_capacity 4
    assert deepspeed_capacity(6, 4, 2 * 0.5, 0) == 2      # top-2 at factor 0.5: ceil(6 / 4 x 1) = 2
    assert deepspeed_capacity(64, 8, 3 * 1.25, 4) == 30   # top-3 at 1.25: ceil(8 x 3.75)


def test_top2_keeps_first_choices_before_second_ones_by_position_and_renormalizes():
    """capacity ceil(6 / 4 x 0.5 x 2) = 2; an expert's slots go to its first choices in token order, then its
    second choices (locations2 += the first choices' count); the two kept weights are renormalized; l_aux =
    E^2 x mean_e(mean_t(softmax) x mean_t(first choice))."""
    probs, indices, l_aux = top2gating(torch.tensor(LOGITS), 0.5, 0, True, second_expert_sampling=False)
    scores = [softmax(row) for row in LOGITS]
    first = [ranked(row)[0] for row in LOGITS]
    second = [ranked(row)[1] for row in LOGITS]
    slots = {e: [] for e in range(E)}
    for t in range(T):
        slots[first[t]].append((t, 0))
    for t in range(T):
        slots[second[t]].append((t, 1))
    kept = {choice for e in range(E) for choice in slots[e][:2]}
    expected_indices = [[first[t] if (t, 0) in kept else -1, second[t] if (t, 1) in kept else -1] for t in range(T)]
    assert indices.tolist() == expected_indices
    assert any(-1 in row for row in expected_indices)  # the example drops
    for t in range(T):
        g1 = scores[t][first[t]] if (t, 0) in kept else 0.0
        g2 = scores[t][second[t]] if (t, 1) in kept else 0.0
        assert probs[t].tolist() == pytest.approx([g1 / max(g1 + g2, 1.1920929e-07), g2 / max(g1 + g2, 1.1920929e-07)],
                                                  rel=1e-6)
    me = [sum(scores[t][e] for t in range(T)) / T for e in range(E)]
    ce = [sum(first[t] == e for t in range(T)) / T for e in range(E)]
    assert l_aux.item() == pytest.approx(sum(m * c for m, c in zip(me, ce)) / E * E * E, rel=1e-6)


def test_topk_keeps_the_highest_logits_per_expert_and_renormalizes():
    """k = 3, capacity ceil(6 / 4 x 0.5 x 3) = 3: each expert keeps the 3 of its tokens whose logits are highest
    (the "probs" policy on the top-k logits); l_aux = E^2 / k x mean_e(mean_t(softmax) x mean_t(chosen))."""
    probs, indices, l_aux = topkgating(torch.tensor(LOGITS), 3, 0.5, 0, True)
    scores = [softmax(row) for row in LOGITS]
    chosen = [set(ranked(row)[:3]) for row in LOGITS]
    kept = set()
    for e in range(E):
        mine = sorted((t for t in range(T) if e in chosen[t]), key=lambda t: -LOGITS[t][e])
        kept |= {(t, e) for t in mine[:3]}
    for t in range(T):
        order = ranked(LOGITS[t])[:3]
        assert indices[t].tolist() == [e if (t, e) in kept else -1 for e in order]
        total = sum(scores[t][e] for e in order if (t, e) in kept)
        assert probs[t].tolist() == pytest.approx([scores[t][e] / total if (t, e) in kept else 0.0 for e in order],
                                                  rel=1e-6, abs=1e-7)
    me = [sum(scores[t][e] for t in range(T)) / T for e in range(E)]
    ce = [sum(e in chosen[t] for t in range(T)) / T for e in range(E)]
    assert l_aux.item() == pytest.approx(sum(m * c for m, c in zip(me, ce)) / E * E * E / 3, rel=1e-6)


def test_top1_keeps_capacity_tokens_of_each_expert_at_random_with_their_softmax_weight():
    """capacity ceil(6 / 4 x 1) = 2: an expert chosen by 3 tokens keeps 2 of them (Random Token Selection), the
    others all theirs; a kept token's weight is its softmax probability, not renormalized; l_aux = E x
    sum_e mean_t(softmax) x mean_t(chosen)."""
    logits = torch.tensor(LOGITS + [[3.0, 0.0, 0.0, 0.0]])  # expert 0 is first for tokens 0, 2 and 6
    rows = logits.tolist()
    probs, indices, l_aux = top1gating(logits, 1.0, 0, True, generator=torch.Generator().manual_seed(0))
    first = [ranked(row)[0] for row in rows]
    counts = {e: first.count(e) for e in range(E)}
    capacity = math.ceil(7 / 4)
    kept = [t for t in range(7) if indices[t, 0] >= 0]
    assert all(indices[t, 0] == first[t] for t in kept)
    assert {e: sum(first[t] == e for t in kept) for e in range(E)} == {e: min(n, capacity) for e, n in counts.items()}
    assert [probs[t, 0].item() for t in range(7)] == pytest.approx(
        [softmax(rows[t])[first[t]] if t in kept else 0.0 for t in range(7)], rel=1e-6)
    me = [sum(softmax(row)[e] for row in rows) / 7 for e in range(E)]
    assert l_aux.item() == pytest.approx(E * sum(me[e] * counts[e] / 7 for e in range(E)), rel=1e-6)
    # --disable-moe-token-dropping: the capacity is the busiest expert's count, nothing dropped
    _, indices, _ = top1gating(logits, 1.0, 0, False)
    assert indices[:, 0].tolist() == first
