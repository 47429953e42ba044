"""How long a run is counted, in iterations (--train-iters) or samples (--train-samples), and which schedule lengths go
with each, by Megatron-LM's validate_args. As there, values are compared, not flags: a length of the other kind counts
only with a value that means something; a preset's or default's one is dropped."""

from __future__ import annotations

from typing import Any

from arguments.config_sources import FLAG, JSON, Source, show_value

# Each kind's lengths, with the value that leaves them unset (Megatron's defaults).
ITERATION_BASED_UNSET = {"train_iters": None, "lr_warmup_iters": 0, "lr_decay_iters": None}
SAMPLE_BASED_UNSET = {"train_samples": None, "lr_warmup_samples": 0, "lr_decay_samples": None}
_FLAGS = {name: "--" + name.replace("_", "-") for name in (*ITERATION_BASED_UNSET, *SAMPLE_BASED_UNSET,
                                                             "lr_warmup_fraction")}


def _given(sources: dict[str, Source], name: str) -> bool:
    return sources[name].kind in (JSON, FLAG)


def _conflict(first: str, second: str, settings: dict[str, Any], sources: dict[str, Source]) -> str:
    """One line naming both flags: `first` (the run's kind, or the warmup fraction) and `second`, given with a value
    that means something."""
    if _given(sources, first):
        return (f"give one of {_FLAGS[first]} and {_FLAGS[second]}, not both ({sources[first].describe()}; "
                f"{sources[second].describe()})")
    # the run's kind from a preset or the default: the user gave only the other length
    counts, other = ("samples", "iterations") if first == "train_samples" else ("iterations", "samples")
    where = "on the command line" if sources[second].kind == FLAG else f"from {sources[second].origin}"
    return (f"{_FLAGS[second]} {show_value(settings[second])} {where} is a length in {other}, "
            f"and this run counts {counts} ({_FLAGS[first]} {show_value(settings[first])}, "
            f"{sources[first].describe()}): give {_FLAGS['train_samples' if counts == 'iterations' else 'train_iters']}"
            f" to count {other}, or drop {_FLAGS[second]} (Megatron-LM refuses the two kinds together)")


def check_run_lengths(settings: dict[str, Any], sources: dict[str, Source]) -> list[str]:
    """A problem for each length of the other kind given a value, and for a non-zero warmup of the run's own kind beside
    --lr-warmup-fraction."""
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
    """With --train-samples the iteration-based lengths are unset, as in Megatron-LM; a preset's or default's value for
    them is dropped."""
    if settings.get("train_samples") is None:
        return
    for name, unset in ITERATION_BASED_UNSET.items():
        if settings[name] != unset:
            settings[name] = unset
            given = sources["train_samples"]
            sources[name] = Source(given.kind, given.origin or "--train-samples",
                                   note="unset: the run is sample-based, as in Megatron-LM")
