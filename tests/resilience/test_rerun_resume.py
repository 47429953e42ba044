"""Issue 69 item 7: the rerun state machine's state in the checkpoint (resilience/rerun_resume.py,
checkpoint/rerun_machine_entry.py), so that a job that exited 16 re-runs the iteration once more when resumed
and decides, as Megatron-Core's RerunStateMachine.state_dict / load_state_dict and Megatron-LM's checkpointing.py
make it: on the node and device that reproduced the result, exit 16 again; elsewhere exit 17, "Possible persistent
error" when the result differs there, "Correct result" when it is the same.
"""

from __future__ import annotations

import json
import math
import random
import socket
from functools import partial

import pytest

from base.errors import CheckpointError
from checkpoint.schema import check_metadata
from resilience.rerun_resume import (
    common_state,
    load_machine_state,
    machine_checkpoint_state,
    rank_state,
    resume_machine,
)
from resilience.rerun_state import (
    EXIT_CODE_FAILED_ON_RESULT_VALIDATION,
    EXIT_CODE_RESUME_TO_DISAMBIGUATE,
    RerunState,
)
from tests.reliability_helpers import metrics_records, snapshot, train
from tests.resilience.rerun_machines import (
    drive_megatron,
    drive_ours,
    megatron_machine_of,
    megatron_rerun_module,
    our_machine,
)

LOSSES = [5.0, 4.9, 4.8, 4.7, 4.6, 4.5, 4.4, 4.3]


def saved_and_read_back(machine) -> dict:
    """metadata.json's entry for a one-rank job, through JSON as a checkpoint holds it."""
    return json.loads(json.dumps({**common_state(machine), "ranks": [rank_state(machine)]}))


def megatron_saved(machine) -> dict:
    """Megatron's state_dict as its load_checkpoint hands it back: the sharded part loaded in place."""
    state = machine.state_dict(data_iterator=None, ckpt_format="torch_dist")
    return {**state, "sharded": state["sharded"].data}


def first_job_and_resumed(monkeypatch, kind: str, losses: list, other_node: bool) -> tuple[tuple, tuple, list]:
    """Both machines through the job that exits 16, then through the job resumed from its checkpoint (on
    "node-a" again or on "node-b"): (our resumed trace, Megatron's, our resumed machine's lines)."""
    node = ["node-a"]
    rsm = megatron_rerun_module(monkeypatch, node)
    random.seed(3)
    theirs = megatron_machine_of(rsm, 3, kind)
    first_theirs = drive_megatron(theirs, losses)
    random.seed(3)
    ours = our_machine(3, kind, where=("node-a", "0"))
    first_ours = drive_ours(ours, losses)
    assert first_ours == first_theirs and first_ours[-1][2:] == (True, True, EXIT_CODE_RESUME_TO_DISAMBIGUATE)
    failing = first_ours[-1][0]

    node[0] = "node-b" if other_node else "node-a"
    resumed_theirs = megatron_machine_of(rsm, 3, kind)
    resumed_theirs.load_state_dict(megatron_saved(theirs))
    resumed_ours = our_machine(3, kind, where=(node[0], "0"))
    load_machine_state(resumed_ours, saved_and_read_back(ours), rank=0)
    return (drive_ours(resumed_ours, losses, first=failing), drive_megatron(resumed_theirs, losses, first=failing),
            resumed_ours.lines)


@pytest.mark.parametrize("kind", ["persistent_error", "correct_result"])
@pytest.mark.parametrize("other_node", [False, True])
def test_the_resumed_jobs_re_run_decides_as_megatron_cores_machine_decides(monkeypatch, kind, other_node):
    ours, theirs, lines = first_job_and_resumed(monkeypatch, kind, LOSSES, other_node)
    assert ours == theirs
    assert len(ours) == 1 and ours[0][1] == 1  # the iteration runs once more, from the checkpoint, and the job ends
    if not other_node:  # the same node and device: resume again (elsewhere), with no new checkpoint
        assert ours[0][2:] == (False, True, EXIT_CODE_RESUME_TO_DISAMBIGUATE)
        assert any("Got rescheduled on the same GPU" in line for line in lines)
    else:
        assert ours[0][2:] == (False, True, EXIT_CODE_FAILED_ON_RESULT_VALIDATION)
        verdict = "Possible persistent error!!" if kind == "persistent_error" else "Correct result (but possible"
        assert any(verdict in line for line in lines), lines


