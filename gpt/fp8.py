"""FP8 training: Megatron-Core's --fp8-format and --fp8-recipe flags applied through parallel/fp8's kernels to the GEMMs
Megatron-Core with TransformerEngine runs in FP8 (block linears, experts, MTP layers; never embeddings, output, norms or
routers), and every combination not built refused before any work in one line."""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Optional

import torch
import torch.distributed as dist
from torch import nn

from base.errors import ConfigError
from gpt.mla import ReplicatedLinear
from gpt.mlp import SwiGLUMLP
from gpt.model import MTP_PASS
from gpt.moe.experts import Experts
from gpt.moe.layer import SharedExperts
from parallel.fp8 import grouped
from parallel.fp8.delayed_updates import DelayedScalingPasses
from parallel.fp8.fused import resolve_fused_casts
from parallel.fp8.guard import DENSE, EXPERT, GuardMonitor, LayerGuard
from parallel.fp8.kernel import kernel_name
from parallel.fp8.linear import Fp8LinearState, fp8_linear, fp8_states, shape_rule_broken
from parallel.fp8.recipes import Fp8Recipe
from parallel.fp8.recompute import delayed_scalings_in
from parallel.fp8.weight_cache import WeightCache
from parallel.layers import ColumnParallelLinear, RowParallelLinear
from parallel.state import ParallelState


def recipe_of(model_config) -> Fp8Recipe:
    """The run's FP8 settings as Megatron-Core's TransformerConfig holds them."""
    fp8 = model_config.fp8
    return Fp8Recipe(fp8_format=fp8.format, recipe=fp8.recipe, margin=fp8.margin,
                     amax_history_len=fp8.amax_history_len, amax_compute_algo=fp8.amax_compute_algo, wgrad=fp8.wgrad)


@dataclass(frozen=True)
class Fp8Launch:
    """What the refusals read besides the model's settings."""
    pipeline_parallel: int
    context_parallel: int
    expert_parallel: int
    recompute: bool
    zero_stage: int = 0


def check_fp8(model_config, launch: Fp8Launch) -> None:
    """Refuse, in one line, every FP8 combination not built; nothing without --fp8-format."""
    fp8 = model_config.fp8
    fp8.validate(model_config.num_layers)
    if fp8.enabled and fp8.param_gather:
        _check_param_gather(f"--fp8-format {fp8.format} --fp8-recipe {fp8.recipe}", launch.zero_stage)


def _check_param_gather(what: str, zero_stage: int) -> None:
    """--fp8-param-gather needs ZeRO 1 or 3, as Megatron-LM asserts the distributed optimizer or FSDP."""
    if zero_stage == 0:
        raise ConfigError(f"{what} --fp8-param-gather needs sharded parameters, as in Megatron-LM (distributed "
                          f"optimizer or FSDP): use --use-distributed-optimizer or --zero-stage 1, 2 or 3")


def fp8_gathered_weights(model: nn.Module) -> dict:
    """{id(weight): Fp8LinearState} of the FP8 linears, for ZeRO to gather as FP8 bytes."""
    return {id(module.weight): module.fp8_state for module in model.modules()
            if getattr(module, "fp8_state", None) is not None}


def _tp_linears(block: nn.Module):
    return [(name, module) for name, module in block.named_modules()
            if isinstance(module, (ColumnParallelLinear, RowParallelLinear))]


def _shared_expert_linears(block: nn.Module):
    """A TP 1 shared expert's projections: Megatron's SharedExpertMLP is TE linears, so they run in FP8."""
    return [(f"{name}.{part}", getattr(module, part)) for name, module in block.named_modules()
            if isinstance(module, SharedExperts) and name.endswith("shared_experts")
            for part in ("dense_h_to_4h_gate", "dense_h_to_4h_up", "dense_h_to_4h", "dense_4h_to_h")
            if hasattr(module, part)]


def _joined_gate_up(block: nn.Module, model_config) -> dict:
    """{gate name: (gated MLP, up name)} whose gate and up run as one FP8 linear with one scale, as Megatron-Core's
    linear_fc1. Not with biases, nor under --fp8-param-gather, where each parameter has its own scale."""
    if model_config.fp8.param_gather:
        return {}
    return {f"{name}.dense_h_to_4h_gate": (mlp, f"{name}.dense_h_to_4h_up") for name, mlp in block.named_modules()
            if isinstance(mlp, SwiGLUMLP) and mlp.dense_h_to_4h_gate.bias is None}


