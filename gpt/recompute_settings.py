"""The recomputation section: Megatron-LM's --recompute-modules, read only under --recompute-granularity selective;
"layernorm" makes a block's input and pre-MLP norms keep only their input."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import ClassVar

from base.options import option

# Megatron-Core's recompute_modules choices
RECOMPUTE_MODULES = ("core_attn", "moe_act", "layernorm", "mla_up_proj", "mlp", "moe", "shared_experts")


class TupleOfValues(argparse.Action):
    """nargs' values as a tuple, so a ModelConfig stays hashable."""

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
