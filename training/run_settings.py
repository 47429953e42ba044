"""The run's configuration resolved once, after the tokenizer and the process grid are known: vocabulary, batch
schedule, iterations, learning-rate schedule, dtypes and attention kernel, into a frozen `RunSettings` whose resolved
`config` everything downstream reads. On a CPU a preset's 16-bit precision becomes fp32."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Optional

import torch

from arguments.batch_schedule import BatchSchedule, batch_schedule
from arguments.checkpoint_config import CheckpointConfig
from arguments.config import ConfigError, PretrainConfig
from arguments.config_sources import FLAG, JSON, PRESET
from arguments.schedule import LearningRateSchedule, build_lr_schedule, train_iterations
from arguments.training_config import TrainingConfig
from base.options import replace_settings
from checkpoint.formats import pretrained_vocab_size
from data.data_config import DataConfig
from gpt.attention_backend import backend_for_device
from gpt.hybrid_pattern import GDN
from gpt.layer_spec import mixer_symbols
from gpt.model_config import ModelConfig
from training.moe_notes import moe_notes
from zero.optimizer import PRECISION_DTYPES
from zero.optimizer_config import OptimizerConfig


@dataclass(frozen=True)
class RunSettings:
    config: PretrainConfig          # resolved copy: vocabulary, batch sizes and precision set
    tensor_parallel_size: int
    data_parallel_size: int
    batch: BatchSchedule            # the global batch of every iteration, from the samples consumed
    vocab_size: int                 # the model's (model_vocabulary)
    padded_vocab_size: int          # rounded up for fast GEMMs and equal TP shards
    param_dtype: torch.dtype
    grad_dtype: torch.dtype
    lr_schedule: LearningRateSchedule  # Megatron's, in samples (and tokens)
    # --decoupled-lr's: the same schedule with its own peak and floor
    decoupled_lr_schedule: Optional[LearningRateSchedule] = None
    notes: tuple[str, ...] = ()     # what resolving changed or warns about, said once

    def tokens_in(self, global_batch_size: int) -> int:
        return global_batch_size * self.config.model.seq_length


def resolve_run_settings(config: PretrainConfig, vocab_size: int, tensor_parallel_size: int, data_parallel_size: int,
                         device_type: str = "cuda", *, batch: Optional[BatchSchedule] = None,
                         resumed_lr_schedule: Optional[LearningRateSchedule] = None) -> RunSettings:
    """Everything derived from `config` for a TP x DP grid on `device_type` and a tokenizer of `vocab_size` tokens."""
    batch = batch if batch is not None else batch_schedule(config, data_parallel_size)
    training, notes = resolve_precision(config.training, config.sources, device_type)
    attention_backend, fallback = resolve_attention_backend(config.model, config.data, config.sources, training.precision,
                                                            device_type)
    notes += fallback + vocabulary_notes(config.data, config.model, config.sources, vocab_size) \
        + document_masking_notes(config.data, config.model) \
        + moe_notes(config.model, config.parallel, tensor_parallel_size, data_parallel_size)
    notes += longrope_notes(config.model)
    model = replace_settings(config.model, vocab_size=vocab_size, attention_backend=attention_backend)
    training = dataclasses.replace(training, global_batch_size=batch.global_batch_size,
                                   micro_batch_size=batch.micro_batch_size,
                                   train_iters=train_iterations(config.training, batch))
    resolved = dataclasses.replace(config, model=model, training=training)
    lr_schedule = resumed_lr_schedule if resumed_lr_schedule is not None else build_lr_schedule(
        resolved.optimizer, resolved.training, resolved.model.seq_length, batch)
    return RunSettings(lr_schedule=lr_schedule, decoupled_lr_schedule=decoupled_schedule(config.optimizer, lr_schedule),
        config=resolved, tensor_parallel_size=tensor_parallel_size, data_parallel_size=data_parallel_size,
        batch=batch, vocab_size=vocab_size, padded_vocab_size=model.padded_vocab_size(tensor_parallel_size),
        param_dtype=PRECISION_DTYPES[training.precision], grad_dtype=PRECISION_DTYPES[training.gradient_precision],
        notes=notes)


def decoupled_schedule(optimizer: OptimizerConfig, schedule: LearningRateSchedule) -> Optional[LearningRateSchedule]:
    """--decoupled-lr's schedule: its own max_lr and min_lr, the rest shared, as Megatron-LM's scheduler."""
    if optimizer.decoupled_lr is None:
        return None
    floor = optimizer.decoupled_min_lr if optimizer.decoupled_min_lr is not None else schedule.min_lr
    return dataclasses.replace(schedule, max_lr=optimizer.decoupled_lr, min_lr=floor)


def tokenizer_named(data: DataConfig) -> bool:
    """Whether the flags name a tokenizer."""
    return bool(data.tokenizer_type or data.tokenizer_file or data.vocab_file)


def tokenizer_size_from_flags(data: DataConfig, model: ModelConfig) -> Optional[int]:
    """The tokenizer's size from the flags alone, or None for a tokenizer read from files."""
    if data.tokenizer_type == "NullTokenizer":
        return model.vocab_size + (not data.newer_null_tokenizer)
    if tokenizer_named(data):
        return None
    return data.tokenizer_vocab_size


