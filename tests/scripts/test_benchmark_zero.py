"""scripts/bench/benchmark_zero.py without starting any rank: the first step's per-phase peak RSS table that
report() prints from the ranks' records, the recorder that reads those peaks inside a rank, and the
output of --world-sizes."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts" / "bench"))
import bench_systems  # noqa: E402
import benchmark_zero  # noqa: E402

MIB_KB = 1024


def rank_record(rss_after_init_kb: int, first_step_hwm_kb: dict[str, int]) -> dict:
    """What one rank writes (benchmark_zero._run_rank), for one timed step and no audit."""
    return {"step_times": [0.5], "phases": [[0.2, 0.2, 0.1]], "losses": [8.3, 8.2], "parameters": 4_240_000,
            "ru_maxrss_kb": 600 * MIB_KB, "vm_hwm_kb": 600 * MIB_KB, "rss_after_init_kb": rss_after_init_kb,
            "rss_after_setup_kb": rss_after_init_kb + 70 * MIB_KB, "first_step_hwm_kb": first_step_hwm_kb,
            "shim": {"total": 17_000_000, "calls": {"all_reduce": 2}}, "audit": None, "our_comm_total": None,
            "versions": {"torch": "2.x"}}


def configuration(args, system: str, stage: int, ranks: list[dict]) -> dict:
    return benchmark_zero.summarize({"system": system, "stage": stage, "variant": "", "wall_s": 1.0,
                                     "ranks": ranks, "loadavg_1min": [1.0, 1.0]}, args)


def growth_rows(text: str) -> dict[str, list[str]]:
    """The per-phase table's rows by their first two cells, each as its four figures."""
    table = text.split("Peak RSS growth per phase of the first step", 1)[1].split("\n\n", 2)[1]
    rows = [line.strip("|").split("|") for line in table.splitlines()[2:]]
    return {f"{cells[0].strip()} {cells[1].strip()}": [c.strip() for c in cells[2:]] for cells in rows}


def test_the_per_phase_table_follows_the_ratios_with_the_max_growth_over_ranks_per_configuration():
    args = benchmark_zero.parse_args(["--world-size", "2"])
    base = 300 * MIB_KB

    def hwm(*mib):  # build, forward, backward, step, in MiB over `base`
        return dict(zip(benchmark_zero.FIRST_STEP_POINTS, (base + int(m * MIB_KB) for m in mib)), init=base)

    # The larger rank differs per phase, and rank 1 starts higher: the growth is per rank, then the max.
    ours = configuration(args, "ours", 3, [rank_record(base, hwm(70, 90, 130, 150)),
                                           rank_record(base + 10 * MIB_KB, hwm(75, 95, 125, 160))])
    fsdp2 = configuration(args, "fsdp2", 3, [rank_record(base, hwm(68, 100, 140, 141.6)),
                                             rank_record(base, hwm(68, 99, 139, 141))])
    failed = {"system": "deepspeed", "stage": 3, "variant": "", "ranks": [None, None], "error": "a rank failed"}
    text = benchmark_zero.report(args, [failed, fsdp2, ours])

    assert ours["first_step_growth_mb"] == {"build": 70, "forward": 90, "backward": 130, "step": 150}
    assert text.index("Ratios ours/theirs") < text.index("Peak RSS growth per phase") < text.index("Detail:")
    assert "| system | stage | build | forward | backward | step |\n|---|---|---:|---:|---:|---:|" in text
    assert growth_rows(text) == {"FSDP2 3 (FSDP2)": ["68", "100", "140", "142"],
                                 "ours 3": ["70", "90", "130", "150"]}  # no row for the failed one


def test_the_recorder_reads_a_high_water_mark_that_never_falls_through_a_step():
    recorder = benchmark_zero.PeakRecorder()
    recorder.read("build")
    # More than the process ever held so far, so forward's reading must rise by about this much.
    rss_kb, hwm_kb = benchmark_zero._status_kb("VmRSS"), benchmark_zero._status_kb("VmHWM")
    held = b"\x01" * ((hwm_kb - rss_kb + 32 * MIB_KB) * 1024)  # bytes * n writes every page
    marks = benchmark_zero.PhaseMarks(time.perf_counter(), recorder)
    bench_systems.mark(marks)  # end of forward
    del held  # released: the peak stays (a raw VmHWM read can dip by a few hundred kB here)
    bench_systems.mark(marks)  # end of backward
    marks.append(time.perf_counter())
    recorder.read("step")

    assert list(recorder.kb) == list(benchmark_zero.FIRST_STEP_POINTS)
    readings = list(recorder.kb.values())
    assert readings == sorted(readings)
    assert recorder.kb["forward"] - recorder.kb["build"] >= 16 * MIB_KB
    assert len(marks) == 4 and list(marks) == sorted(marks)  # the times are still all a step appends


def test_world_sizes_print_each_sizes_tables_under_its_heading_and_keep_the_json_by_size(
        monkeypatch, tmp_path, capsys):
    def fake_plan(args, plan, workdir):  # what run_plan measures, without starting ranks
        hwm = dict.fromkeys(("init",) + benchmark_zero.FIRST_STEP_POINTS, 400 * MIB_KB)
        return [configuration(args, "ours", 3, [rank_record(300 * MIB_KB, hwm)] * args.world_size)]

    monkeypatch.setattr(benchmark_zero, "run_plan", fake_plan)
    common = ["--systems", "ours", "--stages", "3", "--output", str(tmp_path / "out.md")]

    assert benchmark_zero.main(common + ["--world-sizes", "2,4", "--json", str(tmp_path / "sizes.json")]) == 0
    text = capsys.readouterr().out
    assert [line for line in text.splitlines() if line.startswith("## ")] == ["## world size 2", "## world size 4"]
    assert "world size 4 (gloo" in text.split("## world size 4\n\n", 1)[1]
    assert (tmp_path / "out.md").read_text() == text
    by_size = json.loads((tmp_path / "sizes.json").read_text())["results_by_world_size"]
    assert sorted(by_size) == ["2", "4"] and len(by_size["4"][0]["ranks"]) == 4

    assert benchmark_zero.main(common + ["--world-size", "3", "--json", str(tmp_path / "one.json")]) == 0
    text = capsys.readouterr().out
    assert text.startswith("Machine: ") and "## " not in text  # the output it had before --world-sizes
    assert len(json.loads((tmp_path / "one.json").read_text())["results"][0]["ranks"]) == 3
