"""common.pt's args in our `--ckpt-format torch_dist` saves are what Megatron-LM's own parse_args gives the same
command line (issue 78 item 3), on every field Megatron-LM's load reads and every field we write.

The reference is the args Megatron-LM's own pretrain_gpt.py saved in tests/fixtures/megatron_* (scripts/
megatron_checkpoint_fixtures.py): for each fixture's command line and layout, checkpoint/torch_dist/args.py's args
equal them field for field, except the two written otherwise on purpose (checkpoint/torch_dist/args.py) and the
optimizer layout flag of the fixtures Megatron saved dp_reshardable (ours is always written fully_reshardable, and
Megatron-LM's load reads the layout from the content metadata, not from this flag). The fixtures with experts hold
the MoE fields too (num_experts, moe_ffn_hidden_size, the router's, expert_model_parallel_size), which our MoE saves
write.
Before, a rope model's args said add_position_embedding False where Megatron-LM's parser keeps True, and
Megatron-LM refused to continue the save: "add_position_embedding value from checkpoint (False) is not equal to the
input argument value (True)".
"""

from __future__ import annotations

import types

import pytest

from checkpoint.torch_dist.args import READ_AT_LOAD, megatron_args
from checkpoint.torch_dist.common import ForeignValue, load_common
from tests.checkpoint.test_megatron_checkpoint import NAMES, iteration_dir, record

WRITTEN_OTHERWISE = {"no_save_rng", "iteration"}  # checkpoint/torch_dist/args.py says why


def _ours(name: str) -> dict:
    from arguments.parser import parse_config
    from training.run_settings import resolve_run_settings

    written = record(name)
    flags = written["flags"]
    config = parse_config(flags)
    tp, pp = config.parallel.tensor_model_parallel_size, config.parallel.pipeline_model_parallel_size
    dp = written["world_size"] // (tp * pp)
    vocabulary = int(flags[flags.index("--vocab-size") + 1]) + 1  # NullTokenizer's ids and its end-of-document
    settings = resolve_run_settings(config, vocabulary, tp, dp, "cpu")
    state = types.SimpleNamespace(world_size=written["world_size"], data_parallel_size=dp)
    return vars(megatron_args(settings.config, state, 2, 8))


def _comparable(value):
    return value.value if isinstance(value, ForeignValue) else value


@pytest.mark.parametrize("name", NAMES)
def test_our_args_are_megatron_lms_own_for_the_same_command_line(name):
    megatrons = vars(load_common(iteration_dir(name))["args"])
    ours = _ours(name)
    fields = (set(READ_AT_LOAD) | set(ours)) - WRITTEN_OTHERWISE
    if "dp_reshardable" in name:
        fields.discard("dist_ckpt_optim_fully_reshardable")
    different = {field: (ours.get(field, "(absent)"), _comparable(megatrons.get(field, "(absent)")))
                 for field in sorted(fields) if ours.get(field, "(absent)") != _comparable(megatrons.get(field))}
    assert different == {}
