"""Megatron-LM's CUDA graph settings (--cuda-graph-impl, --cuda-graph-modules, --cuda-graph-warmup-steps): their
vocabulary, Megatron's normalisation of --cuda-graph-modules, and its refusals of combinations with other settings. What
is then captured is training/cuda_graphs.py's."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from base.errors import ConfigError

CUDA_GRAPH_IMPLS = ("none", "local", "transformer_engine", "full_iteration")
# the regions per-layer graphs capture (an empty list: the whole layer)
CUDA_GRAPH_MODULES = ("attn", "mlp", "moe", "moe_router", "moe_preprocess", "mamba")
# accepted only to be migrated
DEPRECATED_MODULE_VALUES = ("full", "full_iteration", "full_iteration_inference")
MODULE_CHOICES = CUDA_GRAPH_MODULES + DEPRECATED_MODULE_VALUES
PER_LAYER_IMPLS = ("local", "transformer_engine")


@dataclass(frozen=True)
class NormalizedModules:
    """--cuda-graph-modules as Megatron-LM normalises it, the --cuda-graph-impl its migration leaves, and Megatron's
    warnings for what was migrated."""
    modules: tuple[str, ...]
    impl: str
    notes: tuple[str, ...] = ()


def normalize_modules(values: Sequence[str], impl: str) -> NormalizedModules:
    """Megatron-LM's normalisation: "full" alone is the whole layer (an empty list), "full_iteration" moves to
    --cuda-graph-impl full_iteration, "full_iteration_inference" is an inference scope; local adds moe_router beside
    moe_preprocess. Raises ConfigError with Megatron's assertion."""
    raw = list(dict.fromkeys(values))
    if "full" in raw:
        if raw != ["full"]:
            raise ConfigError("--cuda-graph-modules full cannot be used with other scopes (Megatron-LM asserts "
                              "'full scope cannot be used with other scopes.'): drop full (an empty list is the "
                              "whole layer) or the others", flags=("--cuda-graph-modules",))
        return NormalizedModules((), impl, ("> --cuda-graph-modules full: Megatron-LM's warning: full scope is "
                                            "deprecated. Use empty cuda_graph_modules to capture the whole layer.",))
    deprecated = [value for value in raw if value in DEPRECATED_MODULE_VALUES]
    modules = tuple(value for value in raw if value not in DEPRECATED_MODULE_VALUES)
    notes: list[str] = []
    if len(deprecated) > 1:
        raise ConfigError(f"--cuda-graph-modules {' '.join(deprecated)}: Megatron-LM asserts cuda_graph_modules cannot "
                          f"contain multiple deprecated values at the same time; keep one",
                          flags=("--cuda-graph-modules",))
    if deprecated == ["full_iteration"]:
        if impl not in ("none", "local", "full_iteration"):
            raise ConfigError(f"--cuda-graph-modules full_iteration cannot be combined with --cuda-graph-impl {impl} "
                              f"(Megatron-LM asserts it): use --cuda-graph-impl full_iteration",
                              flags=("--cuda-graph-modules", "--cuda-graph-impl"))
        notes.append("> --cuda-graph-modules full_iteration: Megatron-LM's warning: --cuda-graph-modules "
                     "'full_iteration' is deprecated. Setting --cuda-graph-impl=full_iteration instead.")
        impl = "full_iteration"
    elif deprecated == ["full_iteration_inference"]:
        if impl not in ("none", "local"):
            raise ConfigError(f"--cuda-graph-modules full_iteration_inference cannot be combined with "
                              f"--cuda-graph-impl {impl} (Megatron-LM asserts it)",
                              flags=("--cuda-graph-modules", "--cuda-graph-impl"))
        notes.append("> --cuda-graph-modules full_iteration_inference: an inference CUDA graph scope "
                     "(--inference-cuda-graph-scope block in Megatron-LM, which deprecates this spelling); no effect "
                     "on training")
    if impl == "full_iteration" and modules:
        raise ConfigError(f"--cuda-graph-modules {' '.join(modules)} with --cuda-graph-impl full_iteration: Megatron-LM "
                          f"asserts --cuda-graph-modules must be empty when --cuda-graph-impl=full_iteration",
                          flags=("--cuda-graph-modules", "--cuda-graph-impl"))
    if impl == "local" and {"moe_router", "moe_preprocess"} & set(modules):
        modules += tuple(value for value in ("moe_router", "moe_preprocess") if value not in modules)
    return NormalizedModules(modules, impl, tuple(notes))


