"""`python -m zero.plan search` (planner/layout_search.py) against Megatron-Bridge's published H100 layouts
(configs/benchmarks/bridge_h100.yaml): for every buildable row, Bridge's own layout is among the layouts
that fit, and the search's top pick is not predicted slower than it (issue 67's acceptance)."""

import dataclasses
import json

import pytest

from planner.bridge_rows import UNBUILDABLE, load_rows, row_config, row_layout
from planner.layout_perf import load_layout_constants, output_layer_units, predict_layout
from planner.layout_search import layout_memory_bytes, search, search_command
from planner.perf_model import load_hardware
from planner.pipeline_split import balanced_stage_counts
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
    # Bridge's layout as this project runs it, which the search's layouts are: the all-to-all dispatcher and no
    # combined 1F1B EP overlap (Megatron's flex dispatcher and --overlap-moe-expert-parallel-comm are not built here)
    bridge = dataclasses.replace(row_layout(row, counts), moe_dispatcher="alltoall", ep_overlap=False)
    if bridge.pp > 1 and bridge.output_stage_balanced:
        # a balanced row is priced at the best whole-layer split, as the search prices its own layouts (a layout
        # string places whole layers: 405B's 126 over PP 8 leaves some rank 16 while the mean is 15.8)
        bridge = dataclasses.replace(bridge, stage_counts=balanced_stage_counts(
            counts.layers, bridge.pp, bridge.vp, output_layer_units(counts, bridge)))
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
    checked = dry_run_check(candidates, flags, hardware, 1)
    assert checked[0].fits and checked[0].dry_run_bytes > 0
    # A GPU just big enough for the analytic count but not for the dry run's (which sees the real buffers):
    tight = dataclasses.replace(hardware, gpu_memory_bytes=int(checked[0].memory_bytes) + 1)
    assert checked[0].dry_run_bytes > tight.gpu_memory_bytes
    counts, candidates = search(parse_config(flags).model, 4, 16, "bf16", tight)
    first = next(c for c in candidates if c.fits)
    dry_run_check([first], flags, tight, 1)
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
    # the best distributed-optimizer layout (the top pick runs ZeRO-2, whose exposed per-micro-batch reduce-scatters,
    # the same with or without the output layer, dilute the share to 8%)
    best = next(each for each in json.loads(capsys.readouterr().out) if each["zero_stage"] == 1)
    counts, candidates = search(parse_config(model_flags).model, 8, 64, "bf16", load_hardware("h100-sxm"))
    shape = ("tp", "pp", "vp", "cp", "ep", "micro_batch_size", "recompute", "zero")
    without = next(c for c in candidates if c.fits and all(c.to_json()[key] == best[key] for key in shape))
    assert best["step_s"] > 1.1 * without.prediction.step_s  # GPT-OSS 20B: the 201,088-row output layer, 16% here


@pytest.mark.parametrize("config, gpus, gbs, pp", [("llama3-8b", 16, 128, 4), ("llama3-8b", 16, 128, 8),
                                                    ("llama-tiny", 4, 16, 2)])
def test_the_printed_layout_string_builds_the_split_the_search_priced(config, gpus, gbs, pp):
    # The flag line's --pipeline-model-parallel-layout, read by pretrain_gpt.py's own parser (arguments/) and
    # gpt/pipeline_layout.py, places the layers per rank and chunk the layout model priced, interleaved ones included.
    import shlex

    from arguments.parser import parse_config
    from gpt.pipeline_layout import pipeline_layout_counts

    model = parse_config(["--config", config]).model
    counts, candidates = search(model, gpus, gbs, "bf16", load_hardware("h100-sxm"))
    pipelined = [c for c in candidates if c.fits and c.layout.pp == pp]
    picks = pipelined[:1] + [c for c in pipelined if c.layout.vp > 1][:1]
    assert picks
    for pick in picks:
        config_line = parse_config(["--config", config, *shlex.split(pick.flags())])
        built = pipeline_layout_counts(config_line.model, config_line.parallel)
        assert built == pick.layout.stage_counts and len(built) == pp and len(built[0]) == pick.layout.vp
        assert sum(map(sum, built)) == counts.layers


def test_the_balanced_split_gives_the_output_layers_rank_fewer_layers_where_that_pays():
    from planner.layout_perf import Layout, output_layer_units
    from planner.pipeline_split import balanced_stage_counts, layout_string, rank_loads

    assert balanced_stage_counts(8, 2, 1, 1.2) == ((5,), (3,))     # loads 5 and 4.2, not 4 and 5.2
    assert balanced_stage_counts(8, 2, 1, 0.4) == ((4,), (4,))     # moving a layer would make rank 0 the slower
    assert balanced_stage_counts(2, 2, 1, 5.0) == ((1,), (1,))     # every rank keeps a layer
    assert balanced_stage_counts(9, 2, 2, 0.0) == ((3, 2), (2, 2))
    assert layout_string(((3, 2), (2, 2))) == "Ettt|tt|tt|ttL"     # virtual stage k: chunk k // PP of rank k % PP
    assert layout_string(((5,), (3,))) == "Et*5|tttL"
    # Llama 3 8B (32 layers, 128,256-row output layer) on PP 4: the output layer is worth ~2.1 layers, so its rank
    # gets 6 and the slowest rank's load drops from 8 + 2.1 to 9
    hardware = load_hardware("h100-sxm")
    from arguments.parser import parse_config
    from planner.layout_perf import model_counts

    counts = model_counts(parse_config(["--config", "llama3-8b"]).model)
    units = output_layer_units(counts, Layout(16, pp=4, global_batch_size=128))
    split = balanced_stage_counts(32, 4, 1, units)
    assert 2 < units < 2.2 and split == ((9,), (9,), (8,), (6,)) and max(rank_loads(split, units)) == 9
    even = predict_layout(counts, Layout(16, pp=4, global_batch_size=128, output_stage_balanced=False), hardware,
                          load_layout_constants(hardware.layout_calibration))
    given = predict_layout(counts, Layout(16, pp=4, global_batch_size=128, stage_counts=((8,),) * 4), hardware,
                           load_layout_constants(hardware.layout_calibration))
    # the even split priced from its counts equals the even-split term the Bridge rows use
    assert given.terms["pp_output_stage"] == pytest.approx(even.terms["pp_output_stage"], rel=1e-9)


def test_a_cpu_profile_prices_tp_exposed():
    # --tp-comm-overlap is Transformer Engine's userbuffers (CUDA): on a CPU profile TP layouts pay their collectives
    from arguments.parser import parse_config

    model = parse_config(["--config", "llama-tiny"]).model
    _, on_cpu = search(model, 4, 16, "bf16", load_hardware("cpu-2core-4proc"))
    tp = [c for c in on_cpu if c.fits and c.layout.tp > 1]
    assert tp and all(not c.layout.tp_comm_overlap and c.prediction.terms["tp"] > 0 for c in tp)
    assert all("--tp-comm-overlap" not in c.flags() for c in tp)
