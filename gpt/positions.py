"""The positions section of the model settings: which position embedding the model has and the rotary knobs, as
Megatron-LM's flags."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Optional, Union

from base.errors import ConfigError
from base.options import flag_of_setting, option
from gpt.layer_pattern import check_no_rope_freq, freq_value, no_rope_layers
from gpt.longrope import LongRope, factor_list_value

# Megatron-LM's --position-embedding-type values; yarn is Megatron-Core's YarnRotaryEmbedding; longrope is Phi-3's
# LongRoPE as transformers computes it (no Megatron flag)
POSITION_EMBEDDING_TYPES = ("learned_absolute", "rope", "yarn", "longrope", "none")
ROTARY_TYPES = ("rope", "yarn", "longrope")
LONGROPE_SETTINGS = ("longrope_short_factor", "longrope_long_factor", "longrope_original_max_position_embeddings",
                     "longrope_factor", "longrope_attention_factor")


def _position_embedding_name(text: str) -> str:
    """Megatron-DeepSpeed's `absolute` is Megatron-LM's learned_absolute."""
    return "learned_absolute" if text == "absolute" else text


@dataclass(frozen=True)
class PositionSettings:
    SETTING_PREFIX: ClassVar[str] = ""

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
    # Llama 3's frequency scaling
    use_rope_scaling: bool = option(False, action="store_true",
                                    help="Llama 3.1's scaling of the rotary frequencies (--rope-scaling-factor)")
    rope_scaling_factor: float = option(8.0, help="with --use-rope-scaling: Llama 3.1's factor")
    # adjacent dims (2i, 2i + 1) rotate together instead of i with i + rotary_dim / 2
    rotary_interleaved: bool = option(
        False, action="store_true",
        help="rotary positions rotate adjacent pairs of dims (2i, 2i+1) instead of the two halves (Megatron-LM)")
    # the sliding-window layers' rotary base (Gemma 3), and linear position interpolation
    local_rotary_base: Optional[float] = option(
        None, help="the sliding-window layers' own rotary base, without --rotary-seq-len-interpolation-factor or "
                   "--use-rope-scaling (Gemma 3's rope_local_base_freq); default: the other layers' rotary")
    rotary_seq_len_interpolation_factor: Optional[float] = option(
        None, help="rotary positions divided by this factor (Megatron-LM; transformers' linear rope scaling)")
    # --yarn-* at the values Megatron-LM's _apply_yarn_config_from_args gives where left out
    yarn_original_max_position_embeddings: int = option(
        4096, help="with --position-embedding-type yarn: the context the frequencies were trained at")
    yarn_beta_fast: float = option(32.0, help="with --position-embedding-type yarn: YaRN's beta_fast")
    yarn_beta_slow: float = option(1.0, help="with --position-embedding-type yarn: YaRN's beta_slow")
    yarn_correction_range_round_to_int: bool = option(
        True, help="with --position-embedding-type yarn: round the correction range to whole dims")
    # Phi-3's LongRoPE, set by --init-from-hf from a Phi-3 folder
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
    # the layers whose attention skips rotary positions (Llama 4's NoPE layers)
    no_rope_freq: Union[None, int, str] = option(
        None, feature=True, type=freq_value,
        help="layers whose attention skips the rotary positions (Llama 4's NoPE layers): N skips each N-th layer "
             "(1-based; N divides --num-layers); a list expression gives one 1 (skip) or 0 per layer, e.g. "
             "'([0]*3+[1])*2'; default: none")
    # YaRN's, which multi-latent attention reads too
    rotary_scaling_factor: float = option(1.0, help="with --multi-latent-attention or --position-embedding-type yarn: "
                                                    "YaRN's scaling factor")
    mscale: float = option(1.0, help="with --multi-latent-attention or --position-embedding-type yarn: YaRN's mscale "
                                     "(the rotary concentration)")
    mscale_all_dim: float = option(0.0, help="with --multi-latent-attention or --position-embedding-type yarn: YaRN's "
                                             "mscale_all_dim (multi-latent attention's softmax scale too)")

    def __post_init__(self) -> None:
        for name in ("longrope_short_factor", "longrope_long_factor"):
            if isinstance(getattr(self, name), list):
                object.__setattr__(self, name, tuple(getattr(self, name)))

    @property
    def rotary(self) -> bool:
        return self.position_embedding_type in ROTARY_TYPES

    @property
    def rope_scaling(self) -> Optional[float]:
        return self.rope_scaling_factor if self.use_rope_scaling else None

    def rotary_dim(self, head_dim: int) -> int:
        """The leading dims of each head that rotate (int(kv_channels * rotary_percent))."""
        return int(head_dim * self.rotary_percent) if self.rotary_percent < 1.0 else head_dim

    def rotary_layers(self, num_layers: int) -> tuple[bool, ...]:
        return tuple(self.rotary and not skip for skip in no_rope_layers(self.no_rope_freq, num_layers))

    def longrope(self, max_position_embeddings: int) -> Optional[LongRope]:
        """LongRoPE's factors and attention factor resolved as transformers does; None otherwise."""
        if self.position_embedding_type != "longrope":
            return None
        return LongRope.resolve(self.longrope_short_factor, self.longrope_long_factor,
                                self.longrope_original_max_position_embeddings, max_position_embeddings,
                                self.longrope_factor, self.longrope_attention_factor)

    def validate(self, head_dim: int, num_layers: int) -> None:
        """Values Megatron accepts but this model lacks (alibi, relative, mrope) are refused here with the launch's
        other problems, not by argparse."""
        if self.position_embedding_type not in POSITION_EMBEDDING_TYPES:
            raise ConfigError(f"--position-embedding-type {self.position_embedding_type} is not implemented: "
                              f"positions here are {', '.join(POSITION_EMBEDDING_TYPES)}",
                              flags=("--position-embedding-type",))
        if self.position_embedding_type == "yarn":
            _check_yarn(self)
        if self.rotary:
            _check_rotary(self, head_dim)
        _check_longrope(self, self.rotary_dim(head_dim))
        for name in ("local_rotary_base", "rotary_seq_len_interpolation_factor"):
            _positive_or_none(name, getattr(self, name))
        if self.no_rope_freq:
            check_no_rope_freq(self.no_rope_freq, num_layers)


