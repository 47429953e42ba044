"""scripts/zero_paper/report.py and what it reads: the figures and report.md from the planner and the
performance model alone, measured runs beside them, and the CPU mini-reproduction (measured memory of
C1-C5 against the planner, on gloo)."""

import json
import sys
import time
from pathlib import Path

import pytest

from arguments.config import ConfigError
from tests.zero_paper_points import write_small_definitions
from zero.memory import format_bytes

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts" / "zero_paper"))
import experiments  # noqa: E402
import measurements  # noqa: E402
import mini_analysis  # noqa: E402
import mini_reproduction  # noqa: E402
import report  # noqa: E402


@pytest.fixture
def small_world(tmp_path, monkeypatch):
    """Definitions of small points, and a dgx2 profile whose GPUs hold 2 GB (the V100's in every
    other number), so the planner's searches for the largest model stop after a few layers."""
    definitions = write_small_definitions(tmp_path / "definitions", experiments.COLUMNS)
    profile = tmp_path / "small-v100.yaml"
    text = (ROOT / "configs" / "hardware" / "dgx2-v100.yaml").read_text()
    profile.write_text(text.replace("gpu_memory_bytes: 32e9", "gpu_memory_bytes: 2e9"))
    monkeypatch.setitem(experiments.PROFILES, "dgx2", str(profile))
    experiments._hardware.cache_clear()
    monkeypatch.setenv("ZERO_GPT_PLAN_CACHE", str(tmp_path / "plans"))
    yield definitions
    experiments._hardware.cache_clear()


def fake_run(runs_dir: Path, figure: str, point: str, tflops: float) -> None:
    directory = runs_dir / "dgx2" / figure / point
    directory.mkdir(parents=True)
    (directory / "launch.json").write_text(json.dumps({"figure": figure, "profile": "dgx2", "point": point}))
    records = [{"iteration": i, "iter_time_s": 1.0, "tflops_per_gpu": tflops if i > 2 else 1.0,
                "memory_bytes": 10**9 + i} for i in range(1, 6)]
    (directory / "metrics.jsonl").write_text("\n".join(map(json.dumps, records)) + '\n{"iteration": 6, "iter_t')


def test_report_draws_every_figure_from_predictions_and_measured_runs(small_world, tmp_path):
    runs = tmp_path / "runs"
    fake_run(runs, "fig2", "zero-1.16b", 12.5)
    output = tmp_path / "report"
    argv = ["--output-dir", str(output), "--definitions", str(small_world), "--profiles", "dgx2", "--runs", str(runs),
            "--mini-reproduction", str(ROOT / "docs" / "zero-paper" / "mini-reproduction.json"), "--quiet",
            "--no-compare"]  # compare.py's side-by-side section: tests/planner/test_zero_paper_2019.py
    assert report.main(argv) == 0
    for name in report.OUTPUTS:
        assert (output / name).stat().st_size > 1000, name
    text = (output / "report.md").read_text()
    zero_row = [line for line in text.splitlines() if line.startswith("| dgx2 | zero-1.16b |")][0]
    assert zero_row.split("|")[-3].strip() == "12.5"  # the measured TFLOP/s, median after the warm-up
    assert zero_row.split("|")[-2].strip() == format_bytes(10**9 + 5)  # and its memory, the largest record
    assert "### Largest model per configuration" in text and "CPU mini-reproduction" in text
    with pytest.raises(ConfigError, match="--overwrite"):
        report.main(argv)
    # Replacing is the same whatever the figures: one (fig2) rather than all six again, which drew
    # every figure a second time for nothing this test reads.
    assert report.main([*argv, "--overwrite", "--figures", "fig2"]) == 0
    assert (output / "report.md").read_text() != text, "--overwrite left the old report.md"


def test_a_run_is_measured_once_past_the_warm_up_and_foreign_runs_are_ignored(tmp_path):
    fake_run(tmp_path, "fig8", "c5-170b", 20.0)
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "metrics.jsonl").write_text('{"iteration": 1, "iter_time_s": 1}\n')
    runs = measurements.read_runs([str(tmp_path)])
    assert list(runs) == [("fig8", "dgx2", "c5-170b")]
    run = runs[("fig8", "dgx2", "c5-170b")]
    assert run.completed and run.iterations == 5 and run.tflops_per_gpu == 20.0 and run.memory_bytes == 10**9 + 5


