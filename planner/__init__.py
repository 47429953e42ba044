"""The planner on top of everything: a dry run builds the whole program on the meta device and reports
one rank's memory (`python -m zero.plan`), the performance model predicts its speed
(`python -m zero.perf_model`), and the paper's tables come from the same formulas."""
