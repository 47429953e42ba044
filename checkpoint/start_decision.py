"""How a run starts -- fresh, or resumed from which checkpoint -- and whether its save directory and data settings allow
it. Pure decisions from the config and the file system; docs/checkpoints.md tells the user's side of these rules.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from arguments.batch_schedule import BatchSchedule
from arguments.bounds import INDEX_BYTES_PER_SAMPLE, gib, host_memory_bytes
from arguments.schedule import train_iterations
from base.errors import CheckpointError, ConfigError
from base.options import setting_value
from checkpoint.format import (
    LATEST_FILE,
    METADATA_FILE,
    TRACKER_FILE,
    is_save_directory,
    pointed_checkpoint,
    resolve_checkpoint,
)
from checkpoint.formats import format_of, locate
from checkpoint.save_directory import holds_checkpoints
from data import DataError
from data.gpt_dataset import parse_split
from data.identity import data_identity, same_data

# The settings that decide which tokens sample i holds: (config section, field, flag).
SAMPLE_DEFINING_SETTINGS = (("data", "data_path", "--data-path"), ("data", "data_args_path", "--data-args-path"),
                            ("data", "train_data_path", "--train-data-path"),
                            ("data", "per_split_data_args_path", "--per-split-data-args-path"),
                            ("data", "data_file_list", "--data-file-list"),
                            ("data", "split", "--split"), ("model", "seq_length", "--seq-length"),
                            ("training", "seed", "--seed"))
# The training blend's settings: compared as the content they read when known.
TRAINING_BLEND_SETTINGS = ("data_path", "data_args_path", "train_data_path", "per_split_data_args_path",
                           "data_file_list")


@dataclass(frozen=True)
class StartDecision:
    resume_from: Optional[Path]  # the iteration directory to load; None: a fresh start
    note: Optional[str] = None   # one line to print about the decision
    format_name: Optional[str] = None


def _resume(resume_from: Path, note: Optional[str] = None) -> StartDecision:
    return StartDecision(resume_from, note, format_of(resume_from).name)


def decide_start(load: Optional[str], save: Optional[str], universal: bool = False,
                 exit_on_missing: bool = False) -> StartDecision:
    """Which checkpoint `--load` names, if any (DeepSpeed's tag folder or ours); an empty or missing --load is a fresh
    start, an error under `exit_on_missing`."""
    if not load:
        return StartDecision(None)
    located = locate(Path(load), universal)  # a format whose save directories point their own way (DeepSpeed's)
    if located is not None:
        fmt, folder, named_by = located
        return StartDecision(folder, f"> --load {load}: {fmt.name} checkpoint {folder}"
                                     + (f" (its '{named_by}' names it)" if named_by else ""), fmt.name)
    path = Path(load)
    also_save = save is not None and path.resolve() == Path(save).resolve()
    if path.is_file():
        raise ConfigError(f"--load {load} is a file; pass a --save directory or one of its iter_* directories")
    if path.is_dir():
        if (path / LATEST_FILE).exists() or (path / TRACKER_FILE).exists() or (path / METADATA_FILE).exists() \
                or path.name.startswith("iter_"):
            resume_from = resolve_checkpoint(path)  # a broken one is an error naming what is wrong
            note = None if (path / METADATA_FILE).exists() or not is_save_directory(path) \
                else pointed_checkpoint(path)[2]
            return _resume(resume_from, note)
        complete = [name for name in holds_checkpoints(path) if name not in (LATEST_FILE, TRACKER_FILE)]
        if complete:
            raise CheckpointError(f"--load {load} holds checkpoints ({', '.join(complete[-3:])}) but no "
                                  f"'{LATEST_FILE}' or '{TRACKER_FILE}'; pass --load {path / complete[-1]} to resume "
                                  f"from the newest")
    if exit_on_missing and (also_save or not path.exists() or not any(path.iterdir())):
        # Megatron-LM exits 0 here; 2 lets a script's `&&` stop.
        raise ConfigError(f"--load {load}: {'no such directory' if not path.exists() else 'no checkpoint in it'}, "
                          f"and --exit-on-missing-checkpoint refuses to start from random weights (exit 2; "
                          f"Megatron-LM exits 0)", flags=("--load", "--exit-on-missing-checkpoint"))
    if also_save:
        return StartDecision(None, f"> no checkpoint in {load} yet: starting a fresh run (--load is the --save "
                               f"directory)")
    if not path.exists() or not any(path.iterdir()):
        what = "no such directory" if not path.exists() else "an empty directory"
        return StartDecision(None, f"WARNING: --load {load}: {what}, not --save: NOTHING IS RESUMED, training "
                               f"starts from random weights, as in Megatron-LM (--exit-on-missing-checkpoint "
                               f"refuses it)")
    raise ConfigError(f"--load {load} holds no checkpoint; check the path (a fresh run passes no --load, "
                      f"--load equal to --save, or an empty directory)")


def check_save_directory(save: str, resume_from: Optional[Path], finetune: bool, overwrite_save: bool,
                         ckpt_step: bool = False) -> None:
    """Refuse to write into a save directory holding another run's checkpoints, or later iterations the saves would
    replace."""
    existing = holds_checkpoints(Path(save))
    if not existing or overwrite_save:
        return
    save_dir = Path(save).resolve()
    resumed_here = resume_from is not None and save_dir in resume_from.resolve().parents
    if resumed_here and not finetune:
        if ckpt_step:
            _refuse_replacing_later_iterations(save, resume_from, existing)
        return
    how = ("--finetune starts again from iteration 0 and" if resumed_here
           else "this run does not resume from them and")
    shown = ", ".join(existing[:3]) + (", ..." if len(existing) > 3 else "")
    raise ConfigError(f"--save {save} already holds checkpoints ({shown}); {how} would replace them. "
                      f"Resume with --load {save}, choose another --save directory, or pass --overwrite-save")


def _refuse_replacing_later_iterations(save: str, resume_from: Path, existing: list[str]) -> None:
    """--ckpt-step N with a --save directory holding later iterations: refused unless --overwrite-save, since the
    continued run's saves would replace them."""
    resumed = re.fullmatch(r"iter_(\d+)", resume_from.name)
    if resumed is None:
        return
    later = sorted({int(found.group(1)) for name in existing if (found := re.match(r"iter_(\d+)", name))
                    and int(found.group(1)) > int(resumed.group(1))})
    if later:
        shown = ", ".join(map(str, later[:3])) + (", ..." if len(later) > 3 else "")
        raise ConfigError(f"--save {save} holds iteration(s) {shown}, later than the iteration {int(resumed.group(1))} "
                          f"--ckpt-step resumes from; this run's saves would replace them. Drop --ckpt-step to resume "
                          f"from the newest, choose another --save directory, or pass --overwrite-save to replace them")


def _same_setting(name: str, saved, ours) -> bool:
    """Equal as the data pipeline reads them (a --split "969, 30, 1" is "969,30,1")."""
    if name == "split" and isinstance(saved, str) and isinstance(ours, str):
        try:
            return parse_split(saved) == parse_split(ours)
        except DataError:
            pass
    return saved == ours


def check_resume_matches(metadata: dict, config, iteration_dir: Path, override: bool) -> Optional[str]:
    """None when the sample-defining settings equal the checkpoint's; a note when they differ and `override` allows it;
    else a ConfigError listing each difference."""
    saved_config = metadata.get("config") or {}
    differences = []
    sources = config.data.sources()
    training_blend = list(sources.training_blend() or [])
    content = _data_content_difference(metadata.get("data_identity"), training_blend)
    if content:
        differences.append(f"{sources.training_source()} {_show(training_blend)} ({content})")
    for section, name, flag in SAMPLE_DEFINING_SETTINGS:
        if name not in saved_config.get(section, {}):
            continue  # a checkpoint from a tool that did not record it
        if name in TRAINING_BLEND_SETTINGS and content is not None:
            continue  # compared as content above: the words typed may differ for the same files
        saved, ours = saved_config[section][name], setting_value(getattr(config, section), name)
        if isinstance(ours, (list, tuple)):
            ours = list(ours)
        if not _same_setting(name, saved, ours):
            differences.append(f"{flag} {_show(ours)} (the checkpoint's: {_show(saved)})")
    if not differences:
        return None
    listed = "; ".join(differences)
    if override:
        return (f"> note: resuming {iteration_dir} with {listed}, as --override-data-on-resume allows; the "
                f"samples from here on are not the ones the original run would have seen")
    raise ConfigError(f"resuming {iteration_dir} with {listed}: the run would not continue its sample "
                      f"sequence. Pass the checkpoint's settings, or --override-data-on-resume to go on anyway")


def _data_content_difference(saved: Optional[list], data_path) -> Optional[str]:
    """How the files --data-path reads differ from the checkpoint's: "" when the same content, None when that cannot be
    told."""
    if not saved:
        return None
    ours = data_identity(data_path)
    if ours is None:
        return None
    return same_data(saved, ours) or ""


def _show(value) -> str:
    return " ".join(map(str, value)) if isinstance(value, list) else str(value)


def continues_training(config) -> bool:
    """Whether a resume continues its checkpoint's training (its samples, batch and schedule are checked): not under
    --finetune, --skip-train or --moe-use-upcycling."""
    checkpoint = config.checkpoint
    return not checkpoint.finetune and not checkpoint.moe_use_upcycling and not config.training.skip_train


def check_samples_fit(metadata: dict, config, batch: BatchSchedule, iteration_dir: Path) -> None:
    """Raise ConfigError, naming the flag that makes it consistent, when the iterations left would read past the samples
    the schedule covers because the global batch changed, or when reading on needs a sample index this machine cannot
    hold. More samples than its iterations' batches (an upcycled run's, checkpoint/upcycling.py) are read on, as
    Megatron-LM reads on: build_data sizes the data for them."""
    iteration, consumed = metadata["iteration"], metadata["consumed_samples"]
    train_iters = train_iterations(config.training, batch)
    tokens = config.training.train_tokens
    if iteration >= train_iters or (tokens is not None and consumed * config.model.seq_length >= tokens):
        return  # nothing to train: the run says so and ends (training/run_training.py)
    covered = batch.consumed_after(train_iters)
    needed = batch.consumed_after(train_iters - iteration, consumed)
    if needed * INDEX_BYTES_PER_SAMPLE > host_memory_bytes():
        raise ConfigError(f"resuming {iteration_dir}: it has consumed {consumed} samples in {iteration} iterations; "
                          f"reading on to sample {needed} needs a sample index of at least "
                          f"{gib(needed * INDEX_BYTES_PER_SAMPLE)}, more than this machine's {gib(host_memory_bytes())} "
                          f"(was the metadata edited?): pass --finetune to train its weights on a new sample sequence "
                          f"from iteration 0", flags=("--finetune",))
    saved_batch = ((metadata.get("config") or {}).get("training") or {}).get("global_batch_size")
    if needed <= covered or not (isinstance(saved_batch, int) and saved_batch != batch.global_batch_size
                                 and batch.rampup is None and batch.steps is None and iteration * saved_batch >= consumed):
        return
    length = (f"--train-samples {config.training.train_samples}" if config.training.train_samples is not None
              else f"--train-iters {train_iters}")
    raise ConfigError(f"resuming {iteration_dir}: it has consumed {consumed} samples in {iteration} iterations, and "
                      f"the {train_iters - iteration} iterations left would read samples {consumed} to {needed}, past "
                      f"the {covered} that {length} at global batch {batch.describe()} covers; resume with the "
                      f"checkpoint's --global-batch-size {saved_batch}",
                      flags=("--global-batch-size", "--train-iters"))