def test_layers_within_a_budget_follow_the_measured_line():
    def rank(model, activations):
        return {"rank": 0, "model_state_bytes": model, "buffer_bytes": 100, "saved_activation_device_bytes": activations,
                "saved_activation_host_bytes": 0}
    summary = {"runs": [
        {"configuration": "C1", "layers": 4, "measured": [rank(4000, 1000)], "planned": [rank(4000, 1100)]},
        {"configuration": "C1", "layers": 8, "measured": [rank(8000, 1800)], "planned": [rank(8000, 1900)]},
        {"configuration": "C4", "layers": 4, "measured": [rank(2000, 900)], "planned": [rank(2000, 900)]},
        {"configuration": "C4", "layers": 8, "measured": [rank(4000, 1300)], "planned": [rank(4000, 1300)]}]}
    memory = mini_analysis.memory_by_configuration(summary)
    assert memory["C1"].measured == (5100, 9900) and memory["C1"].per_layer("measured") == 1200
    budget = mini_analysis.layers_in_c1_budget(memory)
    assert budget["C1"]["measured"] == pytest.approx(8)
    # C4: 3000 at 4 layers, 600 a layer: (9900 - 3000) / 600 + 4 = 15.5 layers in C1's 9900 bytes.
    assert budget["C4"]["measured"] == pytest.approx(15.5)


def test_the_committed_mini_reproduction_measured_what_the_planner_predicts():
    summary = json.loads((ROOT / "docs" / "zero-paper" / "mini-reproduction.json").read_text())
    assert (summary["tensor_parallel_size"], summary["data_parallel_size"]) == (2, 2)
    for run in summary["runs"]:
        for measured, planned in zip(run["measured"], run["planned"]):
            assert measured["model_state_bytes"] == planned["model_state_bytes"]
            assert measured["saved_activation_device_bytes"] == pytest.approx(planned["saved_activation_device_bytes"],
                                                                              rel=0.01)
    memory = mini_analysis.memory_by_configuration(summary)
    deep = {name: item.measured[1] for name, item in memory.items()}
    assert deep["C1"] > deep["C2"] and deep["C3"] > deep["C4"] > deep["C5"] and deep["C1"] > deep["C3"]
    assert memory["C5"].host_measured > 0 == memory["C4"].host_measured


@pytest.mark.slow
def test_the_mini_reproduction_measures_every_configuration_in_one_launch(tmp_path, corpus_cache):
    output = tmp_path / "mini.json"
    assert mini_reproduction.main(["--output", str(output), "--layers", "1", "2", "--hidden-size", "64",
                                   "--seq-length", "64", "--micro-batch-size", "4", "--bucket-size", "20000",
                                   "--data-cache-dir", corpus_cache, "--timeout", "300"]) == 0
    summary = json.loads(output.read_text())
    assert len(summary["runs"]) == 10
    assert "--output mini.json " in summary["command"] and str(tmp_path) not in summary["command"]  # no machine path
    assert summary["date"] == time.strftime("%Y-%m-%d", time.gmtime())
    for run in summary["runs"]:
        assert [r["rank"] for r in run["measured"]] == [0, 1, 2, 3]
        for measured, planned in zip(run["measured"], run["planned"]):
            assert measured["model_state_bytes"] == planned["model_state_bytes"]
            assert measured["saved_activation_host_bytes"] == planned["saved_activation_host_bytes"]
            assert measured["saved_activation_device_bytes"] == pytest.approx(planned["saved_activation_device_bytes"],
                                                                              rel=0.01)
    with pytest.raises(ConfigError, match="exists"):
        mini_reproduction.main(["--output", str(output)])


def test_a_launch_that_hangs_is_stopped_with_its_processes():
    started = time.perf_counter()
    with pytest.raises(ConfigError, match="did not finish in 1 s"):
        mini_reproduction._launch([sys.executable, "-c", "import time; time.sleep(60)"], 1)
    assert time.perf_counter() - started < 30


# ---- inputs checked before the output directory is made (issue 27, problem 6) ---------------------

