"""The layout search against measured runs: on one H100, what the lent H100 measured (docs/search-vs-measured-h100-*.json, written
by scripts/bench/search_vs_measured.py --device cuda): gpt2-350m and gpt2-124m at sequence 1024, global batch 32, every
micro-batch size and full recompute or none, each trained by pretrain_gpt.py on the GPU.

Our step at a small micro-batch is bound by the host (Python, autograd, the launches, the gradient hooks: about 2 ms a
layer per micro-batch there), not the GPU: without the host term (planner/layout_perf.py `host`, the profile's
constants from scripts/bench/probe_host_overhead.py, not fitted to these steps) every micro-batch size was predicted the
same 192 ms and the search's top pick, MBS 1, measured 7.55x the fastest. And on 4 CPU ranks, the balanced side-by-side
run of docs/search-vs-measured-cpu-balanced.json (scripts/bench/search_vs_measured.py), taken before the host term."""

import json
import shlex
from pathlib import Path

import pytest

from arguments.parser import parse_config
from planner.layout_of_config import layout_of_config
from planner.layout_perf import model_counts
from planner.layout_search import search
from planner.perf_model import load_hardware
from planner.vocabulary import launch_vocab
from scripts.bench.search_vs_measured import MODEL, candidates_to_measure

DOCS = Path(__file__).resolve().parents[2] / "docs"


def predicted_steps(model: str) -> tuple[dict, tuple]:
    config = parse_config(model.split())
    _, candidates = search(config, 1, load_hardware("h100-sxm"), launch_vocab(config.checkpoint, config.data, config.model, config.sources)[0])
    steps = {}
    for candidate in candidates:
        layout = candidate.layout
        key = (layout.micro_batch_size, "full" if layout.recompute_fraction else "none")
        steps.setdefault(key, candidate.prediction.step_s)
    top = candidates[0].layout
    return steps, (top.micro_batch_size, "full" if top.recompute_fraction else "none")


@pytest.mark.parametrize("name", ["350m", "124m"])
def test_the_search_on_one_h100_picks_the_fastest_measured_layout_and_ranks_as_measured(name):
    measured_file = json.loads((DOCS / f"search-vs-measured-h100-{name}.json").read_text(encoding="utf-8"))
    measured = {(row["micro_batch_size"], row["recompute"]): row["measured_s"] for row in measured_file["layouts"]}
    predicted, top_pick = predicted_steps(measured_file["model"])
    assert top_pick == min(measured, key=measured.get) == (8, "none")
    assert sorted(measured, key=predicted.get) == sorted(measured, key=measured.get)
    # every prediction 0.74-1.01 of the measured step: the host probe ran at sequence 64, where a micro-batch took
    # 46 ms, against 60 ms at sequence 1024 (the host's work grows a little with the tokens: not modelled)
    ratios = {key: predicted[key] / measured[key] for key in measured}
    assert all(0.70 <= ratio <= 1.05 for ratio in ratios.values()), ratios


def ran_layout(flags: str):
    """The layout pretrain_gpt.py runs for MODEL and `flags` (planner/layout_of_config.py)."""
    config = parse_config([*MODEL, *shlex.split(flags)])
    return layout_of_config(config.model, config.parallel, config.training, config.zero, config.activations, 4, model_counts(config.model, launch_vocab(config.checkpoint, config.data, config.model, config.sources)[0]))


def _run_key(tp: int, pp: int, dp: int, micro_batch_size: int, stage: int) -> tuple:
    """One run's layout: the optimizer's sharding is the plain run's at DP 1."""
    return tp, pp, dp, micro_batch_size, stage if dp > 1 else 0


def test_the_cpu_search_top_pick_is_within_10_percent_of_the_fastest_measured_on_4_ranks():
    """Re-predicted with the CPU profile's host constants (scripts/bench/probe_host_overhead.py --ranks 4, 24.7 ms a
    micro-batch; the balanced run measured 23.3 ms between MBS 1 and 2 of the same layout): the top pick moves from
    PP 2 x DP 2 at MBS 1 (measured 1.248x the fastest) to MBS 2, measured 1.063x. That run (before ZeRO-2/3 were
    choices) measured every layout the search then kept; the ZeRO-2/3 ones are new."""
    measured_file = json.loads((DOCS / "search-vs-measured-cpu-balanced.json").read_text(encoding="utf-8"))
    measured = {_run_key(row["tp"], row["pp"], row["dp"], row["micro_batch_size"], int(row["zero"] != "none")):
                row["measured_s"] for row in measured_file["layouts"]}
    kept = candidates_to_measure(MODEL, 4, "cpu-2core-4proc", None)
    keys = [_run_key(c.layout.tp, c.layout.pp, c.layout.dp, c.layout.micro_batch_size, c.layout.stage) for c in kept]
    assert set(measured) <= set(keys) and len(measured) == 16
    assert keys[0] == (1, 2, 2, 2, 1)  # PP 2 x DP 2, MBS 2, the distributed optimizer
    assert measured[keys[0]] / min(measured.values()) <= 1.10


def test_the_cpu_search_top_pick_measured_side_by_side_with_every_layout_is_within_10_percent():
    """docs/search-vs-measured-cpu-host.json: every layout the search keeps (24, ZeRO-2/3 among them) trained on 4
    ranks in 2 balanced rounds after the host term: its layout 1 is today's top pick, measured 1.078x the fastest."""
    measured_file = json.loads((DOCS / "search-vs-measured-cpu-host.json").read_text(encoding="utf-8"))
    rows = measured_file["layouts"]
    kept = candidates_to_measure(MODEL, 4, "cpu-2core-4proc", None)
    # the same runs: each measured line (written before the search dropped the flags it repeated, the global batch
    # and the default --overlap-grad-reduce) runs the layout the search's line for it runs
    assert [ran_layout(candidate.flags()) for candidate in kept] == [ran_layout(row["flags"]) for row in rows]
    fastest = min(row["measured_s"] for row in rows)
    assert rows[0]["measured_s"] / fastest <= 1.10