def _routed_experts(block: nn.Module):
    return [(name, module) for name, module in block.named_modules() if isinstance(module, Experts)]


def amax_reduction(parallel: Optional[ParallelState]):
    """Delayed scaling's max all-reduce of an amax over Megatron-Core's amax reduction group: this stage's TP x CP x DP
    ranks. None for one rank."""
    if parallel is None or parallel.world_size == 1:
        return None
    if parallel.pipeline_parallel_size == 1:
        group = dist.group.WORLD
    elif parallel.stage_group is not None:
        group = parallel.stage_group
    else:
        return None
    comm = parallel.comm
    return lambda amax: comm.all_reduce(amax, group, "amax", op=dist.ReduceOp.MAX)


def amax_group_size(parallel: Optional[ParallelState]) -> int:
    if parallel is None:
        return 1
    return parallel.world_size // parallel.pipeline_parallel_size


def verdict_reduction(parallel: Optional[ParallelState]):
    """The guard's verdicts max-reduced over TP, so every TP rank of a layer takes the same path; None at TP 1."""
    if parallel is None or parallel.tensor_parallel_size == 1:
        return None
    comm, group = parallel.comm, parallel.tensor_parallel_group
    return lambda flags: comm.all_reduce(flags, group, "tp", op=dist.ReduceOp.MAX)


def expert_verdict_reduction(parallel: Optional[ParallelState]):
    """verdict_reduction for routed experts, over the expert TP group; None at ETP 1."""
    if parallel is None or parallel.experts.tensor_size == 1:
        return None
    comm, group = parallel.comm, parallel.experts.tensor_group
    return lambda flags: comm.all_reduce(flags, group, "etp", op=dist.ReduceOp.MAX)


def guard_monitor(model_config, parallel: Optional[ParallelState], device: torch.device) -> GuardMonitor:
    """--fp8-guard's monitor for this rank: threshold, verdict reductions and the vote on re-running the iteration."""
    any_rank = None
    if parallel is not None and parallel.world_size > 1:
        any_rank = parallel.comm.max_over_world
    return GuardMonitor(threshold=model_config.fp8.guard_saturation_threshold,
                        reductions={DENSE: verdict_reduction(parallel), EXPERT: expert_verdict_reduction(parallel)},
                        any_rank=any_rank, device=device)


def delayed_scaling_passes(model: nn.Module, model_config,
                           parallel: Optional[ParallelState]) -> Optional[DelayedScalingPasses]:
    """Delayed scaling's per-pass update over each model chunk's blocks and the MTP layers; None without delayed
    scaling."""
    if not model_config.fp8.enabled or model_config.fp8.recipe != "delayed":
        return None
    groups = {chunk: delayed_scalings_in(blocks) for chunk, blocks in enumerate(model.chunk_blocks)}
    groups[MTP_PASS] = delayed_scalings_in(model.mtp_layers)
    device = parallel.device if parallel is not None else torch.device("cpu")
    fused, _ = resolve_fused_casts(model_config.fp8.fused_casts, device)
    return DelayedScalingPasses(groups, amax_reduction(parallel), fused)


def fp8_weight_caches(model: nn.Module) -> list[WeightCache]:
    return [state.weight_cache for state in fp8_states(model).values()]


def forget_fp8_weight_casts(model: nn.Module) -> None:
    """Forget every FP8 weight cast where an iteration's micro-batches start and end, so the first micro-batch casts
    again (TE's is_first_microbatch) and the optimizer step's in-place writes are never missed."""
    for cache in getattr(model, "fp8_weight_caches", ()):
        cache.forget()


def guard_log(parallel: Optional[ParallelState]):
    """The guard's lines, from the first TP rank of each DP rank."""
    if parallel is None or parallel.world_size == 1:
        return lambda line: print(line, flush=True)
    if parallel.tensor_parallel_rank != 0:
        return lambda line: None
    return lambda line: print(f" [rank {parallel.rank}]{line}", flush=True)


