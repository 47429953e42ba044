"""What the user fixed by giving the layout search a trainer flag: each dimension a flag sets is searched at that value
only, and the printed command keeps the user's flag. A preset's or --init-from-hf folder's value is the model's, not a
choice of layout."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from arguments.config import ConfigError, PretrainConfig
from arguments.config_sources import FLAG, JSON
from planner.layout_of_config import precision_of, stage_counts_of

# the settings that fix the pipeline split
SPLIT_SETTINGS = ("pipeline_model_parallel_layout", "num_layers_per_virtual_pipeline_stage",
                  "num_virtual_stages_per_pipeline_rank", "decoder_first_pipeline_num_layers",
                  "decoder_last_pipeline_num_layers", "account_for_embedding_in_pipeline_split",
                  "account_for_loss_in_pipeline_split")


DIMENSION_NAMES = {"tp": "TP", "pp": "PP", "cp": "CP", "ep": "EP", "micro_batch_size": "micro-batch",
                   "recompute": "recompute", "zero_stage": "ZeRO stage", "dispatcher": "MoE dispatcher",
                   "overlap_grad_reduce": "gradient-reduce overlap", "overlap_param_gather": "parameter-gather overlap"}


@dataclass(frozen=True)
class Pins:
    """Each searched dimension's value where the user's flags fix it, None where the search chooses."""
    tp: Optional[int] = None
    pp: Optional[int] = None
    stage_counts: Optional[tuple[tuple[int, ...], ...]] = None
    cp: Optional[int] = None
    ep: Optional[int] = None
    micro_batch_size: Optional[int] = None
    recompute: Optional[float] = None        # 1.0 full, 0.0 none
    zero_stage: Optional[int] = None
    dispatcher: Optional[str] = None  # the MoE dispatcher the trainer runs (flex runs alltoall here)
    configured_dispatcher: str = "allgather"  # the config's, pinned or not: what a layout without EP runs
    overlap_grad_reduce: Optional[bool] = None
    overlap_param_gather: Optional[bool] = None
    expert_tp: bool = False
    sequence_parallel: bool = False
    sixteen_bit: bool = False
    precision: str = "bf16"                  # what the search prices: fp8 where --fp8-format is given
    fp8_recipe: str = "delayed"
    fp8_wgrad: bool = True

    def names(self) -> list[str]:
        names = [name for field, name in DIMENSION_NAMES.items() if getattr(self, field) is not None]
        return names + (["the pipeline split"] if self.stage_counts is not None else []) + \
            (["expert TP"] if self.expert_tp else []) + \
            (["precision"] if self.sixteen_bit or self.precision == "fp8" else [])


def given(sources: dict, setting: str) -> bool:
    source = sources.get(setting)
    return source is not None and source.kind in (FLAG, JSON)


def pins_of(config: PretrainConfig) -> Pins:
    """The dimensions `config`'s own flags fix."""
    parallel, zero = config.parallel, config.zero

    def value(setting: str, current):
        return current if given(config.sources, setting) else None

    recompute_given = given(config.sources, "checkpoint_activations") or given(config.sources, "recompute_granularity")
    if config.activations.checkpoint_activations and config.activations.recompute_method == "block":
        # the search's memory model knows every layer recomputed or none
        raise ConfigError("--recompute-method block: the layout search prices the recompute of every layer or of "
                          "none; give --recompute-method uniform or no recompute flag, or price this launch as it is "
                          "with `python -m zero.plan dry-run --hardware`", flags=("--recompute-method",))
    dispatcher = parallel.moe_token_dispatcher_type
    return Pins(
        tp=value("tensor_model_parallel_size", parallel.tensor_model_parallel_size),
        pp=value("pipeline_model_parallel_size", parallel.pipeline_model_parallel_size),
        stage_counts=stage_counts_of(config.model, config.parallel)
        if any(given(config.sources, setting) for setting in SPLIT_SETTINGS) else None,
        cp=value("context_parallel_size", parallel.context_parallel_size),
        ep=value("expert_model_parallel_size", parallel.expert_model_parallel_size),
        micro_batch_size=value("micro_batch_size", config.training.micro_batch_size),
        recompute=(1.0 if config.activations.checkpoint_activations else 0.0) if recompute_given else None,
        zero_stage=value("stage", zero.stage),
        dispatcher=value("moe_token_dispatcher_type", "alltoall" if dispatcher == "flex" else dispatcher),
        configured_dispatcher="alltoall" if dispatcher == "flex" else dispatcher,
        overlap_grad_reduce=value("overlap_comm", zero.overlap_comm),
        overlap_param_gather=value("overlap_param_gather", zero.overlap_param_gather),
        expert_tp=given(config.sources, "expert_tensor_parallel_size"),
        sequence_parallel=given(config.sources, "sequence_parallel"),
        sixteen_bit=given(config.sources, "bf16") or given(config.sources, "fp16"),
        precision="fp8" if precision_of(config.model, config.training) == "fp8" else "bf16",
        fp8_recipe=config.model.fp8.recipe,
        fp8_wgrad=config.model.fp8.wgrad)