def check_cuda_graphs(config) -> None:
    """Megatron-LM's refusals of the CUDA graph settings beside the others (TransformerConfig, validate_args). What is
    not captured here and changes no number is only named at start-up."""
    training, model = config.training, config.model
    impl = training.cuda_graph_impl
    if training.cuda_graph_warmup_steps < 0:
        raise ConfigError(f"--cuda-graph-warmup-steps {training.cuda_graph_warmup_steps} must be 0 or more",
                          flags=("--cuda-graph-warmup-steps",))
    if impl == "none":
        return
    normalized = normalize_modules(training.cuda_graph_modules, impl)
    modules, impl = set(normalized.modules), normalized.impl
    if impl == "full_iteration" and training.faults.check_for_nan_in_loss_and_grad:
        raise ConfigError("--cuda-graph-impl full_iteration: Megatron-LM asserts --no-check-for-nan-in-loss-and-grad "
                          "should be set with --cuda-graph-impl=full_iteration for training; add it",
                          flags=("--cuda-graph-impl", "--no-check-for-nan-in-loss-and-grad"))
    if impl not in PER_LAYER_IMPLS:
        return
    if config.activations.checkpoint_activations:
        raise ConfigError(f"--cuda-graph-impl {impl} with full activation recompute (--recompute-granularity full, "
                          f"--checkpoint-activations): Megatron-LM asserts full recompute is only supported with full "
                          f"iteration CUDA graph; drop one of them",
                          flags=("--cuda-graph-impl", "--checkpoint-activations"))
    _check_moe_modules(model, config.parallel, impl, modules)


def _check_moe_modules(model, parallel, impl: str, modules: set) -> None:
    """TransformerConfig.__post_init__'s MoE scope rules for the per-layer implementations."""
    flags = ("--cuda-graph-modules",)
    if "moe" in modules and "moe_router" in modules:
        raise ConfigError("--cuda-graph-modules with both moe and moe_router: Megatron-LM asserts cuda_graph_modules "
                          "must not contain both moe and moe_router", flags=flags)
    if "moe_preprocess" in modules and "moe_router" not in modules:  # local adds moe_router itself (normalize)
        raise ConfigError(f"--cuda-graph-modules moe_preprocess without moe_router under --cuda-graph-impl {impl}: "
                          f"Megatron-LM asserts moe_preprocess cuda graph is only supported with moe_router cuda "
                          f"graph", flags=flags)
    moe = model.moe
    if moe is None:
        given = sorted(modules & {"moe", "moe_router"})
        if given:
            raise ConfigError(f"--cuda-graph-modules {' '.join(given)} on a dense model: Megatron-LM asserts moe cuda "
                              f"graph is only supported for MoE (add --num-experts, or drop them)",
                              flags=(*flags, "--num-experts"))
        return
    if "mlp" in modules and all(model.moe_layers()):
        raise ConfigError("--cuda-graph-modules mlp with every layer an MoE layer: Megatron-LM asserts mlp cuda graph "
                          "is only supported for dense layers, but not found in the model", flags=(*flags, "--moe-layer-freq"))
    if moe.expert_capacity_factor is None or not moe.pad_expert_input_to_capacity:
        if "moe" in modules:
            raise ConfigError("--cuda-graph-modules moe without drop-and-pad MoE: Megatron-LM asserts moe cuda graph is "
                              "only supported with drop-padding MoE (--moe-expert-capacity-factor with "
                              "--moe-pad-expert-input-to-capacity)",
                              flags=(*flags, "--moe-expert-capacity-factor", "--moe-pad-expert-input-to-capacity"))
        if parallel.moe_token_dispatcher_type == "alltoall" and moe.expert_capacity_factor is not None \
                and "moe_preprocess" in modules:
            raise ConfigError("--cuda-graph-modules moe_preprocess with the alltoall dispatcher and a capacity factor "
                              "but no padding: Megatron-LM asserts moe_preprocess cuda graph is not supported when "
                              "there are DtoH copies and synchronizations in the preprocess step",
                              flags=(*flags, "--moe-token-dispatcher-type", "--moe-expert-capacity-factor"))
