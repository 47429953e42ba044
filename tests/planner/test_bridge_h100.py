"""Megatron-Bridge's published DGX-H100 pre-training rows (configs/benchmarks/bridge_h100.yaml) against the
layout model (planner/layout_perf.py) at Bridge's own layouts: the issue 67 acceptance table. Each row is priced
from its pretrain_gpt.py flags (planner/bridge_rows.py row_flags) read back as Megatron-LM runs them
(planner/layout_of_config.py), the path `python -m zero.plan dry-run --hardware h100-sxm --trainer megatron-lm` takes
(issue 80; one row through that command below).

Predicted and measured are compared in tokens/s/GPU: Bridge's TFLOP/s column uses its own FLOPs per token
(Megatron-LM's training.py num_floating_point_operations, which halves causal attention), ours counts the
full square (training/metrics.py), so TFLOP/s would compare the two FLOP counts as well as the time. The
predicted TFLOP/s in Bridge's accounting is the predicted tokens/s times the row's own FLOPs per token.
"""

import dataclasses
import json

import pytest

from planner.bridge_rows import MODEL_FLAGS, UNBUILDABLE, load_rows, row_counts, row_layout
from planner.layout_calibration import fit
from planner.layout_perf import load_layout_constants, predict_layout
from planner.perf_model import load_hardware

TOLERANCE = 0.20
# Each row the model misses by more than 20%, and the term that explains the miss (docs/planning.md).
KNOWN_MISSES = {
    # The EP overlap (combined 1F1B) at PP 2 x VP 12 (26.02, with DeepEP) and PP 2 x VP 24 (25.11 as printed; v0.2.0's
    # config says VP 12), EP 8 inside a node: measured 2.0-2.7x slower than predicted, some 13 ms a MoE layer and
    # micro-batch beyond the modelled kernels where every other MoE row leaves 4-7 ms (the moe_sync constant's 4.9).
    # Not priced: Bridge dropped this layout the next release (26.02.01: PP 1 x EP 16, 1.77x faster).
    ("Qwen3_30B_a3B", "26.02"): "ep overlap at PP 2 x VP 12-24", ("Qwen3_30B_a3B", "25.11"): "ep overlap at PP 2 x VP 12-24",
    # The EP overlap with DeepEP over 8 nodes hides less than the model lets it: priced with the all-to-alls exposed the
    # row is within 20% (test below); DeepEP's kernels take SMs from the compute they overlap (20 of 132 in 25.09:
    # Megatron-Core 0.14's moe_deepep_num_sms), not priced.
    ("DeepSeekV3", "25.09"): "ep overlap with DeepEP",
}
FITTED_ROWS = {("LLAMA3_8B", "25.11"), ("Qwen3_30B_a3B", "26.04.01")}  # planner/layout_calibration.py


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
            counts[key] = row_counts(row)
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
    for row, prediction in predictions:  # the fitted rows reproduce their figures
        if (row.model, row.release) in FITTED_ROWS:
            assert prediction.tokens_per_s_per_gpu == pytest.approx(row.tokens_per_s_per_gpu, rel=1e-3), row.label
    assert len(within) == 29 and len(predictions) == 32  # 29 of 32 (91%); 27 of the 30 not fitted (90%)


def test_a_row_through_zero_plan_dry_run_is_priced_as_in_the_table(predictions, capsys):
    """The fitted Llama 3 8B row's flags given to `zero.plan dry-run --hardware h100-sxm --trainer megatron-lm`: the
    step the table prices (the budget is raised to spare the levers' dry runs: the dry run plans the row's block
    recompute of 5 of 32 layers, and the rest keep their activations)."""
    from planner.bridge_rows import row_flags
    from planner.plan import main

    row, prediction = next((r, p) for r, p in predictions if (r.model, r.release) == ("LLAMA3_8B", "25.11"))
    assert main(["dry-run", "--hardware", "h100-sxm", "--trainer", "megatron-lm", "--world-size", "8",
                 "--gpu-memory", "1TB", "--json", *row_flags(row)]) == 0
    planned = json.loads(capsys.readouterr().out)
    assert planned["step_s"] == pytest.approx(prediction.step_s, rel=1e-12)
    assert planned["prediction"]["tokens_per_s_per_gpu"] == pytest.approx(row.tokens_per_s_per_gpu, rel=1e-3)


def test_the_calibration_file_holds_what_its_rows_fit():
    """configs/hardware/calibrations/h100-bridge.yaml is what planner/layout_calibration.py solves from its two rows
    today: a changed term moves the fit, and the file must be written again (`python -m planner.layout_calibration
    --write`) rather than left to stand for a model it no longer fits."""
    hardware = load_hardware("h100-sxm")
    stored, fitted = load_layout_constants(hardware.layout_calibration), fit(hardware)
    assert stored.gemm_efficiency == pytest.approx(fitted.gemm_efficiency, abs=1e-4)
    assert stored.moe_sync_s == pytest.approx(fitted.moe_sync_s, abs=1e-6)


def test_deepseek_v3_miss_is_the_ep_overlap(predictions):
    """DeepSeek-V3's miss is the EP overlap's: priced with its all-to-alls exposed, as without
    --overlap-moe-expert-parallel-comm, the row is within 20%."""
    row, prediction = next((r, p) for r, p in predictions if r.model == "DeepSeekV3")
    hardware = load_hardware("h100-sxm")
    counts = row_counts(row)
    exposed = predict_layout(counts, dataclasses.replace(row_layout(row, counts), ep_overlap=False), hardware,
                             load_layout_constants(hardware.layout_calibration), hardware.fp8_peak_flops)
    assert prediction.tokens_per_s_per_gpu / row.tokens_per_s_per_gpu > 1 + TOLERANCE
    assert abs(exposed.tokens_per_s_per_gpu / row.tokens_per_s_per_gpu - 1) <= TOLERANCE
