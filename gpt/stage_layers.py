"""Which transformer layers a pipeline stage holds, as Megatron assigns them: contiguous even splits, uneven first and
last stages, virtual stages (interleaving) and --pipeline-model-parallel-layout, with the splits Megatron refuses
refused in one line."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from base.errors import ConfigError
from parallel.pipeline_schedules import VirtualStages

# messages name both flags as --decoder-first/last-pipeline-num-layers
FIRST_STAGE_FLAG = "--decoder-first-pipeline-num-layers"
LAST_STAGE_FLAG = "--decoder-last-pipeline-num-layers"

@dataclass(frozen=True)
class StageLayers:
    chunks: tuple[tuple[int, ...], ...]  # global layer ids of each model chunk on this stage
    first: bool  # holds the embedding (chunk 0 starts the model)
    last: bool   # holds the final norm and the output layer (its last chunk ends the model)

    @property
    def layer_ids(self) -> tuple[int, ...]:
        return tuple(layer for chunk in self.chunks for layer in chunk)


def whole_model(num_layers: int) -> StageLayers:
    return StageLayers((tuple(range(num_layers)),), first=True, last=True)


def stage_sizes(num_layers: int, pp_size: int, first: Optional[int] = None, last: Optional[int] = None) -> list[int]:
    """Layers per stage: even, or with uneven first/last stages and the rest even, as Megatron-Core's
    get_num_layers_to_build."""
    if first is None and last is None:
        if num_layers % pp_size:
            raise ConfigError(f"--num-layers {num_layers} is not divisible by --pipeline-model-parallel-size "
                              f"{pp_size}: Megatron splits the layers evenly over the stages; pick a stage count "
                              f"that divides the layers, or set --decoder-first/last-pipeline-num-layers",
                              flags=("--num-layers", "--pipeline-model-parallel-size"))
        return [num_layers // pp_size] * pp_size
    for flag, value in ((FIRST_STAGE_FLAG, first), (LAST_STAGE_FLAG, last)):
        if value is not None and not 1 <= value <= num_layers:
            raise ConfigError(f"{flag} {value}: a stage holds 1 to --num-layers {num_layers} layers",
                              flags=(flag, "--num-layers"))
    middle_stages = pp_size - (first is not None) - (last is not None)
    middle_layers = num_layers - (first or 0) - (last or 0)
    if middle_stages < 0 or middle_layers < middle_stages or (middle_stages and middle_layers % middle_stages) \
            or (middle_stages == 0 and middle_layers):
        raise ConfigError(f"--decoder-first/last-pipeline-num-layers ({first}, {last}) leave {middle_layers} of "
                          f"--num-layers {num_layers} for {max(middle_stages, 0)} other stages of "
                          f"--pipeline-model-parallel-size {pp_size}: Megatron splits the rest evenly (at least one "
                          f"layer each); pick sizes that leave a multiple of the other stages",
                          flags=(FIRST_STAGE_FLAG, LAST_STAGE_FLAG, "--num-layers", "--pipeline-model-parallel-size"))
    per_middle = middle_layers // middle_stages if middle_stages else 0
    sizes = [per_middle] * pp_size
    if first is not None:
        sizes[0] = first
    if last is not None:
        sizes[-1] = last
    return sizes


EMBEDDING_FLAG, LOSS_FLAG = "--account-for-embedding-in-pipeline-split", "--account-for-loss-in-pipeline-split"
VIRTUAL_LAYERS_FLAG, VIRTUAL_STAGES_FLAG = ("--num-layers-per-virtual-pipeline-stage",
                                            "--num-virtual-stages-per-pipeline-rank")


def stage_layers(num_layers: int, pp_size: int, pp_rank: int, layers_per_virtual_stage: Optional[int] = None,
                 first_stage_layers: Optional[int] = None, last_stage_layers: Optional[int] = None, *,
                 virtual_stages: Optional[int] = None, account_for_embedding: bool = False,
                 account_for_loss: bool = False,
                 layout_counts: Optional[tuple[tuple[int, ...], ...]] = None) -> StageLayers:
    """The layers of stage `pp_rank`; ConfigError naming the flag for a split Megatron refuses. Interleaving comes as
    layers per chunk or chunks per stage; --account-for-embedding/loss-in-pipeline-split count those as one layer
    each."""
    if layout_counts is not None:
        # --pipeline-model-parallel-layout: chunk c of rank r is virtual stage c x pp + r, after every virtual stage
        # before it
        flat = [layout_counts[rank][chunk] for chunk in range(len(layout_counts[0])) for rank in range(pp_size)]

        def layout_chunk(chunk: int) -> tuple[int, ...]:
            start = sum(flat[:chunk * pp_size + pp_rank])
            return tuple(range(start, start + layout_counts[pp_rank][chunk]))

        return StageLayers(tuple(layout_chunk(chunk) for chunk in range(len(layout_counts[pp_rank]))),
                           first=pp_rank == 0, last=pp_rank == pp_size - 1)
    if layers_per_virtual_stage is not None and virtual_stages is not None:
        raise ConfigError(f"{VIRTUAL_LAYERS_FLAG} with {VIRTUAL_STAGES_FLAG}: Megatron takes one of them; drop one",
                          flags=(VIRTUAL_LAYERS_FLAG, VIRTUAL_STAGES_FLAG))
    uneven = first_stage_layers is not None or last_stage_layers is not None
    if uneven and (account_for_embedding or account_for_loss):
        # Megatron: "Does not support standalone embedding stage and standalone loss stage with uneven pp"
        raise ConfigError("--decoder-first/last-pipeline-num-layers with --account-for-embedding/loss-in-pipeline-"
                          "split: Megatron does not take both; drop one of them",
                          flags=(FIRST_STAGE_FLAG, LAST_STAGE_FLAG, EMBEDDING_FLAG, LOSS_FLAG))
    if uneven:
        sizes = stage_sizes(num_layers, pp_size, first_stage_layers, last_stage_layers)
        if layers_per_virtual_stage is not None:
            # Megatron-LM requires --num-virtual-stages-per-pipeline-rank with uneven stages
            raise ConfigError(f"--decoder-first/last-pipeline-num-layers with {VIRTUAL_LAYERS_FLAG}: Megatron takes "
                              f"uneven stages' interleaving as {VIRTUAL_STAGES_FLAG} (chunks a stage); use it",
                              flags=(FIRST_STAGE_FLAG, LAST_STAGE_FLAG, VIRTUAL_LAYERS_FLAG, VIRTUAL_STAGES_FLAG))
        if virtual_stages is not None and virtual_stages > 1:
            # each stage's layers split evenly over its chunks, chunk c of rank r after every chunk before it round the
            # ring
            if any(size % virtual_stages for size in sizes):
                raise ConfigError(f"{VIRTUAL_STAGES_FLAG} {virtual_stages} does not divide every stage's layers "
                                  f"({', '.join(map(str, sizes))} with --decoder-first/last-pipeline-num-layers): "
                                  f"Megatron splits each stage's layers evenly over its chunks; pick sizes it divides",
                                  flags=(VIRTUAL_STAGES_FLAG, FIRST_STAGE_FLAG, LAST_STAGE_FLAG))
            return stage_layers(num_layers, pp_size, pp_rank, layout_counts=tuple(
                (size // virtual_stages,) * virtual_stages for size in sizes))
        start = sum(sizes[:pp_rank])
        return StageLayers((tuple(range(start, start + sizes[pp_rank])),),
                           first=pp_rank == 0, last=pp_rank == pp_size - 1)
    before = int(account_for_embedding)
    slots = num_layers + before + int(account_for_loss)
    if slots % pp_size:
        counted = " (with the embedding and/or loss counted as layers)" if slots != num_layers else ""
        raise ConfigError(f"--num-layers {num_layers}{counted} is not divisible by --pipeline-model-parallel-size "
                          f"{pp_size}: Megatron splits the layers evenly over the stages; pick a stage count "
                          f"that divides the layers, or set --decoder-first/last-pipeline-num-layers",
                          flags=("--num-layers", "--pipeline-model-parallel-size")
                          + ((EMBEDDING_FLAG,) if account_for_embedding else ())
                          + ((LOSS_FLAG,) if account_for_loss else ()))
    per_stage = slots // pp_size
    if virtual_stages is not None:
        if virtual_stages < 1 or per_stage % virtual_stages:
            raise ConfigError(f"{VIRTUAL_STAGES_FLAG} {virtual_stages} does not divide the {per_stage} layers of "
                              f"each of the {pp_size} stages: pick a divisor of {per_stage}",
                              flags=(VIRTUAL_STAGES_FLAG,))
        layers_per_virtual_stage = per_stage // virtual_stages
    elif layers_per_virtual_stage is not None:
        if layers_per_virtual_stage < 1 or per_stage % layers_per_virtual_stage:
            raise ConfigError(f"{VIRTUAL_LAYERS_FLAG} {layers_per_virtual_stage} does not divide the "
                              f"{per_stage} layers of each of the {pp_size} stages: pick a divisor of {per_stage}",
                              flags=(VIRTUAL_LAYERS_FLAG,))
    else:
        layers_per_virtual_stage = per_stage
    chunks = per_stage // layers_per_virtual_stage

    def chunk_layers(chunk: int) -> tuple[int, ...]:
        first_slot = VirtualStages(pp_size, pp_rank).of(chunk) * layers_per_virtual_stage
        return tuple(slot - before for slot in range(first_slot, first_slot + layers_per_virtual_stage)
                     if 0 <= slot - before < num_layers)

    stage = StageLayers(tuple(chunk_layers(chunk) for chunk in range(chunks)),
                        first=pp_rank == 0, last=pp_rank == pp_size - 1)
    if not stage.layer_ids:
        raise ConfigError(f"--pipeline-model-parallel-size {pp_size} over --num-layers {num_layers} with the "
                          f"embedding and/or loss counted as layers leaves stage {pp_rank} no transformer layer: "
                          f"not implemented here; use fewer stages or more layers",
                          flags=("--pipeline-model-parallel-size", "--num-layers", EMBEDDING_FLAG, LOSS_FLAG))
    return stage


def activation_shape(tokens, hidden_size: int, model, tensor_parallel_size: int) -> tuple:
    """The hidden states' shape one stage sends the next: [batch, seq, hidden], or [batch, seq / TP, hidden] under
    sequence parallelism, as Megatron-Core's get_tensor_shapes."""
    batch, sequence = tokens.shape
    if model.sequence_parallel:
        sequence //= tensor_parallel_size
    return batch, sequence, hidden_size
