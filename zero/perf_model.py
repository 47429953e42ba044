"""`python -m zero.perf_model`: the performance model's command line, kept where users type it
(planner/perf_cli.py; the model is planner/perf_model.py)."""

import sys

from planner.perf_cli import command

if __name__ == "__main__":
    sys.exit(command())
