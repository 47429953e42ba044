"""What --moe-use-upcycling needs before any work: Megatron-LM's rules (validate_args, and the asserts and errors of
megatron/core/transformer/moe/upcycling_utils.py) and the cases the load here does not build, each one line."""

from __future__ import annotations

from base.errors import ConfigError

# Megatron-Core's upcycling scales gelu, silu (SwiGLU) and squared_relu experts (_get_config's ActivationFuncName)
UPCYCLED_ACTIVATIONS = ("gelu", "squared_relu")
FLAGS = ("--moe-use-upcycling",)


def check_upcycling(config) -> None:
    """Raise ConfigError in one line where --moe-use-upcycling cannot run as Megatron-LM runs it."""
    checkpoint, model = config.checkpoint, config.model
    granularity = checkpoint.moe_upcycling_granularity
    if not checkpoint.moe_use_upcycling:
        return
    if not checkpoint.save:  # Megatron-LM's validate_args
        raise ConfigError("--moe-use-upcycling needs --save DIR (where the upcycled MoE model goes), as Megatron-LM "
                          "asserts", flags=(*FLAGS, "--save"))
    if not checkpoint.load:
        raise ConfigError("--moe-use-upcycling needs --load CHECKPOINT (the dense model to upcycle)",
                          flags=(*FLAGS, "--load"))
    if granularity < 1:
        raise ConfigError(f"--moe-upcycling-granularity must be at least 1, got {granularity}",
                          flags=("--moe-upcycling-granularity",))
    moe, counts = model.moe, model.experts_per_layer()
    if moe is None:
        raise ConfigError("--moe-use-upcycling makes an MoE model from a dense one: give --num-experts N",
                          flags=(*FLAGS, "--num-experts"))
    if moe.num_experts % granularity:  # upcycling_utils._get_config
        raise ConfigError(f"--num-experts {moe.num_experts} is not divisible by --moe-upcycling-granularity "
                          f"{granularity}, as Megatron-Core's upcycling asserts",
                          flags=("--num-experts", "--moe-upcycling-granularity"))
    if model.hybrid_layer_pattern is not None or min(counts) != moe.num_experts or model.mtp.num_layers:
        raise ConfigError("--moe-use-upcycling is implemented for GPT layers that are all MoE layers (no "
                          "--hybrid-layer-pattern, dense --moe-layer-freq layers or --mtp-num-layers): drop the flag "
                          "or make every layer an MoE layer", flags=(*FLAGS, "--moe-layer-freq"))
    if moe.shared_expert_intermediate_size or moe.deepspeed.gating == "deepspeed":
        raise ConfigError("--moe-use-upcycling is implemented for Megatron-Core's routed experts alone (no "
                          "--moe-shared-expert-intermediate-size, no DeepSpeed-MoE gating)", flags=FLAGS)
    if moe.ffn_hidden_size != model.ffn_size:
        raise ConfigError(f"--moe-use-upcycling splits a dense FFN of --ffn-hidden-size x --moe-upcycling-granularity "
                          f"into experts of --ffn-hidden-size ({model.ffn_size}); --moe-ffn-hidden-size "
                          f"{moe.ffn_hidden_size} differs: drop it", flags=(*FLAGS, "--moe-ffn-hidden-size"))
    _check_activation(model.mlp)


def _check_activation(mlp) -> None:
    swiglu = mlp.swiglu and not (mlp.quick_geglu or mlp.gated_linear_unit or mlp.glu_linear_offset
                                 or mlp.activation_func_clamp_value is not None)
    if not swiglu and (mlp.gated or mlp.activation not in UPCYCLED_ACTIVATIONS):
        raise ConfigError("--moe-use-upcycling upcycles gelu, squared_relu or SwiGLU MLPs (Megatron-Core's "
                          "upcycling_utils scales only these): choose --activation gelu or squared_relu, or --swiglu",
                          flags=(*FLAGS, "--activation", "--swiglu"))
