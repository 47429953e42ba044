"""The planner's command line, `python -m zero.plan`: will a model fit, and what will it send, on any cluster
without GPUs (tables, dry-run, max-size, search)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import sys
from typing import Optional, Sequence

from arguments.bounds import check_parameters_fit
from arguments.config import ConfigError, PretrainConfig
from arguments.parser import ParsedArguments
from arguments.training_config import TrainingConfig
from base.errors import OneLineArgumentParser, run_tool
from data import DataError
from data.data_config import DataConfig
from data.per_split import describe_sources
from gpt.model_config import ModelConfig
from parallel.config import ParallelismConfig
from planner.dry_run import MAX_PLAN_LAYERS, Cluster, RankPlan, check_plannable, dry_run
from planner.input_bounds import check_gpu_count
from planner.layout_of_config import PRETRAIN_GPT, TRAINERS
from planner.levers import Lever, find_levers, format_levers
from planner.moe_plan import moe_lines, moe_state_rows
from planner.paper_tables import PAPER_FIGURE6, PAPER_TABLE2_MEASURED, format_parameters, format_table1, format_table2
from planner.pipeline_plan import PipelineFigures
from planner.stage_plans import run_plans, stage_plans
from planner.vocabulary import launch_vocab
from training.memory_fit import available_host_memory
from zero.memory import format_bytes
from zero.optimizer_config import OptimizerConfig

USAGE = """The planner: will it fit, and what will it send, for any model on any cluster, without GPUs.

    python -m zero.plan tables                       # the ZeRO paper's Tables 1 and 2, from the formulas
    python -m zero.plan dry-run --world-size 400 --gpus-per-node 16 --gpu-memory 32GB \
        --num-layers 212 --hidden-size 8192 --num-attention-heads 64 --tensor-model-parallel-size 16 \
        --zero-stage 2 --checkpoint-activations --partition-activations --micro-batch-size 4 --fp16 [--json]
    python -m zero.plan search --config llama3-8b --gpus 8 --hardware h100-sxm --global-batch-size 128 \
        --seq-length 8192 [--json]                   # rank every layout, print commands (planner/search_cli.py)
    python -m zero.plan max-size --world-size 400 --gpus-per-node 16 --gpu-memory 32GB \
        --tensor-model-parallel-size 16 --hidden-size 8192 --num-attention-heads 64 --micro-batch-size 16 --fp16