def model_vocabulary(checkpoint: CheckpointConfig, data: DataConfig, model: ModelConfig, sources: dict,
                     tokenizer_vocab_size: int) -> int:
    """The model's vocabulary, for the trainer and the planner alike: a named tokenizer's size (Megatron-LM reads
    --vocab-size only for the NullTokenizer), else --vocab-size, or an --init-from-hf folder's."""
    folder = checkpoint.init_from_hf
    if folder:
        hf_vocab = pretrained_vocab_size(folder)
        if tokenizer_vocab_size > hf_vocab:
            raise ConfigError(f"the run's tokenizer has {tokenizer_vocab_size} tokens, more than {folder}/config.json's "
                              f"vocab_size {hf_vocab}: its ids past {hf_vocab - 1} have no row in the model; give the "
                              f"tokenizer the folder was trained with")
        return hf_vocab
    asked = model.vocab_size
    if tokenizer_named(data) or not asked:
        return tokenizer_vocab_size
    if tokenizer_vocab_size > asked:
        raise ConfigError(f"{_vocab_words(model, sources)} is smaller than the embedded corpus's tokenizer "
                          f"(--tokenizer-vocab-size {data.tokenizer_vocab_size}): the model's vocabulary must "
                          f"hold every token id; raise --vocab-size or lower --tokenizer-vocab-size",
                          flags=("--vocab-size", "--tokenizer-vocab-size"))
    return asked


def _vocab_words(model: ModelConfig, sources: dict) -> str:
    """--vocab-size N, and the preset it came from where it was not typed."""
    source = sources.get("vocab_size")
    where = f" (vocab_size of the preset {source.origin})" if source is not None and source.kind == PRESET else ""
    return f"--vocab-size {model.vocab_size}{where}"


def document_masking_notes(data: DataConfig, model: ModelConfig) -> tuple[str, ...]:
    """--reset-position-ids and --reset-attention-mask where they change less than asked, said once."""
    kind = model.positions.position_embedding_type
    notes = ()
    if data.reset_attention_mask and GDN in mixer_symbols(model):
        notes = ("> --reset-attention-mask does not reach the Gated DeltaNet (`G`) layers: their state runs over the "
                 "whole sequence, as Megatron-Core's GatedDeltaNet reads no attention mask",)
    if not data.reset_position_ids or kind == "learned_absolute":
        return notes
    return notes + (f"> --reset-position-ids has no effect with --position-embedding-type {kind}: Megatron-LM restarts "
                    f"only learned positions after each end-of-document token; rotary angles stay those of positions "
                    f"0..seq-1 (within a document, which --reset-attention-mask keeps attention to, rotary q.k "
                    f"depends only on the positions' difference)",)


def longrope_notes(model: ModelConfig) -> tuple[str, ...]:
    """Which of LongRoPE's factor lists the sequence takes, as transformers picks them."""
    longrope, seq = model.longrope, model.seq_length
    if longrope is None:
        return ()
    which = "long" if seq > longrope.original_max_positions else "short"
    relation = "longer than" if which == "long" else "within"
    return (f"> --position-embedding-type longrope: the {seq}-token sequence is {relation} the original context "
            f"({longrope.original_max_positions}), so every position takes the {which} factors, as transformers "
            f"picks them for a whole sequence; cos and sin times {longrope.attention_factor:.6g}",)


def vocabulary_notes(data: DataConfig, model: ModelConfig, sources: dict, vocab_size: int) -> tuple[str, ...]:
    """Where a --vocab-size is not read, said once."""
    asked = model.vocab_size
    if not asked or data.tokenizer_type == "NullTokenizer":
        return ()
    if not tokenizer_named(data):
        return (f"> the model's vocabulary is {_vocab_words(model, sources)}: the embedded corpus's tokenizer, trained here "
                f"with at most --tokenizer-vocab-size {data.tokenizer_vocab_size} tokens, uses its first ids "
                f"(name your tokenizer, --tokenizer-file, to train on all of them)",)
    if asked == vocab_size:
        return ()
    tokenizer = data.tokenizer_type or "the tokenizer given"
    return (f"> {_vocab_words(model, sources)} is not read beside {tokenizer} (as in Megatron-LM): the vocabulary is the "
            f"tokenizer's {vocab_size} tokens",)


def resolve_attention_backend(model: ModelConfig, data: DataConfig, sources: dict, precision: str,
                              device_type: str) -> tuple[str, tuple[str, ...]]:
    """(the attention backend this device runs, why it is not the one asked)."""
    typed = sources.get("attention_backend")
    flag = typed.origin.split(" ")[0] if typed is not None and typed.kind == FLAG else ""
    backend, fallback = backend_for_device(model, precision, torch.device(device_type), flag,
                                           attention_mask=data.reset_attention_mask)
    return backend, (fallback,) if fallback else ()


def resolve_precision(training: TrainingConfig, sources: dict, device_type: str):
    """(training section at the precision this device runs, notes)."""
    if device_type != "cpu" or training.precision == "fp32":
        return training, ()
    name = training.precision
    source = sources.get(name)
    if source is not None and source.kind not in (JSON, FLAG):
        return (replace_settings(training, bf16=False, fp16=False),
                (f"> {name} comes from {source.describe()}, a setting for GPUs: on this CPU the run trains in fp32, "
                 f"10-15x faster here than {name} (pass --{name} to keep it)",))
    return training, (f"warning: {name} on a CPU runs 10-15x slower than fp32 (CPUs lack fast 16-bit matrix "
                      f"kernels); use --no-{name} unless you are testing {name} numerics",)