@pytest.mark.parametrize("case, words", [
    ("--runs names no directory", ["--runs", "no-such-runs"]),
    ("--runs names a file", ["--runs", "a file"]),
    ("empty --mini-reproduction", ["--mini-reproduction", "empty"]),
    ("malformed --mini-reproduction", ["--mini-reproduction", "not valid JSON"]),
    ("--mini-reproduction of another shape", ["--mini-reproduction", "mini_reproduction.py"]),
    ("--mini-reproduction names no file", ["--mini-reproduction", "file not found"]),
    ("--mini-reproduction is a FIFO", ["--mini-reproduction", "FIFO"]),
    ("--definitions names no directory", ["--definitions", "no such directory"]),
])
def test_report_inputs_are_checked_before_the_output_directory_is_made(case, words, small_world, tmp_path):
    import os

    from tests.reliability_helpers import run_main

    output = tmp_path / "report"
    argv = ["--output-dir", output, "--definitions", small_world, "--profiles", "dgx2", "--figures", "fig2", "--quiet"]
    mini = tmp_path / "mini.json"
    if case == "--runs names no directory":
        argv += ["--runs", tmp_path / "no-such-runs"]
    elif case == "--runs names a file":
        (tmp_path / "runs.txt").write_text("")
        argv += ["--runs", tmp_path / "runs.txt"]
    elif case == "--mini-reproduction names no file":
        argv += ["--mini-reproduction", tmp_path / "typo.json"]
    elif case == "--mini-reproduction is a FIFO":
        os.mkfifo(mini)
        argv += ["--mini-reproduction", mini]
    elif case == "--definitions names no directory":
        argv += ["--definitions", tmp_path / "no-such-definitions"]
    else:
        mini.write_text({"empty --mini-reproduction": "", "malformed --mini-reproduction": '{"runs": [',
                         "--mini-reproduction of another shape": '{"runs": [{"layers": 4}]}'}[case])
        argv += ["--mini-reproduction", mini]
    outcome = run_main(report.command, argv)
    outcome.one_error_line(*words)
    assert not output.exists(), case


def test_each_run_checkpoints_as_its_configuration_says(tmp_path):
    """Beside model flags (a Megatron launch) the JSON's activation_checkpointing block is read only as the
    real pair reads it, here not at all (tests/arguments/test_deepspeed_checkpointing_block.py): the runs say
    each configuration's checkpointing (Table 3's P_a, P_a+cpu, M_D) as flags."""
    import argparse

    from arguments.deepspeed.translation import resolve_zero_config
    from arguments.parser import parse_config
    args = argparse.Namespace(bucket_size=20000, hidden_size=64, seq_length=64, micro_batch_size=4)
    for configuration in mini_reproduction.CONFIGURATIONS:
        block = json.loads(resolve_zero_config(f"zero_paper_{configuration.lower()}").read_text())[
            "activation_checkpointing"]
        activations = parse_config(mini_reproduction.run_argv(configuration, 1, args, tmp_path / "metrics.jsonl",
                                                              str(tmp_path))).activations
        assert (activations.checkpoint_activations, activations.partition_activations, activations.cpu_checkpointing,
                activations.contiguous_checkpointing) == (True, block["partition_activations"],
                                                          block["cpu_checkpointing"],
                                                          block["contiguous_memory_optimization"]), configuration


def test_a_report_without_measured_runs_labels_every_figure_and_table_as_predicted(small_world, tmp_path, monkeypatch):
    """Issue 49: the committed report, written from 0 measured runs, had figures and tables that read as
    results. Every figure's title (its second line) and caption, the report's title and every table of
    points now say the numbers are predicted; with a measured run, the figure it is in says how many
    of its marks are measured."""
    import figures

    titles = {}
    save = figures._save

    def keep_title(fig, path):
        titles[Path(path).stem] = " ".join(fig._suptitle.get_text().split("\n"))  # wrapped lines joined
        save(fig, path)

    monkeypatch.setattr(figures, "_save", keep_title)
    output = tmp_path / "report"
    argv = ["--output-dir", str(output), "--definitions", str(small_world), "--profiles", "dgx2", "--quiet",
            "--no-compare", "--figures", "fig2", "fig8"]
    assert report.main(argv) == 0
    text = (output / "report.md").read_text()
    assert text.startswith("# The ZeRO paper's Figures 2-8: predicted and stated (no measured run)\n")
    assert "**Every figure and every number below is a prediction, not a measurement**" in text
    for figure in ("fig2", "fig8"):
        line = "PREDICTED by the planner (memory) and the performance model (time), not measured: no measured run"
        assert titles[figure].endswith(f" {line}"), titles[figure]  # the second line, however wrapped
        assert f"![{figure}, predicted]({figure}.png)" in text and f". {line}.*" in text
        assert f"### {figure}: predicted (no measured run)\n" in text
    assert "| predicted per-GPU memory | predicted to fit |" in text

    runs = tmp_path / "runs"
    fake_run(runs, "fig2", "zero-1.16b", 12.5)
    assert report.main([*argv, "--overwrite", "--runs", str(runs)]) == 0
    text = (output / "report.md").read_text()
    assert text.startswith("# The ZeRO paper's Figures 2-8: predicted, measured and stated\n")
    assert titles["fig2"].endswith(" predicted by the planner and the performance model, with 1 measured point (black)")
    assert "### fig2: predicted, 1 measured\n" in text and "### fig8: predicted (no measured run)\n" in text


