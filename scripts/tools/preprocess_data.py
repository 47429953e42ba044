"""Megatron-style entry point: `python scripts/tools/preprocess_data.py ...` = `python -m data.preprocess ...`."""
import os
import sys

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, REPO_ROOT)  # the repo root holds `data`
from data.preprocess import main  # noqa: E402  (needs the path above)

if __name__ == "__main__":
    sys.exit(main())