def apply_fp8(blocks: nn.ModuleList, model_config, tokens_per_micro_batch: int,
              device: torch.device, parallel: Optional[ParallelState] = None,
              monitor: Optional[GuardMonitor] = None, mtp_layers: Optional[nn.ModuleList] = None,
              compiled: bool = False) -> Optional[str]:
    """Run in FP8 the GEMMs Megatron-Core runs in FP8, each linear with its own Fp8LinearState, and return the start-up
    line; None without --fp8-format. MTP layers are FP8 whatever --first-last-layers-bf16 says, as in Megatron. With
    --fp8-guard each linear gets a guard gathered in `monitor`."""
    if not model_config.fp8.enabled:
        return None
    recipe = recipe_of(model_config)
    reduced = recipe.recipe == "delayed" and amax_reduction(parallel) is not None
    guarded = model_config.fp8.guard and device.type != "meta"  # a planner's meta rank: no values to check
    if guarded and monitor is None:  # no verdict reader: the guards count, nothing falls back
        monitor = guard_monitor(model_config, parallel, device)
    threshold = model_config.fp8.guard_saturation_threshold

    fused, fusion = resolve_fused_casts(model_config.fp8.fused_casts, device)

    def state_for(name: str, expert: bool = False) -> Fp8LinearState:
        guard = None
        if guarded:
            guard = LayerGuard(name, EXPERT if expert else DENSE, guard_log(parallel), device)
            monitor.layers.append(guard)
        # the weight is cast once an iteration, as Megatron-Core's TE linears (is_first_microbatch)
        return Fp8LinearState(recipe, device, guard, fused=fused, cache_weight=True, compiled=compiled)

    in_fp8, experts_in_fp8, high_precision_layers, off_shape, replicated = [], [], [], [], set()
    modules = [(f"blocks.{name}", block, int(name)) for name, block in blocks.named_children()]
    modules += [(f"mtp_layers.{name}", layer, None) for name, layer in (mtp_layers or nn.ModuleList()).named_children()]
    for prefix, module, layer in modules:
        if layer is not None and model_config.fp8.keeps_high_precision(layer, model_config.num_layers):
            high_precision_layers.append(layer)
            continue
        replicated.update(name.split(".")[-1] for name, child in module.named_modules()
                          if isinstance(child, ReplicatedLinear))
        linears = dict(_tp_linears(module) + _shared_expert_linears(module))
        joined = {gate: (mlp, up) for gate, (mlp, up) in _joined_gate_up(module, model_config).items()
                  if not any(_broken(linears[name], tokens_per_micro_batch, recipe) for name in (gate, up))}
        for gate, (mlp, up) in joined.items():
            name = gate[:-len("_gate")]  # Megatron-DeepSpeed's name of the joined projection
            # one state on both, found once under the joined name
            state = state_for(f"{prefix}.{name}")
            linears[gate].fp8_state = linears[up].fp8_state = state
            linears[gate].fp8_state_name = name.split(".")[-1]
            mlp.joined_linear = partial(_fp8_joined_call, state=state)
            in_fp8.append(f"{name} (gate and up, one linear)")
        skipped = {name for gate, (_, up) in joined.items() for name in (gate, up)}
        for name, linear in linears.items():
            if name in skipped:
                continue
            # a linear's GEMMs take its local shape
            broken = _broken(linear, tokens_per_micro_batch, recipe)
            if broken:
                off_shape.append(f"{prefix}.{name} ({broken})")
                continue
            linear.fp8_state = state_for(f"{prefix}.{name}")
            if isinstance(linear, (ColumnParallelLinear, RowParallelLinear)):
                linear.linear = partial(_fp8_linear_call, state=linear.fp8_state)
            in_fp8.append(name)
        for name, experts in _routed_experts(module):
            # each expert's rows are padded to the alignment: only the weights' shape rules
            projections = [(f"{expert_id}.{part}", linear) for expert_id, expert in experts.named_children()
                           for part, linear in expert.named_children() if hasattr(linear, "weight")]
            broken = next(filter(None, (shape_rule_broken(linear.weight.shape[1], linear.weight.shape[0],
                                                          grouped.alignment(recipe.recipe), recipe.recipe)
                                        for _, linear in projections)), None)
            if broken:
                off_shape.append(f"{prefix}.{name} ({broken})")
                continue
            for part, linear in projections:
                linear.fp8_state = state_for(f"{prefix}.{name}.{part}", expert=True)
            experts.fp8_align = grouped.alignment(recipe.recipe)
            experts_in_fp8.append(f"{prefix}.{name}")
    return startup_line(recipe, device, parallel, in_fp8, experts_in_fp8, high_precision_layers, off_shape,
                        reduced, guarded, threshold, bool(mtp_layers), sorted(replicated),
                        model_config.fp8.param_gather, compiled, (fused, fusion))


def _broken(linear: nn.Module, tokens: int, recipe: Fp8Recipe) -> Optional[str]:
    out_features, in_features = linear.weight.shape
    return shape_rule_broken(in_features, out_features, tokens, recipe.recipe)


