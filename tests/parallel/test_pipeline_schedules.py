"""The pipeline schedules as data (parallel/pipeline_schedules.py): the order of forward and backward slots
on every stage against Megatron-Core's tables (github:NVIDIA/Megatron-LM,
megatron/core/pipeline_parallel/schedules.py: forward_backward_pipelining_without_interleaving's
num_warmup_microbatches = pipeline_parallel_size - pipeline_parallel_rank - 1, and
forward_backward_pipelining_with_interleaving's (pp - rank - 1) * 2 + (num_model_chunks - 1) * pp with
get_model_chunk_id / get_microbatch_id_in_model_chunk), and a simulation of the executor's rule (sends never
wait, a receive waits for its message) that every schedule completes without deadlock."""

from __future__ import annotations

import pytest

from base.errors import ConfigError
from parallel.pipeline_schedules import Slot, interleaved_one_f_one_b, one_f_one_b, schedule


def _text(slots):
    return " ".join(f"{s.kind}{s.micro_batch}" + (f".{s.chunk}" if s.chunk else "") for s in slots)


def test_one_f_one_b_order_of_slots_on_every_stage():
    # Megatron's 1F1B with pp 4 and 6 micro-batches: rank r runs pp - r - 1 warm-up forwards.
    expected = {
        0: "F0 F1 F2 F3 B0 F4 B1 F5 B2 B3 B4 B5",
        1: "F0 F1 F2 B0 F3 B1 F4 B2 F5 B3 B4 B5",
        2: "F0 F1 B0 F2 B1 F3 B2 F4 B3 F5 B4 B5",
        3: "F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5",
    }
    for rank, table in expected.items():
        assert _text(one_f_one_b(6, 4, rank)) == table


def test_fewer_micro_batches_than_stages_warm_up_all_of_them():
    assert _text(one_f_one_b(2, 4, 0)) == "F0 F1 B0 B1"


def test_interleaved_order_of_slots_and_counts_on_every_stage():
    # pp 2, 2 chunks, 4 micro-batches: Megatron's groups of pp micro-batches per chunk.
    assert _text(interleaved_one_f_one_b(4, 2, 0, 2)) == \
        "F0 F1 F0.1 F1.1 F2 B0.1 F3 B1.1 F2.1 B0 F3.1 B1 B2.1 B3.1 B2 B3"
    assert _text(interleaved_one_f_one_b(4, 2, 1, 2)) == \
        "F0 F1 F0.1 B0.1 F1.1 B1.1 F2 B0 F3 B1 F2.1 B2.1 F3.1 B3.1 B2 B3"
    for pp, vp, m in ((2, 2, 4), (4, 2, 8), (2, 3, 6), (4, 2, 4)):
        for rank in range(pp):
            slots = interleaved_one_f_one_b(m, pp, rank, vp)
            # get_pp_rank_microbatches at d98e8a64: no special case for m == pp any more (older Megatron ran
            # every forward as warm-up there); all of them only where the count reaches vp x m
            warmup = min((pp - rank - 1) * 2 + (vp - 1) * pp, vp * m)
            forwards_before_first_backward = next(i for i, s in enumerate(slots) if s.kind == "B")
            # the warm-up forwards, then the steady phase's first forward (when there is a steady phase)
            assert forwards_before_first_backward == warmup + (warmup < vp * m)
            for kind in "FB":
                assert sorted((s.micro_batch, s.chunk) for s in slots if s.kind == kind) == \
                    [(mb, c) for mb in range(m) for c in range(vp)]


def test_interleaving_refuses_micro_batches_not_a_multiple_of_stages():
    with pytest.raises(ConfigError, match="multiple of --pipeline-model-parallel-size 2"):
        schedule(5, 2, 0, vp_size=2)


def _runs_without_deadlock(pp: int, vp: int, m: int) -> None:
    """Walk every rank's slots as the executor does: a forward of (chunk c, stage s) waits for the
    activation of (c, s - 1) (stage pp - 1 of chunk c - 1 for s = 0); a backward waits for the gradient
    from (c, s + 1) and for its own forward."""
    stages = pp * vp
    plans = {rank: schedule(m, pp, rank, vp) for rank in range(pp)}
    done: set = set()
    position = {rank: 0 for rank in range(pp)}
    while any(position[r] < len(plans[r]) for r in range(pp)):
        moved = False
        for rank in range(pp):
            if position[rank] == len(plans[rank]):
                continue
            slot: Slot = plans[rank][position[rank]]
            virtual = slot.chunk * pp + rank
            if slot.kind == "F":
                ready = virtual == 0 or ("F", slot.micro_batch, virtual - 1) in done
            else:
                ready = ("F", slot.micro_batch, virtual) in done and (
                    virtual == stages - 1 or ("B", slot.micro_batch, virtual + 1) in done)
            if ready:
                done.add((slot.kind, slot.micro_batch, virtual))
                position[rank] += 1
                moved = True
        assert moved, f"deadlock at pp {pp} vp {vp} m {m}: {position}"


