"""Nothing moves (issue 112): our model's `named_parameters()` -- names, shapes and order -- equal the lists recorded
in tests/fixtures/parameter_names.json before the model's modules were split. Initial values are a function of a
parameter's name, and every checkpoint format and HF family maps these names, so a refactor must keep them exactly.

Recorded, each from its command line (kept in the fixture, so the comparison replays it and recomputes nothing of the
expected side), built at TP 1 on one process on the meta device:
- every `--config` preset (configs/models, its folders included) at its real size, except the MoE presets, whose
  128-256 experts a layer take seconds a layer to build: those are cut to their first 4 layers (`--num-layers 4`
  and `--moe-layer-freq` their first 4 entries), so dense and MoE layers both stay. A preset without a vocabulary
  (its tokenizer gives it at run time) gets GPT-2's, 50257;
- small GPT configurations of each feature that changes the parameters (MLA, MoE, q/k norms, gates, sinks, sublayer
  norms, MTP, untied output, a hybrid pattern);
- every HF family's tiny folder as the family tests make it (`--init-from-hf`; its config.json is recorded).

A deliberate change re-records: `python -m tests.gpt.test_parameter_names_recorded --record`. The lists are stored
folded (a run of numbered modules with equal contents, such as a model's blocks or a layer's experts, is written
once with its first number and count); the test unfolds them and compares the whole lists.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest
import torch

from arguments.parser import parse_config
from gpt.model import GPTModel
from parallel.state import ParallelState

ROOT = Path(__file__).parents[2]
FIXTURE = ROOT / "tests" / "fixtures" / "parameter_names.json"
PRESETS = ROOT / "configs" / "models"
FOLDER = "{folder}"  # where an argv names the HF folder the test writes the recorded config.json into
META = ParallelState(device=torch.device("meta"))

STAND_IN_VOCAB = "50257"  # GPT-2's, which the presets without a vocabulary name as their tokenizer
MOE_PRESET_LAYERS = 4
SMALL = ["--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4", "--seq-length", "16",
         "--max-position-embeddings", "16", "--vocab-size", "64"]
MOE = ["--num-experts", "4", "--moe-router-topk", "2", "--moe-ffn-hidden-size", "24"]
ROPE = ["--position-embedding-type", "rope", "--normalization", "RMSNorm"]
FEATURES = {
    "gpt2": [],
    "llama": [*ROPE, "--swiglu", "--num-query-groups", "2", "--untie-embeddings-and-output-weights",
              "--disable-bias-linear"],
    "qkv-bias": ["--disable-bias-linear", "--add-qkv-bias"],
    "layernorm-1p": ["--apply-layernorm-1p"],
    "mla": [*ROPE, "--multi-latent-attention", "--kv-lora-rank", "8"],
    "mla-q-lora-qk-layernorm": [*ROPE, "--multi-latent-attention", "--q-lora-rank", "16", "--kv-lora-rank", "8",
                                "--qk-layernorm"],
    "moe": MOE,
    "moe-dense-first": [*MOE, "--moe-layer-freq", "[0,1]"],
    "moe-shared-experts": [*MOE, "--moe-shared-expert-intermediate-size", "32", "--moe-shared-expert-gate"],
    "moe-grouped-gemm": [*MOE, "--moe-grouped-gemm", "--swiglu"],
    "moe-biases": [*MOE, "--add-bias-linear", "--moe-router-enable-expert-bias", "--moe-router-score-function",
                   "sigmoid"],
    "qk-layernorm": ["--qk-layernorm"],
    "qk-layernorm-over-projection": ["--qk-layernorm", "--qk-layernorm-over-projection"],
    "qk-l2-norm": [*ROPE, "--qk-l2-norm"],
    "attention-output-gate": ["--attention-output-gate"],
    "learnable-softmax": ["--softmax-type", "learnable"],
    "sublayer-norms-output": ["--sublayer-norms", "output"],
    "sublayer-norms-both": ["--sublayer-norms", "input_and_output"],
    "mtp": [*ROPE, "--mtp-num-layers", "1", "--untie-embeddings-and-output-weights"],
    "untied": ["--untie-embeddings-and-output-weights"],
}
HYBRID = ["--hidden-size", "32", "--num-attention-heads", "4", "--seq-length", "16", "--max-position-embeddings",
          "16", "--vocab-size", "64", "--hybrid-layer-pattern", "*-*E", *MOE]


def parameter_rows(argv: list[str]) -> list[list]:
    """[name, shape] of each of the model's parameters, in named_parameters() order, built on the meta device."""
    model = GPTModel(parse_config(argv).model, META)
    return [[name, list(param.shape)] for name, param in model.named_parameters()]


