"""Tensor model parallelism: the TP x DP process grid, autograd collectives for TP regions, the
tensor-parallel layers, vocab-parallel cross entropy and the TP-aware RNG tracker."""
