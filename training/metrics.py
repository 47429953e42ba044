"""What a run reports (model size, FLOPs, throughput, memory) and where the records go: a Megatron-style console line,
metrics.jsonl, and W&B and TensorBoard under Megatron-LM's names. Only the first rank writes."""

from __future__ import annotations

import json
import math
import os
import resource
import shutil
import sys
from pathlib import Path
from typing import Any, Callable, Optional

import torch

from gpt.model_config import ModelConfig
from gpt.moe.balancing import MOE_LOSS_NAMES
from gpt.shape import model_shape


def parameter_count(config: ModelConfig, padded_vocab_size: Optional[int] = None) -> int:
    """Exact number of parameters of `GPTModel` (a tied output layer once)."""
    vocab = padded_vocab_size if padded_vocab_size is not None else config.padded_vocab_size()
    return model_shape(config).parameter_count(vocab)


def active_parameter_count(config: ModelConfig, padded_vocab_size: Optional[int] = None) -> int:
    """The parameters one token's forward uses (k experts of each MoE layer)."""
    vocab = padded_vocab_size if padded_vocab_size is not None else config.padded_vocab_size()
    return model_shape(config).active_parameter_count(vocab)


def forward_flops_per_token(config: ModelConfig, padded_vocab_size: Optional[int] = None) -> tuple[int, int]:
    """(blocks', logits') matmul FLOPs of one token's forward."""
    vocab = padded_vocab_size if padded_vocab_size is not None else config.padded_vocab_size()
    shape = model_shape(config)
    return shape.blocks_forward_flops_per_token(), shape.logits_forward_flops_per_token(vocab)


def flops_per_iteration(config: ModelConfig, global_batch_size: int, activation_recompute: float = False,
                        padded_vocab_size: Optional[int] = None) -> float:
    """Matmul FLOPs of one iteration, Megatron's accounting (Narayanan et al., 2021); each recomputed block (the share
    `activation_recompute`) adds a forward."""
    blocks_forward, logits_forward = forward_flops_per_token(config, padded_vocab_size)
    tokens = global_batch_size * config.seq_length
    block_passes = 3 + float(activation_recompute)
    return float(block_passes * tokens * blocks_forward + 3 * tokens * logits_forward)


def peak_memory_bytes(device: torch.device) -> int:
    """Peak device memory on CUDA; peak RSS on CPU."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024  # Linux reports KiB, macOS bytes


def _proc_status_bytes(field: str) -> int:
    """A KiB field of /proc/self/status in bytes (0 where there is none)."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def current_rss_bytes() -> int:
    return _proc_status_bytes("VmRSS")


def mapped_file_bytes() -> int:
    """The resident pages of files this process maps (RssFile)."""
    return _proc_status_bytes("RssFile")


# below this a CPU run's memory line gives a difference, not a ratio
RATIO_FROM_BYTES = 64 * 2**20


