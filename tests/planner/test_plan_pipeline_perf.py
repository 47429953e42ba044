"""The performance model with pipeline stages (planner/perf_model.py): a stage computes its own layers, the bubble
adds (P - 1) / vp micro-batches of the stage's forward and backward (Narayanan et al. 2021, "Efficient Large-Scale
Language Model Training on GPU Clusters Using Megatron-LM", section 2.2: the bubble is (p - 1) / m of the ideal
time for 1F1B and (p - 1) / (v m) interleaved), and the point-to-point bytes the dry run counted go at the link
between neighbouring stages. Before, a plan with stages had neither term and computed the whole model's layers."""

import dataclasses

import pytest

from arguments.parser import parse_config
from planner.dry_run import Cluster, dry_run
from planner.perf_model import Constants, load_hardware, predict

MODEL = ["--num-layers", "4", "--hidden-size", "64", "--num-attention-heads", "4", "--seq-length", "32",
         "--max-position-embeddings", "32", "--micro-batch-size", "2", "--global-batch-size", "8",
         "--vocab-size", "1000"]
CONSTANTS = Constants(0.5, 10.0, 0.0, "test")


def predicted(rank, *flags, world=2):
    config = parse_config([*MODEL, *flags])
    plan = dry_run(config, Cluster(world, 8, None, "cuda"), 1000, rank)
    hardware = dataclasses.replace(load_hardware("h100-sxm"), gpus_per_node=8)
    return plan, predict(plan, config, 1000, world, hardware, CONSTANTS), hardware


@pytest.mark.parametrize("flags, chunks", [((), 1), (("--num-layers-per-virtual-pipeline-stage", "1"), 2)])
def test_a_stage_pays_the_bubble_and_its_sends(flags, chunks):
    plan, stage, h100 = predicted(0, "--pipeline-model-parallel-size", "2", *flags)
    micro_batches = plan.pipeline.micro_batches
    assert micro_batches == 4
    # compute is M x (forward + backward) of the stage; the bubble (P - 1) / vp of one micro-batch's
    assert stage.terms["pipeline_bubble"] == pytest.approx(stage.terms["compute"] / micro_batches * 1 / chunks)
    # this rank's sends, one message a call, inside the node (TP x DP = 1 of its 8 GPUs)
    sent, message = plan.pipeline.p2p_sent_bytes, plan.pipeline.p2p_message_bytes
    assert stage.terms["pipeline_p2p"] == pytest.approx(sent / h100.intra_node_bandwidth
                                                        + sent // message * h100.intra_node_latency_s)
    # the tied embedding's gradient, summed with the last stage's copy in one all-reduce (the comm_bytes the dry run
    # counted on the embedding group, as a live rank counts them), inside the node too
    summed = plan.comm_bytes["embedding"]["all_reduce"]
    assert summed > 0
    assert stage.terms["pipeline_embedding"] == pytest.approx(summed / h100.intra_node_bandwidth
                                                              + h100.intra_node_latency_s)
    assert stage.iteration_s == pytest.approx(sum(stage.terms.values()))


def test_a_stage_computes_its_own_layers():
    _, whole, _ = predicted(0, world=1)
    _, first, _ = predicted(0, "--pipeline-model-parallel-size", "2")
    _, last, _ = predicted(1, "--pipeline-model-parallel-size", "2")
    assert "pipeline_bubble" not in whole.terms  # no stages, no pipeline terms: the plain run's output is unchanged
    # the two stages split the blocks; the logits are the last stage's
    assert first.terms["compute"] < last.terms["compute"] < whole.terms["compute"]
    assert first.terms["compute"] + last.terms["compute"] == pytest.approx(whole.terms["compute"], rel=0.02)
