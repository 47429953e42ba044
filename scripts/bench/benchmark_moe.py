#!/usr/bin/env python
"""Benchmark our expert-parallel MoE GPT against the same model in DeepSpeed-MoE, on CPU, side by side.

    DS_ACCELERATOR=cpu python scripts/bench/benchmark_moe.py --rounds 3     # ours vs DeepSpeed-MoE, EP 2

Both train the same small GPT with DeepSpeed-MoE gating from our weights, so they keep and drop the same tokens:
losses side by side, then step time, peak RSS and bytes sent per rank. Needs requirements-bench.txt."""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

SCRIPT = Path(__file__).resolve()
REPO_ROOT = SCRIPT.parents[2]
for path in (REPO_ROOT, SCRIPT.parent):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

from base.errors import ConfigError, OneLineArgumentParser, run_tool  # noqa: E402  (standard library only)
from benchmark_zero import _cpu_model, _ratio, _status_kb, progress, run_ranks  # noqa: E402

SYSTEM_ORDER = ("ours", "deepspeed")
LABELS = {"ours": "ours", "deepspeed": "DeepSpeed-MoE"}


# ----------------------------------------------------------------------------- orchestration

def comma_ints(text: str) -> list[int]:
    try:
        values = sorted({int(part) for part in text.split(",") if part.strip()})
    except ValueError:
        values = []
    if not values:
        raise argparse.ArgumentTypeError(f"expected a comma list of integers such as 1,2, got {text!r}")
    return values


