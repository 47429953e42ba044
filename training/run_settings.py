"""The run's configuration resolved once, after the tokenizer and the process grid are known.

A `PretrainConfig` holds what the user asked for; a few numbers depend on things known only later:
the vocabulary (from the tokenizer), the padded vocabulary (and the TP size), the batch of every
iteration (and the DP size: arguments/batch_schedule.py), the iterations a --train-samples run makes and the
learning-rate schedule in samples (arguments/schedule.py), the dtypes and the attention kernel (and the
device). `resolve_run_settings` computes them once into a frozen `RunSettings` (settings, not a plan: "plan"
is only the planner's, planner/plan.py), whose `config` is a resolved copy (vocabulary, batch sizes,
precision and attention backend filled in) that checkpoint metadata records and everything downstream
reads: the trainer (training/prepare.py) and the dry run (planner/dry_run.py) alike. The user's config
object is a frozen dataclass that nothing changes, so the order in which functions are called cannot
change a number.

Precision on a CPU: a 16-bit setting that came from a preset (`gpt2-124m` turns bf16 on for GPUs) is
resolved to fp32 on a CPU, where 16-bit math runs 10-15x slower; one asked for explicitly (a flag or
the DeepSpeed JSON) is kept, with a warning (`precision_notes`).
"""

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
    vocab_size: int                 # the model's (model_vocabulary: the tokenizer's, or a preset's)
    padded_vocab_size: int          # rounded up for fast GEMMs and equal TP shards
    param_dtype: torch.dtype        # 16-bit (or fp32) parameters and activations
    grad_dtype: torch.dtype         # what gradients are accumulated and reduced in
    lr_schedule: LearningRateSchedule  # Megatron's, in samples (and tokens): arguments/schedule.py
    # --decoupled-lr's: the same schedule with its own peak and floor (the embedding and output weights)
    decoupled_lr_schedule: Optional[LearningRateSchedule] = None
    notes: tuple[str, ...] = ()     # what resolving changed or warns about, said once at the start

    def tokens_in(self, global_batch_size: int) -> int:
        return global_batch_size * self.config.model.seq_length


def resolve_run_settings(config: PretrainConfig, vocab_size: int, tensor_parallel_size: int, data_parallel_size: int,
                         device_type: str = "cuda", *, batch: Optional[BatchSchedule] = None,
                         resumed_lr_schedule: Optional[LearningRateSchedule] = None) -> RunSettings:
    """Everything derived from `config` for a grid of TP x DP on `device_type` and a tokenizer of
    `vocab_size` tokens. Raises ConfigError (naming the flags) when the batch arithmetic does not work out.

    `batch`: the run's schedule when the caller has computed it already (a training run computes it
    once, before any work, and passes it along). `resumed_lr_schedule`: the checkpoint's schedule, kept
    by --use-checkpoint-opt_param-scheduler (checkpoint/run_start.py); without it the schedule is this
    run's own."""
    batch = batch if batch is not None else batch_schedule(config, data_parallel_size)
    training, notes = resolve_precision(config.training, config.sources, device_type)
    attention_backend, fallback = resolve_attention_backend(config.model, config.data, config.sources, training.precision,
                                                            device_type)
    notes += fallback + vocabulary_notes(config.data, config.model, config.sources, vocab_size) \
        + document_masking_notes(config.data, config.model) \
        + moe_notes(config.model, config.parallel, tensor_parallel_size, data_parallel_size)
    notes += longrope_notes(config.model) + masked_loss_log_notes(config.data, config.training)
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
    """Megatron-LM's scheduler gives a parameter group its own max_lr and min_lr (--decoupled-lr,
    --decoupled-min-lr, else --min-lr) and shares the rest: warmup, decay, style and the warmup's start
    (megatron/core/optimizer_param_scheduler.py get_lr; megatron/core/optimizer/__init__.py
    get_standard_config_overrides). --decoupled-min-lr alone does nothing there, nor here."""
    if optimizer.decoupled_lr is None:
        return None
    floor = optimizer.decoupled_min_lr if optimizer.decoupled_min_lr is not None else schedule.min_lr
    return dataclasses.replace(schedule, max_lr=optimizer.decoupled_lr, min_lr=floor)


def tokenizer_named(data: DataConfig) -> bool:
    """Whether the flags name a tokenizer; without one the embedded corpus trains its own BPE here."""
    return bool(data.tokenizer_type or data.tokenizer_file or data.vocab_file)


def tokenizer_size_from_flags(data: DataConfig, model: ModelConfig) -> Optional[int]:
    """The run's tokenizer's size as the flags give it, before any tokenizer is loaded: an explicit tokenizer wins
    over the embedded corpus's (and, arguments/hf_folder.py, over an --init-from-hf folder's). Megatron's
    NullTokenizer is --vocab-size ids plus its end-of-document id; with no tokenizer named, the embedded corpus's
    BPE has at most --tokenizer-vocab-size tokens; None for a tokenizer read from files (its size is known once it
    is loaded)."""
    if data.tokenizer_type == "NullTokenizer":
        return model.vocab_size + 1
    if tokenizer_named(data):
        return None
    return data.tokenizer_vocab_size


