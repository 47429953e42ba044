#!/usr/bin/env python
"""Benchmark our ZeRO stages 0-3 against DeepSpeed ZeRO 1-3, PyTorch FSDP2 and DDP on one machine.

    DS_ACCELERATOR=cpu python scripts/bench/benchmark_zero.py     # everything, 2 ranks

Each configuration trains the same small GPT in fresh processes: step time, peak RSS and bytes sent per rank
(bench_comm.py), and our ratios to each peer. This process imports no torch, so the ranks inherit no memory
high-water mark. Needs requirements-bench.txt."""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional

SCRIPT = Path(__file__).resolve()
REPO_ROOT = SCRIPT.parents[2]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from base.errors import OneLineArgumentParser, run_tool  # noqa: E402  (imports nothing but the standard library)

SYSTEM_ORDER = ("ours", "deepspeed", "fsdp2", "ddp")
LABELS = {"ours": "ours", "deepspeed": "DeepSpeed", "fsdp2": "FSDP2", "ddp": "DDP"}
RELEASE = "release"
OVERLAP = "overlap"  # ours at stages 1-2 with --overlap-param-gather
STEP_PHASES = ("forward", "backward", "step")
# Where each rank reads its RSS high-water mark: after model+optimizer setup, then at the end of each
# phase of the first step, where memory promises break first (buffers and states created lazily).
FIRST_STEP_POINTS = ("build",) + STEP_PHASES


# ----------------------------------------------------------------------------- orchestration

def world_sizes(text: str) -> list[int]:
    """--world-sizes: a comma list of distinct positive ints, in the order given (a size twice would run
    its configurations twice into the same files)."""
    try:
        sizes = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        sizes = []
    if not sizes or min(sizes) < 1 or len(set(sizes)) != len(sizes):
        raise argparse.ArgumentTypeError(f"expected a comma list of distinct positive integers such as 2,4, "
                                         f"got {text!r}")
    return sizes


