"""Checkpoint conformance as one table (issue 61 item 4): each row a save layout, a load layout, the model and the
optimizer, in the shape of torchtitan's tests/integration_tests/features.py (a list of rows, each run the same way).

For each row a run trains 4 iterations at the save layout, saving at iteration 2 (its iterations 3 and 4 the
reference), and the checkpoint is resumed at the load layout: the resumed losses and gradient norms equal the
uninterrupted run's to 1e-5 relative (fp32, dropout off), bitwise where the row says so (the same layout, so the same
reduction order). A row at another TP, PP, EP, expert TP or DP size sums the same numbers in another order, which fp32
may round differently (measured at most 2.7e-7 relative here). The save runs are shared between the rows that load
the same checkpoint, and every launch of one world size runs in one multi-rank launch (tests/training/
test_moe_training.py launch_rank): two launches per world size, saves then resumes.

The rows cover TP, sequence parallelism, PP, virtual stages, EP, expert TP, DP, ZeRO 0-3 and offload, Adam,
AdEMAMix, Muon and bf16 moments, and the issues' named cases: TP 2 x PP 2 with the distributed optimizer resumed on
one rank; one rank resumed at TP 2 + SP; an MoE saved at TP 2 + SP x EP 2 resumed on one rank and at PP 2 x EP 2;
issue 69's MoE at TP 2 + SP with expert TP 1; and an MoE whose experts are split over 2 DP ranks at TP 1 (expert TP
above TP, issue 81) resumed at TP 2 + SP x EP 2, expert TP 1."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.distributed import free_port, run_distributed
from tests.reliability_helpers import TINY
from tests.training.test_expert_parallel_training import MOE
from tests.training.test_moe_training import launch_rank

ITERATIONS, SAVED_AT = 4, 2
# TINY (hidden 32, 2 heads, 16-token samples, dropout 0) at 4 layers, so that PP 2 holds 2 virtual stages of 1
DENSE = TINY + ["--num-layers", "4", "--train-iters", str(ITERATIONS), "--global-batch-size", "8", "--seed", "3"]
MOE_MODEL = TINY + MOE + ["--train-iters", str(ITERATIONS), "--global-batch-size", "8"]
OPTIMIZERS = {
    "adam": [],
    "ademamix": ["--optimizer", "ademamix", "--ademamix-alpha", "8", "--ademamix-beta3", "0.9999"],
    "muon": ["--optimizer", "muon", "--muon-momentum", "0.95", "--muon-nesterov"],
    # Newton-Schulz in fp32: in bf16 TP's last-bit gradient differences become bf16 ones (docs/configuration.md)
    "muon-fp32-ns": ["--optimizer", "muon", "--muon-momentum", "0.95", "--muon-fp32-matmul-prec", "high"],
    "adam-bf16-moments": ["--use-precision-aware-optimizer", "--exp-avg-dtype", "bf16", "--exp-avg-sq-dtype", "bf16"],
}
TP2, SP, EP2 = ["--tensor-model-parallel-size", "2"], ["--sequence-parallel"], ["--expert-model-parallel-size", "2"]
PP2 = ["--pipeline-model-parallel-size", "2"]


def zero(stage: int) -> list[str]:
    return ["--zero-stage", str(stage)]


@dataclass(frozen=True)
class Layout:
    name: str
    flags: tuple[str, ...]
    world: int  # ranks


LAYOUTS = {layout.name: layout for layout in [
    Layout("1 rank", ("--zero-stage", "0"), 1),
    Layout("1 rank, ZeRO 1", tuple(zero(1)), 1),
    Layout("TP 2 + SP, ZeRO 1", (*TP2, *SP, *zero(1)), 2),
    Layout("TP 2, ZeRO 0", (*TP2, *zero(0)), 2),
    Layout("TP 2, ZeRO 1", (*TP2, *zero(1)), 2),
    Layout("TP 2 x PP 2, distributed optimizer", (*TP2, *PP2, "--use-distributed-optimizer"), 4),
    Layout("PP 2 x 2 virtual stages x DP 2, ZeRO 2", (*PP2, "--num-layers-per-virtual-pipeline-stage", "1", *zero(2)), 4),
    Layout("PP 2 x 2 virtual stages, ZeRO 1", (*PP2, "--num-layers-per-virtual-pipeline-stage", "1", *zero(1)), 2),
    Layout("DP 2, ZeRO 1", tuple(zero(1)), 2),
    Layout("DP 2, ZeRO 2", tuple(zero(2)), 2),
    Layout("DP 2, ZeRO 3", tuple(zero(3)), 2),
    Layout("DP 2, ZeRO 3 + offload", (*zero(3), "--offload-optimizer", "--offload-param"), 2),
    Layout("DP 4, ZeRO 2", tuple(zero(2)), 4),
    Layout("TP 2 + SP x EP 2", (*TP2, *SP, *EP2, "--moe-token-dispatcher-type", "alltoall", *zero(1)), 4),
    Layout("TP 2 + SP x EP 2, expert TP 1", (*TP2, *SP, *EP2, "--expert-tensor-parallel-size", "1",
                                            "--moe-token-dispatcher-type", "alltoall", *zero(1)), 4),
    Layout("PP 2 x EP 2", (*PP2, *EP2, "--moe-token-dispatcher-type", "alltoall", *zero(1)), 4),
    Layout("TP 2 + SP, expert TP 1", (*TP2, *SP, "--expert-tensor-parallel-size", "1", *zero(1)), 2),
    Layout("EP 2, ZeRO 3", (*EP2, "--moe-token-dispatcher-type", "alltoall", *zero(3)), 2),
    # Megatron-Core's parallel folding with the expert TP above the TP size: each expert split over the 2 DP ranks
    Layout("DP 2, expert TP 2", ("--expert-tensor-parallel-size", "2", "--moe-token-dispatcher-type", "alltoall",
                                 *zero(1)), 2),
]}


@dataclass(frozen=True)
class Row:
    save: str
    load: str
    model: str = "dense"
    optimizer: str = "adam"
    bitwise: bool = False  # the same reduction order: the uninterrupted run's losses exactly

    @property
    def id(self) -> str:
        return f"{self.model} {self.optimizer}: {self.save} -> {self.load}"


ROWS = [
    Row("1 rank", "TP 2 + SP, ZeRO 1"),
    Row("TP 2 x PP 2, distributed optimizer", "1 rank"),
    Row("TP 2 x PP 2, distributed optimizer", "PP 2 x 2 virtual stages x DP 2, ZeRO 2"),
    Row("PP 2 x 2 virtual stages, ZeRO 1", "DP 2, ZeRO 3"),
    Row("DP 2, ZeRO 3 + offload", "TP 2, ZeRO 0"),
    Row("DP 4, ZeRO 2", "DP 2, ZeRO 3"),
    Row("DP 4, ZeRO 2", "1 rank"),
    Row("TP 2 + SP x EP 2", "1 rank", model="moe"),
    Row("TP 2 + SP x EP 2", "PP 2 x EP 2", model="moe"),
    Row("TP 2 + SP x EP 2", "TP 2 + SP x EP 2", model="moe", bitwise=True),
    Row("TP 2 + SP x EP 2", "TP 2 + SP x EP 2, expert TP 1", model="moe"),
    Row("TP 2 + SP x EP 2, expert TP 1", "TP 2 + SP x EP 2", model="moe"),
    Row("TP 2 + SP, expert TP 1", "TP 2 + SP, expert TP 1", model="moe", bitwise=True),
    Row("TP 2 + SP, expert TP 1", "EP 2, ZeRO 3", model="moe"),
    Row("DP 2, expert TP 2", "TP 2 + SP x EP 2, expert TP 1", model="moe"),
    Row("TP 2, ZeRO 1", "DP 2, ZeRO 2", optimizer="ademamix"),
    Row("DP 2, ZeRO 1", "1 rank, ZeRO 1", optimizer="muon"),
    Row("TP 2, ZeRO 1", "1 rank, ZeRO 1", optimizer="muon-fp32-ns"),  # its momentum saved from TP shards
    Row("TP 2, ZeRO 1", "1 rank, ZeRO 1", optimizer="adam-bf16-moments"),
]


def save_key(row: Row) -> tuple[str, str, str]:
    return row.save, row.model, row.optimizer


def flags(layout: str, model: str, optimizer: str) -> list[str]:
    return [*(DENSE if model == "dense" else MOE_MODEL), *OPTIMIZERS[optimizer], *LAYOUTS[layout].flags]


def launch_in_turn(rank: int, world_size: int, argvs: list[list[str]], ports: list[int]) -> None:
    launch_rank(rank, world_size, argvs, ports)


def run_grouped(launches: list[tuple[int, list[str]]]) -> None:
    """Each world size's command lines in one multi-rank launch."""
    for world in sorted({world for world, _ in launches}):
        argvs = [argv for size, argv in launches if size == world]
        run_distributed(launch_in_turn, world, argvs, [free_port() for _ in argvs], timeout=900)


