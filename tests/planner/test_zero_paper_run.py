"""scripts/zero_paper: the experiment definitions, run.py's commands (every one parses as the point it
stands for) and its dry runs, and the planner helpers behind them."""

import json
import shlex
import sys
from pathlib import Path

import pytest

from arguments.config import ConfigError
from arguments.parser import parse_config

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts" / "zero_paper"))
import experiments  # noqa: E402
import planning  # noqa: E402
import run as zero_paper_run  # noqa: E402

CASES = [(figure, profile) for figure in experiments.FIGURES for profile in experiments.PROFILES]
LAUNCHERS = ("slurm_dgx2.sbatch", "launch_multi_node.sh", "launch_single_node.sh")


def commands(capsys, argv):
    """run.py's printed commands as (environment, pretrain_gpt.py flags) pairs."""
    assert zero_paper_run.main(argv) == 0
    found = []
    for line in capsys.readouterr().out.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        words = shlex.split(line)
        env = dict(word.split("=", 1) for word in words if "=" in word.split("--")[0] and not word.startswith("-"))
        (start,) = [i for i, word in enumerate(words) if word.endswith(LAUNCHERS)]
        found.append((env, words[start + 1:]))
    return found


@pytest.mark.parametrize("figure, profile", CASES)
def test_every_generated_command_parses_as_its_point(figure, profile, capsys, tmp_path):
    points = experiments.load_points(figure, profile)
    assert points
    printed = commands(capsys, [figure, "--profile", profile, "--runs-dir", str(tmp_path)])
    assert len(printed) == len(points)
    for point, (env, argv) in zip(points, printed):
        config = parse_config(argv)
        model, training = config.model, config.training
        assert (model.num_layers, model.hidden_size, model.num_attention_heads) == (point.layers, point.hidden, point.heads)
        assert config.parallel.tensor_model_parallel_size == point.mp
        config.model.validate_tensor_parallel(point.mp)
        assert (training.micro_batch_size, training.global_batch_size, training.train_iters) == \
               (point.micro_batch, point.global_batch, point.iterations)
        assert config.zero.stage == point.zero_stage and config.activations.checkpoint_activations
        assert (config.activations.partition_activations, config.activations.cpu_checkpointing,
                config.activations.contiguous_checkpointing) == (bool(point.pa), bool(point.pa_cpu), bool(point.md))
        assert training.precision == {"dgx2": "fp16", "h100": "bf16"}[profile]
        assert training.gradient_precision == training.precision  # the paper's 16-bit gradients
        assert config.logging.report_memory == (figure in experiments.MEMORY_FIGURES)
        assert config.data.data_path == ["$DATA_PATH"] and config.data.vocab_file == "$VOCAB_FILE"
        assert config.logging.wandb_run_name == point.name and config.logging.wandb_project == "zero-paper"
        assert env["WANDB_RUN_GROUP"] == f"zero-paper-{figure}-{profile}"
        assert env["WANDB_TAGS"].split(",") == ["zero-paper", figure, profile, point.series, point.point]
        assert env["TP"] == str(point.mp)
        directory = tmp_path / profile / figure / point.point
        assert config.logging.metrics_file == str(directory / "metrics.jsonl")
        launch = json.loads((directory / "launch.json").read_text())
        assert launch["argv"] == argv and launch["world_size"] == point.world_size


def test_the_slurm_command_asks_for_the_points_grid(capsys, tmp_path):
    assert zero_paper_run.main(["fig3", "--profile", "h100", "--runs-dir", str(tmp_path), "--points", "zero-400gpus"]) == 0
    line = [text for text in capsys.readouterr().out.splitlines() if not text.startswith("#")][0]
    words = shlex.split(line)
    sbatch = words.index("sbatch")
    assert words[sbatch + 1:sbatch + 7] == ["--nodes", "50", "--ntasks-per-node", "8", "--gpus-per-node", "8"]


def test_torchrun_commands_run_on_every_node_and_parse(capsys, tmp_path):
    printed = commands(capsys, ["fig4", "--profile", "h100", "--launcher", "torchrun", "--runs-dir", str(tmp_path),
                                "--data-path", "/data/web", "--vocab-file", "v.json", "--merge-file", "m.txt",
                                "--", "--compile"])
    for env, argv in printed:
        assert env["NNODES"] == "16" and env["GPUS_PER_NODE"] == "8" and env["NODE_RANK"] == "$NODE_RANK"
        config = parse_config(argv)
        assert config.data.data_path == ["/data/web"] and config.training.compile  # flags after -- reach every run