def parse_args(argv=None) -> argparse.Namespace:
    p = OneLineArgumentParser(prog="benchmark_moe.py", description=__doc__.split("\n\n")[0],
                              formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--systems", default=",".join(SYSTEM_ORDER), help="comma list of " + ", ".join(SYSTEM_ORDER))
    p.add_argument("--world-size", type=int, default=2)
    p.add_argument("--expert-parallel-size", type=int, default=2,
                   help="ours: --moe-expert-parallel-size; DeepSpeed: MoE(ep_size=...)")
    p.add_argument("--stages", type=comma_ints, default=[1],
                   help="ZeRO stages, 0-2 (DeepSpeed-MoE refuses ZeRO-3: engine.py 'Native DeepSpeed MoE is not "
                        "supported with ZeRO Stage 3')")
    p.add_argument("--num-experts", type=int, default=4)
    p.add_argument("--topk", type=int, default=2, choices=(1, 2), help="DeepSpeed-MoE's top-1 or top-2 gating")
    p.add_argument("--capacity-factor", type=float, default=1.0,
                   help="--moe-train-capacity-factor; MoE(capacity_factor=...)")
    p.add_argument("--min-capacity", type=int, default=4, help="--moe-min-capacity; MoE(min_capacity=...)")
    p.add_argument("--disable-moe-token-dropping", action="store_true",
                   help="keep every token (MoE(drop_tokens=False): DeepSpeed pads each expert to the largest count)")
    p.add_argument("--top2-2nd-expert-sampling", action="store_true",
                   help="sample top-2's second expert (Gumbel noise; the two sides then draw different noise and "
                        "their losses part); default: argmax on both sides")
    p.add_argument("--moe-loss-coeff", type=float, default=0.1)
    p.add_argument("--expert-interval", type=int, default=1,
                   help="an MoE layer at every N-th layer (Megatron-DeepSpeed's --expert-interval; its default is 2)")
    p.add_argument("--dispatcher", choices=("alltoall", "allgather"), default="alltoall",
                   help="our --moe-token-dispatcher-type (DeepSpeed-MoE always exchanges by all-to-all)")
    p.add_argument("--num-layers", type=int, default=4)
    p.add_argument("--hidden-size", type=int, default=256)
    p.add_argument("--num-attention-heads", type=int, default=4)
    p.add_argument("--seq-length", type=int, default=128)
    p.add_argument("--vocab-size", type=int, default=4096, help="padded to a multiple of 128")
    p.add_argument("--micro-batch-size", type=int, default=8, help="per rank; one micro-batch per step")
    p.add_argument("--warmup-steps", type=int, default=3)
    p.add_argument("--steps", type=int, default=10, help="timed steps")
    p.add_argument("--rounds", type=int, default=1,
                   help="run the plan this many times, interleaved; each configuration keeps its round with the "
                        "lowest median step time")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--adam-beta1", type=float, default=0.9)
    p.add_argument("--adam-beta2", type=float, default=0.95)
    p.add_argument("--adam-eps", type=float, default=1e-8)
    p.add_argument("--clip-grad", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--reduce-bucket-size", type=int, default=1_000_000, help="elements (ours and DeepSpeed)")
    p.add_argument("--allgather-bucket-size", type=int, default=1_000_000, help="elements (ours and DeepSpeed)")
    p.add_argument("--timeout", type=float, default=900, help="seconds per configuration")
    p.add_argument("--output", help="also write the Markdown report here")
    p.add_argument("--json", help="also write every measurement here: {args, results}")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if not args.worker:
        check(args)
    return args


def check(args) -> None:
    """The plan's refusals, each one line (base/errors.py's boundary: exit 2)."""
    systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    unknown = sorted(set(systems) - set(SYSTEM_ORDER))
    if unknown or not systems:
        raise ConfigError(f"--systems: unknown {', '.join(unknown) or 'empty list'}; choose from "
                          f"{', '.join(SYSTEM_ORDER)}", flags=("--systems",))
    if any(stage not in (0, 1, 2) for stage in args.stages):
        raise ConfigError(f"--stages {','.join(map(str, args.stages))}: ZeRO stages 0, 1 and 2 only; DeepSpeed "
                          f"0.19's engine refuses its MoE layer under ZeRO-3 ('Native DeepSpeed MoE is not "
                          f"supported with ZeRO Stage 3')", flags=("--stages",))
    ep, experts, world = args.expert_parallel_size, args.num_experts, args.world_size
    if ep < 1 or world < 1 or world % ep:
        raise ConfigError(f"--expert-parallel-size {ep} must divide --world-size {world} (the expert-parallel "
                          f"group is carved out of the data-parallel ranks)",
                          flags=("--expert-parallel-size", "--world-size"))
    if experts < 2 or experts % ep:
        raise ConfigError(f"--num-experts {experts} must be at least 2 and divisible by --expert-parallel-size "
                          f"{ep}: each expert-parallel rank holds an equal share",
                          flags=("--num-experts", "--expert-parallel-size"))
    if args.topk > experts:
        raise ConfigError(f"--topk {args.topk} is more than --num-experts {experts}", flags=("--topk",))
    if args.expert_interval < 1 or args.expert_interval > args.num_layers:
        raise ConfigError(f"--expert-interval {args.expert_interval} leaves no MoE layer in {args.num_layers} "
                          f"layers", flags=("--expert-interval", "--num-layers"))
    if args.micro_batch_size * args.seq_length < args.min_capacity:
        # DeepSpeed's top1gating asserts it ("No. of tokens (batch-size) should be greater than min_capacity")
        raise ConfigError(f"--micro-batch-size x --seq-length ({args.micro_batch_size * args.seq_length} tokens "
                          f"per rank) is below --min-capacity {args.min_capacity}", flags=("--min-capacity",))
    if args.steps < 1 or args.warmup_steps < 0 or args.rounds < 1:
        raise ConfigError("--steps and --rounds must be at least 1, --warmup-steps at least 0",
                          flags=("--steps", "--rounds", "--warmup-steps"))


def configurations(args) -> list[tuple[str, int]]:
    """(system, stage) pairs, each stage's DeepSpeed run next to ours."""
    systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    return [(system, stage) for stage in args.stages for system in SYSTEM_ORDER if system in systems]


SPEC_KEYS = ("world_size", "expert_parallel_size", "num_experts", "topk", "capacity_factor", "min_capacity",
             "disable_moe_token_dropping", "top2_2nd_expert_sampling", "moe_loss_coeff", "expert_interval",
             "dispatcher", "num_layers", "hidden_size", "num_attention_heads", "seq_length", "vocab_size",
             "micro_batch_size", "warmup_steps", "steps", "lr", "weight_decay", "adam_beta1", "adam_beta2",
             "adam_eps", "clip_grad", "seed", "reduce_bucket_size", "allgather_bucket_size")


def rank_spec(args, system: str, stage: int, result_dir: Path) -> dict:
    spec = {key: getattr(args, key) for key in SPEC_KEYS}
    # bench_systems.deepspeed_config's other keys: fp32, and stage 3's knobs (unused at stages 0-2)
    spec.update(system=system, stage=stage, result_dir=str(result_dir), bf16=False, prefetch_bucket_size=0,
                param_persistence_threshold=0, max_live_parameters=1_000_000_000)
    return spec


def run_configuration(args, system: str, stage: int, workdir: Path) -> dict:
    """One process per rank, fresh interpreters; wait (with the timeout) and collect what each rank wrote."""
    name = f"{system}-{stage}"
    spec = rank_spec(args, system, stage, workdir / name)
    Path(spec["result_dir"]).mkdir(parents=True, exist_ok=True)
    for old in Path(spec["result_dir"]).glob("rank*.json"):  # a previous round's
        old.unlink()
    spec_path = workdir / f"{name}.json"
    spec_path.write_text(json.dumps(spec))
    failure, ranks, timing = run_ranks(SCRIPT, spec_path, Path(spec["result_dir"]), args.world_size, workdir / name,
                                       args.timeout)
    result = {"system": system, "stage": stage, **timing, "ranks": ranks}
    if failure:
        result["error"] = failure
        return result
    return summarize(result)


def summarize(result: dict) -> dict:
    """One configuration's figures from its ranks' records."""
    ranks = result["ranks"]
    steps = len(ranks[0]["step_times"])
    slowest = [max(r["step_times"][i] for r in ranks) for i in range(steps)]
    # the expert-parallel ranks hold different experts: the model in all is the dense part once, plus every
    # rank's experts once per expert data-parallel replica (the ranks with equal expert_rank hold the same ones)
    dense = ranks[0]["parameters"] - ranks[0]["expert_parameters"]
    experts_by_ep_rank = {r["expert_rank"]: r["expert_parameters"] for r in ranks}
    result.update(
        step_ms=1000 * statistics.median(slowest), step_ms_min=1000 * min(slowest), step_ms_max=1000 * max(slowest),
        # the process's CPU time (all its threads) per step: on a shared machine the work, not the wait for a core
        cpu_ms=1000 * statistics.median(max(r["cpu_times"][i] for r in ranks) for i in range(steps)),
        rss_mb=max(r["ru_maxrss_kb"] for r in ranks) / 1024,
        sent_mb=max(r["shim"]["total"] for r in ranks) / steps / 1e6,
        calls={k: v / steps for k, v in ranks[0]["shim"]["calls"].items()},
        losses=[statistics.fmean(r["losses"][i] for r in ranks) for i in range(len(ranks[0]["losses"]))],
        moe_losses=[statistics.fmean(r["moe_losses"][i] for r in ranks) for i in range(len(ranks[0]["moe_losses"]))],
        grad_norms=ranks[0]["grad_norms"],  # of every parameter, before clipping: the same on every rank
        parameters_per_rank=[r["parameters"] for r in ranks], expert_parameters_per_rank=[r["expert_parameters"]
                                                                                           for r in ranks],
        parameters_total=dense + sum(experts_by_ep_rank.values()),
        versions=ranks[0]["versions"], info=ranks[0].get("info", {}))
    return result


def best_round(results: list[dict]) -> dict:
    """The round with the lowest median step time (a failed round counts only if all failed)."""
    ok = [r for r in results if "error" not in r]
    if not ok:
        return results[-1]
    best = dict(min(ok, key=lambda r: r["step_ms"]))
    best["round_step_ms"] = [r["step_ms"] for r in ok]
    best["round_cpu_ms"] = [r["cpu_ms"] for r in ok]
    return best


def run_plan(args, plan: list[tuple[str, int]], workdir: Path) -> list[dict]:
    """Every configuration --rounds times, interleaved (ours, DeepSpeed, ours, ...); the best round of each."""
    rounds: dict[int, list[dict]] = {i: [] for i in range(len(plan))}
    for round_index in range(args.rounds):
        for i, (system, stage) in enumerate(plan):
            where = f"round {round_index + 1}/{args.rounds}, {i + 1}/{len(plan)}"
            progress(f"({where}) {LABELS[system]} ZeRO {stage}: starting {args.world_size} ranks")
            result = run_configuration(args, system, stage, workdir)
            if "error" in result:
                progress(f"({where}) {LABELS[system]} ZeRO {stage}: FAILED after {result['wall_s']:.0f} s: "
                         f"{result['error']}")
            else:
                progress(f"({where}) {LABELS[system]} ZeRO {stage}: {result['step_ms']:.1f} ms/step, "
                         f"{result['rss_mb']:.0f} MB peak RSS, loss {result['losses'][-1]:.4f}, load "
                         f"{result['loadavg_1min'][0]:.1f}/{result['loadavg_1min'][1]:.1f} "
                         f"({result['wall_s']:.0f} s)")
            rounds[i].append(result)
    return [best_round(rounds[i]) for i in range(len(plan))]


# ----------------------------------------------------------------------------- report

def gating_text(args) -> str:
    drop = ("dropless (--disable-moe-token-dropping: DeepSpeed pads every expert to the largest count)"
            if args.disable_moe_token_dropping else
            f"token dropping at capacity factor {args.capacity_factor:g}, min capacity {args.min_capacity}")
    second = ("; second expert sampled (Gumbel)" if args.top2_2nd_expert_sampling else
              "; second expert by argmax") if args.topk == 2 else ""
    return f"top-{args.topk}, {drop}{second}, moe loss coeff {args.moe_loss_coeff:g}"


def cpu_ms(r: dict) -> float:
    """CPU time per step: the lowest of the rounds' medians (each the median over steps of the busiest rank)."""
    return min(r.get("round_cpu_ms", [r["cpu_ms"]]))


def differences(ours: dict, theirs: dict) -> str:
    """How far apart the two trajectories are: at the first step (the same weights and tokens) and at most."""
    def rel(a, b):
        return abs(a - b) / max(abs(b), 1e-30)

    loss = [abs(a - b) for a, b in zip(ours["losses"], theirs["losses"])]
    moe = [abs(a - b) for a, b in zip(ours["moe_losses"], theirs["moe_losses"])]
    norm = [rel(a, b) for a, b in zip(ours["grad_norms"], theirs["grad_norms"])]
    return (f"|LM loss diff| {loss[0]:.1e} at step 1, {max(loss):.1e} at most; |MoE loss diff| {moe[0]:.1e} at step 1, "
            f"{max(moe):.1e} at most; grad norm relative diff {norm[0]:.1e} at step 1, {max(norm):.1e} at most")


def report(args, results: list[dict]) -> str:
    ok = [r for r in results if "error" not in r]
    versions = {key: value for r in ok for key, value in r["versions"].items()}
    moe_layers = len(range(args.expert_interval - 1, args.num_layers, args.expert_interval))
    lines = [
        f"Machine: {_cpu_model()}, {os.cpu_count()} cores, {platform.system()} {platform.release()}, Python "
        f"{platform.python_version()}; torch {versions.get('torch', '?')}, DeepSpeed "
        f"{versions.get('deepspeed', 'not installed')}; world size {args.world_size} (gloo, 1 thread per rank), "
        f"expert parallelism {args.expert_parallel_size}; model {args.num_layers} layers ({moe_layers} MoE, "
        f"{args.num_experts} experts each), hidden {args.hidden_size}, {args.num_attention_heads} heads, seq "
        f"{args.seq_length}, vocab {args.vocab_size}; {gating_text(args)}; our dispatcher {args.dispatcher}; "
        f"micro batch {args.micro_batch_size}/rank; fp32; {args.warmup_steps} warmup + {args.steps} timed steps; "
        f"step time (wall clock) and CPU time per step (the rank process's, all threads): each the best of "
        f"{args.rounds} interleaved round(s)' medians over the timed steps of the slowest (busiest) rank.",
        "",
        "| system | ZeRO | step time (ms) | every round's median (ms) | CPU time/step (ms) | peak RSS/rank (MB) "
        "| sent/rank/step (MB) | parameters/rank | parameters in all | loss after timed steps |",
        "|---|---|---:|---|---:|---:|---:|---|---:|---:|",
    ]
    for r in results:
        if "error" in r:
            lines.append(f"| {LABELS[r['system']]} | {r['stage']} | failed | | | | | | | |")
            continue
        lines.append(f"| {LABELS[r['system']]} | {r['stage']} | {r['step_ms']:.1f} | "
                     f"{', '.join(f'{x:.0f}' for x in r.get('round_step_ms', [r['step_ms']]))} | {cpu_ms(r):.1f} | "
                     f"{r['rss_mb']:.0f} | "
                     f"{r['sent_mb']:.2f} | {' / '.join(f'{n:,}' for n in r['parameters_per_rank'])} | "
                     f"{r['parameters_total']:,} | {r['losses'][-1]:.4f} |")
    by_key = {(r["system"], r["stage"]): r for r in ok}
    ratios = [(by_key[("ours", s)], by_key[("deepspeed", s)]) for s in args.stages
              if ("ours", s) in by_key and ("deepspeed", s) in by_key]
    if ratios:
        lines += ["", "Ratios ours / DeepSpeed-MoE (below 1: ours is faster, smaller, or sends less):", "",
                  "| ZeRO | step time | CPU time/step | peak RSS | bytes sent | same parameters per rank |",
                  "|---|---:|---:|---:|---:|---|"]
        for x, y in ratios:
            same = "yes" if x["parameters_per_rank"] == y["parameters_per_rank"] else "NO"
            lines.append(f"| {x['stage']} | {_ratio(x['step_ms'], y['step_ms'])} | {_ratio(cpu_ms(x), cpu_ms(y))} | "
                         f"{_ratio(x['rss_mb'], y['rss_mb'])} "
                         f"| {_ratio(x['sent_mb'], y['sent_mb'])} | {same} |")
    lines += ["", "Detail: step time min-max (slowest rank), collectives per step (shim), 1-minute load average "
              "before/after the best round:", "", "| system | ZeRO | step min-max (ms) | collectives per step | load |",
              "|---|---|---:|---|---:|"]
    for r in ok:
        calls = ", ".join(f"{k} {v:g}" for k, v in sorted(r["calls"].items()))
        lines.append(f"| {LABELS[r['system']]} | {r['stage']} | {r['step_ms_min']:.0f}-{r['step_ms_max']:.0f} | "
                     f"{calls} | {r['loadavg_1min'][0]:.1f}/{r['loadavg_1min'][1]:.1f} |")
    lines += ["", f"LM loss and gradient norm (before clipping) per step ({args.warmup_steps} warmup steps, then the "
              f"timed ones; the loss is the mean over ranks; the MoE loss l_aux x coeff, summed over layers, is in the "
              f"gradient and not in the loss):", ""]
    for r in ok:
        lines.append(f"- {LABELS[r['system']]} ZeRO {r['stage']}: loss " + " ".join(f"{x:.4f}" for x in r["losses"])
                     + "; grad norm " + " ".join(f"{x:.4f}" for x in r["grad_norms"]))
    for x, y in ratios:
        lines.append(f"- ours - DeepSpeed-MoE, ZeRO {x['stage']}: " + differences(x, y))
    failed = [r for r in results if "error" in r]
    if failed:
        lines += ["", "Failures:"]
        lines += [f"- {LABELS[r['system']]} ZeRO {r['stage']}: " + r["error"].strip().splitlines()[0] for r in failed]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.worker:
        return worker(args.worker)
    plan = configurations(args)
    with tempfile.TemporaryDirectory(prefix="benchmark_moe.") as tmp:
        results = run_plan(args, plan, Path(tmp))
    text = report(args, results)
    print(text, end="", flush=True)
    if args.output:
        Path(args.output).write_text(text)
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "results": results}, indent=1))
    return 0 if all("error" not in r for r in results) else 1


