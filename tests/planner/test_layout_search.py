"""`python -m zero.plan search` (planner/layout_search.py) against Megatron-Bridge's published H100 layouts
(configs/benchmarks/bridge_h100.yaml): for every buildable row, Bridge's own layout is among the layouts
that fit, and the search's top pick is not predicted slower than it (issue 67's acceptance)."""

import dataclasses
import json

import pytest

from arguments.parser import parse_config
from planner.bridge_rows import MODEL_FLAGS, UNBUILDABLE, load_rows, row_layout
from planner.layout_memory import layout_memory_bytes
from planner.layout_perf import load_layout_constants, predict_layout
from planner.layout_search import search
from planner.perf_model import load_hardware
from planner.search_cli import search_command
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


def search_flags(row) -> list[str]:
    """The row's model, batch and precision as the search is given them; its CP pinned where it has one (the search
    chooses CP only where the user gives it: planner/layout_search.py says why)."""
    seq = str(row.layout["seq_length"])
    return [*MODEL_FLAGS[row.model], "--seq-length", seq, "--max-position-embeddings", seq, "--global-batch-size",
            str(row.layout["global_batch_size"]), "--bf16", *([] if row.precision == "BF16" else ["--fp8-format", "hybrid"]),
            *(["--context-parallel-size", str(row.layout["cp"])] if row.layout["cp"] > 1 else [])]


@pytest.fixture(scope="module")
def searches():
    hardware = load_hardware("h100-sxm")
    found = {}
    for row in ROWS:
        config = parse_config(search_flags(row))
        key = tuple(search_flags(row)) + (row.layout["gpus"],)
        if key not in found:
            found[key] = search(config, row.layout["gpus"], hardware, launch_vocab(config.checkpoint, config.data, config.model, config.sources)[0])
    return hardware, found


@pytest.mark.parametrize("row", ROWS, ids=lambda row: row.label.replace(" ", "_"))
def test_bridge_layout_fits_and_the_top_pick_is_not_slower(row, searches):
    hardware, found = searches
    counts, candidates = found[tuple(search_flags(row)) + (row.layout["gpus"],)]
    # Bridge's layout as this project runs it, which the search's layouts are: the all-to-all dispatcher, no combined
    # 1F1B EP overlap and no TP overlap (Megatron's flex dispatcher, --overlap-moe-expert-parallel-comm and
    # --tp-comm-overlap have no effect here), at the split its flags make here
    bridge = dataclasses.replace(row_layout(row, counts), moe_dispatcher="alltoall", ep_overlap=False,
                                 tp_comm_overlap=False)
    shape = (bridge.tp, bridge.pp, bridge.vp, bridge.cp, bridge.ep, bridge.micro_batch_size)
    same = [c for c in candidates if (c.layout.tp, c.layout.pp, c.layout.vp, c.layout.cp, c.layout.ep,
                                      c.layout.micro_batch_size) == shape]
    # (Qwen3 30B-A3B's 48 layers as PP 2 x VP 24, one layer a chunk, only at Megatron's even split: the balanced one
    # would leave the output layer's rank an empty chunk)
    assert any(c.fits for c in same), (row.label, [c.lost_to for c in same][:3],
                                       layout_memory_bytes(counts, bridge) / 1e9)
    constants = load_layout_constants(hardware.layout_calibration)
    bridge_step = predict_layout(counts, bridge, hardware, constants, hardware.fp8_peak_flops).step_s
    assert candidates[0].fits
    if layout_memory_bytes(counts, bridge) > hardware.gpu_memory_bytes:
        # Bridge's own choices (its recompute, ZeRO and split) are over an H100 as this trainer runs them: its blocks
        # keep more than Megatron-Core's (the norms' fp32 copies: planner/layout_activations.py, issues 94 and 111).
        # The ranking is held to Bridge's on a GPU just big enough for it here, as the search runs it (its split) too.
        needed = max([layout_memory_bytes(counts, bridge)] + [
            c.memory_bytes for c in same if (c.layout.recompute_fraction, c.layout.stage) == (bridge.recompute_fraction,
                                                                                              bridge.stage)])
        roomy = dataclasses.replace(hardware, gpu_memory_bytes=int(needed) + 1)
        config = parse_config(search_flags(row))
        _, candidates = search(config, row.layout["gpus"], roomy, launch_vocab(config.checkpoint, config.data, config.model, config.sources)[0])
    assert candidates[0].fits and candidates[0].prediction.step_s <= bridge_step * (1 + 1e-9)