def test_a_launch_file_of_another_run_is_kept_unless_overwrite(capsys, tmp_path):
    argv = ["fig2", "--profile", "dgx2", "--runs-dir", str(tmp_path), "--points", "zero-1.5b"]
    assert zero_paper_run.main(argv) == 0
    assert zero_paper_run.main(argv) == 0  # the same run again: nothing to protect
    with pytest.raises(ConfigError, match="describes another run"):
        zero_paper_run.main([*argv, "--", "--seed", "7"])
    assert zero_paper_run.main([*argv, "--overwrite", "--", "--seed", "7"]) == 0


def test_submitting_needs_sbatch_and_the_data(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(ConfigError, match="sbatch is not on PATH"):
        zero_paper_run.main(["fig2", "--profile", "dgx2", "--submit", "--runs-dir", str(tmp_path)])
    sbatch = tmp_path / "sbatch"
    sbatch.write_text('#!/bin/sh\necho "$@" >> "${0%/*}/submitted"\n')  # shell built-ins only: PATH is bare
    sbatch.chmod(0o755)
    for name in ("DATA_PATH", "VOCAB_FILE", "MERGE_FILE"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(ConfigError, match="--submit needs --data-path"):
        zero_paper_run.main(["fig2", "--profile", "dgx2", "--submit", "--runs-dir", str(tmp_path)])
    assert zero_paper_run.main(["fig2", "--profile", "dgx2", "--submit", "--runs-dir", str(tmp_path / "runs"),
                                "--data-path", "d", "--vocab-file", "v", "--merge-file", "m", "--points",
                                "zero-1.5b", "megatron-1.5b"]) == 0
    submitted = (tmp_path / "submitted").read_text().splitlines()
    assert len(submitted) == 2 and all("--data-path d " in line for line in submitted)


def test_unknown_points_and_bad_definitions_are_named(tmp_path):
    with pytest.raises(ConfigError, match="no-such-point"):
        zero_paper_run.main(["fig2", "--profile", "dgx2", "--points", "no-such-point"])
    bad = tmp_path / "fig2.dat"
    bad.write_text(" ".join(experiments.COLUMNS) + "\n"
                   "dgx2 p zero 1 16 16 48 1600 16 4 4 2 1 0 1 5e8 2e8 5\n")  # 48 x 1600 has 16 heads: fine
    assert len(experiments.load_points("fig2", directory=tmp_path)) == 1
    bad.write_text(" ".join(experiments.COLUMNS) + "\n"
                   "dgx2 p zero 1 16 16 48 1600 32 4 4 2 1 0 1 5e8 2e8 5\n")
    with pytest.raises(ConfigError, match="32 heads, but zero_paper/1.5b-48x1600 has 16"):
        experiments.load_points("fig2", directory=tmp_path)
    bad.write_text(" ".join(experiments.COLUMNS) + "\n"
                   "dgx2 p zero 1 16 16 48 1600 16 4 5 2 1 0 1 5e8 2e8 5\n")
    with pytest.raises(ConfigError, match="global batch"):
        experiments.load_points("fig2", directory=tmp_path)


SMALLEST = {figure: min(experiments.load_points(figure, "dgx2"), key=lambda p: p.layers * p.hidden ** 2).point
            for figure in experiments.FIGURES}


@pytest.fixture(scope="module")
def plan_cache(tmp_path_factory):
    """One plan cache for the module: Figures 6, 7 and 8 share their smallest point (C1 at 40B)."""
    return tmp_path_factory.mktemp("plans")


@pytest.mark.parametrize("figure", experiments.FIGURES)
def test_dry_run_runs_for_every_figure(figure, capsys, monkeypatch, plan_cache):
    """One point per figure (its smallest model) at the real size: a dry run of the whole figure is
    the same code many times over, and takes minutes (report.py does it, with a cache)."""
    tmp_path = plan_cache
    monkeypatch.setenv("ZERO_GPT_PLAN_CACHE", str(tmp_path))
    assert zero_paper_run.main([figure, "--profile", "dgx2", "--dry-run", "--points", SMALLEST[figure]]) == 0
    out = capsys.readouterr().out
    (row,) = [line for line in out.splitlines() if line.startswith(f"| {SMALLEST[figure]} |")]
    point = [p for p in experiments.load_points(figure, "dgx2") if p.point == SMALLEST[figure]][0]
    plan = planning.Planner(tmp_path).plan(point)  # the cached plan run.py made
    assert ("does NOT fit" in row) == (not plan.fits) and "GiB" in row
    assert "1 points;" in out and not list(tmp_path.glob("*.tmp-*"))
    assert list(tmp_path.glob("*.json"))  # the plan was cached


def test_dry_run_flags_what_does_not_fit_and_finds_the_largest_batch(capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("ZERO_GPT_PLAN_CACHE", str(tmp_path / "cache"))
    definitions = tmp_path / "defs"
    definitions.mkdir()
    (definitions / "fig4.dat").write_text(
        "# two points without MP on 8 GPUs: plain DP cannot hold 2.5B in 32 GB, ZeRO stage 2 can\n"
        + " ".join(experiments.COLUMNS) + "\n"
        "dgx2 ddp-2.5b ddp 1 8 1 54 1920 16 1 8 0 0 0 1 5e8 2e8 5\n"
        "dgx2 zero-2.5b zero 1 8 1 54 1920 16 1 8 2 0 0 1 5e8 2e8 5\n")
    assert zero_paper_run.main(["fig4", "--profile", "dgx2", "--dry-run", "--largest-batch",
                                "--definitions", str(definitions)]) == 0
    out = capsys.readouterr().out
    assert "1 will not fit: ddp-2.5b" in out
    zero_row = [line for line in out.splitlines() if line.startswith("| zero-2.5b |")][0]
    largest = int(zero_row.rstrip(" |").rsplit("|", 1)[1])
    point = experiments.load_points("fig4", "dgx2", definitions)[1]
    planner = planning.Planner(tmp_path / "cache")
    limit = planning.BATCH_HEADROOM * point.hardware.gpu_memory_bytes
    assert planner.plan(point.with_micro_batch(largest)).total_bytes <= limit
    following = planning.MICRO_BATCH_LADDER[planning.MICRO_BATCH_LADDER.index(largest) + 1]
    assert planner.plan(point.with_micro_batch(following)).total_bytes > limit


# ---- flags after -- are pretrain_gpt.py's, checked before any launch (issue 27, problem 6) --------

@pytest.mark.parametrize("extra, words", [
    (["--num-layres", "3"], ["--num-layres", "--num-layers"]),
    (["--seed", "seven"], ["--seed", "seven"]),
    (["--zero-stage", "9"], ["--zero-stage"]),
    (["--lr", "nan"], ["--lr"]),
])
@pytest.mark.parametrize("submit", [False, True])
def test_flags_after_the_separator_are_checked_before_any_launch(extra, words, submit, monkeypatch, tmp_path):
    from tests.reliability_helpers import run_main

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    sbatch = bin_dir / "sbatch"
    sbatch.write_text('#!/bin/sh\necho "$@" >> "${0%/*}/submitted"\n')
    sbatch.chmod(0o755)
    monkeypatch.setenv("PATH", str(bin_dir))
    runs = tmp_path / "runs"
    argv = ["fig2", "--profile", "dgx2", "--runs-dir", runs]
    if submit:
        argv += ["--submit", "--data-path", "d", "--vocab-file", "v", "--merge-file", "m"]
    outcome = run_main(zero_paper_run.command, [*argv, "--", *extra])
    outcome.one_error_line(*words)
    assert outcome.out == "" and not runs.exists() and not (bin_dir / "submitted").exists()


def test_a_dry_run_refuses_flags_it_would_not_plan(tmp_path):
    from tests.reliability_helpers import run_main

    outcome = run_main(zero_paper_run.command, ["fig2", "--profile", "dgx2", "--dry-run", "--", "--seed", "7"])
    outcome.one_error_line("--dry-run", "--seed 7")


def test_the_plan_cache_key_hashes_every_package_a_dry_run_executes():
    """A cached plan is keyed by the planning code's hash: every package that planner/dry_run.py
    reaches (transitively) must be hashed, or an edit there would serve stale plans. data/ only
    supplies the vocabulary size, which is part of the key itself."""
    import sys

    sys.path.insert(0, str(ROOT / "scripts" / "zero_paper"))
    from planning import NOT_PLANNING, PLANNING_SOURCES
    from tests.test_layering import import_graph

    graph, seen, todo = import_graph(ROOT), set(), ["planner.dry_run"]
    while todo:
        module = todo.pop()
        if module not in seen:
            seen.add(module)
            todo.extend(graph.get(module, ()))
    packages = {module.split(".")[0] for module in seen} - {"data"}
    assert packages <= set(PLANNING_SOURCES), sorted(packages - set(PLANNING_SOURCES))
    unhashed = {module for module in seen if module.rsplit(".", 1)[-1] + ".py" in NOT_PLANNING}
    assert not unhashed, f"a dry run executes {sorted(unhashed)}, which the cache key leaves out"
