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


def test_a_yarn_field_megatron_lm_has_no_flag_for_is_named():
    _, given = megatron_settings(common_with())
    assert unsourced_fields({"rope_parameters": {"rope_type": "yarn", "beta_fast": 32.0}}, given) == [
        " note: config.json rope_parameters.beta_fast = 32.0: the run's args do not hold yarn_beta_fast"]


def every_family_config() -> dict[str, tuple[str, dict]]:
    """Each family's tiny config (tests/checkpoint/test_hf_dense_families.py, moe_family_folders.py): family ->
    (transformers' config class, its arguments)."""
    from tests.checkpoint import moe_family_folders as moe
    from tests.checkpoint import test_hf_dense_families as dense

    configs = {family: (config_class, {**dense.COMMON, **extra})
               for family, (config_class, _, extra) in dense.FAMILIES.items()}
    configs.update({family: (config_class, {**moe._COMMON, **extra})
                    for family, (config_class, _, extra) in moe.FAMILIES.items()})
    # the families exported through LlamaForCausalLM's path and GPT-2's
    experts = dict(num_experts_per_tok=2, tie_word_embeddings=False)
    configs.update(mixtral=("MixtralConfig", {**dense.COMMON, **experts, "num_local_experts": 4}),
                   qwen2_moe=("Qwen2MoeConfig", {**dense.COMMON, **experts, "num_experts": 4,
                                                 "moe_intermediate_size": 32, "shared_expert_intermediate_size": 32}),
                   apertus=("ApertusConfig", {**dense.COMMON, "tie_word_embeddings": False}),
                   gpt2=("GPT2Config", dict(vocab_size=dense.VOCAB, n_embd=64, n_layer=2, n_head=4, n_positions=32,
                                            bos_token_id=None, eos_token_id=None)))
    return configs


def test_every_field_any_familys_export_writes_is_a_settings_or_named_with_its_reason(tmp_path):
    """With every setting given, a family's export names only the fields no setting holds: the table leaves none
    of a setting out, so a Megatron-LM run's export names a field only where its args lack what it needs."""
    import json

    import torch
    import transformers

    from arguments.parser import parse_config
    from base.options import setting_names
    from checkpoint.hf.folders import folder_config
    from checkpoint.megatron_hf_fields import END_OF_DOCUMENT
    from gpt.model_config import ModelConfig

    given = frozenset(setting_names(ModelConfig)) | {END_OF_DOCUMENT}
    named = set()
    for family, (config_class, arguments) in every_family_config().items():
        folder = tmp_path / family
        getattr(transformers, config_class)(**arguments).save_pretrained(str(folder))
        model = parse_config(["--init-from-hf", str(folder), "--tokenizer-type", "NullTokenizer", "--mock-data"]).model
        written = json.loads(folder_config(model, None, torch.float32, 0).to_json_string(use_diff=True))
        assert written["model_type"] == family.removesuffix("_longrope")  # exported as that family
        named |= {line.split()[2] for line in unsourced_fields(written, given)}
    assert named == {"use_cache", "pad_token_id", "output_router_logits", "router_jitter_noise", "clip_qkv",
                     "summary_activation", "summary_first_dropout", "summary_proj_to_labels", "summary_type",
                     "summary_use_proj"}
