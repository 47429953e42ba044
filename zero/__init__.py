"""The ZeRO runtime: stages 0-3, the loss scaler, ZeRO-R's activation checkpointing and the memory accounting."""
