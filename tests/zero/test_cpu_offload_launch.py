"""Megatron-LM's hybrid CPU optimizer through slime's launches (issue 81): THUDM slime's MoE flag sets in the replay
corpus (tests/replay_corpus/slime.py), shrunk by the corpus's one shrink, give --optimizer-cpu-offload
--overlap-cpu-optimizer-d2h-h2d --use-precision-aware-optimizer beside the distributed optimizer slime sets. In one
test (one pair of gloo processes, the launches in turn), each of COMPARED trains with the losses, gradient norms and
evaluation losses of the same launch without --optimizer-cpu-offload, bit for bit (fp32: the --bf16 slime sets on
every launch left out; 3 iterations, each logged), at Megatron-LM's default fraction 1.0 (the whole host step,
zero/offload.py) and at 0.5 (the split, zero/hybrid_offload.py); and the split run's save of iteration 2 resumes
without offload to iteration 3's records (the states are saved whole, wherever they lived). The shrunk launches are
TP 2 x EP 2, one data-parallel rank: the split over several data-parallel ranks is tests/zero/test_hybrid_offload.py's.
slime's other flag sets train with the offload as written (bf16) in tests/scripts/test_replay_corpus.py.
"""
import os
import shutil
import time
from pathlib import Path

import pytest

from tests.distributed import free_port, run_distributed
from tests.reliability_helpers import metrics_records
from tests.replay_corpus import slime
from tests.replay_corpus.shrink import ITERATIONS, WORLD_SIZE, LocalFiles, ranks_for, shrink

# Qwen3-30B-A3B (softmax router, 128 experts, QK norms, GQA) and Moonlight (multi-latent attention, a sigmoid
# router with expert bias, shared experts, a dense first layer, DeepEP's flex dispatcher): TP 2 x EP 2 shrunk
COMPARED = ("slime-qwen3-30b-a3b", "slime-moonlight-16b-a3b")


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


def _runs(launch, prepared, folder: Path) -> list[tuple[list[str], object]]:
    """plain (without --optimizer-cpu-offload), whole (as written), half (F 0.5), resumed (plain from half's save of
    iteration 2): the shrunk launch, fp32 (--bf16 left out), each iteration logged, each run in its own folder."""
    runs = {}
    for run in ("plain", "whole", "half", "resumed"):
        out = folder / run
        out.mkdir(parents=True)
        shrunk = shrink(launch, LocalFiles(prepared.data_prefix, prepared.tokenizer_dir, prepared.vocab_size, str(out)))
        # every iteration's record: the launches leave --log-interval to Megatron's 100
        runs[run] = _without(shrunk.argv, "--bf16") + ["--log-interval", "1", "--metrics-file", str(out / "metrics.jsonl")]
    for run in ("plain", "resumed"):
        runs[run] = _without(runs[run], "--optimizer-cpu-offload")
    runs["half"] += ["--optimizer-offload-fraction", "0.5"]
    save = runs["half"][runs["half"].index("--save") + 1]
    runs["resumed"] = _value(runs["resumed"], "--load", save)
    return [(runs["plain"], None), (runs["whole"], None), (runs["half"], None), (runs["resumed"], save)]


@pytest.mark.slow
def test_slimes_hybrid_optimizer_trains_as_the_launch_without_it(embedded_corpus, tmp_path):
    launches = {launch.name: launch for launch in slime.LAUNCHES}
    jobs = []
    for name in COMPARED:
        launch = launches[name]
        assert launch.outcome == "trains" and ranks_for(launch) == WORLD_SIZE
        assert {"--optimizer-cpu-offload", "--use-precision-aware-optimizer", "--bf16"} <= set(launch.argv)
        jobs += _runs(launch, embedded_corpus[1], tmp_path / name)
    run_distributed(launch_rank, WORLD_SIZE, jobs, [free_port() for _ in jobs], timeout=600)
    for name in COMPARED:
        plain = logged(tmp_path / name / "plain" / "metrics.jsonl")
        assert [iteration for split, iteration, _, _ in plain if split == "train"] == list(range(1, ITERATIONS + 1))
        # the evaluations of iterations 2 and 3 (one batch, the same one) differ: the steps moved the weights
        assert len({loss for split, _, loss, _ in plain if split == "valid"}) == 2, name
        for run in ("whole", "half"):
            assert logged(tmp_path / name / run / "metrics.jsonl") == plain, (name, run)
        assert logged(tmp_path / name / "resumed" / "metrics.jsonl") == [r for r in plain if r[1] == ITERATIONS], name
