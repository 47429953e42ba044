"""Hugging Face conversion is GPT-2's or Llama's (tests/checkpoint/test_hf_llama.py): a model neither
GPT2LMHeadModel nor LlamaForCausalLM can hold (GPT-2's blocks with rotary positions, say) is refused in one
line naming what a Llama would need, at export (scripts/tools/convert_to_hf.py's to_hf_state_dict, which raised a
KeyError on 'position_embeddings.weight'); at --init-from-hf, the folder's own architecture is the model's, and a
flag that asks for another is refused with the launch's other flag checks."""


import pytest
import torch

from arguments.config import ConfigError, ModelConfig
from arguments.parser import parse_arguments
from base.options import replace_settings
from checkpoint.hf.folders import check_gpt2_shaped, to_hf_state_dict
from gpt.model import build_gpt_model
from parallel.state import ParallelState
from training.late_checks import LATE_CHECKS

TINY = ModelConfig.of(num_layers=1, hidden_size=32, num_attention_heads=4, seq_length=16, max_position_embeddings=16,
                   vocab_size=64)


def test_a_gpt2_model_passes_and_a_llama_shaped_one_is_named():
    check_gpt2_shaped(TINY, "the export")
    llama = replace_settings(TINY, normalization="RMSNorm", swiglu=True, position_embedding_type="rope",
                                untie_embeddings_and_output_weights=True, add_bias_linear=False)
    with pytest.raises(ConfigError) as error:
        check_gpt2_shaped(llama, "the export")
    message = str(error.value)
    assert "\n" not in message
    for flag in ("--normalization RMSNorm", "--swiglu", "--position-embedding-type rope",
                 "--untie-embeddings-and-output-weights", "--disable-bias-linear"):
        assert flag in message


def test_exporting_a_llama_shaped_state_is_one_line_not_a_key_error():
    config = replace_settings(TINY, position_embedding_type="rope")
    state = {name: tensor.detach() for name, tensor in build_gpt_model(config, ParallelState(device=torch.device("cpu")), seed=0).state_dict().items()}
    with pytest.raises(ConfigError, match="--normalization RMSNorm, --swiglu"):
        to_hf_state_dict(state, config)


def test_init_from_hf_with_half_of_llamas_blocks_is_refused_with_the_flags(tmp_path):
    """The folder is read with the flags (arguments/hf_folder.py): a GPT-2 folder with --swiglu is refused
    in the same round as the other flags' problems, naming the flag and the folder's key."""
    from tests.checkpoint.test_hf_checkpoint import random_hf_folder

    folder = random_hf_folder(tmp_path / "gpt2")
    with pytest.raises(ConfigError) as error:
        parse_arguments(["--init-from-hf", str(folder), "--swiglu", "--lr", "nan"], late_checks=LATE_CHECKS)
    message = str(error.value)
    assert "\n" not in message and "--lr" in message  # one round
    assert f"--swiglu on the command line disagrees with the folder's no --swiglu ({folder / 'config.json'}" in message
    with pytest.raises(ConfigError, match="config.json: missing"):  # an empty folder is no model
        parse_arguments(["--init-from-hf", str(tmp_path), "--swiglu", "--normalization", "RMSNorm",
                         "--position-embedding-type", "rope"], late_checks=LATE_CHECKS)
