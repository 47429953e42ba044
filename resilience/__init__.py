"""Resilience of a training run, a floor below training/: watched and in-process-restarted runs, the rerun state
machine, the fault injector, fault-tolerance sections, the recovery line and the straggler report."""
