"""What a dry run adds for a mixture of experts: the experts' own model states, and their working set under the worst
routing. The meta device routes in equal shares, so the plan is a balanced step's; `ExpertRowProbe` measures the bytes a
row saves, and the worst case (dropless, or bounded by --moe-expert-capacity-factor) adds the rows beyond balance."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Callable, Optional

from gpt.moe.deepspeed_gating import deepspeed_capacity
from gpt.moe.experts import Experts, can_group
from gpt.moe.router import get_capacity
from training.build import config_stage_layers
from zero.memory import MODEL_STATE_CATEGORIES, host_resident_tensors, measure_by_placement


class ExpertRowProbe:
    """Forward hooks on every MoE layer's experts: the rows each receives and the bytes it saves for backward, in the
    first forward that saves any."""

    def __init__(self, model, live: Callable[[], int], device_type: str) -> None:
        """`live`: the saved-for-backward bytes now. `device_type` makes the experts on meta run that device's path
        (grouped matmul or loop)."""
        self.live = live
        self.layers: dict[int, tuple[int, int]] = {}  # id(experts) -> (rows, saved bytes a row's worth)
        # the most rows one expert matmul takes at once
        self.rows_at_once = 0
        self._before: dict[int, int] = {}
        self._handles = []
        for module in model.modules():
            if isinstance(module, Experts):
                module.planned_device = device_type
                self._handles.append(module.register_forward_pre_hook(functools.partial(self._start, id(module))))
                self._handles.append(module.register_forward_hook(functools.partial(self._stop, id(module))))

    def _start(self, key, module, args) -> None:
        self._before[key] = self.live()

    def _stop(self, key, module, args, output) -> None:
        before = self._before.pop(key, None)
        if before is None:
            return
        rows = args[0]
        grouped = module.grouped and can_group(rows, list(module.children()), module.planned_device)
        local = max(1, sum(1 for _ in module.children()))
        self.rows_at_once = max(self.rows_at_once, rows.shape[0] if grouped else -(-rows.shape[0] // local))
        saved = self.live() - before
        if saved <= 0:  # under checkpointing its recompute in backward saves instead
            return
        if key not in self.layers:
            self.layers[key] = (rows.shape[0], saved)

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()


@dataclass
class MoEFigures:
    """A rank's experts in a plan. Bytes per GPU; rows per MoE layer and micro-batch on this rank."""
    num_experts: int
    local_experts: int
    expert_parallel_size: int
    expert_data_parallel_size: int
    dispatcher: str                        # "local" at EP 1, else --moe-token-dispatcher-type
    moe_layers: int
    expert_state_bytes: Optional[dict[str, int]]  # the experts' own ZeRO (EP > 1); None: inside the dense states
    expert_parameters_local: int
    balanced_rows: int                     # rows this rank's experts receive a layer under balanced routing
    dispatched_tokens: int
    worst_rows: int
    worst_expert_rows: int
    capacity: Optional[int]                # per expert per source rank; None: dropless
    capacity_rule: str
    saved_bytes_per_row: float
    layers_held: int
    worst_extra_bytes: int = 0
    worst_total_bytes: int = 0


def _moe_layers_held(config, pipeline_rank: int, moe_layers: int, in_flight: int) -> int:
    """The MoE layers of this rank whose experts' saved tensors are alive together at the peak: all of them per forward
    in flight without checkpointing, one recomputed at a time with it, and under --recompute-method block those past the
    first N of their chunk."""
    activations = config.activations
    if not activations.checkpoint_activations:
        return moe_layers * in_flight
    if activations.recompute_method != "block":
        return 1
    chunks = config_stage_layers(config.model, config.parallel, pipeline_rank).chunks \
        if config.parallel.pipeline_model_parallel_size > 1 \
        else (tuple(range(config.model.num_layers)),)
    is_moe = config.model.moe_layers()
    kept = recomputed = 0
    for chunk in chunks:
        for first, end, checkpointed in activations.checkpointed_groups(len(chunk)):
            moe = sum(is_moe[layer] for layer in chunk[first:end])
            recomputed, kept = (recomputed + moe, kept) if checkpointed else (recomputed, kept + moe)
    return max(kept * in_flight, kept * (in_flight - 1) + (1 if recomputed else 0))