@pytest.mark.parametrize("elsewhere", [float("nan"), 4.7])
def test_a_real_nan_re_run_elsewhere_is_judged_as_megatron_judges_it(monkeypatch, elsewhere):
    """Iteration 3's NaN reproduces in place (exit 16); on another node it is NaN again ("Correct result") or a
    number ("Possible persistent error": the first node computed it wrongly). Either way exit 17."""
    nan, resumed_losses = [5.0, 4.9, float("nan")], [5.0, 4.9, elsewhere]
    node = ["node-a"]
    rsm = megatron_rerun_module(monkeypatch, node)
    theirs, ours = megatron_machine_of(rsm, 0, "transient_error"), our_machine(0, "transient_error", where=("node-a", "0"))
    assert drive_ours(ours, nan) == drive_megatron(theirs, nan) == [
        (1, 1, False, False, 0), (2, 1, False, False, 0), (3, 2, True, True, EXIT_CODE_RESUME_TO_DISAMBIGUATE)]
    node[0] = "node-b"
    resumed_theirs = megatron_machine_of(rsm, 0, "transient_error")
    resumed_theirs.load_state_dict(megatron_saved(theirs))
    resumed_ours = our_machine(0, "transient_error", where=("node-b", "0"))
    load_machine_state(resumed_ours, saved_and_read_back(ours), rank=0)
    assert drive_ours(resumed_ours, resumed_losses, first=3) == drive_megatron(resumed_theirs, resumed_losses, first=3) \
        == [(3, 1, False, True, EXIT_CODE_FAILED_ON_RESULT_VALIDATION)]
    verdict = "Correct result" if math.isnan(elsewhere) else "Possible persistent error"
    assert any(verdict in line for line in resumed_ours.lines), resumed_ours.lines


def test_nothing_is_saved_without_a_pending_re_run_and_a_changed_layout_or_disabled_mode_is_said():
    machine = our_machine(0, "transient_error")
    assert machine_checkpoint_state(machine) is None and machine_checkpoint_state(None) is None
    drive_ours(machine, [5.0, float("nan")])
    assert machine.state == RerunState.WILL_RERUN_FROM_CHECKPOINT
    saved = saved_and_read_back(machine)
    assert saved["ranks"][0]["initial_result"] == "nan"  # JSON numbers carry no NaN
    lines = []
    fresh = our_machine(0, "transient_error")
    resume_machine(fresh, saved, "world size 2 -> 1, DP 2 -> 1", 0, lines.append)
    assert fresh.state == RerunState.NOT_RUNNING_YET
    assert lines == ["> the checkpoint holds the rerun state machine's state, a pending re-run of iteration 2 "
                     "(WILL_RERUN_FROM_CHECKPOINT), saved at another layout (world size 2 -> 1, DP 2 -> 1): ignored, as "
                     "Megatron-LM ignores it then; that iteration trains afresh"]
    resume_machine(None, saved, None, 0, lines.append)
    assert lines[-1].startswith("> RerunStateMachine disabled via CLI, ignoring machine state saved in checkpoint")


def test_a_corrupt_entry_is_refused_before_anything_reads_it(tmp_path):
    machine = our_machine(0, "transient_error")
    drive_ours(machine, [5.0, float("nan")])
    metadata = {"iteration": 1, "consumed_samples": 2, "tensor_parallel_size": 1, "data_parallel_size": 1,
                "zero_stage": 0, "adam_step": 1, "parameters": {}, "optimizer_shards": [], "files": {},
                "rerun_state_machine": saved_and_read_back(machine)}
    check_metadata(metadata, tmp_path / "metadata.json")
    metadata["rerun_state_machine"]["ranks"][0]["failed_validation_call"] = "found NaN"
    with pytest.raises(CheckpointError, match="'rerun_state_machine' must be an object of"):
        check_metadata(metadata, tmp_path / "metadata.json")