def _table_bytes(cell: str) -> tuple[float, float]:
    """A report.md memory cell ("43.43 GiB") as (bytes, half its last digit in bytes)."""
    value, unit = cell.split()
    scale = 1024 ** ("B", "KiB", "MiB", "GiB", "TiB").index(unit)
    return float(value) * scale, 0.005 * scale


def _bar_tops(ax) -> dict[float, float]:
    """The top of each stack of bars an axes draws, by its x centre."""
    tops = {}
    for patch in ax.patches:
        centre = round(patch.get_x() + patch.get_width() / 2, 6)
        tops[centre] = max(tops.get(centre, 0.0), patch.get_y() + patch.get_height())
    return tops


def _texts_outside(fig) -> list[str]:
    """Every visible text of `fig` that reaches past the figure's edges, as its text."""
    from matplotlib.text import Text

    fig.canvas.draw()  # at the figure's own dpi, which savefig's changed for its draw
    renderer = fig.canvas.get_renderer()
    bounds = fig.bbox
    outside = []
    for text in fig.findobj(Text):
        if text.get_visible() and text.get_text().strip():
            box = text.get_window_extent(renderer)
            if box.x0 < bounds.x0 - 1 or box.x1 > bounds.x1 + 1 or box.y0 < bounds.y0 - 1 or box.y1 > bounds.y1 + 1:
                outside.append(text.get_text())
    return outside


def test_figure_7_draws_the_tables_memory_and_no_text_leaves_the_figure(small_world, tmp_path, monkeypatch):
    """Issue 94 item 5: Figure 7's bars added up parts that left out M_D's contiguous checkpoint buffer, so a
    point the table put over the GPU's memory was drawn under it; its subtitle ran past both edges. Each bar's
    top is now the table's per-GPU memory (Figure 6's, its largest model), and every text of both figures lies
    inside the figure."""
    import figures

    drawn = {}
    save, close = figures._save, figures.plt.close

    def keep(fig, path):
        save(fig, path)  # lays the figure out and writes it as the report does
        drawn[Path(path).stem] = fig

    monkeypatch.setattr(figures, "_save", keep)
    monkeypatch.setattr(figures.plt, "close", lambda fig: None)  # kept open to be measured, closed below
    output = tmp_path / "report"
    argv = ["--output-dir", str(output), "--definitions", str(small_world), "--profiles", "dgx2", "--quiet",
            "--no-compare", "--figures", "fig6", "fig7", "--mini-reproduction",
            str(ROOT / "docs" / "zero-paper" / "mini-reproduction.json")]
    assert report.main(argv) == 0
    table = report_rows((output / "report.md").read_text(), "### fig7:")
    tops = sorted(_bar_tops(drawn["fig7"].axes[0]).items())  # one model size: C1-C5, as the rows run
    assert len(tops) == len(table) == 5
    for (_, top), row in zip(tops, table):
        expected, rounding = _table_bytes(row[7])
        assert abs(top * 2**30 - expected) <= rounding, (row[2], top, row[7])
    largest = report_rows((output / "report.md").read_text(), "### Largest model per configuration")
    tops = sorted(_bar_tops(drawn["fig6"].axes[0]).items())
    assert len(tops) == len(largest) == 5
    for (_, top), row in zip(tops, largest):  # billions, the table's to one decimal
        assert abs(top - float(row[3].removesuffix("B"))) <= 0.05, (row[2], top, row[3])
    for name, fig in drawn.items():
        assert _texts_outside(fig) == [], name
        close(fig)


def report_rows(text: str, heading: str) -> list[list[str]]:
    """The cells of each data row of the table under `heading` in report.md."""
    section = text.split(heading, 1)[1].split("\n\n", 2)[1]
    return [[cell.strip() for cell in line.split("|")] for line in section.splitlines()[2:] if line.startswith("|")]


def _drawn_points(ax) -> list[tuple[str, str, str]]:
    """(legend label, x, y) of every marker an axes draws as a line (not the paper's), x in billions of
    parameters written as the tables write them."""
    from planner.paper_tables import format_parameters

    return sorted((line.get_label(), format_parameters(x * 1e9), f"{y:.1f}") for line in ax.lines
                  if not line.get_label().startswith("paper") for x, y in zip(line.get_xdata(), line.get_ydata()))


