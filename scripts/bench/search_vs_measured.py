#!/usr/bin/env python
"""The layout search's pick against every layout measured side by side: a 2-layer GPT on 4 gloo CPU ranks.

    nice -n 10 python scripts/bench/search_vs_measured.py --output docs/search-vs-measured-cpu.json

The layouts the search keeps train in interleaved rounds; reported: the measured and predicted rankings and the top
pick's step over the fastest's. On a GPU: --device cuda --ranks 1."""

from __future__ import annotations

import json
import os
import shlex
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Optional, Sequence

REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT))

from arguments.config import ConfigError  # noqa: E402
from base.errors import OneLineArgumentParser, run_tool  # noqa: E402
from scripts.timed_launch import step_times  # noqa: E402

RANKS = 4
VOCAB = 512
# Wide and long enough that a step's GEMMs outweigh the launch's fixed costs; a run of 8 steps is seconds.
MODEL = ["--num-layers", "2", "--hidden-size", "256", "--num-attention-heads", "4", "--seq-length", "256",
         "--max-position-embeddings", "256", "--tokenizer-vocab-size", str(VOCAB), "--global-batch-size", "4"]
TRAINING = ["--log-interval", "1", "--eval-iters", "0", "--hidden-dropout", "0",
            "--attention-dropout", "0", "--lr-warmup-iters", "0"]


def load_average() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def candidates_to_measure(model: Sequence[str], ranks: int, hardware_name: str, layouts: Optional[int],
                          recompute: bool = False) -> list:
    from arguments.parser import parse_config
    from planner.layout_search import search
    from planner.perf_model import load_hardware
    from planner.vocabulary import launch_vocab

    config = parse_config(list(model))
    hardware = load_hardware(hardware_name)
    vocab = launch_vocab(config.checkpoint, config.data, config.model, config.sources)[0]
    _, candidates = search(config, ranks, hardware, vocab)
    kept, runs = [], set()
    for candidate in candidates:
        layout = candidate.layout
        if not candidate.fits or layout.cp > 1 or (layout.recompute_fraction > 0 and not recompute):
            continue
        run = (layout.tp, layout.pp, layout.vp, layout.micro_batch_size, layout.stage if layout.dp > 1 else 0,
               layout.recompute_fraction)
        if run not in runs:
            runs.add(run)
            kept.append(candidate)
    if layouts is not None and layouts < len(kept):
        pipelined = next((c for c in kept if c.layout.pp > 1), None)
        first = [kept[0]] + ([pipelined] if pipelined is not None and pipelined is not kept[0] else [])
        kept = (first + [c for c in kept if all(c is not f for f in first)])[:layouts]
    return kept


def run_layout(model: Sequence[str], ranks: int, device: str, flags: Sequence[str], iterations: int,
               cache_dir: str, scratch: Path) -> list[float]:
    """One launch on `ranks` ranks (gloo on the CPU), one thread a rank; each step's iter_time_s."""
    argv = [*model, *TRAINING, "--device", device, *flags, "--train-iters", str(iterations), "--data-cache-dir",
            cache_dir]
    return step_times(argv, ranks, scratch, f"the layout {shlex.join(flags)}")