@pytest.mark.parametrize("pp,vp,m", [(2, 1, 4), (4, 1, 8), (4, 1, 2), (2, 2, 4), (4, 2, 8), (2, 3, 6), (4, 2, 4)])
def test_every_schedule_completes_as_a_data_flow(pp, vp, m):
    _runs_without_deadlock(pp, vp, m)


def _most_sends_held(pp: int, vp: int, m: int, group: int | None = None, lag: int | None = None) -> int:
    """Walk every rank's slots under parallel/p2p.py's rule: a slot that receives posts its receive, then waits
    for the sends of its slots before the previous one (SEND_LAG; each send completes once its receiver has
    posted the matching receive) and for its message; a slot that receives nothing waits for those sends too;
    a slot's own sends are posted when it ends. Returns the
    most sends one rank held at once; fails on a deadlock, or if a send is never received."""
    from parallel.p2p import SEND_LAG

    SEND_LAG = SEND_LAG if lag is None else lag  # noqa: N806 (the rule's name in parallel/p2p.py)
    stages = pp * vp
    plans = {rank: schedule(m, pp, rank, vp, group_size=group) for rank in range(pp)}
    posted, sent = set(), set()
    held: dict[int, list] = {rank: [] for rank in range(pp)}  # (message, the slot that sent it)
    position = {rank: 0 for rank in range(pp)}
    most = 0
    while any(position[r] < len(plans[r]) for r in range(pp)):
        moved = False
        for rank in range(pp):
            index = position[rank]
            if index == len(plans[rank]):
                continue
            slot: Slot = plans[rank][index]
            virtual = slot.chunk * pp + rank
            needs = ("activation", slot.micro_batch, virtual) if slot.kind == "F" and virtual != 0 else \
                ("gradient", slot.micro_batch, virtual) if slot.kind == "B" and virtual != stages - 1 else None
            if needs is not None:
                moved |= needs not in posted  # a receive posted is progress: a neighbour's send can complete
                posted.add(needs)
            due = [message for message, sender in held[rank] if sender <= index - SEND_LAG]
            if (needs is not None and needs not in sent) or any(message not in posted for message in due):
                continue
            held[rank] = [(message, sender) for message, sender in held[rank] if sender > index - SEND_LAG]
            if slot.kind == "F" and virtual != stages - 1:
                held[rank].append((("activation", slot.micro_batch, virtual + 1), index))
            if slot.kind == "B" and virtual != 0:
                held[rank].append((("gradient", slot.micro_batch, virtual - 1), index))
            sent.update(message for message, _ in held[rank])
            most = max(most, len(held[rank]))
            position[rank] += 1
            moved = True
        assert moved, f"deadlock at pp {pp} vp {vp} m {m}: {position}"
    assert all(message in posted for messages in held.values() for message, _ in messages)  # finish_sends
    return most


@pytest.mark.parametrize("pp,vp", [(2, 1), (4, 1), (8, 1), (2, 2), (4, 2), (8, 2), (2, 3), (4, 4), (8, 5)])
def test_sends_complete_two_slots_on_without_deadlock_and_without_growing_with_micro_batches(pp, vp):
    """PipelineP2P holds a send only until its rank's slot two on (Megatron-Core waits a slot's sends with its
    receives): no schedule deadlocks under that rule, and a rank holds at most two sends at once, whatever the
    micro-batches (held to the iteration's end they grew with them: 144 GiB a GPU at GPT-3 175B; waited only at
    receives, the first stage held its warm-up's chunk-0 sends: 9 at PP 8 VP 5, 288 MiB at Bridge's Llama 3 70B)."""
    held = [_most_sends_held(pp, vp, m) for m in (pp, 2 * pp, 4 * pp, 8 * pp)]
    assert max(held) <= 2, held
    if vp == 1:  # 1F1B with any count of micro-batches, fewer than the stages included
        for m in (1, 2, 3, 5):
            _most_sends_held(pp, vp, m)


