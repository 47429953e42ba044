"""The DeepSpeed JSON blocks read as a whole (optimizer, scheduler, offload, monitors, pipeline, ...): each
classifier turns one block into verdicts and declares, with `@wins`, the precedence of the keys it makes flags."""

from __future__ import annotations

import os
from typing import Any

from arguments.deepspeed.precedence import (
    AUTOTP,
    GRAD_ACCUM_DTYPE,
    LEGACY_ZERO,
    LOSS_SCALE,
    OPTIMIZER,
    PROGRESS_LINE,
    SCHEDULER,
    TENSORBOARD,
    WANDB,
    ZERO,
)
from arguments.deepspeed.verdicts import (
    HONOURED,
    NO_EFFECT,
    UNSUPPORTED,
    Classifier,
    Verdict,
    block,
    boolean,
    no_effect,
    number,
    only_if,
    show,
    to_flag,
    whole_number,
    wins,
)
from base.errors import ConfigError

NVME_OFFLOAD = 'NVMe offload (ZeRO-Infinity) is not implemented: use "device": "cpu" (host memory)'
OFFLOAD_NVME_KNOBS = ("nvme_path", "buffer_count", "pipeline_read", "pipeline_write", "fast_init")


def _offload_device(key: str, value: Any, flag: str) -> tuple[dict, list[Verdict]]:
    """(the block's other keys to classify, the device's verdict): "cpu" is `flag`; "none" has no effect
    and "nvme" is refused, both leaving nothing else to classify."""
    offload = block(key, value)
    device = offload.get("device", "none")
    if device not in ("none", "cpu", "nvme"):
        raise ConfigError(f'{key}.device must be "cpu", "nvme" or "none", got {show(device)}')
    if device == "none":
        return {}, [Verdict(key, NO_EFFECT, why="no offload")]
    if device == "nvme":
        return {}, [Verdict(f"{key}.device", UNSUPPORTED, why=NVME_OFFLOAD)]
    return {name: setting for name, setting in offload.items() if name != "device"}, \
        [Verdict(f"{key}.device", HONOURED, (flag,))]


@wins({"zero_optimization.offload_optimizer.device": ZERO,
       "zero_optimization.offload_optimizer.pin_memory": ZERO})
def classify_offload_optimizer(key: str, value: Any) -> list[Verdict]:
    """device cpu is --offload-optimizer; its knobs map to flags, NVMe's own have nothing to configure."""
    offload, verdicts = _offload_device(key, value, "--offload-optimizer")
    for name in sorted(offload):
        path, setting = f"{key}.{name}", offload[name]
        if name == "pin_memory":
            verdicts += to_flag("--offload-pin-memory", "bool")(path, setting)
        elif name == "ratio":
            verdicts += only_if(lambda v: number(path, v) >= 1.0, "the whole optimizer state is on the host",
                                "partial offload (ratio < 1) is not implemented: the whole optimizer state goes to "
                                "the host; set 1.0 or remove it")(path, setting)
        elif name in OFFLOAD_NVME_KNOBS:
            verdicts.append(Verdict(path, NO_EFFECT, why="it configures NVMe offload's buffers and reads, not used "
                                                         "with device cpu"))
        elif name == "cpuadam_cores_perc":
            verdicts.append(Verdict(path, NO_EFFECT, why="the host step runs on PyTorch's CPU threads "
                                                         "(torch.set_num_threads)"))
        else:
            verdicts.append(Verdict(path, UNSUPPORTED, why="not implemented with offload here (it takes device, "
                                                           "pin_memory, ratio 1 and NVMe's knobs)"))
    return verdicts


# DeepSpeedZeroOffloadParamConfig's keys.
PARAM_NVME_KNOBS = ("nvme_path", "buffer_count", "buffer_size", "max_in_cpu")