class MemoryCheck:
    """After iteration 1, one line: the planner's predicted peak beside the measured one (CUDA's max_memory_allocated,
    or on a CPU the peak RSS growth since before the build, less file pages mapped since)."""

    def __init__(self, predicted_bytes: Optional[int], device: torch.device, note: str = "",
                 predicted_host_bytes: int = 0) -> None:
        self.device, self.note, self.predicted_host_bytes = device, note, predicted_host_bytes
        self.predicted_bytes = predicted_bytes
        if predicted_bytes is not None and device.type != "cuda":
            self.predicted_bytes = predicted_bytes + predicted_host_bytes
        self.baseline = 0 if device.type == "cuda" else peak_memory_bytes(device)
        self.file_baseline = 0 if device.type == "cuda" else mapped_file_bytes()

    def measured(self) -> tuple[int, str]:
        if self.device.type == "cuda":
            return torch.cuda.max_memory_allocated(self.device), "CUDA max_memory_allocated"
        # Mapped file pages are in the RSS but not the run's memory; their count depends on the page cache.
        files = max(0, mapped_file_bytes() - self.file_baseline)
        return (peak_memory_bytes(self.device) - self.baseline - files,
                f"peak RSS growth over the process baseline, less {files / 2**20:.1f} MiB of files mapped since")

    def figures(self) -> tuple[int, Optional[int]]:
        """(measured, predicted) bytes of this rank."""
        return self.measured()[0], self.predicted_bytes

    def line(self, iteration: int, ranks: Optional[list[tuple[int, Optional[int]]]] = None) -> str:
        """This rank's figures and, given every rank's `figures()`, their range over the ranks."""
        measured, how = self.measured()
        if self.predicted_bytes is None:
            return f" memory after iteration {iteration}: {measured / 2**20:.1f} MiB ({how}); no prediction ({self.note})"
        line = (f" memory after iteration {iteration}: predicted peak {self.predicted_bytes / 2**20:.1f} MiB "
                f"({self._predicted_split()}), measured {measured / 2**20:.1f} MiB ({how}), "
                f"{self._comparison([(measured, self.predicted_bytes)])}")
        predicted_ranks = [(m, p) for m, p in ranks or [] if p]
        if len(predicted_ranks) > 1:
            mib = [m / 2**20 for m, _ in ranks]
            line += (f"; over all {len(predicted_ranks)} ranks measured {min(mib):.1f}-{max(mib):.1f} MiB (most on "
                     f"rank {mib.index(max(mib))}), {self._comparison(predicted_ranks)}")
        if self.device.type == "cuda" and self.predicted_host_bytes:
            line += (f"; host memory predicted {self.predicted_host_bytes / 2**20:.1f} MiB (offload, not in either), "
                     f"this process's resident memory now {current_rss_bytes() / 2**20:.1f} MiB")
        if self.device.type != "cuda":
            line += f"; process baseline before the build {self.baseline / 2**20:.1f} MiB (not in either)"
        return line

    def _predicted_split(self) -> str:
        """Where the prediction lies (device and host, on a CPU with offload)."""
        if self.device.type == "cuda" or not self.predicted_host_bytes:
            return "zero.plan"
        device = self.predicted_bytes - self.predicted_host_bytes
        return (f"zero.plan: device {device / 2**20:.1f} MiB + host {self.predicted_host_bytes / 2**20:.1f} MiB, "
                f"one process's memory on a CPU")

    def _comparison(self, figures: list[tuple[int, int]]) -> str:
        """'measured/predicted 1.01-1.02', or on a CPU below RATIO_FROM_BYTES the excess in MiB."""
        if self.device.type == "cuda" or min(p for _, p in figures) >= RATIO_FROM_BYTES:
            ratios = [m / p for m, p in figures]
            return f"measured/predicted {_span(ratios, '.2f')}"
        excess = [(m - p) / 2**20 for m, p in figures]
        return (f"measured-predicted {_span(excess, '+.1f')} MiB (a CPU's first iteration adds a fixed few MiB "
                f"the planner does not predict: no ratio below a {RATIO_FROM_BYTES // 2**20} MiB prediction)")


def _span(values: list[float], spec: str) -> str:
    low, high = min(values), max(values)
    return format(low, spec) if len(values) == 1 else f"{format(low, spec)}-{format(high, spec)}"


def format_console_line(record: dict[str, Any], train_iters: int, eta_s: Optional[float] = None) -> str:
    """One Megatron-style line for a training record."""
    parts = [
        f"iteration {record['iteration']:>8d}/{train_iters:>8d}",
        f"consumed samples: {record['consumed_samples']:>10d}",
        f"elapsed time per iteration (ms): {record['iter_time_s'] * 1000:.1f}",
        f"learning rate: {record['lr']:.3E}",
        f"lm loss: {record['loss']:.6E}",
        *(f"{name}: {record[name]:.6E}" for name in MOE_LOSS_NAMES if name in record),
        *(f"{name}: {record[name]:.6E}" for name in record if name.startswith("mtp_")),
        f"grad norm: {record['grad_norm']:.3f}",
        f"tokens/s: {record['tokens_per_s']:.0f}",
        f"TFLOP/s/GPU: {record['tflops_per_gpu']:.2f}",
        f"mem (MB): {record['memory_bytes'] / 2**20:.0f}",
    ]
    if "mfu" in record:
        parts.insert(-1, f"MFU: {record['mfu'] * 100:.1f}%")
    if record.get("skipped_iterations"):
        parts.append(f"skipped: {record['skipped_iterations']}")
    if eta_s is not None:
        parts.append(f"ETA: {format_duration(eta_s)}")
    return " | ".join(parts) + " |"


def format_duration(seconds: float) -> str:
    """'42 s', '7 min 05 s', '3 h 12 min'."""
    seconds = max(0, round(seconds))
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60} min {seconds % 60:02d} s"
    return f"{seconds // 3600} h {seconds % 3600 // 60:02d} min"