# ----------------------------------------------------------------------------- one rank

def our_config(spec: dict):
    """Megatron-DeepSpeed's MoE flags through our parser, as a launch of pretrain_gpt.py gives them."""
    from arguments.parser import parse_config

    argv = ["--num-layers", spec["num_layers"], "--hidden-size", spec["hidden_size"],
            "--num-attention-heads", spec["num_attention_heads"], "--seq-length", spec["seq_length"],
            "--max-position-embeddings", spec["seq_length"], "--vocab-size", spec["vocab_size"],
            "--hidden-dropout", 0, "--attention-dropout", 0, "--micro-batch-size", spec["micro_batch_size"],
            "--global-batch-size", spec["micro_batch_size"] * spec["world_size"],
            "--lr", spec["lr"], "--min-lr", 0, "--weight-decay", spec["weight_decay"], "--clip-grad", spec["clip_grad"],
            "--adam-beta1", spec["adam_beta1"], "--adam-beta2", spec["adam_beta2"], "--adam-eps", spec["adam_eps"],
            "--seed", spec["seed"], "--device", "cpu", "--no-bf16", "--zero-stage", spec["stage"], "--overlap-comm",
            "--reduce-bucket-size", spec["reduce_bucket_size"], "--allgather-bucket-size", spec["allgather_bucket_size"],
            # DeepSpeed's stages 1-2 reduce gradients in the training dtype: compare like with like
            "--no-accumulate-allreduce-grads-in-fp32",
            "--moe-gating", "deepspeed", "--num-experts", spec["num_experts"], "--topk", spec["topk"],
            "--moe-train-capacity-factor", spec["capacity_factor"], "--moe-eval-capacity-factor", spec["capacity_factor"],
            "--moe-min-capacity", spec["min_capacity"], "--moe-loss-coeff", spec["moe_loss_coeff"],
            "--expert-interval", spec["expert_interval"],
            "--moe-expert-parallel-size", spec["expert_parallel_size"] if spec["system"] == "ours" else 1,
            "--moe-token-dispatcher-type", spec["dispatcher"]]
    if spec["disable_moe_token_dropping"]:
        argv.append("--disable-moe-token-dropping")
    if not spec["top2_2nd_expert_sampling"]:
        argv.append("--disable-moe-top2-2nd-expert-sampling")
    return parse_config([str(a) for a in argv])