def test_search_json_lists_fitting_layouts_best_first(capsys):
    assert search_command(["--config", "llama3-8b", "--gpus", "8", "--hardware", "h100-sxm",
                           "--global-batch-size", "128", "--seq-length", "8192", "--json", "--no-dry-run-check"]) == 0
    layouts = json.loads(capsys.readouterr().out)
    steps = [each["step_s"] for each in layouts]
    assert steps == sorted(steps) and len(layouts) > 10
    assert {"tp", "pp", "vp", "cp", "ep", "micro_batch_size", "recompute", "zero", "tflops_per_gpu"} <= set(layouts[0])


def test_dry_run_with_hardware_adds_the_predicted_step(capsys):
    from planner.plan import main

    argv = ["dry-run", "--config", "tiny", "--world-size", "2", "--micro-batch-size", "2", "--global-batch-size", "8",
            "--bf16", "--json"]
    assert main(argv) == 0
    plain = json.loads(capsys.readouterr().out)
    assert main([*argv, "--hardware", "h100-sxm"]) == 0
    planned = json.loads(capsys.readouterr().out)
    assert "step_s" not in plain and planned["step_s"] > 0 and planned["tflops_per_gpu"] > 0
    assert planned["step_s"] == pytest.approx(planned["prediction"]["step_s"])
    assert planned["tflops_per_gpu"] == pytest.approx(planned["prediction"]["model_tflops_per_gpu"])
    # an fp32 run on a 16-bit profile: the plan stands and says why there is no step (the layout model prices
    # 16-bit and FP8 runs there)
    assert main([*[word for word in argv if word != "--bf16"], "--hardware", "h100-sxm"]) == 0
    fp32 = json.loads(capsys.readouterr().out)
    assert fp32["step_s"] is None and "fp32" in fp32["no_prediction"]


def test_the_dry_run_check_replans_the_best_and_drops_what_its_count_missed():
    from planner.search_check import check_picks

    flags = ["--config", "llama-tiny", "--global-batch-size", "16"]
    hardware = load_hardware("h100-sxm")
    _, candidates = search(parse_config(flags), 4, hardware)
    check_picks(candidates, flags, hardware, 1, 5)
    assert candidates[0].fits and candidates[0].dry_run_bytes > candidates[0].memory_bytes
    # A GPU just big enough for the analytic count but not for the dry run's (which sees the real buffers):
    tight = dataclasses.replace(hardware, gpu_memory_bytes=int(candidates[0].memory_bytes) + 1)
    _, candidates = search(parse_config(flags), 4, tight)
    first = candidates[0]
    summary = check_picks(candidates, flags, tight, 1, 1)
    assert not first.fits and first.lost_to.startswith("memory (dry run)") and summary.capped
    assert first not in [c for c in candidates if c.fits]


def test_search_of_an_hf_folder_counts_its_output_layer(capsys):
    # The folder's vocab_size reaches the counts (planner/vocabulary.py, as at launch): the logits GEMM and the
    # output layer's weights are in every layout's step and memory.
    from planner.bridge_rows import HF_CONFIGS

    model_flags = ["--init-from-hf", str(HF_CONFIGS / "gpt-oss-20b"), "--seq-length", "4096",
                   "--max-position-embeddings", "4096"]
    assert search_command([*model_flags, "--gpus", "8", "--hardware", "h100-sxm", "--global-batch-size", "64",
                           "--json", "--no-dry-run-check"]) == 0
    # the best distributed-optimizer layout (the top pick runs ZeRO-2, whose exposed per-micro-batch reduce-scatters,
    # the same with or without the output layer, dilute the share to 8%)
    best = next(each for each in json.loads(capsys.readouterr().out) if each["zero_stage"] == 1)
    counts, candidates = search(parse_config([*model_flags, "--global-batch-size", "64"]), 8, load_hardware("h100-sxm"))
    shape = ("tp", "pp", "vp", "cp", "ep", "micro_batch_size", "recompute", "zero")
    without = next(c for c in candidates if c.fits and all(c.to_json()[key] == best[key] for key in shape))
    # GPT-OSS 20B: the 201,088-row output layer, 9% of the step at the layout picked here (16% at the one picked before
    # the count held the last stage's logits and the recomputed block apart from them)
    assert best["step_s"] > 1.05 * without.prediction.step_s


@pytest.mark.parametrize("config, gpus, gbs, pp", [(["llama3-8b"], 16, 128, 4), (["llama3-8b"], 16, 128, 8),
                                                    (["llama-tiny"], 4, 16, 2),
                                                    (["llama3-8b", "--mtp-num-layers", "1"], 16, 128, 4)])