# ---- end to end: pretrain_gpt on one CPU process, three launches ------------------------------------------------

RUN = ["--train-iters", "4", "--global-batch-size", "4", "--hidden-dropout", "0.1", "--seed", "5",
       "--rerun-mode", "validate_results", "--error-injection-rate", "1", "--error-injection-type", "persistent_error"]


def test_exit_16_then_resumed_on_the_same_node_exits_16_again_and_elsewhere_exits_17(corpus_cache_300, tmp_path,
                                                                                    monkeypatch):
    cache, ckpt, tracker = corpus_cache_300, tmp_path / "ckpt", tmp_path / "rejected.txt"
    launch = partial(train, cache, tmp_path, *RUN, "--save", ckpt, "--save-interval", "1",
                     "--result-rejected-tracker-filename", tracker)
    first = launch()
    assert first.code == EXIT_CODE_RESUME_TO_DISAMBIGUATE, first.err[-2000:]
    # iteration 1 was saved by --save-interval before iteration 2's verdict; saved again, with the pending re-run
    metadata = json.loads((ckpt / "iter_0000001" / "metadata.json").read_text())
    entry = metadata["rerun_state_machine"]
    assert (entry["state"], entry["current_iteration"], len(entry["ranks"])) == ("WILL_RERUN_FROM_CHECKPOINT", 2, 1)
    assert entry["ranks"][0]["error_injector"]["injected_error_type"] == "persistent_error"
    kept = snapshot(ckpt)

    again = launch("--load", ckpt)  # the same host and device: Megatron asks to resume elsewhere, saving nothing
    assert again.code == EXIT_CODE_RESUME_TO_DISAMBIGUATE, again.err[-2000:]
    assert "Getting RerunStateMachine state from checkpoint. Will rerun step" in again.out
    assert "Got rescheduled on the same GPU. Need to resume again from the same checkpoint" in again.out
    assert snapshot(ckpt) == kept

    monkeypatch.setattr(socket, "gethostname", lambda: "another-node")  # the job resumed on another node
    elsewhere = launch("--load", ckpt)
    assert elsewhere.code == EXIT_CODE_FAILED_ON_RESULT_VALIDATION, elsewhere.err[-2000:]
    assert "Rank 0, node another-node, device cpu, iteration #2: Possible persistent error!!" in elsewhere.out
    assert "Exiting now. A checkpoint at the last iteration already exists" in elsewhere.out
    assert snapshot(ckpt) == kept
    assert [r["iteration"] for r in metrics_records(tmp_path / "metrics.jsonl") if "loss" in r] == [1]
    # the tracker file: the first job's two lines, the second re-run's; its loss is the first run's bitwise (the
    # resumed job drew the same micro-batches with the same dropout masks: the checkpoint's random states are those
    # the iteration started from)
    lines = [dict(field.split("=", 1) for field in line.split(" message=")[0].split(" ")[2:])
             for line in tracker.read_text().splitlines()]
    assert [line["status"] for line in lines] == ["initial_run", "first_rerun_reproducible",
                                                  "second_rerun_not_reproducible"]
    assert lines[0]["result"] == lines[1]["result"] == lines[2]["result"]
    assert lines[2]["node"] == "another-node"


def test_megatrons_torch_dist_layout_is_written_without_the_state_and_the_checkpoint_line_says_so(corpus_cache_300,
                                                                                                  tmp_path):
    outcome = train(corpus_cache_300, tmp_path, "--train-iters", "1", "--ckpt-format", "torch_dist",
                    "--save", tmp_path / "ckpt")
    assert outcome.code == 0, outcome.err[-2000:]
    assert ("> checkpoints: saved synchronously in Megatron-LM's torch_dist layout; without the rerun state machine's "
            "state: a job resumed from the checkpoint of an exit 16 trains that iteration afresh instead of re-running "
            "it to decide") in outcome.out.splitlines()
