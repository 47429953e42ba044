"""A DeepSpeed checkpoint as a `GlobalStateSource`: every tensor under our name at our TP 1 layout, read a region at a
time from ZeRO 1/2, ZeRO 3 or universal files, with the iteration, samples, schedule position, Adam step and loss scaler
where the run recorded them.
"""

from __future__ import annotations

import argparse
from typing import Optional

import torch

from base.errors import CheckpointError
from checkpoint.deepspeed.families import Traced, family_map
from checkpoint.deepspeed.files import (
    DeepSpeedCheckpoint,
    DynamicLossScaler,
    LossScaler,
    ZeroStageEnum,
    load_pt,
    model_state_files,
    pickle_bytes,
)
from checkpoint.deepspeed.names import (
    MEGATRON_DEEPSPEED,
    MEGATRON_DEEPSPEED_PIPE,
    TRANSFORMERS,
    Attention,
    Mapped,
    megatron_deepspeed_map,
    model_family,
)
from checkpoint.deepspeed.stores import UniversalStore, Zero3Store, ZeroStore, optimizer_files, read_region
from checkpoint.global_state import GlobalStateSource, GlobalTensorInfo, SourceProgress, megatron_rows_multiple

OUR_KEYS = {"master": "fp32", "exp_avg": "exp_avg", "exp_avg_sq": "exp_avg_sq"}
MEGATRON_SCHEDULER_KEYS = ("max_lr", "min_lr", "num_steps", "lr_decay_style", "lr_decay_steps", "lr_warmup_steps")


def client_args(model_states: dict) -> Optional[argparse.Namespace]:
    """Megatron-DeepSpeed's args (None for a plain DeepSpeed run)."""
    args = model_states.get("args")
    return args if isinstance(args, argparse.Namespace) else None