def moe_figures(config, state, optimizer, probe: ExpertRowProbe, micro_forwards_in_flight: int) -> MoEFigures:
    """This rank's MoEFigures from the dry run's build and its probe."""
    moe = config.model.moe
    experts = state.experts
    expert_states = None
    expert_parameters = 0
    if hasattr(optimizer, "parts"):  # the experts' own ZeRO over the expert data-parallel group
        part = optimizer.experts
        placed = measure_by_placement(part.model_state_tensors(), host_resident_tensors(part), include_meta=True)
        expert_states = {key: placed["device"][key] for key in (*MODEL_STATE_CATEGORIES, "total")}
        expert_parameters = part.num_parameters
    rows_and_bytes = list(probe.layers.values())
    local = moe.num_experts // experts.model_size
    balanced = max((rows for rows, _ in rows_and_bytes), default=0)
    per_row = max((saved / rows for rows, saved in rows_and_bytes if rows), default=0.0)
    # balanced: this rank's `local` experts get tokens x k x local / E rows
    tokens = balanced * moe.num_experts // (moe.router_topk * local) if local else 0
    sources = experts.model_size if experts.model_size > 1 else 1
    own_tokens = tokens // sources
    dropless_rank = tokens * min(moe.router_topk, local)
    capacity, rule = _capacity(moe, own_tokens)
    if capacity is None:
        worst_expert = tokens
        worst_rank = dropless_rank
    else:
        worst_expert = min(tokens, sources * capacity)
        worst_rank = min(dropless_rank, local * worst_expert)
        if moe.pad_expert_input_to_capacity:  # every expert takes exactly its capacity from every source
            worst_rank = local * sources * capacity
    layers = sum(1 for _ in rows_and_bytes)
    held = _moe_layers_held(config, state.pipeline_parallel_rank, layers, max(1, micro_forwards_in_flight))
    figures = MoEFigures(
        num_experts=moe.num_experts, local_experts=local, expert_parallel_size=experts.model_size,
        expert_data_parallel_size=experts.data_size,
        dispatcher=config.parallel.dispatcher_name if experts.model_size > 1 else "local",
        moe_layers=layers, expert_state_bytes=expert_states, expert_parameters_local=expert_parameters,
        balanced_rows=balanced, dispatched_tokens=tokens, worst_rows=worst_rank, worst_expert_rows=worst_expert,
        capacity=capacity, capacity_rule=rule, saved_bytes_per_row=per_row, layers_held=held)
    figures.worst_extra_bytes = int(max(0, worst_rank - balanced) * per_row) * figures.layers_held
    return figures


def _capacity(moe, tokens: int) -> tuple[Optional[int], str]:
    """Rows an expert keeps from one source rank's `tokens` (Megatron's ceil(T x k / E x factor)), and the rule."""
    k = moe.router_topk
    if moe.deepspeed.gating == "deepspeed":
        if not moe.deepspeed.token_dropping:
            return None, "dropless (--disable-moe-token-dropping)"
        capacity = deepspeed_capacity(tokens, moe.num_experts, moe.deepspeed.train_capacity_factor * k, moe.deepspeed.min_capacity)
        return capacity, (f"DeepSpeed-MoE's capacity ceil({tokens} / {moe.num_experts} x {moe.deepspeed.train_capacity_factor:g} "
                          f"x {k}), at least {moe.deepspeed.min_capacity} (sharded_moe._capacity)")
    if moe.expert_capacity_factor is None:
        return None, "dropless"
    capacity = get_capacity(tokens * k, moe.num_experts, moe.expert_capacity_factor)
    return capacity, (f"capacity ceil({tokens} x {k} / {moe.num_experts} x {moe.expert_capacity_factor:g}) "
                      f"(Megatron-Core moe_utils.get_capacity)")


def moe_state_rows(moe: MoEFigures) -> list[tuple[str, int]]:
    """The plan table's rows splitting the model states into dense and experts'."""
    if moe.expert_state_bytes is None:
        return []
    experts = moe.expert_state_bytes
    return [(f"  of these four, the experts' ({moe.local_experts} of {moe.num_experts} a layer at EP "
             f"{moe.expert_parallel_size}, {moe.expert_parameters_local:,} parameters; ZeRO over expert DP "
             f"{moe.expert_data_parallel_size})", experts["total"])]


def moe_lines(moe: MoEFigures, total_bytes: int, width: int) -> list[str]:
    """The worst-case routing's rows and total, below the plan's total; none for a rank without MoE layers."""
    if moe.moe_layers == 0:
        return []
    where = f"the {moe.dispatched_tokens:,} tokens the {moe.dispatcher} dispatcher brings" \
        if moe.expert_parallel_size > 1 else f"the {moe.dispatched_tokens:,} tokens of the micro-batch"
    bound = f"{moe.capacity_rule}, {moe.capacity:,} rows an expert from each source rank" \
        if moe.capacity is not None else "dropless: all tokens to this rank's experts, stated as such"
    extra = max(0, moe.worst_rows - moe.balanced_rows)
    return [f"  experts' rows a layer and micro-batch: {moe.balanced_rows:,} planned (routing uniform); worst case "
            f"{moe.worst_rows:,} ({bound}: {where}, each choosing min(k, {moe.local_experts} local experts) of "
            f"them; one expert at most {moe.worst_expert_rows:,})",
            f"  {'experts saved for backward, worst case (' + format(extra, ',') + ' rows more a layer x ' + _bytes(moe.saved_bytes_per_row) + ' a row x ' + _layers(moe.layers_held) + ')':<{width}} "
            f"{_format(moe.worst_extra_bytes):>12}",
            f"  {'total with the worst-case routing':<{width}} {_format(total_bytes + moe.worst_extra_bytes):>12}"]


def _format(num_bytes: int) -> str:
    from zero.memory import format_bytes
    return format_bytes(num_bytes)


def _layers(count: int) -> str:
    return f"{count} layer" + ("s" if count != 1 else "")


def _bytes(per_row: float) -> str:
    return f"{per_row:,.0f} B"
