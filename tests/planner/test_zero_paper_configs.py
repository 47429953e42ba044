"""The ZeRO paper's Table 4 models (configs/models/zero_paper) and its C1-C5 configurations
(configs/zero/zero_paper_c*.json): every row has its configs, every config parses, and each model's
real parameter count agrees with the paper's label, or with the documented exception."""

import dataclasses
import re
import sys
from pathlib import Path

import pytest
import yaml

from arguments.parser import PRESET_DIR, parse_config
from planner.plan import CONFIGURATIONS, GPT2_VOCAB
from training.metrics import parameter_count

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts" / "zero_paper"))
from paper_values import PAPER_TABLE4, PAPER_TABLE4_EXCEPTIONS  # noqa: E402

PAPER_DIR = PRESET_DIR / "zero_paper"
TOLERANCE = 0.05


def presets() -> dict[str, dict]:
    return {path.stem: yaml.safe_load(path.read_text()) for path in sorted(PAPER_DIR.glob("*.yaml"))}


def real_parameters(name: str) -> int:
    config = parse_config(["--config", f"zero_paper/{name}"])
    return parameter_count(dataclasses.replace(config.model, vocab_size=GPT2_VOCAB))


def preset_for(layers: int, hidden: int) -> str:
    matches = [name for name, values in presets().items()
               if values["num_layers"] == layers and values["hidden_size"] == hidden]
    assert len(matches) == 1, f"{layers} x {hidden}: expected one preset in {PAPER_DIR}, found {matches}"
    return matches[0]


def label_range(label: str) -> tuple[float, float]:
    ends = [float(part.rstrip("B")) * 1e9 for part in label.split("-")]
    return ends[0], ends[-1]


TABLE4_ROWS = [(figure, label, layers, hidden) for figure, rows in PAPER_TABLE4.items()
               for label, layers, hidden in rows]


@pytest.mark.parametrize("figure, label, layers, hidden", TABLE4_ROWS,
                         ids=[f"{row[0]}:{row[1]}" for row in TABLE4_ROWS])
def test_every_table4_row_has_configs_whose_size_matches_its_label(figure, label, layers, hidden):
    counts = [real_parameters(preset_for(n, hidden)) for n in layers]
    low, high = label_range(label)
    exception = PAPER_TABLE4_EXCEPTIONS.get(label, "")
    if label == "0B-60B":  # neither end is usable; the note gives the real counts, which must be right
        for count in counts:
            assert f"{count / 1e9:.1f}B" in exception, (count, exception)
        return
    if label != "0B-8B":  # its printed lower end is an OCR error (documented)
        assert abs(counts[0] - low) <= TOLERANCE * low, (label, counts[0])
    if label != "80B-170B":  # its upper end is the next row's (documented)
        assert abs(counts[-1] - high) <= TOLERANCE * high, (label, counts[-1])
    for count in counts:
        assert (1 - TOLERANCE) * low <= count <= (1 + TOLERANCE) * high, (label, count)
    assert counts == sorted(counts)


def test_exceptions_name_only_printed_labels():
    labels = {label for _, label, _, _ in TABLE4_ROWS}
    assert set(PAPER_TABLE4_EXCEPTIONS) <= labels


@pytest.mark.parametrize("name", sorted(presets()))
def test_each_preset_parses_and_its_file_name_gives_its_real_size(name):
    config = parse_config(["--config", f"zero_paper/{name}"])
    config.validate()
    size, shape = re.fullmatch(r"([0-9.]+)b-(\d+x\d+)", name).groups()
    assert shape == f"{config.model.num_layers}x{config.model.hidden_size}"
    count = real_parameters(name)
    assert abs(count - float(size) * 1e9) <= TOLERANCE * count, (name, count)
    # Whole heads for every model-parallel size the experiments use (up to 32 across two DGX-2 nodes).
    assert config.model.num_attention_heads % 16 == 0
    assert config.model.hidden_size % config.model.num_attention_heads == 0
    # The comment at the top states the real count; it must be the one computed here.
    assert f"{count / 1e9:.2f}B parameters" in (PAPER_DIR / f"{name}.yaml").read_text()


@pytest.mark.parametrize("name", sorted(CONFIGURATIONS))
def test_c1_to_c5_json_configs_are_the_planners_configurations(name):
    config = parse_config(["--zero-config", f"zero_paper_{name.lower()}"])
    expected = CONFIGURATIONS[name]
    assert config.zero.stage == expected["stage"]
    assert config.activations.checkpoint_activations
    assert config.activations.partition_activations == expected["partition_activations"]
    assert config.activations.cpu_checkpointing == expected["cpu_checkpointing"]
    assert config.activations.contiguous_checkpointing  # every configuration has M_D (Table 3)


def test_a_preset_in_a_folder_resolves_by_name_and_a_missing_one_is_named(tmp_path):
    from arguments.config import ConfigError

    assert parse_config(["--config", "zero_paper/100b-125x8192"]).model.num_layers == 125
    with pytest.raises(ConfigError, match="zero_paper/no-such"):
        parse_config(["--config", "zero_paper/no-such"])
    own = tmp_path / "mine"  # a path without a suffix still works as a path
    own.write_text("num_layers: 3\n")
    assert parse_config(["--config", str(own)]).model.num_layers == 3
