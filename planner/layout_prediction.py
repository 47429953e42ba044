"""The step time `python -m zero.plan dry-run --hardware P` prints: the layout model's for the launch's own flags read
back as a Layout, the same function the layout search ranks with. A profile without a layout calibration (dgx2-v100,
cpu-2core) keeps the dry-run-based model (planner/perf_model.py)."""

from __future__ import annotations

from typing import Any, Mapping, Optional

from arguments.config import ConfigError
from arguments.training_config import TrainingConfig
from gpt.model_config import ModelConfig
from parallel.config import ParallelismConfig
from planner.layout_of_config import PRETRAIN_GPT, layout_of_config, precision_of
from planner.layout_perf import (
    Layout,
    LayoutConstants,
    LayoutPrediction,
    load_layout_constants,
    model_counts,
    predict_layout,
)
from planner.perf_model import Hardware
from zero.config import ActivationCheckpointConfig, ZeroConfig


def predict_config(model: ModelConfig, parallel: ParallelismConfig, training: TrainingConfig, zero: ZeroConfig,
                   activations: ActivationCheckpointConfig, gpus: int, vocab: int, hardware: Hardware,
                   trainer: str = PRETRAIN_GPT, megatron_flags: Optional[Mapping[str, Any]] = None,
                   ) -> tuple[Layout, LayoutPrediction, LayoutConstants]:
    """`config` on `gpus` GPUs of `hardware` as `trainer` runs it: its Layout, the prediction and the constants."""
    if precision_of(model, training) is None and hardware.precision != "fp32":
        raise ConfigError(f"an fp32 run on {hardware.name}, whose runs are {hardware.precision}: the layout model "
                          f"prices 16-bit and FP8 training there (--bf16, --fp16, --fp8-format)", flags=("--bf16",))
    constants = load_layout_constants(hardware.layout_calibration)
    counts = model_counts(model, vocab)
    layout = layout_of_config(model, parallel, training, zero, activations, gpus, counts, trainer, megatron_flags)
    return layout, predict_layout(counts, layout, hardware, constants, hardware.fp8_peak_flops), constants


def prediction_json(prediction: LayoutPrediction, trainer: str) -> dict:
    return {"step_s": prediction.step_s, "tflops_per_gpu": prediction.model_tflops_per_gpu,
            "prediction": {**prediction.to_json(), "model": "layout", "trainer": trainer}}


def format_layout_prediction(prediction: LayoutPrediction, hardware: Hardware, constants: LayoutConstants,
                             trainer: str) -> str:
    lines = [f"predicted on {hardware.name} by the layout model (planner/layout_perf.py, the search's; constants "
             f"from {constants.source}: GEMM efficiency {constants.gemm_efficiency:.4f}, MoE layer sync "
             f"{constants.moe_sync_s * 1e3:.3f} ms) for the flags as {trainer} runs them:",
             f"  step {prediction.step_s * 1e3:,.1f} ms"]
    for name, seconds in prediction.terms.items():
        if seconds:
            lines.append(f"    {name:<18} {seconds * 1e3:>12,.1f} ms  {seconds / prediction.step_s:6.1%}")
    lines.append(f"  {prediction.model_tflops_per_gpu:.1f} TFLOP/s per GPU (model FLOPs, no recompute counted), "
                 f"{prediction.tokens_per_s_per_gpu:,.0f} tokens/s per GPU")
    return "\n".join(lines)
