"""Every key of DeepSpeed's config JSON, classified: honoured (and the flags it becomes), accepted with
no effect on the math (and why), or unsupported (and what to use instead).

The keys are those of DeepSpeed's documented configuration (https://www.deepspeed.ai/docs/config-json/, the source
`docs/_pages/config-json.md` of deepspeedai/DeepSpeed), plus keys earlier revisions documented that configs in the
wild still carry (`memory_breakdown`, `amp`, `sparse_attention`, `elasticity`, `bfloat16`, ...).

A key is looked up by its dotted path (`zero_optimization.offload_optimizer`); a classifier gets its value and
returns a `Verdict`. A key that becomes flags also names on its row which side wins where a flag sets the same thing
(`to_flag(..., wins=ZERO)`, `@wins({...})`: arguments/deepspeed/precedence.py's behaviours; `precedence_of` reads
them back). Blocks whose keys only mean something together (`optimizer`, `scheduler`, `tensorboard`, `wandb`) are
classified as a whole; sections whose sub-keys each map to a setting (`fp16`, `bf16`, `zero_optimization`,
`activation_checkpointing`, `checkpoint`, `data_types`) are listed key by key in `SECTION_KEYS`.

The keys stay here, in DeepSpeed's order, rather than beside the settings' fields (base/options.py): a quarter of
the honoured keys are not one key for one flag, most set no setting at all, and a section reads as DeepSpeed
documents it only when all its keys are in one place."""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from typing import Any, Callable, Optional

from arguments.deepspeed.precedence import (
    ACCUMULATION,
    AUTOTP,
    BATCH_IDENTITY,
    BATCH_IDENTITY_RULE,
    CHECKPOINT_BLOCK,
    CHECKPOINTING,
    GLOBAL_BATCH,
    GRAD_ACCUM_DTYPE,
    GRADIENT_CLIPPING,
    LEGACY_ZERO,
    LOSS_SCALE,
    MICRO_BATCH,
    OPTIMIZER,
    PRECISION,
    PROGRESS_LINE,
    SCHEDULER,
    TENSORBOARD,
    UNIVERSAL_CHECKPOINT,
    WANDB,
    ZERO,
    ZERO_STAGE,
    Precedence,
)
from base.errors import ConfigError

HONOURED, NO_EFFECT, UNSUPPORTED = "honoured", "no effect", "unsupported"


@dataclass(frozen=True)
class Verdict:
    key: str                    # the dotted path it is about
    kind: str                   # HONOURED, NO_EFFECT or UNSUPPORTED
    flags: tuple[str, ...] = ()  # HONOURED: the equivalent command-line flags (none: the value is what runs)
    why: str = ""               # HONOURED without flags: what runs; NO_EFFECT: why the math is the same;
                                # UNSUPPORTED: the reason or the alternative


Classifier = Callable[[str, Any], list[Verdict]]


# ---- value checks (a bad value is an error at once: it is a typo, not a feature we lack) ----------

def _show(value: Any) -> str:
    text = json.dumps(value)
    return text + ' (the HF Trainer fills in "auto"; write the value here)' if value == "auto" else text


