"""`--print-config`: the resolved configuration, every value beside where it came from: the settings by section, the
Megatron-LM and DeepSpeed flags that are not settings and what each does, every DeepSpeed JSON key and what became of
it, and the numbers derived from several settings."""

from __future__ import annotations

from typing import Any

from arguments.batch_schedule import batch_schedule
from arguments.config_sources import DEFAULT, Source, show_value
from arguments.deepspeed.verdicts import HONOURED
from arguments.megatron.flags import MEANINGS, NO_EFFECT_FLAGS
from arguments.megatron.harvested_flags import resolve_harvested
from arguments.schedule import build_lr_schedule, train_iterations
from base.options import setting_values

NAME_WIDTH = 38
VALUE_WIDTH = 22
# The model's first rows in their historical order, so a logged --print-config still diffs line for line; the rest
# follow in their sections' order.
FLAT_MODEL_ORDER = (
    "num_layers", "hybrid_layer_pattern", "hidden_size", "num_attention_heads", "kv_channels", "ffn_hidden_size",
    "seq_length", "max_position_embeddings", "vocab_size", "make_vocab_size_divisible_by", "pad_vocab_size_to",
    "hidden_dropout", "attention_dropout", "layernorm_epsilon", "normalization", "swiglu", "position_embedding_type",
    "rotary_base", "rotary_percent", "use_rope_scaling", "rope_scaling_factor", "rotary_interleaved",
    "num_query_groups", "untie_embeddings_and_output_weights", "add_bias_linear", "add_qkv_bias", "qk_layernorm",
    "qk_l2_norm", "qk_layernorm_over_projection", "attention_output_gate", "apply_layernorm_1p", "sublayer_norms",
    "gated_linear_unit", "scale_embeddings_by_sqrt_hidden", "softmax_scale", "attn_logit_softcapping",
    "final_logit_softcapping", "local_rotary_base", "rotary_seq_len_interpolation_factor", "hf_model_type",
    "softmax_type", "quick_geglu", "glu_linear_offset", "activation_func_clamp_value",
    "yarn_original_max_position_embeddings", "yarn_beta_fast", "yarn_beta_slow",
    "yarn_correction_range_round_to_int", "longrope_short_factor", "longrope_long_factor",
    "longrope_original_max_position_embeddings", "longrope_factor", "longrope_attention_factor", "window_size",
    "window_attn_skip_freq", "no_rope_freq", "multi_latent_attention", "q_lora_rank", "kv_lora_rank", "qk_head_dim",
    "qk_pos_emb_head_dim", "v_head_dim", "rope_type", "rotary_scaling_factor", "mscale", "mscale_all_dim",
    "init_method_std", "activation", "attention_backend", "cp_comm_type", "pad_attention_head_dim",
    "recompute_modules", "cross_entropy_loss_fusion", "z_loss_strength",
)


