"""bf16 Adam moments (--use-precision-aware-optimizer --exp-avg-dtype bf16 --exp-avg-sq-dtype bf16,
zero/precision_aware.py) in checkpoints: saved as bf16 (exact: they are bf16) and resumed exactly; moments of another
dtype than the run's are converted as they load, with a note.

Megatron-LM converts too: its distributed optimizer saves the precision-aware optimizer's states unscaled in fp32
(megatron/core/optimizer/distrib_optimizer.py, _get_main_param_and_optimizer_states: TransformerEngine's
FusedAdam.get_unscaled_state) and stores a loaded state in the run's dtype (_set_main_param_and_optimizer_states:
set_scaled_state), so a checkpoint loads whatever --exp-avg-dtype either run has."""

import dataclasses

import pytest
import torch
from safetensors import safe_open

from arguments.config import OptimizerConfig, PretrainConfig
from checkpoint.ours.sharded import load_checkpoint, save_checkpoint
from parallel.state import ParallelState
from tests.checkpoint.test_checkpoint_interface import InterfaceOnlyOptimizer, tiny_model
from tests.reliability_helpers import TINY, straight_and_resumed

BF16_MOMENTS = ["--use-precision-aware-optimizer", "--exp-avg-dtype", "bf16", "--exp-avg-sq-dtype", "bf16"]
MOMENTS = ("exp_avg", "exp_avg_sq")


@pytest.mark.parametrize("stage", ["1", "3"])
def test_a_bf16_moment_run_saved_and_resumed_continues_exactly(corpus_cache_300, tmp_path, stage):
    """Saved at iteration 2 of 4, resumed: every loss and gradient norm equals the straight run's; the optimizer
    file holds the moments as BF16 (the master F32)."""
    argv = TINY + BF16_MOMENTS + ["--train-iters", "4", "--data-cache-dir", corpus_cache_300, "--zero-stage", stage]
    straight, split, save = straight_and_resumed(argv, tmp_path, exit_interval=2)
    assert len(straight) == 4
    assert [(r["iteration"], r["loss"], r["grad_norm"]) for r in straight] == \
           [(r["iteration"], r["loss"], r["grad_norm"]) for r in split]
    [optimizer_file] = (save / "iter_0000002").glob("optim_*.safetensors")
    with safe_open(str(optimizer_file), "pt") as reader:
        dtypes = {key: reader.get_tensor(key).dtype for key in reader.keys()}
        assert reader.get_tensor("exp_avg").float().abs().sum() > 0
    assert dtypes == {"master": torch.float32, "exp_avg": torch.bfloat16, "exp_avg_sq": torch.bfloat16}


def interface_optimizer(model, seed, dtype):
    """The checkpoint-interface-only optimizer of tests/checkpoint/test_checkpoint_interface.py, its moments in
    `dtype` (random values rounded to it)."""
    optimizer = InterfaceOnlyOptimizer(model, seed)
    for key in MOMENTS:
        optimizer._tensors[key] = optimizer._tensors[key].to(dtype)
    return optimizer


def config_with(dtype: str) -> PretrainConfig:
    config = PretrainConfig()
    return dataclasses.replace(config, optimizer=OptimizerConfig.of(
        exp_avg_dtype=dtype, exp_avg_sq_dtype=dtype))


@pytest.mark.parametrize("saved, loaded", [("bf16", "bf16"), ("fp32", "bf16"), ("bf16", "fp32")])
def test_moments_load_converted_into_the_runs_dtype_with_a_note(tmp_path, capsys, saved, loaded):
    """A checkpoint's moments load into the run's dtype: bf16 into bf16 as saved, fp32 into bf16 rounded to
    nearest even (what .to(torch.bfloat16) gives), bf16 into fp32 exactly; a note says so when the dtypes differ.
    The saved file passes the integrity check (load_checkpoint verifies every file first)."""
    dtypes = {"bf16": torch.bfloat16, "fp32": torch.float32}
    model = tiny_model(1)
    source = interface_optimizer(model, 1, dtypes[saved])
    save_checkpoint(tmp_path / "ckpt", 3, 12, model, source, None, config_with(saved),
                    ParallelState(device=torch.device("cpu")))
    fresh_model = tiny_model(2)
    fresh = interface_optimizer(fresh_model, 2, dtypes[loaded])
    capsys.readouterr()
    load_checkpoint(tmp_path / "ckpt", fresh_model, fresh, None, ParallelState(device=torch.device("cpu")),
                    load_rng=False)
    out = capsys.readouterr().out
    for key in MOMENTS:
        assert fresh._tensors[key].dtype == dtypes[loaded]
        assert torch.equal(fresh._tensors[key], source._tensors[key].to(dtypes[loaded])), key
    if saved == loaded:
        assert "converted" not in out
    else:
        rounding = "; to bf16 rounds to nearest even" if loaded == "bf16" else ""
        assert f"converted (exp_avg {saved} -> {loaded}, exp_avg_sq {saved} -> {loaded}{rounding})" in out
