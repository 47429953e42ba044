"""Megatron's other pipeline split and schedule flags train with the one-stage losses and gradient norms (fp32 on
gloo, PP 2, one 2-rank launch running two grids in turn):

- --account-for-embedding-in-pipeline-split over 5 layers: the embedding counts as a layer, so the 6 slots split
  3 and 3 and the first stage builds layers 0-1, the second 2-4 (Megatron-Core's get_num_layers_to_build,
  megatron/core/transformer/transformer_block.py; gpt/stage_layers.py's test checks the split itself);
- both --account-for-* flags over 6 layers with --num-virtual-stages-per-pipeline-rank 2 (2 chunks a stage: stage 0
  [0] and [3, 4], stage 1 [1, 2] and [5]) and --microbatch-group-size-per-virtual-pipeline-stage 3 over the 8
  micro-batches (groups 0-2, 3-5, 6-7 run through each chunk in turn: Megatron-Core's get_schedule_table,
  megatron/core/pipeline_parallel/schedules.py). The group size changes only the order of the chunk-forwards
  and backwards, so the losses are the default group's, the one-stage run's;
- an uneven first stage interleaved: 6 layers, --decoder-first-pipeline-num-layers 2 with
  --num-virtual-stages-per-pipeline-rank 2 (stage 0 [0] and [3], stage 1 [1, 2] and [4, 5]: each stage's layers
  split over its chunks, Megatron-Core's get_transformer_layer_offset).

Not bitwise, as tests/training/test_pipeline_training.py explains: 1e-6 relative. The same runs show that a sent
output is not kept for its backward (training/pipeline_step.py's SentOutput, as Megatron-Core's
deallocate_output_tensor): when a gradient is received, no activation sent on is still referenced by the step.
"""

from __future__ import annotations

import weakref

import pytest

from tests.distributed import free_port, run_distributed
from tests.training.test_pipeline_training import one_stage_reference, train_configurations

EMBEDDING = ["--num-layers", "5", "--pipeline-model-parallel-size", "2", "--account-for-embedding-in-pipeline-split"]
BOTH_INTERLEAVED_GROUPED = ["--num-layers", "6", "--pipeline-model-parallel-size", "2",
                            "--account-for-embedding-in-pipeline-split", "--account-for-loss-in-pipeline-split",
                            "--num-virtual-stages-per-pipeline-rank", "2",
                            "--microbatch-group-size-per-virtual-pipeline-stage", "3"]
UNEVEN_INTERLEAVED = ["--num-layers", "6", "--pipeline-model-parallel-size", "2", "--decoder-first-pipeline-num-layers",
                      "2", "--num-virtual-stages-per-pipeline-rank", "2"]
CONFIGS = {"embedding-counted": (EMBEDDING, 1), "both-counted-interleaved-group-3": (BOTH_INTERLEAVED_GROUPED, 1),
           "uneven-first-interleaved": (UNEVEN_INTERLEAVED, 1)}


def _train_watching_sent_outputs(rank: int, world_size: int, configs: dict, ports: list[int]):
    """train_configurations, and at each gradient received, how many outputs sent on are still referenced."""
    from parallel.p2p import ACTIVATION, GRADIENT, PipelineP2P

    sent, referenced = [], []
    send, receive = PipelineP2P.send, PipelineP2P.receive

    def watched_send(self, tensor, peer, tag):
        if tag == ACTIVATION:
            sent.append(weakref.ref(tensor))
        return send(self, tensor, peer, tag)

    def watched_receive(self, shape, dtype, peer, tag):
        if tag == GRADIENT:
            referenced.append(sum(output() is not None for output in sent))
        return receive(self, shape, dtype, peer, tag)

    PipelineP2P.send, PipelineP2P.receive = watched_send, watched_receive
    return train_configurations(rank, world_size, configs, ports), referenced


@pytest.mark.slow
def test_split_and_group_flags_train_with_the_one_stage_losses_and_norms():
    six_layers = one_stage_reference(("--num-layers", "6"))
    references = {"embedding-counted": one_stage_reference(("--num-layers", "5")),
                  "both-counted-interleaved-group-3": six_layers, "uneven-first-interleaved": six_layers}
    per_rank, referenced = zip(*run_distributed(_train_watching_sent_outputs, 2, CONFIGS,
                                                [free_port() for _ in CONFIGS], timeout=300))
    assert len(referenced[0]) > 0 and set(referenced[0]) == {0}, referenced[0]  # the first stage receives gradients
    for name in CONFIGS:
        assert per_rank[0][name].outcomes == per_rank[1][name].outcomes, name
        losses, norms = zip(*per_rank[0][name].outcomes)
        single = references[name]
        assert single[-1][0] < single[0][0]  # it trains
        assert list(losses) == pytest.approx([loss for loss, _ in single], rel=1e-6, abs=0), name
        assert list(norms) == pytest.approx([norm for _, norm in single], rel=1e-6, abs=0), name