def parse_args(argv=None) -> argparse.Namespace:
    p = OneLineArgumentParser(prog="benchmark_zero.py", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--world-size", type=int, default=2)
    p.add_argument("--world-sizes", type=world_sizes,
                   help="comma list such as 2,4: run the whole plan at each world size in turn and print each "
                        "one's tables under a line '## world size N' (default: --world-size alone, no heading)")
    p.add_argument("--systems", default=",".join(SYSTEM_ORDER), help="comma list of " + ", ".join(SYSTEM_ORDER))
    p.add_argument("--stages", default="0,1,2,3", help="ZeRO stages for ours (0-3) and DeepSpeed (1-3)")
    p.add_argument("--num-layers", type=int, default=4)
    p.add_argument("--hidden-size", type=int, default=256)
    p.add_argument("--num-attention-heads", type=int, default=4)
    p.add_argument("--seq-length", type=int, default=128)
    p.add_argument("--vocab-size", type=int, default=4096, help="padded to a multiple of 128")
    p.add_argument("--micro-batch-size", type=int, default=8, help="per rank; one micro-batch per step")
    p.add_argument("--warmup-steps", type=int, default=3)
    p.add_argument("--steps", type=int, default=10, help="timed steps")
    p.add_argument("--rounds", type=int, default=1,
                   help="run the whole plan this many times, interleaved, and keep each configuration's "
                        "round with the lowest median step time (on a shared machine, load from other "
                        "work only ever slows a round down)")
    p.add_argument("--bf16", action="store_true", help="bf16 parameters (autocast for the peers; default fp32)")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--adam-beta1", type=float, default=0.9)
    p.add_argument("--adam-beta2", type=float, default=0.95)
    p.add_argument("--adam-eps", type=float, default=1e-8)
    p.add_argument("--clip-grad", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--reduce-bucket-size", type=int, default=1_000_000,
                   help="elements (ours and DeepSpeed; DDP's bucket_cap_mb)")
    p.add_argument("--allgather-bucket-size", type=int, default=1_000_000, help="elements (ours and DeepSpeed)")
    p.add_argument("--prefetch-bucket-size", type=int, default=1_000_000, help="stage 3 prefetch, elements")
    p.add_argument("--param-persistence-threshold", type=int, default=0,
                   help="stage 3: parameters this small stay whole (ours and DeepSpeed)")
    p.add_argument("--max-live-parameters", type=int, default=1_000_000_000, help="stage 3 (ours and DeepSpeed)")
    p.add_argument("--ds-release-variant", action=argparse.BooleanOptionalAction, default=True,
                   help="also run DeepSpeed stage 3 with stage3_prefetch_bucket_size 0 and "
                        "stage3_max_reuse_distance 0, which release parameters after use (see configurations())")
    p.add_argument("--overlap-variant", action=argparse.BooleanOptionalAction, default=True,
                   help="also run our stages 1-2 with --overlap-param-gather")
    p.add_argument("--no-audit", action="store_true", help="skip the dispatcher audit step")
    p.add_argument("--timeout", type=float, default=900, help="seconds per configuration")
    p.add_argument("--output", help="also write the Markdown report here")
    p.add_argument("--json", help="also write every measurement here: {args, results}, or with --world-sizes "
                                  "{args, results_by_world_size: {N: results}}")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    return p.parse_args(argv)


def configurations(args) -> list[tuple[str, int, str]]:
    """(system, stage, variant) triples, each of ours next to what it is compared with.

    DeepSpeed's stage 3 runs twice. With the shared settings, DeepSpeed 0.19 keeps every parameter
    gathered from forward to backward on this model, so backward gathers nothing (2 Psi of traffic,
    parameters whole between the passes): its coordinator does not release a parameter that the
    prefetcher marked for a later use (any stage3_prefetch_bucket_size > 0), nor one used again
    within stage3_max_reuse_distance elements (default 1e9). The variant sets both to 0: parameters
    are released after each use and gathered again for backward (3 Psi), as the ZeRO paper, FSDP2
    and our stage 3 do."""
    systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    unknown = sorted(set(systems) - set(SYSTEM_ORDER))
    if unknown:
        sys.exit(f"benchmark_zero.py: error: --systems: unknown {', '.join(unknown)}; "
                 f"choose from {', '.join(SYSTEM_ORDER)}")
    stages = sorted({int(s) for s in args.stages.split(",") if s.strip()})
    if any(s not in (0, 1, 2, 3) for s in stages):
        sys.exit("benchmark_zero.py: error: --stages takes numbers from 0 to 3")
    plan = []
    for stage in stages:
        if stage == 0 and "ddp" in systems:
            plan.append(("ddp", 0, ""))
        if stage >= 1 and "deepspeed" in systems:
            plan.append(("deepspeed", stage, ""))
            if stage == 3 and args.ds_release_variant:
                plan.append(("deepspeed", 3, RELEASE))
        if stage == 3 and "fsdp2" in systems:
            plan.append(("fsdp2", 3, ""))
        if "ours" in systems:
            plan.append(("ours", stage, ""))
            if stage in (1, 2) and args.overlap_variant:
                plan.append(("ours", stage, OVERLAP))
    for system, stage in (("ddp", 0), ("fsdp2", 3)):  # the peers without stages run whatever --stages says
        if system in systems and (system, stage, "") not in plan:
            plan.append((system, stage, ""))
    return plan


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def progress(message: str) -> None:
    print(f"[benchmark {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def run_configuration(args, system: str, stage: int, variant: str, workdir: Path) -> dict:
    """Start one process per rank, wait (with the timeout), and collect what each rank wrote."""
    name = f"{system}-{stage}{'-' + variant if variant else ''}"
    spec = {key: getattr(args, key) for key in (
        "world_size", "num_layers", "hidden_size", "num_attention_heads", "seq_length", "vocab_size",
        "micro_batch_size", "warmup_steps", "steps", "bf16", "lr", "weight_decay", "adam_beta1", "adam_beta2",
        "adam_eps", "clip_grad", "seed", "reduce_bucket_size", "allgather_bucket_size", "prefetch_bucket_size",
        "param_persistence_threshold", "max_live_parameters")}
    spec.update(system=system, stage=stage, audit=not args.no_audit, result_dir=str(workdir / name))
    if variant == RELEASE:
        spec.update(prefetch_bucket_size=0, ds_max_reuse_distance=0)
    if variant == OVERLAP:
        spec.update(overlap_param_gather=True)
    Path(spec["result_dir"]).mkdir(parents=True, exist_ok=True)
    spec_path = workdir / f"{name}.json"
    spec_path.write_text(json.dumps(spec))
    failure, ranks, timing = run_ranks(SCRIPT, spec_path, Path(spec["result_dir"]), args.world_size, workdir / name,
                                       args.timeout)
    result = {"system": system, "stage": stage, "variant": variant, **timing, "ranks": ranks}
    if failure:
        result["error"] = failure
    return summarize(result, args)


def run_ranks(script: Path, spec_path: Path, result_dir: Path, world_size: int, log_prefix: Path,
              timeout: float) -> tuple[Optional[str], list, dict]:
    """One fresh interpreter per rank running `script --worker spec_path`; wait (with the timeout; when one rank
    dies the others are stopped, as they would wait in a collective until gloo's timeout) and read what each rank
    wrote to result_dir/rank<r>.json: (why it failed, with the first error or rank 0's log tail, or None; the
    ranks' records, None for a rank that wrote none; {"wall_s", "loadavg_1min": [before, after]})."""
    port = free_port()
    processes, logs = [], []
    for rank in range(world_size):
        env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                   WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world_size),
                   OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", DS_ACCELERATOR="cpu", WANDB_MODE="disabled",
                   PYTHONPATH=os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])))
        log = open(f"{log_prefix}.rank{rank}.log", "w")
        logs.append(log)
        processes.append(subprocess.Popen([sys.executable, str(script), "--worker", str(spec_path)], env=env,
                                          cwd=str(REPO_ROOT), stdout=log, stderr=subprocess.STDOUT))
    start = time.monotonic()
    load_before = os.getloadavg()[0]
    failure = None
    try:
        while any(p.poll() is None for p in processes):
            if time.monotonic() - start > timeout:
                failure = f"timed out after {timeout:.0f} s"
                break
            if any(p.returncode not in (None, 0) for p in processes):
                time.sleep(2.0)  # one rank died: the others would wait in a collective until the gloo timeout
                if any(p.poll() is None for p in processes):
                    failure = "a rank failed; stopped the others"
                break
            time.sleep(0.2)
    finally:
        for p in processes:  # only the processes started above, by their Popen handles
            if p.poll() is None:
                p.terminate()
        for p in processes:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        for log in logs:
            log.close()
    timing = {"wall_s": time.monotonic() - start, "loadavg_1min": [load_before, os.getloadavg()[0]]}
    ranks = []
    for rank in range(world_size):
        path = result_dir / f"rank{rank}.json"
        ranks.append(json.loads(path.read_text()) if path.exists() else None)
    errors = [r["error"] for r in ranks if r and "error" in r]
    if failure is None and (errors or any(r is None for r in ranks)):
        failure = "a rank failed" if errors else "a rank exited without a result"
    if failure:
        failure = f"{failure}\n{errors[0] if errors else _log_tail(Path(f'{log_prefix}.rank0.log'))}"
    return failure, ranks, timing