def ranking(values: dict[str, float]) -> list[str]:
    return sorted(values, key=values.get)


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = OneLineArgumentParser(prog="scripts/bench/search_vs_measured.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--hardware", default="cpu-2core-4proc")
    parser.add_argument("--model", default=shlex.join(MODEL), help="the model's pretrain_gpt.py flags, one string")
    parser.add_argument("--ranks", type=int, default=RANKS)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--recompute", action="store_true", help="measure the full-recompute layouts too")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--iterations", type=int, default=8)
    parser.add_argument("--skip", type=int, default=2, help="steps dropped from the start of each run")
    parser.add_argument("--layouts", type=int, default=None, help="measure K layouts, not all")
    parser.add_argument("--output", default=None, help="write the results as JSON here")
    parser.add_argument("--data-cache-dir", default=None)
    args = parser.parse_args(argv)
    if args.iterations <= args.skip:
        raise ConfigError(f"--iterations {args.iterations} with --skip {args.skip}: no steady step is left")
    from data.corpus import prepare_default_corpus

    model = shlex.split(args.model)
    cache_dir = args.data_cache_dir or str(Path.home() / ".cache" / "zero-gpt")
    if "--tokenizer-vocab-size" in model:
        prepare_default_corpus(cache_dir, int(model[model.index("--tokenizer-vocab-size") + 1]))  # before the ranks
    kept = candidates_to_measure(model, args.ranks, args.hardware, args.layouts, args.recompute)
    names = [f"{rank}" for rank in range(1, len(kept) + 1)]  # the search's predicted rank among those measured
    steady: dict[str, list[float]] = {name: [] for name in names}
    per_round: list[dict[str, float]] = []  # each round's median steady step per layout
    loads = []
    with tempfile.TemporaryDirectory() as scratch:
        for round_index in range(args.rounds):
            loads.append(load_average())
            print(f"round {round_index + 1}/{args.rounds}, load average {loads[-1]}", flush=True)
            # forward in even rounds, reversed in odd ones: over an even number of rounds every layout's mean
            # place in the order is the same, so a load that falls (or rises) through the run favours none
            order = list(range(len(kept)))[::-1 if round_index % 2 else 1]
            per_round.append({})
            for index in order:
                times = run_layout(model, args.ranks, args.device, kept[index].flag_words, args.iterations,
                                   cache_dir, Path(scratch))
                steady[names[index]] += times[args.skip:]
                per_round[-1][names[index]] = statistics.median(times[args.skip:])
                print(f"  layout {names[index]}: steps {', '.join(f'{t:.3f}' for t in times)} s", flush=True)
    loads.append(load_average())
    measured = {name: statistics.median(steady[name]) for name in names}
    predicted = {name: candidate.prediction.step_s for name, candidate in zip(names, kept)}
    fastest = ranking(measured)[0]
    ratio = measured[names[0]] / measured[fastest]
    round_ratios = [round(medians[names[0]] / min(medians.values()), 4) for medians in per_round]
    rows = [{"layout": name, "flags": candidate.flags(), "predicted_s": round(predicted[name], 5),
             "measured_s": round(measured[name], 5), "steady_steps": len(steady[name]),
             "terms_s": {k: round(v, 5) for k, v in candidate.prediction.terms.items()},
             **{k: candidate.to_json()[k] for k in ("tp", "pp", "dp", "micro_batch_size", "zero", "zero_stage",
                                                     "recompute")}}
            for name, candidate in zip(names, kept)]
    for row in rows:
        print(f"layout {row['layout']:>2}: predicted {row['predicted_s'] * 1e3:8.1f} ms, measured "
              f"{row['measured_s'] * 1e3:8.1f} ms  (TP {row['tp']} PP {row['pp']} DP {row['dp']} MBS "
              f"{row['micro_batch_size']}, {row['zero']}, recompute {row['recompute']})")
    print(f"measured ranking (fastest first): {' '.join(ranking(measured))}")
    print(f"predicted ranking:                {' '.join(ranking(predicted))}")
    print(f"top pick (layout 1) measured {measured[names[0]] * 1e3:.1f} ms, the fastest (layout {fastest}) "
          f"{measured[fastest] * 1e3:.1f} ms: {ratio:.3f}x")
    print(f"the top pick over each round's fastest: {', '.join(f'{r:.3f}x' for r in round_ratios)}")
    print(f"load average (1, 5, 15 min) at each round's start and the end: {' | '.join(loads)}")
    if args.output:
        result = {"command": "python scripts/bench/search_vs_measured.py " + shlex.join(list(argv or sys.argv[1:])),
                  "model": args.model, "ranks": args.ranks, "device": args.device, "hardware": args.hardware, "rounds": args.rounds,
                  "iterations": args.iterations, "skip": args.skip, "load_average": loads,
                  "measured_ranking": ranking(measured), "predicted_ranking": ranking(predicted),
                  "top_pick_over_fastest": round(ratio, 4), "top_pick_over_fastest_per_round": round_ratios,
                  "layouts": rows}
        Path(args.output).write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(run_tool("scripts/bench/search_vs_measured.py", main, (ConfigError,)))
