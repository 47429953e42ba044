"""The model-state memory model (closed forms, the paper's Table 1), the live storage walk, and the
analytic activation model (checkpointed inputs, Korthikanti et al.'s per-layer estimate)."""

import json

import pytest
import torch

from zero.memory import (
    checkpointed_input_bytes,
    format_bytes,
    format_memory_line,
    measure_tensor_bytes,
    memory_record,
    paper_model_state_gb,
    predict_model_state_bytes,
    predict_saved_activation_bytes,
    within_tolerance,
)

PSI = 1200  # divisible by 1, 2, 4 so the closed forms need no rounding


# Closed forms per rank, written out independently of the module's bytes-per-element table.
def bf16_closed_form(stage, psi, n):
    return {0: 16 * psi, 1: 4 * psi + 12 * psi // n, 2: 2 * psi + 14 * psi // n, 3: 16 * psi // n}[stage]


def fp32_closed_form(stage, psi, n):
    return {0: 20 * psi, 1: 8 * psi + 12 * psi // n, 2: 4 * psi + 16 * psi // n, 3: 20 * psi // n}[stage]


@pytest.mark.parametrize("n", [1, 2, 4])
@pytest.mark.parametrize("stage", [0, 1, 2, 3])
@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_16_bit_totals_match_closed_forms(precision, stage, n):
    predicted = predict_model_state_bytes(PSI, stage, n, precision)
    assert predicted["total"] == bf16_closed_form(stage, PSI, n)
    assert predicted["total"] == sum(predicted[key] for key in
                                     ("parameters", "gradients", "master_weights", "optimizer_states"))


@pytest.mark.parametrize("n", [1, 2, 4])
@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_fp32_totals_match_closed_forms(stage, n):
    assert predict_model_state_bytes(PSI, stage, n, "fp32")["total"] == fp32_closed_form(stage, PSI, n)


def test_bf16_breakdown_partitions_the_right_states_per_stage():
    n = 4
    expected = {  # (parameters, gradients, master_weights, optimizer_states)
        0: (2 * PSI, 2 * PSI, 4 * PSI, 8 * PSI),
        1: (2 * PSI, 2 * PSI, 4 * PSI // n, 8 * PSI // n),
        2: (2 * PSI, 2 * PSI // n, 4 * PSI // n, 8 * PSI // n),
        3: (2 * PSI // n, 2 * PSI // n, 4 * PSI // n, 8 * PSI // n),
    }
    for stage, (params, grads, master, adam) in expected.items():
        predicted = predict_model_state_bytes(PSI, stage, n, "bf16")
        assert (predicted["parameters"], predicted["gradients"], predicted["master_weights"],
                predicted["optimizer_states"]) == (params, grads, master, adam), stage


def test_partitioned_states_round_each_rank_shard_up():
    # 1001 elements over 4 ranks: each rank's padded shard holds 251 elements.
    predicted = predict_model_state_bytes(1001, 3, 4, "bf16")
    assert predicted == {"parameters": 502, "gradients": 502, "master_weights": 1004,
                         "optimizer_states": 2008, "total": 4016}
    assert predict_model_state_bytes(1001, 0, 4, "bf16")["total"] == 16 * 1001


@pytest.mark.parametrize("precision", ["fp8", "float32", "BF16", None])
def test_invalid_precision_names_the_choices(precision):
    with pytest.raises(ValueError, match="precision must be one of .*bf16.*fp16.*fp32"):
        predict_model_state_bytes(PSI, 1, 2, precision)


@pytest.mark.parametrize("stage", [-1, 4])
def test_invalid_stage_is_rejected(stage):
    with pytest.raises(ValueError, match="ZeRO stage must be one of"):
        predict_model_state_bytes(PSI, stage, 2, "bf16")
    with pytest.raises(ValueError, match="ZeRO stage must be one of"):
        paper_model_state_gb(7.5e9, 64, stage)


def test_invalid_sizes_are_rejected():
    with pytest.raises(ValueError, match="data_parallel_size"):
        predict_model_state_bytes(PSI, 1, 0, "bf16")
    with pytest.raises(ValueError, match="num_parameters"):
        predict_model_state_bytes(-1, 1, 2, "bf16")


# ZeRO paper, Table 1: per-device model-state memory in GB for (model, N_d) under P_os, P_os+g,
# P_os+g+p, as printed. Large entries are printed without decimals (4187.5 appears as 4187), so each
# cell is checked to within one unit of its last printed digit.
TABLE_1 = {
    7.5e9: {1: ("120", "120", "120"), 4: ("52.5", "41.3", "30"), 16: ("35.6", "21.6", "7.5"),
            64: ("31.4", "16.6", "1.88"), 256: ("30.4", "15.4", "0.47"), 1024: ("30.1", "15.1", "0.12")},
    128e9: {1: ("2048", "2048", "2048"), 4: ("896", "704", "512"), 16: ("608", "368", "128"),
            64: ("536", "284", "32"), 256: ("518", "263", "8"), 1024: ("513", "257", "2")},
    1e12: {1: ("16000", "16000", "16000"), 4: ("7000", "5500", "4000"), 16: ("4750", "2875", "1000"),
           64: ("4187", "2218", "250"), 256: ("4046", "2054", "62.5"), 1024: ("4011", "2013", "15.6")},
}


def last_digit_unit(printed):
    return 10.0 ** -len(printed.split(".")[1]) if "." in printed else 1.0


@pytest.mark.parametrize("psi,n,stage,printed", [
    (psi, n, stage, cells[stage - 1])
    for psi, rows in TABLE_1.items() for n, cells in rows.items() for stage in (1, 2, 3)])
def test_paper_formula_reproduces_table_1(psi, n, stage, printed):
    assert abs(paper_model_state_gb(psi, n, stage) - float(printed)) < last_digit_unit(printed)


def test_paper_baseline_is_the_same_for_every_dp_degree():
    # "Without ZeRO, the memory consumption is equal to the first row in the table."
    for n in (1, 4, 64, 1024):
        assert paper_model_state_gb(7.5e9, n, 0) == pytest.approx(120.0)


def test_paper_formula_takes_k():
    # K only scales the optimizer-state term: P_os at N_d=4 with K=4 is 4Ψ + Ψ.
    assert paper_model_state_gb(1e9, 4, 1, k=4) == pytest.approx(5.0)


def test_paper_formula_agrees_with_our_bf16_prediction_for_divisible_sizes():
    for stage in (0, 1, 2, 3):
        ours = predict_model_state_bytes(64_000_000, stage, 64, "bf16")["total"]
        assert paper_model_state_gb(64_000_000, 64, stage) * 1e9 == pytest.approx(ours)


def test_views_of_one_flat_buffer_count_once_at_full_storage_size():
    flat = torch.zeros(100, dtype=torch.float32)
    measured = measure_tensor_bytes({"parameters": [flat[:10], flat[10:30], flat[30:60].view(5, 6)]})
    assert measured["parameters"] == 400
    assert measured["total"] == 400


def test_a_small_view_counts_its_whole_storage():
    flat = torch.zeros(100, dtype=torch.float32)
    assert measure_tensor_bytes({"master_weights": [flat[90:]]})["master_weights"] == 400


def test_separate_storages_each_count():
    measured = measure_tensor_bytes({"gradients": [torch.zeros(10), torch.zeros(10)]})
    assert measured["gradients"] == 80


def test_dtypes_set_the_bytes():
    measured = measure_tensor_bytes({
        "parameters": [torch.zeros(10, dtype=torch.bfloat16)],
        "gradients": [torch.zeros(10, dtype=torch.float16)],
        "master_weights": [torch.zeros(10, dtype=torch.float32)],
        "optimizer_states": [torch.zeros(10, dtype=torch.float32), torch.zeros(10, dtype=torch.float32)],
    })
    assert measured == {"parameters": 20, "gradients": 20, "master_weights": 40,
                        "optimizer_states": 80, "total": 160}


def test_a_storage_is_not_counted_again_in_a_later_category():
    flat = torch.zeros(50, dtype=torch.bfloat16)
    measured = measure_tensor_bytes({"parameters": [flat[:25]], "gradients": [flat[25:]]})
    assert measured["parameters"] == 100
    assert measured["gradients"] == 0
    assert measured["total"] == 100


def test_shared_storage_goes_to_the_model_state_even_if_buffers_are_listed_first():
    bucket = torch.zeros(8, dtype=torch.float32)
    measured = measure_tensor_bytes({"buffers": [bucket], "gradients": [bucket[:4]]})
    assert measured["gradients"] == 32
    assert measured["buffers"] == 0


def test_buffers_are_reported_but_not_in_the_total():
    measured = measure_tensor_bytes({"parameters": [torch.zeros(4)], "buffers": [torch.zeros(100)]})
    assert measured["buffers"] == 400
    assert measured["total"] == 16


def test_none_meta_and_empty_tensors_count_nothing():
    measured = measure_tensor_bytes({
        "parameters": [None, torch.zeros(3), torch.empty(1000, device="meta")],
        "gradients": [None, torch.empty(0), torch.empty(0, dtype=torch.bfloat16)],
    })
    assert measured["parameters"] == 12
    assert measured["gradients"] == 0
    assert measured["master_weights"] == 0
    assert "buffers" not in measured


def test_unknown_category_is_rejected():
    with pytest.raises(ValueError, match="unknown memory categories.*'grads'"):
        measure_tensor_bytes({"grads": [torch.zeros(1)]})


def test_measurement_of_a_stage_1_layout_matches_the_prediction():
    # A hand-built rank-0 stage-1 layout (N=4): full bf16 params and grads in flat buffers, a quarter
    # of the fp32 states. Measured by storage, independently of the bytes-per-element table.
    psi, n = 1000, 4
    flat_params = torch.zeros(psi, dtype=torch.bfloat16)
    flat_grads = torch.zeros(psi, dtype=torch.bfloat16)
    master = torch.zeros(psi // n, dtype=torch.float32)
    measured = measure_tensor_bytes({
        "parameters": [flat_params[:600], flat_params[600:]],
        "gradients": [flat_grads[:600], flat_grads[600:]],
        "master_weights": [master],
        "optimizer_states": [torch.zeros_like(master), torch.zeros_like(master)],
    })
    predicted = predict_model_state_bytes(psi, 1, n, "bf16")
    assert {key: measured[key] for key in predicted} == predicted


def test_within_tolerance_boundaries():
    assert within_tolerance(1020, 1000, 0)
    assert within_tolerance(980, 1000, 0)
    assert not within_tolerance(1021, 1000, 0)
    assert not within_tolerance(979, 1000, 0)
    assert within_tolerance(1021, 1000, 1)
    assert within_tolerance(1100, 1000, 0, rel=0.1)
    with pytest.raises(ValueError):
        within_tolerance(1000, 1000, -1)


@pytest.mark.parametrize("num_bytes,text", [
    (0, "0 B"), (512, "512 B"), (1536, "1.50 KiB"), (3 * 2**20, "3.00 MiB"), (5 * 2**30, "5.00 GiB"),
    (2 * 2**40, "2.00 TiB")])
def test_format_bytes(num_bytes, text):
    assert format_bytes(num_bytes) == text


def make_record(with_buffers=True):
    measured = {"parameters": 2 * 2**20, "gradients": 2**20, "master_weights": 3 * 2**20,
                "optimizer_states": 6 * 2**20, "total": 12 * 2**20}
    if with_buffers:
        measured["buffers"] = 2**20
    predicted = {"parameters": 2 * 2**20, "gradients": 2**20, "master_weights": 3 * 2**20,
                 "optimizer_states": 6 * 2**20, "total": 12 * 2**20 - 2**17}
    return memory_record(measured, predicted, rank=3, extra={"iteration": 7, "zero_stage": 2})


def test_memory_record_is_flat_json_and_carries_extra():
    record = make_record()
    assert record["rank"] == 3 and record["iteration"] == 7 and record["zero_stage"] == 2
    assert record["measured_total_bytes"] == 12 * 2**20
    assert record["predicted_total_bytes"] == 12 * 2**20 - 2**17
    assert record["measured_buffers_bytes"] == 2**20
    assert record["relative_difference"] == pytest.approx(2**17 / (12 * 2**20 - 2**17))
    assert json.loads(json.dumps(record)) == record
    assert all(not isinstance(value, (dict, list)) for value in record.values())
    assert "measured_buffers_bytes" not in make_record(with_buffers=False)


def test_memory_record_with_nothing_predicted_has_no_ratio():
    zeros = {"parameters": 0, "gradients": 0, "master_weights": 0, "optimizer_states": 0, "total": 0}
    record = memory_record(zeros, zeros, rank=0, extra={})
    assert record["relative_difference"] is None
    assert "(n/a)" in format_memory_line(record)


def test_format_memory_line_shows_the_numbers_on_one_line():
    line = format_memory_line(make_record())
    assert "\n" not in line
    assert line.startswith("rank 3 model states: measured 12.00 MiB")
    assert "params 2.00 MiB" in line and "grads 1.00 MiB" in line
    assert "master 3.00 MiB" in line and "adam 6.00 MiB" in line
    assert "predicted 11.88 MiB (+1.1%)" in line  # 0.125 MiB over 11.875 MiB is +1.05%
    assert line.endswith("; buffers 1.00 MiB")
    assert "buffers" not in format_memory_line(make_record(with_buffers=False))


# GPT-2 1.5B (ZeRO paper's model): 48 layers, s=1024, h=1600, a=16; one micro-batch of b=1.
GPT2_15B = dict(num_layers=48, seq_length=1024, micro_batch_size=1, hidden_size=1600, num_attention_heads=16)
SBH = 1024 * 1 * 1600  # 1,638,400 elements


def test_checkpointed_input_is_sbh_elements_and_a_tp_slice_when_partitioned():
    assert checkpointed_input_bytes(1024, 1, 1600, 2, 1, partitioned=False) == 3_276_800
    assert checkpointed_input_bytes(1024, 1, 1600, 2, 4, partitioned=False) == 3_276_800
    assert checkpointed_input_bytes(1024, 1, 1600, 2, 4, partitioned=True) == 819_200
    assert checkpointed_input_bytes(1024, 2, 1600, 4, 1, partitioned=True) == 13_107_200
    # 15 elements over 4 ranks: each keeps a padded slice of 4.
    assert checkpointed_input_bytes(3, 1, 5, 2, 4, partitioned=True) == 8


def test_per_layer_estimate_for_gpt2_1_5b_is_34_plus_5as_over_h_bytes_per_sbh():
    # t=1: 10 + 24 + 5*16*1024/1600 = 34 + 51.2 = 85.2 bytes per s*b*h element.
    predicted = predict_saved_activation_bytes(**GPT2_15B, bytes_per_element=2, tensor_parallel_size=1,
                                               checkpoint_num_layers=None, partitioned=False)
    assert predicted == {"checkpointed_inputs": 0, "per_layer_without_recompute": 139_591_680,
                         "total": 48 * 139_591_680}
    assert predicted["per_layer_without_recompute"] == SBH * 852 // 10
    fp32 = predict_saved_activation_bytes(**GPT2_15B, bytes_per_element=4, tensor_parallel_size=1,
                                          checkpoint_num_layers=None, partitioned=False)
    assert fp32["per_layer_without_recompute"] == 2 * 139_591_680 and fp32["total"] == 2 * predicted["total"]


def test_per_layer_estimate_with_tensor_parallelism():
    # t=4: 10 + 24/4 + 5*16*1024/(1600*4) = 10 + 6 + 12.8 = 28.8 bytes per s*b*h element.
    predicted = predict_saved_activation_bytes(**GPT2_15B, bytes_per_element=2, tensor_parallel_size=4,
                                               checkpoint_num_layers=None, partitioned=False)
    assert predicted["per_layer_without_recompute"] == SBH * 288 // 10 == 47_185_920


def test_per_layer_estimate_rounds_a_fraction_of_a_byte_up():
    # s=3, b=1, h=5, a=1, t=7: 15*10 + 15*24/7 + 5*1*9*1/7 = 150 + 360/7 + 45/7 = 207.86 -> 208.
    predicted = predict_saved_activation_bytes(1, 3, 1, 5, 1, 2, 7, checkpoint_num_layers=None, partitioned=False)
    assert predicted["per_layer_without_recompute"] == 208


def test_checkpointing_keeps_one_input_per_group():
    # Full recompute of every layer: 2*s*b*h bytes per layer in 16-bit, as in Korthikanti et al.
    every_layer = predict_saved_activation_bytes(**GPT2_15B, bytes_per_element=2, tensor_parallel_size=1,
                                                 checkpoint_num_layers=1, partitioned=False)
    assert every_layer["checkpointed_inputs"] == every_layer["total"] == 48 * 2 * SBH == 157_286_400
    assert every_layer["per_layer_without_recompute"] == 139_591_680  # still reported
    # Groups of 5 blocks: ceil(48 / 5) = 10 checkpoints.
    groups = predict_saved_activation_bytes(**GPT2_15B, bytes_per_element=2, tensor_parallel_size=1,
                                            checkpoint_num_layers=5, partitioned=False)
    assert groups["total"] == 10 * 2 * SBH


def test_partitioned_checkpoints_divide_by_tp():
    whole = predict_saved_activation_bytes(**GPT2_15B, bytes_per_element=2, tensor_parallel_size=4,
                                           checkpoint_num_layers=1, partitioned=False)
    sliced = predict_saved_activation_bytes(**GPT2_15B, bytes_per_element=2, tensor_parallel_size=4,
                                            checkpoint_num_layers=1, partitioned=True)
    assert whole["total"] == 157_286_400 and sliced["total"] == 48 * 819_200 == 39_321_600


@pytest.mark.parametrize("kwargs, words", [
    (dict(num_layers=0), "num_layers must be >= 1"),
    (dict(num_attention_heads=0), "num_attention_heads must be >= 1"),
    (dict(tensor_parallel_size=0), "tensor_parallel_size must be >= 1"),
    (dict(bytes_per_element=0), "bytes_per_element must be >= 1"),
    (dict(checkpoint_num_layers=0), "checkpoint_num_layers must be >= 1"),  # uniform; block takes 0
])
def test_activation_model_rejects_bad_sizes(kwargs, words):
    arguments = dict(GPT2_15B, bytes_per_element=2, tensor_parallel_size=1, checkpoint_num_layers=1,
                     partitioned=False)
    arguments.update(kwargs)
    with pytest.raises(ValueError, match=words):
        predict_saved_activation_bytes(**arguments)
