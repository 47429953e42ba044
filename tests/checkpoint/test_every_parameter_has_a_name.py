"""Every parameter a built feature adds has a torch_dist name that reads back, and an HF name where its family holds
it (issue 114 item 4).

The models are tests/fixtures/parameter_names.json's (every preset, the small feature models, every HF family's tiny
folder), their parameters the recorded [name, shape] rows (tests/gpt/test_parameter_names_recorded.py keeps them
equal to what the model builds). torch_dist: the writer's placement of each (checkpoint/torch_dist/writer.py), read
back through the reader's table with what the written args say (names.py our_placements, source.py gated_mlp), to
the same place. HF: the family's export (checkpoint/hf/folders.py to_hf_state_dict) of a state whose every parameter
holds its own value must hold every value.

Left without a torch_dist name, each for its reason, and only where the run's start-up line says its save is this
project's format (arguments/config.py megatron_format_unwritten), are BEYOND_MEGATRON's parameters: Megatron-LM has
no flag that builds them, so its layout has no place for them. Left out of an HF export: the MTP layers of a family
whose transformers class has none (FamilyWeights.drops_mtp, said in one line at export).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch

from arguments.parser import parse_config
from checkpoint.hf.folders import to_hf_state_dict
from checkpoint.torch_dist.args import megatron_args
from checkpoint.torch_dist.names import our_placements
from checkpoint.torch_dist.source import gated_mlp
from checkpoint.torch_dist.writer import _placement
from parallel.state import ParallelState
from tests.gpt.test_parameter_names_recorded import FOLDER, RECORDED, unfold

# a parameter's name (its layer's number left out) -> why Megatron-LM's layout has no place for it
BEYOND_MEGATRON = {
    **{f"blocks.N.{norm}.{part}": "--sublayer-norms (Gemma 2/3's and OLMo 2's norms after each sublayer): Megatron-LM "
       "has no such flag" for norm in ("attention_output_layernorm", "mlp_output_layernorm")
       for part in ("weight", "bias")},
    **{f"blocks.N.mlp.activation_func.{alpha}": "--activation xielu (Apertus's learnt alphas): Megatron-LM has no "
       "such activation" for alpha in ("alpha_p", "alpha_n")},
}
NUMBER = re.compile(r"\.\d+\.")


def _config(entry: dict, folder: Path, *extra: str):
    if "config_json" in entry:
        (folder / "config.json").write_text(json.dumps(entry["config_json"]))
    return parse_config([*(str(folder) if value == FOLDER else value for value in entry["argv"]), *extra])


@pytest.mark.parametrize("name", sorted(RECORDED))
def test_every_parameter_has_a_torch_dist_name_that_reads_back(name, tmp_path):
    config = _config(RECORDED[name], tmp_path, "--ckpt-format", "torch_dist", "--save", str(tmp_path / "save"))
    ours = config.megatron_format_unwritten() is not None  # its save is this project's, said at start-up
    args = megatron_args(config, ParallelState(device=torch.device("cpu")), 1, 1)
    gated, mla = gated_mlp(args), bool(getattr(args, "multi_latent_attention", False))
    unplaced, unread = [], []
    for parameter, shape in unfold(RECORDED[name]["parameters"]):
        placed = _placement(parameter, tuple(shape), config)
        if placed is None:
            if not (ours and NUMBER.sub(".N.", parameter, count=1) in BEYOND_MEGATRON):
                unplaced.append(parameter)
            continue
        if ours:  # never written in this layout: the read-back is a Megatron-layout save's
            continue
        placement, global_shape = placed
        back = our_placements(placement.key, global_shape, gated, mla, config.model.hybrid_layer_pattern) or {}
        if back.get(parameter) != placement:
            unread.append(f"{parameter} (as {placement.key})")
    assert unplaced == [], f"{name}: no torch_dist name for {unplaced[:5]}"
    assert unread == [], f"{name}: written but not read back: {unread[:5]}"


FAMILIES = sorted(name for name, entry in RECORDED.items() if "family" in entry)


@pytest.mark.parametrize("name", FAMILIES)
def test_every_parameter_of_a_family_model_has_an_hf_name(name, tmp_path):
    """Parameter k holds 10 k everywhere; an export moves, splits, joins and transposes values, and shifts a gain by
    at most 1 (--apply-layernorm-1p's), so each value found names the parameter it came from."""
    config = _config(RECORDED[name], tmp_path).model
    rows = unfold(RECORDED[name]["parameters"])
    state = {parameter: torch.full(shape, 10.0 * (k + 1)) for k, (parameter, shape) in enumerate(rows)}
    exported = to_hf_state_dict(state, config)
    found = set()
    for tensor in exported.values():
        found.update(torch.round(tensor.double() / 10).long().unique().tolist())
    missing = [parameter for k, (parameter, _) in enumerate(rows) if k + 1 not in found]
    assert missing == [], f"{name}: no HF name for {missing[:5]}"