def _log_tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def summarize(result: dict, args) -> dict:
    """Per-configuration numbers from the per-rank records."""
    ranks = [r for r in result["ranks"] if r and "error" not in r]
    if "error" in result or len(ranks) != args.world_size:
        return result
    steps = len(ranks[0]["step_times"])
    slowest = [max(r["step_times"][i] for r in ranks) for i in range(steps)]
    losses = [statistics.fmean(r["losses"][i] for r in ranks) for i in range(len(ranks[0]["losses"]))]
    mb = 1e6
    # Forward / backward / optimizer step of the slowest rank's median step.
    phases = {}
    for i, phase in enumerate(STEP_PHASES):
        phases[phase] = 1000 * statistics.median(max(r["phases"][k][i] for r in ranks) for k in range(steps))
    shim_mb = max(r["shim"]["total"] for r in ranks) / steps / mb
    audit_mb = (max(r["audit"]["total"] for r in ranks) / mb) if all(r.get("audit") for r in ranks) else None
    # DDP's reducer calls the process group from C++, past the Python shim; the dispatcher audit sees
    # those collectives, so where it finds more than the shim its figure is the one reported.
    bypassed = audit_mb is not None and audit_mb > shim_mb * 1.001 + 1e-4
    result.update(
        step_ms=1000 * statistics.median(slowest),
        step_ms_min=1000 * min(slowest),
        step_ms_max=1000 * max(slowest),
        rss_mb=max(r["ru_maxrss_kb"] for r in ranks) / 1024,
        hwm_mb=max(r["vm_hwm_kb"] for r in ranks) / 1024,
        rss_start_mb=max(r["rss_after_init_kb"] for r in ranks) / 1024,
        rss_model_mb=max(r["rss_after_setup_kb"] for r in ranks) / 1024,
        sent_mb=audit_mb if bypassed else shim_mb,
        sent_source="audit" if bypassed else "shim",
        shim_mb=shim_mb,
        audit_mb=audit_mb,
        phases_ms=phases,
        first_step_growth_mb=first_step_growth_mb(ranks),
        ours_mb=(max(r["our_comm_total"] for r in ranks) / steps / mb
                 if ranks[0].get("our_comm_total") is not None else None),
        losses=losses,  # mean over ranks = the global batch's loss; warmup steps first
        parameters=ranks[0]["parameters"],
        versions=ranks[0]["versions"],
        info=ranks[0].get("info", {}),
        calls={k: v / steps for k, v in ranks[0]["shim"]["calls"].items()},
        audit_calls=ranks[0]["audit"]["calls"] if ranks[0].get("audit") else None,
        audit_unknown=ranks[0]["audit"]["unknown_ops"] if ranks[0].get("audit") else None,
    )
    return result


