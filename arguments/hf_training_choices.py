"""The training choices besides dropouts a Hugging Face folder's config.json gives and the export writes back:
router_aux_loss_coef as --moe-aux-loss-coeff, initializer_range as --init-method-std. A typed flag that differs wins;
transformers' runtime switches are not read, said once."""

from __future__ import annotations

from families.common.fields import HFConfig
from families.common.reader import FolderValue

# transformers' runtime switches and their defaults (which the export writes)
SWITCHES = {"use_cache": True, "output_router_logits": False}


def folder_training_choices(config: HFConfig) -> tuple[dict[str, FolderValue], list[str]]:
    """The folder's training choices as settings, and the start-up line naming a switch it sets that is not read."""
    choices = {}
    if config.initializer_range > 0:  # 0 initializes nothing; --init-method-std refuses it
        choices["init_method_std"] = FolderValue(config.initializer_range, "initializer_range")
    if "router_aux_loss_coef" in config.values:
        choices["moe_aux_loss_coeff"] = FolderValue(float(config.values["router_aux_loss_coef"]),
                                                    "router_aux_loss_coef")
    unread = [f"{key} {str(config.fields[key]).lower()}" for key, default in SWITCHES.items()
              if key in config.fields and config.fields[key] != default]
    notes = [f"> {config.path}: {', '.join(unread)} not read (transformers' own inference and training switches; "
             f"an export writes their defaults)"] if unread else []
    return choices, notes
