"""Megatron-Core's --pipeline-model-parallel-layout (gpt/pipeline_layout.py) against its grammar and checks
(github:NVIDIA/Megatron-LM megatron/core/transformer/pipeline_parallel_layer_layout.py: parse_str_to_list, __init__'s
1D -> 2D conversion, validate_layer_layout; docs/user-guide/features/pipeline_parallel_layout.md's DeepSeek-V3
example "Et*3|(tt|)*29,m|L" and its rank map), and its mapping onto the stages here (gpt/stage_layers.py)."""

from __future__ import annotations

import json

import pytest

from arguments.parser import parse_config
from base.errors import ConfigError
from gpt.pipeline_layout import layout_chunks, layout_layer_counts, parse_layout
from gpt.stage_layers import stage_layers


def test_parse_unrolls_repetitions_and_drops_commas_as_megatron():
    # parse_str_to_list's docstring: "Ettt|(tt|)*29,m|L" -> [E,t,t,t] + [t,t]*29 + [m], [L]
    assert parse_layout("Ettt|(tt|)*29,m|L") == ["Ettt"] + ["tt"] * 29 + ["m", "L"]
    # its comments: "(ab)*3 -> ababab", "ab,(cd|)*2 -> abcd|cd|", "(|ab)*2,cd -> |ab|abcd"; "x*n" to n x's
    assert parse_layout("Et*3|(tt|)*6tmL") == ["Ettt"] + ["tt"] * 6 + ["tmL"]
    assert parse_layout("(tt)*3") == ["tttttt"]
    assert parse_layout("E,(tt|)*2L") == ["Ett", "tt", "L"]
    assert parse_layout("(|tt)*2,tL") == ["", "tt", "tttL"]
    with pytest.raises(ConfigError, match="invalid layer character 'x'"):
        parse_layout("Etx|L")


def test_the_deepseek_v3_example_maps_as_megatrons_rank_map():
    """pipeline_parallel_layout.md: PP 16, VPP 2; rank 0 holds E + 3 t then 2 t, ranks 1-13 2 t and 2 t, rank 14
    2 t then m, rank 15 2 t then L. Here the m on rank 14 is Megatron's standalone MTP stage: refused."""
    stages = parse_layout("Et*3|(tt|)*29,m|L")
    by_rank = [[stages[chunk * 16 + rank] for chunk in range(2)] for rank in range(16)]
    assert by_rank[0] == ["Ettt", "tt"] and by_rank[14] == ["tt", "m"] and by_rank[15] == ["tt", "L"]
    with pytest.raises(ConfigError, match="standalone MTP stage"):
        layout_chunks("Et*3|(tt|)*29,m|L", 16, 61, 1)


def test_validation_follows_validate_layer_layout():
    with pytest.raises(ConfigError, match="embedding E must come first"):
        layout_chunks("tE|tL", 2, 2, 0)
    with pytest.raises(ConfigError, match="loss L must come last"):
        layout_chunks("Et|Lt", 2, 2, 0)
    with pytest.raises(ConfigError, match="3 transformer layers .t., not --num-layers 4"):
        layout_chunks("Et|ttL", 2, 4, 0)
    with pytest.raises(ConfigError, match="1 MTP layers .m., not --mtp-num-layers 0"):
        layout_chunks("Et|tmL", 2, 2, 0)
    with pytest.raises(ConfigError, match="decoder layers .t. must be placed before MTP layers"):
        layout_chunks("Et|mtL", 2, 2, 1)
    with pytest.raises(ConfigError, match="not a multiple of --pipeline-model-parallel-size 2"):
        layout_chunks("Et|t|tL", 2, 3, 0)
    with pytest.raises(ConfigError, match="pipeline rank 1 .'', 'L'. holds no transformer layer"):
        layout_chunks("Ett||t|L", 2, 3, 0)
    # an empty virtual stage is allowed (pipeline_parallel_layout.md: "E||t|L"), so is one with only m and L
    assert layout_layer_counts("Et*3|(tt|)*6mL", 4, 15, 1) == ((3, 2), (2, 2), (2, 2), (2, 0))