def first_step_growth_mb(ranks: list[dict]) -> dict[str, float]:
    """Per point of FIRST_STEP_POINTS, the RSS high-water mark there minus the RSS after process-group
    init, max over ranks, in MiB (kB / 1024, as the other RSS figures)."""
    return {point: max(r["first_step_hwm_kb"][point] - r["rss_after_init_kb"] for r in ranks) / 1024
            for point in FIRST_STEP_POINTS}


# ----------------------------------------------------------------------------- report

def _fmt(value, spec=".1f") -> str:
    return "-" if value is None else format(value, spec)


def _ratio(a, b) -> str:
    if a is None or b is None or b == 0:
        return "-"
    return f"{a / b:.2f}"


def label(r: dict) -> str:
    text = f"{LABELS[r['system']]} {r['stage']}" if r["system"] in ("ours", "deepspeed") else LABELS[r["system"]]
    return text + {RELEASE: " (release)", OVERLAP: " (overlap)"}.get(r.get("variant"), "")


def stage_column(r: dict) -> str:
    stage = {"ddp": "0 (DDP)", "fsdp2": "3 (FSDP2)"}.get(r["system"], str(r["stage"]))
    return stage + {RELEASE: ", release after use: prefetch 0, max reuse distance 0",
                    OVERLAP: ", parameter all-gather overlapped with the next forward"}.get(r.get("variant"), "")


