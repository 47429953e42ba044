"""The numbers of a Megatron-LM checkpoint's common.pt, checked before anything trusts them, as checkpoint/schema.py
checks ours: each within its type's range and consistent with the others (samples at least the iteration, a scheduler no
further than its samples, Adam's step at most the iteration), else one line naming the entry.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Optional

import torch

from base.errors import CheckpointError
from checkpoint.schema import FINITE, NON_NEGATIVE, POSITIVE, is_int, is_number, number_problem, shown_value

# Megatron-LM's args that are sizes: positive where they are set
POSITIVE_ARGS = ("num_layers", "hidden_size", "num_attention_heads", "num_query_groups", "ffn_hidden_size",
                 "kv_channels", "seq_length", "max_position_embeddings", "padded_vocab_size", "micro_batch_size",
                 "global_batch_size", "tensor_model_parallel_size", "pipeline_model_parallel_size",
                 "context_parallel_size", "data_parallel_size", "world_size")
SCHEDULER_RATES = ("max_lr", "min_lr", "start_wd", "end_wd")
SCHEDULER_STEPS = ("lr_warmup_steps", "lr_decay_steps", "wd_incr_steps", "wsd_decay_steps")
NON_NEGATIVE_NUMBER = "a non-negative finite number"


def _step_value(value: Any) -> Any:
    """A step as a number: the plain optimizer keeps its common_step as a one-element tensor."""
    if isinstance(value, torch.Tensor) and value.numel() == 1 and not value.is_complex():
        return value.item()
    return value


def _whole(value: Any) -> bool:
    return is_int(value) or isinstance(value, float) and math.isfinite(value) and value >= 0 and value.is_integer()


def _adam_steps(common: dict) -> list[tuple[str, Any]]:
    saved = common.get("optimizer")
    if not isinstance(saved, dict):
        return []
    found = []
    state = saved.get("state")
    if isinstance(state, dict) and "common_step" in state:
        found.append(("optimizer.state.common_step", _step_value(state["common_step"])))
    for where, groups in (("optimizer.param_groups", saved.get("param_groups")),
                          ("optimizer.optimizer.param_groups", (saved.get("optimizer") or {}).get("param_groups")
                           if isinstance(saved.get("optimizer"), dict) else None)):
        for index, group in enumerate(groups if isinstance(groups, list) else []):
            if isinstance(group, dict) and group.get("step") is not None:
                found.append((f"{where}[{index}].step", _step_value(group["step"])))
    return found


def common_problem(common: dict) -> Optional[tuple[str, Any, str]]:
    """(entry, value, what it must be) for the first number of common.pt that cannot be."""
    iteration = common.get("iteration")
    if not is_int(iteration):
        return "iteration", iteration, NON_NEGATIVE
    version = common.get("checkpoint_version")
    if version is not None and not is_number(version):
        return "checkpoint_version", version, FINITE
    for key in ("optimizer", "opt_param_scheduler", "content_metadata"):  # read as dicts wherever they are present
        if common.get(key) is not None and not isinstance(common[key], dict):
            return key, common[key], "a dict (Megatron-LM's state_dict of it)"
    args = common.get("args")
    values = dict(vars(args)) if args is not None and hasattr(args, "__dict__") else {}
    problem = number_problem(values, "args")
    if problem:
        return problem
    for name in POSITIVE_ARGS:
        if values.get(name) is not None and not is_int(values[name], 1):
            return f"args.{name}", values[name], POSITIVE
    consumed = values.get("consumed_train_samples", 0) or 0
    skipped = values.get("skipped_train_samples", 0) or 0
    for name, value in (("consumed_train_samples", consumed), ("skipped_train_samples", skipped)):
        if not is_int(value):
            return f"args.{name}", value, NON_NEGATIVE
    if iteration == 0 and consumed != 0:
        return "args.consumed_train_samples", consumed, "0 at iteration 0: nothing has been trained"
    if consumed < iteration:
        return ("args.consumed_train_samples", consumed,
                f"at least its 'iteration' ({iteration}): every iteration consumes a global batch of samples")
    scheduler = common.get("opt_param_scheduler")
    if scheduler is not None:
        problem = number_problem(scheduler, "opt_param_scheduler")
        if problem:
            return problem
        steps = scheduler.get("num_steps", 0)
        if not is_int(steps):
            return "opt_param_scheduler.num_steps", steps, NON_NEGATIVE
        if steps > consumed + skipped:
            return ("opt_param_scheduler.num_steps", steps,
                    f"at most its consumed and skipped samples ({consumed + skipped}): the schedule counts the "
                    f"samples of the updates taken")
        for name in SCHEDULER_RATES:
            value = scheduler.get(name)
            if value is not None and not (is_number(value) and value >= 0):
                return f"opt_param_scheduler.{name}", value, NON_NEGATIVE_NUMBER
        for name in SCHEDULER_STEPS:
            value = scheduler.get(name)
            if value is not None and not is_int(value):
                return f"opt_param_scheduler.{name}", value, NON_NEGATIVE
    for where, step in _adam_steps(common):
        if not _whole(step):
            return where, step, f"a whole number from 0 to its 'iteration' ({iteration})"
        if step > iteration:
            return where, step, f"at most its 'iteration' ({iteration}): an iteration takes one optimizer step at most"
    flops = common.get("num_floating_point_operations_so_far")
    if flops is not None and not (is_number(flops) and flops >= 0):
        return "num_floating_point_operations_so_far", flops, NON_NEGATIVE_NUMBER
    return None


def check_common(common: dict, path: Path) -> None:
    """Raise CheckpointError naming common.pt and its first number that cannot be."""
    problem = common_problem(common)
    if problem:
        where, value, meaning = problem
        raise CheckpointError(f"{path}: corrupt, its {where!r} must be {meaning}, got {shown_value(value)}")
