"""Issue 35, point 2: the loop has seams. The cadence (training/loop.py `train`) takes the train step as
a parameter (a `TrainStep`), so a second step, here a plain SGD step on a linear model with no ZeRO and
no micro-batches, drives the same logging, saving and divergence bookkeeping without touching it.

The model is torchtitan's split: torchtitan/train.py `Trainer.train_step` (optimizer side) calls
`forward_backward_step` (one micro-batch), and `torchtitan/distributed/pipeline_parallel.py` builds the
pipeline schedule (`pp_schedule.step(...)`) that `forward_backward_step` uses instead of the plain
forward and backward when pipeline parallelism is on; the loop in `Trainer.train` only counts steps,
logs, checkpoints and checks the exit conditions.
"""

import inspect
import json

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from arguments.parser import parse_config
from parallel.state import destroy, initialize
from training import loop
from training.evaluation import Evaluator
from training.interval_metrics import IntervalMetrics
from training.memory_report import FirstIterationMemory
from training.metrics import MetricsWriter
from training.run_settings import resolve_run_settings
from training.train_step import StepOutcome, TrainingDiverged
from zero.activations import ActivationMonitor

SMALL = ["--num-layers", "1", "--hidden-size", "32", "--num-attention-heads", "2", "--seq-length", "16",
         "--max-position-embeddings", "16", "--micro-batch-size", "2", "--global-batch-size", "4",
         "--train-iters", "6", "--log-interval", "2", "--save-interval", "3", "--device", "cpu"]


class PlainSGDStep:
    """A second TrainStep: least squares on a linear model under torch.optim.SGD."""

    def __init__(self, settings, diverge_at=None):
        torch.manual_seed(0)
        self.model = nn.Linear(4, 1)
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.05)
        self.inputs = torch.randn(16, 4)
        self.targets = self.inputs @ torch.tensor([[1.0], [2.0], [3.0], [4.0]])
        self.settings, self.diverge_at, self.calls = settings, diverge_at, []

    def __call__(self, iteration, consumed_samples, measure_activations, schedule_samples=None):
        self.calls.append((iteration, consumed_samples))
        self.optimizer.zero_grad()
        loss = F.mse_loss(self.model(self.inputs), self.targets)
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), float("inf")).item()
        self.optimizer.step()
        if iteration == self.diverge_at:
            diverged = TrainingDiverged(f"iteration {iteration}: diverged")
            diverged.loss = float("nan")
            raise diverged
        return StepOutcome(loss=loss.item(), grad_norm=grad_norm, skipped=False, loss_scale=1.0,
                           global_batch_size=self.settings.batch.global_batch_at(consumed_samples), lr=0.05,
                           seconds=1e-3)


@pytest.fixture
def single_process():
    state = initialize("cpu", 1)
    yield state
    destroy(state)


def run_cadence(tmp_path, state, step, settings):
    writer = MetricsWriter(str(tmp_path / "m.jsonl"), enabled=True)
    activations = ActivationMonitor(state.device)
    metrics = IntervalMetrics(settings, state, writer, activations)
    evaluator = Evaluator(step.model, None, None, 0, settings.config.training, state, writer)
    memory = FirstIterationMemory(None, settings, state, writer, activations, None, first_iteration=1)
    saves = []
    try:
        summary = loop.train(step, metrics, evaluator, memory, settings, state,
                             save_checkpoint=lambda *saved: saves.append(saved))
    finally:
        writer.close()
    return summary, saves, [json.loads(line) for line in (tmp_path / "m.jsonl").read_text().splitlines()]


def test_a_second_train_step_drives_the_same_cadence(tmp_path, single_process):
    settings = resolve_run_settings(parse_config(SMALL), 128, 1, 1, "cpu")
    step = PlainSGDStep(settings)
    summary, saves, records = run_cadence(tmp_path, single_process, step, settings)
    # The cadence hands each iteration the samples consumed before it (4 a step) ...
    assert step.calls == [(iteration, 4 * (iteration - 1)) for iteration in range(1, 7)]
    # ... keeps every outcome's loss (the step really trains: least squares goes down) ...
    losses = summary.train_losses
    assert len(losses) == 6 and all(later < earlier for earlier, later in zip(losses, losses[1:]))
    assert (summary.iterations, summary.consumed_samples) == (6, 24)
    # ... logs each --log-interval's mean loss with the last step's norm and rate ...
    assert [r["iteration"] for r in records] == [2, 4, 6]
    assert [r["loss"] for r in records] == [(losses[i] + losses[i + 1]) / 2 for i in (0, 2, 4)]
    assert all(r["lr"] == 0.05 and r["global_batch_size"] == 4 for r in records)
    # ... and saves every --save-interval, the end included, with the samples and the rate.
    assert saves == [(3, 12, 0.05, 12), (6, 24, 0.05, 24)]  # no skipped step: the schedule counts every sample


def test_the_cadence_gives_a_diverged_step_its_history(tmp_path, single_process):
    settings = resolve_run_settings(parse_config(SMALL), 128, 1, 1, "cpu")
    step = PlainSGDStep(settings, diverge_at=5)
    with pytest.raises(TrainingDiverged) as caught:
        run_cadence(tmp_path, single_process, step, settings)
    history = caught.value.history
    assert history.start_iteration == 0 and history.saved_iterations == [3]
    assert len(history.losses) == 5 and history.losses[-1] != history.losses[-1]  # the diverging NaN last


def test_the_cadence_function_is_short():
    assert len(inspect.getsource(loop.train).splitlines()) < 60