def remaining_seconds(seconds_per_sample: float, consumed_samples: int, iterations_left: int,
                      consumed_after: Callable[[int, int], int]) -> float:
    """The time the iterations left need at this interval's pace per sample."""
    return seconds_per_sample * (consumed_after(iterations_left, consumed_samples) - consumed_samples)


def format_eval_line(record: dict[str, Any]) -> str:
    return (f"{record['split']} loss at iteration {record['iteration']}: lm loss {record['loss']:.6E} | "
            f"lm loss PPL {record['ppl']:.6E}")


def perplexity(loss: float) -> float:
    return math.exp(min(loss, 700.0))  # exp overflows a float past ~709


def drop_redone_records(metrics_file: str, iteration: int, run_id: str) -> int:
    """Drop the records a resumed run will write again (its lineage's after `iteration`, a cut-short last line); the
    rest is kept byte for byte. Returns how many were dropped."""
    target = Path(os.path.realpath(metrics_file))
    if not target.is_file():
        return 0
    lines = target.read_bytes().splitlines(keepends=True)
    ours = run_id.encode()
    kept = [line for line in lines if ours not in line or not _redone(line, iteration, run_id)]
    if len(kept) == len(lines):
        return 0
    temporary = target.with_name(f".{target.name}.tmp-{os.getpid()}")
    temporary.write_bytes(b"".join(line if line.endswith(b"\n") else line + b"\n" for line in kept))
    shutil.copymode(target, temporary)
    os.replace(temporary, target)
    return len(lines) - len(kept)


def end_last_line(metrics_file: str) -> None:
    """End a last record a kill cut short with its newline."""
    target = Path(os.path.realpath(metrics_file))
    if not target.is_file() or target.stat().st_size == 0:
        return
    with open(target, "rb+") as f:
        f.seek(-1, os.SEEK_END)
        if f.read(1) != b"\n":
            f.write(b"\n")


def _redone(line: bytes, iteration: int, run_id: str) -> bool:
    try:
        record = json.loads(line)
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError):
        # A line cut short: ours if it begins as our records do.
        return line.startswith(json.dumps({"run_id": run_id})[:-1].encode())
    if not isinstance(record, dict) or record.get("run_id") != run_id:
        return False
    value = record.get("iteration")
    return isinstance(value, int) and value > iteration


def count_records(metrics_file: str) -> int:
    path = Path(metrics_file)
    if not path.is_file():
        return 0
    with open(path, "rb") as f:
        return sum(1 for line in f if line.strip())


class MetricsWriter:
    """Fans one record out to the console, metrics.jsonl and (optionally) W&B and TensorBoard."""

    def __init__(self, metrics_file: str, enabled: bool, wandb_run: Any = None, tensorboard: Any = None,
                 identity: Optional[dict[str, str]] = None):
        self.enabled = enabled
        # first in every JSONL record: a resume drops only its own
        self.identity = identity or {}
        self.wandb_run = wandb_run
        self.tensorboard = tensorboard
        self._file = None
        if enabled:
            path = Path(metrics_file)
            path.parent.mkdir(parents=True, exist_ok=True)
            self._file = path.open("a", buffering=1)  # line-buffered: a crash loses at most one line

    def write(self, record: dict[str, Any], console_line: Optional[str] = None) -> None:
        if not self.enabled:
            return
        if console_line:
            print(console_line, flush=True)
        self._file.write(json.dumps({**self.identity, **record}) + "\n")
        if self.wandb_run is not None:
            _log_to_wandb(self.wandb_run, record)
        if self.tensorboard is not None and "iteration" in record:
            self.tensorboard.write(scalar_values(record), record["iteration"])
            if "consumed_samples" in record:
                self.tensorboard.write(samples_values(record), record["consumed_samples"])

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        if self.wandb_run is not None:
            try:
                self.wandb_run.finish()
            except Exception as error:  # W&B trouble must never fail a finished run
                print(f"warning: W&B finish failed: {error}", file=sys.stderr)
            self.wandb_run = None
        if self.tensorboard is not None:
            self.tensorboard.close()
            self.tensorboard = None


# Megatron-LM's names for what its training_log and evaluate_and_print_results log.
MEGATRON_TRAIN_NAMES = {"loss": "lm loss", "lr": "learning-rate", "grad_norm": "grad-norm", "loss_scale": "loss-scale",
                        "global_batch_size": "batch-size", "iter_time_s": "iteration-time",
                        "tflops_per_gpu": "throughput", "memory_bytes": "mem-max-allocated-bytes",
                        "consumed_samples": "samples vs steps"}
