"""`python -m zero.plan search` (planner/layout_search.py) against Megatron-Bridge's published H100 layouts
(configs/benchmarks/bridge_h100.yaml): for every buildable row, Bridge's own layout is among the layouts
that fit, and the search's top pick is not predicted slower than it (issue 67's acceptance)."""

import json

import pytest

from planner.bridge_rows import UNBUILDABLE, load_rows, row_config, row_layout
from planner.layout_perf import load_layout_constants, predict_layout
from planner.layout_search import layout_memory_bytes, search, search_command
from planner.perf_model import load_hardware
from planner.vocabulary import launch_vocab


def _distinct_rows():
    seen, rows = set(), []
    for row in load_rows():
        key = (row.model, row.layout["gpus"], row.layout["global_batch_size"], row.layout["seq_length"],
               row.precision == "BF16", row.layout["tp"], row.layout["pp"], row.layout["vp"], row.layout["cp"],
               row.layout["ep"], row.layout["micro_batch_size"])
        if row.model not in UNBUILDABLE and key not in seen:
            seen.add(key)
            rows.append(row)
    return rows


ROWS = _distinct_rows()


@pytest.fixture(scope="module")
def searches():
    hardware = load_hardware("h100-sxm")
    found = {}
    for row in ROWS:
        config = row_config(row)
        key = (row.model, row.layout["gpus"], row.layout["global_batch_size"], row.layout["seq_length"],
               row.precision == "BF16")
        if key not in found:
            found[key] = search(config.model, row.layout["gpus"], row.layout["global_batch_size"],
                                "bf16" if row.precision == "BF16" else "fp8", hardware, launch_vocab(config)[0])
    return hardware, found


@pytest.mark.parametrize("row", ROWS, ids=lambda row: row.label.replace(" ", "_"))
def test_bridge_layout_fits_and_the_top_pick_is_not_slower(row, searches):
    hardware, found = searches
    counts, candidates = found[(row.model, row.layout["gpus"], row.layout["global_batch_size"],
                                row.layout["seq_length"], row.precision == "BF16")]
    bridge = row_layout(row, counts)
    shape = (bridge.tp, bridge.pp, bridge.vp, bridge.cp, bridge.ep, bridge.micro_batch_size)
    same = [c for c in candidates if (c.layout.tp, c.layout.pp, c.layout.vp, c.layout.cp, c.layout.ep,
                                      c.layout.micro_batch_size) == shape]
    assert any(c.fits for c in same), (row.label, [c.lost_to for c in same][:3],
                                       layout_memory_bytes(counts, bridge) / 1e9)
    constants = load_layout_constants(hardware.layout_calibration)
    bridge_step = predict_layout(counts, bridge, hardware, constants, hardware.fp8_peak_flops).step_s
    assert candidates[0].fits and candidates[0].prediction.step_s <= bridge_step * (1 + 1e-9)


def test_search_json_lists_fitting_layouts_best_first(capsys):
    assert search_command(["--config", "llama3-8b", "--gpus", "8", "--hardware", "h100-sxm",
                           "--global-batch-size", "128", "--seq-length", "8192", "--json"]) == 0
    layouts = json.loads(capsys.readouterr().out)
    steps = [each["step_s"] for each in layouts]
    assert steps == sorted(steps) and len(layouts) > 10
    assert {"tp", "pp", "vp", "cp", "ep", "micro_batch_size", "recompute", "zero", "tflops_per_gpu"} <= set(layouts[0])


def test_dry_run_with_hardware_adds_the_predicted_step(capsys):
    from planner.plan import main

    argv = ["dry-run", "--config", "tiny", "--world-size", "2", "--micro-batch-size", "2", "--global-batch-size", "8",
            "--json"]
    assert main(argv) == 0
    plain = json.loads(capsys.readouterr().out)
    assert main([*argv, "--hardware", "h100-sxm"]) == 0
    planned = json.loads(capsys.readouterr().out)
    assert "step_s" not in plain and planned["step_s"] > 0 and planned["tflops_per_gpu"] > 0
    assert planned["step_s"] == pytest.approx(planned["prediction"]["iteration_s"])
    assert planned["tflops_per_gpu"] == pytest.approx(planned["prediction"]["model_tflops_per_gpu"])


def test_the_dry_run_check_replans_the_best_and_drops_what_its_count_missed():
    import dataclasses

    from arguments.parser import parse_config
    from planner.layout_search import dry_run_check

    flags = ["--config", "llama-tiny", "--global-batch-size", "16"]
    hardware = load_hardware("h100-sxm")
    counts, candidates = search(parse_config(flags).model, 4, 16, "bf16", hardware)
    checked = dry_run_check(candidates, counts, flags, hardware, 1)
    assert checked[0].fits and checked[0].dry_run_bytes > 0
    # A GPU just big enough for the analytic count but not for the dry run's (which sees the real buffers):
    tight = dataclasses.replace(hardware, gpu_memory_bytes=int(checked[0].memory_bytes) + 1)
    assert checked[0].dry_run_bytes > tight.gpu_memory_bytes
    counts, candidates = search(parse_config(flags).model, 4, 16, "bf16", tight)
    first = next(c for c in candidates if c.fits)
    dry_run_check([first], counts, flags, tight, 1)
    assert not first.fits and first.lost_to.startswith("memory (dry run)")


def test_search_of_an_hf_folder_counts_its_output_layer(capsys):
    # The folder's vocab_size reaches the counts (planner/vocabulary.py, as at launch): the logits GEMM and the
    # output layer's weights are in every layout's step and memory.
    from arguments.parser import parse_config
    from planner.bridge_rows import HF_CONFIGS

    model_flags = ["--init-from-hf", str(HF_CONFIGS / "gpt-oss-20b"), "--seq-length", "4096",
                   "--max-position-embeddings", "4096"]
    assert search_command([*model_flags, "--gpus", "8", "--hardware", "h100-sxm", "--global-batch-size", "64",
                           "--json"]) == 0
    best = json.loads(capsys.readouterr().out)[0]
    counts, candidates = search(parse_config(model_flags).model, 8, 64, "bf16", load_hardware("h100-sxm"))
    without = next(c for c in candidates if c.fits and c.flags(counts) in best["flags"])  # no vocabulary
    assert best["step_s"] > 1.1 * without.prediction.step_s  # GPT-OSS 20B: the 201,088-row output layer, 16% here


def test_the_search_names_what_its_flag_lines_even_split_costs():
    # Layouts are ranked with a balanced pipeline split; the printed flags give Megatron's even one, whose last
    # stage also runs the logits (planner/layout_perf.py's even_split_output_stage_s): the line says how much.
    from arguments.parser import parse_config
    from planner.layout_perf import even_split_output_stage_s
    from planner.layout_search import format_search

    hardware = load_hardware("h100-sxm")
    counts, candidates = search(parse_config(["--config", "llama3-8b"]).model, 16, 128, "bf16", hardware)
    pipelined = [c for c in candidates if c.fits and c.layout.pp == 4][:1]
    extra = even_split_output_stage_s(counts, pipelined[0].layout, hardware,
                                      load_layout_constants(hardware.layout_calibration))
    assert extra > 0
    text = format_search(counts, pipelined, 1, 0.0, "", hardware)
    assert f"the last stage also runs the logits: +{extra * 1e3:,.1f} ms/step for layout 1" in text
