"""Megatron-LM's deprecated CUDA graph flags mapped as its validate_args maps them (--enable-cuda-graph,
--external-cuda-graph, --cuda-graph-scope onto --cuda-graph-impl and --cuda-graph-modules, with its assertions and
warnings), and its rules between CUDA graphs and selective recompute."""

from __future__ import annotations

from typing import Any, Callable, Optional

from arguments.cuda_graphs import MODULE_CHOICES, normalize_modules
from base.errors import ConfigError

DEPRECATED_IMPL_FLAGS = {"enable_cuda_graph": ("--enable-cuda-graph", "local"),
                         "external_cuda_graph": ("--external-cuda-graph", "transformer_engine")}
SCOPE_ADD = {"nargs": "+", "choices": MODULE_CHOICES, "metavar": "SCOPE"}
# the inference scopes each --cuda-graph-impl takes
ALLOWED_INFERENCE_SCOPES = {"none": ("none",), "local": ("layer", "block"), "transformer_engine": ("none",),
                            "full_iteration": ("none",)}
# TransformerConfig's recompute_modules when --recompute-modules is not given
DEFAULT_RECOMPUTE_MODULES = ("core_attn",)


def resolve_cuda_graph_flags(given: dict[str, Any], settings: dict[str, Any], option_used: Callable[[str], Optional[str]],
                             change: Callable, resolved, harvested: dict[str, Any]) -> None:
    """Set --cuda-graph-impl and --cuda-graph-modules from the deprecated flags and normalise the modules (changes
    through `change`, Megatron's warnings into `resolved.notes`, its refusals into `resolved.refused`)."""
    impl = settings["cuda_graph_impl"]
    spellings = [dest for dest in DEPRECATED_IMPL_FLAGS if given.get(dest)]
    if spellings and impl != "none":
        resolved.refused.append(f"{' and '.join(DEPRECATED_IMPL_FLAGS[dest][0] for dest in spellings)} with "
                                f"--cuda-graph-impl {impl}: Megatron-LM asserts 'Do not use --enable-cuda-graph or "
                                f"--external-cuda-graph with --cuda-graph-impl.'; keep --cuda-graph-impl")
        return
    if len(spellings) == 2:
        resolved.refused.append("--enable-cuda-graph with --external-cuda-graph: Megatron-LM asserts they cannot be "
                                "enabled at the same time; use --cuda-graph-impl local or transformer_engine")
        return
    for dest in spellings:
        flag, impl = DEPRECATED_IMPL_FLAGS[dest]
        change("cuda_graph_impl", impl, dest, f"Megatron-LM's deprecated spelling of --cuda-graph-impl {impl}")
        resolved.notes.append(f"> {flag}: Megatron-LM's warning: {flag} is deprecated, use --cuda-graph-impl={impl} "
                              f"instead.")
    modules, moved = list(settings["cuda_graph_modules"]), None
    scope = given.get("cuda_graph_scope")
    if scope is not None:
        if modules:
            resolved.refused.append("--cuda-graph-scope with --cuda-graph-modules: Megatron-LM asserts they cannot be "
                                    "used together; keep --cuda-graph-modules")
            return
        modules, moved = list(scope), "cuda_graph_scope"
        resolved.notes.append("> --cuda-graph-scope: Megatron-LM's warning: --cuda-graph-scope is deprecated, use "
                              "--cuda-graph-modules instead.")
    try:
        normalized = normalize_modules(modules, impl)
    except ConfigError as error:
        resolved.refused.append(str(error))
        return
    if list(normalized.modules) != list(settings["cuda_graph_modules"]):
        change("cuda_graph_modules", list(normalized.modules), moved or "cuda_graph_modules",
               "as Megatron-LM normalises --cuda-graph-modules")
    if normalized.impl != impl:
        change("cuda_graph_impl", normalized.impl, moved or "cuda_graph_modules",
               "Megatron-LM moves --cuda-graph-modules full_iteration to --cuda-graph-impl full_iteration")
    resolved.notes.extend(normalized.notes)
    _check_inference_scope(harvested.get("--inference-cuda-graph-scope"), normalized.impl, modules, resolved)
    _check_selective_recompute(given, settings, harvested, normalized.impl, set(normalized.modules), resolved)


def _check_inference_scope(scope: Optional[str], impl: str, modules: list, resolved) -> None:
    """--inference-cuda-graph-scope does nothing in training, but a value that does not fit --cuda-graph-impl is
    refused, as Megatron-LM refuses it."""
    if scope is None:
        return
    if "full_iteration" in modules and scope != "none":
        resolved.refused.append(f"--cuda-graph-modules full_iteration with --inference-cuda-graph-scope {scope}: "
                                f"Megatron-LM asserts they cannot be combined")
    elif "full_iteration_inference" in modules and scope != "block":
        resolved.refused.append(f"--cuda-graph-modules full_iteration_inference with --inference-cuda-graph-scope "
                                f"{scope}: Megatron-LM asserts they cannot be combined")
    elif scope not in ALLOWED_INFERENCE_SCOPES[impl]:
        resolved.refused.append(f"--inference-cuda-graph-scope {scope} with --cuda-graph-impl {impl}: Megatron-LM "
                                f"asserts an invalid inference CUDA graph scope for it (allowed: "
                                f"{', '.join(ALLOWED_INFERENCE_SCOPES[impl])})")


def _check_selective_recompute(given: dict[str, Any], settings: dict[str, Any], harvested: dict[str, Any], impl: str,
                               modules: set, resolved) -> None:
    """TransformerConfig's rules for selective recompute under CUDA graphs: a no-op here, but a launch Megatron-LM
    refuses is refused."""
    granularity = given.get("recompute_granularity") or ("selective" if given.get("recompute_activations") else None)
    if impl == "none" or granularity != "selective":
        return
    recomputed = set(settings.get("recompute_modules") or DEFAULT_RECOMPUTE_MODULES)
    whole = impl == "full_iteration" or not modules  # Megatron's full_cudagraph
    if impl == "transformer_engine" and "moe" in recomputed and "moe_router" in modules:
        resolved.refused.append("--recompute-modules moe with --cuda-graph-modules moe_router under --cuda-graph-impl "
                                "transformer_engine: Megatron-LM asserts moe recompute is not supported with "
                                "moe_router CUDA graph")
    rules = (
        (settings["attention_dropout"] != 0.0, "core_attn", ("attn",),
         "attention dropout is not supported with graphed attention recomputation", "--attention-dropout 0"),
        (settings["hidden_dropout"] != 0.0, "mlp", ("mlp",),
         "hidden dropout is not supported with graphed MLP/MoE recomputation", "--hidden-dropout 0"),
        (settings["hidden_dropout"] != 0.0, "moe", ("moe",),
         "hidden dropout is not supported with graphed MLP/MoE recomputation", "--hidden-dropout 0"),
        (harvested.get("--moe-input-jitter-eps") is not None, "moe", ("moe",),
         "moe_input_jitter_eps is not supported with graphed moe recomputation", "no --moe-input-jitter-eps"))
    typed = "--recompute-granularity selective" if given.get("recompute_granularity") else "--recompute-activations"
    refusals = []
    for random_inside, recomputed_module, graphed, assertion, fix in rules:
        if random_inside and recomputed_module in recomputed and (whole or modules & set(graphed)):
            refusals.append(f"{typed} recomputing {recomputed_module} inside "
                            f"--cuda-graph-impl {impl}'s graphs: Megatron-LM asserts {assertion}; use {fix}, or "
                            f"recompute other modules")
    resolved.refused.extend(dict.fromkeys(refusals))