def losses(path: Path) -> dict[int, tuple[float, float]]:
    """iteration -> (loss, gradient norm)."""
    return {r["iteration"]: (r["loss"], r["grad_norm"]) for r in map(json.loads, path.read_text().splitlines())
            if "loss" in r and "split" not in r}


@pytest.fixture(scope="module")
def table(tmp_path_factory, corpus_cache_300):
    work = tmp_path_factory.mktemp("conformance")
    common = ["--data-cache-dir", corpus_cache_300]
    saves = {key: f"save{index}" for index, key in enumerate(dict.fromkeys(map(save_key, ROWS)))}
    run_grouped([(LAYOUTS[layout].world,
                  flags(layout, model, optimizer) + common + ["--save", str(work / name), "--save-interval",
                                                              str(SAVED_AT), "--metrics-file", str(work / f"{name}.jsonl")])
                 for (layout, model, optimizer), name in saves.items()])
    run_grouped([(LAYOUTS[row.load].world,
                  flags(row.load, row.model, row.optimizer) + common
                  + ["--load", str(work / saves[save_key(row)] / f"iter_{SAVED_AT:07d}"),
                     "--metrics-file", str(work / f"row{index}.jsonl")])
                 for index, row in enumerate(ROWS)])
    return {row.id: (losses(work / f"{saves[save_key(row)]}.jsonl"), losses(work / f"row{index}.jsonl"))
            for index, row in enumerate(ROWS)}


