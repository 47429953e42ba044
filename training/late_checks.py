"""Checks of a training launch that need more than the flags (the disk, the tokenizer, the device), run with the flag
checks so every problem of a launch comes back in one list."""

from __future__ import annotations

import os

import torch

from arguments.checkpoint_config import CheckpointConfig
from arguments.cuda_graphs import PER_LAYER_IMPLS
from arguments.fault_handling import FaultHandlingSettings
from arguments.training_config import TrainingConfig
from base.errors import ConfigError
from checkpoint.start_decision import decide_start
from checkpoint.unfinished_save import needs_finishing
from data.data_config import DataConfig
from gpt.fp8 import Fp8Launch, check_fp8
from gpt.model_config import ModelConfig
from parallel.config import ParallelismConfig
from resilience.rerun_state import iterations_megatron_skips
from training.run_settings import model_vocabulary, tokenizer_size_from_flags
from zero.config import ActivationCheckpointConfig, ZeroConfig


def check_vocabulary_flags(checkpoint: CheckpointConfig, data: DataConfig, model: ModelConfig, sources: dict) -> None:
    """Without a named tokenizer --vocab-size is the model's vocabulary, and the corpus's tokenizer must fit in it."""
    tokens = tokenizer_size_from_flags(data, model)
    if not model.vocab_size or tokens is None or checkpoint.init_from_hf:
        return  # the folder's layer (arguments/hf_folder.py) checked the tokenizer against its vocab_size
    model_vocabulary(checkpoint, data, model, sources, tokens)


def check_fp8_flag(model: ModelConfig, parallel: ParallelismConfig, activations: ActivationCheckpointConfig,
                   zero: ZeroConfig) -> None:
    """--fp8-format and its recipe, checked with the flags."""
    if not model.fp8.enabled:
        return
    check_fp8(model, Fp8Launch(
        pipeline_parallel=parallel.pipeline_model_parallel_size, context_parallel=parallel.context_parallel_size,
        expert_parallel=parallel.expert_model_parallel_size, recompute=activations.checkpoint_activations,
        zero_stage=zero.stage))


def check_load(checkpoint: CheckpointConfig) -> None:
    """--load names a checkpoint, a missing or empty folder, or the --save folder."""
    if not needs_finishing(checkpoint.load, checkpoint.save):
        decide_start(checkpoint.load, checkpoint.save, checkpoint.universal_checkpoint,
                     checkpoint.exit_on_missing_checkpoint)


def check_rejected_results_tracker(faults: FaultHandlingSettings) -> None:
    """Refuse a --result-rejected-tracker-filename that Megatron-LM would skip iterations from (not implemented)."""
    tracker = faults.result_rejected_tracker_filename
    skipped = iterations_megatron_skips(tracker) if tracker else []
    if skipped:
        raise ConfigError(f"--result-rejected-tracker-filename {tracker}: Megatron-LM would skip iterations "
                          f"{', '.join(map(str, skipped))} (reproducibly rejected twice on a rank); skipping "
                          f"iterations (--iterations-to-skip) is not implemented here: name another file",
                          flags=("--result-rejected-tracker-filename",))


def check_cuda_graph_allocator(training: TrainingConfig) -> None:
    """Megatron-LM's refusal of per-layer CUDA graphs beside expandable segments, with its message."""
    impl = training.cuda_graph_impl
    if impl not in PER_LAYER_IMPLS or "expandable_segments:True" not in os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "") \
            or os.environ.get("NCCL_GRAPH_REGISTER", "") == "0":
        return
    if impl == "local" and not (torch.cuda.is_available() and torch.cuda.get_device_capability()[0] < 10):
        return  # local checks it where it captures: a GPU before Blackwell
    raise ConfigError(f"--cuda-graph-impl {impl} with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True: Megatron-LM "
                      f"asserts 'Setting NCCL_GRAPH_REGISTER=0 to avoid illegal memory access when using CUDA Graph with "
                      f"PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True.'; export NCCL_GRAPH_REGISTER=0",
                      flags=("--cuda-graph-impl",))


# each check given the sections it reads
LATE_CHECKS = (lambda config: check_load(config.checkpoint),
               lambda config: check_vocabulary_flags(config.checkpoint, config.data, config.model, config.sources),
               lambda config: check_fp8_flag(config.model, config.parallel, config.activations, config.zero),
               lambda config: check_rejected_results_tracker(config.training.faults),
               lambda config: check_cuda_graph_allocator(config.training))
