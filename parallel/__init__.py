"""Tensor model parallelism and the process grid: the TP x DP groups, `parallel.comm` (the one door
through which every collective passes and is counted), autograd collectives for TP regions, the
tensor-parallel layers, vocab-parallel cross entropy and the TP-aware RNG tracker."""
