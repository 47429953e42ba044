"""`python -m training.plot` (issue 49, point 5): a run's loss, learning rate and throughput as a PNG, and
the training run's last line saying how to draw it."""

import json
import shlex
import subprocess
import sys
from pathlib import Path

import numpy
import pytest
from matplotlib.image import imread

import pretrain_gpt
from training import plot

REPO = Path(__file__).resolve().parents[2]
SMALL = ["--num-layers", "1", "--hidden-size", "32", "--num-attention-heads", "2", "--seq-length", "16",
         "--max-position-embeddings", "16", "--micro-batch-size", "2", "--global-batch-size", "2",
         "--train-iters", "6", "--log-interval", "1", "--eval-interval", "3", "--eval-iters", "1",
         "--tokenizer-vocab-size", "300", "--device", "cpu"]
WIDTH, HEIGHT = 1200, 800  # FIGURE_INCHES x DOTS_PER_INCH
# matplotlib's first colours of its default cycle (C0, C1, C2), as imread gives them (RGB in 0..1).
CYCLE = ((0x1F, 0x77, 0xB4), (0xFF, 0x7F, 0x0E), (0x2C, 0xA0, 0x2C))


def has_colour(image: numpy.ndarray, rgb: tuple[int, int, int]) -> bool:
    """Whether some pixel is drawn in `rgb` (a line's antialiased core is its exact colour)."""
    target = numpy.array(rgb) / 255.0
    return bool((numpy.abs(image[..., :3] - target).max(axis=-1) < 2 / 255).any())


def train_record(run_id: str, iteration: int, loss: float) -> dict:
    """A training record as training/interval_metrics.py writes it (the keys and their types)."""
    return {"run_id": run_id, "launch_id": "l" + run_id, "iteration": iteration, "consumed_samples": 8 * iteration,
            "global_batch_size": 8, "loss": loss, "lr": 1e-3 * iteration / 10, "grad_norm": 1.5,
            "iter_time_s": 0.1, "tokens_per_s": 2000.0 + iteration, "tflops_per_gpu": 0.01,
            "memory_bytes": 2**28, "comm_bytes": {"dp": {"all_reduce": 0}}}


def eval_record(run_id: str, iteration: int, split: str, loss: float) -> dict:
    return {"run_id": run_id, "launch_id": "l" + run_id, "iteration": iteration, "consumed_samples": 8 * iteration,
            "split": split, "loss": loss, "ppl": 2.718 ** loss}


def write_metrics(path: Path, records: list, tail: str = "") -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records) + tail)
    return path


