"""What pipeline stages cannot do yet is refused in one line naming the flag, before any work, instead of a
crash or a wrong result."""

from __future__ import annotations

import pytest

from arguments.parser import parse_arguments, parse_config
from base.errors import ConfigError
from planner.dry_run import check_plannable
from training.late_checks import LATE_CHECKS

STAGES = ["--num-layers", "4", "--pipeline-model-parallel-size", "2"]


@pytest.mark.parametrize("flags, message", [
    # DeepSpeed's pipeline engine refuses ZeRO >= 2 (deepspeed/runtime/pipe/engine.py,
    # github:deepspeedai/DeepSpeed: assert zero_optimization_stage() < ZeroStageEnum.gradients, "ZeRO-2 and
    # ZeRO-3 are incompatible with pipeline parallelism"); stage 2 runs here, stage 3 does not.
    (["--zero-stage", "3"], "--zero-stage 3 with --pipeline-model-parallel-size 2: ZeRO-3 is incompatible"),
    (["--num-layers", "3"], "--num-layers 3 is not divisible by --pipeline-model-parallel-size 2"),
])
def test_refused_with_stages_in_one_line(flags, message):
    with pytest.raises(ConfigError) as error:
        parse_arguments([*STAGES, *flags], late_checks=LATE_CHECKS)  # as pretrain_gpt.py parses a launch
    assert message in str(error.value) and "\n" not in str(error.value)


def test_virtual_stages_need_stages_and_the_planner_plans_stages():
    with pytest.raises(ConfigError, match="--num-layers-per-virtual-pipeline-stage needs --pipeline-model-parallel"):
        parse_config(["--num-layers-per-virtual-pipeline-stage", "1"])
    parse_config([*STAGES, "--zero-stage", "2"])  # ZeRO 2 with stages is accepted
    check_plannable(parse_config(STAGES).model)  # planned per stage (tests/planner/test_plan_pipeline.py)


def test_pipe_parallel_size_is_deepspeeds_stage_count():
    """DeepSpeedExamples' Megatron-LM-v1.1.5-3D_parallelism (github:microsoft/DeepSpeedExamples @5c6b1c8f):
    megatron/arguments.py `--pipe-parallel-size, default=0, help='Size of the pipeline parallel. Disable with
    0.'`; megatron/initialize.py `if args.pipe_parallel_size > 0: ... PipeModelDataParallelTopology(num_pp=pp,
    num_mp=mp, num_dp=dp)`; megatron/model/gpt2_model.py GPT2ModelPipe: PipelineModule(...,
    partition_method='type:transformer'), which DeepSpeed splits with partition_balanced over the transformer
    layers alone (github:deepspeedai/DeepSpeed deepspeed/runtime/pipe/module.py _partition_layers): an even
    split where the stages divide the layers, as Megatron's."""
    parsed = parse_arguments(["--num-layers", "4", "--pipe-parallel-size", "2"], late_checks=LATE_CHECKS)
    assert parsed.config.parallel.pipeline_model_parallel_size == 2
    assert "type:transformer" in parsed.config.sources["pipeline_model_parallel_size"].describe()
    assert parse_config(["--pipe-parallel-size", "0"]).parallel.pipeline_model_parallel_size == 1  # no engine
    with pytest.raises(ConfigError, match="--pipe-parallel-size 2 contradicts --pipeline-model-parallel-size 4"):
        parse_config(["--num-layers", "4", "--pipe-parallel-size", "2", "--pipeline-model-parallel-size", "4"])
    with pytest.raises(ConfigError, match="--num-layers 3 is not divisible"):  # DeepSpeed would balance unevenly
        parse_config(["--num-layers", "3", "--pipe-parallel-size", "2"])