@wins({"zero_optimization.offload_param.device": ZERO, "zero_optimization.offload_param.pin_memory": ZERO})
def classify_offload_param(key: str, value: Any) -> list[Verdict]:
    """device cpu is --offload-param (stage 3's parameter shard on the host); NVMe's knobs do nothing."""
    offload, verdicts = _offload_device(key, value, "--offload-param")
    for name in sorted(offload):
        path, setting = f"{key}.{name}", offload[name]
        if name == "pin_memory":
            verdicts += to_flag("--offload-pin-memory", "bool")(path, setting)
        elif name in PARAM_NVME_KNOBS:
            verdicts.append(Verdict(path, NO_EFFECT, why="it sizes NVMe offload's buffers, not used with device "
                                                         "cpu"))
        else:
            verdicts.append(Verdict(path, UNSUPPORTED, why="not a key of DeepSpeed's offload_param block (device, "
                                                           "pin_memory and NVMe's knobs)"))
    return verdicts


@wins({"zero_optimization.cpu_offload_params": ZERO})
def classify_cpu_offload_params(key: str, value: Any) -> list[Verdict]:
    """DeepSpeed v0.3's form of offload_param {device: cpu}."""
    if boolean(key, value):
        return [Verdict(key, HONOURED, ("--offload-param",))]
    return [Verdict(key, NO_EFFECT, why="no offload")]


@wins({"zero_optimization.cpu_offload": ZERO})
def classify_cpu_offload(key: str, value: Any) -> list[Verdict]:
    """DeepSpeed v0.3's form of offload_optimizer {device: cpu}."""
    if boolean(key, value):
        return [Verdict(key, HONOURED, ("--offload-optimizer",))]
    return [Verdict(key, NO_EFFECT, why="no offload")]


ADAM_TYPES = ("adam", "adamw")


def classify_optimizer(key: str, value: Any) -> list[Verdict]:
    """DeepSpeed's Adam (adam_w_mode on by default) and AdamW are our AdamW; params map to the flags."""
    optimizer = block(key, value)
    verdicts = []
    kind = optimizer.get("type")
    if not isinstance(kind, str) or kind.lower() not in ADAM_TYPES:
        verdicts.append(Verdict(f"{key}.type", UNSUPPORTED,
                                why=f"{kind!r}: the optimizer here is AdamW (ZeRO's sharded Adam with decoupled weight "
                                    "decay); use \"Adam\" or \"AdamW\""))
    else:
        verdicts.append(Verdict(f"{key}.type", HONOURED, why=f"{kind}: the AdamW that runs here"))
    params = block(f"{key}.params", optimizer.get("params", {}))
    for name, param in params.items():
        path = f"{key}.params.{name}"
        if name in OPTIMIZER_PARAMS:
            verdicts += OPTIMIZER_PARAMS[name](path, param)
        else:
            verdicts.append(Verdict(path, UNSUPPORTED, why=f"not a parameter of the AdamW here (it takes "
                                                           f"{', '.join(sorted(OPTIMIZER_PARAMS))})"))
    for name in sorted(set(optimizer) - {"type", "params"}):
        verdicts += _adam_mode(f"{key}.{name}", optimizer[name]) if name == "adam_w_mode" else \
            [Verdict(f"{key}.{name}", UNSUPPORTED, why="not a key of DeepSpeed's optimizer block (type, params)")]
    return verdicts


@wins({"optimizer.params.betas": OPTIMIZER})
def _betas(key: str, value: Any) -> list[Verdict]:
    if not isinstance(value, (list, tuple)) or len(value) != 2:
        raise ConfigError(f"{key} must be a list of two numbers, got {show(value)}")
    beta1, beta2 = (number(key, beta) for beta in value)
    return [Verdict(key, HONOURED, ("--adam-beta1", repr(float(beta1)), "--adam-beta2", repr(float(beta2))))]


def _max_grad_norm(key: str, value: Any) -> list[Verdict]:
    """The old apex FusedAdam's clip norm: DeepSpeed clips with gradient_clipping, never with it (and the JSON's
    optimizer block is not read under Megatron), so ignoring it changes nothing that ran."""
    number(key, value)
    return [Verdict(key, NO_EFFECT, why="not read: Megatron passes DeepSpeed its own optimizer (or param groups "
                                        "it filled), and DeepSpeed clips with gradient_clipping, never with the "
                                        "optimizer's max_grad_norm (since v0.2.0 an error where it builds the "
                                        "JSON's optimizer)")]


