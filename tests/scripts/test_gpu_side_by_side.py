"""scripts/bench/gpu_side_by_side.py, the one-call GPU table of issue 76 item 4: it holds every run the issue names,
gives Megatron-LM and this project the same command line, reads Megatron-LM's log as its training loop writes it, and
(on the CPU, at the 2-layer size) runs, keeps what each run wrote and reports figures that are the runs' own."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from scripts.bench.gpu_side_by_side import (
    SHAPES,
    add_ratios,
    markdown_table,
    memory_figures,
    plan_runs,
    startup_notes,
    summarize_megatron,
)

REPO = Path(__file__).resolve().parents[2]


def test_the_speed_table_holds_every_run_the_issue_names():
    runs = {(run.shape.name, run.variant) for run in plan_runs()}
    for shape in ("llama-1.2b", "gpt2-1.5b", "gpt2-124m-mbs1"):
        assert {(shape, variant) for variant in ("megatron", "eager", "compile", "cuda-graphs")} <= runs
    # FP8 per recipe on the Llama shape, compiled as the acceptance allows, and tensorwise eager beside it
    assert {("llama-1.2b", f"fp8-{recipe}-compile") for recipe in ("tensorwise", "delayed", "blockwise")} <= runs
    assert ("llama-1.2b", "fp8-tensorwise") in runs


def test_megatron_lm_and_ours_run_the_same_command_line_and_each_variant_adds_only_its_flags():
    for shape in SHAPES:
        runs = {run.variant: run for run in plan_runs([shape.name])}
        megatron = runs["megatron"].argv(tiny=False, iterations=12)
        assert runs["eager"].argv(tiny=False, iterations=12) == megatron
        for variant, run in runs.items():
            assert run.argv(tiny=False, iterations=12) == megatron + list(() if variant == "megatron" else run.extra)
    llama = plan_runs(["llama-1.2b"], ["eager"])[0].argv(tiny=False, iterations=12)
    assert " ".join(llama).count("--num-query-groups 8") == 1 and "--vocab-size 128000" in " ".join(llama)


def test_the_convergence_table_trains_200_iterations_on_the_embedded_corpus():
    runs = plan_runs(table="convergence")
    assert [run.variant for run in runs] == ["compile", "fp8-tensorwise-compile", "fp8-delayed-compile",
                                             "fp8-blockwise-compile"]
    argv = runs[1].argv(tiny=False, iterations=200)
    assert "--mock-data" not in argv and "--vocab-size" not in argv and "NullTokenizer" not in argv
    assert argv[argv.index("--train-iters") + 1] == "200" and argv[argv.index("--log-interval") + 1] == "10"
    assert argv[-5:] == ["--fp8-format", "hybrid", "--fp8-recipe", "tensorwise", "--compile"]


def megatron_log_line(iteration: int, ms: float, tflops: float, loss: float) -> str:
    """One line as Megatron-LM core_v0.16.1's training_log writes it (megatron/training/training.py, with
    --log-throughput; the fields between are its own)."""
    return (f" [2026-11-25 10:00:00.000000] iteration {iteration:8d}/{15:8d} | consumed samples: {iteration * 16:12d} |"
            f" elapsed time per iteration (ms): {ms:.1f} | throughput per GPU (TFLOP/s/GPU): {tflops:.1f} |"
            f" learning rate: {3e-4:.6E} | global batch size: {16:5d} | lm loss: {loss:.6E} | loss scale: 1.0 |"
            f" grad norm: 1.234 | number of skipped iterations:   0 | number of nan iterations:   0 |")


def megatron_memory_line(iteration: int, max_allocated: float) -> str:
    """megatron/training/utils.py report_memory's line, as rank 0 prints it."""
    return (f"[Rank 0] (after {iteration} iterations) memory (MB) | allocated: 1000.00 | max allocated: "
            f"{max_allocated:.2f} | reserved: 2000.00 | max reserved: 2000.00")


