"""Which transformer layers a pipeline stage holds, as Megatron assigns them.

Without virtual stages, stage s of pp holds the contiguous layers [s * L / pp, (s + 1) * L / pp); Megatron
refuses a split that is not even unless the first/last stage sizes are given (megatron/training/arguments.py:
"number of layers should be divisible by the pipeline parallel size"). With
--num-layers-per-virtual-pipeline-stage L_v, each stage holds vp = L / (pp x L_v) model chunks, and chunk c of
stage s holds layers (c x pp + s) x L_v ... + L_v (Megatron-Core's get_transformer_layer_offset:
vp_rank x (L / vp) + pp_rank x L_v), so a micro-batch visits the stages vp times round the ring.

The embedding lives on the first stage, the final norm and the output layer on the last; layers keep their
global numbers (parameter names), so a stage's weights are drawn exactly as the one-stage model's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from base.errors import ConfigError


@dataclass(frozen=True)
class StageLayers:
    chunks: tuple[tuple[int, ...], ...]  # the global layer ids of each model chunk on this stage
    first: bool  # holds the embedding (chunk 0 starts the model)
    last: bool   # holds the final norm and the output layer (its last chunk ends the model)

    @property
    def layer_ids(self) -> tuple[int, ...]:
        return tuple(layer for chunk in self.chunks for layer in chunk)


def whole_model(num_layers: int) -> StageLayers:
    return StageLayers((tuple(range(num_layers)),), first=True, last=True)


def stage_layers(num_layers: int, pp_size: int, pp_rank: int,
                 layers_per_virtual_stage: Optional[int] = None) -> StageLayers:
    """The layers of stage `pp_rank` of `pp_size`; ConfigError naming the flag for a split Megatron refuses."""
    if num_layers % pp_size:
        raise ConfigError(f"--num-layers {num_layers} is not divisible by --pipeline-model-parallel-size "
                          f"{pp_size}: Megatron splits the layers evenly over the stages; pick a stage count that "
                          f"divides the layers")
    per_stage = num_layers // pp_size
    if layers_per_virtual_stage is None:
        return StageLayers((tuple(range(pp_rank * per_stage, (pp_rank + 1) * per_stage)),),
                           first=pp_rank == 0, last=pp_rank == pp_size - 1)
    if layers_per_virtual_stage < 1 or per_stage % layers_per_virtual_stage:
        raise ConfigError(f"--num-layers-per-virtual-pipeline-stage {layers_per_virtual_stage} does not divide the "
                          f"{per_stage} layers of each of the {pp_size} stages: pick a divisor of {per_stage}")
    chunks = per_stage // layers_per_virtual_stage
    return StageLayers(tuple(tuple(range((chunk * pp_size + pp_rank) * layers_per_virtual_stage,
                                         (chunk * pp_size + pp_rank + 1) * layers_per_virtual_stage))
                             for chunk in range(chunks)),
                       first=pp_rank == 0, last=pp_rank == pp_size - 1)