def _adam_mode(key: str, value: Any) -> list[Verdict]:
    return only_if(lambda v: v is True, "decoupled weight decay (AdamW) is what runs here",
                   "Adam with L2 regularization is not implemented: weight decay is decoupled (AdamW); remove it "
                   "or set it to true")(key, value)


OPTIMIZER_PARAMS: dict[str, Classifier] = {
    "lr": to_flag("--lr", wins=OPTIMIZER),
    "betas": _betas,
    "eps": to_flag("--adam-eps", wins=OPTIMIZER),
    "weight_decay": to_flag("--weight-decay", wins=OPTIMIZER),
    "max_grad_norm": _max_grad_norm,
    "adam_w_mode": _adam_mode,
    "torch_adam": no_effect("an implementation choice: the update is the same AdamW"),
    "fused": no_effect("an implementation choice: the update is the same AdamW"),
    "bias_correction": only_if(lambda v: v is True, "Adam's bias correction is always applied here",
                               "Adam without bias correction is not implemented"),
    "amsgrad": only_if(lambda v: v is False, "plain Adam moments, as here",
                       "AMSGrad is not implemented: the AdamW here keeps plain moments"),
}

# DeepSpeed's own defaults for the WarmupLR / WarmupDecayLR parameters a config may leave out.
WARMUP_DEFAULTS = {"warmup_min_lr": 0.0, "warmup_max_lr": 0.001, "warmup_num_steps": 1000, "warmup_type": "log"}
SCHEDULER_ALTERNATIVE = ("use WarmupLR or WarmupDecayLR with \"warmup_type\": \"linear\", or the flags "
                         "--lr-warmup-iters, --lr-decay-style {cosine,linear,constant}, --lr-decay-iters, --min-lr")


@wins({"scheduler.params": SCHEDULER})
def classify_scheduler(key: str, value: Any) -> list[Verdict]:
    """WarmupLR (linear warmup to warmup_max_lr, then constant) and WarmupDecayLR (then a linear decay to warmup_min_lr
    at total_num_steps) are our schedule, warming up from 0; DeepSpeed's default logarithmic warmup is not
    implemented."""
    scheduler = block(key, value)
    kind = scheduler.get("type")
    params = block(f"{key}.params", scheduler.get("params", {}))
    extra = set(scheduler) - {"type", "params"}
    if kind not in ("WarmupLR", "WarmupDecayLR"):
        return [Verdict(f"{key}.type", UNSUPPORTED, why=f"{kind!r} is not implemented; {SCHEDULER_ALTERNATIVE}")]
    known = set(WARMUP_DEFAULTS) | ({"total_num_steps"} if kind == "WarmupDecayLR" else set()) | {"last_batch_iteration"}
    verdicts = [Verdict(f"{key}.{name}", UNSUPPORTED, why="not a key of DeepSpeed's scheduler block (type, params)")
                for name in sorted(extra)]
    verdicts += [Verdict(f"{key}.params.{name}", UNSUPPORTED, why=f"not a parameter of {kind}")
                 for name in sorted(set(params) - known)]
    merged = {**WARMUP_DEFAULTS, **params}
    floor = number(f"{key}.params.warmup_min_lr", merged["warmup_min_lr"])
    peak = number(f"{key}.params.warmup_max_lr", merged["warmup_max_lr"])
    steps = whole_number(f"{key}.params.warmup_num_steps", merged["warmup_num_steps"])
    if merged["warmup_type"] != "linear":
        said = "absent, so DeepSpeed's default \"log\"" if "warmup_type" not in params else repr(merged["warmup_type"])
        verdicts.append(Verdict(f"{key}.params.warmup_type", UNSUPPORTED,
                                why=f"{said}: the warmup here is linear; write \"warmup_type\": \"linear\""))
    if floor != 0:
        verdicts.append(Verdict(f"{key}.params.warmup_min_lr", UNSUPPORTED,
                                why=f"{floor}: the warmup here starts from 0; set it to 0"))
    flags = ["--lr", repr(float(peak)), "--lr-warmup-iters", str(steps), "--min-lr", repr(float(floor))]
    if kind == "WarmupLR":
        flags += ["--lr-decay-style", "constant"]
    else:
        if "total_num_steps" not in params:
            raise ConfigError(f"{key}.params.total_num_steps is required by WarmupDecayLR")
        total = whole_number(f"{key}.params.total_num_steps", params["total_num_steps"])
        flags += ["--lr-decay-style", "linear", "--lr-decay-iters", str(total)]
    verdicts.append(Verdict(f"{key}.params", HONOURED, tuple(flags)))
    if "last_batch_iteration" in params:
        verdicts.append(Verdict(f"{key}.params.last_batch_iteration", NO_EFFECT,
                                why="the schedule is a function of the iteration, restored from the checkpoint"))
    return verdicts


