"""The recomputation section of the model's settings (base/options.py section()): Megatron-LM's --recompute-modules
(TransformerConfig.recompute_modules), read under --recompute-granularity selective only, as Megatron-Core
(arguments/megatron/flags.py empties it otherwise, said). gpt/model.py's blocks read it: "layernorm" makes each
block's input and pre-MLP RMSNorm keep only its input and run again in backward (gpt/norms.py rms_norm,
gpt/recomputed.py)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import ClassVar

from base.options import option

# Megatron-Core's TransformerConfig.recompute_modules choices (transformer_config.py __post_init__'s allowed_modules)
RECOMPUTE_MODULES = ("core_attn", "moe_act", "layernorm", "mla_up_proj", "mlp", "moe", "shared_experts")


class TupleOfValues(argparse.Action):
    """nargs' values as a tuple: a ModelConfig stays hashable (gpt/shape.py keys its shapes by the config's values)."""

    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, tuple(values))


@dataclass(frozen=True)
class RecomputeSettings:
    SETTING_PREFIX: ClassVar[str] = "recompute_"

    modules: tuple[str, ...] = option(
        (), nargs="+", choices=RECOMPUTE_MODULES, action=TupleOfValues,
        help="with --recompute-granularity selective, what of each layer is recomputed in backward (Megatron-LM's "
             "names): layernorm keeps only each block's RMSNorms' input (2 bytes a value in 16 bits where autograd "
             "keeps 6: its fp32 copy and the normed values) and runs their forward again in backward; core_attn is "
             "SDPA's own (it stores no scores); the others are accepted with no effect")
