"""The layout model's two fitted constants (planner/layout_perf.py), each solved from ONE of Megatron-Bridge's
published DGX-H100 rows so that its predicted tokens/s equal its measured ones: gemm_efficiency from Llama 3 8B 25.11
(no model-parallel communication), moe_layer_sync_ms from Qwen3 30B-A3B 26.04.01. `--write` writes
configs/hardware/calibrations/h100-bridge.yaml."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Callable

from planner.bridge_rows import BridgeRow, load_rows, row_counts, row_layout
from planner.layout_perf import LayoutConstants, predict_layout
from planner.perf_model import CALIBRATION_DIR, Hardware, load_hardware

GEMM_ROW = ("LLAMA3_8B", "25.11")
MOE_SYNC_ROW = ("Qwen3_30B_a3B", "26.04.01")
CALIBRATION = CALIBRATION_DIR / "h100-bridge.yaml"


def find_row(model: str, release: str) -> BridgeRow:
    return next(row for row in load_rows() if (row.model, row.release) == (model, release))


def _predicted_tokens(row: BridgeRow, hardware: Hardware) -> Callable[[LayoutConstants], float]:
    counts = row_counts(row)
    layout = row_layout(row, counts)
    return lambda constants: predict_layout(counts, layout, hardware, constants,
                                            hardware.fp8_peak_flops).tokens_per_s_per_gpu


def fit_gemm_efficiency(hardware: Hardware) -> float:
    """The efficiency at which GEMM_ROW's predicted tokens/s equal its measured ones, by bisection."""
    row = find_row(*GEMM_ROW)
    predicted = _predicted_tokens(row, hardware)
    low, high = 0.05, 1.0
    for _ in range(60):
        middle = (low + high) / 2
        if predicted(LayoutConstants(middle, "fit")) < row.tokens_per_s_per_gpu:
            low = middle
        else:
            high = middle
    return (low + high) / 2


def fit_moe_layer_sync_s(hardware: Hardware, gemm_efficiency: float) -> float:
    """The per-MoE-layer sync time at which MOE_SYNC_ROW's predicted step equals its measured one (linear: solved
    exactly)."""
    row = find_row(*MOE_SYNC_ROW)
    predicted = _predicted_tokens(row, hardware)
    tokens_per_gpu = row.layout["global_batch_size"] * row.layout["seq_length"] / row.layout["gpus"]
    step = [tokens_per_gpu / predicted(LayoutConstants(gemm_efficiency, "fit", sync)) for sync in (0.0, 1e-3)]
    measured = tokens_per_gpu / row.tokens_per_s_per_gpu
    return (measured - step[0]) / (step[1] - step[0]) * 1e-3


def fit(hardware: Hardware) -> LayoutConstants:
    efficiency = fit_gemm_efficiency(hardware)
    return LayoutConstants(efficiency, "fit", fit_moe_layer_sync_s(hardware, efficiency))


def calibration_text(constants: LayoutConstants) -> str:
    return f"""# The layout model's fitted constants (planner/layout_perf.py), each fitted to ONE published run of
# Megatron-Bridge's (configs/benchmarks/bridge_h100.yaml) by planner/layout_calibration.py, which wrote this file
# (`python -m planner.layout_calibration --write`); every other Bridge row is a prediction
# (tests/planner/test_bridge_h100.py).
#
# gemm_efficiency: Llama 3 8B, 8 x H100, FP8 current scaling, GBS 128, MBS 1, seq 8192, release 25.11, 14,451
# tokens/s/GPU: the fraction of the dense peak (989 BF16 / 1979 FP8 TFLOP/s) that Transformer Engine's GEMMs and fused
# attention reach end to end in that run, once the elementwise kernels' HBM time is taken out.
gemm_efficiency: {constants.gemm_efficiency:.4f}
# moe_layer_sync_ms: Qwen3 30B-A3B, 16 x H100, FP8, PP 1, EP 16 (HybridEP), MBS 1, GBS 1024, seq 4096, release
# 26.04.01, 8,960 tokens/s/GPU: the time the device waits at each MoE layer's forward and micro-batch beyond the
# modelled kernels and all-to-alls (the dispatcher's host sync: planner/layout_perf.py's moe_sync term). It also
# takes up whatever else that row's model misses.
moe_layer_sync_ms: {constants.moe_sync_s * 1e3:.3f}
"""


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m planner.layout_calibration", description=__doc__.split("\n")[0])
    parser.add_argument("--hardware", default="h100-sxm")
    parser.add_argument("--write", action="store_true", help=f"write {CALIBRATION}")
    args = parser.parse_args(argv)
    constants = fit(load_hardware(args.hardware))
    print(f"gemm_efficiency {constants.gemm_efficiency:.4f} ({' '.join(GEMM_ROW)}); "
          f"moe_layer_sync_ms {constants.moe_sync_s * 1e3:.3f} ({' '.join(MOE_SYNC_ROW)})")
    if args.write:
        Path(CALIBRATION).write_text(calibration_text(constants), encoding="utf-8")
        print(f"wrote {CALIBRATION}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
