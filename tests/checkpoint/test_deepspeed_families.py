"""DeepSpeed folders of the Hugging Face families continued here (issue 92 item 4): tests/fixtures/deepspeed_checkpoints'
hf_llama_zero2, hf_llama_zero3, hf_mixtral_zero3 and hf_phi3_zero1, written by DeepSpeed 0.19.8's own engine training
transformers' LlamaForCausalLM, MixtralForCausalLM and Phi3ForCausalLM on 2 gloo ranks
(scripts/tools/deepspeed_checkpoint_fixtures.py, the harness of
tests/checkpoint/test_deepspeed_checkpoints.py's cases, which recorded DeepSpeed's next loss in losses.json).

- The tensors: each of our tensors read from the ZeRO partitions through the family's mapping traced once
  (checkpoint/deepspeed/families.py) equals what --init-from-hf's own conversion makes of the same weights whole
  (checkpoint/hf/source.py load_hf_weights on a folder of DeepSpeed's consolidated tensors), bitwise; Mixtral's
  experts are fused [experts, 2 x ffn, hidden] in transformers 5 and in DeepSpeed's copy; Phi-3's fused names hold
  the model the same flags give Llama's (the export writes it as Llama: the reader finds Phi-3's names next).
- The continuation (slow): pretrain_gpt.py with the run's flags and --load trains iteration 3, and its fp32 loss is
  the one DeepSpeed computed from the same checkpoint (1e-6 relative; measured: bitwise, docs/checkpoints.md).
- Every family read here: the module's parameters by the names DeepSpeed records read as --init-from-hf reads the
  family's saved folder, bitwise, or (GPT-OSS, Apertus, DeepSeek-V3, GLM-4.5) a refusal in one line with the reason.
- A run whose model the parameters do not fit is refused in one line naming each misfit.
"""

from __future__ import annotations

import pytest
import torch

from arguments.parser import parse_config
from base.errors import CheckpointError
from base.options import replace_settings
from checkpoint.deepspeed.files import find_deepspeed_checkpoint
from checkpoint.deepspeed.source import open_deepspeed_source
from checkpoint.deepspeed.stores import read_region
from tests.checkpoint.test_deepspeed_checkpoints import FIXTURES, RECORD, case_model, continues_to_deepspeeds_loss

# each case and the family its parameters are read as: Phi-3's fused names hold the same flags' model as Llama's
FAMILY = {"hf_llama_zero2": "llama", "hf_llama_zero3": "llama", "hf_mixtral_zero3": "mixtral", "hf_phi3_zero1": "phi3"}
CASES = tuple(FAMILY)


def source(case: str, universal: bool = False, *extra: str):
    return open_deepspeed_source(find_deepspeed_checkpoint(FIXTURES / case, universal), case_model(case, *extra))


def hf_folder(case: str, tmp_path):
    """DeepSpeed's tensors of the case, consolidated whole under the module's names, as a transformers folder."""
    import transformers
    from safetensors.torch import save_file

    from scripts.tools.deepspeed_checkpoint_fixtures import TRANSFORMERS_MODELS

    store = source(case).store
    tensors = {name: read_region(store, "fp32", name, tuple(slice(0, n) for n in shape)).contiguous()
               for name, shape in store.shapes.items()}
    config_class, arguments, _ = TRANSFORMERS_MODELS[case.rsplit("_", 1)[0]]
    getattr(transformers, config_class)(**arguments).save_pretrained(str(tmp_path))
    save_file(tensors, str(tmp_path / "model.safetensors"))
    return tmp_path


@pytest.mark.parametrize("case", CASES)
def test_each_tensor_is_what_the_families_own_conversion_makes_of_deepspeeds_weights(case, tmp_path):
    from checkpoint.hf.source import load_hf_weights
    from parallel.state import ParallelState

    src = source(case)
    theirs = load_hf_weights(hf_folder(case, tmp_path), case_model(case), ParallelState(device=torch.device("cpu")))
    info = src.tensors("master")
    assert info.keys() == theirs.keys() and src.format_name.endswith(f"transformers {FAMILY[case]}")
    for name, tensor in info.items():
        ours = src.read("master", name, tuple(slice(0, n) for n in tensor.shape))
        assert torch.equal(ours, theirs[name][:ours.shape[0]]), name  # theirs: padded to 128 vocabulary rows
    # a region of a fused expert's rows reads only its bytes
    name = "blocks.1.mlp.experts.3.dense_h_to_4h_up.weight" if "mixtral" in case else "blocks.1.mlp.dense_h_to_4h_up.weight"
    before = src.store.bytes_read
    assert torch.equal(src.read("master", name, (slice(4, 20), slice(3, 9))), theirs[name][4:20, 3:9])
    assert src.store.bytes_read - before == 16 * 6 * 4


def test_the_moments_and_the_step_come_with_the_weights():
    src = source("hf_mixtral_zero3")
    assert src.keys() == ("master", "exp_avg", "exp_avg_sq") and src.progress().optimizer_step == 2
    moment = src.read("exp_avg_sq", "blocks.0.mlp.router.weight", (slice(0, 4), slice(0, 16)))
    assert moment.shape == (4, 16) and bool((moment > 0).all())


