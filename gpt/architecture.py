"""The blocks' architecture beyond GPT-2: RMSNorm, SwiGLU, rotary positions (in halves or interleaved),
grouped-query attention, per-head query/key norms, a gate on attention's output, an untied output layer,
linears without biases (issue 37, issue 48). The default is GPT-2, and builds GPT-2's exact
model: LayerNorm, a 4h GeLU MLP, learned absolute positions, one key/value head per query head, the
output layer tied to the token embedding, biases everywhere.

Each field is a ModelConfig setting of the same name (Megatron-LM's argument dest), so a flag, a YAML
key and a --print-config row; `ModelConfig.architecture` gathers them into this frozen view, which
GPTModel builds from and which holds the rules that read them together (ffn size, rotary dims,
validation). Megatron-DeepSpeed's spellings map onto them in arguments/megatron/flags.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Union

from base.errors import ConfigError
from gpt.attention_window import any_layer_windowed, layer_windows
from gpt.layer_pattern import no_rope_layers

NORMALIZATIONS = ("LayerNorm", "RMSNorm")  # Megatron-LM's --normalization choices we build
# of Megatron-LM's --position-embedding-type; yarn is Megatron-Core's YarnRotaryEmbedding (gpt/rotary.py yarn_angles);
# longrope is not Megatron's: Phi-3's LongRoPE as transformers computes it (gpt/longrope.py), a Hugging Face folder's
POSITION_EMBEDDING_TYPES = ("learned_absolute", "rope", "yarn", "longrope", "none")
ROTARY_TYPES = ("rope", "yarn", "longrope")
# --position-embedding-type longrope's settings (ModelConfig fields of these names, --longrope-*)
LONGROPE_SETTINGS = ("longrope_short_factor", "longrope_long_factor", "longrope_original_max_position_embeddings",
                     "longrope_factor", "longrope_attention_factor")
SOFTMAX_TYPES = ("vanilla", "off-by-one", "learnable")  # Megatron-Core's TransformerConfig.softmax_type
SUBLAYER_NORM_PLACES = ("input", "output", "input_and_output")  # --sublayer-norms


@dataclass(frozen=True)
class Architecture:
    normalization: str = "LayerNorm"
    swiglu: bool = False
    position_embedding_type: str = "learned_absolute"
    rotary_base: float = 10000.0
    rotary_percent: float = 1.0
    # Megatron-LM's --use-rope-scaling / --rope-scaling-factor: Llama 3's scaling of the frequencies.
    use_rope_scaling: bool = False
    rope_scaling_factor: float = 8.0
    # Megatron-LM's --rotary-interleaved: each pair of adjacent dims (2i, 2i + 1) rotates together, instead
    # of dim i with dim i + rotary_dim / 2 (gpt/rotary.py).
    rotary_interleaved: bool = False
    # None: one key/value head per query head (multi-head attention); 1 is multi-query attention.
    num_query_groups: Optional[int] = None
    untie_embeddings_and_output_weights: bool = False
    add_bias_linear: bool = True
    # Megatron-LM's --add-qkv-bias: the QKV projection keeps its bias when the other linears have none.
    add_qkv_bias: bool = False
    # Megatron-LM's --qk-layernorm: the model's normalization over each query and key head (Qwen3).
    qk_layernorm: bool = False
    # Megatron-LM's --qk-l2-norm: each query and key head over its root mean square, no gain (gpt/norms.py L2HeadNorm);
    # it takes --qk-layernorm's place where both are given, as Megatron-Core's SelfAttention picks L2Norm first
    qk_l2_norm: bool = False
    # Megatron-LM's --no-rope-freq: the layers whose attention skips the rotary positions (Llama 4's NoPE layers;
    # gpt/layer_pattern.py no_rope_layers)
    no_rope_freq: Union[None, int, str] = None
    # With it: the norms over the whole query and key projections instead of each head (OLMo 2; gpt/norms.py
    # ProjectionNorm)
    qk_layernorm_over_projection: bool = False
    # Megatron-LM's --attention-output-gate: the QKV projection also yields a gate per query head, and the
    # attention's output is multiplied by its sigmoid before the output projection (gpt/model.py).
    attention_output_gate: bool = False
    # Megatron-LM's --apply-layernorm-1p: each norm's gain is 1 + its weight, in fp32 (gpt/norms.py)
    apply_layernorm_1p: bool = False
    # where each block's norms act: "input" (before attention and MLP), "output" (on their outputs, inside the
    # residual branch: OLMo 2), "input_and_output" (Gemma 2/3)
    sublayer_norms: str = "input"
    # a gated MLP with --activation's GeLU (Gemma's GeGLU); --swiglu gates with SiLU
    gated_linear_unit: bool = False
    scale_embeddings_by_sqrt_hidden: bool = False
    softmax_scale: Optional[float] = None
    attn_logit_softcapping: Optional[float] = None
    final_logit_softcapping: Optional[float] = None
    # the sliding-window layers' rotary base (Gemma 3), and Megatron-LM's linear interpolation of positions
    local_rotary_base: Optional[float] = None
    rotary_seq_len_interpolation_factor: Optional[float] = None
    # Megatron-LM's --window-size (left, right) and --window-attn-skip-freq: sliding-window attention on the layers
    # the frequency picks (gpt/attention_window.py)
    window_size: Optional[tuple] = None
    window_attn_skip_freq: Union[None, int, str] = None
    # Megatron-LM's --softmax-type: attention sinks, a logit per head in the softmax's denominator, 0 (off-by-one)
    # or learned (gpt/attention_sinks.py; GPT-OSS's sinks)
    softmax_type: str = "vanilla"
    # Megatron-LM's --quick-geglu: the gated MLP with quick_gelu(x) = x sigmoid(1.702 x) in SiLU's place (GPT-OSS);
    # --glu-linear-offset adds to the linear half, --activation-func-clamp-value clamps both halves (gpt/glu.py)
    quick_geglu: bool = False
    glu_linear_offset: float = 0.0
    activation_func_clamp_value: Optional[float] = None
    # --position-embedding-type yarn's knobs (Megatron-LM's --rotary-scaling-factor, --mscale, --mscale-all-dim and
    # --yarn-*, gpt/rotary.py yarn_angles)
    rotary_scaling_factor: float = 1.0
    mscale: float = 1.0
    mscale_all_dim: float = 0.0
    yarn_original_max_position_embeddings: int = 4096
    yarn_beta_fast: float = 32.0
    yarn_beta_slow: float = 1.0
    yarn_correction_range_round_to_int: bool = True
    # --position-embedding-type longrope's (gpt/longrope.py): a factor per rotary frequency for sequences up to the
    # original context and one for longer ones, that context, and the attention factor (else from the factor, else
    # from --max-position-embeddings / the original context)
    longrope_short_factor: Optional[tuple] = None
    longrope_long_factor: Optional[tuple] = None
    longrope_original_max_position_embeddings: Optional[int] = None
    longrope_factor: Optional[float] = None
    longrope_attention_factor: Optional[float] = None

    @property
    def gated_mlp(self) -> bool:
        """The MLP's first projection is a gate and a linear half (SwiGLU's, quick-GeGLU's or --gated-linear-unit's
        GeGLU: Megatron-Core's TransformerConfig.gated_linear_unit, which each of them sets)."""
        return self.swiglu or self.quick_geglu or self.gated_linear_unit

    @property
    def rotary(self) -> bool:
        return self.position_embedding_type in ROTARY_TYPES

    @property
    def rope_scaling(self) -> Optional[float]:
        return self.rope_scaling_factor if self.use_rope_scaling else None

    @property
    def qkv_bias(self) -> bool:
        return self.add_bias_linear or self.add_qkv_bias

    def attention_windows(self, num_layers: int) -> tuple[Optional[int], ...]:
        """Per layer (0-based): the keys before each query its attention sees, or None for the whole causal
        context."""
        return layer_windows(self.window_size, self.window_attn_skip_freq, num_layers)

    def rotary_layers(self, num_layers: int) -> tuple[bool, ...]:
        """Per layer (0-based): whether its attention rotates queries and keys (--position-embedding-type and
        --no-rope-freq)."""
        skipped = no_rope_layers(self.no_rope_freq, num_layers)
        return tuple(self.rotary and not skip for skip in skipped)

    def has_windows(self, num_layers: int) -> bool:
        """Whether some layer has a sliding window (cheap at any depth)."""
        return any_layer_windowed(self.window_size, self.window_attn_skip_freq, num_layers)

    def query_groups(self, num_attention_heads: int) -> int:
        return num_attention_heads if self.num_query_groups is None else self.num_query_groups

    def ffn_size(self, hidden_size: int, ffn_hidden_size: Optional[int]) -> int:
        """--ffn-hidden-size, else Megatron-LM's default: 4h, or for SwiGLU two thirds of it rounded
        *down* to a multiple of 64 (megatron/training/arguments.py, validate_args:
        `args.ffn_hidden_size = int((4 * args.hidden_size * 2 / 3) / 64) * 64`), which keeps the three
        SwiGLU matrices near the two GeLU ones in size."""
        if ffn_hidden_size:
            return ffn_hidden_size
        return int((4 * hidden_size * 2 / 3) / 64) * 64 if self.swiglu else 4 * hidden_size

    def rotary_dim(self, head_dim: int) -> int:
        """The leading dims of each head that rotate (Megatron-LM's RotaryEmbedding: int(kv_channels *
        rotary_percent) when the percent is below 1); the rest pass through."""
        return int(head_dim * self.rotary_percent) if self.rotary_percent < 1.0 else head_dim

    def validate(self, num_attention_heads: int, hidden_size: int, ffn_hidden_size: Optional[int],
                 tensor_parallel_size: int = 1, head_dim: Optional[int] = None) -> None:
        """`head_dim`: each head's width (--kv-channels), by default hidden / heads."""
        # A value Megatron accepts but this model lacks (BigScience's alibi, Megatron-LM's relative, yarn,
        # mrope) is refused here, with the launch's other problems, rather than by argparse's choices,
        # whose error would end the one round of checks (arguments/parser.py).
        if self.normalization not in NORMALIZATIONS:
            raise ConfigError(f"--normalization {self.normalization} is not implemented: the blocks here use "
                              f"{' or '.join(NORMALIZATIONS)}", flags=("--normalization",))
        if self.position_embedding_type not in POSITION_EMBEDDING_TYPES:
            raise ConfigError(f"--position-embedding-type {self.position_embedding_type} is not implemented: "
                              f"positions here are {', '.join(POSITION_EMBEDDING_TYPES)}",
                              flags=("--position-embedding-type",))
        if self.position_embedding_type == "yarn":
            if self.rotary_interleaved:  # YarnRotaryEmbedding.get_emb asserts it
                raise ConfigError("--position-embedding-type yarn with --rotary-interleaved is not implemented: YaRN "
                                  "rotates halves (Megatron-Core's YarnRotaryEmbedding asserts it)",
                                  flags=("--position-embedding-type", "--rotary-interleaved"))
            if self.rotary_percent != 1.0:
                raise ConfigError(f"--position-embedding-type yarn with --rotary-percent {self.rotary_percent} is not "
                                  f"implemented: Megatron-Core's YarnRotaryEmbedding computes its frequencies over "
                                  f"the whole head", flags=("--position-embedding-type", "--rotary-percent"))
            if not self.rotary_scaling_factor > 0:
                raise ConfigError(f"--rotary-scaling-factor must be positive, got {self.rotary_scaling_factor}",
                                  flags=("--rotary-scaling-factor",))
        if self.rotary:
            head_dim = head_dim or hidden_size // num_attention_heads
            if not self.rotary_base > 0:
                raise ConfigError(f"--rotary-base must be positive, got {self.rotary_base}", flags=("--rotary-base",))
            if self.use_rope_scaling and not self.rope_scaling_factor > 0:
                raise ConfigError(f"--rope-scaling-factor must be positive, got {self.rope_scaling_factor}",
                                  flags=("--rope-scaling-factor",))
            if not 0.0 < self.rotary_percent <= 1.0 or self.rotary_dim(head_dim) < 2 or self.rotary_dim(head_dim) % 2:
                raise ConfigError(f"--rotary-percent {self.rotary_percent} of head dim {head_dim} must rotate an "
                                  "even number of dims, at least 2; choose a percent in (0, 1] that does",
                                  flags=("--rotary-percent",))
        self._validate_longrope(self.rotary_dim(head_dim or hidden_size // num_attention_heads))
        if self.sublayer_norms not in SUBLAYER_NORM_PLACES:
            raise ConfigError(f"--sublayer-norms {self.sublayer_norms} is not one of {', '.join(SUBLAYER_NORM_PLACES)}",
                              flags=("--sublayer-norms",))
        for flag, value in (("--softmax-scale", self.softmax_scale), ("--attn-logit-softcapping",
                                                                        self.attn_logit_softcapping),
                            ("--final-logit-softcapping", self.final_logit_softcapping),
                            ("--local-rotary-base", self.local_rotary_base),
                            ("--rotary-seq-len-interpolation-factor", self.rotary_seq_len_interpolation_factor)):
            if value is not None and not 0 < value < float("inf"):
                raise ConfigError(f"{flag} must be a positive number, got {value}", flags=(flag,))
        if self.gated_linear_unit and (self.swiglu or self.quick_geglu):
            other = "--swiglu" if self.swiglu else "--quick-geglu"
            raise ConfigError(f"--gated-linear-unit with {other}: {other} is the gated MLP with "
                              f"{'SiLU' if self.swiglu else 'quick-GeLU'}; give one of them",
                              flags=("--gated-linear-unit", other))
        if self.softmax_type not in SOFTMAX_TYPES:
            raise ConfigError(f"--softmax-type {self.softmax_type} is not one of {', '.join(SOFTMAX_TYPES)}",
                              flags=("--softmax-type",))
        groups = self.query_groups(num_attention_heads)
        if groups < 1 or num_attention_heads % groups:  # 0 is refused here, not read as "one per head"
            raise ConfigError(f"--num-query-groups {groups} does not divide --num-attention-heads "
                              f"{num_attention_heads}; each key/value group serves an equal number of heads",
                              flags=("--num-query-groups", "--num-attention-heads"))
        if groups % tensor_parallel_size:
            raise ConfigError(f"--num-query-groups {groups} is not divisible by --tensor-model-parallel-size "
                              f"{tensor_parallel_size}; each tensor-parallel rank needs whole key/value groups",
                              flags=("--num-query-groups", "--tensor-model-parallel-size"))
        ffn = self.ffn_size(hidden_size, ffn_hidden_size)
        if ffn < 1 or ffn % tensor_parallel_size:
            raise ConfigError(f"--ffn-hidden-size {ffn} is not a positive multiple of --tensor-model-parallel-size "
                              f"{tensor_parallel_size}; each tensor-parallel rank needs an equal share",
                              flags=("--ffn-hidden-size", "--tensor-model-parallel-size"))

    def _validate_longrope(self, rotary_dim: int) -> None:
        """--position-embedding-type longrope needs both factor lists, one factor per rotary frequency (Phi3Config's
        validate_rope: `len(short_factor) == rotary_ndims // 2`), and the original context; it is one set of
        frequencies in halves (Phi3RotaryEmbedding), so no other scaling, local base or interleaving beside it."""
        given = [name for name in LONGROPE_SETTINGS if getattr(self, name) is not None]
        if self.position_embedding_type != "longrope":
            if given:  # they would do nothing
                flags = tuple(_flag(name) for name in given)
                raise ConfigError(f"{', '.join(flags)} set LongRoPE, which only --position-embedding-type longrope "
                                  f"reads (this model's is {self.position_embedding_type})", flags=flags)
            return
        for name in LONGROPE_SETTINGS[:3]:
            if getattr(self, name) is None:
                raise ConfigError(f"--position-embedding-type longrope needs {_flag(name)}", flags=(_flag(name),))
        for name in LONGROPE_SETTINGS[:2]:
            factors = getattr(self, name)
            if len(factors) != rotary_dim // 2 or not all(0 < value < float("inf") for value in factors):
                raise ConfigError(f"{_flag(name)} has {len(factors)} factors; LongRoPE takes one positive factor per "
                                  f"rotary frequency, {rotary_dim // 2} here (rotary dims {rotary_dim} / 2)",
                                  flags=(_flag(name),))
        if self.longrope_original_max_position_embeddings < 2:  # its log divides the attention factor's
            raise ConfigError(f"--longrope-original-max-position-embeddings must be at least 2, got "
                              f"{self.longrope_original_max_position_embeddings}",
                              flags=("--longrope-original-max-position-embeddings",))
        for name in LONGROPE_SETTINGS[3:]:
            value = getattr(self, name)
            if value is not None and not 0 < value < float("inf"):
                raise ConfigError(f"{_flag(name)} must be a positive number, got {value}", flags=(_flag(name),))
        others = [flag for flag, on in (("--rotary-interleaved", self.rotary_interleaved),
                                        ("--use-rope-scaling", self.use_rope_scaling),
                                        ("--rotary-seq-len-interpolation-factor",
                                         self.rotary_seq_len_interpolation_factor is not None),
                                        ("--local-rotary-base", self.local_rotary_base is not None)) if on]
        if others:
            raise ConfigError(f"--position-embedding-type longrope with {', '.join(others)} is not implemented: "
                              f"LongRoPE is Phi3RotaryEmbedding's one set of frequencies, rotating halves",
                              flags=("--position-embedding-type", *others))


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


GPT2 = Architecture()
