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
    check_plannable(parse_config(STAGES))  # planned per stage (tests/planner/test_plan_pipeline.py)
