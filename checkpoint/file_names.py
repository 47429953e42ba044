"""The names of a rank's files in a checkpoint, as Megatron-LM names its per-rank files.

Megatron's get_checkpoint_name (megatron/training/checkpointing.py) adds the pipeline rank only when there are
stages (`mp_rank_{tp:02d}` vs `mp_rank_{tp:02d}_{pp:03d}`) and the expert rank with expert parallelism
(`_{ep:03d}`); ours follow: the model file of a TP rank, its experts' file per expert-parallel rank, the
optimizer partition of a (TP, partition) rank and the RNG states of a (TP, DP) rank, each within its stage.
What each file holds is the save plan's (checkpoint/save_plan.py); metadata.json lists the files written.
"""

from __future__ import annotations

from typing import Optional

# torch.distributed.checkpoint's index of a torch_dist folder (checkpoint/torch_dist/dcp_reader.py reads it); a constant here so
# that naming it does not import DCP (and with it DTensor and sympy: tests/test_startup.py)
DCP_METADATA_FILE = ".metadata"


def _stage_prefix(pipeline_rank: Optional[int]) -> str:
    # Megatron's get_checkpoint_name adds the pipeline rank only when there are stages
    # (mp_rank_{tp:02d} vs mp_rank_{tp:02d}_{pp:03d}): a one-stage checkpoint keeps its names.
    return "" if pipeline_rank is None else f"pp{pipeline_rank:03d}_"


def model_file(tensor_parallel_rank: int, pipeline_rank: Optional[int] = None) -> str:
    return f"model_{_stage_prefix(pipeline_rank)}tp{tensor_parallel_rank:02d}.safetensors"


def expert_model_file(tensor_parallel_rank: int, expert_parallel_rank: int, pipeline_rank: Optional[int] = None,
                      expert_tensor_rank: Optional[int] = None) -> str:
    """One expert-parallel rank's experts (Megatron's get_checkpoint_name appends the expert rank, `_{ep:03d}`).
    `expert_tensor_rank` where the expert TP size exceeds the TP size: its writers (one per ETP x EP rank) then
    share TP ranks, so the ETP rank tells their files apart (`_etp{etp:02d}`)."""
    etp = "" if expert_tensor_rank is None else f"_etp{expert_tensor_rank:02d}"
    return (f"model_{_stage_prefix(pipeline_rank)}tp{tensor_parallel_rank:02d}_ep{expert_parallel_rank:03d}{etp}"
            ".safetensors")


def optimizer_file(tensor_parallel_rank: int, data_parallel_rank: int, pipeline_rank: Optional[int] = None) -> str:
    return f"optim_{_stage_prefix(pipeline_rank)}tp{tensor_parallel_rank:02d}_dp{data_parallel_rank:03d}.safetensors"


def rng_file(tensor_parallel_rank: int, data_parallel_rank: int, pipeline_rank: Optional[int] = None) -> str:
    return f"rng_{_stage_prefix(pipeline_rank)}tp{tensor_parallel_rank:02d}_dp{data_parallel_rank:03d}.safetensors"
