"""The model's shape: GPTModel's configuration, beside the model it builds (nanoGPT's GPTConfig).

It imports only torch-free helpers of the floors below (base/, parallel/), so building or inspecting
a model never loads the data pipeline or the flag parser. The run's other settings live in
arguments/config.py, which holds one of these as `PretrainConfig.model`.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Optional

from base.errors import ConfigError
from base.options import Const, flag_of_setting, option, replace_settings, section, with_settings
from gpt.attention_settings import AttentionSettings
from gpt.hybrid_pattern import check_model_follows_pattern
from gpt.longrope import LongRope
from gpt.mla_settings import MLASettings
from gpt.mlp import MLPSettings
from gpt.moe.settings import (
    MoESettings,
    experts_per_layer,
    largest_expert_count,
    moe_layer_pattern,
)
from gpt.mtp import MTPSettings
from gpt.norms import NormSettings
from gpt.positions import PositionSettings
from gpt.section_rules import (
    check_layers_without_rotary,
    check_mlp_with_experts,
    check_multi_latent_attention,
    check_output_layer,
)
from parallel.config import RECORDED_SECTION
from parallel.layers import padded_vocab_size

FP8_FORMATS = ("e4m3", "hybrid")  # Megatron-LM's --fp8-format choices
FP8_RECIPE_CHOICES = ("tensorwise", "delayed", "mxfp8", "blockwise", "custom")  # Megatron-LM's --fp8-recipe

# Megatron-Core's TransformerConfig.recompute_modules choices (transformer_config.py __post_init__'s allowed_modules)
RECOMPUTE_MODULES = ("core_attn", "moe_act", "layernorm", "mla_up_proj", "mlp", "moe", "shared_experts")


class TupleOfValues(argparse.Action):
    """nargs' values as a tuple: a ModelConfig stays hashable (gpt/shape.py keys its shapes by the config's values)."""

    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, tuple(values))


@dataclass(frozen=True)
class ModelConfig:
    num_layers: int = option(4, aliases={"--encoder-num-layers": "Megatron-LM (a GPT's only stack)"})
    # Megatron-LM's HybridModel pattern, read as GPT blocks (gpt/hybrid_pattern.py): it sets the depth, the MoE layers,
    # the stages and the MTP depth (arguments/megatron/hybrid_layer_pattern.py)
    hybrid_layer_pattern: Optional[str] = option(
        None, aliases={"--hybrid-override-pattern": "Megatron-LM (deprecated)"},
        help="Megatron-LM's layer pattern: `*-` a dense block, `*E` an MoE block, `|` between pipeline segments "
             "(segment k: model chunk k // PP of rank k mod PP), `/` then one block per MTP depth, e.g. '*-*E|*E*E/*E'; "
             "sets --num-layers, --moe-layer-freq, the stages and --mtp-num-layers")
    hidden_size: int = 128
    num_attention_heads: int = 4
    # Megatron-LM's --kv-channels: each head's width (Megatron-Core's kv_channels; transformers' head_dim), so the
    # attention's heads x width may differ from the hidden size (Qwen3's 128 at hidden 2560 / 32 heads).
    kv_channels: Optional[int] = option(None, help="each attention head's width (default: --hidden-size / "
                                                   "--num-attention-heads)")
    # None means 4 x hidden_size, as in GPT-2
    ffn_hidden_size: Optional[int] = option(None, help="default: 4 x hidden size")
    seq_length: int = option(128, aliases={"--encoder-seq-length": "Megatron-LM (a GPT's only sequence)"})
    max_position_embeddings: int = 128
    # Megatron's --vocab-size. Without NullTokenizer it stays 0, and the run plan's resolved copy holds the
    # tokenizer's.
    vocab_size: int = option(0, group="data",
                             help="with --tokenizer-type NullTokenizer: token ids are 0..N-1 and the end-of-document "
                                  "id is N")
    make_vocab_size_divisible_by: int = option(
        128, help="pad the vocabulary to a multiple of this x tensor-parallel size",
        consts=[Const(("--no-pad-vocab-size", "--disable-pad-vocab-size"), 1,
                      help="Megatron-LM: no padding beyond the TP split (--make-vocab-size-divisible-by 1)")])
    pad_vocab_size_to: Optional[int] = option(
        None, flags=("--pad-vocab-size-to", "--padded-vocab-size"),
        help="the padded vocabulary, exactly (BigScience's --pad-vocab-size-to, Megatron-LM's --padded-vocab-size): "
             "at least the tokenizer's, divisible by the TP size")
    hidden_dropout: float = 0.1
    attention_dropout: float = 0.1
    # The blocks' components, each a section in its component's own file whose settings are flags, YAML keys and
    # recorded names of their own (base/options.py section()); the defaults are GPT-2's blocks.
    norms: NormSettings = section(NormSettings)
    mlp: MLPSettings = section(MLPSettings)
    positions: PositionSettings = section(PositionSettings)
    attention: AttentionSettings = section(AttentionSettings)
    untie_embeddings_and_output_weights: bool = option(
        False, action="store_true", help="an output layer of its own instead of the token embedding's (Llama)")
    add_bias_linear: bool = option(
        True, consts=[Const(("--disable-bias-linear",), False, help="Megatron-LM: linears without biases (Llama)")],
        help="biases in every linear layer, as in GPT-2")
    scale_embeddings_by_sqrt_hidden: bool = option(
        False, action="store_true",
        help="the token embeddings multiplied by sqrt(--hidden-size), rounded to their dtype (Gemma)")
    final_logit_softcapping: Optional[float] = option(
        None, help="the output logits become c x tanh(logit / c) before the loss (Gemma 2)")
    # Not the math: which transformers class scripts/convert_to_hf.py writes (families/registry.py export_family),
    # where the blocks fit several (a Phi-3 and a Mistral are the same blocks); --init-from-hf sets the folder's
    hf_model_type: Optional[str] = option(
        None, help="the transformers family the Hugging Face export writes this model as (config.json's "
                   "model_type: llama, qwen2, qwen3, mistral, gemma2, gemma3_text, olmo2, phi3, ...); default: "
                   "the --init-from-hf folder's, else the first whose blocks are these")
    # Megatron-LM's multi-latent attention (DeepSeek-V2/V3; gpt/mla.py): its section
    mla: MLASettings = section(MLASettings)
    init_method_std: float = 0.02
    # Megatron-LM's --recompute-modules (TransformerConfig.recompute_modules), read under --recompute-granularity
    # selective only, as Megatron-Core (arguments/megatron/flags.py empties it otherwise, said): "layernorm" makes each
    # block's input and pre-MLP RMSNorm keep only its input and run again in backward (gpt/norms.py rms_norm)
    recompute_modules: tuple[str, ...] = option(
        (), nargs="+", choices=RECOMPUTE_MODULES, action=TupleOfValues,
        help="with --recompute-granularity selective, what of each layer is recomputed in backward (Megatron-LM's "
             "names): layernorm keeps only each block's RMSNorms' input (2 bytes a value in 16 bits where autograd "
             "keeps 6: its fp32 copy and the normed values) and runs their forward again in backward; core_attn is "
             "SDPA's own (it stores no scores); the others are accepted with no effect")
    # Megatron-LM's --cross-entropy-loss-fusion (there: a fused cross-entropy kernel); here the output
    # layer and the loss fused over token chunks (parallel/fused_linear_cross_entropy.py).
    cross_entropy_loss_fusion: bool = option(
        False, action="store_true",
        help="compute the output layer and the cross entropy together over chunks of tokens, never holding the "
             "full logits (recomputed in the backward); the same loss and gradients to rounding")
    # llm-jp's Megatron-LM fork (branch v4: --z-loss-strength; branch nii-geniac: --use-z-loss, a fixed 1e-4):
    # megatron/core/tensor_parallel/cross_entropy.py, _VocabParallelCrossEntropy.forward adds
    # z_loss_strength * log(Z)^2 per token, log(Z) the log-sum-exp of the logits (PaLM's z-loss).
    z_loss_strength: float = option(
        0.0, consts=[Const(("--use-z-loss",), 1e-4, help="llm-jp's Megatron-LM fork (nii-geniac): --z-loss-strength "
                                                         "1e-4")],
        help="add S x log(Z)^2 to every token's loss, log(Z) the log-sum-exp of its logits (PaLM's z-loss, as "
             "llm-jp's Megatron-LM fork adds it); 0 adds nothing")
    # Megatron-Core's multi-token prediction (gpt/mtp.py, megatron/core/transformer/multi_token_prediction.py)
    mtp: MTPSettings = section(MTPSettings)
    # Megatron-LM's --fp8-format (dest fp8) and its knobs, Megatron-Core's TransformerConfig fields and defaults;
    # DeepSpeed-Megatron's --fp8-e4m3 / --fp8-hybrid. gpt/fp8.py applies them and refuses, before any work,
    # what is not built yet.
    fp8: Optional[str] = option(
        None, flags=("--fp8-format",), choices=FP8_FORMATS, group="zero",
        consts=[Const(("--fp8-e4m3",), "e4m3", help="DeepSpeed-Megatron: --fp8-format e4m3"),
                Const(("--fp8-hybrid",), "hybrid", help="DeepSpeed-Megatron: --fp8-format hybrid")],
        help="the blocks' linears' GEMMs in FP8 through torch._scaled_mm (docs/fp8.md): e4m3 everywhere, or "
             "hybrid (e4m3 forward, e5m2 gradients); no model parallelism so far")
    fp8_recipe: str = option(
        "delayed", choices=FP8_RECIPE_CHOICES, group="zero",
        help="with --fp8-format, TransformerEngine's recipe: delayed (amax history), tensorwise (current "
             "per-tensor scales), blockwise (1x128 activations, 128x128 weights), mxfp8 (1x32 blocks, E8M0 scales, "
             "emulated); custom is refused")
    fp8_margin: int = option(0, group="zero", help="delayed scaling: scale = fp8_max / amax / 2^margin")
    fp8_amax_history_len: int = option(1, group="zero", help="delayed scaling: the amax history's length")
    fp8_amax_compute_algo: str = option(
        "most_recent", choices=("most_recent", "max"), group="zero",
        help="delayed scaling: the amax from the history's most recent entry or its max")
    fp8_wgrad: bool = option(
        True, group="zero", consts=[Const(("--disable-fp8-wgrad",), False,
                                          help="Megatron-LM: --no-fp8-wgrad")],
        help="the weight-gradient GEMM in FP8 (Megatron passes --no-fp8-wgrad to delayed scaling only)")
    fp8_param_gather: bool = option(
        False, action="store_true", group="zero",
        help="with --fp8-format and ZeRO stage 3, the FP8 linears' weights cast to e4m3 from the fp32 master after "
             "each step and all-gathered as FP8 bytes (1 byte per element; delayed and tensorwise recipes)")
    # Not Megatron-LM's: the guard of issue 65 (parallel/fp8/guard.py, docs/fp8.md "The guard")
    fp8_guard: bool = option(
        True, group="zero",
        help="with --fp8-format, count each FP8 cast's saturated and flushed values per layer into the metrics, and "
             "run a layer's GEMMs again in high precision where its FP8 output could be non-finite or a cast saturates "
             "more than --fp8-guard-saturation-threshold of its values (--no-fp8-guard: none of it)")
    fp8_guard_saturation_threshold: float = option(
        0.05, group="zero",
        help="--fp8-guard: the fraction of one cast's values saturated above which its layer falls back to high "
             "precision (default 0.05: a well scaled cast clips at most the values above its last amax; a scale "
             "2x too large clips about 8%% of a normal tensor)")
    # Not Megatron-LM's: issue 87's fused casts (parallel/fp8/fused.py, docs/fp8.md "Fused casts")
    fp8_fused_casts: str = option(
        "auto", choices=("auto", "on", "off"), group="zero",
        help="with --fp8-format, each FP8 cast (amax, scale, quantize, its transpose, the guard's counts) and each "
             "GEMM's epilogue as one torch.compile'd region: auto fuses on CUDA and not on a CPU (compiling costs "
             "seconds a region), on fuses wherever inductor compiles, off never")
    first_last_layers_bf16: bool = option(
        False, action="store_true", group="zero",
        help="with --fp8-format, keep the first and last blocks' linears in high precision")
    num_layers_at_start_in_bf16: int = option(1, group="zero", help="--first-last-layers-bf16's blocks at the start")
    num_layers_at_end_in_bf16: int = option(1, group="zero", help="--first-last-layers-bf16's blocks at the end")

    # Mixture of experts (issue 51; gpt/moe/): Megatron-LM's --num-experts and --moe-* flags, DeepSpeed-MoE's inside
    experts: MoESettings = section(MoESettings)

    @classmethod
    def of(cls, **settings) -> "ModelConfig":
        """A model from its settings by name, a section's among them (`mtp_num_layers=1`), as flags give them."""
        return with_settings(cls, settings)

    @property
    def longrope(self) -> Optional[LongRope]:
        """--position-embedding-type longrope's resolved factors (gpt/longrope.py), None for other positions."""
        return self.positions.longrope(self.max_position_embeddings)

    @property
    def moe(self) -> Optional[MoESettings]:
        """The MoE layers' settings at the largest expert count (gpt/moe/settings.py), or None for a dense model (no
        --num-experts, or 1)."""
        largest = largest_expert_count(self.experts.num_experts)
        return None if largest is None else self.experts.for_layer(largest, self.ffn_size)

    @property
    def per_layer_experts(self) -> bool:
        """--num-experts gives different counts per MoE layer (Megatron-DeepSpeed's list; PR-MoE's pyramid)."""
        return isinstance(self.experts.num_experts, tuple)

    def with_layers(self, num_layers: int, **changes) -> "ModelConfig":
        """This model at another layer count, for counting (a one-block shape probe, a pipeline stage's GEMMs): the
        per-layer pattern flags, written for the real model's layers and shaping no parameter, are dropped rather
        than checked again against the probe's count (--no-rope-freq 4 is valid at 8 layers, not at 1)."""
        return replace_settings(self, num_layers=num_layers, window_attn_skip_freq=None, no_rope_freq=None,
                                hybrid_layer_pattern=None, **changes)

    def moe_layers(self) -> tuple[bool, ...]:
        """Per layer, whether it is an MoE layer (--moe-layer-freq); all False for a dense model."""
        if self.moe is None:
            return (False,) * self.num_layers
        if self.experts.deepspeed.gating == "deepspeed":  # Megatron-DeepSpeed's get_num_experts_per_layer
            return tuple(count > 1 for count in self.experts_per_layer())
        return moe_layer_pattern(self.experts.layer_freq, self.num_layers)

    def experts_per_layer(self) -> tuple[int, ...]:
        """Each layer's number of experts, 1 for a dense layer. A Megatron-DeepSpeed launch maps --num-experts (one
        count, or one per MoE layer) onto every --expert-interval-th layer (gpt/moe/settings.py experts_per_layer);
        Megatron-Core's router gives every MoE layer of --moe-layer-freq the one count."""
        if self.moe is None:
            return (1,) * self.num_layers
        experts = self.experts
        if experts.deepspeed.gating == "deepspeed":
            return experts_per_layer(experts.num_experts, self.num_layers, experts.deepspeed.expert_interval)
        return tuple(experts.num_experts if is_moe else 1
                     for is_moe in moe_layer_pattern(experts.layer_freq, self.num_layers))

    def moe_of(self, layer: int) -> "MoESettings":
        """Layer `layer`'s (0-based) MoE settings: `moe` with that layer's number of experts."""
        return self.experts.for_layer(self.experts_per_layer()[layer], self.ffn_size)

    def expert_counts(self) -> tuple[int, ...]:
        """The distinct numbers of experts of the MoE layers, smallest first."""
        return tuple(sorted({count for count in self.experts_per_layer() if count > 1}))

    def attention_windows(self) -> tuple[Optional[int], ...]:
        """Per layer (0-based): the keys before each query its attention sees, or None (gpt/attention_settings.py)."""
        return self.attention.attention_windows(self.num_layers)

    def has_windows(self) -> bool:
        """Whether some layer has a sliding window (without a tuple per layer)."""
        return self.attention.has_windows(self.num_layers)

    @property
    def ffn_size(self) -> int:
        """--ffn-hidden-size, else Megatron-LM's default: 4h, or SwiGLU's two thirds of it (gpt/mlp.py)."""
        return self.mlp.ffn_size(self.hidden_size, self.ffn_hidden_size)

    @property
    def head_dim(self) -> int:
        """--kv-channels, else Megatron-LM's default hidden / heads (validate_args:
        `if args.kv_channels is None: ... args.kv_channels = args.hidden_size // args.num_attention_heads`)."""
        return self.kv_channels if self.kv_channels is not None else self.hidden_size // self.num_attention_heads

    def padded_vocab_size(self, tensor_parallel_size: int = 1) -> int:
        try:
            return padded_vocab_size(self.vocab_size, self.make_vocab_size_divisible_by, tensor_parallel_size,
                                     self.pad_vocab_size_to)
        except ValueError as error:
            raise ConfigError(str(error), flags=("--pad-vocab-size-to", "--tensor-model-parallel-size")) from None

    def validate_tensor_parallel(self, tensor_parallel_size: int) -> None:
        """Each TP rank takes whole attention heads and an equal slice of hidden and 4h."""
        for name, size in (("num_attention_heads", self.num_attention_heads), ("hidden_size", self.hidden_size),
                           ("ffn_hidden_size", self.ffn_size)):
            if size % tensor_parallel_size != 0:
                raise ConfigError(f"{_flag(name)} {size} is not divisible by --tensor-model-parallel-size "
                                  f"{tensor_parallel_size}; each tensor-parallel rank needs an equal share",
                                  flags=(_flag(name), "--tensor-model-parallel-size"))
        self.validate_blocks(tensor_parallel_size)
        if self.moe is not None and self.moe.deepspeed.use_residual and tensor_parallel_size > 1:
            # Megatron-DeepSpeed's residual MLP is the experts' template (ParallelMLP(moe=True)), not split over TP
            raise ConfigError(f"--mlp-type residual with --tensor-model-parallel-size {tensor_parallel_size} is not "
                              f"implemented: PR-MoE's dense MLP is not tensor-parallel here; run it at "
                              f"--tensor-model-parallel-size 1", flags=("--mlp-type", "--tensor-model-parallel-size"))

    @classmethod
    def from_record(cls, recorded: dict) -> "ModelConfig":
        """The model of a recorded config's `model` section (checkpoint metadata), without the parallel
        settings the record keeps there (`sequence_parallel`: parallel/config.py RECORDED_SECTION)."""
        beside = {name for name, section in RECORDED_SECTION.items() if section == "model"}
        return with_settings(cls, {name: value for name, value in recorded.items() if name not in beside})

    def validate_blocks(self, tensor_parallel_size: int = 1) -> None:
        """The blocks' sections' own rules, at a tensor-parallel size (GPTModel checks them as it builds)."""
        self.norms.validate()
        self.mlp.validate()
        self.positions.validate(self.head_dim, self.num_layers)
        self.attention.validate(self.num_attention_heads, self.num_layers, tensor_parallel_size)
        self.mla.validate()
        ffn = self.ffn_size
        if ffn < 1 or ffn % tensor_parallel_size:
            raise ConfigError(f"--ffn-hidden-size {ffn} is not a positive multiple of --tensor-model-parallel-size "
                              f"{tensor_parallel_size}; each tensor-parallel rank needs an equal share",
                              flags=("--ffn-hidden-size", "--tensor-model-parallel-size"))

    def validate(self) -> None:
        """The trunk's rules, then each section's (its own file), then the rules across sections
        (gpt/section_rules.py)."""
        self._validate_trunk()
        self.mtp.validate(self.seq_length)
        self.validate_blocks()
        if self.hybrid_layer_pattern is not None:
            check_model_follows_pattern(self)
        self._validate_experts()
        check_layers_without_rotary(self.positions, self.mla, self.mtp)
        check_multi_latent_attention(self.mla, self.attention, self.positions, self.num_layers)
        check_mlp_with_experts(self.mlp, has_experts=self.moe is not None)
        check_output_layer(self.z_loss_strength, self.final_logit_softcapping, self.cross_entropy_loss_fusion)

    def _validate_trunk(self) -> None:
        for name in ("num_layers", "hidden_size", "num_attention_heads", "seq_length",
                     "max_position_embeddings", "make_vocab_size_divisible_by"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{_flag(name)} must be at least 1, got {getattr(self, name)}", flags=(_flag(name),))
        for name in ("ffn_hidden_size", "kv_channels"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise ConfigError(f"{_flag(name)} must be at least 1, got {getattr(self, name)}", flags=(_flag(name),))
        # Megatron-LM asserts the division only where it derives the head width from it (validate_args).
        if self.kv_channels is None and self.hidden_size % self.num_attention_heads != 0:
            raise ConfigError(f"--hidden-size {self.hidden_size} is not divisible by --num-attention-heads "
                              f"{self.num_attention_heads}; choose sizes with hidden = heads x head_dim, or give "
                              f"each head's width with --kv-channels",
                              flags=("--hidden-size", "--num-attention-heads", "--kv-channels"))
        if self.seq_length > self.max_position_embeddings:
            raise ConfigError(f"--seq-length {self.seq_length} is larger than --max-position-embeddings "
                              f"{self.max_position_embeddings}; raise the latter or shorten the sequence",
                              flags=("--seq-length", "--max-position-embeddings"))
        for name in ("hidden_dropout", "attention_dropout"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ConfigError(f"{_flag(name)} must be in [0, 1), got {getattr(self, name)}", flags=(_flag(name),))
        if self.init_method_std <= 0:
            raise ConfigError(f"--init-method-std must be positive, got {self.init_method_std}",
                              flags=("--init-method-std",))
        if self.vocab_size < 0:
            raise ConfigError(f"--vocab-size must be at least 1, got {self.vocab_size}", flags=("--vocab-size",))
        if self.z_loss_strength < 0:
            raise ConfigError(f"--z-loss-strength must be 0 or more, got {self.z_loss_strength}",
                              flags=("--z-loss-strength",))
        if self.final_logit_softcapping is not None and not 0 < self.final_logit_softcapping < float("inf"):
            raise ConfigError(f"--final-logit-softcapping must be a positive number, got "
                              f"{self.final_logit_softcapping}", flags=("--final-logit-softcapping",))

    def _validate_experts(self) -> None:
        counts = self.experts.num_experts if self.per_layer_experts else (self.experts.num_experts or 0,)
        if min(counts) < 0:
            raise ConfigError(f"--num-experts must be at least 1, got {min(counts)}", flags=("--num-experts",))
        if self.moe is None:
            return
        if self.per_layer_experts and self.experts.deepspeed.gating != "deepspeed":
            raise ConfigError(f"--num-experts {' '.join(map(str, counts))}: a count per MoE layer is "
                              f"Megatron-DeepSpeed's (DeepSpeed-MoE's gating, a --deepspeed launch or --moe-gating "
                              f"deepspeed); Megatron-Core's router takes one count, and --moe-layer-freq chooses "
                              f"the MoE layers", flags=("--num-experts", "--moe-gating"))
        self.experts.validate_gating()
        for count in self.expert_counts():
            self.experts.for_layer(count, self.ffn_size).validate()

def _flag(name: str) -> str:
    return flag_of_setting(ModelConfig, name)
