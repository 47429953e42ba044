"""The parallel-combination table (tests/training/combinations.py), run one way: each model once on one rank (in this
process), and every combination of one rank count in turn in one multi-rank launch (tests/training/test_moe_training.py
launch_rank), as the checkpoint conformance table does; then each combination's logged values against its model's
one-rank run, at every iteration, within the entry's tolerance."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import pretrain_gpt
from tests.distributed import free_port, run_distributed
from tests.training.combinations import DIMENSIONS, MODELS, TABLE, Combination, Layout
from tests.training.test_moe_training import launch_rank

# per command line of a launch: the slowest (TP 4, 20 iterations) took about 60 s on the loaded 2-core machine
SECONDS_PER_RUN = 300


def logged(path: Path) -> list[dict]:
    return [record for record in map(json.loads, path.read_text().splitlines())
            if "loss" in record and "split" not in record]


@pytest.fixture(scope="module")
def runs(tmp_path_factory, request) -> Path:
    work = tmp_path_factory.mktemp("combinations")
    data = {name: ["--data-cache-dir", request.getfixturevalue(model.corpus)] for name, model in MODELS.items()}
    for name, model in MODELS.items():
        assert pretrain_gpt.main([*model.flags, *data[name], "--metrics-file", str(work / f"{name}.jsonl")]) == 0
    for ranks in sorted({entry.ranks for entry in TABLE}):
        entries = [entry for entry in TABLE if entry.ranks == ranks]
        argvs = [[*MODELS[entry.model].flags, *entry.layout.flags(), *data[entry.model], "--metrics-file",
                  str(work / f"{entry.name}.jsonl")] for entry in entries]
        run_distributed(launch_rank, ranks, argvs, [free_port() for _ in argvs], timeout=SECONDS_PER_RUN * len(argvs))
    return work


def test_the_table_names_each_combination_once_and_sets_each_main_dimension():
    assert len({entry.name for entry in TABLE}) == len(TABLE)
    assert {entry.model for entry in TABLE} == set(MODELS)
    set_by_table = {name for entry in TABLE for name in DIMENSIONS
                    if getattr(entry.layout, name) != getattr(Layout(), name)}
    assert {"tp", "sp", "pp", "vp_layers", "zero", "ep", "etp"} <= set_by_table
    assert {entry.ranks for entry in TABLE} == {2, 4}


@pytest.mark.slow
@pytest.mark.parametrize("name", MODELS)
def test_each_models_one_rank_run_trains(runs, name):
    model, reference = MODELS[name], logged(runs / f"{name}.jsonl")
    assert len(reference) == model.iterations
    if model.learns is not None:
        assert reference[-1]["loss"] < reference[0]["loss"] - model.learns
    if model.clips is not None:
        assert all(record["grad_norm"] > model.clips for record in reference), "every step clips"


@pytest.mark.slow
@pytest.mark.parametrize("entry", TABLE, ids=[entry.name for entry in TABLE])
def test_a_combination_logs_its_one_rank_runs_values(runs, entry: Combination):
    reference, ours = logged(runs / f"{entry.model}.jsonl"), logged(runs / f"{entry.name}.jsonl")
    assert len(ours) == len(reference) == MODELS[entry.model].iterations
    for key, rel in entry.held.items():
        assert [record[key] for record in ours] == pytest.approx([record[key] for record in reference], rel=rel,
                                                                 abs=0), key
