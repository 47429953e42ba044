"""scripts/tools/harvest_megatron_functional_tests.py builds each configuration's command line as Megatron-LM's CI does
(tests/functional_tests/shell_test_utils/_run_training.sh at d98e8a64): yq's `explode(.)` expands merge keys, a
`true` value is a bare flag, a value with a space is one quoted argument, a [ ] value its items, a repeated key
is passed twice (argparse keeps the last)."""

import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts" / "tools"))

from harvest_megatron_functional_tests import ci_mode, ci_test_type, harvest, model_args_argv  # noqa: E402

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


def test_the_moe_suite_takes_the_pretraining_configurations_of_moe_and_mixtral(tmp_path):
    """`--suite moe` reads test_cases/moe/* and test_cases/mixtral/*, and leaves out what the CI does not run as
    pretraining: Megatron-LM's _run_training.sh (d98e8a64) picks the program by the config's MODE (inference:
    its inference engines; rl: GRPO), pretrain_gpt.py when MODE is absent or pretraining."""
    cases = tmp_path / "tests/functional_tests/test_cases"
    configs = {"moe/gpt3_mcore_tp1_4experts": "MODEL_ARGS:\n  --num-experts: 4\n",
               "moe/gpt_static_inference_16B": "MODE: inference\nMODEL_ARGS:\n  --num-experts: 64\n",
               "moe/gpt_grpo_dp8": "TEST_TYPE: frozen-start\nMODE: rl\nMODEL_ARGS:\n  --num-experts: 8\n",
               "mixtral/mixtral_8x7b_release": 'TEST_TYPE: "release"\nMODE: pretraining\nMODEL_ARGS:\n  --seed: ${REPEAT}\n',
               "gpt/gpt3_dense": "MODEL_ARGS:\n  --num-layers: 2\n"}
    for folder, text in configs.items():
        (cases / folder).mkdir(parents=True)
        (cases / folder / "model_config.yaml").write_text(text)
    (cases / "moe/golden_values_only").mkdir()
    (cases / "moe/golden_values_only/golden_values_dev.json").write_text("{}")
    for args in (["init", "-q"], ["add", "."], ["-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "x"]):
        subprocess.run(["git", "-C", str(tmp_path), *args], check=True)
    launches, skipped = harvest(str(tmp_path), "HEAD", "moe")
    assert [(launch["name"], launch["test_type"], launch["argv"]) for launch in launches] == [
        ("megatron-lm-ft-moe-gpt3_mcore_tp1_4experts", "regular", ["--num-experts", "4"]),
        ("megatron-lm-ft-mixtral-mixtral_8x7b_release", "release", ["--seed", "1"])]
    assert skipped == ["tests/functional_tests/test_cases/moe/gpt_grpo_dp8/model_config.yaml (MODE: rl)",
                       "tests/functional_tests/test_cases/moe/gpt_static_inference_16B/model_config.yaml "
                       "(MODE: inference)"]
    assert [launch["name"] for launch in harvest(str(tmp_path), "HEAD", "gpt")[0]] == ["megatron-lm-ft-gpt3_dense"]
    assert ci_mode("MODEL_ARGS:\n  --bf16: true\n") == "pretraining"