def test_a_run_ends_with_the_command_that_draws_its_curves_and_the_command_writes_the_png(tmp_path, capsys,
                                                                                          corpus_cache_300):
    metrics = tmp_path / "runs" / "metrics.jsonl"
    code = pretrain_gpt.main(SMALL + ["--data-cache-dir", corpus_cache_300, "--metrics-file", str(metrics)])
    out = capsys.readouterr().out
    assert code == 0
    last = out.strip().splitlines()[-1]
    curves = tmp_path / "runs" / "curves.png"
    assert last == f"> draw the curves: python -m training.plot {metrics} -o {curves}", last
    command = shlex.split(last.split(": ", 1)[1])
    drawn = subprocess.run([sys.executable, *command[1:]], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert drawn.returncode == 0 and drawn.stderr == "", drawn.stderr
    assert drawn.stdout == f"training.plot: 6 training and 3 evaluation records of 1 run(s) -> {curves}\n"
    image = imread(curves)
    assert image.shape[:2] == (HEIGHT, WIDTH)
    assert has_colour(image, CYCLE[0]) and not has_colour(image, CYCLE[1])  # one run: one colour of lines


def test_several_files_and_runs_sharing_a_file_are_one_line_each(tmp_path, capsys):
    shared = write_metrics(tmp_path / "shared.jsonl", [
        train_record("a", 1, 6.0), train_record("b", 1, 6.1), train_record("a", 2, 5.5),
        {"run_id": "a", "iteration": 2, "memory": [{"rank": 0}]},  # a memory record: nothing to draw
        eval_record("a", 2, "valid", 5.6), train_record("b", 2, 5.4), eval_record("b", 2, "test", 5.45)])
    single = write_metrics(tmp_path / "other.jsonl", [train_record("c", i, 7.0 - i / 10) for i in range(1, 6)])
    notes = []
    series = plot.read_series(str(shared), notes)
    assert [s.label for s in series] == [f"{shared} (run a)", f"{shared} (run b)"]
    assert [r["iteration"] for r in series[0].training] == [1, 2] and series[0].evaluations == {"valid": [(2, 5.6)]}
    assert series[1].evaluations == {"test": [(2, 5.45)]} and notes == []
    assert [s.label for s in plot.read_series(str(single), notes)] == [str(single)]

    output = tmp_path / "curves.png"
    assert plot.main([str(shared), str(single), "-o", str(output)]) == 0
    assert capsys.readouterr().out == f"training.plot: 9 training and 2 evaluation records of 3 run(s) -> {output}\n"
    image = imread(output)
    assert image.shape[:2] == (HEIGHT, WIDTH)
    assert all(has_colour(image, rgb) for rgb in CYCLE)


def test_runs_are_labelled_by_the_flags_that_tell_them_apart(tmp_path):
    """Issue 94 item 6b: the legend named files and run ids (runs/<32 hex digits>/metrics.jsonl). The flags each
    launch recorded beside its metrics (training/run_commands.py) label it; a run without them keeps its name."""
    from training.run_commands import commands_file, record_command

    shared = write_metrics(tmp_path / "shared.jsonl", [train_record("a", 1, 6.0), train_record("b", 1, 6.1)])
    record_command(shared, {"run_id": "a", "launch_id": "la"}, ["--lr 0.001", "--train-iters 10"])
    record_command(shared, {"run_id": "b", "launch_id": "lb"}, ["--lr 0.003", "--train-iters 10", "--bf16"])
    record_command(shared, {"run_id": "b", "launch_id": "lb2"}, ["--lr 9"])  # b resumed: its first launch counts
    single = write_metrics(tmp_path / "m.jsonl", [train_record("c", 1, 7.0)])
    assert commands_file(shared) == tmp_path / "shared.commands.jsonl"
    series = [s for path in (shared, single) for s in plot.read_series(str(path), [])]
    plot.label_by_flags(series)
    assert [s.label for s in series] == ["--lr 0.001", "--lr 0.003 --bf16", str(single)]


def test_without_o_the_png_goes_beside_the_first_metrics_file_and_is_never_replaced_without_overwrite(tmp_path,
                                                                                                       capsys):
    metrics = write_metrics(tmp_path / "metrics.jsonl", [train_record("a", i, 6.0 - i / 10) for i in (1, 2, 3)])
    assert plot.main([str(metrics)]) == 0
    written = (tmp_path / "curves.png").read_bytes()
    capsys.readouterr()
    assert plot.main([str(metrics)]) == 2
    assert capsys.readouterr().err == (f"training.plot: error: {tmp_path / 'curves.png'} (-o's default): already "
                                       f"exists; pass --overwrite to replace it, or -o another path\n")
    assert (tmp_path / "curves.png").read_bytes() == written
    assert plot.main([str(metrics), "--overwrite"]) == 0


def test_a_record_a_kill_cut_short_is_skipped_with_a_note(tmp_path, capsys):
    """training/metrics.py's end_last_line ends a killed run's cut last record so the next run appends
    after it: such a line may sit anywhere in a file, and is what a kill leaves, not a wrong file."""
    records = [train_record("a", 1, 6.0)]
    cut = json.dumps(train_record("a", 2, 5.9))[:50]
    metrics = write_metrics(tmp_path / "metrics.jsonl", records, cut + "\n" + json.dumps(train_record("b", 1, 6.2)))
    assert plot.main([str(metrics), "-o", str(tmp_path / "c.png")]) == 0
    captured = capsys.readouterr()
    assert captured.err == f"training.plot: note: {metrics}: skipped 1 record(s) a kill cut short (line 2)\n"
    assert "2 training and 0 evaluation records of 2 run(s)" in captured.out


@pytest.mark.parametrize("content, expected", [
    (None, "metrics file {path}: file not found; give a metrics.jsonl that a training run wrote"),
    ("", "{path}: no training records (a run writes one every --log-interval iterations); is it the metrics "
         "file of a run that trained?"),
    (json.dumps(eval_record("a", 2, "valid", 5.0)) + "\n",
     "{path}: no training records (a run writes one every --log-interval iterations); is it the metrics "
     "file of a run that trained?"),
    (json.dumps(train_record("a", 1, 6.0)) + "\nloss=5.2 at iteration 2\n",
     "{path}, line 2: not JSON ('loss=5.2 at iteration 2'); is it a metrics.jsonl that a training run wrote?"),
    ("[1, 2, 3]\n", "{path}, line 1: a JSON list, not a record; is it a metrics.jsonl that a training run wrote?"),
])
def test_a_file_that_cannot_be_drawn_is_one_line_and_exit_2(tmp_path, capsys, content, expected):
    path = tmp_path / "metrics.jsonl"
    if content is not None:
        path.write_text(content)
    assert plot.main([str(path), "-o", str(tmp_path / "c.png")]) == 2
    assert capsys.readouterr().err == f"training.plot: error: {expected.format(path=path)}\n"
    assert not (tmp_path / "c.png").exists()


def test_an_output_that_is_not_a_png_is_refused_before_reading(tmp_path, capsys):
    assert plot.main([str(tmp_path / "absent.jsonl"), "-o", str(tmp_path / "c.jpg")]) == 2
    assert capsys.readouterr().err == (f"training.plot: error: -o {tmp_path / 'c.jpg'}: the picture is a PNG; "
                                       f"give a path ending in .png\n")


def test_importing_training_does_not_import_matplotlib():
    """Every run imports training/; matplotlib (a second or more to import) only when a plot is drawn."""
    code = ("import sys, training.plot, training.run_training; "
            "assert 'matplotlib' not in sys.modules, sorted(m for m in sys.modules if 'matplotlib' in m)")
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
