"""Issue 23, point 1: stage 3's gathered parameters are a budget, not a hope.

The prefetch window is counted ahead of the chunk in use, chunks already gathered or in flight
included. Before, each forward hook skipped those and started a fresh window's worth on top, so with a
4-block window about 19 of 24 blocks were gathered at once. The dry run drives the same gatherer as a
live run (zero/stage3.py), so its peak of live gathered elements is the live run's."""

import pytest

from arguments.parser import parse_config
from planner.dry_run import Cluster, dry_run
from zero.flat_buffer import DEFAULT_ALIGNMENT

LAYERS, HIDDEN = 24, 64
BLOCK = 12 * HIDDEN * HIDDEN + 13 * HIDDEN  # one block's parameters (QKV, proj, two MLP layers, biases, 2 LNs)
CHUNK = -(-BLOCK // (2 * DEFAULT_ALIGNMENT)) * 2 * DEFAULT_ALIGNMENT  # a block's chunk, padded for 2 ranks


def plan(window_blocks: int):
    config = parse_config(["--num-layers", str(LAYERS), "--hidden-size", str(HIDDEN), "--num-attention-heads", "4",
                           "--seq-length", "32", "--max-position-embeddings", "32", "--zero-stage", "3",
                           "--micro-batch-size", "2", "--global-batch-size", "4",
                           "--stage3-prefetch-bucket-size", str(int(window_blocks * BLOCK)),
                           "--stage3-param-persistence-threshold", "0"])
    return dry_run(config, Cluster(2, 2, device_type="cpu"), 1000)


@pytest.mark.parametrize("window_blocks", [0, 1, 2, 4])
def test_live_gathered_parameters_stay_within_the_block_in_use_plus_the_window(window_blocks):
    result, serial = plan(window_blocks), plan(0)
    live_elements = result.stage3_live_chunk_bytes // 4  # fp32
    root = serial.stage3_live_chunk_bytes // 4 - CHUNK  # what the window-0 peak holds beside one block
    # whole chunks that fit in the window, and at least one when the window is not empty
    ahead = max(1, window_blocks * BLOCK // CHUNK) if window_blocks else 0
    assert live_elements == root + (1 + ahead) * CHUNK, (live_elements / CHUNK, window_blocks)
    # prefetching moves gathers earlier; it never adds any
    assert result.comm_bytes == serial.comm_bytes


@pytest.mark.parametrize("window_blocks", [0.25, 0.5, 0.99])
def test_a_window_smaller_than_a_block_still_prefetches_the_next_block(window_blocks):
    """DeepSpeed starts the next parameter's gather whenever its prefetch budget is positive, however
    large that parameter is. Our unit is a block, so a budget under one block prefetches one block: it
    does not switch prefetching off (which cost a 2-rank 12 x 1024 stage-3 run a synchronous gather per
    block in forward and backward)."""
    result, serial, one = plan(window_blocks), plan(0), plan(1)
    assert result.stage3_live_chunk_bytes == one.stage3_live_chunk_bytes > serial.stage3_live_chunk_bytes
    assert result.comm_bytes == serial.comm_bytes