def test_layout_counts_give_each_chunk_its_layers_in_megatrons_order():
    """get_layer_offset: virtual stage k = chunk k // PP of rank k % PP, its layers after every earlier one's.
    "Et*3|(tt|)*6tmL" at PP 4 (the MoE functional tests'): rank 0 holds layers 0-2 and 9-10, rank 3 7-8 and 15."""
    counts = layout_layer_counts("Et*3|(tt|)*6tmL", 4, 16, 1)
    assert counts == ((3, 2), (2, 2), (2, 2), (2, 1))
    stages = [stage_layers(16, 4, rank, layout_counts=counts) for rank in range(4)]
    assert [stage.chunks for stage in stages] == [((0, 1, 2), (9, 10)), ((3, 4), (11, 12)), ((5, 6), (13, 14)),
                                                  ((7, 8), (15,))]
    assert sorted(layer for stage in stages for layer in stage.layer_ids) == list(range(16))
    # without interleaving: uneven stages, "Et*7|t*7mL" of the DeepSeek-V3 proxies
    assert [stage_layers(14, 2, rank, layout_counts=layout_layer_counts("Et*7|t*7mL", 2, 14, 1)).chunks
            for rank in range(2)] == [(tuple(range(7)),), (tuple(range(7, 14)),)]
    assert [stage_layers(4, 2, rank, layout_counts=layout_layer_counts("Ettt|tL", 2, 4, 0)).layer_ids
            for rank in range(2)] == [(0, 1, 2), (3,)]


def test_the_flag_parses_and_what_it_replaces_is_refused():
    argv = ["--num-layers", "4", "--pipeline-model-parallel-size", "2", "--position-embedding-type", "rope",
            "--pipeline-model-parallel-layout", "Ettt|tmL", "--mtp-num-layers", "1"]
    assert parse_config(argv).parallel.pipeline_model_parallel_layout == "Ettt|tmL"
    with pytest.raises(ConfigError, match="--pipeline-model-parallel-layout with --decoder-first-pipeline-num-layers"):
        parse_config(argv + ["--decoder-first-pipeline-num-layers", "3"])
    with pytest.raises(ConfigError, match="2 transformer layers .t., not --num-layers 4"):
        parse_config(["--num-layers", "4", "--pipeline-model-parallel-size", "2",
                      "--pipeline-model-parallel-layout", "Et|tL"])
    with pytest.raises(ConfigError, match="interleaving needs --pipeline-model-parallel-size > 1"):
        parse_config(["--num-layers", "2", "--pipeline-model-parallel-layout", "Et|tL"])


def test_an_uneven_layout_trains_as_one_stage(corpus_cache_300, tmp_path):
    """Two stages split 3 + 1 by the layout log the one-stage run's losses and gradient norms."""
    import pretrain_gpt
    from tests.distributed import free_port, run_distributed
    from tests.reliability_helpers import TINY
    from tests.training.test_moe_training import launch_rank

    flags = TINY + ["--num-layers", "4", "--train-iters", "2", "--data-cache-dir", corpus_cache_300, "--seed", "5"]
    single, staged = tmp_path / "single.jsonl", tmp_path / "pp2.jsonl"
    assert pretrain_gpt.main(flags + ["--metrics-file", str(single)]) == 0
    run_distributed(launch_rank, 2, [flags + ["--pipeline-model-parallel-size", "2", "--pipeline-model-parallel-layout",
                                              "Ettt|tL", "--metrics-file", str(staged)]], [free_port()], timeout=300)

    def logged(path):
        return [value for r in map(json.loads, path.read_text().splitlines()) if "loss" in r and "split" not in r
                for value in (r["loss"], r["grad_norm"])]

    assert len(logged(single)) == 2 * 2
    assert logged(staged) == pytest.approx(logged(single), rel=1e-6, abs=0)