def test_a_start_that_has_not_read_its_tokenizer_maps_at_the_checkpoints_vocabulary():
    """The start's checks run before the tokenizer is read (a HuggingFace tokenizer's vocabulary is then unset): the
    name-only pass needs no vocabulary, and the source presents the rows it holds (the loader compares them)."""
    unset = replace_settings(case_model("hf_mixtral_zero3"), vocab_size=None)
    src = open_deepspeed_source(find_deepspeed_checkpoint(FIXTURES / "hf_mixtral_zero3", False), unset)
    assert src.tensors("master")["word_embeddings.weight"].shape == (101, 16)


def test_a_run_whose_model_the_parameters_do_not_fit_is_refused_in_one_line():
    with pytest.raises(CheckpointError) as error:
        source("hf_llama_zero2", False, "--num-query-groups", "2")
    message = str(error.value)
    assert "\n" not in message and "fit no family read here" in message
    assert "model.layers.0.self_attn.k_proj.weight: shape [8, 16], expected [16, 16]" in message
    with pytest.raises(CheckpointError, match="pass --untie-embeddings-and-output-weights"):
        flags = [flag for flag in RECORD["cases"]["hf_llama_zero2"]["our_flags"] + ["--mock-data"]
                 if flag != "--untie-embeddings-and-output-weights"]
        open_deepspeed_source(find_deepspeed_checkpoint(FIXTURES / "hf_llama_zero2", False),
                              replace_settings(parse_config(flags).model, vocab_size=101))


# ---- every family read here, by the names DeepSpeed records ------------------------------------------------------

# the families whose DeepSpeed folders are refused, and the reason each is
REFUSED = {"gpt_oss": "gate and up columns interleaved, which its conversion transposes and splits",
           "deepseek_v3": "e_score_correction_bias (model.layers.1.mlp.gate.e_score_correction_bias, ...) is a buffer",
           "glm4_moe": "e_score_correction_bias (model.layers.1.mlp.gate.e_score_correction_bias, ...) is a buffer",
           "apertus": "checks the xIELU activation's beta and eps buffers by value",
           "granitemoeshared": "its experts are saved fused (block_sparse_moe.input_linear"}


def family_folder(family: str, path):
    """The family's tiny random folder, as its own --init-from-hf test makes it."""
    import transformers

    from tests.checkpoint import moe_family_folders, test_hf_dense_families
    from tests.checkpoint.test_hf_apertus import random_apertus_folder
    from tests.checkpoint.test_hf_folder_is_the_model import random_weights
    from tests.checkpoint.test_hf_moe import mixtral_folder, qwen2_moe_folder

    made = {"mixtral": mixtral_folder, "qwen2_moe": qwen2_moe_folder, "apertus": random_apertus_folder}
    if family in made:
        return made[family](path)
    if family in moe_family_folders.FAMILIES:
        return moe_family_folders.family_folder(family, path)
    config_class, model_class, extra = test_hf_dense_families.FAMILIES[family]
    model = getattr(transformers, model_class)(getattr(transformers, config_class)(**test_hf_dense_families.COMMON,
                                                                                 **extra))
    random_weights(model, seed=7)
    model.save_pretrained(str(path))
    return path


EVERY_FAMILY = ["qwen2", "qwen3", "mistral", "gemma2", "gemma3_text", "olmo2", "phi3", "phi3_longrope", "llama",
                "mixtral", "qwen2_moe", "qwen3_moe", "olmoe", *REFUSED]


@pytest.mark.parametrize("family", EVERY_FAMILY)
def test_every_familys_parameters_read_as_init_from_hf_reads_its_folder(family, tmp_path):
    """The module's parameters by the names DeepSpeed records (transformers' in-memory names: fused experts), mapped
    and traced for the run's model (the folder's settings), read as --init-from-hf reads the saved folder."""
    import transformers

    from arguments.config import PretrainConfig
    from arguments.hf_config import read_hf_config
    from arguments.hf_folder import architecture_settings
    from checkpoint.deepspeed.families import family_map
    from checkpoint.hf.source import load_hf_weights
    from parallel.state import ParallelState

    folder = family_folder(family, tmp_path / "hf")
    hf = read_hf_config(folder)
    settings = {name: given.value for name, given in architecture_settings(hf).items()}
    model = replace_settings(PretrainConfig().model, **{**settings, "vocab_size": hf.fields["vocab_size"]})
    params = dict(transformers.AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32)
                  .named_parameters())
    shapes = {name: tuple(param.shape) for name, param in params.items()}
    if family in REFUSED:
        with pytest.raises(CheckpointError) as error:
            family_map(shapes, model)
        assert REFUSED[family] in str(error.value) and "\n" not in str(error.value)
        return
    _, traced = family_map(shapes, model)
    theirs = load_hf_weights(folder, model, ParallelState(device=torch.device("cpu")))
    assert traced.keys() == theirs.keys()
    for name, tensor in traced.items():
        ours = tensor.read(tuple(slice(0, n) for n in tensor.whole_shape),
                           lambda source, region, view: params[source].detach().reshape(view)[region])
        assert torch.equal(ours, theirs[name][:ours.shape[0]]), name  # theirs padded to the vocabulary's multiple


CONTINUED = [(case, False) for case in CASES] + [
    (case, True) for case in CASES if "deepspeed_resumed_from_universal" in RECORD["cases"][case]]


@pytest.mark.slow
@pytest.mark.parametrize("case, universal", CONTINUED)
def test_our_next_iteration_computes_the_loss_deepspeed_computed_from_the_same_checkpoint(case, universal, tmp_path):
    out, _ = continues_to_deepspeeds_loss(case, universal, tmp_path, rel=1e-6)
    assert f"transformers {FAMILY[case]}" in out  # the family found
