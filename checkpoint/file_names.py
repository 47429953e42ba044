"""The names of a rank's files in a checkpoint, following Megatron-LM's get_checkpoint_name: a pipeline rank only with
stages, an expert rank only with expert parallelism.
"""

from __future__ import annotations

from typing import Optional

# A constant here so that naming it does not import DCP (and DTensor, sympy).
DCP_METADATA_FILE = ".metadata"


def _stage_prefix(pipeline_rank: Optional[int]) -> str:
    return "" if pipeline_rank is None else f"pp{pipeline_rank:03d}_"


def model_file(tensor_parallel_rank: int, pipeline_rank: Optional[int] = None) -> str:
    return f"model_{_stage_prefix(pipeline_rank)}tp{tensor_parallel_rank:02d}.safetensors"


def expert_model_file(tensor_parallel_rank: int, expert_parallel_rank: int, pipeline_rank: Optional[int] = None,
                      expert_tensor_rank: Optional[int] = None) -> str:
    """One expert-parallel rank's experts; `expert_tensor_rank` tells apart writers that share a TP rank when the expert
    TP size exceeds the TP size."""
    etp = "" if expert_tensor_rank is None else f"_etp{expert_tensor_rank:02d}"
    return (f"model_{_stage_prefix(pipeline_rank)}tp{tensor_parallel_rank:02d}_ep{expert_parallel_rank:03d}{etp}"
            ".safetensors")


def optimizer_file(tensor_parallel_rank: int, data_parallel_rank: int, pipeline_rank: Optional[int] = None) -> str:
    return f"optim_{_stage_prefix(pipeline_rank)}tp{tensor_parallel_rank:02d}_dp{data_parallel_rank:03d}.safetensors"


def rng_file(tensor_parallel_rank: int, data_parallel_rank: int, pipeline_rank: Optional[int] = None) -> str:
    return f"rng_{_stage_prefix(pipeline_rank)}tp{tensor_parallel_rank:02d}_dp{data_parallel_rank:03d}.safetensors"
