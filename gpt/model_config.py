"""The model's shape: GPTModel's configuration, beside the model it builds (nanoGPT's GPTConfig).

It imports only torch-free helpers of the floors below (base/, parallel/), so building or inspecting
a model never loads the data pipeline or the flag parser. The run's other settings live in
arguments/config.py, which holds one of these as `PretrainConfig.model`.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
from dataclasses import dataclass
from typing import Optional, Union

from base.errors import ConfigError
from base.options import Const, flag_of_setting, option, replace_settings, section, with_settings
from gpt.architecture import NORMALIZATIONS, SOFTMAX_TYPES, SUBLAYER_NORM_PLACES, Architecture
from gpt.attention_window import check_window_size, window_size_value
from gpt.hybrid_pattern import check_model_follows_pattern
from gpt.layer_pattern import check_no_rope_freq
from gpt.longrope import LongRope, factor_list_value
from gpt.mla_settings import MLASettings
from gpt.moe.settings import (
    MoESettings,
    OneExpertCount,
    experts_per_layer,
    largest_expert_count,
    moe_freq_value,
    moe_layer_pattern,
    num_experts_value,
)
from gpt.mtp import MTPSettings
from parallel.config import RECORDED_SECTION
from parallel.layers import padded_vocab_size

FP8_FORMATS = ("e4m3", "hybrid")  # Megatron-LM's --fp8-format choices
FP8_RECIPE_CHOICES = ("tensorwise", "delayed", "mxfp8", "blockwise", "custom")  # Megatron-LM's --fp8-recipe

# squared_relu is Megatron-LM's --squared-relu (megatron/core/activations.py: relu(x)^2); xielu swiss-ai's
# Megatron-LM fork's --xielu (gpt/xielu.py).
ACTIVATIONS = ("gelu", "gelu_tanh", "squared_relu", "xielu")
# Megatron-Core's TransformerConfig.recompute_modules choices (transformer_config.py __post_init__'s allowed_modules)
RECOMPUTE_MODULES = ("core_attn", "moe_act", "layernorm", "mla_up_proj", "mlp", "moe", "shared_experts")


class TupleOfValues(argparse.Action):
    """nargs' values as a tuple: a ModelConfig stays hashable (gpt/shape.py keys its shapes by the config's values)."""

    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, tuple(values))


def _normalization_name(text: str) -> str:
    """Megatron-LM spells it RMSNorm, Megatron-DeepSpeed rmsnorm (its --normalization choices are
    layernorm and rmsnorm): either is the same setting."""
    return {name.lower(): name for name in NORMALIZATIONS}.get(text.lower(), text)


def _position_embedding_name(text: str) -> str:
    """Megatron-DeepSpeed's `absolute` is Megatron-LM's learned_absolute."""
    return "learned_absolute" if text == "absolute" else text
ATTENTION_BACKENDS = ("auto", "flash", "fused", "unfused", "local")
# ModelConfig fields moe_<name> that are MoESettings fields <name>
MOE_FIELDS = ("router_topk", "router_score_function", "router_pre_softmax", "router_topk_scaling_factor", "router_dtype",
              "router_num_groups", "router_group_topk", "router_enable_expert_bias", "router_bias_update_rate",
              "router_load_balancing_type", "aux_loss_coeff", "z_loss_coeff", "expert_capacity_factor",
              "pad_expert_input_to_capacity", "token_drop_policy", "shared_expert_intermediate_size",
              "shared_expert_gate", "router_force_load_balancing")
# Megatron-LM's --cp-comm-type choices (megatron/training/arguments.py)
CP_COMM_TYPES = ("p2p", "all_gather", "a2a", "a2a+p2p")


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
    layernorm_epsilon: float = option(1e-5, aliases={"--norm-epsilon": "Megatron-LM"})
    # The blocks beyond GPT-2 (issue 37), named as Megatron-LM's arguments (their dests); what each
    # builds is in gpt/architecture.py. The defaults are GPT-2's blocks.
    normalization: str = option("LayerNorm", type=_normalization_name,
                                help="LayerNorm (GPT-2) or RMSNorm (Llama); Megatron-DeepSpeed's layernorm/rmsnorm too")
    swiglu: bool = option(False, action="store_true",
                          help="SwiGLU MLP (Llama); --ffn-hidden-size defaults to int(4h x 2/3 / 64) x 64")
    position_embedding_type: str = option(
        "learned_absolute", type=_position_embedding_name,
        help="learned_absolute (GPT-2), rope (rotary, Llama), yarn (rotary with YaRN's frequencies and concentration: "
             "--rotary-scaling-factor, --mscale, --mscale-all-dim, --yarn-*), longrope (Phi-3's LongRoPE, not "
             "Megatron-LM's: --longrope-*) or none; Megatron-DeepSpeed's "
             "--use-rotary-position-embeddings --no-position-embedding is rope")
    rotary_base: float = option(10000.0, aliases={"--rotary-position-embeddings-theta": "Megatron-DeepSpeed",
                                                  "--rope-theta": "llm-jp's Megatron-LM fork"},
                                help="rotary positions' base (theta): 10000 Llama 2, 500000 Llama 3")
    rotary_percent: float = option(1.0, help="the fraction of each head's dims that rotate, in (0, 1]")
    use_rope_scaling: bool = option(False, action="store_true",
                                    help="Llama 3.1's scaling of the rotary frequencies (--rope-scaling-factor)")
    rope_scaling_factor: float = option(8.0, help="with --use-rope-scaling: Llama 3.1's factor")
    rotary_interleaved: bool = option(
        False, action="store_true",
        help="rotary positions rotate adjacent pairs of dims (2i, 2i+1) instead of the two halves (Megatron-LM)")
    num_query_groups: Optional[int] = option(
        None, aliases={"--num-key-value-heads": "Megatron-DeepSpeed"},
        help="key/value heads (grouped-query attention; 1 is multi-query); default: one per attention head. "
             "Megatron-LM reads it only with --group-query-attention, which is refused without it here")
    untie_embeddings_and_output_weights: bool = option(
        False, action="store_true", help="an output layer of its own instead of the token embedding's (Llama)")
    add_bias_linear: bool = option(
        True, consts=[Const(("--disable-bias-linear",), False, help="Megatron-LM: linears without biases (Llama)")],
        help="biases in every linear layer, as in GPT-2")
    add_qkv_bias: bool = option(False, action="store_true",
                                help="keep the query-key-value bias when --disable-bias-linear drops the others (Qwen)")
    qk_layernorm: bool = option(False, action="store_true",
                                help="--normalization over each query and key head before attention (Qwen3)")
    qk_l2_norm: bool = option(False, action="store_true",
                              help="each query and key head scaled to a mean square of 1 before attention, no gain "
                                   "(Megatron-Core's L2Norm; Llama 4); with --qk-layernorm it takes that norm's place")
    qk_layernorm_over_projection: bool = option(
        False, action="store_true",
        help="with --qk-layernorm: the norms act over the whole query projection (heads x head dim) and the whole "
             "key projection, one gain per feature, instead of over each head (OLMo 2, OLMoE)")
    attention_output_gate: bool = option(
        False, action="store_true",
        help="the QKV projection also yields a gate per query head; attention's output is multiplied by its "
             "sigmoid before the output projection (Megatron-LM, Qwen3-Next)")
    # The blocks of Gemma 2/3 and OLMo 2 (issue 63), each transformers' own: Megatron-LM's flag where it has one
    # (--apply-layernorm-1p, --rotary-seq-len-interpolation-factor; Megatron-Core's TransformerConfig softmax_scale),
    # else Megatron-Bridge's provider field's name (attn_logit_softcapping, final_logit_softcapping)
    apply_layernorm_1p: bool = option(
        False, action="store_true",
        help="every norm's gain is 1 + its stored weight (Megatron's zero-centered gamma; Gemma's RMSNorm), computed "
             "in fp32; the weights start at 0")
    sublayer_norms: str = option(
        "input", choices=SUBLAYER_NORM_PLACES,
        help="where each block's norms act, inside the residual branches: on the attention's and the MLP's input "
             "(GPT-2, Llama), on their output (OLMo 2), or both (Gemma 2/3)")
    gated_linear_unit: bool = option(
        False, action="store_true",
        help="a gated MLP, down(act(gate(x)) * up(x)), with --activation's gelu or gelu_tanh (GeGLU: Gemma); "
             "--swiglu is the same gate with SiLU")
    scale_embeddings_by_sqrt_hidden: bool = option(
        False, action="store_true",
        help="the token embeddings multiplied by sqrt(--hidden-size), rounded to their dtype (Gemma)")
    softmax_scale: Optional[float] = option(
        None, help="attention scores' scale (default 1/sqrt(head width)); Gemma's query_pre_attn_scalar q is q^-0.5")
    attn_logit_softcapping: Optional[float] = option(
        None, help="attention scores become c x tanh(score / c) before the mask and softmax (Gemma 2)")
    final_logit_softcapping: Optional[float] = option(
        None, help="the output logits become c x tanh(logit / c) before the loss (Gemma 2)")
    local_rotary_base: Optional[float] = option(
        None, help="the sliding-window layers' own rotary base, without --rotary-seq-len-interpolation-factor or "
                   "--use-rope-scaling (Gemma 3's rope_local_base_freq); default: the other layers' rotary")
    rotary_seq_len_interpolation_factor: Optional[float] = option(
        None, help="rotary positions divided by this factor (Megatron-LM; transformers' linear rope scaling)")
    # Not the math: which transformers class scripts/convert_to_hf.py writes (families/registry.py export_family),
    # where the blocks fit several (a Phi-3 and a Mistral are the same blocks); --init-from-hf sets the folder's
    hf_model_type: Optional[str] = option(
        None, help="the transformers family the Hugging Face export writes this model as (config.json's "
                   "model_type: llama, qwen2, qwen3, mistral, gemma2, gemma3_text, olmo2, phi3, ...); default: "
                   "the --init-from-hf folder's, else the first whose blocks are these")
    # Megatron-Core's TransformerConfig.softmax_type (gpt/attention_sinks.py)
    softmax_type: str = option(
        "vanilla", choices=SOFTMAX_TYPES,
        help="attention's softmax: vanilla; off-by-one (each row's denominator + 1); learnable (a learned logit per "
             "head in each row's denominator: attention sinks, GPT-OSS)")
    # Megatron-LM's --quick-geglu, --glu-linear-offset, --activation-func-clamp-value (gpt/glu.py)
    quick_geglu: bool = option(
        False, action="store_true",
        help="a gated MLP with quick_gelu(gate) = gate x sigmoid(1.702 gate) times its linear half (GPT-OSS)")
    glu_linear_offset: float = option(0.0, help="with --swiglu or --quick-geglu: add this to the gated MLP's linear "
                                                "half (GPT-OSS: 1)")
    activation_func_clamp_value: Optional[float] = option(
        None, help="with --quick-geglu (or --swiglu's experts): clamp the gate half at most and the linear half within "
                   "+-this before the activation (GPT-OSS: 7)")
    # --position-embedding-type yarn's (Megatron-LM's --yarn-* flags, at the values its argument_utils.py
    # _apply_yarn_config_from_args gives where they are left out)
    yarn_original_max_position_embeddings: int = option(
        4096, help="with --position-embedding-type yarn: the context the frequencies were trained at")
    yarn_beta_fast: float = option(32.0, help="with --position-embedding-type yarn: YaRN's beta_fast")
    yarn_beta_slow: float = option(1.0, help="with --position-embedding-type yarn: YaRN's beta_slow")
    yarn_correction_range_round_to_int: bool = option(
        True, help="with --position-embedding-type yarn: round the correction range to whole dims")
    # --position-embedding-type longrope's: Phi-3's LongRoPE (gpt/longrope.py), which Megatron-LM has no flag for;
    # --init-from-hf sets them from a Phi-3 folder's rope_scaling (families/phi3/config.py)
    longrope_short_factor: Optional[tuple] = option(
        None, type=factor_list_value, metavar="F1,F2,...",
        help="with --position-embedding-type longrope: each rotary frequency's divisor while the sequence is at most "
             "--longrope-original-max-position-embeddings (one per frequency, comma-separated)")
    longrope_long_factor: Optional[tuple] = option(
        None, type=factor_list_value, metavar="F1,F2,...",
        help="with --position-embedding-type longrope: each rotary frequency's divisor for a longer sequence")
    longrope_original_max_position_embeddings: Optional[int] = option(
        None, help="with --position-embedding-type longrope: the context the model was pretrained at")
    longrope_factor: Optional[float] = option(
        None, help="with --position-embedding-type longrope: the context's scaling, which sets the attention factor "
                   "(default: --max-position-embeddings / the original context)")
    longrope_attention_factor: Optional[float] = option(
        None, help="with --position-embedding-type longrope: cos and sin's factor (default: sqrt(1 + ln(factor) / "
                   "ln(original context)), 1 for a factor at most 1)")
    # Megatron-LM's sliding-window attention (Megatron-Core's TransformerConfig window_size, window_attn_skip_freq;
    # gpt/attention_window.py): Mistral, Gemma 2/3, GPT-OSS, Phi-3
    window_size: Optional[tuple] = option(
        None, type=window_size_value, metavar="LEFT,RIGHT",
        help="sliding-window attention: a query sees itself and the LEFT keys before it (-1: no limit; attention "
             "is causal, so RIGHT is 0 whatever it says); default: the whole causal context")
    window_attn_skip_freq: Union[None, int, str] = option(
        None, type=moe_freq_value,
        help="with --window-size, which layers have the window: N gives every layer but each N-th (1-based) a "
             "window; a list expression gives one 1 (window) or 0 (full attention) per layer, e.g. '([1]*5+[0])*4'; "
             "default: every layer")
    no_rope_freq: Union[None, int, str] = option(
        None, type=moe_freq_value,
        help="layers whose attention skips the rotary positions (Llama 4's NoPE layers): N skips each N-th layer "
             "(1-based; N divides --num-layers); a list expression gives one 1 (skip) or 0 per layer, e.g. "
             "'([0]*3+[1])*2'; default: none")
    # Megatron-LM's multi-latent attention (DeepSeek-V2/V3; gpt/mla.py): its section
    mla: MLASettings = section(MLASettings)
    rotary_scaling_factor: float = option(1.0, help="with --multi-latent-attention or --position-embedding-type yarn: "
                                                    "YaRN's scaling factor")
    mscale: float = option(1.0, help="with --multi-latent-attention or --position-embedding-type yarn: YaRN's mscale "
                                     "(the rotary concentration)")
    mscale_all_dim: float = option(0.0, help="with --multi-latent-attention or --position-embedding-type yarn: YaRN's "
                                             "mscale_all_dim (multi-latent attention's softmax scale too)")
    init_method_std: float = 0.02
    # "gelu_tanh" is "gelu_new" in transformers.
    activation: str = option("gelu_tanh", choices=ACTIVATIONS,
                             help="gelu_tanh is GPT-2's approximation, gelu the exact erf form, squared_relu "
                                  "relu(x)^2 (Megatron-LM's --squared-relu), xielu swiss-ai's xIELU with two "
                                  "learned scalars per MLP (its fork's --xielu)")
    # Megatron's --attention-backend; Megatron's other names for its values are SPELLINGS in
    # arguments/megatron/flags.py (--use-flash-attn).
    attention_backend: str = option(
        "auto", choices=ATTENTION_BACKENDS,
        help="the SDPA kernel (Megatron's names): flash = flash attention, fused = cuDNN or the memory-efficient "
             "kernel, unfused/local = the math kernel, auto = PyTorch's choice")
    # Megatron-Core's TransformerConfig.cp_comm_type (gpt/cp_attention.py); only read with --context-parallel-size > 1.
    # Megatron takes one value, or one per layer (nargs "+"); here one, for every layer.
    cp_comm_type: str = option(
        "p2p", choices=CP_COMM_TYPES, group="training",
        help="with --context-parallel-size > 1, how attention reaches the other ranks' keys and values: p2p (the "
             "ring, partial softmaxes merged), all_gather (gathered once), a2a (DeepSpeed-Ulysses: heads split "
             "over the CP ranks) or a2a+p2p (a2a over the first of --hierarchical-context-parallel-sizes, the ring "
             "over the second), for every layer")
    # Issue 40's lever 1 (gpt/attention_padding.py): acts only on CUDA, so CPU math is unchanged.
    pad_attention_head_dim: bool = option(
        True, help="on CUDA, zero-pad a head dim that is not a multiple of 8 (the paper's 1.5B: 100 -> 104) so "
                   "SDPA's fused kernels take it; the attention is the same (scale 1/sqrt(original head dim)); "
                   "no effect on a CPU or with --attention-backend unfused/local")
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

    # Mixture of experts (issue 51; gpt/moe/), Megatron-LM's flags and dests. Without --num-experts (or with 1:
    # one expert is the dense model) every MLP is dense and the rest has no effect.
    num_experts: Union[None, int, tuple] = option(
        None, type=num_experts_value, nargs="+", action=OneExpertCount, metavar="N",
        help="experts per MoE layer (Megatron-Core's MoE layer: a top-k router, the experts, balancing losses); "
             "default (or 1): a dense MLP; a Megatron-DeepSpeed launch (DeepSpeed-MoE's gating) may give one count "
             "per MoE layer (PR-MoE's pyramid: 32 ... 32 64 64)")
    moe_ffn_hidden_size: Optional[int] = option(None, help="each expert's hidden size (default: "
                                                                        "--ffn-hidden-size)")
    moe_layer_freq: Union[int, str] = option(
        1, type=moe_freq_value, help="N: an MoE layer at every layer i with i mod N == 0, dense between; or a list "
                               "expression with one 0 (dense) or 1 (MoE) per layer, e.g. '([1]*3+[0]*1)*2'")
    moe_router_topk: int = option(2, help="experts per token")
    moe_router_score_function: str = option("softmax",
                                            help="softmax or sigmoid scores (sigmoid: normalised over the top k)")
    moe_router_pre_softmax: bool = option(False, action="store_true",
                                          help="softmax over all experts before the top-k (else over the top k)")
    moe_router_topk_scaling_factor: Optional[float] = option(None,
                                                             help="multiply the top-k weights by this")
    moe_router_dtype: Optional[str] = option(None, choices=("fp32", "fp64"),
                                             help="the router's logits and scores in this precision")
    moe_router_num_groups: Optional[int] = option(None,
                                                  help="group-limited routing: the experts in this many groups")
    moe_router_group_topk: Optional[int] = option(None,
                                                  help="group-limited routing: each token chooses in this many groups")
    # Megatron-Core's deprecated name for it (swiss-ai's fork parses it): arguments/megatron/limited_devices.py
    moe_router_topk_limited_devices: Optional[int] = option(
        None, help="device-limited routing (deprecated in Megatron-Core): --moe-router-group-topk N over "
                   "--moe-router-num-groups equal to the expert-parallel ranks")
    moe_router_enable_expert_bias: bool = option(
        False, action="store_true",
        help="aux-loss-free balancing (DeepSeek-V3): a per-expert bias on the sigmoid scores chooses the experts, "
             "moved by --moe-router-bias-update-rate toward the mean load after each iteration")
    moe_router_bias_update_rate: float = option(1e-3, help="the expert bias's step per iteration")
    # Megatron-Core's TopKRouter.forward: `logits = apply_random_logits(logits)` (moe_utils.RandomSTE)
    moe_router_force_load_balancing: bool = option(
        False, action="store_true",
        help="benchmark routing, as Megatron-Core's: each router's logits are replaced by standard normal draws "
             "(per expert-parallel rank) before the top-k, their gradient passed to the real logits unchanged")
    moe_router_load_balancing_type: str = option(
        "aux_loss",
        help="aux_loss (GShard/Switch), seq_aux_loss (per sequence), global_aux_loss (token counts over the "
             "data-parallel group and the iteration), sinkhorn, or none")
    moe_aux_loss_coeff: float = option(0.0,
                                       help="the balancing loss's coefficient (its gradient only: it is logged "
                                            "beside the LM loss, not added to it)")
    moe_z_loss_coeff: Optional[float] = option(None, help="the router z-loss's coefficient (ST-MoE)")
    moe_expert_capacity_factor: Optional[float] = option(
        None, help="drop the tokens beyond ceil(tokens x k / experts x factor) per expert "
                                "(default: dropless)")
    moe_pad_expert_input_to_capacity: bool = option(False, action="store_true",
                                                    help="with a capacity: every expert takes exactly its capacity")
    moe_token_drop_policy: str = option("probs", choices=("probs", "position"),
                                        help="with a capacity: keep each expert's most probable tokens, or its first")
    moe_shared_expert_intermediate_size: Optional[int] = option(
        None, help="a shared expert of this hidden size that every token passes through")
    moe_shared_expert_gate: bool = option(False, action="store_true",
                                          help="gate the shared expert's output per token by sigmoid(x . w) "
                                               "(Qwen2-MoE)")

    # DeepSpeed-MoE's gating (gpt/moe/deepspeed_gating.py) and Megatron-DeepSpeed's flags for it; a
    # Megatron-DeepSpeed launch (--deepspeed, its flags) with --num-experts takes it (arguments/parser.py).
    moe_gating: str = option("megatron", choices=("megatron", "deepspeed"),
                             help="megatron: Megatron-Core's router (--moe-router-*); deepspeed: DeepSpeed-MoE's "
                                  "gating (--topk, --moe-train-capacity-factor, ...), which a Megatron-DeepSpeed "
                                  "launch with --num-experts takes")
    topk: int = option(1, help="DeepSpeed-MoE: experts per token (1, 2, or more)")
    moe_train_capacity_factor: float = option(1.0, help="DeepSpeed-MoE: the capacity factor in training")
    moe_eval_capacity_factor: float = option(1.0, help="DeepSpeed-MoE: the capacity factor in evaluation")
    moe_min_capacity: int = option(4, help="DeepSpeed-MoE: each expert's capacity at least this")
    moe_token_dropping: bool = option(
        True, consts=[Const(("--disable-moe-token-dropping",), False,
                            help="Megatron-DeepSpeed: DeepSpeed-MoE keeps every token")],
        help="DeepSpeed-MoE: drop the tokens beyond each expert's capacity")
    moe_loss_coeff: float = option(0.1, help="DeepSpeed-MoE: l_aux's coefficient (its gradient; logged as moe_loss)")
    moe_top2_2nd_expert_sampling: bool = option(
        True, consts=[Const(("--disable-moe-top2-2nd-expert-sampling",), False,
                            help="Megatron-DeepSpeed: top-2's second expert by argmax, not sampled")],
        help="DeepSpeed-MoE top-2: sample the second expert (Gumbel noise on the logits)")
    expert_interval: int = option(2, help="DeepSpeed-MoE: an MoE layer at every expert-interval-th layer (1-based)")
    mlp_type: str = option("standard", help="DeepSpeed-MoE: standard, or residual (PR-MoE: a dense MLP beside the "
                                            "experts, mixed per token by a learned coefficient)")

    def __post_init__(self) -> None:
        # a per-layer --num-experts read back from a recorded config (JSON) is a list: the same tuple as parsed
        if isinstance(self.num_experts, list):
            object.__setattr__(self, "num_experts", tuple(self.num_experts))
        if isinstance(self.window_size, list):  # the same, for the window's two sides
            object.__setattr__(self, "window_size", tuple(self.window_size))
        for name in ("longrope_short_factor", "longrope_long_factor"):  # and LongRoPE's factors
            if isinstance(getattr(self, name), list):
                object.__setattr__(self, name, tuple(getattr(self, name)))

    @classmethod
    def of(cls, **settings) -> "ModelConfig":
        """A model from its settings by name, a section's among them (`mtp_num_layers=1`), as flags give them."""
        return with_settings(cls, settings)

    @property
    def architecture(self) -> Architecture:
        """The blocks these settings choose, as GPTModel builds them."""
        return Architecture(**{name: getattr(self, name) for name in Architecture.__dataclass_fields__})

    @property
    def longrope(self) -> Optional[LongRope]:
        """--position-embedding-type longrope's factors and attention factor, resolved as transformers does (the
        default attention factor reads --max-position-embeddings); None for other positions."""
        if self.position_embedding_type != "longrope":
            return None
        return LongRope.resolve(self.longrope_short_factor, self.longrope_long_factor,
                                self.longrope_original_max_position_embeddings, self.max_position_embeddings,
                                self.longrope_factor, self.longrope_attention_factor)

    @property
    def moe(self) -> Optional["MoESettings"]:
        """The MoE layers' settings (gpt/moe/settings.py), or None for a dense model (no --num-experts, or 1)."""
        largest = largest_expert_count(self.num_experts)
        if largest is None:
            return None
        settings = {name: getattr(self, "moe_" + name) for name in MOE_FIELDS}
        if (settings["expert_capacity_factor"] or 0.0) < 0:
            # Megatron-Core's TransformerConfig.__post_init__: "if self.moe_expert_capacity_factor < 0:
            # self.moe_expert_capacity_factor = None", no capacity (dropless); said at the start (moe_notes)
            settings["expert_capacity_factor"] = None
        if self.moe_gating == "deepspeed":
            settings.update(router_topk=self.topk, router_load_balancing_type="none", aux_loss_coeff=0.0,
                            z_loss_coeff=None)
        return MoESettings(
            num_experts=largest,
            ffn_hidden_size=self.moe_ffn_hidden_size if self.moe_ffn_hidden_size is not None else self.ffn_size,
            gating=self.moe_gating, train_capacity_factor=self.moe_train_capacity_factor,
            eval_capacity_factor=self.moe_eval_capacity_factor, min_capacity=self.moe_min_capacity,
            drop_tokens=self.moe_token_dropping, loss_coeff=self.moe_loss_coeff,
            second_expert_sampling=self.moe_top2_2nd_expert_sampling, use_residual=self.mlp_type == "residual",
            **settings)

    @property
    def per_layer_experts(self) -> bool:
        """--num-experts gives different counts per MoE layer (Megatron-DeepSpeed's list; PR-MoE's pyramid)."""
        return isinstance(self.num_experts, tuple)

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
        if self.moe_gating == "deepspeed":  # Megatron-DeepSpeed's get_num_experts_per_layer: layer_num % interval
            return tuple(count > 1 for count in self.experts_per_layer())
        return moe_layer_pattern(self.moe_layer_freq, self.num_layers)

    def experts_per_layer(self) -> tuple[int, ...]:
        """Each layer's number of experts, 1 for a dense layer. A Megatron-DeepSpeed launch maps --num-experts (one
        count, or one per MoE layer) onto every --expert-interval-th layer (gpt/moe/settings.py experts_per_layer);
        Megatron-Core's router gives every MoE layer of --moe-layer-freq the one count."""
        if self.moe is None:
            return (1,) * self.num_layers
        if self.moe_gating == "deepspeed":
            return experts_per_layer(self.num_experts, self.num_layers, self.expert_interval)
        return tuple(self.num_experts if is_moe else 1
                     for is_moe in moe_layer_pattern(self.moe_layer_freq, self.num_layers))

    def moe_of(self, layer: int) -> "MoESettings":
        """Layer `layer`'s (0-based) MoE settings: `moe` with that layer's number of experts."""
        return dataclasses.replace(self.moe, num_experts=self.experts_per_layer()[layer])

    def expert_counts(self) -> tuple[int, ...]:
        """The distinct numbers of experts of the MoE layers, smallest first."""
        return tuple(sorted({count for count in self.experts_per_layer() if count > 1}))

    def attention_windows(self) -> tuple[Optional[int], ...]:
        """Per layer (0-based): the keys before each query its attention sees (--window-size's left side), or None
        for the whole causal context (gpt/attention_window.py)."""
        return self.architecture.attention_windows(self.num_layers)

    def has_windows(self) -> bool:
        """Whether some layer has a sliding window (without a tuple per layer)."""
        return self.architecture.has_windows(self.num_layers)

    @property
    def ffn_size(self) -> int:
        """--ffn-hidden-size, else Megatron-LM's default: 4h, or SwiGLU's two thirds of it (architecture.py)."""
        return self.architecture.ffn_size(self.hidden_size, self.ffn_hidden_size)

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
        self.architecture.validate(self.num_attention_heads, self.hidden_size, self.ffn_hidden_size,
                                   tensor_parallel_size, head_dim=self.head_dim)
        if self.moe is not None and self.moe.use_residual and tensor_parallel_size > 1:
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

    def _check_gating_flags(self) -> None:
        """DeepSpeed-MoE (a Megatron-DeepSpeed launch) reads --topk, --moe-train-capacity-factor, ...; Megatron-Core's
        router reads --moe-router-topk, --moe-aux-loss-coeff, ...: the other side's flags would do nothing, so a
        launch giving them is told in one line. A count per MoE layer, and PR-MoE (--mlp-type residual), are
        Megatron-DeepSpeed's (DeepSpeed-MoE's MoE(use_residual=True))."""
        if self.mlp_type not in MLP_TYPES:
            raise ConfigError(f"--mlp-type {self.mlp_type} is not one of {', '.join(MLP_TYPES)} (Megatron-DeepSpeed's "
                              f"choices)", flags=("--mlp-type",))
        if self.expert_interval < 1:
            raise ConfigError(f"--expert-interval must be at least 1, got {self.expert_interval}",
                              flags=("--expert-interval",))
        deepspeed = self.moe_gating == "deepspeed"
        other = _differs_from_default(self, MEGATRON_MOE_FIELDS + ("moe_shared_expert_intermediate_size",)
                                      if deepspeed else DEEPSPEED_MOE_FIELDS)
        if other:
            flags = tuple(_flag(name) for name in other)
            raise ConfigError(
                f"{', '.join(flags)} " + (
                    "set Megatron-Core's router, but this Megatron-DeepSpeed launch gates by DeepSpeed-MoE "
                    "(--topk, --moe-train-capacity-factor, --moe-loss-coeff, ...): drop them, or pass --moe-gating "
                    "megatron" if deepspeed else
                    "set DeepSpeed-MoE's gating, which a Megatron-DeepSpeed launch (--deepspeed) or --moe-gating "
                    "deepspeed takes; this launch uses Megatron-Core's router (--moe-router-topk, ...)"),
                flags=flags)

    def _check_gemma_features(self) -> None:
        """What the gated MLP, the soft-capping and the per-layer rotary are not built with, one line each."""
        if self.gated_linear_unit and self.activation not in ("gelu", "gelu_tanh"):
            raise ConfigError(f"--gated-linear-unit gates --activation gelu or gelu_tanh here (GeGLU), not "
                              f"{self.activation}", flags=("--gated-linear-unit", "--activation"))
        if self.gated_linear_unit and self.moe is not None:
            raise ConfigError("--gated-linear-unit with --num-experts is not implemented: the experts are SwiGLU "
                              "(--swiglu) or ungated", flags=("--gated-linear-unit", "--num-experts"))
        if self.final_logit_softcapping is not None and self.cross_entropy_loss_fusion:
            raise ConfigError("--final-logit-softcapping with --cross-entropy-loss-fusion is not implemented: the "
                              "fused output layer computes the loss of uncapped logits; drop "
                              "--cross-entropy-loss-fusion",
                              flags=("--final-logit-softcapping", "--cross-entropy-loss-fusion"))
        if self.softmax_type != "vanilla" and self.attn_logit_softcapping is not None:
            raise ConfigError(f"--softmax-type {self.softmax_type} with --attn-logit-softcapping is not implemented: "
                              f"the sink's score joins SDPA's, which cannot cap the others",
                              flags=("--softmax-type", "--attn-logit-softcapping"))
        if self.position_embedding_type == "yarn":
            given = [flag for flag, value in (("--local-rotary-base", self.local_rotary_base),
                                              ("--rotary-seq-len-interpolation-factor",
                                               self.rotary_seq_len_interpolation_factor)) if value is not None]
            if given:
                raise ConfigError(f"--position-embedding-type yarn with {', '.join(given)} is not implemented: YaRN's "
                                  f"frequencies are Megatron-Core's YarnRotaryEmbedding's, one set for every layer",
                                  flags=("--position-embedding-type", *given))
        if self.mla.multi_latent_attention:
            given = [flag for flag, value in (("--softmax-scale", self.softmax_scale),
                                              ("--attn-logit-softcapping", self.attn_logit_softcapping),
                                              ("--local-rotary-base", self.local_rotary_base),
                                              ("--rotary-seq-len-interpolation-factor",
                                               self.rotary_seq_len_interpolation_factor)) if value is not None]
            if self.position_embedding_type == "longrope":
                given.append("--position-embedding-type longrope")
            if given:
                raise ConfigError(f"--multi-latent-attention with {', '.join(given)} is not implemented: multi-latent "
                                  f"attention scales its scores and rotates its positions as Megatron-Core's "
                                  f"MLASelfAttention (YaRN's mscale)", flags=("--multi-latent-attention", *given))

    def _check_gated_activation(self) -> None:
        """--quick-geglu, --glu-linear-offset and --activation-func-clamp-value as Megatron-LM takes them
        (core_transformer_config_from_args: `assert not args.swiglu` beside --quick-geglu; TransformerConfig.__post_init__:
        SwiGLU's clamp only in MoE experts, at a positive finite value and without an offset). The offset and the clamp
        act on a gated MLP's halves only; without one they would do nothing, so a launch giving them is told."""
        gated = self.swiglu or self.quick_geglu or self.gated_linear_unit
        if self.quick_geglu and (self.swiglu or self.activation in ("squared_relu", "xielu")):
            other = "--swiglu" if self.swiglu else f"--activation {self.activation}"
            raise ConfigError(f"--quick-geglu with {other}: give one activation (Megatron-LM asserts it)",
                              flags=("--quick-geglu", other.split()[0]))
        clamp = self.activation_func_clamp_value
        if (clamp is not None or self.glu_linear_offset) and not gated:
            raise ConfigError("--activation-func-clamp-value and --glu-linear-offset act on a gated MLP's halves: give "
                              "--quick-geglu, --swiglu or --gated-linear-unit, or drop them",
                              flags=("--activation-func-clamp-value", "--glu-linear-offset"))
        if clamp is not None and not (math.isfinite(clamp) and clamp > 0):
            raise ConfigError(f"--activation-func-clamp-value must be positive and finite, got {clamp}",
                              flags=("--activation-func-clamp-value",))
        if clamp is not None and self.swiglu:
            if self.moe is None:
                raise ConfigError("--activation-func-clamp-value with --swiglu clamps the experts' SwiGLU only: add "
                                  "--num-experts (Megatron-Core's TransformerConfig requires MoE)",
                                  flags=("--activation-func-clamp-value", "--swiglu"))
            if self.glu_linear_offset:
                raise ConfigError("--activation-func-clamp-value with --swiglu takes no --glu-linear-offset (as "
                                  "Megatron-Core's TransformerConfig requires)",
                                  flags=("--activation-func-clamp-value", "--glu-linear-offset"))
        if not math.isfinite(self.glu_linear_offset):
            raise ConfigError(f"--glu-linear-offset must be finite, got {self.glu_linear_offset}",
                              flags=("--glu-linear-offset",))

    def _check_multi_latent_attention(self) -> None:
        """--multi-latent-attention's sizes (its section's), and what it is not built with (gpt/mla.py)."""
        self.mla.validate()
        if not self.mla.multi_latent_attention:
            return
        if not self.rotary_scaling_factor > 0 or self.rotary_base <= 0:
            raise ConfigError("--rotary-scaling-factor and --rotary-base must be positive",
                              flags=("--rotary-scaling-factor", "--rotary-base"))
        # what Megatron-Core's MLA refuses (MLATransformerConfig.__post_init__: the output gate; YarnRotaryEmbedding:
        # interleaved rotary) or does not read for MLA, and Llama 3's scaling, which its rotary embeddings lack
        others = {"--attention-output-gate": self.attention_output_gate,
                  "--rotary-interleaved": self.rotary_interleaved,
                  "--use-rope-scaling": self.use_rope_scaling,
                  f"--rotary-percent {self.rotary_percent}": self.rotary_percent != 1.0}
        given = [flag for flag, on in others.items() if on]
        if given:
            raise ConfigError(f"--multi-latent-attention with {', '.join(given)} is not implemented: multi-latent "
                              f"attention here rotates all --qk-pos-emb-head-dim dims of each head, in halves after "
                              f"de-interleaving, with no output gate, as Megatron-Core's MLASelfAttention",
                              flags=("--multi-latent-attention", *(flag.split()[0] for flag in given)))

    def validate(self) -> None:
        for name in ("num_layers", "hidden_size", "num_attention_heads", "seq_length",
                     "max_position_embeddings", "make_vocab_size_divisible_by"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{_flag(name)} must be at least 1, got {getattr(self, name)}", flags=(_flag(name),))
        if self.ffn_hidden_size is not None and self.ffn_hidden_size < 1:
            raise ConfigError(f"--ffn-hidden-size must be at least 1, got {self.ffn_hidden_size}",
                              flags=("--ffn-hidden-size",))
        if self.kv_channels is not None and self.kv_channels < 1:
            raise ConfigError(f"--kv-channels must be at least 1, got {self.kv_channels}", flags=("--kv-channels",))
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
        if self.activation not in ACTIVATIONS:
            raise ConfigError(f"--activation {self.activation!r} is not one of {', '.join(ACTIVATIONS)}",
                              flags=("--activation",))
        if self.activation == "squared_relu" and self.swiglu:
            # Megatron-LM asserts it (core_transformer_config_from_args: `assert not args.swiglu`).
            raise ConfigError("--squared-relu replaces the MLP's activation and --swiglu gates it with SiLU: "
                              "give one of them", flags=("--activation", "--swiglu"))
        if self.activation == "xielu" and self.swiglu:
            # swiss-ai's fork: core_transformer_config_from_args raises "Only one activation function can be
            # selected at a time" for --swiglu with --xielu.
            raise ConfigError("--xielu replaces the MLP's activation and --swiglu gates it with SiLU: give one of "
                              "them (swiss-ai's Megatron-LM fork allows one activation at a time)",
                              flags=("--activation", "--swiglu"))
        self._check_gated_activation()
        if self.init_method_std <= 0 or self.layernorm_epsilon <= 0:
            raise ConfigError("--init-method-std and --layernorm-epsilon must be positive",
                              flags=("--init-method-std", "--layernorm-epsilon"))
        if self.vocab_size < 0:
            raise ConfigError(f"--vocab-size must be at least 1, got {self.vocab_size}", flags=("--vocab-size",))
        self.mtp.validate(self.seq_length)
        if self.z_loss_strength < 0:
            raise ConfigError(f"--z-loss-strength must be 0 or more, got {self.z_loss_strength}",
                              flags=("--z-loss-strength",))
        if self.z_loss_strength > 0 and self.cross_entropy_loss_fusion:
            raise ConfigError("--z-loss-strength with --cross-entropy-loss-fusion: the z-loss is not implemented in "
                              "the fused output layer; drop --cross-entropy-loss-fusion",
                              flags=("--z-loss-strength", "--cross-entropy-loss-fusion"))
        if self.attention_backend not in ATTENTION_BACKENDS:
            raise ConfigError(f"--attention-backend {self.attention_backend!r} is not one of "
                              f"{', '.join(ATTENTION_BACKENDS)}", flags=("--attention-backend",))
        self.architecture.validate(self.num_attention_heads, self.hidden_size, self.ffn_hidden_size,
                                   head_dim=self.head_dim)
        self._check_gemma_features()
        if self.qk_l2_norm and (self.mla.multi_latent_attention or self.qk_layernorm_over_projection):
            # gpt_layer_specs.py: "qk_l2_norm is not supported with MLA."; Megatron-Core has no norm over projections
            other = "--multi-latent-attention" if self.mla.multi_latent_attention else "--qk-layernorm-over-projection"
            raise ConfigError(f"--qk-l2-norm with {other} is not implemented: the L2 norm acts over each head of "
                              f"multi-head or grouped-query attention, as in Megatron-Core", flags=("--qk-l2-norm", other))
        if self.no_rope_freq:
            check_no_rope_freq(self.no_rope_freq, self.num_layers)
        if self.no_rope_freq and (self.mla.multi_latent_attention or self.mtp.num_layers):
            # MLA rotates inside its own projections (Megatron-Core's MLASelfAttention never reads the rotary that
            # Attention.forward drops), and an MTP layer's layer number is its own, not a decoder layer's
            other = "--multi-latent-attention" if self.mla.multi_latent_attention else "--mtp-num-layers"
            raise ConfigError(f"--no-rope-freq with {other} is not implemented: drop one of them",
                              flags=("--no-rope-freq", other))
        if self.qk_layernorm_over_projection and not self.qk_layernorm:
            raise ConfigError("--qk-layernorm-over-projection says where --qk-layernorm's query and key norms act: add "
                              "--qk-layernorm", flags=("--qk-layernorm-over-projection", "--qk-layernorm"))
        check_window_size(self.window_size)
        if self.window_attn_skip_freq is not None and "[" in str(self.window_attn_skip_freq):
            self.attention_windows()  # a list of one 0 or 1 per layer (refused otherwise, naming both flags)
        if self.has_windows() and self.mla.multi_latent_attention:
            # Megatron-Core's MLA asserts it (attention.py: "Set config.window_size = None or use a non-MLA attention
            # layer")
            raise ConfigError("--window-size with --multi-latent-attention is not implemented: multi-latent attention "
                              "sees the whole causal context, as in Megatron-Core",
                              flags=("--window-size", "--multi-latent-attention"))
        self._check_multi_latent_attention()
        if self.hybrid_layer_pattern is not None:
            check_model_follows_pattern(self)
        counts = self.num_experts if isinstance(self.num_experts, tuple) else (self.num_experts or 0,)
        if min(counts) < 0:
            raise ConfigError(f"--num-experts must be at least 1, got {min(counts)}", flags=("--num-experts",))
        if self.moe is not None:
            if self.per_layer_experts and self.moe_gating != "deepspeed":
                raise ConfigError(f"--num-experts {' '.join(map(str, self.num_experts))}: a count per MoE layer is "
                                  f"Megatron-DeepSpeed's (DeepSpeed-MoE's gating, a --deepspeed launch or --moe-gating "
                                  f"deepspeed); Megatron-Core's router takes one count, and --moe-layer-freq chooses "
                                  f"the MoE layers", flags=("--num-experts", "--moe-gating"))
            self._check_gating_flags()
            for count in self.expert_counts():
                dataclasses.replace(self.moe, num_experts=count).validate()


MLP_TYPES = ("standard", "residual")
# Megatron-DeepSpeed's DeepSpeed-MoE flags and Megatron-Core's router flags: each side's only under its gating
DEEPSPEED_MOE_FIELDS = ("topk", "moe_train_capacity_factor", "moe_eval_capacity_factor", "moe_min_capacity",
                        "moe_token_dropping", "moe_loss_coeff", "moe_top2_2nd_expert_sampling", "expert_interval",
                        "mlp_type")
MEGATRON_MOE_FIELDS = tuple("moe_" + name for name in MOE_FIELDS if name not in ("shared_expert_intermediate_size",
                                                                                 "shared_expert_gate"))


def _differs_from_default(config: "ModelConfig", names: tuple[str, ...]) -> list[str]:
    defaults = ModelConfig()
    return [name for name in names if getattr(config, name) != getattr(defaults, name)]


def _flag(name: str) -> str:
    return flag_of_setting(ModelConfig, name)
