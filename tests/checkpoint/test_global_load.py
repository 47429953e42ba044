"""The any-layout loader (checkpoint/global_load.py) and our format as a GlobalStateSource
(checkpoint/ours/source.py): each rank asks for exactly the global regions it owns.

- checkpoint/regions.py: a ZeRO fragment's flat stretch is cut into the boxes it is made of, and a box read back
  a contiguous stretch at a time, element for element (checked exhaustively on small shapes).
- The source reads any region of a checkpoint written before the sharding records (tests/fixtures/
  checkpoint_84ae2c6, one rank; tests/fixtures/checkpoint_54c4492_tp2_pp2, TP 2 x PP 2 x ZeRO 1 on 4 ranks, both
  written by the code of the commit their name gives): the master weights are the model files' (an independent
  reading, by the parameter table), and a region reads its bytes and no more.
- That TP 2 x PP 2 checkpoint resumes on one rank (another TP size loads online) to the losses its own 4-rank run
  logged uninterrupted (kept beside it in losses.json); the vocabulary pads to 512 rows at TP 2 and 384 at TP 1.
- Loaded at TP 2 + SP and at TP 1 x DP 2 under ZeRO 3, each rank reads at most its own shard's bytes plus 10%
  (file headers included), and its shard's bytes are what the planner's dry run states for that rank.
"""

from __future__ import annotations

import json
import math
import os
import random
import shutil
from pathlib import Path

import pytest
import torch

from checkpoint.regions import box_runs, flat_range_boxes, flat_start

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
BEFORE_MESHES = FIXTURES / "checkpoint_84ae2c6"
TP2_PP2 = FIXTURES / "checkpoint_54c4492_tp2_pp2"
# the flags of tests/fixtures/checkpoint_54c4492_tp2_pp2/losses.json's run, but its grid
FIXTURE_RUN = ["--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "2", "--seq-length", "16",
               "--max-position-embeddings", "16", "--micro-batch-size", "2", "--global-batch-size", "4",
               "--eval-iters", "0", "--log-interval", "1", "--tokenizer-vocab-size", "300", "--device", "cpu",
               "--hidden-dropout", "0", "--attention-dropout", "0", "--seed", "7", "--train-iters", "4"]


def test_a_flat_stretch_is_the_contiguous_boxes_it_is_cut_into_in_order():
    for shape in [(7,), (4, 6), (3, 4, 5), (2, 3, 1, 4), (1, 5)]:
        numel = math.prod(shape)
        index = torch.arange(numel).view(shape)
        for start in range(numel):
            for stop in range(start + 1, numel + 1):
                covered = []
                for box in flat_range_boxes(shape, start, stop):
                    elements = index[box].reshape(-1).tolist()
                    assert elements == list(range(elements[0], elements[0] + len(elements))), (shape, box)
                    assert flat_start(shape, box) == elements[0]
                    covered += elements
                assert covered == list(range(start, stop)), (shape, start, stop)
                # a few boxes, not one per row: a partial head, whole rows, a partial tail at each level
                assert len(flat_range_boxes(shape, start, stop)) <= 2 * len(shape) - 1


def test_a_box_is_read_a_contiguous_stretch_at_a_time():
    generator = random.Random(0)
    for shape in [(7,), (4, 6), (3, 4, 5), (2, 3, 1, 4)]:
        flat = torch.arange(math.prod(shape))
        for _ in range(200):
            box = tuple(slice(a, b + 1) for a, b in (sorted(generator.sample(range(size), 2)) if size > 1 else (0, 0)
                                                       for size in shape))
            out = torch.empty(math.prod(part.stop - part.start for part in box), dtype=flat.dtype)
            for start, at, length in box_runs(shape, box):
                out[at:at + length] = flat[start:start + length]
            assert torch.equal(out, flat.view(shape)[box].reshape(-1)), (shape, box)


