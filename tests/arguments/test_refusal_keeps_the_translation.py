"""A refused Megatron flag does not undo what the accepted ones translate (issue 34, "every problem in one
round"): the rest of the launch is checked as translated, so the one error line lists only real problems.

NVIDIA/Megatron-LM examples/llama/train_llama3_8b_h100_fp8.sh passes --use-distributed-optimizer
--overlap-grad-reduce --overlap-param-gather beside --sequence-parallel; with the refusal's translation
dropped, --use-distributed-optimizer's ZeRO stage 1 was lost and --overlap-param-gather was reported as
"not --zero-stage 0", a problem the launch does not have."""

import pytest

from arguments.parser import parse_config
from base.errors import ConfigError


def test_a_refused_flag_leaves_the_distributed_optimizers_stage_1_in_place():
    assert parse_config(["--use-distributed-optimizer", "--overlap-param-gather"]).zero.stage == 1
    with pytest.raises(ConfigError) as error:
        parse_config(["--use-distributed-optimizer", "--overlap-param-gather", "--use-mup"])
    message = str(error.value)
    assert "--use-mup" in message
    assert "--overlap-param-gather" not in message and "problems" not in message, message
