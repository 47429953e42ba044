"""An error on one rank inside work the ranks do together (a save, a load: parallel/comm.py `collective_work`) ends
every rank within seconds, with one line and the status of a bad input, and the folder's last good checkpoint is
still the one a resume loads.

Each launch resumes a two-rank run from its iteration-2 checkpoint with tests/raise_in_collective_work.py raising an
OSError on one rank at one stage of the iteration-4 save or of the load; the next launch of the chain resumes from
what the failed one left, so each stage's launch proves its predecessor left iteration 2 loadable. Where the ranks
meet the error together (DCP's own exchange, an agreement after a stage) every rank raises it and rank 0 prints it;
where the failing rank leaves the others in a collective (a stage whose error it raises at once), it publishes the
error through the rendezvous store and they end with its status, silently (rendezvous/liveness.py, way 3).
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from checkpoint.format import TRACKER_FILE
from tests.checkpoint.test_checkpoint_resume import COMMON, _launch
from tests.distributed import free_port

ENDS_WITHIN_S = 30.0
# the rank each stage fails on: one that reaches it (the first rank alone writes the metadata and the tracker, and
# at ZeRO 0 every torch_dist tensor, each written by its first replica)
SAVE_STAGES = {"plan": 1, "write": 0, "finalise": 0, "tracker": 0}


def launch(tmp_path: Path, name: str, argv: list, ranks: int, stage: str | None = None, rank: int = 1):
    """`argv` on `ranks` ranks (tests/raise_in_collective_work.py raising at `stage` on `rank`, or plain
    pretrain_gpt.py): each rank's (exit status, stderr, exit time), and the raise's time."""
    mark = tmp_path / f"{name}.raised"
    env = {"FAIL_STAGE": stage, "FAIL_RANK": str(rank), "FAIL_MARK": str(mark)} if stage else {}
    script = "tests/raise_in_collective_work.py" if stage else "pretrain_gpt.py"
    port = free_port()
    logs = [(open(tmp_path / f"{name}.{r}.out", "w"), open(tmp_path / f"{name}.{r}.err", "w")) for r in range(ranks)]
    processes = [_launch(argv, r, ranks, port, out, env, script=script, errors=err) for r, (out, err) in enumerate(logs)]
    ended: dict[int, float] = {}
    deadline = time.monotonic() + 240
    try:
        while len(ended) < ranks and time.monotonic() < deadline:
            for r, process in enumerate(processes):
                if r not in ended and process.poll() is not None:
                    ended[r] = time.time()
            time.sleep(0.05)
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
            process.wait(timeout=30)
        for out, err in logs:
            out.close()
            err.close()
    assert len(ended) == ranks, f"{name}: ranks {sorted(set(range(ranks)) - set(ended))} still running after 240 s"
    raised_at = float(mark.read_text()) if mark.exists() else None
    return [(process.returncode, (tmp_path / f"{name}.{r}.err").read_text(), ended[r])
            for r, process in enumerate(processes)], raised_at


def assert_every_rank_ends_on_the_line(name: str, outcome, stage: str, rank: int) -> None:
    ranks, raised_at = outcome
    assert raised_at is not None, f"{name}: nothing raised"
    errors = "\n".join(f"rank {r} ({code}): {err}" for r, (code, err, _) in enumerate(ranks))
    assert all(code == 2 for code, _, _ in ranks), f"{name}: {errors}"
    assert max(at for *_, at in ranks) - raised_at < ENDS_WITHIN_S, f"{name}: {errors}"
    lines = [line for _, err, _ in ranks for line in err.splitlines() if "error:" in line]
    assert "Traceback" not in errors and len(lines) == 1, f"{name}: {errors}"
    assert lines[0].startswith("pretrain_gpt.py: error: ") and f"injected at {stage} on rank {rank}" in lines[0], \
        f"{name}: {errors}"


def run_argv(cache: str, save: Path, ranks: int, torch_dist: bool) -> list[str]:
    """Four iterations saving at 2 and 4 (resuming from --save), a global batch of 8 over the ranks."""
    argv = COMMON + ["--data-cache-dir", cache, "--train-iters", "4", "--save-interval", "2", "--save", save,
                     "--load", save, "--micro-batch-size", 8 // ranks] + (["--ckpt-format", "torch_dist"] if torch_dist
                                                                          else [])
    return list(map(str, argv))


def tracked_iteration(save: Path) -> int:
    return int((save / TRACKER_FILE).read_text())


@pytest.mark.slow
@pytest.mark.parametrize("ckpt_format", ["ours", "torch_dist"])
def test_an_error_on_one_rank_at_each_stage_of_a_save_and_a_load_ends_every_rank(tmp_path, corpus_cache,
                                                                                 ckpt_format):
    save = tmp_path / "ck"
    argv = run_argv(corpus_cache, save, 2, ckpt_format == "torch_dist")
    first, _ = launch(tmp_path, "first", argv + ["--exit-interval", "2"], 2)
    assert [code for code, _, _ in first] == [0, 0], first
    assert tracked_iteration(save) == 2
    for stage, rank in (*SAVE_STAGES.items(), ("load", 1)):
        outcome = launch(tmp_path, stage, argv, 2, stage, rank)
        assert_every_rank_ends_on_the_line(stage, outcome, stage, rank)
        # what a resume loads: iteration 2, or a save that was complete before its tracker failed
        assert tracked_iteration(save) == 2, stage
    last, _ = launch(tmp_path, "last", argv, 2)
    assert [code for code, _, _ in last] == [0, 0], last
    assert tracked_iteration(save) == 4


@pytest.mark.slow
def test_on_four_ranks_the_three_others_end_too(tmp_path, corpus_cache):
    """A torch_dist save whose rank 2 cannot plan its part (the others wait inside DCP), then a load that rank 3
    leaves at its start (the others load on): every rank ends, and iteration 2 stays the one to resume from."""
    save = tmp_path / "ck"
    argv = run_argv(corpus_cache, save, 4, torch_dist=True)
    first, _ = launch(tmp_path, "first", argv + ["--exit-interval", "2"], 4)
    assert [code for code, _, _ in first] == [0] * 4, first
    for stage, rank in (("plan", 2), ("load", 3)):
        assert_every_rank_ends_on_the_line(stage, launch(tmp_path, stage, argv, 4, stage, rank), stage, rank)
        assert tracked_iteration(save) == 2
