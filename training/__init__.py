"""The training program: the build shared with the planner, the loop, exit conditions, metrics and their sinks."""
