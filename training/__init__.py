"""The training program: the build shared with the planner, the loop, the frozen run plan, exit
conditions, metrics and their sinks (metrics.jsonl, W&B, TensorBoard)."""