def format_config(parsed) -> str:
    """The text --print-config prints for a `arguments.parser.ParsedArguments`."""
    config, sources = parsed.config, parsed.config.sources
    lines = ["pretrain_gpt.py --print-config: every setting, its value, and where the value came from"]
    preset = sources.get("config", Source(DEFAULT))
    lines.append(_row("preset", parsed.preset, preset.describe()))
    if parsed.deepspeed is not None:
        lines.append(_row("DeepSpeed JSON", parsed.deepspeed.source, sources["zero_config"].describe()))
    for section in config.SECTIONS:
        lines.append(section)
        for name, value in _in_print_order(section, setting_values(getattr(config, section))).items():
            lines.append(_row(name, show_value(value), sources.get(name, Source(DEFAULT)).describe()))
    if parsed.meanings or parsed.harvested:
        lines.append("Megatron-LM and DeepSpeed flags that are not settings here")
        lines += [_row(_typed(dest, value, sources), "", _meaning(dest, value))
                  for dest, value in parsed.meanings.items()]
        accepted, _ = resolve_harvested(parsed.harvested or {}, None)
        lines += [_row(shown, "", f"accepted, no effect on the math: {reason}") for shown, reason in accepted]
    if parsed.deepspeed is not None:
        lines.append(f"DeepSpeed JSON {parsed.deepspeed.source}: every key")
        for verdict in parsed.deepspeed.verdicts:
            if verdict.kind == HONOURED:
                effect = f"honoured: {' '.join(verdict.flags)}" if verdict.flags else f"honoured: {verdict.why}"
            else:
                effect = f"accepted, no effect on the math: {verdict.why}"
            outcome = parsed.json_outcomes.get(verdict.key)
            section, _, rest = verdict.key.partition(".")
            shown = verdict.key if section not in parsed.deepspeed.written_as else \
                f"{verdict.key} (written {parsed.deepspeed.written_as[section]}.{rest}, its older name)"
            lines.append(_row(shown, "", f"{effect}; {outcome}" if outcome else effect))
        implied = {"activation_checkpointing": "--checkpoint-activations"}  # keys no verdict lists
        lines += [_row(key, "", f"implies {flag}; {parsed.json_outcomes[key]}") for key, flag in implied.items()
                  if key in parsed.json_outcomes]
    lines.append("derived")
    optimizer, training = config.optimizer, config.training
    if training.accumulation_steps is None:  # else the global batch depends on the data-parallel size
        batch = batch_schedule(config, 1, deepspeed_check=False)  # 1 stands in for the launch's size
        schedule = build_lr_schedule(config.optimizer, config.training, config.model.seq_length, batch)
        per_iteration = "micro batch x data-parallel size" if batch.steps is not None else "global batch"
        lines.append(_row("training iterations", str(train_iterations(config.training, batch)),
                          "--train-iters" if training.train_samples is None else
                          f"--train-samples {training.train_samples} // global batch (Megatron's arithmetic)"))
        lines.append(_row("learning-rate warmup (samples)", f"{schedule.warmup_samples:g}",
                          f"--lr-warmup-fraction {optimizer.lr_warmup_fraction} x decay"
                          if optimizer.lr_warmup_fraction is not None else
                          f"--lr-warmup-iters x {per_iteration}" if training.train_samples is None else
                          "--lr-warmup-samples"))
        lines.append(_row("learning-rate decay (samples)", f"{schedule.decay_samples:g}",
                          f"(--lr-decay-iters or --train-iters) x {per_iteration}" if training.train_samples is None
                          else "--lr-decay-samples or --train-samples"))
        if schedule.decay_tokens is not None or schedule.warmup_tokens is not None:
            lines.append(_row("learning-rate by tokens", f"{schedule.warmup_tokens} / {schedule.decay_tokens}",
                              "--lr-warmup-tokens / --lr-decay-tokens (Megatron-DeepSpeed)"))
    if training.rampup_batch_size is not None:
        start, increment, samples = training.rampup_batch_size
        lines.append(_row("global batch", f"{start} -> {training.global_batch_size}",
                          f"+{increment} evenly over the first {samples:,} samples (--rampup-batch-size); the "
                          f"learning-rate schedule follows consumed samples"))
    if training.step_batch_size_schedule is not None:
        lines.append(_row("global batch", batch.describe(), "--step-batch-size-schedule (thresholds in tokens, "
                          "as samples here); the learning-rate schedule follows consumed samples"))
    if parsed.notes or config.json_differences:
        lines.append("said at the start of a run")
        lines += [note if note.startswith(">") else f"> {note}" for note in parsed.notes]
        lines += config.json_differences
    return "\n".join(lines)


def _in_print_order(section: str, values: dict[str, Any]) -> dict[str, Any]:
    if section != "model":
        return values
    return {**{name: values[name] for name in FLAT_MODEL_ORDER}, **values}


def _row(name: str, value: str, where: str) -> str:
    """`  name   value   # where`: aligned for reading, and split at "  # " by a program."""
    return f"  {name:<{NAME_WIDTH}} {value:<{VALUE_WIDTH}}  # {where}"


def _typed(dest: str, value: Any, sources: dict[str, Source]) -> str:
    source = sources.get(dest)
    option = source.origin if source is not None and source.origin else dest
    return option if isinstance(value, bool) else f"{option} {value}"


def _meaning(dest: str, value: Any) -> str:
    if dest in NO_EFFECT_FLAGS:
        return f"accepted, no effect on the math: {NO_EFFECT_FLAGS[dest]}"
    meaning = next(m for m in MEANINGS if m.dest == dest)
    return f"honoured: {meaning.help}"
