"""The `parallel` section (parallel/config.py): Megatron's parallelism flags, presets, the DeepSpeed JSON and
--print-config land in config.parallel, and checkpoint metadata records them where it always has.

Megatron-Core keeps these in one ModelParallelConfig (megatron/core/model_parallel_config.py:
tensor_model_parallel_size, pipeline_model_parallel_size, virtual_pipeline_model_parallel_size,
sequence_parallel, ...), as torchtitan's ParallelismConfig (torchtitan/config/job_config.py) does.
"""

from __future__ import annotations

import json
from dataclasses import fields
from pathlib import Path

from arguments.config import PretrainConfig
from arguments.parser import build_parser, parse_arguments, parse_config
from arguments.print_config import format_config
from parallel.config import ParallelismConfig

FIXTURE = Path(__file__).parents[1] / "fixtures" / "checkpoint_84ae2c6" / "iter_0000002" / "metadata.json"
PP_FLAGS = ["--num-layers", "4", "--pipeline-model-parallel-size", "2", "--num-layers-per-virtual-pipeline-stage",
            "1", "--microbatch-group-size-per-virtual-pipeline-stage", "2"]


def test_the_parallel_flags_set_the_parallel_section():
    config = parse_config(["--tensor-model-parallel-size", "2", "--sequence-parallel", *PP_FLAGS])
    parallel = config.parallel
    assert (parallel.tensor_model_parallel_size, parallel.sequence_parallel, parallel.pipeline_model_parallel_size,
            parallel.num_layers_per_virtual_pipeline_stage,
            parallel.microbatch_group_size_per_virtual_pipeline_stage) == (2, True, 2, 1, 2)
    moved = {f.name for f in fields(ParallelismConfig)}
    assert not moved & {f.name for f in fields(config.training)} and not moved & {f.name for f in fields(config.model)}
    # Other programs' names still reach it: DeepSpeed-Megatron's --model-parallel-size.
    assert parse_config(["--model-parallel-size", "2"]).parallel.tensor_model_parallel_size == 2


def test_a_preset_sets_the_parallel_section(tmp_path):
    preset = tmp_path / "p.yaml"
    preset.write_text("tensor_model_parallel_size: 2\nsequence_parallel: true\n")
    parsed = parse_arguments(["--config", str(preset)])
    assert parsed.config.parallel.tensor_model_parallel_size == 2 and parsed.config.parallel.sequence_parallel
    assert "preset" in parsed.config.sources["tensor_model_parallel_size"].describe()


def test_print_config_and_help_show_the_parallel_section():
    text = format_config(parse_arguments(["--tensor-model-parallel-size", "2", "--print-config"]))
    lines = text.splitlines()
    section = lines.index("parallel")
    assert lines[section + 1].split()[:2] == ["tensor_model_parallel_size", "2"]
    assert "parallelism (tensor, sequence, pipeline)" in build_parser().format_help()


def test_checkpoint_metadata_records_the_parallel_settings_where_it_always_has():
    """The recorded config (checkpoint metadata, to_dict) keeps its sections: the sizes under `training` and
    sequence_parallel under `model`, so a checkpoint written before the parallel section (the fixture) and one
    written after read alike."""
    config = parse_config(["--tensor-model-parallel-size", "2", "--sequence-parallel", *PP_FLAGS])
    record = config.to_dict()
    assert set(record) == set(PretrainConfig.SECTIONS) - {"parallel"}
    assert record["training"]["tensor_model_parallel_size"] == 2 and record["model"]["sequence_parallel"] is True
    assert record["training"]["num_layers_per_virtual_pipeline_stage"] == 1
    old = json.loads(FIXTURE.read_text())["config"]
    for section, values in old.items():
        assert set(values) <= set(record[section]), section
