"""The rules that read two or more sections of the model settings together; a rule reading one section is that section's
`validate`."""

from __future__ import annotations

from typing import Optional

from base.errors import ConfigError
from base.options import features, flag_of_setting
from gpt.attention_settings import AttentionSettings
from gpt.gdn_settings import GatedDeltaNetSettings
from gpt.hybrid_pattern import GDN
from gpt.mla_settings import MLASettings
from gpt.mlp import MLPSettings
from gpt.mtp import MTPSettings
from gpt.positions import PositionSettings


def check_layers_without_rotary(positions: PositionSettings, mla: MLASettings, mtp: MTPSettings) -> None:
    """--no-rope-freq picks decoder layers of plain attention."""
    if positions.no_rope_freq and (mla.multi_latent_attention or mtp.num_layers):
        # MLA rotates inside its own projections, and an MTP layer's number is not a decoder layer's
        other = "--multi-latent-attention" if mla.multi_latent_attention else "--mtp-num-layers"
        raise ConfigError(f"--no-rope-freq with {other} is not implemented: drop one of them",
                          flags=("--no-rope-freq", other))


def check_multi_latent_attention(mla: MLASettings, attention: AttentionSettings, positions: PositionSettings,
                                 num_layers: int) -> None:
    """What multi-latent attention is not built with."""
    if not mla.multi_latent_attention:
        return
    if attention.qk_l2_norm:  # Megatron-Core: "qk_l2_norm is not supported with MLA."
        raise ConfigError("--qk-l2-norm with --multi-latent-attention is not implemented: the L2 norm acts over each "
                          "head of multi-head or grouped-query attention, as in Megatron-Core",
                          flags=("--qk-l2-norm", "--multi-latent-attention"))
    if attention.has_windows(num_layers):
        # Megatron-Core's MLA asserts it
        raise ConfigError("--window-size with --multi-latent-attention is not implemented: multi-latent attention "
                          "sees the whole causal context, as in Megatron-Core",
                          flags=("--window-size", "--multi-latent-attention"))
    default = AttentionSettings()
    given = [flag_of_setting(AttentionSettings, name) for name in features(AttentionSettings)
             if name not in mla.ATTENTION_FEATURES and getattr(attention, name) != getattr(default, name)]
    given += [flag for flag, value in (("--local-rotary-base", positions.local_rotary_base),
                                       ("--rotary-seq-len-interpolation-factor",
                                        positions.rotary_seq_len_interpolation_factor)) if value is not None]
    if positions.position_embedding_type == "longrope":
        given.append("--position-embedding-type longrope")
    if given:
        taken = ", ".join(flag_of_setting(AttentionSettings, name) for name in mla.ATTENTION_FEATURES)
        raise ConfigError(f"--multi-latent-attention with {', '.join(given)} is not implemented: multi-latent "
                          f"attention takes of the attention's features only {taken}, and scales its scores and "
                          f"rotates its positions as Megatron-Core's MLASelfAttention (YaRN's mscale)",
                          flags=("--multi-latent-attention", *given))
    _check_multi_latent_rotary(positions)


def _check_multi_latent_rotary(positions: PositionSettings) -> None:
    """MLA's rotary: YaRN's, over all --qk-pos-emb-head-dim dims, in halves."""
    if not positions.rotary_scaling_factor > 0 or positions.rotary_base <= 0:
        raise ConfigError("--rotary-scaling-factor and --rotary-base must be positive",
                          flags=("--rotary-scaling-factor", "--rotary-base"))
    # what Megatron-Core's MLA refuses or does not read, and Llama 3's scaling, which it lacks
    others = {"--rotary-interleaved": positions.rotary_interleaved,
              "--use-rope-scaling": positions.use_rope_scaling,
              f"--rotary-percent {positions.rotary_percent}": positions.rotary_percent != 1.0}
    given = [flag for flag, on in others.items() if on]
    if given:
        raise ConfigError(f"--multi-latent-attention with {', '.join(given)} is not implemented: multi-latent "
                          f"attention here rotates all --qk-pos-emb-head-dim dims of each head, in halves after "
                          f"de-interleaving, as Megatron-Core's MLASelfAttention",
                          flags=("--multi-latent-attention", *(flag.split()[0] for flag in given)))


def check_mlp_with_experts(mlp: MLPSettings, has_experts: bool) -> None:
    """GeGLU experts are not built; SwiGLU's clamp needs MoE, as Megatron-Core requires."""
    if mlp.gated_linear_unit and has_experts:
        raise ConfigError("--gated-linear-unit with --num-experts is not implemented: the experts are SwiGLU "
                          "(--swiglu) or ungated", flags=("--gated-linear-unit", "--num-experts"))
    if mlp.activation_func_clamp_value is not None and mlp.swiglu and not has_experts:
        raise ConfigError("--activation-func-clamp-value with --swiglu clamps the experts' SwiGLU only: add "
                          "--num-experts (Megatron-Core's TransformerConfig requires MoE)",
                          flags=("--activation-func-clamp-value", "--swiglu"))


def check_gated_delta_net_layers(gdn: GatedDeltaNetSettings, mlp: MLPSettings, hybrid_layer_pattern: Optional[str],
                                 num_layers: int, tensor_parallel_size: int) -> None:
    """Gated DeltaNet layers need --swiglu's SiLU (Megatron-Core's conv kernel takes only it) and query/key heads that
    TP divides."""
    has_layers = GDN in hybrid_layer_pattern if hybrid_layer_pattern is not None else gdn.has_layers(num_layers)
    gdn.validate(has_layers)
    if not has_layers:
        return
    if not mlp.swiglu:
        raise ConfigError("Gated DeltaNet layers (`G`, --experimental-attention-variant gated_delta_net) take the "
                          "MLP's activation, SiLU under --swiglu (as Megatron-Core's causal_conv1d kernel requires): "
                          "add --swiglu", flags=("--swiglu",))
    if gdn.linear_num_key_heads % tensor_parallel_size:
        raise ConfigError(f"--linear-num-key-heads {gdn.linear_num_key_heads} is not divisible by "
                          f"--tensor-model-parallel-size {tensor_parallel_size}: each TP rank takes whole query/key "
                          f"heads with their value heads (as Megatron-Core splits them)",
                          flags=("--linear-num-key-heads", "--tensor-model-parallel-size"))