`dry-run` and `max-size` take every `pretrain_gpt.py` flag plus the cluster: `--world-size`, `--gpus-per-node`,
`--gpu-memory` (32GB = 32e9 bytes, 32GiB = 32 x 2^30), `--host-memory` (per node) and `--rank`. The vocabulary is the
one `pretrain_gpt.py` builds with the same flags (planner/launch.py launch_vocab). A dry run builds the real model and
ZeRO setup for one rank on the meta device and runs one iteration (planner/dry_run.py); `max-size` repeats it to find
the most layers that fit under the paper's C1-C5. A dry run that does not fit plans its levers (planner/levers.py);
with `--hardware P` it adds the layout model's step time (planner/layout_prediction.py; `--trainer megatron-lm` as
Megatron-LM runs the flags). `dry-run --help` and `search --help` list the planner's flags, `--help-model`
pretrain_gpt.py's. Bad flags: one line on stderr, exit status 2. Bounded: at most 1,024 layers, progress after ten
seconds, `--gpu-memory` at most 16 TB, `max-size` a few dozen dry runs (a fit at 1,024 is "at least 1024")."""

GPT2_VOCAB = 50257
# the paper's Figures 6-8 configurations (section 10.4), each with activation checkpointing
CONFIGURATIONS = {
    "C1": {"stage": 1, "partition_activations": False, "cpu_checkpointing": False},
    "C2": {"stage": 1, "partition_activations": True, "cpu_checkpointing": False},
    "C3": {"stage": 2, "partition_activations": False, "cpu_checkpointing": False},
    "C4": {"stage": 2, "partition_activations": True, "cpu_checkpointing": False},
    "C5": {"stage": 2, "partition_activations": True, "cpu_checkpointing": True},
}
CONFIGURATION_NAMES = {"C1": "P_os", "C2": "P_os + P_a", "C3": "P_os+g", "C4": "P_os+g + P_a",
                       "C5": "P_os+g + P_a+cpu"}
# no GPU holds more than a few hundred GB and a CPU host a few TB; 10^6 GB is a typo
MAX_DEVICE_MEMORY_BYTES = 16 * 10**12


def parse_memory(text: str, flag: str = "--gpu-memory") -> int:
    """"32GB" (decimal), "32GiB" (binary), "80e9" or a byte count -> bytes."""
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:[eE][0-9]+)?)\s*([KMGT]i?B)?\s*", text)
    if not match:
        raise ConfigError(f"{flag} {text!r}: give a size like 32GB, 80GiB or 34359738368")
    value, unit = float(match.group(1)), (match.group(2) or "B")
    scale = {"B": 1} if unit == "B" else {unit: (1024 if "i" in unit else 1000) ** ("KMGT".index(unit[0]) + 1)}
    size = value * scale[unit]
    if not 1 <= size <= MAX_DEVICE_MEMORY_BYTES:
        raise ConfigError(f"{flag} {text}: give a size from 1 byte to {MAX_DEVICE_MEMORY_BYTES // 10**12} TB "
                          f"(no GPU, nor a CPU host, holds more; MAX_DEVICE_MEMORY_BYTES in planner/plan.py)")
    return int(size)


# ---- dry-run ----
def format_plan(plan: RankPlan, cluster: Cluster, config: PretrainConfig, vocab_source: str,
                levers: Optional[list[Lever]] = None) -> str:
    """The plan as a table; `levers`: each lever of a run that does not fit, planned."""
    training, activations = config.training, config.activations
    devices = "GPUs" if cluster.device_type == "cuda" else "processes"
    stages = plan.pipeline
    where = f"PP rank {stages.pipeline_parallel_rank}, " if stages is not None else ""
    grid = f"PP {stages.pipeline_parallel_size} x " if stages is not None else ""
    lines = [f"dry run of rank {plan.rank} ({where}TP rank {plan.tensor_parallel_rank}, DP rank "
             f"{plan.data_parallel_rank}) of {cluster.world_size} {devices}, {cluster.gpus_per_node} per node: "
             f"{grid}TP {plan.tensor_parallel_size} x DP {plan.data_parallel_size}"
             + (f" x CP {config.parallel.context_parallel_size} (--cp-comm-type {config.model.attention.cp_comm_type}; each rank "
                f"holds {config.model.seq_length // config.parallel.context_parallel_size} tokens of a sequence)"
                if config.parallel.context_parallel_size > 1 else ""),
             f"model: {_count(plan.parameters_total)} parameters ({config.model.num_layers} layers, hidden "
             f"{config.model.hidden_size}, {config.model.num_attention_heads} heads, sequence "
             f"{config.model.seq_length}; vocabulary from {vocab_source}); this rank's TP shard "
             f"{plan.parameters_local:,}",
             f"training: ZeRO stage {plan.stage}, {plan.precision} parameters, {plan.gradient_precision} gradients, "
             f"micro batch {training.micro_batch_size}, {plan.micro_batches} micro-batch"
             f"{'es' if plan.micro_batches > 1 else ''} a step on each DP rank"
             + ("" if plan.simulated_micro_batches == plan.micro_batches else
                f" ({plan.simulated_micro_batches} planned: the schedule's warm-up and steady state, which the rest "
                f"repeat)" if stages is not None else
                f" ({plan.simulated_micro_batches} planned: the first and the last, which reduces; they run one at a "
                f"time and the others repeat the first)")
             + "; checkpointing "
             + (("on" + (f", the first {activations.checkpoint_num_layers} layer"
                         f"{'s' if activations.checkpoint_num_layers != 1 else ''} of each chunk (--recompute-method "
                         f"block)" if activations.recompute_method == "block" else "")
                 + (", P_a" if activations.partition_activations else "")
                 + (", P_a+cpu" if activations.cpu_checkpointing else "")
                 + (", contiguous (M_D)" if activations.contiguous_checkpointing else ""))
                if activations.checkpoint_activations else "off"),
             *_data_lines(config.data),
             "", "per GPU:" if cluster.device_type == "cuda" else "per process:"]
    states = plan.model_state_bytes
    rows = [("parameters", states["parameters"]), ("gradients", states["gradients"]),
            ("fp32 master weights", states["master_weights"]), (_moments(config.optimizer), states["optimizer_states"]),
            *(moe_state_rows(plan.moe) if plan.moe is not None else []),
            ("constant buffers (C_B: reduce buckets, scatter outputs)", plan.buffer_bytes)]
    if plan.fp8_state_bytes:
        rows.append(("FP8 amax histories and scales, --fp8-param-gather's bytes", plan.fp8_state_bytes))
    if plan.offload_copy_bytes:
        rows.append(("offloaded shards' device copies in flight at the peak", plan.offload_copy_bytes))
    if plan.stage == 3:
        rows.append((f"stage-3 gathered chunks, peak (prefetch {plan.stage3_prefetch_elements:,} elements)",
                     plan.stage3_live_chunk_bytes))
    contiguous = activations.contiguous_checkpointing and activations.checkpoint_activations
    checkpoints = "activation checkpoints" + (" (1/TP each, P_a)" if activations.partition_activations else "")
    rows += [("saved for backward, peak over the iteration", plan.saved_activation_bytes["device"]),
             (f"  {checkpoints} alive at once (in the contiguous buffer below)" if contiguous else
              f"  of which {checkpoints}", plan.checkpoint_bytes["device"]),
             ("  of which the loss's fp32 softmax", plan.loss_softmax_bytes),
             ("  one block's saved tensors in forward", plan.block_saved_bytes["forward"]),
             ("  one block's saved tensors in backward (recompute: in the total beside the checkpoints kept then)",
              plan.block_saved_bytes["backward"]),
             *([("contiguous checkpoint buffer (M_D: a slot set per micro-batch in flight, held)",
                 plan.contiguous_checkpoint_buffer_bytes["device"])] if plan.contiguous_checkpoint_buffer_bytes["device"]
               else []),
             ("logits of one micro-batch (transient)", plan.logits_bytes),
             *([("pipeline sends held at once (each until its rank's slot two on)", plan.p2p_held_bytes),
                ("  peak of saved activations, held sends and gloo's copy over the schedule",
                 stages.pass_peak_bytes)] if stages is not None else []),
             ("gradients in flight: logits, block boundaries and the MLP's", plan.gradient_working_bytes),
             ("largest parameter gradient before the reducer takes it (tied: both)", plan.parameter_gradient_bytes),
             *([("  what is live as a parameter gradient arrives, with it, at the most (in the total instead)",
                 stages.gradient_arrival_peak_bytes)] if stages is not None else []),
             *([("FP8 weights cast once an iteration, kept through its micro-batches (data and transpose)",
                 plan.fp8_weight_cache_bytes)] if plan.fp8_weight_cache_bytes else [])]
    if any(plan.transport_copy_bytes.values()):
        # read at its collective, not on top of the activations' peak
        rows.append(("gloo's copy of the passes' largest collective (beside what is saved then)",
                     plan.transport_copy_bytes["passes"]))
    rows.append(("optimizer step's temporaries (fused AdamW: none, AdEMAMix: 3 windows; gradient partition or publishing"
                 + (", gloo's copy" if plan.transport_copy_bytes["step"] else "") + ")", plan.step_working_bytes))
    if plan.cuda_graph_static_bytes:
        rows += [("CUDA graphs' static buffers (inputs, incoming gradients, gradient arena)", plan.cuda_graph_static_bytes),
                 ("CUDA graphs' pool, held through the step (saved activations, block gradients)",
                  plan.cuda_graph_pool_bytes)]
    width = max(len(name) for name, _ in rows) + 2
    lines += [f"  {name:<{width}} {format_bytes(value):>12}" for name, value in rows]
    lines.append(f"  {'total (states + buffers + the larger of the passes and the step)':<{width}} "
                 f"{format_bytes(plan.total_bytes):>12}")
    if plan.first_iteration_bytes and plan.first_iteration_bytes != plan.total_bytes:
        lines.append(f"  {'  of which iteration 1 reaches (its constant buffers appear at its first reduction)':<{width}} "
                     f"{format_bytes(plan.first_iteration_bytes):>12}")
    if plan.moe is not None:
        lines += moe_lines(plan.moe, plan.total_bytes, width)
    if plan.process_baseline_bytes:
        lines.append(f"  {'process baseline, not in the total (this planner process: Python, torch)':<{width}} "
                     f"{format_bytes(plan.process_baseline_bytes):>12}")
    if plan.budget_bytes is not None:
        verdict = "fits" if plan.fits_device else "does NOT fit"
        lines.append(f"  budget {format_bytes(plan.budget_bytes)}: {verdict}, headroom "
                     f"{format_bytes(plan.headroom_bytes)}" if plan.fits_device else
                     f"  budget {format_bytes(plan.budget_bytes)}: {verdict}, short by {format_bytes(-plan.headroom_bytes)}"
                     + (f"; {best_lever(levers).describe()}" if levers else ""))
    lines += _host_lines(plan, width, _moments(config.optimizer))
    lines.append(f"  {'a resume reads (the fp32 master and moments of its own partition, at any saved layout)':<{width}} "
                 f"{format_bytes(plan.checkpoint_read_bytes):>12}")
    lines += ["", "sent per iteration by this rank:"]
    for group, kinds in plan.comm_bytes.items():
        if group == "pp" or (group == "embedding" and stages is None):
            continue
        sent = ", ".join(f"{kind} {format_bytes(n)}" for kind, n in kinds.items() if n)
        lines.append(f"  {group}: {sent or 'nothing'}")
    if stages is not None:
        lines += _pipeline_lines(stages)
    lines += [f"FLOPs per iteration: {plan.flops_per_iteration:.3e} (model FLOPs"
              + (" with recompute" if activations.checkpoint_activations else "") + f"), {plan.flops_per_gpu:.3e} per GPU",
              "", "not known to a dry run (leave headroom for them):"]
    lines += [f"  - {unknown}" for unknown in plan.unknowns] + [f"note: {note}" for note in plan.notes]
    return "\n".join(lines)


def _data_lines(data: DataConfig) -> list[str]:
    """Which blend each split reads; nothing for the embedded corpus."""
    if not data.user_data:
        return []
    return [f"data: {describe_sources(data.sources(), data.split)}"]


def _pipeline_lines(stages: PipelineFigures) -> list[str]:
    schedule = f"interleaved 1F1B, {stages.chunks} model chunks a stage" if stages.chunks > 1 else "1F1B"
    return [f"  pp (point-to-point): {format_bytes(stages.p2p_sent_bytes)} (messages of "
            f"{format_bytes(stages.p2p_message_bytes)}: activations forward, gradients back)",
            f"pipeline: {schedule}, {stages.micro_batches} micro-batches; at most "
            f"{stages.peak_chunk_forwards_in_flight} chunk forwards await their backward on this stage "
            f"(planned from {stages.simulated_micro_batches} micro-batches, the rest's sends added); bubble "
            f"{stages.bubble_fraction:.1%} of the iteration ((P-1)/(vp*M+P-1), Narayanan et al. 2021)"]


def format_stage_table(plans: list[RankPlan], levers: Optional[list[Lever]] = None) -> str:
    lines = ["per stage (same DP and TP rank): rank, layers' model states, saved for backward, pipeline sends "
             "held, total"]
    for plan in plans:
        lines.append(f"  stage {plan.pipeline.pipeline_parallel_rank:>3} rank {plan.rank:>5}: "
                     f"{format_bytes(plan.model_state_bytes['total']):>12} {format_bytes(plan.saved_activation_bytes['device']):>12} "
                     f"{format_bytes(plan.p2p_held_bytes):>12} {format_bytes(plan.total_bytes):>12}"
                     + ("" if plan.fits_device is None else ("  fits" if plan.fits_device else "  does NOT fit")))
    worst = max(plans, key=lambda plan: plan.total_bytes)
    parts = {"model states": worst.model_state_bytes["total"], "saved for backward": worst.saved_activation_bytes["device"],
             "pipeline sends held": worst.p2p_held_bytes}
    largest = max(parts, key=parts.get)
    lines.append(f"worst stage: {worst.pipeline.pipeline_parallel_rank} ({format_bytes(worst.total_bytes)}); its "
                 f"largest part: {largest} ({format_bytes(parts[largest])})"
                 + (f"; {best_lever(levers).describe()}" if levers else ""))
    return "\n".join(lines)


def best_lever(levers: list[Lever]) -> Lever:
    """The first lever that fits (the cheapest), else the closest."""
    return next((lever for lever in levers if lever.fits), None) or max(levers, key=lambda lever: lever.headroom_bytes)


def _moments(optimizer: OptimizerConfig) -> str:
    """The optimizer states' names and stored dtypes."""
    if optimizer.optimizer == "ademamix":
        return "AdEMAMix moments (m1, m2, nu)"
    if optimizer.optimizer == "sophiag":
        return "Sophia-G states (momentum, Hessian estimate)"
    dtypes = (optimizer.algorithms.exp_avg_dtype, optimizer.algorithms.exp_avg_sq_dtype)
    return "Adam moments" if dtypes == ("fp32", "fp32") else f"Adam moments ({dtypes[0]}, {dtypes[1]})"