def test_megatron_lm_log_read_as_its_training_loop_writes_it():
    times = [900.0, 400.0, 350.0, 340.0, 360.0]
    lines = []
    for iteration, ms in enumerate(times, start=1):
        lines.append(megatron_log_line(iteration, ms, 100.0 + iteration, 10.0 - iteration))
        if iteration <= 2:  # Megatron reports memory after iterations 1 and 2
            lines.append(megatron_memory_line(iteration, 5000.0 * iteration))
    summary = summarize_megatron("\n".join(lines), skip=2)
    assert summary["ms_per_iteration"] == statistics.median(times[2:])
    assert summary["tflops_per_gpu"] == statistics.median([103.0, 104.0, 105.0])
    assert summary["loss_last"] == 5.0 and summary["iterations"] == 5 and summary["iterations_timed"] == 3
    assert summary["measured_peak_mib"] == 10000.0  # the second report: it holds the optimizer's states


def test_our_memory_line_and_the_ratios():
    line = (" memory after iteration 1: predicted peak 40000.0 MiB (zero.plan), measured 42105.3 MiB (CUDA "
            "max_memory_allocated), predicted/measured 0.95")
    assert memory_figures(line) == {"predicted_peak_mib": 40000.0, "measured_peak_mib": 42105.3,
                                    "predicted_over_measured": 40000.0 / 42105.3}
    rows = [{"shape": "s", "variant": "megatron", "ms_per_iteration": 1000.0, "loss_last": 7.0},
            {"shape": "s", "variant": "eager", "ms_per_iteration": 500.0, "loss_last": 7.0},
            {"shape": "s", "variant": "compile", "ms_per_iteration": 400.0, "loss_last": 7.07}]
    add_ratios(rows, "eager")
    assert rows[2]["ms_over_megatron"] == 0.4 and rows[2]["ms_over_baseline"] == 0.8
    assert rows[2]["loss_over_baseline"] == pytest.approx(1.01)
    assert "ms_over_baseline" not in rows[1] and rows[1]["ms_over_megatron"] == 0.5
    assert "| s | compile | 400.0 | 0.40x | 0.80x |" in markdown_table(rows, "eager")


@pytest.mark.slow
def test_the_harness_runs_the_table_on_the_cpu_and_reports_each_runs_own_figures(tmp_path):
    """Two-layer models: Megatron-LM's row skipped (no kit here) with the reason, ours trained; the JSON's step time
    is the median of the metrics file's iter_time_s after --skip, and its memory the run's own start-up line."""
    output, logs = tmp_path / "table.json", tmp_path / "logs"
    done = subprocess.run([sys.executable, str(REPO / "scripts/bench/gpu_side_by_side.py"), "--device", "cpu", "--tiny",
                           "--only", "gpt2-124m-mbs1", "--variants", "megatron,eager", "--iterations", "4", "--skip",
                           "1", "--megatron-kit", str(tmp_path / "no-kit"), "--logs", str(logs), "--output",
                           str(output)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    report = json.loads(output.read_text())
    assert report["torch"] and report["commit"] and report["device"].startswith("cpu") and report["table"] == "speed"
    megatron, eager = report["rows"]
    assert "no Megatron-LM kit" in megatron["skipped"]
    assert eager["rc"] == 0 and "--mock-data" in eager["command"]
    records = [json.loads(line) for line in (logs / "01-gpt2-124m-mbs1-eager" / "metrics.jsonl").read_text().splitlines()]
    steps = [record["iter_time_s"] for record in records if "iter_time_s" in record and record["iteration"] > 1]
    assert len(steps) == 3 and eager["ms_per_iteration"] == pytest.approx(1000 * statistics.median(steps))
    assert eager["loss_last"] == [r for r in records if "loss" in r][-1]["loss"]
    log = (logs / "01-gpt2-124m-mbs1-eager" / "output.log").read_text()
    assert memory_figures(log)["predicted_peak_mib"] == eager["predicted_peak_mib"]
    assert "| gpt2-124m-mbs1 | eager |" in done.stdout


def test_a_run_keeps_its_own_lines_on_graphs_fp8_and_the_compiler():
    log = ("> model: 124M parameters\n"
           "> --cuda-graph-impl local: nothing captured, the blocks run eagerly (the same math): the device is cpu\n"
           " iteration 1/12 | loss 10.9\n"
           "> FP8: --fp8-format hybrid --fp8-recipe tensorwise: 64 linears in FP8\n")
    assert startup_notes(log) == [
        "> --cuda-graph-impl local: nothing captured, the blocks run eagerly (the same math): the device is cpu",
        "> FP8: --fp8-format hybrid --fp8-recipe tensorwise: 64 linears in FP8"]
