"""Megatron-LM's `--recompute-method block --recompute-num-layers N` (issue 81): the first N transformer layers of each
pipeline stage's model chunk are checkpointed, one layer a checkpoint, and the rest run keeping their activations.

The spec is Megatron-Core's checkpointed_forward (github:NVIDIA/Megatron-LM megatron/core/recompute.py, called by
transformer_block.py for each model chunk with num_layers_per_pipeline_rank = len(self.layers)):

    elif self.config.recompute_method == 'block':
        for layer_idx in range(self.num_layers_per_pipeline_rank):
            use_checkpoint = (layer_idx >= recompute_skip_num_layers
                              and layer_idx < self.config.recompute_num_layers + recompute_skip_num_layers)
            chunk_runner(layer_idx, layer_idx + 1, use_checkpoint)

(recompute_skip_num_layers stays 0 but under FP8 with an input that needs no gradient). Megatron asserts nothing of N
against a stage's layers: an N of the chunk's layers or more checkpoints every one of them. Recompute changes what is
kept, never the math: a PP 2 run with block recompute logs the PP 2 run's losses and norms bitwise (fp32, gloo), and
the one-rank run's within the pipeline tests' bound (tests/training/test_pipeline_training.py says why)."""

from __future__ import annotations

import os

import pytest

from arguments.parser import parse_config
from tests.distributed import free_port, run_distributed
from tests.training.test_pipeline_training import MODEL, _train, one_stage_reference

BLOCK_1 = ["--recompute-granularity", "full", "--recompute-method", "block", "--recompute-num-layers", "1"]
STAGES = ["--pipeline-model-parallel-size", "2"]
MICRO_BATCHES, ITERATIONS = 8, 5  # MODEL's global batch 16 of micro-batches of 2, over 5 iterations


def test_block_checkpoints_the_first_layers_of_a_chunk_one_by_one_and_uniform_groups_them():
    def groups(*flags: str, layers: int = 4):
        return parse_config(["--checkpoint-activations", *flags]).activations.checkpointed_groups(layers)

    assert groups("--recompute-method", "block", "--recompute-num-layers", "1") == \
        [(0, 1, True), (1, 2, False), (2, 3, False), (3, 4, False)]
    assert groups("--recompute-method", "block", "--recompute-num-layers", "3") == \
        [(0, 1, True), (1, 2, True), (2, 3, True), (3, 4, False)]
    # more than the chunk's layers: all of them, as Megatron's `layer_idx < recompute_num_layers` gives
    assert groups("--recompute-method", "block", "--recompute-num-layers", "9") == \
        [(0, 1, True), (1, 2, True), (2, 3, True), (3, 4, True)]
    # uniform (the default): every layer, in groups of N, the last one shorter (Megatron's min(layer_idx + N, L))
    assert groups("--recompute-num-layers", "3") == [(0, 3, True), (3, 4, True)]
    config = parse_config(["--checkpoint-activations", "--recompute-method", "block", "--recompute-num-layers", "3"])
    assert config.activations.num_checkpoints(4) == 3 and config.activations.num_checkpoints(2) == 2


def test_block_takes_a_count_above_the_model_depth_as_megatron_does_and_uniform_still_refuses_it():
    """Megatron-LM's uniform would index past its layers with such a count in its 2.x code; this trainer refuses it
    for uniform (zero/config.py), and takes it for block, where it means every layer."""
    from base.errors import ConfigError

    deep = ["--num-layers", "4", "--recompute-granularity", "full", "--recompute-num-layers", "6"]
    assert parse_config([*deep, "--recompute-method", "block"]).activations.num_checkpoints(4) == 4
    with pytest.raises(ConfigError, match="--recompute-num-layers 6 is larger than --num-layers 4"):  # as typed
        parse_config([*deep, "--recompute-method", "uniform"])


def test_block_0_recomputes_no_layer_as_megatron_does_and_uniform_0_is_refused():
    """Megatron-Core's `layer_idx < recompute_num_layers` is never true for N = 0, so block 0 runs every layer keeping
    its activations: the dry run saves what no recompute saves. Its uniform groups of 0 layers never advance
    (`layer_idx += self.config.recompute_num_layers`), so uniform 0 is refused in one line."""
    from base.errors import ConfigError
    from planner.dry_run import Cluster, dry_run

    block_0 = ["--checkpoint-activations", "--recompute-method", "block", "--recompute-num-layers", "0"]
    config = parse_config([*MODEL, *block_0])
    assert config.activations.checkpointed_groups(3) == [(0, 1, False), (1, 2, False), (2, 3, False)]
    assert config.activations.num_checkpoints(3) == 0
    none, block = (dry_run(parse_config([*MODEL, *flags]), Cluster(1, 1, None, "cpu"), 128, 0) for flags in ([], block_0))
    assert block.checkpoint_bytes["device"] == 0
    assert block.saved_activation_bytes == none.saved_activation_bytes
    with pytest.raises(ConfigError, match="--recompute-num-layers must be at least 1 .*got 0$"):
        parse_config(["--checkpoint-activations", "--recompute-num-layers", "0"])


def test_the_dry_run_keeps_the_block_recomputed_layers_inputs_and_the_other_layers_activations():
    """The planner's memory is the dry run's (planner/dry_run.py drives the same checkpointing on the meta device):
    block 1 of 4 layers keeps one checkpointed input where uniform 1 keeps four, and saves more than uniform and
    less than no recompute, the three layers it does not recompute keeping their activations."""
    from planner.dry_run import Cluster, dry_run

    def plan(*flags: str):
        return dry_run(parse_config([*MODEL, *flags]), Cluster(1, 1, None, "cpu"), 128, 0)

    none, uniform = plan(), plan("--recompute-granularity", "full", "--recompute-num-layers", "1")
    block = plan(*BLOCK_1)
    assert none.checkpoint_bytes["device"] == 0
    assert block.checkpoint_bytes["device"] * 4 == uniform.checkpoint_bytes["device"] > 0
    assert uniform.saved_activation_bytes["device"] < block.saved_activation_bytes["device"] \
        < none.saved_activation_bytes["device"]


