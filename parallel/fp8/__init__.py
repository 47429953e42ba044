"""FP8 GEMMs through torch._scaled_mm: the one kernel path (kernel.py), TransformerEngine's recipes' scales
and casts (recipes.py, block_scaling.py), and the FP8 linear's forward and backward (linear.py)."""
