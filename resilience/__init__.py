"""Resilience on a training run, a floor below training/ (which calls it): the watched and in-process-restarted
runs, the rerun state machine and its loss checks, the fault injector armed by the loop, the fault-tolerance
sections and their monitor, the recovery line, the straggler report."""