def test_the_flops_and_the_layout_model_count_the_share_block_recomputes():
    """A recompute's FLOPs are one more forward of the blocks recomputed (training/metrics.py): under block 1 of 2
    layers a stage, half of them; interleaved at one layer a chunk, all. The layout model (planner/layout_of_config.py)
    prices the same share for this trainer and for Megatron-LM, the parser taking block for both now."""
    from planner.layout_of_config import MEGATRON_LM, PRETRAIN_GPT, layout_of_config
    from planner.layout_perf import model_counts
    from training.metrics import flops_per_iteration
    from training.recompute_share import recomputed_share

    block = parse_config([*MODEL, *STAGES, *BLOCK_1])
    interleaved = parse_config([*MODEL, *STAGES, *BLOCK_1, "--num-layers-per-virtual-pipeline-stage", "1"])
    uniform = parse_config([*MODEL, *STAGES, "--recompute-granularity", "full"])
    assert [recomputed_share(c.activations, c.model, c.parallel) for c in (parse_config(MODEL), block, interleaved, uniform)] == \
        [0.0, 0.5, 1.0, 1.0]
    assert recomputed_share(block.activations, block.model, block.parallel, pipeline_rank=1) == 0.5
    model = block.model
    none, every = (flops_per_iteration(model, 16, activation_recompute=share) for share in (False, True))
    assert flops_per_iteration(model, 16, activation_recompute=recomputed_share(block.activations, block.model, block.parallel)) == pytest.approx(
        none + (every - none) / 2, rel=1e-12)
    one_stage = parse_config([*MODEL, *BLOCK_1, "--bf16"])
    for trainer in (PRETRAIN_GPT, MEGATRON_LM):
        assert layout_of_config(one_stage.model, one_stage.parallel, one_stage.training, one_stage.zero, one_stage.activations, 1, model_counts(one_stage.model, 128), trainer).recompute_fraction == 0.25


def _train_counting_block_forwards(rank: int, world_size: int, configs: dict, ports: list[int]) -> dict:
    """Each configuration trained in turn on this rank: its (loss, norm) per iteration and the forward calls of each
    of the stage's blocks, in the order the first forward called them (a checkpointed block runs again in
    backward)."""
    import torch

    from gpt.model import TransformerBlock

    results = {}
    for (name, flags), port in zip(configs.items(), ports):
        os.environ["MASTER_PORT"] = str(port)  # a fresh rendezvous for each grid
        calls: dict[int, int] = {}

        def count(module, args):
            if isinstance(module, TransformerBlock):
                calls[id(module)] = calls.get(id(module), 0) + 1

        hook = torch.nn.modules.module.register_module_forward_pre_hook(count)
        try:
            outcomes = _train(flags, 1).outcomes
        finally:
            hook.remove()
        results[name] = (outcomes, list(calls.values()))  # a dict keeps the order of first calls
    return results


@pytest.mark.slow
def test_block_recompute_at_two_stages_trains_the_losses_of_one_rank_without_recompute():
    configs = {"pp2": STAGES, "pp2-block-1": [*STAGES, *BLOCK_1]}
    per_rank = run_distributed(_train_counting_block_forwards, 2, configs, [free_port() for _ in configs],
                               timeout=300)
    plain, block = (per_rank[0][name][0] for name in configs)
    assert all(results[name][0] == per_rank[0][name][0] for results in per_rank for name in configs)
    assert block == plain  # bitwise: the recompute redoes the forward's fp32 ops with the forward's RNG
    single = one_stage_reference()
    assert [loss for loss, _ in block] == pytest.approx([loss for loss, _ in single], rel=1e-6, abs=0)
    assert [norm for _, norm in block] == pytest.approx([norm for _, norm in single], rel=1e-6, abs=0)
    # each stage holds 2 of the 4 layers: its first runs twice a micro-batch under block 1 (forward and recompute),
    # its second once, as every layer without recompute
    runs = MICRO_BATCHES * ITERATIONS
    for rank in range(2):
        assert per_rank[rank]["pp2"][1] == [runs, runs], rank
        assert per_rank[rank]["pp2-block-1"][1] == [2 * runs, runs], rank


def test_the_layout_search_refuses_block_recompute_it_cannot_price():
    """The search's memory model (planner/layout_memory.py) knows every layer recomputed or none,
    so a launch pinning block is told how to price it rather than searched as full recompute."""
    from base.errors import ConfigError
    from planner.layout_pins import pins_of

    with pytest.raises(ConfigError, match="--recompute-method block: the layout search prices the recompute of"):
        pins_of(parse_config([*MODEL, *BLOCK_1]))
    assert pins_of(parse_config([*MODEL, "--recompute-granularity", "full"])).recompute == 1.0


def test_a_run_that_does_not_fit_names_uniform_recompute_beside_block():
    """training/memory_fit.py's refusal before work names the levers: under block, recomputing every layer."""
    from training.memory_fit import _device_levers

    block, full = parse_config([*MODEL, *BLOCK_1]), parse_config([*MODEL, "--recompute-granularity", "full"])
    assert "--recompute-method uniform" in _device_levers(block.zero, block.activations)
    assert "--recompute-method uniform" not in _device_levers(full.zero, full.activations)
