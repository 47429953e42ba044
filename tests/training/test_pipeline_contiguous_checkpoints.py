"""ZeRO-R's contiguous checkpoints (M_D, --contiguous-checkpointing) under every pipeline schedule (issue 77, item 3).

The buffer holds a slot set for each micro-batch the schedule keeps in flight (zero/checkpoint_buffer.py). With one
slot set, 1F1B's warm-up forwards overwrote the checkpointed inputs of the micro-batches awaiting their backward and
the recompute rebuilt their blocks from another micro-batch's input: iteration 1's loss agreed, its grad norm did not
(3.6e-4 off), and the losses drifted. Here PP 2 under 1F1B, interleaved 1F1B (2 chunks a stage) and a custom
--pipeline-model-parallel-layout with an empty chunk, each with and without M_D, in ONE 2-rank launch: the
contiguous run equals the checkpointed run without it bit for bit (the same values, copied into other memory), and
both equal the one-stage run to 1e-6 (tests/training/test_pipeline_training.py says why not bitwise). Each rank's
buffer is the planner's figure for that rank, and the slot sets are Megatron-Core's count of what its schedule
keeps in flight."""

from __future__ import annotations

import pytest

from tests.distributed import free_port, run_distributed
from tests.training.test_pipeline_training import MODEL, VOCAB, one_stage_reference, train_configurations

CHECKPOINTED = ["--pipeline-model-parallel-size", "2", "--checkpoint-activations"]
SCHEDULES = {"1f1b": [], "interleaved": ["--num-layers-per-virtual-pipeline-stage", "1"],
             # rank 0 runs the embedding and a layer, then a layer; rank 1 two layers, then only the loss
             "layout": ["--pipeline-model-parallel-layout", "Et|tt|t|L"]}
SLOT = 2 * 16 * 32 * 4  # one checkpointed input: [micro batch, sequence, hidden] fp32
# Slot sets (of 2 checkpoints: a micro-batch's on a stage of 2 layers) per rank, from Megatron-Core's schedules
# (megatron/core/pipeline_parallel/schedules.py) at 8 micro-batches: 1F1B keeps min(P - s, M) micro-batches in flight
# on stage s; interleaved 1F1B (P 2, 2 chunks, groups of P) runs (P - s - 1) x 2 + (vp - 1) x P warm-up chunk
# forwards and one more before its first backward: 5 on rank 0 and 3 on rank 1, one checkpoint each, 3 and 2 sets;
# the layout's rank 0 is the interleaved one's, its rank 1 makes both its checkpoints in chunk 0 and reaches the
# first backward of a chunk 0 with 3 micro-batches' chunk 0 awaiting theirs (the chunk 1 backwards free nothing).
SLOT_SETS = {"1f1b": (2, 1), "interleaved": (3, 2), "layout": (3, 3)}


@pytest.mark.slow
def test_contiguous_checkpoints_hold_every_micro_batch_in_flight_under_each_schedule():
    from arguments.parser import parse_config
    from planner.dry_run import Cluster, dry_run

    configs = {f"{name}{contiguous}": ([*CHECKPOINTED, *flags, *(["--contiguous-checkpointing"] if contiguous else [])],
                                       1)
               for name, flags in SCHEDULES.items() for contiguous in ("", "-contiguous")}
    per_rank = run_distributed(train_configurations, 2, configs, [free_port() for _ in configs], timeout=600)
    reference = one_stage_reference()
    for name, flags in SCHEDULES.items():
        for rank, results in enumerate(per_rank):
            plain, contiguous = results[name], results[f"{name}-contiguous"]
            assert contiguous.outcomes == plain.outcomes, (name, rank)  # bit for bit
            assert [value for outcome in plain.outcomes for value in outcome] == \
                pytest.approx([value for outcome in reference for value in outcome], rel=1e-6, abs=0), (name, rank)
            planned = dry_run(parse_config([*MODEL, *configs[f"{name}-contiguous"][0]]), Cluster(2, 2, None, "cpu"),
                              VOCAB, rank).contiguous_checkpoint_buffer_bytes
            assert contiguous.contiguous_buffer_bytes == planned["device"] == SLOT_SETS[name][rank] * 2 * SLOT, \
                (name, rank)


def test_a_slot_set_too_small_for_a_stages_chunks_is_refused_in_one_line():
    """A group never spans two model chunks, so a stage can make more checkpoints than the whole model's groups:
    4 layers in groups of 4 make 1, but each rank's two 1-layer chunks make 2 (the depth check passes 1)."""
    from arguments.parser import parse_config
    from base.errors import ConfigError
    from planner.dry_run import Cluster, dry_run

    config = parse_config([*MODEL, *CHECKPOINTED, *SCHEDULES["interleaved"], "--contiguous-checkpointing",
                           "--checkpoint-num-layers", "4", "--number-checkpoints", "1"])
    with pytest.raises(ConfigError, match=r"--number-checkpoints 1 is fewer than the 2 checkpoints a micro-batch's "
                                          r"forward makes on this pipeline stage \(model chunks of 1, 1 layers"):
        dry_run(config, Cluster(2, 2, None, "cpu"), VOCAB, 0)
