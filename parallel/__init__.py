"""Tensor model parallelism."""
