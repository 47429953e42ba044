"""How long a run is counted: in iterations (--train-iters) or in samples (--train-samples), and which
schedule lengths go with each, by Megatron-LM's rules.

Megatron-LM's validate_args (megatron/training/arguments.py; the same block in Megatron-DeepSpeed's):

    if args.train_iters:                      if args.train_samples:
        assert args.train_samples is None         assert args.train_iters is None
        assert args.lr_decay_samples is None      assert args.lr_decay_iters is None
        assert args.lr_warmup_samples == 0        assert args.lr_warmup_iters == 0
        if args.lr_warmup_fraction is not None:   if args.lr_warmup_fraction is not None:
            assert args.lr_warmup_iters == 0          assert args.lr_warmup_samples == 0

It compares values, not whether a flag was typed: `--lr-warmup-samples 0` beside `--train-iters` (as Megatron's
functional tests write it) is accepted; only a value that would mean something is a conflict. Here a value counts
as given when it comes from the command line or the DeepSpeed JSON; a preset's or default's value for the other kind
is dropped (this repository's defaults are iteration-based: --train-iters 250, --lr-warmup-iters 20).
Megatron-DeepSpeed (and Megatron-LM until NVIDIA/Megatron-LM#4411) also asserts `args.rampup_batch_size is None`
with --train-iters; Megatron-LM main dropped it, and a ramp runs here with either count (arguments/batch_schedule.py)."""

from __future__ import annotations

from typing import Any

from arguments.config_sources import FLAG, JSON, Source, show_value

# The lengths of each kind, with the value that leaves them unset (Megatron's defaults).
ITERATION_BASED_UNSET = {"train_iters": None, "lr_warmup_iters": 0, "lr_decay_iters": None}
SAMPLE_BASED_UNSET = {"train_samples": None, "lr_warmup_samples": 0, "lr_decay_samples": None}
_FLAGS = {name: "--" + name.replace("_", "-") for name in (*ITERATION_BASED_UNSET, *SAMPLE_BASED_UNSET,
                                                             "lr_warmup_fraction")}


def _given(sources: dict[str, Source], name: str) -> bool:
    return sources[name].kind in (JSON, FLAG)


def _conflict(first: str, second: str, settings: dict[str, Any], sources: dict[str, Source]) -> str:
    """One line naming both flags: `first` (which sets the run's kind, or the warmup fraction) and
    `second`, given with a value that means something."""
    if _given(sources, first):
        return (f"give one of {_FLAGS[first]} and {_FLAGS[second]}, not both ({sources[first].describe()}; "
                f"{sources[second].describe()})")
    # the run's kind from a preset or the default (--train-iters 250): the user gave only the other length
    counts, other = ("samples", "iterations") if first == "train_samples" else ("iterations", "samples")
    where = "on the command line" if sources[second].kind == FLAG else f"from {sources[second].origin}"
    return (f"{_FLAGS[second]} {show_value(settings[second])} {where} is a length in {other}, "
            f"and this run counts {counts} ({_FLAGS[first]} {show_value(settings[first])}, "
            f"{sources[first].describe()}): give {_FLAGS['train_samples' if counts == 'iterations' else 'train_iters']}"
            f" to count {other}, or drop {_FLAGS[second]} (Megatron-LM refuses the two kinds together)")


def check_run_lengths(settings: dict[str, Any], sources: dict[str, Source]) -> list[str]:
    """A problem for each length of the other kind given with a value other than its unset one, and for a
    warmup of the run's own kind given non-zero beside --lr-warmup-fraction (Megatron's validate_args)."""
    sample_based = settings.get("train_samples") is not None
    kind, others = ("train_samples", ITERATION_BASED_UNSET) if sample_based else ("train_iters", SAMPLE_BASED_UNSET)
    problems = [_conflict(kind, name, settings, sources) for name, unset in others.items()
                if name != kind and _given(sources, name) and settings[name] != unset]
    own_warmup = "lr_warmup_samples" if sample_based else "lr_warmup_iters"
    if (settings.get("lr_warmup_fraction") is not None and _given(sources, "lr_warmup_fraction")
            and _given(sources, own_warmup) and settings[own_warmup] != 0):
        problems.append(_conflict("lr_warmup_fraction", own_warmup, settings, sources))
    return problems


def use_sample_based_lengths(settings: dict[str, Any], sources: dict[str, Source]) -> None:
    """With --train-samples the run is sample-based, as in Megatron-LM: the iteration-based lengths must be
    unset there, so a preset's or default's value for them is dropped (a given one is refused above)."""
    if settings.get("train_samples") is None:
        return
    for name, unset in ITERATION_BASED_UNSET.items():
        if settings[name] != unset:
            settings[name] = unset
            given = sources["train_samples"]
            sources[name] = Source(given.kind, given.origin or "--train-samples",
                                   note="unset: the run is sample-based, as in Megatron-LM")
