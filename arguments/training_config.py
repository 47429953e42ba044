"""The training section of the run's settings: how long, the batches, the seed, the device and compilation,
evaluation and logging intervals; mixed precision, fault handling and the fault injector are its sections."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from arguments.cuda_graphs import CUDA_GRAPH_IMPLS, MODULE_CHOICES
from arguments.fault_handling import FaultHandlingSettings
from base.errors import ConfigError
from base.options import count, flag_of_setting, option, section
from rendezvous.fault_injector import FaultInjectorSettings
from zero.precision_settings import PrecisionSettings

SEED_LIMIT = 2**32


@dataclass(frozen=True)
class TrainingConfig:
    micro_batch_size: int = option(16, aliases={"--batch-size": "DeepSpeed-Megatron"})
    global_batch_size: int = option(32, help="micro batch x gradient-accumulation steps x data-parallel size "
                                             "(set from --gradient-accumulation-steps when that is given)")
    # When set, it determines the global batch instead of --global-batch-size, unless both are given
    # explicitly; see arguments/batch_schedule.py.
    accumulation_steps: Optional[int] = option(
        None, flags=("--gradient-accumulation-steps",),
        help="micro batches per rank per iteration; when given, it determines the global batch "
             "(default: --global-batch-size / (micro batch x data-parallel size))",
        aliases={"--gas": "DeepSpeedExamples' Megatron 3D"})
    # The ramp itself: arguments/batch_schedule.py.
    rampup_batch_size: Optional[list[int]] = option(
        None, nargs=3, type=count, metavar=("START", "INCREMENT", "SAMPLES"),
        help="grow the global batch from START by INCREMENT, evenly over the first SAMPLES samples, to "
             "--global-batch-size (Megatron-LM)")
    step_batch_size_schedule: Optional[str] = option(
        None, type=str, metavar="'THRESHOLD:BATCH ...'",
        help="the global batch in steps: from each THRESHOLD tokens consumed (suffixes K, M, B, T), BATCH; the "
             "first threshold is 0 and the last batch is the run's global batch (Megatron-LM's main branch, "
             "which deprecates --rampup-batch-size; arguments/step_batch_schedule.py)")
    train_iters: Optional[int] = 250  # None with --train-samples: derived as Megatron does (arguments/schedule.py)
    train_samples: Optional[int] = option(
        None, type=count, help="train for this many samples instead of --train-iters (Megatron-LM; the iterations "
                               "are derived as Megatron derives them, a batch ramp included)")
    train_tokens: Optional[int] = option(None, type=count, help="also stop once this many tokens are consumed "
                                                                "(Megatron-DeepSpeed)")
    seed: int = 1234
    # Megatron-LM's _set_random_seed (megatron/training/initialize.py): `seed = seed + 10 * dp_rank` under it, after
    # the pipeline rank's 100 x; the weights stay --seed's (Megatron broadcasts DP rank 0's), as here always.
    # Megatron-LM's --calculate-per-token-loss (training/per_token_loss.py)
    calculate_per_token_loss: bool = option(
        False, help="the iteration's loss is its (masked) per-token losses' sum over their count across DP x CP, "
                    "as Megatron-LM; without it each micro-batch's (masked) mean, averaged")
    data_parallel_random_init: bool = option(
        False, help="each data-parallel rank's random streams (dropout, the experts' random routing) from --seed + 10 "
                    "x its DP rank, as Megatron-LM; the weights stay --seed's")
    mixed_precision: PrecisionSettings = section(PrecisionSettings)  # --bf16, --fp16 and fp16's loss scaling
    device: str = option("auto", help="auto (CUDA if present, else CPU), cpu, cuda, cuda:N")
    dry_run: bool = option(False, action="store_true",
                           help="print what this rank would hold and send (python -m zero.plan dry-run) and exit")
    # gpt.model.compile_blocks
    compile: bool = option(False, help="torch.compile each transformer block (the first iterations compile; every "
                                       "TP size and ZeRO stage)")
    # Megatron-LM's CUDA graph flags (arguments/cuda_graphs.py; what is captured: training/cuda_graphs.py)
    cuda_graph_impl: str = option(
        "none", choices=CUDA_GRAPH_IMPLS,
        help="local: each transformer block's forward and backward captured as CUDA graphs after the first iteration, "
             "replayed every micro-batch after (Megatron-Core's local implementation); transformer_engine: the same "
             "graphs, captured after --cuda-graph-warmup-steps iterations as Megatron-LM's Transformer Engine path "
             "does; full_iteration: accepted, the whole-iteration graph is not built (the blocks run eagerly); a CPU "
             "captures nothing")
    cuda_graph_modules: list[str] = option(
        default_factory=list, nargs="+", choices=MODULE_CHOICES,
        help="what of each layer is captured: empty, the whole layer; attn its attention half, mlp a dense layer's "
             "MLP half (Megatron-LM's CudaGraphModule); moe, moe_router, moe_preprocess and mamba are accepted and "
             "not captured here (said at the start)")
    cuda_graph_warmup_steps: int = option(
        3, help="local: warm-up passes of each graph before its capture; transformer_engine: eager iterations before "
                "the capture (Megatron-LM's meaning under each)")
    faults: FaultHandlingSettings = section(FaultHandlingSettings)  # timeouts, restarts, the rerun machine
    eval_interval: int = 50
    eval_iters: int = option(10, help="batches per evaluation; 0 or less: no validation or test (as Megatron-LM)")
    # Megatron-LM's --skip-train (megatron/training/training.py pretrain @ d98e8a64: no train(), then the valid and
    # test evaluations at the loaded iteration): training/loop.py
    skip_train: bool = option(False, action="store_true",
                              help="train nothing: evaluate the model (--load's, or the initial one) on the valid "
                                   "and test splits, --eval-iters batches each")
    log_interval: int = 10
    # Megatron-Core's fault injector (megatron/core/fault_injector.py, FaultInjectorConfig: every field None by
    # default, injection on when ranks or num-ranks is given); rendezvous/fault_injector.py, resilience/fault_injection.py.
    fault_injector: FaultInjectorSettings = section(FaultInjectorSettings)


    @property
    def eval_batches(self) -> int:
        """Batches per evaluation. Megatron-LM parses --eval-iters with no bound and evaluates only where it is
        positive (core_v0.16.1 megatron/training/training.py build_train_valid_test_data_loaders: `do_valid` and
        `do_test` need `args.eval_iters > 0`), so -1, which launch scripts pass, is no evaluation: none here too."""
        return max(self.eval_iters, 0)

    @property
    def precision(self) -> str:
        """The training precision: "fp32", "bf16" or "fp16"."""
        return self.mixed_precision.precision

    @property
    def gradient_precision(self) -> str:
        """What gradients are accumulated and reduced in: "fp32", or the training precision."""
        return self.mixed_precision.gradient_precision

    def validate(self) -> None:
        self._validate_length_and_batch()
        self.faults.validate()
        self._validate_fault_injector_seed_and_device()
        self.mixed_precision.validate()

    def _validate_length_and_batch(self) -> None:
        """How long to train and the batches: lengths, sizes, intervals, the ramp."""
        for name in ("train_iters", "train_samples", "train_tokens"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise ConfigError(f"{_flag(name)} must be at least 1, got {getattr(self, name)}", flags=(_flag(name),))
        if self.train_iters is None and self.train_samples is None:
            raise ConfigError("give --train-iters or --train-samples (how long to train)",
                              flags=("--train-iters", "--train-samples"))
        for name in ("micro_batch_size", "global_batch_size", "eval_interval", "log_interval"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{_flag(name)} must be at least 1, got {getattr(self, name)}", flags=(_flag(name),))
        if self.accumulation_steps is not None and self.accumulation_steps < 1:
            raise ConfigError(f"{_flag('accumulation_steps')} must be at least 1, got {self.accumulation_steps}",
                              flags=(_flag("accumulation_steps"),))
        if self.rampup_batch_size is not None:
            check_rampup(self.rampup_batch_size, self.global_batch_size)
            if self.accumulation_steps is not None:
                raise ConfigError("--rampup-batch-size sets the accumulation steps of each iteration; drop "
                                  "--gradient-accumulation-steps (the ramp ends at --global-batch-size)",
                                  flags=("--rampup-batch-size", "--gradient-accumulation-steps", "--global-batch-size"))

    def _validate_fault_injector_seed_and_device(self) -> None:
        """The fault injector (its start against the run's length), the seed and the device."""
        start = self.fault_injector.delay_start_iteration
        if self.fault_injector.enabled and start is not None and self.train_iters is not None \
                and start >= self.train_iters:
            raise ConfigError(f"--fault-injector-delay-start-iteration {start}: Megatron's 0-based iteration count "
                              f"never reaches it in --train-iters {self.train_iters} (its last is "
                              f"{self.train_iters - 1}), so the injector would never fire",
                              flags=("--fault-injector-delay-start-iteration", "--train-iters"))
        check_seed(self.seed)
        check_device_name(self.device)
        self.fault_injector.check(cuda=self.device.startswith("cuda") or (self.device == "auto" and
                                                                          torch.cuda.is_available()))


def check_rampup(ramp: list[int], global_batch_size: int) -> None:
    """Megatron's rules for --rampup-batch-size START INCREMENT SAMPLES, which need no grid to check."""
    if len(ramp) != 3:
        raise ConfigError(f"--rampup-batch-size takes three numbers, START INCREMENT SAMPLES; got {len(ramp)}",
                          flags=("--rampup-batch-size",))
    start, increment, samples = ramp
    if start < 1 or increment < 1 or samples < 0:
        raise ConfigError(f"--rampup-batch-size {start} {increment} {samples}: START and INCREMENT must be at least "
                          f"1 and SAMPLES at least 0", flags=("--rampup-batch-size",))
    if start > global_batch_size or (global_batch_size - start) % increment != 0:
        raise ConfigError(f"--rampup-batch-size {start} {increment} {samples}: the ramp must reach --global-batch-size "
                          f"{global_batch_size} from {start} in steps of {increment}",
                          flags=("--rampup-batch-size", "--global-batch-size"))


def check_seed(seed: int) -> None:
    """--seed seeds every random stream, NumPy's too, which takes a 32-bit seed."""
    if not 0 <= seed < SEED_LIMIT:
        raise ConfigError(f"--seed must be in [0, 2**32), got {seed}; every stream (NumPy's included) "
                          "takes a 32-bit seed", flags=("--seed",))


def check_device_name(name: str) -> None:
    """--device is 'auto', 'cpu', 'cuda' or 'cuda:N'; whether that CUDA device exists is checked when
    the process grid is built."""
    if name == "auto":
        return
    try:
        device = torch.device(name)
    except (RuntimeError, ValueError):
        device = None
    if device is None or device.type not in ("cpu", "cuda"):
        raise ConfigError(f"--device {name!r} is not a device this program trains on; use auto, cpu, cuda or cuda:N",
                          flags=("--device",))


def _flag(name: str) -> str:
    return flag_of_setting(TrainingConfig, name)
