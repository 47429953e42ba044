"""The Megatron -> HF export's settings are the run's args, and a config.json field they do not give is named (issue
92 item 5): checkpoint/megatron_hf.py megatron_settings and checkpoint/megatron_hf_fields.py.

The args are Megatron-LM's own (tests/fixtures/megatron_moe_ep2's common.pt, read, never written); values a run
could have given other than the fixture's are set on an in-memory copy of its args, each to a value this project's
default is not, so a default taken in its place fails the test.
"""

from __future__ import annotations

import copy

import pytest

from base.options import setting_value
from checkpoint.megatron_hf import megatron_settings
from checkpoint.megatron_hf_fields import unsourced_fields
from checkpoint.torch_dist.common import load_common
from tests.checkpoint.test_megatron_checkpoint import iteration_dir

# Megatron-LM's arg -> (our setting, a value no default here has)
RUN_VALUES = {"hidden_dropout": ("hidden_dropout", 0.03), "attention_dropout": ("attention_dropout", 0.07),
              "moe_aux_loss_coeff": ("moe_aux_loss_coeff", 0.01), "moe_z_loss_coeff": ("moe_z_loss_coeff", 0.002),
              "layernorm_epsilon": ("layernorm_epsilon", 3e-6), "rotary_base": ("rotary_base", 500000),
              "init_method_std": ("init_method_std", 0.011), "use_rope_scaling": ("use_rope_scaling", True),
              "rope_scaling_factor": ("rope_scaling_factor", 16.0), "rotary_percent": ("rotary_percent", 0.5)}


def common_with(**changes) -> dict:
    """The MoE fixture's common.pt with its args changed in memory (None: the arg removed)."""
    common = copy.deepcopy(load_common(iteration_dir("megatron_moe_ep2")))
    for name, value in changes.items():
        if value is None:
            delattr(common["args"], name)
        else:
            setattr(common["args"], name, value)
    return common


def test_every_setting_the_export_writes_is_the_runs_arg():
    config, given = megatron_settings(common_with(**{arg: value for arg, (_, value) in RUN_VALUES.items()}))
    for arg, (setting, value) in RUN_VALUES.items():
        assert setting_value(config, setting) == value, arg
        assert setting in given


def test_megatron_lms_one_element_list_is_its_value_and_a_longer_one_is_not_given():
    config, given = megatron_settings(common_with(moe_aux_loss_coeff=[0.01]))  # nargs='+' before validate_args
    assert setting_value(config, "moe_aux_loss_coeff") == 0.01 and "moe_aux_loss_coeff" in given
    _, given = megatron_settings(common_with(moe_aux_loss_coeff=[0.01, 0.001]))  # one per balancing type
    assert "moe_aux_loss_coeff" not in given


def test_a_field_whose_setting_the_args_lack_is_named_with_its_value():
    _, given = megatron_settings(common_with(moe_aux_loss_coeff=None, attention_dropout=None))
    written = {"router_aux_loss_coef": 0.0, "attention_dropout": 0.1, "hidden_size": 16, "use_cache": True,
               "rope_parameters": {"rope_type": "llama3", "rope_theta": 10000, "low_freq_factor": 1.0},
               "architectures": ["MixtralForCausalLM"]}
    assert unsourced_fields(written, given) == [
        " note: config.json attention_dropout = 0.1: the run's args do not hold attention_dropout",
        " note: config.json router_aux_loss_coef = 0.0: the run's args do not hold moe_aux_loss_coeff",
        " note: config.json use_cache = true: transformers' generation switch"]


@pytest.mark.parametrize("written", [{"hidden_size": 16}, {"rope_parameters": {"rope_theta": 10000}}])
def test_a_field_the_args_give_is_not_named(written):
    _, given = megatron_settings(common_with())
    assert unsourced_fields(written, given) == []


def test_the_end_of_document_id_is_the_null_tokenizers_and_another_tokenizers_is_named():
    from checkpoint.megatron_hf import end_of_document_id

    common = common_with()
    assert end_of_document_id(vars(common["args"])) == 127  # the fixture's --vocab-size 127, then its EOD
    _, given = megatron_settings(common_with(tokenizer_type="GPT2BPETokenizer"))
    assert unsourced_fields({"eos_token_id": None}, given) == [
        " note: config.json eos_token_id = null: the run's args do not hold its end-of-document id (its tokenizer's "
        "files are not saved with the checkpoint)"]
