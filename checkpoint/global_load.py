"""Load a checkpoint of any format, saved at any layout, into this run's layout: each rank asks the source for the
global regions its parameters and optimizer partition own, so it reads only its own shard. Everything is staged and
handed over only once every rank has every element; a failure on any rank leaves the optimizer as it was.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import torch
from torch import nn

from base.errors import CheckpointError
from checkpoint.fp8_state import restore_fp8_histories
from checkpoint.global_state import MODEL_KEY, GlobalStateSource, GlobalTensorInfo
from checkpoint.regions import flat_range_boxes, flat_start, shift
from checkpoint.router_state import biased_routers, check_expert_biases, restore_expert_biases
from parallel.random import TensorParallelRNG
from parallel.sharding import ShardingRecord, record_of
from parallel.state import ParallelState
from zero.optimizer_state import CheckpointableOptimizer, NamedFragment

DTYPE_NAMES = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}


@dataclass(frozen=True)
class ResumePoint:
    iteration: int         # the last completed iteration; training continues with the next
    consumed_samples: int  # where the data sampler continues
    path: Optional[Path]   # the iteration directory that was loaded
    # Where the learning-rate schedule continues: the samples of the updates taken (fp16 skips excluded).
    schedule_samples: Optional[int] = None
    bytes_read: Optional[int] = None   # what this rank read from the checkpoint's tensors (headers included)
    shard_bytes: Optional[int] = None  # its own shard's elements at the checkpoint's stored dtypes
    # The rerun state machine's pending re-run and how this grid differs; None where not saved.
    rerun_state: Optional[dict] = None
    rerun_layout_changed: Optional[str] = None


def parameter_records(model: nn.Module) -> dict[str, tuple[nn.Parameter, ShardingRecord]]:
    """Every parameter of this rank's model by name (a tied one under its first name) with its record."""
    seen: set[int] = set()
    records = {}
    for name, param in model.named_parameters():
        if id(param) not in seen:
            seen.add(id(param))
            records[name] = (param, record_of(param))
    return records


def shape_problem(name: str, record: ShardingRecord, saved: GlobalTensorInfo) -> Optional[str]:
    """Why the saved whole tensor cannot give this run's, or None: shapes must match, except a vocabulary's padding rows
    (another TP size pads otherwise) while the real vocabulary is the same."""
    ours, theirs = list(record.global_shape), list(saved.shape)
    vocabulary = vocabulary_problem(name, record, saved)
    if vocabulary is not None:
        return vocabulary
    if ours == theirs:
        return None
    if record.real_rows is not None and len(ours) == len(theirs) and ours[1:] == theirs[1:] \
            and theirs[0] >= record.real_rows:
        return None
    return f"{name}: checkpoint shape {theirs}, model shape {ours}"