MEGATRON_EVAL_NAMES = {"valid": {"loss": "lm loss validation", "ppl": "lm loss validation ppl"},
                       "test": {"loss": "lm loss test", "ppl": "lm loss test ppl"}}
# Megatron-LM also writes these against the consumed samples, as `<name> vs samples`.
VS_SAMPLES = ("lm loss", "learning-rate", "grad-norm", "loss-scale", "batch-size", "lm loss validation",
              "lm loss validation ppl", "lm loss test", "lm loss test ppl")


def scalar_values(record: dict[str, Any]) -> dict[str, float]:
    """A record's numbers as W&B and TensorBoard get them, Megatron-LM's names first, the rest under `<split>/<key>`."""
    split = record.get("split", "train")
    names = MEGATRON_EVAL_NAMES.get(split, {}) if "split" in record else MEGATRON_TRAIN_NAMES
    values: dict[str, float] = {}

    def add(name: str, value: Any) -> None:
        if isinstance(value, dict):
            for key, inner in value.items():
                add(f"{name}/{key}", inner)
        elif isinstance(value, list) and value and all(isinstance(item, dict) for item in value):
            for index, item in enumerate(value):  # the straggler report's ranks
                add(f"{name}/{index}", item)
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            if value or not name.startswith(f"{split}/comm_bytes/"):
                values[name] = value

    for key, value in record.items():
        if key in ("iteration", "split") or (key == "consumed_samples" and "split" in record):
            continue
        add(names.get(key, f"{split}/{key}"), value)
    return values


def samples_values(record: dict[str, Any]) -> dict[str, float]:
    """The `<name> vs samples` scalars, to be written at the record's consumed samples."""
    return {f"{name} vs samples": value for name, value in scalar_values(record).items() if name in VS_SAMPLES}


def _log_to_wandb(run: Any, record: dict[str, Any]) -> None:
    values = scalar_values(record)
    try:
        run.log(values, step=record["iteration"])
    except Exception as error:
        print(f"warning: W&B log failed, continuing without it: {error}", file=sys.stderr)


def wandb_mode() -> str:
    """Online only when the user configured W&B."""
    if os.environ.get("WANDB_MODE"):
        return os.environ["WANDB_MODE"]
    if os.environ.get("WANDB_API_KEY"):
        return "online"
    netrc = Path(os.environ.get("NETRC", Path.home() / ".netrc"))
    try:
        if "api.wandb.ai" in netrc.read_text():
            return "online"
    except OSError:
        pass
    return "offline"


def start_wandb(project: Optional[str], run_name: Optional[str], entity: Optional[str],
                config: dict, directory: str) -> Any:
    """A W&B run, or None when W&B cannot start (training goes on)."""
    if not project:
        return None
    try:
        import wandb

        return wandb.init(project=project, name=run_name, entity=entity, config=config, dir=directory,
                          mode=wandb_mode())
    except Exception as error:
        print(f"warning: W&B did not start ({error}); training continues without it", file=sys.stderr)
        return None


# Dense 16-bit peaks in TFLOP/s (datasheets), matched against the device name in order.
PEAK_TFLOPS_16BIT = (
    ("H100 PCIe", 756.0), ("H100 NVL", 835.0), ("H100", 989.0), ("H200", 989.0), ("H800", 989.0),
    ("GH200", 989.0), ("A100", 312.0), ("A800", 312.0), ("A10G", 125.0), ("L40S", 362.0),
    ("V100S", 130.0), ("V100-PCIE", 112.0), ("V100", 125.0),
)


def run_peak_tflops(device: torch.device, override: Optional[float]) -> Optional[float]:
    """The peak MFU is measured against: --peak-tflops, else the device's; None on a CPU."""
    if override is not None:
        return override
    if device.type == "cuda":
        return device_peak_tflops(torch.cuda.get_device_name(device))
    return None


def model_flops_utilization(model_flops: float, iteration_seconds: float, world_size: int,
                            peak_tflops: float) -> float:
    """MFU: model FLOPs (no recompute) per second per GPU over the dense peak."""
    return model_flops / (iteration_seconds * world_size * 1e12) / peak_tflops


def device_peak_tflops(device_name: str) -> Optional[float]:
    """The dense 16-bit peak of a CUDA device name, or None."""
    for fragment, peak in PEAK_TFLOPS_16BIT:
        if fragment.lower() in device_name.lower():
            return peak
    return None