def _middle(size: int) -> slice:
    return slice(size // 4, size - size // 4) if size > 1 else slice(0, 1)


def whole_from_model_files(iteration_dir: Path) -> dict[str, torch.Tensor]:
    """The whole weights of a checkpoint written before the records, read the way it was written: each TP rank's
    model file holds its slice of every parameter of its stage, cut along the parameter table's
    tensor_parallel_dim (an fp32 run's weights are its master weights)."""
    from safetensors.torch import load_file

    from checkpoint.format import read_metadata

    metadata = read_metadata(iteration_dir)
    pieces: dict[str, list[torch.Tensor]] = {}
    for _, name in sorted(metadata["model_files"]):  # TP rank order within each stage
        for param, tensor in load_file(str(iteration_dir / name)).items():
            pieces.setdefault(param, []).append(tensor)
    whole = {}
    for param, parts in pieces.items():
        dim = metadata["parameters"][param]["tensor_parallel_dim"]
        whole[param] = parts[0] if dim is None else torch.cat(parts, dim=dim)
    return whole


@pytest.mark.parametrize("fixture", [BEFORE_MESHES, TP2_PP2], ids=["84ae2c6", "54c4492-tp2-pp2"])
def test_any_region_of_a_checkpoint_written_before_the_records_reads_as_written(fixture):
    from checkpoint.format import read_metadata, resolve_checkpoint
    from checkpoint.ours.source import ZeroGptSource

    iteration_dir = resolve_checkpoint(fixture)
    assert read_metadata(iteration_dir)["precision"] == "fp32"
    weights = whole_from_model_files(iteration_dir)
    with ZeroGptSource(iteration_dir) as source:
        infos = source.tensors("master")
        assert {name: list(info.shape) for name, info in infos.items()} == \
            {name: entry["shape"] for name, entry in read_metadata(iteration_dir)["parameters"].items()}
        assert sorted(weights) == sorted(infos)
        for key in ("master", "exp_avg", "exp_avg_sq"):
            for name, info in infos.items():
                region = tuple(_middle(size) for size in info.shape)  # across the TP ranks' slices
                before = source.bytes_read
                read = source.read(key, name, region)
                assert source.bytes_read - before == read.numel() * read.element_size(), (key, name)
                whole = source.read(key, name, tuple(slice(0, size) for size in info.shape))
                assert torch.equal(read, whole[region]), (key, name)
                if key == "master":
                    assert torch.equal(whole, weights[name]), name


@pytest.mark.slow
def test_a_checkpoint_saved_at_tp2_by_pp2_resumes_on_one_rank_to_its_own_runs_losses(corpus_cache_300, tmp_path):
    """tests/fixtures/checkpoint_54c4492_tp2_pp2 (iteration 2 of 4) resumed at TP 1 x PP 1: iterations 3 and 4 log
    the losses the saving 4-rank run logged uninterrupted, to 1e-5 relative (fp32; the TP 2 and PP 2 sums ran in
    another order), and the load says what it read."""
    import pretrain_gpt
    from tests.reliability_helpers import metrics_records, run_main

    expected = json.loads((TP2_PP2 / "losses.json").read_text())["uninterrupted_losses"]
    checkpoint = shutil.copytree(TP2_PP2, tmp_path / "ckpt")
    outcome = run_main(pretrain_gpt.main, FIXTURE_RUN + ["--data-cache-dir", corpus_cache_300, "--load", checkpoint,
                                                         "--metrics-file", tmp_path / "resumed.jsonl"])
    assert outcome.code == 0, outcome.err[-3000:]
    assert "saved at --tensor-model-parallel-size 2, this run has 1" in outcome.out  # its RNG streams: not ours
    assert " > the load read at most " in outcome.out
    resumed = {r["iteration"]: r["loss"] for r in metrics_records(tmp_path / "resumed.jsonl") if "loss" in r}
    assert sorted(resumed) == [3, 4]
    for iteration, loss in resumed.items():
        assert loss == pytest.approx(expected[str(iteration)], rel=1e-5, abs=0), iteration


def load_at_layouts(rank: int, world_size: int, checkpoint: str, cache: str, layouts: list[list[str]],
                    ports: list[int]) -> list[tuple[int, int, int]]:
    """The checkpoint loaded through the API a run uses at each layout: (bytes read, shard bytes, the planner's
    figure for this rank) per layout."""
    from arguments.parser import parse_config
    from checkpoint.format import read_metadata, resolve_checkpoint
    from checkpoint.ours.sharded import load_checkpoint
    from parallel.state import destroy, initialize_grid
    from planner.dry_run import Cluster, dry_run
    from training.build import build
    from training.run_settings import resolve_run_settings

    vocab = read_metadata(resolve_checkpoint(checkpoint))["config"]["model"]["vocab_size"]
    results = []
    for layout, port in zip(layouts, ports):
        os.environ["MASTER_PORT"] = str(port)
        config = parse_config(FIXTURE_RUN + ["--data-cache-dir", cache, *layout])
        state = initialize_grid("cpu", config.parallel, 10)
        try:
            settings = resolve_run_settings(config, vocab, state.tensor_parallel_size, state.data_parallel_size, "cpu")
            built = build(settings, state, dropout_rng=True, torch_compile=False)
            point = load_checkpoint(checkpoint, built.model, built.zero.optimizer, built.rng, state)
            planned = dry_run(settings.config, Cluster(world_size, world_size, None, "cpu"), vocab, rank)
            results.append((point.bytes_read, point.shard_bytes, planned.checkpoint_read_bytes))
        finally:
            destroy(state)
    return results


@pytest.mark.slow
def test_each_rank_reads_its_own_shard_and_the_planner_states_it(corpus_cache_300):
    from tests.distributed import free_port, run_distributed

    layouts = [["--tensor-model-parallel-size", "2", "--sequence-parallel", "--zero-stage", "1"],
               ["--zero-stage", "3"]]
    results = run_distributed(load_at_layouts, 2, str(TP2_PP2), corpus_cache_300, layouts,
                              [free_port() for _ in layouts], timeout=600)
    for rank, per_layout in enumerate(results):
        for layout, (read, shard, planned) in zip(layouts, per_layout):
            assert shard == planned, (rank, layout)
            assert shard <= read <= 1.1 * shard, (rank, layout, read, shard)