def _check_yarn(positions: PositionSettings) -> None:
    """YaRN as Megatron-Core computes it: halves, the whole head, one set of frequencies."""
    if positions.rotary_interleaved:  # YarnRotaryEmbedding.get_emb asserts it
        raise ConfigError("--position-embedding-type yarn with --rotary-interleaved is not implemented: YaRN "
                          "rotates halves (Megatron-Core's YarnRotaryEmbedding asserts it)",
                          flags=("--position-embedding-type", "--rotary-interleaved"))
    if positions.rotary_percent != 1.0:
        raise ConfigError(f"--position-embedding-type yarn with --rotary-percent {positions.rotary_percent} is not "
                          f"implemented: Megatron-Core's YarnRotaryEmbedding computes its frequencies over "
                          f"the whole head", flags=("--position-embedding-type", "--rotary-percent"))
    if not positions.rotary_scaling_factor > 0:
        raise ConfigError(f"--rotary-scaling-factor must be positive, got {positions.rotary_scaling_factor}",
                          flags=("--rotary-scaling-factor",))
    given = [_flag(name) for name in ("local_rotary_base", "rotary_seq_len_interpolation_factor")
             if getattr(positions, name) is not None]
    if given:
        raise ConfigError(f"--position-embedding-type yarn with {', '.join(given)} is not implemented: YaRN's "
                          f"frequencies are Megatron-Core's YarnRotaryEmbedding's, one set for every layer",
                          flags=("--position-embedding-type", *given))


def _check_rotary(positions: PositionSettings, head_dim: int) -> None:
    if not positions.rotary_base > 0:
        raise ConfigError(f"--rotary-base must be positive, got {positions.rotary_base}", flags=("--rotary-base",))
    if positions.use_rope_scaling and not positions.rope_scaling_factor > 0:
        raise ConfigError(f"--rope-scaling-factor must be positive, got {positions.rope_scaling_factor}",
                          flags=("--rope-scaling-factor",))
    rotary_dim = positions.rotary_dim(head_dim)
    if not 0.0 < positions.rotary_percent <= 1.0 or rotary_dim < 2 or rotary_dim % 2:
        raise ConfigError(f"--rotary-percent {positions.rotary_percent} of head dim {head_dim} must rotate an "
                          "even number of dims, at least 2; choose a percent in (0, 1] that does",
                          flags=("--rotary-percent",))


def _check_longrope(positions: PositionSettings, rotary_dim: int) -> None:
    """LongRoPE needs both factor lists, one per rotary frequency (as Phi3Config validates), and the original context;
    no other scaling beside it."""
    given = [name for name in LONGROPE_SETTINGS if getattr(positions, name) is not None]
    if positions.position_embedding_type != "longrope":
        if given:  # they would do nothing
            flags = tuple(_flag(name) for name in given)
            raise ConfigError(f"{', '.join(flags)} set LongRoPE, which only --position-embedding-type longrope "
                              f"reads (this model's is {positions.position_embedding_type})", flags=flags)
        return
    for name in LONGROPE_SETTINGS[:3]:
        if getattr(positions, name) is None:
            raise ConfigError(f"--position-embedding-type longrope needs {_flag(name)}", flags=(_flag(name),))
    for name in LONGROPE_SETTINGS[:2]:
        factors = getattr(positions, name)
        if len(factors) != rotary_dim // 2 or not all(0 < value < float("inf") for value in factors):
            raise ConfigError(f"{_flag(name)} has {len(factors)} factors; LongRoPE takes one positive factor per "
                              f"rotary frequency, {rotary_dim // 2} here (rotary dims {rotary_dim} / 2)",
                              flags=(_flag(name),))
    if positions.longrope_original_max_position_embeddings < 2:  # its log divides the attention factor
        raise ConfigError(f"--longrope-original-max-position-embeddings must be at least 2, got "
                          f"{positions.longrope_original_max_position_embeddings}",
                          flags=("--longrope-original-max-position-embeddings",))
    for name in LONGROPE_SETTINGS[3:]:
        _positive_or_none(name, getattr(positions, name))
    others = [flag for flag, on in (("--rotary-interleaved", positions.rotary_interleaved),
                                    ("--use-rope-scaling", positions.use_rope_scaling),
                                    ("--rotary-seq-len-interpolation-factor",
                                     positions.rotary_seq_len_interpolation_factor is not None),
                                    ("--local-rotary-base", positions.local_rotary_base is not None)) if on]
    if others:
        raise ConfigError(f"--position-embedding-type longrope with {', '.join(others)} is not implemented: "
                          f"LongRoPE is Phi3RotaryEmbedding's one set of frequencies, rotating halves",
                          flags=("--position-embedding-type", *others))


def _positive_or_none(name: str, value: Optional[float]) -> None:
    if value is not None and not 0 < value < float("inf"):
        raise ConfigError(f"{_flag(name)} must be a positive number, got {value}", flags=(_flag(name),))


def _flag(name: str) -> str:
    return flag_of_setting(PositionSettings, name)
