"""`python -m zero.perf_model`: the performance model's command line (planner/perf_cli.py), kept where users type it."""

import sys

from planner.perf_cli import command

if __name__ == "__main__":
    sys.exit(command())
