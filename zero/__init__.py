"""The ZeRO runtime: stages 0-3 (flat buffers, parameter storage, gradient reducer, sharded optimizer,
stage-3 gatherer), the loss scaler, ZeRO-R's activation checkpointing and the memory accounting.
`zero/plan.py` and `zero/perf_model.py` are only the planner's command lines, kept where users type them."""
