"""Random states at a resume (checkpoint/random_states.py): at another TP or pipeline size none is restored and the
streams start from the seed, as Megatron-LM's load_checkpoint ignores the RNG state at a (TP, PP) mismatch
(megatron/training/checkpointing.py: `if ckpt_tp_pp == run_tp_pp and ...: ... else: ignore_rng_state = True`, "RNG
state will be ignored"). Each stage draws from its own streams (parallel/random.py: --seed + 100 x the pipeline rank),
so restoring one stage's on every stage of another size would repeat its masks there."""

from pathlib import Path

import pytest
import torch

from checkpoint.random_states import restore_random_states
from parallel.mesh import ParallelDims
from parallel.random import TensorParallelRNG
from parallel.state import ParallelState


def _metadata(tp: int, pp: int) -> dict:
    stages = [{"parameters": [], "files": [f"rng_pp{stage:03d}_tp{rank:02d}_dp000.safetensors" for rank in range(tp)]}
              for stage in range(pp)]
    files = [[rank, 0, name] for stage in stages for rank, name in enumerate(stage["files"])]
    return {"tensor_parallel_size": tp, "rng_files": files, **({"pipeline_stages": stages} if pp > 1 else {})}


@pytest.mark.parametrize("saved, run", [((1, 2), (1, 1)), ((1, 2), (1, 4)), ((1, 1), (1, 2)), ((2, 1), (1, 1))],
                         ids=["pp2-to-pp1", "pp2-to-pp4", "pp1-to-pp2", "tp2-to-tp1"])
def test_at_another_tp_or_pipeline_size_the_streams_start_from_the_seed(saved, run):
    (saved_tp, saved_pp), (tp, pp) = saved, run
    state = ParallelState(device=torch.device("cpu"), dims=ParallelDims.of_rank(0, {"tp": tp, "pp": pp}))
    rng = TensorParallelRNG(5, state)
    before = rng.get_states()
    lines = []
    # the files are not there: a load that tried to read one would fail
    restore_random_states(Path("/nonexistent/iter_0000010"), _metadata(saved_tp, saved_pp), rng, state,
                          log=lambda line, **_: lines.append(line))
    after = rng.get_states()
    assert all(torch.equal(before[key], after[key]) for key in ("default_cpu", "tensor_parallel_cpu"))
    flag = "--tensor-model-parallel-size" if saved_tp != tp else "--pipeline-model-parallel-size"
    (line,) = lines
    assert f"saved at {flag} {saved_tp if saved_tp != tp else saved_pp}, this run has {tp if saved_tp != tp else pp}" \
        in line and "start from --seed" in line, line