def model_vocabulary(checkpoint: CheckpointConfig, data: DataConfig, model: ModelConfig, sources: dict,
                     tokenizer_vocab_size: int) -> int:
    """The model's vocabulary for a run of `config` whose tokenizer has `tokenizer_vocab_size` tokens: the
    one place the trainer (training/prepare.py, with the loaded tokenizer's) and the planner (planner/launch.py's
    launch_vocab, before any tokenizer is loaded) decide it.

    A named tokenizer's own size, as in Megatron-LM, whose build_tokenizer hands --vocab-size only to the
    NullTokenizer (whose size counts the end-of-document id). Without one the embedded corpus's BPE is trained
    here with at most --tokenizer-vocab-size tokens, and a --vocab-size (a preset's: llama3-8b's 128256 tokens,
    gpt2-124m's 50257) is the model's vocabulary, the corpus's ids its first ones: `--config llama3-8b` trains and
    plans Llama 3 8B's 8.03B parameters. A corpus tokenizer larger than that vocabulary is refused.

    With --init-from-hf, the folder's config.json vocab_size, as transformers' embedding has that many rows
    whatever the tokenizer (Qwen's folders hold more rows than tokens); the tokenizer's ids must fall inside it."""
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
    """--reset-position-ids restarts the learned position embedding's positions only: Megatron-Core's GPTModel hands
    position_ids to its embedding, and for rope computes the rotary angles of positions 0..seq-1
    (GPTModel._preprocess: `self.rotary_pos_emb(rotary_seq_len, ...)`), as Megatron-DeepSpeed does
    (`self.rotary_pos_emb(self.seq_length)`). Under rope or no positions the flag changes nothing, said once; and
    --reset-attention-mask leaves Gated DeltaNet layers as Megatron-Core's leaves them, said once."""
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


def masked_loss_log_notes(data: DataConfig, training: TrainingConfig) -> tuple[str, ...]:
    """With a loss mask Megatron-LM logs every loss as the masked sum over the count (pretrain_gpt.py loss_func returns
    both; training_log and evaluate divide the sums); here the evaluation's loss, and the training loss without
    --calculate-per-token-loss, is the mean of each micro-batch's masked mean (training/evaluation.py)."""
    if not (data.eod_mask_loss or data.goldfish_loss):
        return ()
    logged = "evaluation" if training.calculate_per_token_loss else "training and evaluation"
    return (f"> with a loss mask the logged {logged} loss is the mean of each micro-batch's masked mean; Megatron-LM "
            f"logs the masked sum over the token count (the gradients are Megatron-LM's either way)",)


def longrope_notes(model: ModelConfig) -> tuple[str, ...]:
    """Which of LongRoPE's factor lists the run's sequence takes (gpt/longrope.py): the long ones for every position
    once it is longer than the original context, as transformers' longrope_frequency_update picks them for a whole
    forward by its largest position, so a model trained here at one length is the model transformers runs at it."""
    longrope, seq = model.longrope, model.seq_length
    if longrope is None:
        return ()
    which = "long" if seq > longrope.original_max_positions else "short"
    relation = "longer than" if which == "long" else "within"
    return (f"> --position-embedding-type longrope: the {seq}-token sequence is {relation} the original context "
            f"({longrope.original_max_positions}), so every position takes the {which} factors, as transformers "
            f"picks them for a whole sequence; cos and sin times {longrope.attention_factor:.6g}",)


def vocabulary_notes(data: DataConfig, model: ModelConfig, sources: dict, vocab_size: int) -> tuple[str, ...]:
    """Where the model's vocabulary (`vocab_size`, model_vocabulary's) is not the tokenizer's, or a --vocab-size
    is not read, said once. A --vocab-size beside a real tokenizer is not read, as in Megatron-LM: its
    build_tokenizer (megatron/core/tokenizers/utils/build_tokenizer.py) hands args.vocab_size only to the
    NullTokenizer and TikTokenizer, and the padded vocabulary comes from the tokenizer's own size."""
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
    """(the attention backend this device runs, the line saying why when it is not the one asked): a kernel
    the device lacks falls back to PyTorch's own choice (gpt/attention_backend.py), the same math. The line
    names the flag as typed (`--use-flash-attn`)."""
    typed = sources.get("attention_backend")
    flag = typed.origin.split(" ")[0] if typed is not None and typed.kind == FLAG else ""
    backend, fallback = backend_for_device(model, precision, torch.device(device_type), flag,
                                           attention_mask=data.reset_attention_mask)
    return backend, (fallback,) if fallback else ()


def resolve_precision(training: TrainingConfig, sources: dict, device_type: str):
    """(training section with the precision this device runs, notes): a preset's 16-bit setting is fp32
    on a CPU; an explicit one stays, with a warning."""
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