def test_the_printed_layout_string_builds_the_split_the_search_priced(config, gpus, gbs, pp):
    # The flag line's --pipeline-model-parallel-layout, read by pretrain_gpt.py's own parser (arguments/) and
    # gpt/pipeline_layout.py, places the layers per rank and chunk the layout model priced, interleaved ones included
    # (and the MTP layers, `m`, on the last stage).
    import shlex

    from gpt.pipeline_layout import pipeline_layout_counts

    counts, candidates = search(parse_config(["--config", *config, "--global-batch-size", str(gbs)]), gpus,
                                load_hardware("h100-sxm"))
    pipelined = [c for c in candidates if c.fits and c.layout.pp == pp]
    picks = pipelined[:1] + [c for c in pipelined if c.layout.vp > 1][:1]
    assert picks
    for pick in picks:
        config_line = parse_config(["--config", *config, *shlex.split(pick.flags())])
        built = pipeline_layout_counts(config_line.model, config_line.parallel)
        assert built == pick.layout.stage_counts and len(built) == pp and len(built[0]) == pick.layout.vp
        assert sum(map(sum, built)) == counts.layers


@pytest.mark.parametrize("spelling", ["--hybrid-layer-pattern", "--hybrid-override-pattern"])
def test_a_hybrid_patterns_split_is_printed_as_its_pipe_segments_and_builds_the_split_priced(spelling):
    # Megatron-LM refuses --pipeline-model-parallel-layout beside a pattern (its `|` place the stages), and so does the
    # trainer: the printed command carries the split as the pattern's segments, replacing the user's pattern flag.
    from gpt.pipeline_layout import pipeline_layout_counts

    model_flags = [spelling, "M-M-M*-M-M-M*-M-M-M*-M-M-M*-M-M-M*-/*-", "--hidden-size", "4096",
                   "--num-attention-heads", "32", "--seq-length", "4096", "--max-position-embeddings", "4096",
                   "--vocab-size", "32000", "--position-embedding-type", "rope"]
    counts, candidates = search(parse_config([*model_flags, "--global-batch-size", "64"]), 16,
                                load_hardware("h100-sxm"))
    pipelined = [c for c in candidates if c.fits and c.layout.pp > 1]
    picks = pipelined[:1] + [c for c in pipelined if c.layout.vp > 1][:1]
    assert len(picks) == 2
    for pick in picks:
        flags = pick.launch_flags(model_flags)
        assert "--pipeline-model-parallel-layout" not in flags
        assert [word for word in flags if word.startswith("--hybrid-")] == ["--hybrid-layer-pattern"]
        config = parse_config([*flags, "--global-batch-size", "64"])
        built = pipeline_layout_counts(config.model, config.parallel)
        assert built == pick.layout.stage_counts and sum(map(sum, built)) == counts.layers
        assert config.model.mtp.num_layers == 1


def test_the_balanced_split_gives_the_output_layers_rank_fewer_layers_where_that_pays():
    from planner.layout_perf import Layout, output_layer_units
    from planner.pipeline_split import balanced_stage_counts, layout_string, rank_loads

    assert balanced_stage_counts(8, 2, 1, 1.2) == ((5,), (3,))     # loads 5 and 4.2, not 4 and 5.2
    assert balanced_stage_counts(8, 2, 1, 0.4) == ((4,), (4,))     # moving a layer would make rank 0 the slower
    assert balanced_stage_counts(2, 2, 1, 5.0) == ((1,), (1,))     # every rank keeps a layer
    assert balanced_stage_counts(9, 2, 2, 0.0) == ((3, 2), (2, 2))
    assert layout_string(((3, 2), (2, 2))) == "Ettt|tt|tt|ttL"     # virtual stage k: chunk k // PP of rank k % PP
    assert layout_string(((5,), (3,))) == "Et*5|tttL"
    assert layout_string(((1,), (2,)), mtp_depth=2) == "Et|ttmmL"
    # Llama 3 8B (32 layers, 128,256-row output layer) on PP 4: the output layer is worth ~2.1 layers, so its rank
    # gets 6 and the slowest rank's load drops from 8 + 2.1 to 9
    hardware = load_hardware("h100-sxm")
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

    _, on_cpu = search(parse_config(["--config", "llama-tiny", "--global-batch-size", "16"]), 4,
                       load_hardware("cpu-2core-4proc"))
    tp = [c for c in on_cpu if c.fits and c.layout.tp > 1]
    assert tp and all(not c.layout.tp_comm_overlap and c.prediction.terms["tp"] > 0 for c in tp)
    assert all("--tp-comm-overlap" not in c.flags() for c in tp)