class OurMoESystem:
    """training/build.py's construction (TP plan with the dispatcher, the model on the meta device, our ZeRO with
    the experts' own part over the expert data-parallel group) and pretrain_gpt.py's step."""

    def __init__(self, spec: dict, config, state):
        from gpt.model import GPTModel
        from gpt.parallel_plan import tensor_parallel_plan
        from parallel.sharding import record_of
        from zero.apply import apply_zero
        from zero.experts import build_zero_with_experts

        self.spec = spec
        self.model = GPTModel(config.model, state, plan=tensor_parallel_plan(state, config.parallel))
        params = list(self.model.parameters())
        self.parameters = sum(p.numel() for p in params)  # on the meta device: whole shapes at any ZeRO stage
        self.expert_parameters = sum(p.numel() for p in params if record_of(p).is_expert)
        self.zero = apply_zero(self.model, config, state, blocks=self.model.blocks,
                               build=build_zero_with_experts if state.experts.model_size > 1 else None)
        self.optimizer = self.zero.optimizer
        self.expert_rank = state.experts.model_rank
        self.info = {"optimizer": type(self.optimizer).__name__, "expert_data_parallel_size": state.experts.data_size}

    def step(self, inputs, labels) -> tuple[float, float, float]:
        for group in self.optimizer.param_groups:
            group["lr"] = self.spec["lr"]
        tracker = self.model.moe_tracker
        tracker.begin_iteration(1.0)  # fp32, one micro-batch: the MoE loss's gradient at scale 1
        self.zero.reducer.zero_grad()
        loss = self.model(inputs, labels).mean()
        self.zero.scale_loss(loss).backward()
        self.zero.reducer.finish_grad_sync()
        result = self.optimizer.step()
        if getattr(result, "skipped", False):
            raise RuntimeError("our optimizer skipped a step (overflow) in an fp32 benchmark")
        moe_loss = sum(tracker.sums().get("moe_loss", {}).values())
        return loss.item(), float(moe_loss), result.grad_norm


