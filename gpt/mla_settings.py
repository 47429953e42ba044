"""Multi-latent attention's section of the model settings: --multi-latent-attention and its sizes, apart from the layers
so ModelConfig need not import them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Optional

from base.errors import ConfigError
from base.options import flag_of_setting, option

# what a size of 0 builds in Megatron-Core's MLA
_WHY_AT_LEAST_ONE = {
    "q_lora_rank": "a 0-wide query latent makes every query 0, so attention is uniform (leave the flag out for no "
                   "low-rank query)",
    "kv_lora_rank": "a 0-wide key/value latent makes every value and key content 0",
    "qk_head_dim": "the query/key heads keep only their rotary part, scores by position alone",
    "qk_pos_emb_head_dim": "MLA without its rotary part has no position at all",
    "v_head_dim": "0-wide value heads make the attention's output 0",
}


@dataclass(frozen=True)
class MLASettings:
    """The MLA section, named as MLATransformerConfig's fields, with Megatron-LM's defaults."""
    SETTING_PREFIX: ClassVar[str] = ""
    # the attention features MLA takes (norms, sinks, --add-qkv-bias, which it reads as nothing); any other is refused
    # with it
    ATTENTION_FEATURES: ClassVar[tuple[str, ...]] = ("qk_layernorm", "softmax_type", "add_qkv_bias")

    multi_latent_attention: bool = option(
        False, action="store_true",
        help="DeepSeek's multi-latent attention: low-rank query and key/value projections, rotary positions on "
             "--qk-pos-emb-head-dim dims of each query head and one key shared by the heads")
    q_lora_rank: Optional[int] = option(None, help="with --multi-latent-attention: the query's low rank (default: "
                                                   "no low-rank query, one projection)")
    kv_lora_rank: int = option(32, help="with --multi-latent-attention: the key/value latent's rank")
    qk_head_dim: int = option(128, help="with --multi-latent-attention: each query/key head's dims without position")
    qk_pos_emb_head_dim: int = option(64, help="with --multi-latent-attention: each query/key head's rotary dims")
    v_head_dim: int = option(128, help="with --multi-latent-attention: each value head's dims")
    rope_type: Optional[str] = option(None, choices=("rope", "yarn"),
                                      help="with --multi-latent-attention: rope, or yarn (its default)")

    def validate(self) -> None:
        """The latent's own sizes."""
        if not self.multi_latent_attention:
            if self.rope_type == "yarn":  # Megatron-LM asserts it
                raise ConfigError("--rope-type yarn is multi-latent attention's: other attention takes rope "
                                  "(--position-embedding-type rope); add --multi-latent-attention or drop --rope-type",
                                  flags=("--rope-type", "--multi-latent-attention"))
            return
        for name in ("kv_lora_rank", "qk_head_dim", "qk_pos_emb_head_dim", "v_head_dim", "q_lora_rank"):
            value = getattr(self, name)
            if value is not None and value < 1:
                flag = flag_of_setting(MLASettings, name)
                raise ConfigError(f"{flag} must be at least 1, got {value}: {_WHY_AT_LEAST_ONE[name]} (Megatron-LM "
                                  f"builds it without a check, silently)", flags=(flag,))
        if self.qk_pos_emb_head_dim % 2:
            raise ConfigError(f"--qk-pos-emb-head-dim {self.qk_pos_emb_head_dim} must be even: rotary positions turn "
                              f"pairs of dims", flags=("--qk-pos-emb-head-dim",))
        if self.rope_type is not None and self.rope_type not in ("rope", "yarn"):
            raise ConfigError(f"--rope-type {self.rope_type} is not one of rope, yarn", flags=("--rope-type",))