@wins({"tensorboard": TENSORBOARD})
def classify_tensorboard(key: str, value: Any) -> list[Verdict]:
    """DeepSpeed writes events to output_path/job_name."""
    monitor = block(key, value)
    if not monitor.get("enabled", False):
        return [Verdict(key, NO_EFFECT, why="the block is disabled")]
    directory = os.path.join(monitor.get("output_path") or ".", monitor.get("job_name") or "DeepSpeedJobName")
    return [Verdict(key, HONOURED, ("--tensorboard-dir", directory))]


@wins({"wandb": WANDB})
def classify_wandb(key: str, value: Any) -> list[Verdict]:
    monitor = block(key, value)
    if not monitor.get("enabled", False):
        return [Verdict(key, NO_EFFECT, why="the block is disabled")]
    flags = ["--wandb-project", str(monitor.get("project") or "deepspeed")]
    if monitor.get("team"):
        flags += ["--wandb-entity", str(monitor["team"])]
    verdicts = [Verdict(key, HONOURED, tuple(flags))]
    if monitor.get("group"):
        verdicts.append(Verdict(f"{key}.group", NO_EFFECT, why="runs are not grouped here; group them in W&B"))
    return verdicts


@wins({"tensor_parallel.autotp_size": AUTOTP})
def classify_tensor_parallel(key: str, value: Any) -> list[Verdict]:
    """AutoTP's degree is the tensor-parallel size; how to split the layers is fixed by our model."""
    section = block(key, value)
    verdicts = [Verdict(f"{key}.{name}", NO_EFFECT, why="the GPT here is split Megatron-style; its layout is fixed")
                for name in section if name != "autotp_size"]
    if "autotp_size" in section:
        size = whole_number(f"{key}.autotp_size", section["autotp_size"])
        verdicts.append(Verdict(f"{key}.autotp_size", HONOURED, ("--tensor-model-parallel-size", str(max(size, 1)))))
    return verdicts


# DeepSpeed's pipeline engine settings with get_pipeline_config's defaults; the stages come from
# --pipeline-model-parallel-size.
PIPELINE_KEYS = {
    "pipe_partitioned": "how DeepSpeed's pipeline engine sends activations between stages (each split over the "
                        "tensor-parallel ranks, gathered at the receiver): the same values arrive",
    "grad_partitioned": "how DeepSpeed's pipeline engine sends gradients between stages (split over the "
                        "tensor-parallel ranks, gathered at the receiver): the same values arrive",
    "stages": "DeepSpeed reads no stage count from here (PipelineModule's num_stages, which Megatron-DeepSpeed "
              "takes from --pipeline-model-parallel-size, as the stages here are)",
    "partition": "DeepSpeed reads no partition method from here (PipelineModule's partition_method, which "
                 "Megatron-DeepSpeed sets); the layers are split as Megatron splits them",
    "seed_layers": "DeepSpeed reads it from no config (PipelineModule's own seed_layers)",
    "use_reentrant": "which torch checkpoint function recomputes; the recomputed values are the same",
    "activation_checkpoint_interval": "DeepSpeed's pipeline engine recomputes each group of this many layers in "
                                      "backward; here recomputation follows --checkpoint-activations and "
                                      "--recompute-*: the same losses, other memory",
}