def deepspeed_expert(ours_expert, activation):
    """DeepSpeed-MoE's expert module for one of our ExpertMLPs: h -> ffn -> activation -> h, with the same
    names and shapes (DeepSpeed deep-copies it per local expert, deepspeed/moe/experts.py Experts)."""
    import torch.nn.functional as F
    from torch import nn

    class Expert(nn.Module):
        def __init__(self):
            super().__init__()
            up, down = ours_expert.dense_h_to_4h, ours_expert.dense_4h_to_h
            self.dense_h_to_4h = nn.Linear(up.weight.shape[1], up.weight.shape[0], bias=up.bias is not None)
            self.dense_4h_to_h = nn.Linear(down.weight.shape[1], down.weight.shape[0], bias=down.bias is not None)
            self.activation = activation

        def forward(self, hidden):
            return F.linear(self.activation(F.linear(hidden, self.dense_h_to_4h.weight, self.dense_h_to_4h.bias)),
                            self.dense_4h_to_h.weight, self.dense_4h_to_h.bias)

    return Expert()


def deepspeed_moe_mlp(ours, spec: dict, ep_rank: int, l_aux: list):
    """A module in our MoELayer's place: deepspeed.moe.layer.MoE over the same experts, started from our weights.
    Its forward takes [batch, sequence, hidden] as our blocks give it, hands DeepSpeed the tokens in our
    [sequence, batch] order (so that position-based capacity keeps the same tokens on both sides), and appends
    the layer's l_aux to `l_aux` for the step to add to the loss."""
    import torch
    from deepspeed.moe.layer import MoE
    from torch import nn

    num_experts, ep = spec["num_experts"], spec["expert_parallel_size"]
    local = num_experts // ep
    mine = [str(ep_rank * local + i) for i in range(local)]
    if ours.experts.swiglu:
        raise RuntimeError("the benchmark's experts are GPT-2 MLPs (no SwiGLU)")

    class DeepSpeedMoEMLP(nn.Module):
        def __init__(self):
            super().__init__()
            self.moe = MoE(hidden_size=ours.router.weight.shape[1],
                           expert=deepspeed_expert(ours.experts._modules[mine[0]], ours.experts.activation),
                           num_experts=num_experts, ep_size=ep, k=spec["topk"],
                           capacity_factor=spec["capacity_factor"], eval_capacity_factor=spec["capacity_factor"],
                           min_capacity=spec["min_capacity"], drop_tokens=not spec["disable_moe_token_dropping"],
                           use_rts=True, top2_2nd_expert_sampling=spec["top2_2nd_expert_sampling"])
            with torch.no_grad():
                self.moe.deepspeed_moe.gate.wg.weight.copy_(ours.router.weight)
                for theirs, name in zip(self.moe.deepspeed_moe.experts.deepspeed_experts, mine):
                    for key, value in ours.experts._modules[name].state_dict().items():
                        theirs.state_dict()[key].copy_(value)

        def forward(self, hidden):
            output, loss, _ = self.moe(hidden.transpose(0, 1))
            l_aux.append(loss)
            return output.transpose(0, 1)

    return DeepSpeedMoEMLP()