def good_steps(cur_iter: int, last_overflow_iter: int, window: int) -> int:
    """Our scaler's good-step count that makes it grow at the update DeepSpeed's update_scale would (they differ by one
    after the next overflow)."""
    window = max(1, int(window))
    multiple = max(1, -(-(cur_iter - last_overflow_iter - 1) // window))
    updates_to_growth = last_overflow_iter + 1 + multiple * window - cur_iter + 1
    return window - updates_to_growth


def our_loss_scaler(scaler) -> tuple[Optional[str], Optional[dict]]:
    """(our scaler's type, its state) for DeepSpeed's."""
    fields = vars(scaler) if isinstance(scaler, (LossScaler, DynamicLossScaler)) else {}
    if isinstance(scaler, LossScaler) and "cur_scale" in fields:
        return "LossScaler", {"scale": float(fields["cur_scale"])}
    if isinstance(scaler, DynamicLossScaler) and {"cur_scale", "cur_iter", "last_overflow_iter",
                                                  "scale_window", "cur_hysteresis"} <= set(fields):
        return "DynamicLossScaler", {"scale": float(fields["cur_scale"]),
                                     "good_steps": good_steps(fields["cur_iter"], fields["last_overflow_iter"],
                                                              fields["scale_window"]),
                                     "hysteresis_left": int(fields["cur_hysteresis"])}
    return None, None


class DeepSpeedSource(GlobalStateSource):
    """A DeepSpeed tag folder as whole tensors by our names. `attention` lays out Megatron-DeepSpeed's fused QKV rows;
    `model` maps a transformers model's parameters."""

    def __init__(self, checkpoint: DeepSpeedCheckpoint, attention: Attention, model=None) -> None:
        self.checkpoint, self.path = checkpoint, checkpoint.path
        files = model_state_files(checkpoint.path)
        if not files:
            raise CheckpointError(f"{checkpoint.path}: no DeepSpeed model states file (*_model_states.pt)")
        self.model_states = load_pt(files[0])
        if not isinstance(self.model_states, dict):
            raise CheckpointError(f"{files[0]}: not a DeepSpeed model states file (not a dict)")
        if self.model_states.get("mp_world_size", 1) != 1 and not checkpoint.universal:
            raise CheckpointError(f"{checkpoint.path}: saved at a model-parallel size of "
                                  f"{self.model_states['mp_world_size']}; convert it with deepspeed/checkpoint/"
                                  f"ds_to_universal.py and load it with --universal-checkpoint")
        self.args = client_args(self.model_states)
        if checkpoint.universal:
            self.store = UniversalStore(checkpoint.path, self.model_states)
            self.stage, self.optimizer_state = None, self._universal_optimizer_state()
        else:
            self.stage = self._zero_stage()
            self.store = (Zero3Store if self.stage == ZeroStageEnum.weights else ZeroStore)(checkpoint.path,
                                                                                          self.model_states)
            self.optimizer_state = self.store.optimizer_state(0)
        self.family = model_family(self.store.shapes)
        self.mapping = self._map(attention, model)
        self.format_name = (f"DeepSpeed {'universal' if checkpoint.universal else f'ZeRO-{self.stage}'}, "
                            f"{self.family}")
        self.header_bytes = pickle_bytes(files[0])

    def _zero_stage(self) -> int:
        """The stage DeepSpeed's optimizer recorded (rank 0's optimizer file); a checkpoint without ZeRO has none."""
        files = optimizer_files(self.path)
        state = load_pt(files[0]) if files else None
        stage = (state or {}).get("optimizer_state_dict", {}).get("zero_stage") if isinstance(state, dict) else None
        if stage not in (ZeroStageEnum.optimizer_states, ZeroStageEnum.gradients, ZeroStageEnum.weights):
            raise CheckpointError(f"{self.path}: {'no optimizer files' if not files else f'ZeRO stage {stage}'}; "
                                  f"DeepSpeed checkpoints of ZeRO stages 1, 2 and 3 are read here")
        return int(stage)

    def _universal_optimizer_state(self) -> Optional[dict]:
        path = self.checkpoint.path / "zero" / "optimizer_state.pt"
        if not path.is_file():
            return None
        state = load_pt(path)
        return state if isinstance(state, dict) else None

    def _map(self, attention: Attention, model) -> dict[str, Mapped | Traced]:
        shapes = self.store.shapes
        if self.family == TRANSFORMERS:
            return self._map_transformers(model)
        if self.family not in (MEGATRON_DEEPSPEED, MEGATRON_DEEPSPEED_PIPE):
            shown = ", ".join(sorted(shapes)[:4])
            raise CheckpointError(f"{self.path}: its parameters ({shown}, ...) are not a Megatron-DeepSpeed GPT's "
                                  f"(GPTModel's language_model.*, GPTModelPipe's N.self_attention.*) nor a "
                                  f"transformers CausalLM's (transformer.*, model.*): this reader knows those")
        args = self.args
        mapped, unknown = megatron_deepspeed_map(
            shapes, attention, block_qkv=args is not None and hasattr(args, "ds_sequence_parallel_fpdt"),
            tensor_parallel=getattr(args, "tensor_model_parallel_size", 1) if self.checkpoint.universal else 1,
            swiglu=bool(getattr(args, "swiglu", False)))
        if unknown:
            raise CheckpointError(f"{self.path}: {len(unknown)} tensors of its {self.family} have no counterpart "
                                  f"here ({', '.join(sorted(unknown)[:4])}{', ...' if len(unknown) > 4 else ''})")
        return mapped

    def _map_transformers(self, model) -> dict[str, Traced]:
        """A transformers model's parameters through its family's mapping, less those DeepSpeed records as shared (a
        tied lm_head)."""
        if model is None:
            raise CheckpointError(f"{self.path}: a transformers model's parameters are mapped for the run's model")
        shared = set(self.model_states.get("shared_params") or {})
        try:
            model_type, mapped = family_map({n: s for n, s in self.store.shapes.items() if n not in shared}, model)
        except CheckpointError as error:
            raise CheckpointError(f"{self.path}: its transformers model's parameters fit no family read here "
                                  f"for this run's model ({error})") from None
        self.family = f"transformers {model_type}"
        return mapped

    @property
    def bytes_read(self) -> int:
        return self.store.bytes_read + self.header_bytes

    def keys(self) -> tuple[str, ...]:
        if isinstance(self.store, UniversalStore):
            held = [key for key in ("exp_avg", "exp_avg_sq")
                    if all(key in self.store.keys_of.get(source, ()) for m in self.mapping.values()
                           for source in m.sources())]
            return ("master", *held)
        return tuple(OUR_KEYS)

    def tensors(self, key: str) -> dict[str, GlobalTensorInfo]:
        if key not in self.keys():
            return {}
        multiple = megatron_rows_multiple(self.args)
        return {name: GlobalTensorInfo(mapped.shape_in(self.store.shapes), torch.float32, rows_multiple=multiple)
                for name, mapped in self.mapping.items()}

    def read(self, key: str, name: str, region: tuple[slice, ...]):
        state = OUR_KEYS[key]
        return self.mapping[name].read(region, lambda source, source_region, view=None:
                                       read_region(self.store, state, source, source_region, view))

    def progress(self) -> SourceProgress:
        states, args = self.model_states, self.args
        iteration = states.get("iteration", states.get("global_steps"))
        consumed = getattr(args, "consumed_train_samples", None) if args is not None else states.get("global_samples")
        if not isinstance(iteration, int):
            raise CheckpointError(f"{self.path}: its model states file records no iteration (Megatron-DeepSpeed's "
                                  f"'iteration' or DeepSpeed's 'global_steps')")
        scheduler = self.megatron_scheduler()
        scaler_type, scaler_state = our_loss_scaler((self.optimizer_state or {}).get("loss_scaler"))
        step = self.store.step()
        return SourceProgress(iteration=iteration, consumed_samples=consumed,
                              schedule_samples=int(scheduler["num_steps"]) if scheduler else consumed,
                              optimizer_step=step, loss_scaler_state=scaler_state,
                              extra={"optimizer": "adam", "loss_scaler_type": scaler_type})

    def megatron_scheduler(self) -> Optional[dict]:
        """Megatron-DeepSpeed's OptimizerParamScheduler state, when DeepSpeed saved that as its lr_scheduler."""
        state = self.model_states.get("lr_scheduler")
        return state if isinstance(state, dict) and all(key in state for key in MEGATRON_SCHEDULER_KEYS) else None

    def not_carried(self) -> list[str]:
        states, notes = self.model_states, []
        scheduler = states.get("lr_scheduler")
        if scheduler is not None and self.megatron_scheduler() is None:
            notes.append(f"DeepSpeed's lr_scheduler state ({', '.join(sorted(scheduler)[:4])}): this run's --lr flags "
                         f"schedule the rate, continued at the consumed samples")
        for key, what in (("data_sampler", "the curriculum data sampler's state"),
                          ("random_ltd", "random-LTD's state")):
            if states.get(key) is not None:
                notes.append(what)
        info = states.get("universal_checkpoint_info") or {}
        padded, original = info.get("padded_vocab_size"), info.get("original_vocab_size")
        if isinstance(padded, int) and isinstance(original, int) and padded > original \
                and not self.checkpoint.universal:
            notes.append(f"the word embedding's {padded - original} vocabulary padding rows (Megatron-DeepSpeed's "
                         f"softmax takes them in, this project's leaves them out)")
        if states.get("skipped_steps"):
            notes.append(f"DeepSpeed's count of {states['skipped_steps']} skipped (overflowed) steps")
        return notes

    def describe(self) -> str:
        """One line for the start: what was found."""
        progress = self.progress()
        return (f"> {self.path}: {self.format_name} at iteration {progress.iteration} ({progress.consumed_samples} "
                f"samples consumed, Adam step {progress.optimizer_step}), {len(self.mapping)} tensors")


def open_deepspeed_source(checkpoint: DeepSpeedCheckpoint, model_config) -> DeepSpeedSource:
    """The source for this run's model (`model_config`: its heads, key/value heads and head size)."""
    heads = model_config.num_attention_heads
    return DeepSpeedSource(checkpoint, Attention(heads, model_config.attention.num_query_groups or heads,
                                                 model_config.head_dim), model_config)