def classify_pipeline(key: str, value: Any) -> list[Verdict]:
    """DeepSpeed's `pipeline` section: how its engine sends and recomputes, none of which changes the math; the stages
    are --pipeline-model-parallel-size's."""
    verdicts = []
    for name, given in block(key, value).items():
        if name not in PIPELINE_KEYS:  # the engine reads only its own keys
            verdicts.append(Verdict(f"{key}.{name}", NO_EFFECT, why="DeepSpeed's pipeline engine reads no such key"))
        elif name in ("pipe_partitioned", "grad_partitioned") and not (isinstance(given, bool) or given == "auto"):
            # PipelineEngine asserts a bool; HabanaAI's scripts write "auto"
            raise ConfigError(f"{key}.{name} must be true or false, got {show(given)}")
        elif name == "activation_checkpoint_interval" and whole_number(f"{key}.{name}", given) <= 0:
            verdicts.append(Verdict(f"{key}.{name}", NO_EFFECT, why="0 or less: DeepSpeed's engine leaves the "
                                                                     "module's interval as it is"))
        else:
            verdicts.append(Verdict(f"{key}.{name}", NO_EFFECT, why=PIPELINE_KEYS[name]))
    return verdicts


@wins({"zero_optimization": LEGACY_ZERO})
def classify_legacy_zero(key: str, value: Any) -> list[Verdict]:
    """`"zero_optimization": true` (DeepSpeed's first form) is stage 1; false is stage 0."""
    return [Verdict(key, HONOURED, ("--zero-stage", "1" if value else "0"))]


@wins({"data_types.grad_accum_dtype": GRAD_ACCUM_DTYPE})
def classify_grad_accum_dtype(key: str, value: Any) -> list[Verdict]:
    if value not in ("fp32", "fp16", "bf16", None):
        raise ConfigError(f"{key} must be \"fp32\", \"fp16\" or \"bf16\", got {show(value)}")
    if value is None:
        return [Verdict(key, NO_EFFECT, why="null: the default for the precision")]
    flag = "--accumulate-allreduce-grads-in-fp32" if value == "fp32" else "--no-accumulate-allreduce-grads-in-fp32"
    return [Verdict(key, HONOURED, (flag,))]


@wins({"steps_per_print": PROGRESS_LINE})
def classify_steps_per_print(key: str, value: Any) -> list[Verdict]:
    """DeepSpeed's own progress-line cadence, independent of --log-interval in the real pair."""
    shown = "null" if value is None else str(whole_number(key, value))
    return [Verdict(key, NO_EFFECT, why=f"{shown}: the cadence of DeepSpeed's own progress line; the log line and "
                                        f"metrics records here follow --log-interval, as Megatron's do in "
                                        f"Megatron-DeepSpeed")]


@wins({"fp16.loss_scale": LOSS_SCALE})
def classify_loss_scale(key: str, value: Any) -> list[Verdict]:
    scale = number(key, value)
    if scale < 0:
        raise ConfigError(f"{key} must be >= 0 (0 means dynamic loss scaling), got {show(value)}")
    if scale == 0:  # dynamic scaling: --loss-scale stays unset
        return [Verdict(key, HONOURED, why="0: dynamic loss scaling")]
    return [Verdict(key, HONOURED, ("--loss-scale", repr(float(scale))))]


@wins({"fp16.initial_scale_power": LOSS_SCALE})
def classify_scale_power(key: str, value: Any) -> list[Verdict]:
    power = whole_number(key, value)
    if not 0 <= power <= 64:
        raise ConfigError(f"{key} must be a whole number in 0..64 (the initial scale is 2**power), got {show(value)}")
    return [Verdict(key, HONOURED, ("--initial-loss-scale", repr(float(2 ** power))))]

