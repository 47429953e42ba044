"""What `python -m zero.plan search` prints: the top picks with their dry-run figures and launch commands, why each pick
after the first ranks below it (a tie's tie-break, else the term that costs it most), and what the rest lost to."""

from __future__ import annotations

from typing import Optional

from arguments.config_sources import DEFAULT, FLAG
from arguments.training_config import TrainingConfig
from gpt.model_config import ModelConfig
from planner.layout_flags import launch_command
from planner.layout_perf import Layout
from planner.layout_pins import Pins
from planner.layout_search import MAX_COUNT_WALKED, Candidate, model_parallel_ranks, rank_key
from planner.search_progress import layout_label
from zero.memory import format_bytes


def _given_by(sources: dict, setting: str, flag: str) -> str:
    source = sources.get(setting)
    if source is None or source.kind == DEFAULT:
        if setting == "global_batch_size":
            return f"none given: the search's default, on every command; {flag} sets it"
        return f"pretrain_gpt.py's default; {flag} sets it"
    return "your flag" if source.kind == FLAG else f"from {source.describe()}"


def answer_terms(model: ModelConfig, training: TrainingConfig, sources: dict, pins: Pins, fp32_runs: bool) -> str:
    """What every pick is for: the global batch and the sequence, each with its source, and the precision."""
    precision = "fp32" if fp32_runs and not pins.sixteen_bit else \
        (training.precision if pins.sixteen_bit else "bf16")
    if pins.precision == "fp8":
        precision += " with FP8 GEMMs (--fp8-format)"
    batch, seq = training.global_batch_size, model.seq_length
    return (f"for global batch {batch:,} ({_given_by(sources, 'global_batch_size', '--global-batch-size')}), "
            f"sequence {seq:,} ({_given_by(sources, 'seq_length', '--seq-length')}), {precision}: "
            f"{batch * seq:,} tokens a step")


def loss_reason(candidate: Candidate, best: Candidate) -> str:
    """Why `candidate` ranks below `best`."""
    mine, theirs = candidate.prediction, best.prediction
    if rank_key(candidate)[0] == rank_key(best)[0]:
        tie = f"tie with 1. at {mine.step_s * 1e3:,.1f} ms; after it by the tie-break"
        ranks, best_ranks = model_parallel_ranks(candidate.layout), model_parallel_ranks(best.layout)
        if ranks != best_ranks:
            return f"{tie}: fewer model-parallel ranks first ({ranks} against {best_ranks})"
        memory, best_memory = rank_key(candidate)[2], rank_key(best)[2]
        if memory != best_memory:
            which = "dry run" if candidate.dry_run_bytes and best.dry_run_bytes else "count"
            return f"{tie}: less memory first ({format_bytes(memory)} against {format_bytes(best_memory)}, {which})"
        return f"{tie}: equal there too, listed in the search's order"
    excess = {term: seconds - theirs.terms[term] for term, seconds in mine.terms.items()}
    term = max(excess, key=excess.get)
    return f"{term} +{excess[term] * 1e3:,.1f} ms (step {mine.step_s / theirs.step_s:.3f}x the best)"


def explain_losses(candidates: list[Candidate]) -> None:
    """Set `lost_to` of every fitting candidate after the best."""
    fitting = [c for c in candidates if c.fits]
    for candidate in fitting[1:]:
        candidate.lost_to = loss_reason(candidate, fitting[0])


def no_fit_lines(gpus: int, budget: int, seq_length: int, smallest: Optional[tuple[int, Layout]], checked: str,
                 closest: Optional[Candidate], baseline: Optional[tuple[Layout, float]],
                 levers: list[tuple[str, float]]) -> list[str]:
    """The answer where no layout fits on `gpus` GPUs: the smallest count that fits (`checked`: whether the dry run
    confirmed it) and, at the count asked, the single lever that cuts memory most from `baseline`, and all together
    (`closest`)."""
    gb, on = f"{budget / 1e9:,.0f} GB", f"{gpus:,} GPU{'s' if gpus > 1 else ''}"
    where = f"no layout fits on {on} of {gb} at sequence {seq_length:,}: "
    if smallest is None:
        where += f"nor on any count up to {MAX_COUNT_WALKED:,} GPUs by the count (a shorter sequence, or --context-parallel-size)"
    else:
        count, layout = smallest
        where += f"the smallest count that fits is {count:,} GPUs ({checked}), as {layout_label(layout)}"
    if closest is None:
        return [where]
    together = f"every lever together at best {layout_label(closest.layout)}, {closest.memory_bytes / 1e9:,.0f} GB"
    if not levers or baseline is None:
        return [where, f"closest on {on}: {together} counted against {gb}"]
    (flags, lever_bytes), (plain, plain_bytes) = levers[0], baseline
    return [where, f"closest on {on}: from {layout_label(plain)} ({plain_bytes / 1e9:,.0f} GB) the lever "
                   f"that cuts the most is {flags}, {lever_bytes / 1e9:,.0f} GB counted against {gb}; {together}"]


def memory_text(candidate: Candidate, budget: int) -> str:
    if candidate.stage_bytes is None:
        return f"counted {format_bytes(candidate.memory_bytes)} (not checked by the dry run)"
    stages = candidate.stage_bytes
    worst = max(range(len(stages)), key=stages.__getitem__)
    where = f" (worst of {len(stages)} stages: {worst})" if len(stages) > 1 else ""
    return f"dry run {format_bytes(stages[worst])} of {format_bytes(budget)}{where}"


def format_picks(candidates: list[Candidate], top: int, model_flags: list[str], gpus_per_node: int,
                 budget: int, header: str, notes: Optional[list[str]] = None, checked_only: bool = False) -> str:
    """The header, the notes, the top `top` fitting candidates as commands (`checked_only`: only those the dry run
    planned), and what the rest lost to."""
    fitting = [c for c in candidates if c.fits and (c.stage_bytes or not checked_only)]
    lines = [header, *(notes or [])]
    for rank, candidate in enumerate(fitting[:top], 1):
        p = candidate.prediction
        lines.append(f"{rank}. {p.step_s * 1e3:,.1f} ms/step, {p.model_tflops_per_gpu:,.0f} TFLOP/s/GPU, "
                     f"{memory_text(candidate, budget)}" + (f"  [{candidate.lost_to}]" if rank > 1 else ""))
        lines.append("   " + launch_command(candidate.layout.gpus, gpus_per_node,
                                            candidate.launch_flags(model_flags)))
    reasons: dict[str, int] = {}
    for candidate in candidates[min(top, len(fitting)):]:
        key = candidate.lost_to.split(" +")[0].split(":")[0].split(" at ")[0] or "not ranked"
        reasons[key] = reasons.get(key, 0) + 1
    lines.append("the rest lost to: " + ", ".join(f"{term} ({n:,})" for term, n in
                                                 sorted(reasons.items(), key=lambda kv: -kv[1])))
    return "\n".join(lines)
