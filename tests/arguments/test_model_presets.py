"""The presets for the models users plan most (issue 94): Llama 3 70B, Llama 3.1 405B, Qwen3 30B-A3B and 235B-A22B,
DeepSeek-V3. Each is the model its released config.json describes: where the repository holds that file
(tests/fixtures/hf_configs), the preset and `--init-from-hf` of the folder build the same model, setting for
setting; each has the parameter count of its published size."""

import pytest

from arguments.parser import parse_config
from planner.bridge_rows import HF_CONFIGS
from training.metrics import parameter_count

# Counted by this repository's model on the preset's vocabulary, unpadded (each divides by 128): Llama 3 70B's is
# its safetensors index's total_size / 2 (bf16), the others match their model cards' rounded sizes (Llama 3.1
# 405B; Qwen3's "30.5B" and "235B"; DeepSeek-V3's 671B, its 14B multi-token-prediction module apart).
PARAMETERS = {"llama3-70b": 70_553_706_496, "llama3.1-405b": 405_853_388_800, "qwen3-30b-a3b": 30_532_122_624,
              "qwen3-235b-a22b": 235_093_634_560, "deepseek-v3": 671_026_404_352}
PUBLISHED_BILLIONS = {"llama3-70b": 70.6, "llama3.1-405b": 405.9, "qwen3-30b-a3b": 30.5, "qwen3-235b-a22b": 235.1,
                      "deepseek-v3": 671.0}
# The folder's marker of its family (arguments/hf_folder.py: what the HF export and the family checks read) and
# its vocabulary, which the folder gives as the tokenizer's: not model settings a preset sets
FOLDER_ONLY = ("hf_model_type", "vocab_size")


@pytest.mark.parametrize("name", sorted(PARAMETERS))
def test_each_preset_has_its_published_size(name):
    model = parse_config(["--config", name]).model
    assert model.padded_vocab_size() == model.vocab_size  # no padding at TP 1: the published count has none
    count = parameter_count(model, model.vocab_size)
    assert count == PARAMETERS[name] and round(count / 1e9, 1) == PUBLISHED_BILLIONS[name]


def _settings(section: dict, prefix: str = "") -> dict:
    """A config's model settings by name, its sections' included (the names --print-config shows)."""
    flat = {}
    for key, value in section.items():
        flat.update(_settings(value, f"{prefix}{key}.") if isinstance(value, dict) else {f"{prefix}{key}": value})
    return flat


@pytest.mark.parametrize("name", ["qwen3-30b-a3b", "qwen3-235b-a22b", "deepseek-v3"])
def test_the_preset_and_the_released_config_build_the_same_model(name):
    preset = parse_config(["--config", name])
    folder = parse_config(["--init-from-hf", str(HF_CONFIGS / name), "--seq-length", str(preset.model.seq_length)])
    mine, theirs = _settings(preset.to_dict()["model"]), _settings(folder.to_dict()["model"])
    differ = {key for key in mine.keys() | theirs.keys() if mine.get(key) != theirs.get(key)}
    # DeepSeek-V3's dense first layers: the preset writes Megatron's pattern, the folder its expanded list
    assert {key.rsplit(".", 1)[-1] for key in differ} <= {*FOLDER_ONLY, "moe_layer_freq"}, differ
    assert preset.model.moe_layers() == folder.model.moe_layers()
    vocab = preset.model.vocab_size
    assert parameter_count(preset.model, vocab) == parameter_count(folder.model, vocab)