def test_figures_4_and_8_draw_every_row_of_their_tables_and_nothing_else(small_world, tmp_path, monkeypatch):
    """Issue 115 item 7: Figure 4 left out the table's searched largest DDP model (micro batch 1), and Figure 8
    drew a fixed micro batch that hid what freed memory buys. Every marker of Figure 4's throughput panel is now
    a row of its tables (a point, or a searched largest model), and Figure 8's bars are the table of each point
    at the largest micro batch that fits, its diamonds the fixed-batch table's."""
    import figures

    profile = tmp_path / "small-v100.yaml"  # GPUs of 8 GB: the 1.16B points fit, DDP's does not
    profile.write_text(profile.read_text().replace("gpu_memory_bytes: 2e9", "gpu_memory_bytes: 8e9"))
    experiments._hardware.cache_clear()
    drawn = {}
    save = figures._save
    monkeypatch.setattr(figures, "_save", lambda fig, path: drawn.setdefault(Path(path).stem, fig) and save(fig, path))
    monkeypatch.setattr(figures.plt, "close", lambda fig: None)
    output = tmp_path / "report"
    assert report.main(["--output-dir", str(output), "--definitions", str(small_world), "--profiles", "dgx2",
                        "--quiet", "--no-compare", "--figures", "fig4", "fig8"]) == 0
    text = (output / "report.md").read_text()

    points = report_rows(text, "### fig4:")
    searched = report_rows(text, "### Largest model without MP")
    expected = [(f"{'ZeRO' if row[2].startswith('zero') else 'plain DP (DDP baseline)'}: "
                 + ("predicted" if row[8] == "yes" else "planner says it does not fit"), row[3],
                 row[10].split()[0] if row[8] == "yes" else "0.0") for row in points]
    expected += [(f"{'ZeRO' if row[2].startswith('ZeRO') else 'plain DP (DDP baseline)'}: predicted at its largest, "
                  "micro batch 1 (planner search)", row[3], row[4]) for row in searched if row[4] != "-"]
    assert [row[8] for row in points] == ["yes", "**no**"] and len(expected) == 4, (points, searched)
    assert _drawn_points(drawn["fig4"].axes[0]) == sorted(
        (label.replace("**no**", "no"), x, y) for label, x, y in expected)

    fixed, largest = report_rows(text, "### fig8: predicted (no"), report_rows(text, "### fig8: predicted at the largest")
    ax = drawn["fig8"].axes[0]
    ticks = [tick.get_text().replace("\n", " ") for tick in ax.get_xticklabels()]
    labels = ax.texts[:len(ax.patches)]  # each bar's label ("41.1\nmb 4"), drawn before the paper's note
    bars = {tick: (f"{patch.get_height():.1f}", label.get_text().split("mb ")[-1])
            for tick, patch, label in zip(ticks, ax.patches, labels) if label.get_text()}
    assert bars == {f"{row[2].split('-')[0].upper()} {row[3]}": (row[10].split()[0], row[5].split(" / ")[0])
                    for row in largest if row[8] == "yes"}
    assert any(int(b) > int(f[5].split(" / ")[0]) for (_, b), f in zip(bars.values(), fixed))  # a larger batch
    diamonds = [line for line in ax.lines if line.get_label().startswith("predicted at the fixed micro batch")]
    assert sorted(f"{y:.1f}" for y in diamonds[0].get_ydata()) == sorted(row[10].split()[0] for row in fixed
                                                                          if row[8] == "yes")
    for fig in drawn.values():
        figures.plt.close(fig)


def test_recorded_commands_name_no_machine_path():
    """Issue 115 item 7: the committed mini-reproduction recorded `--output /tmp/...`, and the figures said
    "this machine's CPU". A recorded command keeps repo-relative paths and drops folders outside the repo,
    and a CPU panel's caption names the command and the date."""
    argv = ["--output", "/tmp/somewhere/mini.json", f"--definitions={ROOT}/scripts/zero_paper/experiments", "a/b"]
    assert experiments.portable_argv(argv) == ["--output", "mini.json", "--definitions=scripts/zero_paper/experiments",
                                               "a/b"]
    mini = json.loads((ROOT / "docs" / "zero-paper" / "mini-reproduction.json").read_text())
    assert "/" not in mini["command"].replace("scripts/zero_paper/", "") and mini["date"]
    line = measurements.provenance(0, mini_analysis.cpu_source(mini))
    assert line.endswith(f"measured on a CPU (`{mini['command']}`, {mini['date']})") and "this machine" not in line
