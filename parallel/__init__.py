"""The process grid and what runs over it: the named mesh and its `ParallelState`, `parallel.comm` (every collective
passes through it and is counted), tensor-parallel layers, sharding records, initial values, vocab-parallel cross
entropy, RNG streams, pipeline schedules, context parallelism and FP8 GEMMs."""
