"""The dry run drives the real train steps (issue 50 item 2): planner/dry_run.py builds training/train_step.py's
DataParallelTrainStep, or training/pipeline_step.py's PipelineTrainStep, on the meta device and runs it under the
counting communicator, so a collective added to a step is in the plan with no edit in planner/.

Before, the planner ran its own copies of the steps (planner/dry_run.py's _one_iteration, planner/pipeline_plan.py's
run_pipeline_iteration), collective by collective: a collective added to a step was missing from the plan.
"""

from __future__ import annotations

import torch

from arguments.parser import parse_config
from parallel.comm import ring_bytes_sent
from planner.dry_run import Cluster, dry_run
from training.pipeline_step import PipelineTrainStep
from training.train_step import DataParallelTrainStep

MODEL = ["--num-layers", "4", "--hidden-size", "64", "--num-attention-heads", "4", "--seq-length", "32",
         "--max-position-embeddings", "32", "--micro-batch-size", "2", "--tokenizer-vocab-size", "512",
         "--hidden-dropout", "0", "--attention-dropout", "0"]
VOCAB = 512
EXTRA = 1000  # fp32 elements of the collective a test adds


def plan(rank: int, world: int, *flags: str):
    return dry_run(parse_config([*MODEL, *flags]), Cluster(world, world, None, "cuda"), VOCAB, rank)


def extra_all_reduce(step) -> None:
    state = step.state
    state.comm.all_reduce(torch.zeros(EXTRA, device=state.device), state.data_parallel_group, "dp")


def test_a_collective_added_to_the_data_parallel_step_is_in_the_plan(monkeypatch):
    # DP 2, ZeRO 1, 4 micro-batches: the plan runs two of them, the step once
    flags = ("--zero-stage", "1", "--global-batch-size", "16")
    before = plan(0, 2, *flags)
    assert before.micro_batches == 4 and before.simulated_micro_batches == 2
    forward_backward = DataParallelTrainStep.forward_backward

    def with_one_more(self, accumulation_steps, measure_activations):
        loss = forward_backward(self, accumulation_steps, measure_activations)
        extra_all_reduce(self)
        return loss

    monkeypatch.setattr(DataParallelTrainStep, "forward_backward", with_one_more)
    after = plan(0, 2, *flags)
    added = ring_bytes_sent("all_reduce", EXTRA * 4, 2)
    assert added > 0
    assert after.comm_bytes["dp"]["all_reduce"] == before.comm_bytes["dp"]["all_reduce"] + added
    assert {group: kinds for group, kinds in after.comm_bytes.items() if group != "dp"} == \
        {group: kinds for group, kinds in before.comm_bytes.items() if group != "dp"}


def test_a_collective_added_to_each_pipeline_backward_is_in_the_plan_for_every_micro_batch(monkeypatch):
    # PP 2 x DP 2, ZeRO 1, M = 64 / (2 x 2) = 16 micro-batches, of which the plan runs M' = 2 on stage 0: the
    # collective added to each backward slot is counted for all 16, those the plan ran and those it added
    flags = ("--pipeline-model-parallel-size", "2", "--zero-stage", "1", "--global-batch-size", "64")
    before = plan(0, 4, *flags)
    assert before.pipeline.micro_batches == 16 and before.pipeline.simulated_micro_batches < 16
    backward = PipelineTrainStep._backward

    def with_one_more(self, slot, received, output):
        backward(self, slot, received, output)
        extra_all_reduce(self)

    monkeypatch.setattr(PipelineTrainStep, "_backward", with_one_more)
    after = plan(0, 4, *flags)
    added = 16 * ring_bytes_sent("all_reduce", EXTRA * 4, 2)
    assert after.comm_bytes["dp"]["all_reduce"] == before.comm_bytes["dp"]["all_reduce"] + added
    assert after.comm_bytes["pp"] == before.comm_bytes["pp"]