# ---- the folded form: {"from", "count", "prefix", "rows"} stands for `count` numbered copies of `rows` -------------

NUMBERED = re.compile(r"^(.*?\.)?(\d+)\.(.+)$")  # the first numbered module in a name: blocks.3.<rest>


def fold(rows: list[list]) -> list:
    folded: list = []
    index = 0
    while index < len(rows):
        match = NUMBERED.match(rows[index][0])
        if match is None:
            folded.append(rows[index])
            index += 1
            continue
        prefix, number = match.group(1) or "", int(match.group(2))
        head = f"{prefix}{number}."
        end = index
        while end < len(rows) and rows[end][0].startswith(head):
            end += 1
        inner = fold([[name[len(head):], shape] for name, shape in rows[index:end]])
        last = folded[-1] if folded else None
        if isinstance(last, dict) and last["prefix"] == prefix and last["from"] + last["count"] == number \
                and last["rows"] == inner:
            last["count"] += 1
        else:
            folded.append({"prefix": prefix, "from": number, "count": 1, "rows": inner})
        index = end
    return folded


def unfold(folded: list) -> list[list]:
    rows = []
    for entry in folded:
        if isinstance(entry, dict):
            for number in range(entry["from"], entry["from"] + entry["count"]):
                rows += [[f"{entry['prefix']}{number}.{name}", shape] for name, shape in unfold(entry["rows"])]
        else:
            rows.append(entry)
    return rows


# ---- the comparison ---------------------------------------------------------------------------------------------

RECORDED = json.loads(FIXTURE.read_text()) if FIXTURE.is_file() else {}


def first_difference(expected: list[list], built: list[list]) -> str:
    for index, (want, have) in enumerate(zip(expected, built)):
        if want != have:
            return f"row {index}: recorded {want}, built {have}"
    return f"recorded {len(expected)} rows, built {len(built)}"


@pytest.mark.parametrize("name", sorted(RECORDED))
def test_named_parameters_equal_the_recorded_list(name, tmp_path):
    entry = RECORDED[name]
    if "config_json" in entry:
        (tmp_path / "config.json").write_text(json.dumps(entry["config_json"]))
    argv = [str(tmp_path) if value == FOLDER else value for value in entry["argv"]]
    expected, built = unfold(entry["parameters"]), parameter_rows(argv)
    assert expected == built, f"{name}: {first_difference(expected, built)}"


def preset_names() -> list[str]:
    return sorted(str(path.relative_to(PRESETS).with_suffix("")) for path in PRESETS.rglob("*.yaml"))


def test_every_preset_and_family_is_recorded():
    """A new preset or HF family is recorded too (`--record`), so the list covers what users build."""
    from families import registry

    assert {f"preset:{name}" for name in preset_names()} <= set(RECORDED)
    assert {family.name for family in registry.registered()} <= {entry.get("family") for entry in RECORDED.values()}


def test_the_folded_form_unfolds_to_the_rows_it_was_made_of():
    """Equal numbered runs fold into one entry, unequal ones stay apart, and unfolding gives the rows back."""
    experts = {0: 2, 1: 2, 2: 3}  # layers 0 and 1 alike, layer 2 one expert more
    rows = [["embed.weight", [8, 4]]] + [[f"blocks.{layer}.experts.{expert}.w", [2]] for layer in range(3)
                                        for expert in range(experts[layer])] + [["blocks.3.norm", [4]], ["out", [1]]]
    folded = fold(rows)
    assert unfold(folded) == rows
    assert [(entry["from"], entry["count"]) for entry in folded if isinstance(entry, dict)] == [(0, 2), (2, 1), (3, 1)]


