"""--softmax-type learnable's per-head offsets in Megatron-Core's torch_dist names, both ways (issue 114 item 4).

github:NVIDIA/Megatron-LM at core_v0.19.0, megatron/core/transformer/dot_product_attention.py: under `learnable`
DotProductAttention registers `softmax_offset` [heads of this rank] (lines 126-138) and its sharded_state_dict
(lines 253-270) saves it with `{'softmax_offset': 0}`: split over TP on its head axis, under the attention's
`core_attention.` (TEDotProductAttention, extensions/transformer_engine.py line 2097, alike). Stacked over the
layers, the key is `decoder.layers.self_attention.core_attention.softmax_offset` [layers, heads]. The resume of a
save in this layout is tests/checkpoint/test_resume_own_save.py's kind-softmax-learnable (and its MLA one).
"""

from __future__ import annotations

from pathlib import Path

import torch

import pretrain_gpt
from checkpoint.format import resolve_checkpoint
from checkpoint.torch_dist.names import hybrid_megatron_placement, megatron_placement, our_placements
from tests.forked_runs import logged_iterations
from tests.reliability_helpers import run_main

KEY = "decoder.layers.self_attention.core_attention.softmax_offset"


def test_the_offsets_name_both_ways_stacked_per_layer_mla_and_hybrid():
    read = our_placements(KEY, (3, 4), gated=False)
    assert {name: (p.index, p.shape) for name, p in read.items()} == {
        f"blocks.{layer}.attention.softmax_offset": ((layer,), (4,)) for layer in range(3)}
    placement, shape = megatron_placement("blocks.2.attention.softmax_offset", (4,), num_layers=3)
    assert (placement.key, placement.index, shape) == (KEY, (2,), (3, 4))
    placement, shape = megatron_placement("blocks.2.attention.softmax_offset", (4,), num_layers=3, per_layer=True)
    assert (placement.key, shape) == ("decoder.layers.2.self_attention.core_attention.softmax_offset", (4,))
    assert set(our_placements(KEY, (3, 4), gated=False, mla=True)) == set(read)
    # HybridModel: block 1's attention is its third layer (`*-*-`)
    placement, _ = hybrid_megatron_placement("blocks.1.attention.softmax_offset", (4,), "*-*-")
    assert placement.key == "decoder.layers.2.self_attention.core_attention.softmax_offset"
    assert set(our_placements(placement.key, (4,), gated=False, hybrid_pattern="*-*-")) == {
        "blocks.1.attention.softmax_offset"}


RUN = ["--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4", "--seq-length", "16",
       "--max-position-embeddings", "16", "--micro-batch-size", "2", "--global-batch-size", "2",
       "--tokenizer-type", "NullTokenizer", "--vocab-size", "127", "--mock-data", "--device", "cpu", "--seed", "3",
       "--hidden-dropout", "0", "--attention-dropout", "0", "--eval-iters", "0", "--lr", "1e-3",
       "--softmax-type", "learnable", "--train-iters", "1", "--ckpt-format", "torch_dist"]


def _saved_offsets(folder: Path) -> torch.Tensor:
    from torch.distributed.checkpoint import FileSystemReader, load

    state = {KEY: torch.zeros(2, 4)}
    load(state, storage_reader=FileSystemReader(str(resolve_checkpoint(folder))), no_dist=True)
    return state[KEY]


def test_a_torch_dist_save_holds_the_offsets_under_megatrons_key(tmp_path: Path):
    from torch.distributed.checkpoint import FileSystemReader

    outcome = run_main(pretrain_gpt.main, [*RUN, "--save", str(tmp_path)])
    assert outcome.code == 0, outcome.err[-3000:]
    metadata = FileSystemReader(str(resolve_checkpoint(tmp_path))).read_metadata().state_dict_metadata
    assert tuple(metadata[KEY].size) == (2, 4)
    # and Adam's moments under the same name (the plain optimizer's `optimizer.state.<moment>.<key>`)
    assert {key for key in metadata if "softmax_offset" in key} == {
        KEY, *(f"optimizer.state.{moment}.{KEY}" for moment in ("exp_avg", "exp_avg_sq"))}


def test_tensor_parallel_ranks_write_their_heads_offsets_where_megatron_splits_them(tmp_path: Path):
    """TP 2: each rank's offsets are its heads' (DotProductAttention's num_attention_heads_per_partition, in head
    order), written at that rank's rows of axis 1: the same tensor a TP 1 run of the same seed writes (the offsets
    are drawn by head, so both start alike; Adam's first step moves them alike to float rounding)."""
    assert run_main(pretrain_gpt.main, [*RUN, "--save", str(tmp_path / "tp1")]).code == 0
    logged_iterations(tmp_path, "tp2", [*RUN, "--tensor-model-parallel-size", "2", "--save", str(tmp_path / "tp2")],
                      ranks=2)
    whole, split = _saved_offsets(tmp_path / "tp1"), _saved_offsets(tmp_path / "tp2")
    assert whole.abs().min() > 0
    torch.testing.assert_close(split, whole, rtol=1e-5, atol=1e-6)
