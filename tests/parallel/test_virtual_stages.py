"""The virtual-stage arithmetic, written once (parallel/pipeline_schedules.py VirtualStages) and read by the
layer split (gpt/stage_layers.py), the pipeline step (training/pipeline_step.py) and the planner.

Megatron-Core numbers model chunk vp_rank of pipeline rank pp_rank as virtual stage vp_rank x PP + pp_rank: its
layer offset is (vp_rank x PP + pp_rank) x layers per chunk (megatron/core/transformer/transformer_layer.py,
get_transformer_layer_offset), and the interleaved schedule sends each chunk's output to the next virtual stage
(forward_backward_pipelining_with_interleaving, megatron/core/pipeline_parallel/schedules.py).
"""

from __future__ import annotations

import pytest

from gpt.stage_layers import stage_layers
from parallel.pipeline_schedules import VirtualStages


@pytest.mark.parametrize("pp, chunks", ((2, 1), (2, 2), (4, 3)))
def test_the_ranks_virtual_stages_cover_the_model_once_in_megatrons_order(pp, chunks):
    ring = [VirtualStages(pp, rank, chunks) for rank in range(pp)]
    every = sorted(stage for stages in ring for stage in stages.all())
    assert every == list(range(chunks * pp))
    if chunks > 1:  # the second chunks follow the first ones round the ring
        assert [stages.of(1) for stages in ring] == [pp + rank for rank in range(pp)]
    assert sum(stages.starts_model(chunk) for stages in ring for chunk in range(chunks)) == 1
    assert [rank for rank, stages in enumerate(ring) if stages.ends_model(chunks - 1)] == [pp - 1]


@pytest.mark.parametrize("pp, chunks, per_chunk", ((2, 2, 1), (2, 2, 3), (4, 2, 2)))
def test_each_chunks_layers_start_at_its_virtual_stage_times_the_chunk_size(pp, chunks, per_chunk):
    layers = pp * chunks * per_chunk
    for rank in range(pp):
        stage = stage_layers(layers, pp, rank, per_chunk)
        assert [chunk[0] for chunk in stage.chunks] == \
            [VirtualStages(pp, rank, chunks).of(chunk) * per_chunk for chunk in range(chunks)]
