"""Megatron-LM's hybrid CPU optimizer through slime's launches (issue 81): THUDM slime's MoE flag sets in the replay
corpus (tests/replay_corpus/slime.py), shrunk by the corpus's one shrink, give --optimizer-cpu-offload
--overlap-cpu-optimizer-d2h-h2d --use-precision-aware-optimizer beside the distributed optimizer slime sets. In one
test (one group of gloo processes per world size, the launches in turn), each of COMPARED trains with the losses,
gradient norms and evaluation losses of the same launch without --optimizer-cpu-offload, bit for bit (fp32: the
--bf16 slime sets on every launch left out; 3 iterations, each logged), at Megatron-LM's default fraction 1.0 (the
whole host step, zero/offload.py) and at 0.5 (the split, zero/hybrid_offload.py); a launch that saves has its split
run's save of iteration 2 resume without offload to iteration 3's records (the states are saved whole, wherever they
lived); and GLM-4.5-Air's split run's bytes by placement, every rank's, are the dry run's (planner/dry_run.py).
The split over several data-parallel ranks is tests/zero/test_hybrid_offload.py's.

slime's other flag sets are equal bit for bit too, measured by hand (BY_HAND);
`SLIME_OFFLOAD_LAUNCHES=slime-qwen3-235b-a22b,slime-glm4.5-355b-a32b,slime-kimi-k2,slime-deepseek-v3 python -m pytest
-n 0 tests/zero/test_cpu_offload_launch.py` compares them (any names of slime.py, comma-separated, instead of COMPARED).
"""
import os
import shutil
import time
from pathlib import Path

import pytest

from arguments.parser import parse_arguments
from planner.dry_run import Cluster, dry_run
from planner.vocabulary import launch_vocab
from tests.distributed import free_port, run_distributed
from tests.reliability_helpers import metrics_records
from tests.replay_corpus import slime
from tests.replay_corpus.shrink import ITERATIONS, LocalFiles, ranks_for, shrink
from zero.memory import MODEL_STATE_CATEGORIES

# Qwen3-30B-A3B (softmax router, 128 experts, QK norms, GQA) and Moonlight (multi-latent attention, a sigmoid
# router with expert bias, shared experts, a dense first layer, DeepEP's flex dispatcher): TP 2 x EP 2 on 2 ranks.
# GLM-4.5-Air: 2 pipeline stages x CP 2 x EP 2 on 4 ranks (its partitions cut over CP, the experts on their own
# grid), QKV biases, half-rotary heads; slime's scripts give it no --save, so no resume.
COMPARED = ("slime-qwen3-30b-a3b", "slime-moonlight-16b-a3b", "slime-glm4.5-106b-a12b")
# Equal bit for bit at F 1.0 and 0.5 (GLM-4.5 355B at 0.25 and 0.9 too, Kimi-K2 at 0.1 and 0.75), measured by hand
# (2026-11-26; seconds for one launch's runs on the shared 2-core machine): Qwen3-235B-A22B (2 stages of 1 rank,
# 11 s), GLM-4.5 355B (GLM-4.5-Air's grid with QK norms, 12 s), Kimi-K2 (2 stages, MLA, 16 s); those that save resume
# too. Each adds no property COMPARED lacks.
# At slime's lr 1e-6 their fp32 losses rarely move in a step; the gradient norms do: GLM-4.5 355B's tell an lr
# 1e-5 higher (relative) apart, so a weight one ulp off shows.
BY_HAND = ("slime-qwen3-235b-a22b", "slime-glm4.5-355b-a32b", "slime-kimi-k2", "slime-deepseek-v3")
# Whose evaluation loss shows a step at that lr. GLM-4.5-Air's moved by one fp32 ulp (6.247738361358643 ->
# 6.247737884521484) until gate and up ran as one GEMM (gpt/gate_up_gemm.py: its input gradient summed in another
# order, gradient norms 1e-9 relative apart) and by none since: below the loss's resolution either way. Its runs'
# gradient norms, equal bit for bit below, are what tells a step.
MOVED = ("slime-qwen3-30b-a3b", "slime-moonlight-16b-a3b")
SELECTION = "SLIME_OFFLOAD_LAUNCHES"
PLANNED = "slime-glm4.5-106b-a12b"  # its split run reports its memory (--report-memory) for the planner's check


def launch_rank(rank, world_size, launches, ports):
    """Each (argv, folder) in turn; a folder (a save of ITERATIONS iterations) is cut back to iteration 2 first, as
    the ckpt-resume phase of Megatron CI does, by rank 0 once every rank is done with it (marker files)."""
    import pretrain_gpt

    for (argv, cut), port in zip(launches, ports):
        if cut is not None:
            cut = Path(cut)
            (cut.parent / f"done{rank}").touch()
            if rank == 0:
                _wait_for([cut.parent / f"done{other}" for other in range(world_size)])
                shutil.rmtree(cut / f"iter_{ITERATIONS:07d}")
                (cut / "latest_checkpointed_iteration.txt").write_text(f"{ITERATIONS - 1}\n")
                (cut.parent / "cut").touch()
            _wait_for([cut.parent / "cut"])
        os.environ["MASTER_PORT"] = str(port)
        assert pretrain_gpt.main(argv) == 0, argv


def _wait_for(paths, timeout=300.0):
    deadline = time.monotonic() + timeout
    while not all(path.exists() for path in paths):
        assert time.monotonic() < deadline, paths
        time.sleep(0.05)


