"""scripts/harvest_megatron_functional_tests.py builds each configuration's command line as Megatron-LM's CI does
(tests/functional_tests/shell_test_utils/_run_training.sh at d98e8a64): yq's `explode(.)` expands merge keys, a
`true` value is a bare flag, a value with a space is one quoted argument, a [ ] value its items, a repeated key
is passed twice (argparse keeps the last)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))

from harvest_megatron_functional_tests import ci_test_type, model_args_argv  # noqa: E402

CONFIG = """
ENV_VARS:
  NCCL_ALGO: Ring
BASE: &BASE_MODEL_ARGS
  --num-layers: 12
  --seed: 5
MODEL_ARGS:
  <<: *BASE_MODEL_ARGS
  # a comment yq drops
  --seed: 7
  --bf16: true
  --lr: 3e-4
  --split: 949,50,1
  --hierarchical-context-parallel-sizes: 2 2
  --ffn-hidden-size: 8192
  --ffn-hidden-size: 8192
  --no-load-optim: false
TEST_TYPE: ckpt-resume
"""


def test_the_command_line_is_the_one_megatrons_ci_builds():
    assert model_args_argv(CONFIG) == [
        "--num-layers", "12",  # merged from the anchor; its --seed is overridden by the mapping's own
        "--seed", "7", "--bf16", "--lr", "3e-4", "--split", "949,50,1",
        "--hierarchical-context-parallel-sizes", "2 2",  # one argument, as the CI's quoting passes it
        "--ffn-hidden-size", "8192", "--ffn-hidden-size", "8192",
        "--no-load-optim", "false"]
    assert ci_test_type(CONFIG) == "ckpt-resume"
    assert ci_test_type("MODEL_ARGS:\n  --bf16: true\n") == "regular"