def startup_line(recipe: Fp8Recipe, device: torch.device, parallel: Optional[ParallelState], in_fp8: list,
                 experts_in_fp8: list, high_precision_layers: list, off_shape: list, reduced: bool, guarded: bool,
                 threshold: float, mtp: bool, replicated: list, param_gather: bool, compiled: bool = False,
                 fusion: tuple[bool, str] = (False, "")) -> str:
    """apply_fp8's line: format, recipe, layers, kernel, cast path, and every difference from Megatron."""
    names = sorted(set(in_fp8))
    words = [f"> FP8: --fp8-format {recipe.fp8_format} --fp8-recipe {recipe.recipe}: {len(in_fp8)} linears in FP8 "
             f"({', '.join(names) or 'none'})"]
    if experts_in_fp8:
        words.append(f"the routed experts of {len(experts_in_fp8)} MoE layer{'s' if len(experts_in_fp8) > 1 else ''} "
                     f"in FP8 as TE's GroupedLinear (one FP8 GEMM per local expert, its rows zero-padded to a multiple "
                     f"of {grouped.alignment(recipe.recipe)} as Megatron's Fp8Padding; an expert given no rows runs "
                     f"one padded block where TE skips its GEMM); the routing probabilities weight the experts' outputs "
                     f"after their second GEMM, where Megatron's TEGroupedMLP multiplies them into its input, so that "
                     f"GEMM's input casts are not Megatron's")
    words[-1] += f", kernel {kernel_name(device, recipe.recipe)}"
    if mtp:
        words.append("the MTP layers' linears in FP8 (Megatron's global FP8 context for MTP)")
    fused, fusion_words = fusion
    if compiled:
        words.append("compiled (--compile): each FP8 linear traced into its block's graph, forward and backward, its "
                     "casts, amaxes and guard counts left to inductor to fuse, the weight cast in every micro-batch "
                     "inside the graph with its iteration's first cast's scale, amax and counts (the cache of an eager "
                     "run is read on the host)"
                     + ("; delayed scaling's amax reduction and scale update outside the blocks, once a pass"
                        if recipe.recipe == "delayed" else "")
                     + ("; on a CPU the blocks compile without vectorization (CPU_FP8_COMPILE_OPTIONS: torch 2.13's "
                        "inductor miscompiles the vectorized FP8 backward there, non-finite gradients the guard "
                        "caught every iteration)" if device.type == "cpu" else ""))
    if fusion_words:
        words.append(fusion_words + ("" if compiled else "; each weight cast once an iteration, in its first "
                                                        "micro-batch (TE's is_first_microbatch)"))
    if device.type == "cuda" and not fused and not compiled:
        words.append("unfused eager FP8 slower than bf16 on a GPU: measured on one H100, gpt2-1.5b's step 3.3x "
                     "bf16's with --no-fp8-guard (tensorwise; the casts, amaxes and scales are unfused eager kernels, "
                     "bound by their launches; docs/fp8.md)")
    elif device.type == "cuda":
        words.append("not measured on a GPU yet")
    if recipe.recipe == "delayed":
        words.append(f"amax history {recipe.amax_history_len} ({recipe.amax_compute_algo}), margin {recipe.margin}"
                     + ("" if recipe.wgrad else ", weight gradients in high precision (--no-fp8-wgrad)"))
    if reduced:
        stage = " of this pipeline stage" if parallel.pipeline_parallel_size > 1 else ""
        words.append(f"amax all-reduced (max) over the {amax_group_size(parallel)} tensor-, context- and data-parallel "
                     f"ranks{stage} (Megatron-Core's amax reduction group)")
        if experts_in_fp8 and parallel.experts.model_size > 1:
            words.append("as in TE, that reduction takes each expert's amax together with those of the experts at the "
                         "same local index on the other expert-parallel ranks (TE reduces its amax buffers by position)")
    tensor_parallel = 1 if parallel is None else parallel.tensor_parallel_size
    if tensor_parallel > 1 and recipe.recipe in ("tensorwise", "blockwise"):
        words.append(f"under TP {tensor_parallel} each rank scales its weight shard, row-parallel inputs and "
                     f"column-parallel output gradients by the shard's own amax"
                     f"{' blocks' if recipe.recipe == 'blockwise' else ''}, as TransformerEngine's quantizers do, "
                     f"so the losses differ from TP 1 by FP8 rounding")
    context_parallel = 1 if parallel is None else parallel.context_parallel_size
    if context_parallel > 1 and recipe.recipe in ("tensorwise", "blockwise"):
        words.append(f"under CP {context_parallel} each rank scales its own tokens' activations and gradients by their "
                     f"own amax{' blocks' if recipe.recipe == 'blockwise' else ''} (TE's quantizers reduce none over "
                     f"CP), so the losses differ from CP 1 by FP8 rounding")
    kept = "the embedding, output layer, norms and routers stay in high precision"
    if high_precision_layers:
        kept += (f", and block{'s' if len(high_precision_layers) > 1 else ''} "
                 f"{', '.join(map(str, high_precision_layers))} (--first-last-layers-bf16)")
    words.append(kept)
    if guarded:
        words.append(f"guard on: a layer whose FP8 output could be non-finite or one of whose casts saturates "
                     f"more than {threshold:g} of its values switches to high precision and the iteration runs again "
                     f"(--fp8-guard-saturation-threshold; the verdicts reduced and read once an iteration; counts in "
                     f"the metrics)")
    else:
        words.append("guard off (--no-fp8-guard): FP8 numerics neither counted nor checked")
    if off_shape:
        words.append("in high precision for CUDA's FP8 shape rules: " + "; ".join(off_shape))
    if replicated:
        words.append(f"MLA's {', '.join(sorted(replicated))} in high precision (replicated linears here; TE linears, "
                     f"in FP8, in Megatron: not built)")
    if param_gather:
        words.append(_param_gather_words(recipe))
    words.append("the planner's dry run keeps the FP8 copies these linears save for the backward and counts the "
                 "amax histories" + ("" if compiled else " and the weights' cached casts"))
    return "; ".join(words)