# ---- the recording ----------------------------------------------------------------------------------------------

def preset_argv(name: str) -> list[str]:
    argv = ["--config", name]
    model = parse_config(argv).model
    if model.vocab_size < 1:
        argv += ["--vocab-size", STAND_IN_VOCAB]
    moe_layers = model.moe_layers()
    if any(moe_layers):
        first = moe_layers[:MOE_PRESET_LAYERS]
        argv += ["--num-layers", str(len(first)), "--moe-layer-freq", "[" + ",".join(str(int(moe)) for moe in first)
                 + "]"]
    return argv


def family_folders(path: Path) -> dict[str, tuple[str, Path]]:
    """{case: (family, folder)}: each HF family's tiny folder, made by its own test's helper."""
    import transformers

    from tests.checkpoint import moe_family_folders
    from tests.checkpoint.test_hf_apertus import random_apertus_folder
    from tests.checkpoint.test_hf_dense_families import COMMON, FAMILIES
    from tests.checkpoint.test_hf_folder_is_the_model import gpt2_folder, llama_folder
    from tests.checkpoint.test_hf_moe import mixtral_folder, qwen2_moe_folder
    from tests.checkpoint.test_hf_nemotron_h import nemotron_h_folder
    from tests.checkpoint.test_hf_qwen3_next import qwen3_next_folder

    folders = {}
    for case, (config_class, _, extra) in FAMILIES.items():
        folder = path / case
        getattr(transformers, config_class)(**COMMON, **extra).save_pretrained(str(folder))
        family = "gemma3" if case == "gemma3_text" else case.split("_longrope")[0]
        folders[f"{case}-dense-test"] = (family, folder)
    for family in moe_family_folders.FAMILIES:
        folders[family] = (family, moe_family_folders.family_folder(family, path / family))
    for family, make in {"gpt2": gpt2_folder, "llama": llama_folder, "mixtral": mixtral_folder,
                         "qwen2_moe": qwen2_moe_folder, "apertus": random_apertus_folder,
                         "qwen3_next": qwen3_next_folder, "nemotron_h": nemotron_h_folder}.items():
        folders[family] = (family, make(path / family))
    return folders


def record() -> dict:
    import tempfile

    entries = {f"preset:{name}": {"argv": preset_argv(name)} for name in preset_names()}
    entries.update({f"feature:{name}": {"argv": [*SMALL, *flags]} for name, flags in FEATURES.items()})
    entries["feature:hybrid-layer-pattern"] = {"argv": HYBRID}
    with tempfile.TemporaryDirectory() as made:
        for case, (family, folder) in family_folders(Path(made)).items():
            config_json = json.loads((folder / "config.json").read_text())
            # the folder's vocabulary is its tokenizer's, which these folders lack: given as the family tests' runs do
            argv = ["--init-from-hf", FOLDER, "--seq-length", "16", "--vocab-size", str(config_json["vocab_size"])]
            entries[f"family:{case}"] = {"family": family, "argv": argv, "config_json": config_json}
    for entry in entries.values():
        argv = entry["argv"]
        if "config_json" in entry:
            with tempfile.TemporaryDirectory() as folder:
                (Path(folder) / "config.json").write_text(json.dumps(entry["config_json"]))
                argv = [folder if value == FOLDER else value for value in argv]
                entry["parameters"] = fold(parameter_rows(argv))
        else:
            entry["parameters"] = fold(parameter_rows(argv))
    return entries


if __name__ == "__main__":
    if sys.argv[1:] != ["--record"]:
        sys.exit("usage: python -m tests.gpt.test_parameter_names_recorded --record")
    recorded = record()
    FIXTURE.write_text("{\n" + ",\n".join(f"{json.dumps(name)}: {json.dumps(entry, separators=(',', ':'))}"
                                          for name, entry in sorted(recorded.items())) + "\n}\n")
    print(f"{FIXTURE.relative_to(ROOT)}: {len(recorded)} models, {FIXTURE.stat().st_size} bytes")
