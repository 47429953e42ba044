"""The train step's observer (training/step_observer.py, issue 50 item 2): a live step tells it each micro-batch,
each forward and backward, and the end of the passes, and lets it pick the micro-batches and take the optimizer's
step; with the default, NO_OBSERVER, the step is what it was. The planner's dry run is the observer that uses the
choices (tests/planner/test_plan_drives_the_step.py); here a live single-process step shows the order it is told.
"""

from __future__ import annotations

import contextlib

import pytest
import torch

from arguments.parser import parse_config
from parallel.state import destroy, initialize
from training.build import build
from training.run_settings import resolve_run_settings
from training.step_observer import NO_OBSERVER, NoObserver
from training.train_step import DataParallelTrainStep

SMALL = ["--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "2", "--seq-length", "16",
         "--max-position-embeddings", "16", "--micro-batch-size", "2", "--global-batch-size", "6",
         "--tokenizer-vocab-size", "512", "--hidden-dropout", "0", "--attention-dropout", "0", "--seed", "3"]


class Recorder(NoObserver):
    def __init__(self, run=None) -> None:
        self.events: list = []
        self.run = run

    def micro_batches(self, accumulation_steps):
        self.events.append(("micro_batches", accumulation_steps))
        return self.run if self.run is not None else range(accumulation_steps)

    @contextlib.contextmanager
    def phase(self, name):
        self.events.append((name, "start"))
        yield
        self.events.append((name, "end"))

    def micro_batch_start(self, micro_batch):
        self.events.append(("start", micro_batch))

    def micro_batch_end(self, micro_batch):
        self.events.append(("end", micro_batch))

    def passes_end(self):
        self.events.append(("passes_end",))

    def optimizer_step(self, optimizer):
        self.events.append(("optimizer_step",))
        return optimizer.step()


@pytest.fixture
def single_process():
    state = initialize("cpu", 1)
    yield state
    destroy(state)


def batches(generator):
    while True:
        yield {"tokens": torch.randint(0, 512, (2, 17), generator=generator)}


def one_step(state, observer):
    settings = resolve_run_settings(parse_config(SMALL), 512, 1, 1, "cpu")
    built = build(settings, state, dropout_rng=True, torch_compile=False)
    feed = batches(torch.Generator().manual_seed(0))
    step = DataParallelTrainStep(built.model, built.zero, feed, settings, state, built.activations, observer=observer)
    outcome = step(1, 0, measure_activations=False)
    return outcome, next(feed)["tokens"]


def test_a_live_step_tells_its_observer_each_micro_batch_and_phase_in_order(single_process):
    recorder = Recorder()
    outcome, _ = one_step(single_process, recorder)
    per_micro_batch = [[("start", m), ("forward", "start"), ("forward", "end"), ("backward", "start"),
                        ("backward", "end"), ("end", m)] for m in range(3)]
    assert recorder.events == [("micro_batches", 3), *sum(per_micro_batch, []), ("passes_end",), ("optimizer_step",)]
    # the observer that only watches changes nothing: the same loss and norm as the default's, bit for bit
    default, _ = one_step(single_process, NO_OBSERVER)
    assert (outcome.loss, outcome.grad_norm) == (default.loss, default.grad_norm)


def test_the_observer_chooses_the_micro_batches_that_run(single_process):
    # the first and the last of 3, as the planner does: two batches are read, and the loss divides by 3 still
    recorder = Recorder(run=[0, 2])
    _, next_tokens = one_step(single_process, recorder)
    assert [event for event in recorder.events if event[0] == "start"] == [("start", 0), ("start", 2)]
    generator = torch.Generator().manual_seed(0)
    for _ in range(2):
        torch.randint(0, 512, (2, 17), generator=generator)
    assert torch.equal(next_tokens, torch.randint(0, 512, (2, 17), generator=generator))