def _host_lines(plan: RankPlan, width: int, moments: str = "Adam moments") -> list[str]:
    """This rank's and the node's host memory, and its verdict against --host-memory."""
    host = plan.host_model_state_bytes
    rows = [(f"host: {name} (offloaded)", host[key]) for name, key in
            (("16-bit parameter shard", "parameters"), ("fp32 gradient partition", "gradients"),
             ("fp32 master weights", "master_weights"), (moments, "optimizer_states"))]
    rows += [("host: constant buffers", plan.host_buffer_bytes),
             ("host: activation checkpoints (P_a+cpu)", plan.saved_activation_bytes["host"]),
             ("host: contiguous checkpoint buffer (P_a+cpu with M_D)", plan.contiguous_checkpoint_buffer_bytes["host"]),
             ("host: checkpoint staged (--async-save)", plan.checkpoint_staging_bytes)]
    rows = [(name, value) for name, value in rows if value]
    if not rows:
        return []
    lines = [f"  {name:<{width}} {format_bytes(value):>12}" for name, value in rows]
    lines.append(f"  {f'host total per rank; per node ({plan.ranks_per_node} ranks)':<{width}} "
                 f"{format_bytes(plan.host_total_bytes):>12}; {format_bytes(plan.host_node_bytes)}")
    if plan.host_budget_bytes is not None:
        verdict = "fits" if plan.fits_host else "does NOT fit"
        whose = f" ({plan.host_budget_source})" if plan.host_budget_source else ""
        lines.append(f"  host memory per node {format_bytes(plan.host_budget_bytes)}{whose}: {verdict}"
                     + (f"; the tighter budget is the {plan.binding}'s" if plan.binding else ""))
    return lines


