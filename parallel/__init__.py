"""The process grid and what runs over it: the named mesh (pp, dp, cp, tp, with the experts' edp x etp x ep folded
over the same ranks: parallel/mesh.py) and its `ParallelState`, `parallel.comm` (the one door through which every
collective and point-to-point send passes and is counted), the tensor-parallel layers and their autograd
collectives, each parameter's sharding record, initial values, vocab-parallel cross entropy, the dropout RNG
streams, pipeline schedules, context parallelism and FP8 GEMMs (docs/layout.md, file by file)."""
