"""Every key of DeepSpeed's config JSON, classified: the table is data (keys.toml, in DeepSpeed's order); this
module turns its rows into classifiers and reads back each key's precedence beside the flag it sets."""

from __future__ import annotations

import difflib
import tomllib
from pathlib import Path
from typing import Any, Callable, Optional

from arguments.deepspeed import blocks, precedence
from arguments.deepspeed.precedence import BATCH_IDENTITY, BATCH_IDENTITY_RULE, CHECKPOINT_BLOCK, Precedence
from arguments.deepspeed.verdicts import Classifier, no_effect, only_if, to_flag, unsupported, when_disabled

TABLE = tomllib.loads(Path(__file__).with_name("keys.toml").read_text())

# The blocks read as a whole, by their name in keys.toml.
RULES: dict[str, Classifier] = {
    "optimizer": blocks.classify_optimizer, "scheduler": blocks.classify_scheduler,
    "tensor_parallel": blocks.classify_tensor_parallel, "pipeline": blocks.classify_pipeline,
    "steps_per_print": blocks.classify_steps_per_print, "tensorboard": blocks.classify_tensorboard,
    "wandb": blocks.classify_wandb, "loss_scale": blocks.classify_loss_scale,
    "scale_power": blocks.classify_scale_power, "offload_param": blocks.classify_offload_param,
    "offload_optimizer": blocks.classify_offload_optimizer, "cpu_offload": blocks.classify_cpu_offload,
    "cpu_offload_params": blocks.classify_cpu_offload_params, "grad_accum_dtype": blocks.classify_grad_accum_dtype}

# Named value tests for `accepts = {rule = ...}`.
VALUE_RULES: dict[str, Callable[[Any], bool]] = {
    "null": lambda value: value is None,
    "non_positive_int": lambda value: isinstance(value, int) and value <= 0,
    # DeepSpeed reads only data_sampling's and data_routing's "enabled"
    "data_efficiency_off": lambda value: isinstance(value, dict) and not any(
        isinstance(value.get(part), dict) and value[part].get("enabled", False) is True
        for part in ("data_sampling", "data_routing")),
}


def _accepts(spec: dict) -> Callable[[Any], bool]:
    if "is" in spec:
        return lambda value: value is spec["is"]
    if "equals" in spec:
        return lambda value: value == spec["equals"]
    return VALUE_RULES[spec["rule"]]


def _classifier(row: dict) -> Classifier:
    if "flag" in row:
        return to_flag(row["flag"], row["kind"], getattr(precedence, row["wins"]) if "wins" in row else None)
    if "no_effect" in row:
        return no_effect(row["no_effect"])
    if "unsupported" in row:
        return unsupported(row["unsupported"])
    if "when_disabled" in row:
        return when_disabled(row["when_disabled"])
    if "accepts" in row:
        return only_if(_accepts(row["accepts"]), row["accepted"], row["refused"])
    return RULES[row["rule"]]


TOP_LEVEL_KEYS: dict[str, Classifier] = {key: _classifier(row) for key, row in TABLE["top_level"].items()}
SECTION_KEYS: dict[str, Classifier] = {key: _classifier(row) for key, row in TABLE["section"].items()}
# "bfloat16" is the name the bf16 section had before DeepSpeed renamed it.
SECTION_ALIASES = {"bfloat16": "bf16"}
SECTIONS = sorted({key.split(".")[0] for key in SECTION_KEYS})


def every_documented_key() -> list[str]:
    """The classified keys: the top-level ones and each section's (for the README table and tests)."""
    return sorted(TOP_LEVEL_KEYS) + sorted(SECTION_KEYS)


def nearest_key(key: str) -> Optional[str]:
    found = difflib.get_close_matches(key, every_documented_key(), n=1)
    return found[0] if found else None


# Rules that are no one key's value: the batch identity, and the block implying --checkpoint-activations.
NOT_ONE_KEY: dict[str, Precedence] = {BATCH_IDENTITY: BATCH_IDENTITY_RULE, "activation_checkpointing": CHECKPOINT_BLOCK}


def _precedence_rows() -> dict[str, Precedence]:
    """Each key's precedence, as its row above declares it (`to_flag(..., wins=)`, `@wins({...})`)."""
    rows = dict(NOT_ONE_KEY)
    for prefix, table in (("", TOP_LEVEL_KEYS), ("", SECTION_KEYS), ("optimizer.params.", blocks.OPTIMIZER_PARAMS),
                          ("", {"zero_optimization": blocks.classify_legacy_zero})):
        for key, classify in table.items():
            declared = getattr(classify, "precedence", None)
            rows.update({prefix + key: declared} if isinstance(declared, Precedence) else declared or {})
    return rows


PRECEDENCE: dict[str, Precedence] = _precedence_rows()


def precedence_of(key: str) -> Precedence:
    """The precedence of a JSON key that sets a flag; a key without one is a bug here, not a user error."""
    if key not in PRECEDENCE:
        raise KeyError(f"{key}: a DeepSpeed JSON key that sets a flag declares no precedence in "
                       f"arguments/deepspeed/keys.py")
    return PRECEDENCE[key]