def _megatron_interleaved(m: int, pp: int, rank: int, vp: int, group: int) -> list[tuple[str, int, int]]:
    """Megatron-Core's interleaved order reproduced from megatron/core/pipeline_parallel/schedules.py
    (d98e8a64): get_schedule_table's (microbatch_id, model_chunk_id) table, get_pp_rank_microbatches'
    num_warmup_microbatches = (pp - rank - 1) * 2 + (num_model_chunks - 1) * microbatch_group_size_per_vp_stage
    (capped at the total), forward_backward_pipelining_with_interleaving's warm-up forwards, then forward k +
    warmup with backward k, then the cool-down backwards; get_model_chunk_id(k, forward=False) is
    num_model_chunks - table chunk - 1, and a chunk's backwards pop its input tensors first in, first out."""
    table = []
    for lo in range(0, m, group):
        hi = m if lo + group >= m else lo + group
        table += [(mb, c) for c in range(vp) for mb in range(lo, hi)]
    total = m * vp
    warmup = min((pp - rank - 1) * 2 + (vp - 1) * group, total)
    popped = {c: 0 for c in range(vp)}  # a chunk's backward takes its oldest forward's micro-batch
    order = [("F", *table[k]) for k in range(warmup)]

    def backward(k):
        chunk = vp - table[k][1] - 1
        popped[chunk] += 1
        return ("B", popped[chunk] - 1, chunk)

    for k in range(total - warmup):
        order += [("F", *table[k + warmup]), backward(k)]
    order += [backward(k) for k in range(total - warmup, total)]
    return order


@pytest.mark.parametrize("pp,vp,m,group", [(2, 2, 5, 3), (2, 2, 6, 3), (2, 3, 8, 4), (4, 2, 8, 8), (4, 2, 10, 5),
                                           (2, 2, 4, 2), (3, 2, 7, 4)])
def test_microbatch_group_size_orders_slots_as_megatrons_schedule_table(pp, vp, m, group):
    """--microbatch-group-size-per-virtual-pipeline-stage: each rank's slots equal Megatron's function above,
    every (micro-batch, chunk) runs once forward and once backward, and the whole schedule still flows."""
    for rank in range(pp):
        slots = schedule(m, pp, rank, vp, group_size=group)
        assert [(s.kind, s.micro_batch, s.chunk) for s in slots] == _megatron_interleaved(m, pp, rank, vp, group)
        for kind in "FB":
            assert sorted((s.micro_batch, s.chunk) for s in slots if s.kind == kind) == \
                [(mb, c) for mb in range(m) for c in range(vp)]
    # the docstring's example in Megatron: PP 2, N 3, M 5, VP 2 -> micro-batches 0 1 2 0 1 2 3 4 3 4
    if (pp, vp, m, group) == (2, 2, 5, 3):
        assert [s.micro_batch for s in schedule(m, pp, 1, vp, group_size=group) if s.kind == "F"] == \
            [0, 1, 2, 0, 1, 2, 3, 4, 3, 4]
    plans = {rank: schedule(m, pp, rank, vp, group_size=group) for rank in range(pp)}
    _flows(plans, pp, vp)


def _flows(plans, pp, vp):
    stages, done, position = pp * vp, set(), {rank: 0 for rank in plans}
    while any(position[r] < len(plans[r]) for r in plans):
        moved = False
        for rank, plan in plans.items():
            if position[rank] == len(plan):
                continue
            slot = plan[position[rank]]
            virtual = slot.chunk * pp + rank
            ready = (virtual == 0 or ("F", slot.micro_batch, virtual - 1) in done) if slot.kind == "F" else \
                ("F", slot.micro_batch, virtual) in done and (virtual == stages - 1
                                                               or ("B", slot.micro_batch, virtual + 1) in done)
            if ready:
                done.add((slot.kind, slot.micro_batch, virtual))
                position[rank] += 1
                moved = True
        assert moved, "deadlock"


def test_microbatch_group_size_is_refused_where_megatron_raises():
    """forward_backward_pipelining_with_interleaving: the group size must lie in [PP, M], and M mod group must
    be 0 or at least PP."""
    with pytest.raises(ConfigError, match="--microbatch-group-size-per-virtual-pipeline-stage 1: .*between"):
        schedule(4, 2, 0, 2, group_size=1)
    with pytest.raises(ConfigError, match="--microbatch-group-size-per-virtual-pipeline-stage 5: .*between"):
        schedule(4, 2, 0, 2, group_size=5)
    with pytest.raises(ConfigError, match="the last group of the 7 micro-batches per iteration would hold 1"):
        schedule(7, 2, 0, 2, group_size=3)


def test_grouped_schedules_need_the_longer_send_lag_and_complete_with_it():
    """With a group above the stages, SEND_LAG's two slots deadlock (the neighbour reads a group's messages later);
    parallel/p2p.py's send_lag, 2 + 2 (G - P), completes every grouped schedule Megatron accepts here."""
    from parallel.p2p import send_lag

    with pytest.raises(AssertionError, match="deadlock"):
        _most_sends_held(2, 2, 8, group=3)
    for pp in (2, 3, 4):
        for vp in (2, 3):
            for m in range(pp, 3 * pp + 1):
                for group in range(pp, m + 1):
                    if 0 < m % group < pp:
                        continue
                    _most_sends_held(pp, vp, m, group=group, lag=send_lag(pp, group))
    assert send_lag(4, None) == send_lag(4, 4) == 2
