"""`python -m zero.plan`: the planner's command line (planner/plan.py), kept where users type it."""

import sys

from planner.plan import command

if __name__ == "__main__":
    sys.exit(command())