class DeepSpeedMoESystem:
    """Our GPTModel materialized (the same values as ours: a function of the seed and each parameter's name), each
    MoE layer replaced by DeepSpeed-MoE's, trained by deepspeed.initialize's engine."""

    def __init__(self, spec: dict, config, state):
        import deepspeed
        import torch
        import torch.distributed as dist
        from deepspeed.moe.utils import is_moe_param, split_params_into_different_moe_groups_for_optimizer

        from bench_systems import adamw_groups, deepspeed_config
        from gpt.model import build_gpt_model
        from gpt.moe.layer import MoELayer

        self.spec = spec
        model = build_gpt_model(config.model, state, seed=spec["seed"])
        local = spec["num_experts"] // spec["expert_parallel_size"]
        # DeepSpeed's expert-parallel groups (deepspeed/utils/groups.py _create_expert_and_data_parallel): consecutive
        # ranks, so that this rank's EP rank is its rank modulo the EP size, as ours (parallel/mesh.py)
        self.expert_rank = dist.get_rank() % spec["expert_parallel_size"]
        self.l_aux: list = []
        for block in model.blocks:
            if isinstance(block.mlp, MoELayer):
                block.mlp = deepspeed_moe_mlp(block.mlp, spec, self.expert_rank, self.l_aux)
        params = list(model.parameters())
        self.parameters = sum(p.numel() for p in params)
        self.expert_parameters = sum(p.numel() for p in params if is_moe_param(p))
        # the split names each expert group after its dense group (Megatron-DeepSpeed's optimizer param groups)
        named = [dict(group, name=name) for group, name in zip(adamw_groups(model, spec["weight_decay"]),
                                                                ("decay", "no_decay"))]
        groups = split_params_into_different_moe_groups_for_optimizer(named)
        optimizer = torch.optim.AdamW(groups, lr=spec["lr"], betas=(spec["adam_beta1"], spec["adam_beta2"]),
                                      eps=spec["adam_eps"])
        ds_config = deepspeed_config(spec)
        self.engine, self.optimizer, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, config=ds_config,
                                                                 dist_init_required=False)
        if self.engine.zero_optimization_stage() != spec["stage"]:
            raise RuntimeError(f"DeepSpeed runs ZeRO stage {self.engine.zero_optimization_stage()}, asked for "
                               f"{spec['stage']}")
        layer = next(m for m in model.modules() if type(m).__name__ == "MOELayer")
        self.info = {"deepspeed": deepspeed.__version__, "optimizer": type(self.optimizer).__name__,
                     "ep_group_size": dist.get_world_size(group=layer.ep_group), "local_experts": local}

    def step(self, inputs, labels) -> tuple[float, float, float]:
        self.l_aux.clear()
        loss = self.engine(inputs, labels).mean()
        moe_loss = sum(self.l_aux) * self.spec["moe_loss_coeff"]  # Megatron-DeepSpeed's loss_func
        self.engine.backward(loss + moe_loss)
        self.engine.step()  # clips, steps and zeroes the gradients
        return loss.item(), float(moe_loss), float(self.engine.get_global_grad_norm())


