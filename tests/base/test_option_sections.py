"""A component's section of settings (base/options.py section()): each of its fields is a setting of the owner by its
prefixed name, everywhere a flat setting is (the flag, the parse, a recorded config, a rebuild from names)."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import pytest

from arguments.config import PretrainConfig
from arguments.parser import parse_config
from base.options import (
    flag_of,
    option,
    option_fields,
    replace_settings,
    section,
    setting_names,
    setting_value,
    setting_values,
    with_settings,
)
from gpt.model_config import ModelConfig


@dataclasses.dataclass(frozen=True)
class Inner:
    SETTING_PREFIX: ClassVar[str] = "inner_"
    depth: int = option(0, help="how deep")
    scale: float = 0.5


@dataclasses.dataclass(frozen=True)
class Outer:
    width: int = 3
    inner: Inner = section(Inner)
    tail: bool = False


def test_a_sections_fields_are_settings_in_its_place_by_their_prefixed_names():
    assert [field.name for field, _ in option_fields(Outer)] == ["width", "inner_depth", "inner_scale", "tail"]
    assert flag_of(next(field for field, _ in option_fields(Outer) if field.name == "inner_depth")) == "--inner-depth"
    assert setting_names(Outer) == ("width", "inner_depth", "inner_scale", "tail")
    built = with_settings(Outer, {"inner_depth": 2, "tail": True})
    assert built == Outer(tail=True, inner=Inner(depth=2))
    assert setting_values(built) == {"width": 3, "inner_depth": 2, "inner_scale": 0.5, "tail": True}
    assert setting_value(built, "inner_depth") == 2
    assert replace_settings(built, inner_scale=0.25, width=4) == Outer(width=4, inner=Inner(depth=2, scale=0.25),
                                                                        tail=True)
    with pytest.raises(TypeError, match="no setting 'depth'"):  # the section's own name is not the owner's
        with_settings(Outer, {"depth": 2})


def test_the_mtp_section_is_flagged_recorded_and_rebuilt_as_the_flat_settings_were():
    config = parse_config(["--mtp-num-layers", "2", "--mtp-loss-scaling-factor", "0.5", "--position-embedding-type",
                           "rope"])
    assert (config.model.mtp.num_layers, config.model.mtp.loss_scaling_factor) == (2, 0.5)
    recorded = config.to_dict()["model"]  # checkpoint metadata: the names saves of before the section hold
    assert (recorded["mtp_num_layers"], recorded["mtp_loss_scaling_factor"]) == (2, 0.5) and "mtp" not in recorded
    assert PretrainConfig.from_flat({**recorded}).model == config.model
    assert ModelConfig.of(mtp_num_layers=2).mtp.num_layers == 2
