"""Megatron-LM's pretrain_hybrid.py launches, as written: pretrain_gpt.py under the name its scripts call.

    torchrun --nproc-per-node 2 pretrain_hybrid.py --hybrid-layer-pattern '*-*E|*E*E' --num-experts 4 \
        --spec megatron.core.models.hybrid.hybrid_layer_specs hybrid_stack_spec --pipeline-model-parallel-size 2 ...

--hybrid-layer-pattern sets the depth (no --num-layers needed), the MoE blocks, the pipeline stages and the MTP
depth (gpt/hybrid_pattern.py, arguments/megatron/hybrid_layer_pattern.py); the model is the GPT blocks the same
settings build from pretrain_gpt.py's flags. `--spec` naming Megatron-Core's hybrid stack and `--is-hybrid-model`
are accepted beside the pattern. Every other flag is pretrain_gpt.py's.
"""

from __future__ import annotations

import sys
from typing import Optional, Sequence

from base.errors import run_tool
from data import DataError
from pretrain_gpt import initialize_and_run

PROGRAM = "pretrain_hybrid.py"


def main(argv: Optional[Sequence[str]] = None) -> int:
    return run_tool(PROGRAM, lambda: initialize_and_run(argv), (DataError,))


if __name__ == "__main__":
    sys.exit(main())