def logged(path):
    """(split, iteration, loss, gradient norm) of every record: training's and the evaluations' (one batch each)."""
    return [(r.get("split", "train"), r["iteration"], r["loss"], r.get("grad_norm")) for r in metrics_records(path)
            if "loss" in r]


def _without(argv: list[str], *flags: str) -> list[str]:
    return [token for token in argv if token not in flags]


def _value(argv: list[str], flag: str, value: str) -> list[str]:
    out = list(argv)
    out[out.index(flag) + 1] = value
    return out


def _runs(launch, prepared, folder: Path) -> dict[str, tuple[list[str], object]]:
    """plain (without --optimizer-cpu-offload), whole (as written), half (F 0.5) and, for a launch that saves,
    resumed (plain from half's save of iteration 2): the shrunk launch, fp32 (--bf16 left out), each iteration
    logged, each run in its own folder. PLANNED's half reports its memory."""
    saves = "--save" in launch.argv
    runs = {}
    for run in ("plain", "whole", "half", "resumed")[:4 if saves else 3]:
        out = folder / run
        out.mkdir(parents=True)
        shrunk = shrink(launch, LocalFiles(prepared.data_prefix, prepared.tokenizer_dir, prepared.vocab_size, str(out)))
        # every iteration's record: the launches leave --log-interval to Megatron's 100
        runs[run] = _without(shrunk.argv, "--bf16") + ["--log-interval", "1", "--metrics-file", str(out / "metrics.jsonl")]
    for run in ("plain", "resumed")[:2 if saves else 1]:
        runs[run] = _without(runs[run], "--optimizer-cpu-offload")
    runs["half"] += ["--optimizer-offload-fraction", "0.5"] + (["--report-memory"] if launch.name == PLANNED else [])
    jobs = {run: (argv, None) for run, argv in runs.items()}
    if saves:
        save = runs["half"][runs["half"].index("--save") + 1]
        jobs["resumed"] = (_value(runs["resumed"], "--load", save), save)
    return jobs


def assert_planned_as_measured(argv: list[str], metrics: Path, world_size: int) -> None:
    """Every rank's model-state bytes of each category and buffers, on the device and on the host, as the dry run
    of the same flags plans them (--report-memory's record: the live tensors, split by zero.memory's placement)."""
    config = parse_arguments(argv).config
    vocab, _ = launch_vocab(config.checkpoint, config.data, config.model, config.sources)
    (records,) = [record["memory"] for record in metrics_records(metrics) if "memory" in record]
    assert sorted(record["rank"] for record in records) == list(range(world_size))
    for live in records:
        plan = dry_run(config, Cluster(world_size, world_size, device_type="cpu"), vocab, rank=live["rank"])
        device, host = plan.model_state_bytes, plan.host_model_state_bytes
        for category in (*MODEL_STATE_CATEGORIES, "total"):
            assert device[category] + host[category] == live[f"measured_{category}_bytes"], (live["rank"], category)
        assert host["total"] == live["host_model_state_bytes"], live["rank"]
        assert plan.host_buffer_bytes == live["host_buffers_bytes"], live["rank"]
        assert plan.buffer_bytes + plan.host_buffer_bytes == live["measured_buffers_bytes"], live["rank"]
        # the split: master and moments on both sides, the 16-bit parameters and the gradient partition on the device
        assert 0 < host["master_weights"] < live["measured_master_weights_bytes"], live["rank"]
        assert host["parameters"] == host["gradients"] == 0, live["rank"]


@pytest.mark.slow
def test_slimes_hybrid_optimizer_trains_as_the_launch_without_it(embedded_corpus, tmp_path):
    launches = {launch.name: launch for launch in slime.LAUNCHES}
    names = os.environ.get(SELECTION, "").split(",") if os.environ.get(SELECTION) else COMPARED
    runs, jobs = {}, {}  # jobs by world size
    for name in names:
        launch = launches[name]
        assert launch.outcome == "trains"
        assert {"--optimizer-cpu-offload", "--use-precision-aware-optimizer", "--bf16"} <= set(launch.argv)
        runs[name] = _runs(launch, embedded_corpus[1], tmp_path / name)
        jobs.setdefault(ranks_for(launch), []).extend(runs[name].values())
    for world_size, group in jobs.items():
        run_distributed(launch_rank, world_size, group, [free_port() for _ in group], timeout=600)
    for name in names:
        plain = logged(tmp_path / name / "plain" / "metrics.jsonl")
        assert [iteration for split, iteration, _, _ in plain if split == "train"] == list(range(1, ITERATIONS + 1))
        if name in MOVED:  # the evaluations of iterations 2 and 3 (one batch, the same one): the steps moved them
            assert len({loss for split, _, loss, _ in plain if split == "valid"}) == 2, name
        for run in ("whole", "half"):
            assert logged(tmp_path / name / run / "metrics.jsonl") == plain, (name, run)
        if (tmp_path / name / "resumed").exists():
            assert logged(tmp_path / name / "resumed" / "metrics.jsonl") == [r for r in plain if r[1] == ITERATIONS], name
    if PLANNED in names:
        assert_planned_as_measured(runs[PLANNED]["half"][0], tmp_path / PLANNED / "half" / "metrics.jsonl", ranks_for(launches[PLANNED]))
