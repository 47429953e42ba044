"""The planner: a dry run builds the whole program on the meta device and reports one rank's memory (`python -m
zero.plan`); the performance model predicts its speed (`python -m zero.perf_model`)."""
