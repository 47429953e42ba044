#!/usr/bin/env python
"""`python scripts/tools/convert_to_hf.py CKPT OUT_DIR` = `zero-gpt-convert CKPT OUT_DIR`
(checkpoint/convert_to_hf.py)."""
import os
import sys

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, REPO_ROOT)  # the repo root holds `checkpoint`
from checkpoint.convert_to_hf import main  # noqa: E402  (needs the path above)

if __name__ == "__main__":
    sys.exit(main())
