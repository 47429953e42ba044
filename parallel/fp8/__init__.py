"""FP8 GEMMs through torch._scaled_mm: one kernel path, TransformerEngine's recipes' scales and casts, and the FP8
linear's forward and backward."""