def report(args, results: list[dict]) -> str:
    ok = [r for r in results if "error" not in r]
    first = ok[0] if ok else {}
    versions = first.get("versions", {})
    cpu = _cpu_model()
    lines = [
        f"Machine: {cpu}, {os.cpu_count()} cores, {platform.system()} {platform.release()}, "
        f"Python {platform.python_version()}; torch {versions.get('torch', '?')}, "
        f"DeepSpeed {versions.get('deepspeed', 'not installed')}; world size {args.world_size} (gloo, "
        f"1 thread per rank); model {args.num_layers} layers, hidden {args.hidden_size}, "
        f"{args.num_attention_heads} heads, seq {args.seq_length}, vocab {args.vocab_size}, "
        f"{first.get('parameters', 0) / 1e6:.2f}M parameters; micro batch {args.micro_batch_size}/rank; "
        f"{'bf16' if args.bf16 else 'fp32'}; {args.warmup_steps} warmup + {args.steps} timed steps; "
        f"step time: best of {args.rounds} interleaved round(s)' medians; "
        f"buckets: reduce {args.reduce_bucket_size:,}, all-gather {args.allgather_bucket_size:,}, "
        f"prefetch {args.prefetch_bucket_size:,} elements, persistence threshold "
        f"{args.param_persistence_threshold:,}.",
        "",
        "| system | stage | step time (ms) | peak RSS/rank (MB) | sent/rank/step (MB) | loss after timed steps |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for r in results:
        if "error" in r:
            lines.append(f"| {LABELS[r['system']]} | {stage_column(r)} | failed | | | |")
            continue
        mark = " †" if r["sent_source"] == "audit" else ""
        lines.append(f"| {LABELS[r['system']]} | {stage_column(r)} | {r['step_ms']:.1f} | {r['rss_mb']:.0f} | "
                     f"{r['sent_mb']:.2f}{mark} | {r['losses'][-1]:.4f} |")
    if any(r.get("sent_source") == "audit" for r in ok):
        lines += ["", "† counted by the dispatcher audit of one extra step: this system issues its "
                  "collectives from C++ (DDP's reducer), past the Python shim."]

    by_key = {(r["system"], r["stage"], r.get("variant", "")): r for r in ok}
    pairs = [(("ours", 0, ""), ("ddp", 0, ""))] + [(("ours", k, ""), ("deepspeed", k, "")) for k in (1, 2, 3)] + [
        (("ours", k, OVERLAP), ("deepspeed", k, "")) for k in (1, 2)] + [
        (("ours", k, OVERLAP), ("ours", k, "")) for k in (1, 2)] + [
        (("ours", 3, ""), ("deepspeed", 3, RELEASE)), (("ours", 3, ""), ("fsdp2", 3, ""))]
    lines += ["", "Ratios ours/theirs (below 1: ours is faster, smaller, or sends less):", "",
              "| comparison | step time | peak RSS | bytes sent |", "|---|---:|---:|---:|"]
    for a, b in pairs:
        if a in by_key and b in by_key:
            x, y = by_key[a], by_key[b]
            lines.append(f"| {label(x)} / {label(y)} | {_ratio(x['step_ms'], y['step_ms'])} | "
                         f"{_ratio(x['rss_mb'], y['rss_mb'])} | {_ratio(x['sent_mb'], y['sent_mb'])} |")
    lines += first_step_growth_table(ok)

    lines += ["", "Detail: step time min-max and its median split (forward / backward / optimizer step, "
              "slowest rank), RSS after process-group init, after model+optimizer setup and at peak, and "
              "bytes per step three ways (shim over torch.distributed; dispatcher audit of one extra step; "
              "our own comm.stats), 1-minute load average before/after:", "",
              "| system | step min-max (ms) | fwd / bwd / step (ms) | RSS init / setup / peak (MB) | shim MB "
              "| audit MB | comm.stats MB | collectives per step (shim) | load |",
              "|---|---:|---:|---:|---:|---:|---:|---|---:|"]
    for r in ok:
        calls = ", ".join(f"{k} {v:g}" for k, v in sorted(r["calls"].items()))
        ph = r["phases_ms"]
        lines.append(f"| {label(r)} | {r['step_ms_min']:.0f}-{r['step_ms_max']:.0f} | "
                     f"{ph['forward']:.0f} / {ph['backward']:.0f} / {ph['step']:.0f} | "
                     f"{r['rss_start_mb']:.0f} / {r['rss_model_mb']:.0f} / {r['rss_mb']:.0f} | {r['shim_mb']:.3f} | "
                     f"{_fmt(r['audit_mb'], '.3f')} | {_fmt(r['ours_mb'], '.3f')} | {calls} | "
                     f"{r['loadavg_1min'][0]:.1f}/{r['loadavg_1min'][1]:.1f} |")

    lines += ["", f"Loss per step (mean over ranks; {args.warmup_steps} warmup steps, then the timed ones):", ""]
    reference = by_key.get(("ddp", 0, ""))
    for r in ok:
        diff = ""
        if reference is not None and r is not reference:
            d = max(abs(a - b) for a, b in zip(r["losses"], reference["losses"]))
            diff = f"  (max |diff| vs DDP {d:.2e})"
        lines.append(f"- {label(r)}: " + " ".join(f"{x:.4f}" for x in r["losses"]) + diff)
    unknown = sorted({op for r in ok for op in (r.get("audit_unknown") or [])})
    if unknown:
        lines += ["", "Collective ops the audit saw but could not size: " + ", ".join(unknown)]
    failed = [r for r in results if "error" in r]
    if failed:
        lines += ["", "Failures:"]
        for r in failed:
            lines.append(f"- {label(r)}: " + r["error"].strip().splitlines()[0])
    return "\n".join(lines) + "\n"


def first_step_growth_table(ok: list[dict]) -> list[str]:
    lines = ["", "Peak RSS growth per phase of the first step (MB over the RSS after process-group init, "
             "max over ranks; MB = 2^20 bytes, as in the RSS columns above). Each figure is the high-water "
             "mark at the end of: model+optimizer setup (build), then the first step's forward, "
             "backward and optimizer step (a warmup step unless --warmup-steps 0); a running maximum, so it "
             "never falls from left to right:", "",
             "| system | stage | " + " | ".join(FIRST_STEP_POINTS) + " |",
             "|---|---|" + "---:|" * len(FIRST_STEP_POINTS)]
    for r in ok:
        growth = r["first_step_growth_mb"]
        lines.append(f"| {LABELS[r['system']]} | {stage_column(r)} | "
                     + " | ".join(f"{growth[point]:.0f}" for point in FIRST_STEP_POINTS) + " |")
    return lines


def _cpu_model() -> str:
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def best_round(results: list[dict]) -> dict:
    """The round with the lowest median step time (a failed round counts only if all failed)."""
    ok = [r for r in results if "error" not in r]
    if not ok:
        return results[-1]
    best = dict(min(ok, key=lambda r: r["step_ms"]))
    best["round_step_ms"] = [r["step_ms"] for r in ok]
    return best


def run_plan(args, plan: list[tuple[str, int, str]], workdir: Path) -> list[dict]:
    """Every configuration of the plan at args.world_size, --rounds times interleaved; the best round of each."""
    rounds: dict[int, list[dict]] = {i: [] for i in range(len(plan))}
    for round_index in range(args.rounds):
        for i, (system, stage, variant) in enumerate(plan):
            name = f"{LABELS[system]} stage {stage}" + (f" ({variant})" if variant else "")
            where = f"round {round_index + 1}/{args.rounds}, {i + 1}/{len(plan)}"
            progress(f"({where}) {name}: starting {args.world_size} ranks")
            result = run_configuration(args, system, stage, variant, workdir)
            if "error" in result:
                progress(f"({where}) {name}: FAILED after {result['wall_s']:.0f} s: {result['error']}")
            else:
                progress(f"({where}) {name}: {result['step_ms']:.1f} ms/step, {result['rss_mb']:.0f} MB "
                         f"peak RSS, {result['sent_mb']:.2f} MB sent/step, loss {result['losses'][-1]:.4f} "
                         f"({result['wall_s']:.0f} s)")
            rounds[i].append(result)
    return [best_round(rounds[i]) for i in range(len(plan))]


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.worker:
        return worker(args.worker)
    plan = configurations(args)
    by_size: dict[int, list[dict]] = {}
    texts = []
    with tempfile.TemporaryDirectory(prefix="benchmark_zero.") as tmp:
        for size in args.world_sizes or [args.world_size]:
            sized = argparse.Namespace(**{**vars(args), "world_size": size})
            workdir = Path(tmp) / f"world{size}"  # a configuration's files are named without the size
            workdir.mkdir(exist_ok=True)
            by_size[size] = run_plan(sized, plan, workdir)
            text = report(sized, by_size[size])
            if args.world_sizes:  # without the option, the output stays what it always was
                text = ("\n" if texts else "") + f"## world size {size}\n\n" + text
            print(text, end="", flush=True)  # each size's tables as soon as they are measured
            texts.append(text)
    if args.output:
        Path(args.output).write_text("".join(texts))
    if args.json:
        measured = ({"results_by_world_size": {str(size): results for size, results in by_size.items()}}
                    if args.world_sizes else {"results": by_size[args.world_size]})
        Path(args.json).write_text(json.dumps({"args": vars(args), **measured}, indent=1))
    return 0 if all("error" not in r for results in by_size.values() for r in results) else 1


# ----------------------------------------------------------------------------- one rank

def _status_kb(field: str) -> int:
    for line in open("/proc/self/status"):
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


class PeakRecorder:
    """The process's RSS high-water mark (VmHWM, kB) read at named points, in the order they were read.

    VmHWM is a running maximum, so each reading is the peak so far: it includes what a phase held only
    briefly (a gathered bucket, a temporary copy), which the RSS read at the phase's end would miss.
    Only nearly: the kernel's RSS counters are synced lazily, so after memory is freed a later read can
    be a few hundred kB lower (seen on Linux 6.18); the peak so far is the max of the reads."""

    def __init__(self):
        self.kb: dict[str, int] = {}

    def read(self, point: str) -> int:
        self.kb[point] = max([_status_kb("VmHWM"), *self.kb.values()])
        return self.kb[point]


class PhaseMarks(list):
    """The `marks` list a system's step appends its phase-end times to (bench_systems.mark) that also
    reads the high-water mark at the end of forward and of backward; the caller reads "step"."""

    def __init__(self, start: float, recorder: PeakRecorder):
        super().__init__([start])
        self.recorder = recorder

    def on_phase_end(self) -> None:
        self.recorder.read(STEP_PHASES[len(self) - 2])  # the start, then one time per ended phase


def worker(spec_path: str) -> int:
    """One rank of one configuration; writes result_dir/rank{RANK}.json."""
    spec = json.loads(Path(spec_path).read_text())
    rank = int(os.environ["RANK"])
    out = Path(spec["result_dir"]) / f"rank{rank}.json"
    sys.path.insert(0, str(SCRIPT.parent))
    try:
        # First, before anything keeps references to torch.distributed's functions.
        from bench_comm import CollectiveShim, DispatchAudit

        shim = CollectiveShim().install()
        record = _run_rank(spec, rank, shim, DispatchAudit)
    except BaseException:  # noqa: BLE001 - the parent prints it
        import traceback

        out.write_text(json.dumps({"error": traceback.format_exc()}))
        return 1
    out.write_text(json.dumps(record))
    return 0


def _run_rank(spec: dict, rank: int, shim, audit_cls) -> dict:
    import resource

    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    from bench_systems import SYSTEMS, build_model, make_batches
    from parallel.state import initialize

    state = initialize(device_name="cpu")
    rss_after_init = _status_kb("VmRSS")
    peaks = PeakRecorder()
    peaks.read("init")  # above rss_after_init where starting up held more memory than it kept
    steps, warmup = spec["steps"], spec["warmup_steps"]
    batches = make_batches(spec, state.data_parallel_rank, warmup + steps + 1)
    model = build_model(spec, state)
    parameters = sum(p.numel() for p in model.parameters())
    system = SYSTEMS[spec["system"]](model, spec, state)
    rss_after_setup = _status_kb("VmRSS")
    peaks.read("build")

    losses, times, phases = [], [], []
    for step, (inputs, labels) in enumerate(batches[: warmup + steps]):
        if step == warmup:
            dist.barrier()
            shim.reset()
            state.comm.stats.snapshot_and_reset()
        # Only the first step reads the high-water mark (a warmup step unless --warmup-steps 0).
        marks = PhaseMarks(time.perf_counter(), peaks) if step == 0 else [time.perf_counter()]
        loss = system.step(inputs, labels, marks).item()
        marks.append(time.perf_counter())
        if step == 0:
            peaks.read("step")
        losses.append(loss)
        if step >= warmup:
            times.append(marks[-1] - marks[0])
            phases.append([b - a for a, b in zip(marks, marks[1:])])
    shim_record = shim.snapshot()
    our_comm = state.comm.stats.snapshot() if spec["system"] == "ours" else None

    audit_record = None
    if spec["audit"]:
        audit = audit_cls(state.world_size, rank)
        inputs, labels = batches[-1]
        with audit:
            system.step(inputs, labels).item()
        audit_record = audit.snapshot()

    usage = resource.getrusage(resource.RUSAGE_SELF)
    versions = {"torch": torch.__version__}
    try:
        from importlib.metadata import version

        versions["deepspeed"] = version("deepspeed")
    except Exception:  # noqa: BLE001 - not installed
        pass
    record = {
        "rank": rank, "step_times": times, "phases": phases, "losses": losses, "parameters": parameters,
        "ru_maxrss_kb": usage.ru_maxrss, "vm_hwm_kb": _status_kb("VmHWM"),
        "rss_after_init_kb": rss_after_init, "rss_after_setup_kb": rss_after_setup,
        "first_step_hwm_kb": peaks.kb,
        "shim": shim_record, "audit": audit_record,
        "our_comm": our_comm, "our_comm_total": (sum(n for kinds in our_comm.values() for n in kinds.values())
                                                  if our_comm is not None else None),
        "info": getattr(system, "info", {}), "versions": versions, "threads": torch.get_num_threads(),
    }
    dist.barrier()
    dist.destroy_process_group()
    return record


if __name__ == "__main__":
    sys.exit(run_tool("benchmark_zero.py", main))  # bad flags and inputs: one line, exit 2