def test_the_table_covers_every_dimension_and_the_issues_cases():
    named = {(row.save, row.load, row.model) for row in ROWS}
    assert {("TP 2 x PP 2, distributed optimizer", "1 rank", "dense"), ("1 rank", "TP 2 + SP, ZeRO 1", "dense"),
            ("TP 2 + SP x EP 2", "1 rank", "moe"), ("TP 2 + SP x EP 2", "PP 2 x EP 2", "moe"),
            ("TP 2 + SP, expert TP 1", "TP 2 + SP, expert TP 1", "moe")} <= named
    assert len(ROWS) >= 12
    every_flag = {flag for row in ROWS for name in (row.save, row.load) for flag in LAYOUTS[name].flags}
    assert {"--tensor-model-parallel-size", "--sequence-parallel", "--pipeline-model-parallel-size",
            "--num-layers-per-virtual-pipeline-stage", "--expert-model-parallel-size", "--expert-tensor-parallel-size",
            "--offload-optimizer", "--offload-param"} <= every_flag
    stages = {LAYOUTS[name].flags[LAYOUTS[name].flags.index("--zero-stage") + 1]
              for row in ROWS for name in (row.save, row.load) if "--zero-stage" in LAYOUTS[name].flags}
    assert stages == {"0", "1", "2", "3"}
    assert {LAYOUTS[name].world for row in ROWS for name in (row.save, row.load)} == {1, 2, 4}  # DP 1, 2, 4
    assert set(OPTIMIZERS) == {row.optimizer for row in ROWS}


@pytest.mark.slow
@pytest.mark.parametrize("row", ROWS, ids=[row.id for row in ROWS])
def test_a_checkpoint_resumes_at_another_layout_with_the_uninterrupted_runs_losses(table, row):
    uninterrupted, resumed = table[row.id]
    assert sorted(uninterrupted) == list(range(1, ITERATIONS + 1))
    assert sorted(resumed) == list(range(SAVED_AT + 1, ITERATIONS + 1))  # continued, not restarted
    for part in (0, 1):  # the loss, and the gradient norm of the step it took
        after = [uninterrupted[iteration][part] for iteration in sorted(resumed)]
        got = [resumed[iteration][part] for iteration in sorted(resumed)]
        assert got == after if row.bitwise else got == pytest.approx(after, rel=1e-5, abs=0), ("loss", "norm")[part]