SYSTEMS = {"ours": OurMoESystem, "deepspeed": DeepSpeedMoESystem}


def worker(spec_path: str) -> int:
    """One rank of one configuration; writes result_dir/rank{RANK}.json."""
    spec = json.loads(Path(spec_path).read_text())
    rank = int(os.environ["RANK"])
    out = Path(spec["result_dir"]) / f"rank{rank}.json"
    try:
        from bench_comm import CollectiveShim  # first, before anything keeps torch.distributed's functions

        shim = CollectiveShim().install()
        record = _run_rank(spec, rank, shim)
    except BaseException:  # noqa: BLE001 - the parent prints it
        import traceback

        out.write_text(json.dumps({"error": traceback.format_exc()}))
        return 1
    out.write_text(json.dumps(record))
    return 0


def _run_rank(spec: dict, rank: int, shim) -> dict:
    import resource

    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    from bench_systems import make_batches
    from parallel.state import initialize

    config = our_config(spec)
    ours = spec["system"] == "ours"
    state = initialize(device_name="cpu", expert_model_parallel_size=spec["expert_parallel_size"] if ours else 1)
    steps, warmup = spec["steps"], spec["warmup_steps"]
    batches = make_batches(spec, state.data_parallel_rank, warmup + steps)
    system = SYSTEMS[spec["system"]](spec, config, state)
    losses, moe_losses, grad_norms, times, cpu_times = [], [], [], [], []
    for step, (inputs, labels) in enumerate(batches):
        if step == warmup:
            dist.barrier()
            shim.reset()
        start, cpu_start = time.perf_counter(), time.process_time()
        loss, moe_loss, grad_norm = system.step(inputs, labels)
        if step >= warmup:
            times.append(time.perf_counter() - start)
            cpu_times.append(time.process_time() - cpu_start)
        losses.append(loss)
        moe_losses.append(moe_loss)
        grad_norms.append(grad_norm)
    shim_record = shim.snapshot()
    versions = {"torch": torch.__version__}
    try:
        from importlib.metadata import version

        versions["deepspeed"] = version("deepspeed")
    except Exception:  # noqa: BLE001 - not installed
        pass
    record = {"rank": rank, "step_times": times, "cpu_times": cpu_times, "losses": losses, "moe_losses": moe_losses, "grad_norms": grad_norms,
              "parameters": system.parameters, "expert_parameters": system.expert_parameters,
              "expert_rank": system.expert_rank, "ru_maxrss_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
              "vm_hwm_kb": _status_kb("VmHWM"), "shim": shim_record, "info": system.info, "versions": versions}
    dist.barrier()
    dist.destroy_process_group()
    return record


if __name__ == "__main__":
    sys.exit(run_tool("benchmark_moe.py", main))  # bad flags and inputs: one line, exit 2
