"""Megatron-LM's pretrain_hybrid.py launches, as written: pretrain_gpt.py under that name. --hybrid-layer-pattern sets
the depth, MoE blocks, stages and MTP depth; `--spec` naming Megatron-Core's hybrid stack and `--is-hybrid-model` are
accepted beside it.
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
