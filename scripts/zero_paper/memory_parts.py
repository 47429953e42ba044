"""The planner's per-GPU peak (RankPlan.total_bytes) in parts that add up to it, Figure 7's stacked
bars: what is held throughout (model states, FP8 states, constant buffers, M_D's buffer, graphs' buffers) read from
the plan, the working set as the rest of the peak, so a bar is the table's number."""

from __future__ import annotations

PARTS = (("model states", "tab:blue"), ("constant buffers", "tab:gray"),
         ("M_D's contiguous checkpoints", "tab:orange"), ("working set at the peak", "tab:red"))


def held_parts(plan) -> list[int]:
    """The first three of PARTS: what `plan` holds throughout, beside the larger working set."""
    return [plan.model_state_bytes["total"] + plan.fp8_state_bytes,
            plan.buffer_bytes + plan.cuda_graph_static_bytes,
            plan.contiguous_checkpoint_buffer_bytes["device"]]


def memory_parts(plan) -> list[int]:
    """Bytes of each of PARTS in `plan`'s peak; their sum is plan.total_bytes."""
    held = held_parts(plan)
    working = plan.total_bytes - sum(held)
    if working < 0:  # dry_run.py's total no longer holds these parts: the bars would not be the table's
        raise ValueError(f"the plan's peak {plan.total_bytes} is less than what it holds throughout {sum(held)}")
    return held + [working]