def _param_gather_words(recipe: Fp8Recipe) -> str:
    """The line's --fp8-param-gather clause."""
    scaled = {"blockwise": "each 128x128 block's scale from the whole block's amax of the fp32 master, max "
                           "all-reduced over the shard owners, and the fp32 master cast to e4m3 as "
                           "TransformerEngine's blockwise cast does, where without the flag the forward casts the "
                           "weight in the model's dtype: in 16-bit runs a byte or a block's scale may differ by that "
                           "rounding",
              "mxfp8": "each 1x32 block's E8M0 scale, along the rows and along the columns, from the whole block's "
                       "amax of the master cast to the model's dtype, max all-reduced over the shard owners, and "
                       "both casts made from it, the forward's own bytes"}.get(
        recipe.recipe, "scale from the whole weight's amax, max all-reduced over the shard owners")
    moved = "2 bytes per element (the rowwise and the columnwise e4m3 casts; the scales not gathered, every rank " \
        "computing them from the reduced amaxes)" if recipe.recipe == "mxfp8" else "1 byte per element"
    return (f"--fp8-param-gather: ZeRO keeps these linears' weights as e4m3 bytes cast from the fp32 master "
            f"after each step ({scaled}) and "
            f"gathers {moved}, the GEMMs taking them with no second cast; the gathered weights are "
            "also dequantized into the high-precision parameters (the autograd leaves), so device memory is "
            "not reduced; under ZeRO 1-2 these gathers run at the step, not overlapped with the forward; the "
            "guard does not count that cast"
            + ("; the weight is cast once per step, not once per micro-batch (TransformerEngine's FP8 "
               "parameters)" if recipe.recipe == "delayed" else ""))


# torch 2.13's vectorized CPU kernels give non-finite gradients in the compiled FP8 backward; scalar kernels give
# eager's bits.
CPU_FP8_COMPILE_OPTIONS = {"cpp.simdlen": 1}


def compile_options(model_config, device: torch.device) -> Optional[dict]:
    return dict(CPU_FP8_COMPILE_OPTIONS) if model_config.fp8.enabled and device.type == "cpu" else None


def delayed_states(model: nn.Module) -> dict:
    """{module name: DelayedScaling} of the delayed-scaling linears (the checkpoint's histories); {} otherwise."""
    return {name: state.delayed for name, state in fp8_states(model).items() if state.delayed is not None}


def _fp8_linear_call(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None, *,
                     state: Fp8LinearState) -> torch.Tensor:
    return fp8_linear(x, weight, bias, state)


def _fp8_joined_call(x: torch.Tensor, weights: tuple, *, state: Fp8LinearState) -> torch.Tensor:
    """A gated MLP's gate and up as one FP8 linear: [gate(x), up(x)] along the last dimension."""
    return fp8_linear(x, weights, None, state)