def number(key: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ConfigError(f"{key} must be a number, got {_show(value)}")
    return value


def whole_number(key: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or \
            (isinstance(value, float) and not value.is_integer()):
        raise ConfigError(f"{key} must be a whole number (5e8 is fine, 1.5 is not), got {_show(value)}")
    return int(value)


def boolean(key: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(f"{key} must be true or false, got {_show(value)}")
    return value


def block(key: str, value: Any) -> dict:
    if not isinstance(value, dict):
        raise ConfigError(f'"{key}" must be an object, got {_show(value)}')
    return value


# ---- classifier builders --------------------------------------------------------------------------

def to_flag(flag: str, kind: str = "number", wins: Optional[Precedence] = None) -> Classifier:
    """Honoured: the value becomes `flag` (kind: "number", "count" (a whole number), "bool" (the flag or
    its --no- form), "optional_count" (null: no flag)); `wins` is the key's precedence beside that flag
    (arguments/deepspeed/precedence.py)."""
    def classify(key: str, value: Any) -> list[Verdict]:
        if kind == "bool":
            flags = (flag,) if boolean(key, value) else ("--no-" + flag[2:],)
        elif kind == "optional_count":
            flags = () if value is None else (flag, str(whole_number(key, value)))
        elif kind == "count":
            flags = (flag, str(whole_number(key, value)))
        else:
            flags = (flag, repr(float(number(key, value))))
        return [Verdict(key, HONOURED, flags)]
    classify.precedence = wins
    return classify


def wins(precedence: dict[str, Precedence]) -> Callable[[Classifier], Classifier]:
    """Declares, on a block's classifier, the precedence of each key it turns into flags."""
    def declare(classify: Classifier) -> Classifier:
        classify.precedence = precedence
        return classify
    return declare


def no_effect(why: str) -> Classifier:
    return lambda key, value: [Verdict(key, NO_EFFECT, why=why)]


def unsupported(why: str) -> Classifier:
    return lambda key, value: [Verdict(key, UNSUPPORTED, why=why)]


def only_if(accepted: Callable[[Any], bool], why_accepted: str, why_not: str) -> Classifier:
    """No effect for the values we already behave as (`accepted`), unsupported for the others."""
    return lambda key, value: [Verdict(key, NO_EFFECT, why=why_accepted) if accepted(value)
                               else Verdict(key, UNSUPPORTED, why=why_not)]


def when_disabled(why_not: str) -> Classifier:
    """A feature block: accepted while it is switched off ("enabled": false, DeepSpeed's default for
    these blocks), unsupported when it is on."""
    return only_if(lambda value: isinstance(value, dict) and value.get("enabled", False) is False,
                   "the block is disabled", why_not)


# ZeRO-Offload's optimizer half (zero/offload.py). DeepSpeed's fields and defaults: deepspeedai/DeepSpeed
# deepspeed/runtime/zero/offload_config.py @edaa722, DeepSpeedZeroOffloadOptimizerConfig (lines 55-105).
NVME_OFFLOAD = 'NVMe offload (ZeRO-Infinity) is not implemented: use "device": "cpu" (host memory)'
OFFLOAD_NVME_KNOBS = ("nvme_path", "buffer_count", "pipeline_read", "pipeline_write", "fast_init")


def _offload_device(key: str, value: Any, flag: str) -> tuple[dict, list[Verdict]]:
    """(the block's other keys to classify, the device's verdict): "cpu" is `flag`; "none" has no effect
    and "nvme" is refused, both leaving nothing else to classify."""
    offload = block(key, value)
    device = offload.get("device", "none")
    if device not in ("none", "cpu", "nvme"):
        raise ConfigError(f'{key}.device must be "cpu", "nvme" or "none", got {_show(device)}')
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


# DeepSpeedZeroOffloadParamConfig (offload_config.py lines 21-50): device, nvme_path, buffer_count,
# buffer_size, max_in_cpu, pin_memory.
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


# ---- blocks classified as a whole ------------------------------------------------------------------

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
        raise ConfigError(f"{key} must be a list of two numbers, got {_show(value)}")
    beta1, beta2 = (number(key, beta) for beta in value)
    return [Verdict(key, HONOURED, ("--adam-beta1", repr(float(beta1)), "--adam-beta2", repr(float(beta2))))]


def _max_grad_norm(key: str, value: Any) -> list[Verdict]:
    """The old apex FusedAdam's clip norm: Megatron-DeepSpeed passes deepspeed.initialize its own optimizer, so
    the JSON's optimizer block is not read, and DeepSpeed clips with gradient_clipping
    (arguments/deepspeed/clipping.py). Where DeepSpeed builds the JSON's optimizer it never clipped with it
    either: v0.1.0 set it to 0 under fp16, and v0.2.0 on refuse it (_configure_basic_optimizer). Accepted, as
    ignoring it changes nothing that ran (tests/arguments/test_deepspeed_clipping.py)."""
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
    """WarmupLR: linear warmup to warmup_max_lr, then constant. WarmupDecayLR: the same warmup, then a
    linear decay to warmup_min_lr at total_num_steps. Both are this codebase's schedule (warmup from 0,
    so warmup_min_lr must be 0); DeepSpeed's default warmup is logarithmic, which is not implemented."""
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


# DeepSpeed's pipeline engine settings, as its runtime/config.py get_pipeline_config fills them (0.19: stages "auto",
# partition "best", seed_layers false, activation_checkpoint_interval 0, pipe_partitioned and grad_partitioned true)
# and runtime/pipe/engine.py PipelineEngine reads them. The stages here come from --pipeline-model-parallel-size.
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
    """DeepSpeed's `pipeline` section: how its pipeline engine sends and recomputes, none of which changes the
    math; the pipeline itself is --pipeline-model-parallel-size's (docs/pipeline-parallelism.md)."""
    verdicts = []
    for name, given in block(key, value).items():
        if name not in PIPELINE_KEYS:  # get_pipeline_config keeps any key; the engine reads only its own
            verdicts.append(Verdict(f"{key}.{name}", NO_EFFECT, why="DeepSpeed's pipeline engine reads no such key"))
        elif name in ("pipe_partitioned", "grad_partitioned") and not (isinstance(given, bool) or given == "auto"):
            # PipelineEngine asserts a bool; HabanaAI's Megatron-DeepSpeed scripts write "auto" for their fork
            raise ConfigError(f"{key}.{name} must be true or false, got {_show(given)}")
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
        raise ConfigError(f"{key} must be \"fp32\", \"fp16\" or \"bf16\", got {_show(value)}")
    if value is None:
        return [Verdict(key, NO_EFFECT, why="null: the default for the precision")]
    flag = "--accumulate-allreduce-grads-in-fp32" if value == "fp32" else "--no-accumulate-allreduce-grads-in-fp32"
    return [Verdict(key, HONOURED, (flag,))]


@wins({"steps_per_print": PROGRESS_LINE})
def classify_steps_per_print(key: str, value: Any) -> list[Verdict]:
    """DeepSpeed's own progress-line cadence: independent of Megatron's --log-interval in the real pair
    (arguments/deepspeed/precedence.py), so it never sets the log interval here."""
    shown = "null" if value is None else str(whole_number(key, value))
    return [Verdict(key, NO_EFFECT, why=f"{shown}: the cadence of DeepSpeed's own progress line; the log line and "
                                        f"metrics records here follow --log-interval, as Megatron's do in "
                                        f"Megatron-DeepSpeed")]


@wins({"fp16.loss_scale": LOSS_SCALE})
def _loss_scale(key: str, value: Any) -> list[Verdict]:
    scale = number(key, value)
    if scale < 0:
        raise ConfigError(f"{key} must be >= 0 (0 means dynamic loss scaling), got {_show(value)}")
    if scale == 0:  # dynamic scaling: --loss-scale stays unset (its default)
        return [Verdict(key, HONOURED, why="0: dynamic loss scaling")]
    return [Verdict(key, HONOURED, ("--loss-scale", repr(float(scale))))]


@wins({"fp16.initial_scale_power": LOSS_SCALE})
def _scale_power(key: str, value: Any) -> list[Verdict]:
    power = whole_number(key, value)
    if not 0 <= power <= 64:
        raise ConfigError(f"{key} must be a whole number in 0..64 (the initial scale is 2**power), got {_show(value)}")
    return [Verdict(key, HONOURED, ("--initial-loss-scale", repr(float(2 ** power))))]


# ---- the tables ------------------------------------------------------------------------------------

LOGGED_ALWAYS = "the metrics records already hold it"

# Top-level keys that are one value or one block classified as a whole.
TOP_LEVEL_KEYS: dict[str, Classifier] = {
    # batch sizes
    "train_batch_size": to_flag("--global-batch-size", "count", wins=GLOBAL_BATCH),
    "train_micro_batch_size_per_gpu": to_flag("--micro-batch-size", "count", wins=MICRO_BATCH),
    "gradient_accumulation_steps": to_flag("--gradient-accumulation-steps", "count", wins=ACCUMULATION),
    "managed_gradient_accumulation": no_effect("how DeepSpeed's engine is called; the loop here steps once per "
                                               "global batch"),
    # optimizer, schedule, clipping
    "optimizer": classify_optimizer,
    "scheduler": classify_scheduler,
    "gradient_clipping": to_flag("--clip-grad", wins=GRADIENT_CLIPPING),
    # communication
    "communication_data_type": only_if(lambda v: v is None, "null: the default",
                                       "gradients are reduced in the dtype they accumulate in: fp32 with "
                                       "--accumulate-allreduce-grads-in-fp32 (data_types.grad_accum_dtype), "
                                       "else the training dtype"),
    "gradient_allreduce_op": only_if(lambda v: v == "mean", "gradients are averaged over data parallelism",
                                     "a sum is not implemented: gradients are averaged over data parallelism"),
    "prescale_gradients": no_effect("the data-parallel average is the same on whichever side of the reduction "
                                    "the division runs"),
    "gradient_predivide_factor": no_effect("the data-parallel average is the same on whichever side of the "
                                           "reduction the division runs"),
    "sparse_gradients": no_effect("dense gradients are reduced; the sum is the same"),
    "disable_allgather": no_effect("DeepSpeed's legacy ZeRO-1 switch between all-gather and broadcast for the "
                                   "updated parameters: the same values arrive either way"),
    # precision blocks that are not the fp16/bf16 sections
    "torch_autocast": when_disabled("torch.autocast over fp32 parameters is not implemented: use --bf16 or --fp16 "
                                    "(16-bit parameters, fp32 master weights)"),
    "amp": when_disabled("NVIDIA apex AMP is not used: use --fp16 or --bf16"),
    # ZeRO blocks beyond the section's keys, and other engines' features
    "aio": no_effect("it configures NVMe offload, which is not used"),
    "tensor_parallel": classify_tensor_parallel,
    "pipeline": classify_pipeline,
    "hybrid_engine": when_disabled("the hybrid engine (RLHF generation) is not part of pretraining here"),
    "expert_parallel": when_disabled("this GPT has no mixture-of-experts layers"),
    "compile": when_disabled("DeepCompile is not implemented"),
    "disable_python_gc": no_effect("garbage collection does not change the numbers"),
    # logging and monitoring
    "steps_per_print": classify_steps_per_print,
    "wall_clock_breakdown": no_effect("iteration time is logged every --log-interval (iter_time_s); "
                                      "--profile-checkpointing times the checkpointed groups"),
    "dump_state": no_effect("--print-config prints the resolved configuration"),
    "memory_breakdown": no_effect("--report-memory logs each rank's model-state bytes beside the prediction"),
    "flops_profiler": no_effect("TFLOP/s per GPU are logged every --log-interval"),
    "comms_logger": no_effect("comm_bytes in every metrics record counts the bytes of each collective"),
    "csv_monitor": no_effect("--metrics-file holds the same values as JSON lines"),
    "tensorboard": classify_tensorboard,
    "wandb": classify_wandb,
    "comet": when_disabled("Comet is not supported: use --wandb-project or --tensorboard-dir"),
    "timers": no_effect(LOGGED_ALWAYS),
    "autotuning": when_disabled("DeepSpeed's autotuner is not implemented: python -m zero.plan max-size plans "
                                "model sizes here"),
    # features that change what is trained
    "data_efficiency": only_if(
        lambda value: isinstance(value, dict) and not any(
            isinstance(value.get(part), dict) and value[part].get("enabled", False) is True
            for part in ("data_sampling", "data_routing")),
        "its data_sampling and data_routing are disabled, the only switches DeepSpeed reads",
        "data_sampling (curriculum learning) or data_routing (random-LTD) enabled changes which tokens train; "
        "not implemented"),
    "curriculum_learning": when_disabled("curriculum learning changes which samples train; not implemented"),
    "compression_training": unsupported("quantization and pruning during training are not implemented"),
    "sparse_attention": unsupported("block-sparse attention is not implemented: attention here is dense and causal"),
    "progressive_layer_drop": when_disabled("progressive layer dropping is not implemented"),
    "eigenvalue": when_disabled("eigenvalue computation (for quantization schedules) is not implemented"),
    "quantize_training": when_disabled("quantized training is not implemented"),
    "elasticity": when_disabled("elastic batch sizes are not implemented; checkpoints already resume at another "
                                "data-parallel size"),
    # engine behaviour
    "zero_allow_untested_optimizer": no_effect("the optimizer is always ZeRO's own AdamW"),
    "zero_force_ds_cpu_optimizer": no_effect("the offloaded step is PyTorch's fused CPU AdamW, the same update"),
    "dataloader_drop_last": no_effect("the sampler always drops a last partial batch"),
}

# Sections whose keys are classified one by one: "section.key" -> classifier.
SECTION_KEYS: dict[str, Classifier] = {
    "fp16.enabled": to_flag("--fp16", "bool", wins=PRECISION),
    "fp16.loss_scale": _loss_scale,
    "fp16.initial_scale_power": _scale_power,
    "fp16.loss_scale_window": to_flag("--loss-scale-window", "count", wins=LOSS_SCALE),
    "fp16.hysteresis": to_flag("--hysteresis", "count", wins=LOSS_SCALE),
    "fp16.min_loss_scale": to_flag("--min-loss-scale", wins=LOSS_SCALE),
    "fp16.consecutive_hysteresis": only_if(lambda v: v is False, "the hysteresis refills when the scale grows, as "
                                           "DeepSpeed's default", "refilling the hysteresis after every good step "
                                           "is not implemented; it refills when the scale grows"),
    "fp16.auto_cast": no_effect("the inputs are token ids; the layers already run in fp16"),
    "fp16.fp16_master_weights_and_grads": only_if(lambda v: v is False, "fp32 master weights, as here",
                                                  "the master weights are always fp32 here"),
    "bf16.enabled": to_flag("--bf16", "bool", wins=PRECISION),
    "bf16.bf16_master_weights_and_grads": only_if(lambda v: v is False, "fp32 master weights, as here",
                                                  "the master weights are always fp32 here"),
    "bf16.bf16_optimizer_states": only_if(lambda v: v is False, "fp32 Adam moments, as here",
                                          "the Adam moments are always fp32 here"),
    "bf16.immediate_grad_update": no_effect("under bf16 gradients accumulate in fp32 already "
                                            "(--accumulate-allreduce-grads-in-fp32)"),
    "zero_optimization.stage": to_flag("--zero-stage", "count", wins=ZERO_STAGE),
    "zero_optimization.allgather_partitions": no_effect("the updated parameters are all-gathered either way; false "
                                                        "only swaps the all-gather for broadcasts"),
    "zero_optimization.allgather_bucket_size": to_flag("--allgather-bucket-size", "count", wins=ZERO),
    "zero_optimization.compute_grad_norm": no_effect("the norm is always computed (clipping and the logged "
                                                     "grad_norm need it)"),
    "zero_optimization.overlap_comm": to_flag("--overlap-comm", "bool", wins=ZERO),
    "zero_optimization.reduce_scatter": to_flag("--reduce-scatter", "bool", wins=ZERO),
    "zero_optimization.reduce_bucket_size": to_flag("--reduce-bucket-size", "count", wins=ZERO),
    "zero_optimization.contiguous_gradients": to_flag("--contiguous-gradients", "bool", wins=ZERO),
    "zero_optimization.load_from_fp32_weights": only_if(lambda v: v is True, "checkpoints restore the fp32 master",
                                                        "checkpoints always restore the fp32 master weights"),
    "zero_optimization.round_robin_gradients": no_effect("it orders gradient copies for CPU offload; "
                                                              "the update is the same in any order"),
    "zero_optimization.parameter_alignment": no_effect("a memory layout; every unit of the flat buffers is "
                                                       "aligned already"),
    "zero_optimization.offload_param": classify_offload_param,
    "zero_optimization.offload_optimizer": classify_offload_optimizer,
    "zero_optimization.cpu_offload": classify_cpu_offload,
    "zero_optimization.cpu_offload_params": classify_cpu_offload_params,
    "zero_optimization.cpu_offload_use_pin_memory": to_flag("--offload-pin-memory", "bool", wins=ZERO),
    "zero_optimization.stage3_max_live_parameters": to_flag("--stage3-max-live-parameters", "count", wins=ZERO),
    "zero_optimization.stage3_max_reuse_distance": no_effect("stage 3 frees a chunk after use and gathers it again; "
                                                             "there is no reuse window to size"),
    "zero_optimization.stage3_prefetch_bucket_size": to_flag("--stage3-prefetch-bucket-size", "count", wins=ZERO),
    "zero_optimization.stage3_param_persistence_threshold": to_flag("--stage3-param-persistence-threshold", "count", wins=ZERO),
    # ZeRO-Offload: DeepSpeed's engine takes it from the JSON (runtime/zero/config.py offload_optimizer,
    # cpu_offload); Megatron-DeepSpeed's --cpu-optimizer only picks the Adam class it hands over.
    "zero_optimization.sub_group_size": to_flag("--sub-group-size", "count", wins=ZERO),
    "zero_optimization.elastic_checkpoint": no_effect("checkpoints always load at another DP size and stage"),
    "zero_optimization.stage3_gather_16bit_weights_on_model_save": no_effect(
        "scripts/tools/convert_to_hf.py and scripts/tools/zero_to_fp32.py consolidate any checkpoint"),
    "zero_optimization.stage3_gather_fp16_weights_on_model_save": no_effect(
        "scripts/tools/convert_to_hf.py and scripts/tools/zero_to_fp32.py consolidate any checkpoint"),
    "zero_optimization.stage3_module_granularity_threshold": no_effect("stage 3 gathers one chunk per "
                                                                       "transformer block"),
    "zero_optimization.zero_hpz_partition_size": only_if(lambda v: v == 1, "1: no secondary partition",
                                                         "hpZ (ZeRO++) is not implemented: parameters are gathered "
                                                         "over the whole data-parallel group"),
    "zero_optimization.zero_quantized_weights": only_if(lambda v: v is False, "weights travel unquantized",
                                                        "ZeRO++ weight quantization is not implemented"),
    "zero_optimization.zero_quantized_gradients": only_if(lambda v: v is False, "gradients travel unquantized",
                                                          "ZeRO++ gradient quantization is not implemented"),
    "zero_optimization.mics_shard_size": only_if(lambda v: isinstance(v, int) and v <= 0, "MiCS off",
                                                 "MiCS is not implemented: ZeRO partitions over the whole "
                                                 "data-parallel group"),
    "zero_optimization.mics_hierarchical_params_gather": only_if(lambda v: v is False, "MiCS off",
                                                                 "MiCS is not implemented"),
    "zero_optimization.log_trace_cache_warnings": no_effect("there is no trace cache: stage 3 gathers by block"),
    "zero_optimization.ignore_unused_parameters": no_effect("every parameter of the GPT is used"),
    "zero_optimization.legacy_stage1": no_effect("there is one stage-1 implementation"),
    "zero_optimization.memory_efficient_linear": no_effect("a memory layout of linear layers' saved inputs"),
    "zero_optimization.use_multi_rank_bucket_allreduce": no_effect("a scheduling choice for the reductions"),
    "zero_optimization.save_muon_momentum_buffer_in_memory": no_effect("it applies to the Muon optimizer only"),
    "activation_checkpointing.partition_activations": to_flag("--partition-activations", "bool", wins=CHECKPOINTING),
    "activation_checkpointing.cpu_checkpointing": to_flag("--cpu-checkpointing", "bool", wins=CHECKPOINTING),
    "activation_checkpointing.contiguous_memory_optimization": to_flag("--contiguous-checkpointing", "bool", wins=CHECKPOINTING),
    "activation_checkpointing.number_checkpoints": to_flag("--number-checkpoints", "optional_count", wins=CHECKPOINTING),
    "activation_checkpointing.synchronize_checkpoint_boundary": to_flag("--synchronize-checkpoint-boundary", "bool", wins=CHECKPOINTING),
    "activation_checkpointing.profile": to_flag("--profile-checkpointing", "bool", wins=CHECKPOINTING),
    "checkpoint.tag_validation": no_effect("every rank agrees on the checkpoint before loading, always"),
    "checkpoint.load_universal": to_flag("--universal-checkpoint", "bool", wins=UNIVERSAL_CHECKPOINT),
    "checkpoint.use_node_local_storage": only_if(lambda v: v is False, "checkpoints go to --save",
                                                 "node-local checkpoints are not implemented: --save is one "
                                                 "directory every rank can reach"),
    "checkpoint.parallel_write": no_effect("each rank writes its own files already"),
    "data_types.grad_accum_dtype": classify_grad_accum_dtype,
}

# "bfloat16" is the name the bf16 section had before DeepSpeed renamed it.
SECTION_ALIASES = {"bfloat16": "bf16"}
SECTIONS = sorted({key.split(".")[0] for key in SECTION_KEYS})


def every_documented_key() -> list[str]:
    """The classified keys: the top-level ones and each section's (for the README table and tests)."""
    return sorted(TOP_LEVEL_KEYS) + sorted(SECTION_KEYS)


def nearest_key(key: str) -> Optional[str]:
    import difflib

    found = difflib.get_close_matches(key, every_documented_key(), n=1)
    return found[0] if found else None


# Rules and implied settings that are no one key's value: the batch identity DeepSpeed checks, and the
# block whose presence implies --checkpoint-activations (arguments/deepspeed/translation.py, _implied).
NOT_ONE_KEY: dict[str, Precedence] = {BATCH_IDENTITY: BATCH_IDENTITY_RULE, "activation_checkpointing": CHECKPOINT_BLOCK}


def _precedence_rows() -> dict[str, Precedence]:
    """Each key's precedence, as its row above declares it (`to_flag(..., wins=)`, `@wins({...})`)."""
    rows = dict(NOT_ONE_KEY)
    for prefix, table in (("", TOP_LEVEL_KEYS), ("", SECTION_KEYS), ("optimizer.params.", OPTIMIZER_PARAMS),
                          ("", {"zero_optimization": classify_legacy_zero})):
        for key, classify in table.items():
            declared = getattr(classify, "precedence", None)
            rows.update({prefix + key: declared} if isinstance(declared, Precedence) else declared or {})
    return rows


PRECEDENCE: dict[str, Precedence] = _precedence_rows()


def precedence_of(key: str) -> Precedence:
    """The precedence of a JSON key that sets a flag; a key without one is a bug here, not a user error."""
    if key not in PRECEDENCE:
        raise KeyError(f"{key}: a DeepSpeed JSON key that sets a flag declares no precedence in "
                       f"arguments/deepspeed/keys.py")
    return PRECEDENCE[key]
