"""The logging section of the run's settings: the metrics file, W&B, TensorBoard, memory and straggler reports,
with its refusal checks."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from base.errors import ConfigError
from base.options import option

# Matsuo Lab's GENIAC teams ran it (ucllm_nedo_dev's README checks out its tags)
GENIAC_FORK = "GENIAC's Megatron-DeepSpeed fork"


@dataclass(frozen=True)
class LoggingConfig:
    # None: runs/RUN_ID/metrics.jsonl, known once the run's lineage is (checkpoint/run_start.py)
    metrics_file: Optional[str] = option(None, metavar="FILE", help="JSON lines, one record per log/eval (default "
                                         "runs/RUN_ID/metrics.jsonl: a file per run, which its resumes append to)")
    # GENIAC's fork (hotsuyuki/Megatron-DeepSpeed, megatron/arguments.py) spells its W&B flags with underscores
    # too; its --use-wandb, --wandb-group and --wandb-tag are in arguments/megatron/flags.py.
    wandb_project: Optional[str] = option(None, help="log to W&B (offline unless W&B is configured on this "
                                                     "machine)", aliases={"--wandb_project": GENIAC_FORK})
    # llm-jp's Megatron-LM fork (nii-geniac: megatron/training/global_vars.py, _set_wandb_writer) names the run
    # --wandb-name plus its start time; W&B tells runs apart by id, so the name is taken as given.
    wandb_run_name: Optional[str] = option(None, aliases={"--wandb-exp-name": "Megatron-LM",
                                                          "--wandb-name": "llm-jp's Megatron-LM fork"})
    wandb_entity: Optional[str] = option(None, aliases={"--wandb_entity": GENIAC_FORK})
    # Megatron-LM's --wandb-save-dir (global_vars.py _set_wandb_writer: wandb.init's dir, there --save/wandb when
    # left out); here W&B's files go beside the metrics file when it is left out
    wandb_save_dir: Optional[str] = option(None, metavar="DIR", help="W&B's local files (wandb.init's dir; default: "
                                                                     "beside the metrics file)")
    report_memory: bool = option(False, help="log per-rank model-state bytes held and the zero/memory.py "
                                             "prediction")
    # None: looked up by the CUDA device's name (omitted on CPU).
    peak_tflops: Optional[float] = option(
        None, help="the device's dense 16-bit peak for the mfu metric (default: by CUDA device name, H100 SXM 989, "
                   "A100 312, V100 125; no mfu on CPU without it)")
    tensorboard_dir: Optional[str] = option(None, metavar="DIR",
                                            help="also write TensorBoard events here, with the same keys as "
                                                 "--metrics-file")
    # Megatron-LM's --moe-per-layer-logging (MoEMetricsTracker.report's per_layer_logging)
    moe_per_layer_logging: bool = option(
        False, action="store_true",
        help="with experts: each record also holds, per layer, the balancing losses and the tokens each expert "
             "received in the iteration (summed over the data-parallel ranks), as moe_per_layer")

    # Megatron-LM's straggler detector flags (megatron/training/arguments.py, _add_straggler_detector_args; its
    # training.py logs the --straggler-minmax-count slowest and fastest ranks each log interval). Here: each rank's
    # compute time, its waits inside collectives taken out (resilience/stragglers.py).
    log_straggler: bool = option(
        False, action="store_true",
        help="each --log-interval, name the --straggler-minmax-count slowest and fastest ranks by compute time "
             "(waits in collectives taken out), relative to the median, in the line and the records")
    straggler_minmax_count: int = option(1, help="how many slowest and fastest ranks --log-straggler names")
    disable_straggler_on_startup: bool = option(
        False, action="store_true",
        help="--log-straggler starts off (Megatron switches it on later through --straggler-ctrlr-port, a control "
             "server that does not exist here: it stays off, said at start)")

    def validate(self) -> None:
        if self.metrics_file is not None and not self.metrics_file:
            raise ConfigError("--metrics-file must name a file", flags=("--metrics-file",))
        if self.peak_tflops is not None and not self.peak_tflops > 0:
            raise ConfigError(f"--peak-tflops must be positive, got {self.peak_tflops}", flags=("--peak-tflops",))
        if self.straggler_minmax_count < 1:
            raise ConfigError(f"--straggler-minmax-count must be at least 1, got {self.straggler_minmax_count}",
                              flags=("--straggler-minmax-count",))
