"""`python -m zero.plan`: the planner's command line, kept where users type it. The planner itself
(planner/plan.py) sits on the top floor, since a dry run builds the whole program."""

import sys

from planner.plan import command

if __name__ == "__main__":
    sys.exit(command())
