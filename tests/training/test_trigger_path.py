"""swiss-ai's --trigger-path DIR (github swiss-ai/Megatron-LM main, megatron/training/training.py):
checkpoint_and_decide_exit checks `if iteration % args.log_interval == 0 and args.trigger_path is not None`
for DIR/save (save_checkpoint_and_time, barrier, rank 0 `os.remove(args.save_trigger)`) and DIR/exit
(`return True`: stop); train() touches DIR/exit once `iteration >= args.train_iters` ("Training finished
... Canceling pending scheduled jobs"). Here an exit also saves first, as every early exit does."""

import torch

from arguments.config import CheckpointConfig
from parallel.state import ParallelState
from training.exit_conditions import ExitConditions

STATE = ParallelState(device=torch.device("cpu"))


def test_triggers_are_read_every_log_interval(tmp_path):
    conditions = ExitConditions(CheckpointConfig(trigger_path=str(tmp_path)), STATE, log_interval=2)
    (tmp_path / "save").touch()
    assert not conditions.save_requested(1)  # not a --log-interval iteration
    assert conditions.save_requested(2)
    conditions.save_done()
    assert not (tmp_path / "save").exists()
    (tmp_path / "exit").touch()
    assert conditions.check(3) is None
    assert conditions.check(4) == f"found the exit trigger {tmp_path / 'exit'} (--trigger-path)"


def test_save_trigger_saves_exit_trigger_stops_and_the_end_writes_exit(tmp_path, corpus_cache_300):
    import pretrain_gpt
    from tests.reliability_helpers import TINY, metrics_records
    from training import exit_conditions

    triggers, save = tmp_path / "triggers", tmp_path / "ck"
    triggers.mkdir()
    common = TINY + ["--data-cache-dir", corpus_cache_300, "--save", str(save), "--trigger-path", str(triggers)]
    check = exit_conditions.ExitConditions.check

    def operator(self, iteration):  # what a person does between iterations: touch save after 1, exit after 4
        if iteration == 1:
            (triggers / "save").touch()
        if iteration == 4:
            (triggers / "exit").touch()
        return check(self, iteration)

    exit_conditions.ExitConditions.check = operator
    try:
        assert pretrain_gpt.main(common + ["--train-iters", "8", "--metrics-file", str(tmp_path / "m.jsonl")]) == 0
    finally:
        exit_conditions.ExitConditions.check = check
    assert [r["iteration"] for r in metrics_records(tmp_path / "m.jsonl")] == [1, 2, 3, 4]
    assert sorted(p.name for p in save.iterdir() if p.name.startswith("iter_")) == ["iter_0000002", "iter_0000004"]
    assert not (triggers / "save").exists()

    # the job script removes the triggers before it starts the next run; that run trains to the end
    (triggers / "exit").unlink()
    assert pretrain_gpt.main(common + ["--train-iters", "8", "--load", str(save),
                                       "--metrics-file", str(tmp_path / "n.jsonl")]) == 0
    assert [r["iteration"] for r in metrics_records(tmp_path / "n.jsonl")] == [5, 6, 7, 8]
    assert (triggers / "exit").exists()  # --train-iters reached: the requeued successors are cancelled