def _count(parameters: int) -> str:
    return f"{parameters / 1e9:.2f}B" if parameters >= 1e9 else f"{parameters:,}"


# ---- max-size ----
def _with(config: PretrainConfig, num_layers: int, configuration: Optional[dict]) -> PretrainConfig:
    model = dataclasses.replace(config.model, num_layers=num_layers)
    zero, activations = config.zero, config.activations
    if configuration is not None:
        zero = dataclasses.replace(zero, stage=configuration["stage"])
        activations = dataclasses.replace(activations, checkpoint_activations=True,
                                          partition_activations=configuration["partition_activations"],
                                          cpu_checkpointing=configuration["cpu_checkpointing"])
    return dataclasses.replace(config, model=model, zero=zero, activations=activations)


def largest_layers(config: PretrainConfig, cluster: Cluster, vocab: int, configuration: Optional[dict],
                   progress=None, plan_run=dry_run) -> tuple[int, Optional[RankPlan]]:
    """The most layers whose dry run fits the budget, and that plan: a secant search on dry runs (bytes grow almost
    linearly with layers), then doubling steps and a bisection, a few dozen dry runs at most. Capped at
    MAX_PLAN_LAYERS."""
    plans: dict[int, RankPlan] = {}

    def plan_for(layers: int) -> RankPlan:
        if layers not in plans:
            plans[layers] = plan_run(_with(config, layers, configuration), cluster, vocab)
            if progress:
                progress(f"    {layers} layers: {format_bytes(plans[layers].total_bytes)}")
        return plans[layers]

    def bracket() -> tuple[int, Optional[int]]:
        """The deepest depth known to fit, and the shallowest deeper one known not to (or None)."""
        deepest = max(layers for layers, plan in plans.items() if plan.fits)
        return deepest, min((layers for layers, plan in plans.items() if not plan.fits and layers > deepest),
                            default=None)

    if not plan_for(1).fits:
        return 0, None
    budget = plan_for(1).budget_bytes if plan_for(1).budget_bytes is not None else cluster.gpu_memory_bytes
    low, high = 1, min(2, MAX_PLAN_LAYERS)
    for _ in range(20):
        slope = max(1.0, (plan_for(high).total_bytes - plan_for(low).total_bytes) / (high - low))
        guess = min(MAX_PLAN_LAYERS, max(1, high + int((budget - plan_for(high).total_bytes) // slope)))
        if guess in (low, high):
            break
        low, high = high, guess
    plan_for(high)
    step = 1
    while True:
        fits, too_deep = bracket()
        if too_deep is None:
            if fits >= MAX_PLAN_LAYERS:
                break
            plan_for(min(MAX_PLAN_LAYERS, fits + step))
        elif too_deep - fits <= 1:
            break
        else:
            plan_for(max(too_deep - step, (fits + too_deep) // 2))
        step *= 2
    return fits, plan_for(fits)


def format_max_size(results: dict[str, tuple[int, Optional[RankPlan]]], cluster: Cluster, model: ModelConfig,
                    parallel: ParallelismConfig, training: TrainingConfig, binds: Optional[dict[str, str]] = None) -> str:
    tp = parallel.tensor_model_parallel_size
    figure6 = tp == 16 and cluster.world_size == 400
    table2 = cluster.world_size == 64 * tp and tp in PAPER_TABLE2_MEASURED
    header = "| config | ZeRO | max layers | parameters | per-GPU total | headroom |"
    rule = "|---|---|---:|---:|---:|---:|"
    host = cluster.host_memory_bytes is not None
    if host:
        header, rule = header + " host per node | binds |", rule + "---:|---|"
    if figure6:
        header, rule = header + " paper Figure 6 |", rule + "---:|"
    if table2:
        header, rule = header + " paper Table 2 measured P_os |", rule + "---:|"
    lines = [f"largest model per configuration on {cluster.world_size} GPUs (TP {tp}), "
             f"{format_bytes(cluster.gpu_memory_bytes)} each; hidden {model.hidden_size}, "
             f"{model.num_attention_heads} heads, sequence {model.seq_length}, micro batch "
             f"{training.micro_batch_size}, {training.precision}"
             + (f"; host memory {format_bytes(cluster.host_memory_bytes)} per node, "
                f"{cluster.ranks_per_node} ranks each" if host else ""), header, rule]
    for name, (layers, plan) in results.items():
        shown = f"at least {layers} (the search's cap)" if layers >= MAX_PLAN_LAYERS else str(layers)
        row = (f"| {name} | {CONFIGURATION_NAMES.get(name, '-')} | {shown} | "
               f"{format_parameters(plan.parameters_total) if plan else '-'} | "
               f"{format_bytes(plan.total_bytes) if plan else '-'} | {format_bytes(plan.headroom_bytes) if plan else '-'} |")
        if host:
            row += (f" {format_bytes(plan.host_node_bytes) if plan else '-'} | {(binds or {}).get(name, '-')} |")
        if figure6:
            paper = PAPER_FIGURE6.get(name)
            row += f" {format_parameters(paper) if paper else 'not given'} |"
        if table2:
            row += f" {format_parameters(PAPER_TABLE2_MEASURED[tp][1]) if name == 'C1' else ''} |"
        lines.append(row)
    return "\n".join(lines)


def binding_budget(too_deep: Optional[RankPlan]) -> str:
    """Which budget stops the search; "neither" where the cap did."""
    if too_deep is None:
        return "neither (the search's cap)"
    broken = [name for name, fits in (("device", too_deep.fits_device), ("host", too_deep.fits_host))
              if fits is False]
    return " and ".join(broken) + " memory"


# ---- the command line ----
MODEL_FLAGS_NOTE = ("Every other flag is pretrain_gpt.py's: the model (--config, --init-from-hf or the shape flags), the "
                    "layout (--tensor-model-parallel-size, --zero-stage, ...), the batch, the precision; "
                    "`--help-model` lists them.")


def print_help(command: str, rest: Sequence[str]) -> int:
    if "--help-model" in rest:
        from arguments.parser import build_parser

        build_parser().print_help()
    else:
        print(planner_arguments(f"python -m zero.plan {command}").format_help())
    return 0


def planner_arguments(prog: str) -> argparse.ArgumentParser:
    p = OneLineArgumentParser(prog=prog, add_help=False, epilog=MODEL_FLAGS_NOTE)
    p.add_argument("--world-size", type=int, default=1, help="GPUs in the job")
    p.add_argument("--gpus-per-node", type=int, default=8)
    p.add_argument("--gpu-memory", default=None, help="per-GPU budget: 32GB, 80GiB, ... (no verdict without it)")
    p.add_argument("--host-memory", default=None,
                   help="host memory per node, shared by its ranks: 512GB, ... (offloaded states, P_a+cpu)")
    p.add_argument("--rank", type=int, default=0, help="which rank to plan")
    p.add_argument("--target", choices=("cuda", "cpu"), default="cuda",
                   help="the device the run will use (it decides which attention kernel's tensors are kept)")
    p.add_argument("--json", action="store_true", help="one JSON object on stdout instead of the table")
    p.add_argument("--hardware", default=None,
                   help="dry-run: a profile in configs/hardware; its node size, memory and device replace the "
                        "cluster flags, and the plan gains the predicted step time: the layout model's, the search's "
                        "(planner/layout_prediction.py), where the profile has a layout calibration")
    p.add_argument("--trainer", choices=TRAINERS, default=PRETRAIN_GPT,
                   help="with --hardware: who runs the flags: this repository's pretrain_gpt.py (Megatron-LM flags it "
                        "accepts with no effect price as nothing) or megatron-lm (--tp-comm-overlap, "
                        "--overlap-moe-expert-parallel-comm, --recompute-modules and the flex dispatcher's backends "
                        "priced as Megatron-LM runs them: Megatron-Bridge's rows)")
    return p


def parse_planner(argv: Sequence[str], prog: str) -> tuple[argparse.Namespace, ParsedArguments, Cluster]:
    from arguments.parser import parse_arguments

    planner, rest = planner_arguments(prog).parse_known_args(list(argv))
    for name in ("world_size", "gpus_per_node"):
        check_gpu_count(f"--{name.replace('_', '-')}", getattr(planner, name))
    if not 0 <= planner.rank < planner.world_size:
        raise ConfigError(f"--rank {planner.rank} is not a rank of --world-size {planner.world_size}; "
                          f"give one from 0 to {planner.world_size - 1}")
    budget = parse_memory(planner.gpu_memory) if planner.gpu_memory is not None else None
    host_budget = parse_memory(planner.host_memory, "--host-memory") if planner.host_memory is not None else None
    parsed = parse_arguments(rest)
    tp = parsed.config.parallel.tensor_model_parallel_size
    if planner.world_size % tp:
        raise ConfigError(f"--tensor-model-parallel-size {tp} does not divide --world-size {planner.world_size} "
                          f"(DP is world size / TP); choose a TP size that divides it")
    return planner, parsed, Cluster(planner.world_size, planner.gpus_per_node, budget, planner.target, host_budget)


def this_machines_host_memory(cluster: Cluster) -> Cluster:
    """`cluster` with this machine's available memory as the host budget per node."""
    available, source = available_host_memory()
    if available is None:
        return cluster
    return dataclasses.replace(cluster, host_memory_bytes=available,
                               host_memory_source=f"this machine's: {source}; --host-memory for the cluster's")


def stderr_line(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    commands = ("tables", "dry-run", "max-size", "search")
    if not argv or argv[0] not in commands:
        if argv and argv[0] in ("-h", "--help"):
            print(USAGE)
            return 0
        raise ConfigError(f"usage: python -m zero.plan {{{','.join(commands)}}} [flags]; see --help")
    command, rest = argv[0], argv[1:]
    if command == "search":
        from planner.search_cli import search_command
        return search_command(rest)
    if command in ("dry-run", "max-size") and {"-h", "--help", "--help-model"} & set(rest):
        return print_help(command, rest)
    if command == "tables":
        if rest:
            raise ConfigError(f"tables takes no flags; got {' '.join(rest)}")
        print(format_table1() + "\n\n" + format_table2())
        return 0
    planner, parsed, cluster = parse_planner(rest, f"python -m zero.plan {command}")
    config = parsed.config
    hardware = None
    if planner.hardware is not None:
        from planner.perf_model import load_hardware

        hardware = load_hardware(planner.hardware)
        cluster = dataclasses.replace(cluster, gpus_per_node=hardware.gpus_per_node, device_type=hardware.device_type,
                                      gpu_memory_bytes=cluster.gpu_memory_bytes or hardware.gpu_memory_bytes)
    if command == "dry-run":
        if cluster.gpu_memory_bytes is not None:
            check_parameters_fit(config.model, cluster.world_size, cluster.gpu_memory_bytes,
                                 "GPUs" if cluster.device_type == "cuda" else "processes")
        check_plannable(config.model)
        if cluster.host_memory_bytes is None:  # the host total checked against something: this machine
            cluster = this_machines_host_memory(cluster)
    elif cluster.gpu_memory_bytes is None:
        raise ConfigError("max-size needs --gpu-memory (the budget each GPU has)")
    vocab, source = launch_vocab(config.checkpoint, config.data, config.model, config.sources)
    if command == "dry-run":
        stages = stage_plans(config, cluster, vocab, planner.rank, stderr_line) \
            if config.parallel.pipeline_model_parallel_size > 1 else []
        plan = next((stage for stage in stages if stage.rank == planner.rank), None) or \
            dry_run(config, cluster, vocab, planner.rank, progress=stderr_line)
        levers = None
        if any(each.fits_device is False for each in stages or [plan]):
            def plan_stages(changed: PretrainConfig, on: Cluster) -> list[RankPlan]:
                return run_plans(changed, on, vocab)

            levers = find_levers(config, cluster, plan.data_parallel_size, plan_stages, progress=stderr_line)
        predicted, predicted_text = {}, ""
        if hardware is not None:
            predicted, predicted_text = _predicted_step(plan, config, parsed.harvested, planner, vocab, cluster,
                                                        hardware)
        if planner.json:
            print(json.dumps({**plan.to_json(), **({"stages": [stage.to_json() for stage in stages]} if stages else {}),
                              **({"levers": [lever.to_json() for lever in levers]} if levers is not None else {}),
                              **predicted}))
        else:
            print(format_plan(plan, cluster, config, source, levers)
                  + ("\n\n" + format_stage_table(stages, levers) if stages else "")
                  + ("\n\n" + "\n".join(format_levers(levers)) if levers is not None else "") + predicted_text)
        return 0
    results, binds = {}, {}
    for name, configuration in CONFIGURATIONS.items():
        stderr_line(f"> {name} ({CONFIGURATION_NAMES[name]})")
        plans: dict[int, RankPlan] = {}

        def plan_run(depth_config, depth_cluster, depth_vocab, plans=plans):
            plans[depth_config.model.num_layers] = dry_run(depth_config, depth_cluster, depth_vocab,
                                                           progress=stderr_line)
            return plans[depth_config.model.num_layers]

        results[name] = largest_layers(config, cluster, vocab, configuration, progress=stderr_line, plan_run=plan_run)
        binds[name] = binding_budget(plans.get(results[name][0] + 1))
    if planner.json:
        print(json.dumps({name: {"layers": layers, "at_search_cap": layers >= MAX_PLAN_LAYERS,
                                 "binds": binds[name], "plan": plan.to_json() if plan else None}
                          for name, (layers, plan) in results.items()}))
    else:
        print(format_max_size(results, cluster, config.model, config.parallel, config.training, binds))
    return 0


def _predicted_step(plan: RankPlan, config: PretrainConfig, megatron_flags: dict, planner: argparse.Namespace,
                    vocab: int, cluster: Cluster, hardware) -> tuple[dict, str]:
    """The planned layout's step time as JSON fields and text: the layout model's where the profile has its calibration,
    else the dry-run-based model's."""
    if hardware.layout_calibration is not None:
        from planner.layout_prediction import format_layout_prediction, predict_config, prediction_json

        try:
            _, prediction, constants = predict_config(config.model, config.parallel, config.training, config.zero,
                                                      config.activations, cluster.world_size, vocab, hardware,
                                                      planner.trainer, megatron_flags)
        except ConfigError as error:  # a run the layout model does not price: the plan stands, the step is said
            return {"step_s": None, "no_prediction": str(error)}, f"\n\nno predicted step: {error}"
        return prediction_json(prediction, planner.trainer), \
            "\n\n" + format_layout_prediction(prediction, hardware, constants, planner.trainer)
    from planner.perf_model import format_prediction, load_constants, predict

    constants = load_constants(hardware.calibration)
    prediction = predict(plan, config, vocab, cluster.world_size, hardware, constants)
    return {"step_s": prediction.iteration_s, "tflops_per_gpu": prediction.model_tflops_per_gpu,
            "prediction": prediction.to_json()}, "\n\n" + format_prediction(prediction, hardware, constants)


def command(argv: Optional[Sequence[str]] = None) -> int:
    """`main` behind the entry-point boundary: exit status 0, or 2 with one line on stderr."""
    return run_tool("python -m zero.plan", lambda: main(argv), (ConfigError, DataError))


if __name__ == "__main__":
    sys.exit(command())
