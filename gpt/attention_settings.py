"""The attention section of the model settings: key/value groups, query/key norms, output gate, softmax scale, sinks and
soft-capping, sliding windows, kernel and CP exchange, as Megatron-LM's flags."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Optional, Union

from base.errors import ConfigError
from base.options import option
from gpt.attention_sinks import SOFTMAX_TYPES
from gpt.attention_window import any_layer_windowed, check_window_size, layer_windows, window_size_value
from gpt.layer_pattern import freq_value

ATTENTION_BACKENDS = ("auto", "flash", "fused", "unfused", "local")
CP_COMM_TYPES = ("p2p", "all_gather", "a2a", "a2a+p2p")


@dataclass(frozen=True)
class AttentionSettings:
    SETTING_PREFIX: ClassVar[str] = ""
    # how attention is computed, not what: a resume may change them
    NOT_THE_MATH: ClassVar[tuple[str, ...]] = ("attention_backend", "cp_comm_type", "pad_attention_head_dim")

    attention_dropout: float = 0.1
    # None: one key/value head per query head; 1 is multi-query
    num_query_groups: Optional[int] = option(
        None, aliases={"--num-key-value-heads": "Megatron-DeepSpeed"},
        help="key/value heads (grouped-query attention; 1 is multi-query); default: one per attention head. "
             "Megatron-LM reads it only with --group-query-attention, which is refused without it here")
    # the QKV projection keeps its bias when the other linears have none
    add_qkv_bias: bool = option(False, feature=True, action="store_true",
                                help="keep the query-key-value bias when --disable-bias-linear drops the others (Qwen)")
    # the model's normalization over each query and key head (Qwen3)
    qk_layernorm: bool = option(False, feature=True, action="store_true",
                                help="--normalization over each query and key head before attention (Qwen3)")
    # RMS over each head, no gain; takes --qk-layernorm's place, as Megatron-Core picks L2Norm
    qk_l2_norm: bool = option(False, feature=True, action="store_true",
                              help="each query and key head scaled to a mean square of 1 before attention, no gain "
                                   "(Megatron-Core's L2Norm; Llama 4); with --qk-layernorm it takes that norm's place")
    # norms over the whole query and key projections (OLMo 2)
    qk_layernorm_over_projection: bool = option(
        False, feature=True, action="store_true",
        help="with --qk-layernorm: the norms act over the whole query projection (heads x head dim) and the whole "
             "key projection, one gain per feature, instead of over each head (OLMo 2, OLMoE)")
    # a gate per query head from the QKV projection
    attention_output_gate: bool = option(
        False, feature=True, action="store_true",
        help="the QKV projection also yields a gate per query head; attention's output is multiplied by its "
             "sigmoid before the output projection (Megatron-LM, Qwen3-Next)")
    # Megatron-Core's softmax_scale (Gemma 2)
    softmax_scale: Optional[float] = option(
        None, feature=True,
        help="attention scores' scale (default 1/sqrt(head width)); Gemma's query_pre_attn_scalar q is q^-0.5")
    attn_logit_softcapping: Optional[float] = option(
        None, feature="attn_logit_softcapping",
        help="attention scores become c x tanh(score / c) before the mask and softmax (Gemma 2)")
    # transformers' config.clip_qkv (OLMoE, DBRX); no Megatron-LM flag
    clip_qkv: Optional[float] = option(
        None, feature="clip_qkv",
        help="the queries, keys and values clamped to [-C, C] after their projections and query/key norms, "
             "before rotary (OLMoE's clip_qkv)")
    # Megatron-Core's softmax_type (attention sinks)
    softmax_type: str = option(
        "vanilla", feature=True, choices=SOFTMAX_TYPES,
        help="attention's softmax: vanilla; off-by-one (each row's denominator + 1); learnable (a learned logit per "
             "head in each row's denominator: attention sinks, GPT-OSS)")
    # Megatron-Core's window_size and window_attn_skip_freq (Mistral, Gemma 2/3, GPT-OSS)
    window_size: Optional[tuple] = option(
        None, type=window_size_value, metavar="LEFT,RIGHT",
        help="sliding-window attention: a query sees itself and the LEFT keys before it (-1: no limit; attention "
             "is causal, so RIGHT is 0 whatever it says); default: the whole causal context")
    window_attn_skip_freq: Union[None, int, str] = option(
        None, type=freq_value,
        help="with --window-size, which layers have the window: N gives every layer but each N-th (1-based) a "
             "window; a list expression gives one 1 (window) or 0 (full attention) per layer, e.g. '([1]*5+[0])*4'; "
             "default: every layer")
    # Megatron's other spellings (--use-flash-attn) are in arguments/megatron/flags.py
    attention_backend: str = option(
        "auto", choices=ATTENTION_BACKENDS,
        help="the SDPA kernel (Megatron's names): flash = flash attention, fused = cuDNN or the memory-efficient "
             "kernel, unfused/local = the math kernel, auto = PyTorch's choice")
    # read only with --context-parallel-size > 1; one value for every layer (Megatron also takes one per layer)
    cp_comm_type: str = option(
        "p2p", choices=CP_COMM_TYPES, group="training",
        help="with --context-parallel-size > 1, how attention reaches the other ranks' keys and values: p2p (the "
             "ring, partial softmaxes merged), all_gather (gathered once), a2a (DeepSpeed-Ulysses: heads split "
             "over the CP ranks) or a2a+p2p (a2a over the first of --hierarchical-context-parallel-sizes, the ring "
             "over the second), for every layer")
    # acts only on CUDA: CPU math is unchanged
    pad_attention_head_dim: bool = option(
        True, help="on CUDA, zero-pad a head dim that is not a multiple of 8 (the paper's 1.5B: 100 -> 104) so "
                   "SDPA's fused kernels take it; the attention is the same (scale 1/sqrt(original head dim)); "
                   "no effect on a CPU or with --attention-backend unfused/local")

    def __post_init__(self) -> None:
        if isinstance(self.window_size, list):
            object.__setattr__(self, "window_size", tuple(self.window_size))

    def query_groups(self, num_attention_heads: int) -> int:
        return num_attention_heads if self.num_query_groups is None else self.num_query_groups

    def qkv_bias(self, add_bias_linear: bool) -> bool:
        """Whether the QKV projection has a bias (--add-bias-linear or --add-qkv-bias)."""
        return add_bias_linear or self.add_qkv_bias

    def attention_windows(self, num_layers: int) -> tuple[Optional[int], ...]:
        """Per layer: the keys before each query it sees, or None for the whole causal context."""
        return layer_windows(self.window_size, self.window_attn_skip_freq, num_layers)

    def has_windows(self, num_layers: int) -> bool:
        return any_layer_windowed(self.window_size, self.window_attn_skip_freq, num_layers)

    def validate(self, num_attention_heads: int, num_layers: int, tensor_parallel_size: int = 1) -> None:
        if not 0.0 <= self.attention_dropout < 1.0:
            raise ConfigError(f"--attention-dropout must be in [0, 1), got {self.attention_dropout}",
                              flags=("--attention-dropout",))
        if self.attention_backend not in ATTENTION_BACKENDS:
            raise ConfigError(f"--attention-backend {self.attention_backend!r} is not one of "
                              f"{', '.join(ATTENTION_BACKENDS)}", flags=("--attention-backend",))
        for flag, value in (("--softmax-scale", self.softmax_scale),
                            ("--attn-logit-softcapping", self.attn_logit_softcapping), ("--clip-qkv", self.clip_qkv)):
            if value is not None and not 0 < value < float("inf"):
                raise ConfigError(f"{flag} must be a positive number, got {value}", flags=(flag,))
        if self.softmax_type not in SOFTMAX_TYPES:
            raise ConfigError(f"--softmax-type {self.softmax_type} is not one of {', '.join(SOFTMAX_TYPES)}",
                              flags=("--softmax-type",))
        if self.softmax_type != "vanilla" and self.attn_logit_softcapping is not None:
            raise ConfigError(f"--softmax-type {self.softmax_type} with --attn-logit-softcapping is not implemented: "
                              f"the sink's score joins SDPA's, which cannot cap the others",
                              flags=("--softmax-type", "--attn-logit-softcapping"))
        _check_groups(self, num_attention_heads, tensor_parallel_size)
        _check_query_key_norms(self)
        check_window_size(self.window_size)
        if self.window_attn_skip_freq is not None and "[" in str(self.window_attn_skip_freq):
            self.attention_windows(num_layers)  # one 0 or 1 per layer


def _check_groups(attention: AttentionSettings, num_attention_heads: int, tensor_parallel_size: int) -> None:
    """Key/value groups divide the heads and fit the TP ranks."""
    groups = attention.query_groups(num_attention_heads)
    if groups < 1 or num_attention_heads % groups:  # 0 is refused, not read as one per head
        raise ConfigError(f"--num-query-groups {groups} does not divide --num-attention-heads "
                          f"{num_attention_heads}; each key/value group serves an equal number of heads",
                          flags=("--num-query-groups", "--num-attention-heads"))
    # a multiple or divisor of TP, as Megatron-Core requires; a divisor's groups are read by tp / groups ranks each
    if groups % tensor_parallel_size and tensor_parallel_size % groups:
        raise ConfigError(f"--num-query-groups {groups} must be a multiple or divisor of "
                          f"--tensor-model-parallel-size {tensor_parallel_size} (Megatron-Core's rule): each "
                          f"tensor-parallel rank needs whole key/value groups or a share of one",
                          flags=("--num-query-groups", "--tensor-model-parallel-size"))
    if groups < tensor_parallel_size and attention.qk_layernorm_over_projection:
        raise ConfigError(f"--qk-layernorm-over-projection with --num-query-groups {groups} below "
                          f"--tensor-model-parallel-size {tensor_parallel_size} is not implemented: the key "
                          f"norm's features are cut over the TP ranks, which here each read a whole group",
                          flags=("--qk-layernorm-over-projection", "--num-query-groups",
                                 "--tensor-model-parallel-size"))


def _check_query_key_norms(attention: AttentionSettings) -> None:
    # Megatron-Core has no L2 norm over projections
    if attention.qk_l2_norm and attention.qk_layernorm_over_projection:
        raise ConfigError("--qk-l2-norm with --qk-layernorm-over-projection is not implemented: the L2 norm acts "
                          "over each head of multi-head or grouped-query attention, as in Megatron-Core",
                          flags=("--qk-l2-norm", "--qk-layernorm-over-projection"))
    if attention.qk_layernorm_over_projection and not attention.qk_layernorm:
        raise ConfigError("--qk-layernorm-over-projection says where --qk-layernorm's query and key norms act: add "
                          "--qk-layernorm", flags=("--qk-layernorm-over-projection", "--qk-layernorm"))
