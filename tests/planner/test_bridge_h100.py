"""Megatron-Bridge's published DGX-H100 pre-training rows (configs/benchmarks/bridge_h100.yaml) against the
layout model (planner/layout_perf.py) at Bridge's own layouts: the issue 67 acceptance table.

Predicted and measured are compared in tokens/s/GPU: Bridge's TFLOP/s column uses its own FLOPs per token
(Megatron-LM's training.py num_floating_point_operations, which halves causal attention), ours counts the
full square (training/metrics.py), so TFLOP/s would compare the two FLOP counts as well as the time. The
predicted TFLOP/s in Bridge's accounting is the predicted tokens/s times the row's own FLOPs per token.
"""

import pytest

from planner.bridge_rows import MODEL_FLAGS, UNBUILDABLE, load_rows, row_config, row_layout
from planner.layout_perf import load_layout_constants, model_counts, predict_layout
from planner.perf_model import load_hardware
from planner.vocabulary import launch_vocab

TOLERANCE = 0.20
# Each row the model misses by more than 20%, and the term that explains the miss (docs/planning.md).
KNOWN_MISSES = {
    # GPT-OSS, predicted 1.30-1.58x too fast (1.55-1.98x before its recipe's even split left the output layer on
    # the last stage, priced now): the rest unexplained. Not its 128-token windows (priced: they make the
    # prediction faster), and not plainly its attention sinks: TE >= 2.8 with cuDNN >= 9.13.1 runs them fused, and
    # Bridge's figure barely moves from 25.11 (TE 2.9) to 26.04.01.
    ("GPT OSS 120B", "26.04.01"): "unexplained", ("GPT OSS 120B", "26.04"): "unexplained",
    ("GPT OSS 120B", "26.02.01"): "unexplained", ("GPT OSS 120B", "26.02"): "unexplained",
    ("GPT OSS 120B", "25.11"): "unexplained",
    # Qwen3 30B-A3B at PP 2 x VP 12 with EP 8 inside one node, 1.80-3.68x too fast: unexplained. Not a
    # per-layer overhead: each rank runs as many layer-micro-batches as at EP 16, whose rows are within 11%.
    # (Bridge's own 26.02 and 26.02.01 figures for this same layout differ by 1.76x.)
    ("Qwen3_30B_a3B", "26.02.01"): "unexplained", ("Qwen3_30B_a3B", "26.02"): "unexplained",
    ("Qwen3_30B_a3B", "25.11"): "unexplained", ("Qwen3_30B_a3B", "25.09"): "unexplained",
    # Qwen3 235B-A22B in 25.09 was token-dropping with GBS 2048 and ran 1.3x slower than 25.11's dropless run
    # of the same layout, which the model predicts; capacity factor 1.0 under force-balanced routing pads
    # nothing, so the difference is the release's, not a term of the layout.
    ("Qwen3_235B_a22B", "25.09"): "release (not capacity padding)",
}


@pytest.fixture(scope="module")
def predictions():
    hardware = load_hardware("h100-sxm")
    constants = load_layout_constants(hardware.layout_calibration)
    counts, found = {}, []
    for row in load_rows():
        if row.model in UNBUILDABLE:
            continue
        key = (row.model, row.layout["seq_length"])
        if key not in counts:
            config = row_config(row)
            counts[key] = model_counts(config.model, launch_vocab(config)[0])
        prediction = predict_layout(counts[key], row_layout(row, counts[key]), hardware, constants,
                                    hardware.fp8_peak_flops)
        found.append((row, prediction))
    return found


def test_the_file_holds_every_h100_row_and_each_layout_divides_its_batch():
    rows = load_rows()
    assert len(rows) == 36  # every DGX-H100 pre-training row of Bridge's summary and archive (26.06 .. 25.09)
    for row in rows:
        layout = row.layout
        assert row.model in MODEL_FLAGS or row.model in UNBUILDABLE, row.model
        data_parallel = layout["gpus"] // (layout["tp"] * layout["pp"] * layout["cp"])
        assert layout["gpus"] == data_parallel * layout["tp"] * layout["pp"] * layout["cp"], row.label
        assert layout["global_batch_size"] % (layout["micro_batch_size"] * data_parallel) == 0, row.label


def test_bridge_layouts_predicted_within_20_percent_or_their_miss_named(predictions, capsys):
    lines, within, misses = [], [], set()
    for row, prediction in predictions:
        ratio = prediction.tokens_per_s_per_gpu / row.tokens_per_s_per_gpu
        bridge_tflops = prediction.tokens_per_s_per_gpu * row.model_tflops_per_gpu / row.tokens_per_s_per_gpu
        largest = max(prediction.terms, key=prediction.terms.get)
        lines.append(f"{row.label:<48} measured {row.model_tflops_per_gpu:5.0f} predicted {bridge_tflops:5.0f} "
                     f"TFLOP/s ({ratio:5.2f}x; largest term {largest})")
        if abs(ratio - 1) <= TOLERANCE:
            within.append(row)
        else:
            misses.add((row.model, row.release))
    with capsys.disabled():
        print("\n" + "\n".join(lines))
    assert misses == set(KNOWN_MISSES), "a row moved in or out of the 20% band: update KNOWN_MISSES and docs/planning.md"
    calibrated = next(p for r, p in predictions if r.model == "LLAMA3_8B" and r.release == "25.11")
    assert calibrated.tokens_per_s_per_gpu == pytest.approx(14451, rel=1e-3)  # the one fitted row
    assert len(within) == 22 and len(predictions) == 32  # 22 of 32 (69%): short of the 80% target