def vocabulary_problem(name: str, record: ShardingRecord, saved: GlobalTensorInfo) -> Optional[str]:
    """A vocabulary tensor whose checkpoint holds another vocabulary than this run's, or None."""
    if record.real_rows is None:
        return None
    if saved.real_rows is not None and saved.real_rows != record.real_rows:
        return (f"{name}: the checkpoint's vocabulary has {saved.real_rows} tokens, this run's {record.real_rows} "
                f"(a vocabulary change, which Megatron-Core's load refuses too)")
    multiple = saved.rows_multiple
    if saved.real_rows is None and multiple and saved.shape and -(-record.real_rows // multiple) * multiple != \
            saved.shape[0]:
        return (f"{name}: the checkpoint holds {saved.shape[0]} vocabulary rows, this run's {record.real_rows} tokens "
                f"padded as it was saved (to a multiple of {multiple}) make "
                f"{-(-record.real_rows // multiple) * multiple} (a vocabulary change, which Megatron-Core's load "
                f"refuses too)")
    return None


def check_fits(source: GlobalStateSource, weights_key: str, records: dict, state: ParallelState) -> None:
    """The checkpoint holds every parameter at its whole shape and nothing else; every rank raises the same error."""
    saved = source.tensors(weights_key)
    problems = [f"{name}: missing from the checkpoint" for name in records if name not in saved]
    problems += [problem for name, (_, record) in records.items() if name in saved
                 for problem in [shape_problem(name, record, saved[name])] if problem]
    gathered = state.comm.all_gather_object((problems, sorted(records)))
    problems = list(dict.fromkeys(p for rank_problems, _ in gathered for p in rank_problems))
    ours = {name for _, names in gathered for name in names}
    problems += [f"{name}: in the checkpoint but not in this model" for name in saved if name not in ours]
    if problems:
        raise CheckpointError(f"{source.path} does not fit this model ({len(problems)} mismatched keys):\n  "
                              + "\n  ".join(problems))


def _checked_expert_biases(source: GlobalStateSource, model: nn.Module, state: ParallelState, required: bool
                           ) -> tuple[Optional[dict], list[str]]:
    """The routers' expert biases, checked on every rank before any weight is read; returns them and the routers that
    start at 0."""
    biases, missing, problem = None, [], None
    try:
        biases = source.expert_biases()
        missing = check_expert_biases(biases, biased_routers(model), str(source.path),
                                      required and source.saves_expert_bias)
    except CheckpointError as error:
        problem = str(error)
    raise_if_any(problem, state)
    return biases, missing


def raise_if_any(problem: Optional[str], state: ParallelState) -> None:
    """Every rank raises the first rank's problem (a rank raising alone would leave the others waiting)."""
    problems = [p for p in state.comm.all_gather_object(problem) if p]
    if problems:
        raise CheckpointError(problems[0])


def fragment_regions(fragment: NamedFragment, record: ShardingRecord):
    """(partition offset, global box) of each box of `fragment`'s elements, padding rows left out."""
    for box in flat_range_boxes(record.local_shape, fragment.param_offset, fragment.param_offset + fragment.numel):
        at = fragment.partition_offset + flat_start(record.local_shape, box) - fragment.param_offset
        region = shift(box, record.global_offset)
        if record.real_rows is not None and region:
            stop = min(region[0].stop, record.real_rows)
            if stop <= region[0].start:
                continue  # vocabulary padding: this run's own
            region = (slice(region[0].start, stop), *region[1:])
        yield at, region


def region_numel(region: tuple[slice, ...]) -> int:
    numel = 1
    for part in region:
        numel *= part.stop - part.start
    return numel


def load_read_bytes(model: nn.Module, optimizer: CheckpointableOptimizer, load_optimizer: bool = True) -> int:
    """The tensor bytes a load reads on this rank when the checkpoint stores this run's dtypes (what the planner
    states)."""
    records = parameter_records(model)
    shard = optimizer.sharded_state_dict(model)
    elements = sum(region_numel(region) for fragment in shard.fragments
                   for _, region in fragment_regions(fragment, records[fragment.name][1]))
    keys = tuple(shard.tensors) if load_optimizer else ("master",)
    return elements * sum(shard.tensors[key].element_size() for key in keys)


def fill_staged(source: GlobalStateSource, fragments: list[NamedFragment], records: dict,
                staged: dict[str, torch.Tensor], source_keys: dict[str, str]) -> tuple[int, int]:
    """Read each fragment's regions into the staged tensors; returns (elements read per key, shard bytes at stored
    dtypes)."""
    infos = {key: source.tensors(source_key) for key, source_key in source_keys.items()}
    elements = shard_bytes = 0
    for fragment in fragments:
        _, record = records[fragment.name]
        for at, region in fragment_regions(fragment, record):
            numel = region_numel(region)
            for key, target in staged.items():
                values = source.read(source_keys[key], fragment.name, region)
                target[at:at + numel].copy_(values.reshape(-1))
                shard_bytes += numel * infos[key][fragment.name].dtype.itemsize
            elements += numel
    return elements, shard_bytes


def load_from_source(source: GlobalStateSource, model: nn.Module, optimizer: CheckpointableOptimizer,
                     rng: Optional[TensorParallelRNG], state: ParallelState, *, load_optimizer: bool = True,
                     load_rng: bool = True, finetune: bool = False, log=print) -> ResumePoint:
    """Restore this rank's parameters (through its fp32 master) and, with `load_optimizer`, moments, step and loss
    scaler; with `load_rng`, the random streams. `finetune` takes the weights only. Every rank calls this."""
    if finetune:
        load_optimizer = load_rng = False
    records = parameter_records(model)
    keys = source.keys()
    weights_key = "master" if "master" in keys else MODEL_KEY
    check_fits(source, weights_key, records, state)
    progress = source.progress()
    shard = optimizer.sharded_state_dict(model)
    if load_optimizer:
        raise_if_any(_optimizer_problem(source, progress.extra.get("optimizer"), shard.optimizer,
                                        tuple(shard.tensors), keys), state)
    wanted = tuple(shard.tensors) if load_optimizer else ("master",)
    source_keys = {key: (weights_key if key == "master" else key) for key in wanted}
    if load_optimizer and state.is_first_rank:
        _note_conversions(source, shard.tensors, source_keys, log)
    if weights_key == MODEL_KEY and state.is_first_rank:
        log(f" note: {source.path} ({source.format_name}) holds no fp32 master weights: they start from its "
            f"weights as stored", flush=True)

    # Staged as copies of the live partition: other dtypes convert as read, and padding rows keep this run's values.
    staged = {key: shard.tensors[key].detach().to("cpu", copy=True) for key in wanted}
    biases, missing_biases = _checked_expert_biases(source, model, state, required=not finetune)
    problem, elements, shard_bytes = None, 0, 0
    try:
        elements, shard_bytes = fill_staged(source, shard.fragments, records, staged, source_keys)
    except CheckpointError as error:
        problem = str(error)
    raise_if_any(problem, state)
    _warn_non_finite(source.path, staged, state, log)

    scaler_state, scaler_note = None, None
    if load_optimizer:
        saved_type = progress.extra.get("loss_scaler_type", shard.loss_scaler_type)
        if progress.loss_scaler_state is not None and saved_type == shard.loss_scaler_type:
            scaler_state = progress.loss_scaler_state
        else:
            scaler_note = (f" note: the checkpoint's loss scaler ({saved_type}) does not apply to this run's "
                           f"precision; starting from the configured loss scale")
    # FP8 histories before the master: publishing it casts the weights with them under --fp8-param-gather.
    missing = restore_fp8_histories(model, source.fp8_histories())
    if missing and state.is_first_rank:
        log(f" note: {source.path} ({source.format_name}) holds no FP8 amax history for {len(missing)} delayed-scaling "
            f"linears of this run (saved without --fp8-recipe delayed, or in a format that does not carry them), "
            f"{missing[0]} first; they start fresh (scale 1)", flush=True)
    step = progress.optimizer_step if progress.optimizer_step is not None else progress.iteration
    optimizer.load_sharded_state_dict(staged, adam_step=step if load_optimizer else None,
                                      loss_scaler_state=scaler_state)
    if state.is_first_rank and scaler_note:
        log(scaler_note, flush=True)
    if load_optimizer and progress.optimizer_step is None and state.is_first_rank:
        log(f" note: {source.path} ({source.format_name}) does not record the optimizer's step count: Adam's bias "
            f"correction continues from the iteration, {progress.iteration}", flush=True)

    restore_expert_biases(model, biases, state.device)
    if missing_biases and state.is_first_rank:
        log(f" note: {source.path} ({source.format_name}) holds no {missing_biases[0]}"
            f"{f' (nor {len(missing_biases) - 1} more)' if len(missing_biases) > 1 else ''}; the expert bias starts "
            f"at 0", flush=True)
    if load_rng:
        source.restore_random_states(rng, state, log)

    bytes_read = source.bytes_read
    _say_bytes_read(bytes_read, shard_bytes, state, log)
    schedule = progress.schedule_samples if progress.schedule_samples is not None else progress.consumed_samples
    if finetune:
        return ResumePoint(0, 0, source.path, 0, bytes_read, shard_bytes)
    return ResumePoint(progress.iteration, progress.consumed_samples or 0, source.path, schedule, bytes_read,
                       shard_bytes)


def _optimizer_problem(source: GlobalStateSource, saved: Optional[str], ours: str, needed: tuple[str, ...],
                       keys: tuple[str, ...]) -> Optional[str]:
    """Moments resume only into the optimizer that made them (Adam's two, AdEMAMix's three, Muon's momentum)."""
    if saved is not None and saved != ours:
        return (f"{source.path} holds --optimizer {saved}'s states, this run has --optimizer {ours}: resume with "
                f"--optimizer {saved}, or pass --no-load-optim to start {ours}'s states fresh from its weights")
    lacking = [key for key in needed if key != "master" and key not in keys]
    unread = source.optimizer_not_read()
    if lacking and unread is not None:
        return (f"{source.path} ({source.format_name}): its optimizer states are not read here: {unread}; pass "
                f"--no-load-optim (or --finetune) to start them fresh from its weights, or save with Megatron-LM's "
                f"--dist-ckpt-optim-fully-reshardable, whose states are read at any layout")
    if lacking:
        return (f"{source.path} ({source.format_name}) holds no {', '.join(lacking)}: pass --no-load-optim (or "
                f"--finetune) to start the optimizer's states fresh from its weights")
    return None


def _note_conversions(source: GlobalStateSource, live: dict[str, torch.Tensor], source_keys: dict[str, str],
                      log) -> None:
    """Say so when a state is stored in another dtype than this run's (--exp-avg-dtype): it is converted as read, as
    Megatron-LM's distributed optimizer does."""
    changed = []
    for key, source_key in source_keys.items():
        if key == "master":
            continue
        stored = {info.dtype for info in source.tensors(source_key).values()}
        if stored and live[key].dtype not in stored:
            saved = DTYPE_NAMES.get(next(iter(stored)), str(next(iter(stored))))
            changed.append(f"{key} {saved} -> {DTYPE_NAMES.get(live[key].dtype, str(live[key].dtype))}")
    if changed:
        rounding = "; to bf16 rounds to nearest even" if any(c.endswith("bf16") for c in changed) else ""
        log(f" note: {source.path} stores the Adam moments in other dtypes than this run's --exp-avg-dtype / "
            f"--exp-avg-sq-dtype: converted ({', '.join(changed)}{rounding})", flush=True)


def _warn_non_finite(path: Path, staged: dict[str, torch.Tensor], state: ParallelState, log) -> None:
    """Rank 0 says so when the loaded state holds NaN or inf on any rank."""
    counts = {key: int(tensor.numel() - torch.isfinite(tensor).sum()) for key, tensor in staged.items()}
    totals = {key: sum(rank_counts[key] for rank_counts in state.comm.all_gather_object(counts)) for key in counts}
    bad = {key: count for key, count in totals.items() if count}
    if bad and state.is_first_rank:
        listed = ", ".join(f"{count} in {key}" for key, count in bad.items())
        log(f" warning: {path} holds non-finite values (NaN or inf): {listed}; training from it will diverge",
            flush=True)


def _say_bytes_read(bytes_read: Optional[int], shard_bytes: int, state: ParallelState,
                    log) -> None:
    """One line: the most any rank read against that rank's own shard (the planner predicts the shard's bytes)."""
    counts = state.comm.all_gather_object((bytes_read, shard_bytes))
    if bytes_read is None or not state.is_first_rank:
        return
    rank, (most, shard) = max(enumerate(counts), key=lambda item: item[1][0] or 0)
    log(f" > the load read at most {most / 2**20:.2f} MiB on a rank (rank {rank}; its shard: {shard / 2**20:.2f} "
        f"MiB)", flush=True)
