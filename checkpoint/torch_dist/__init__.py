"""Megatron-LM's torch_dist format (Megatron-Core's dist_checkpointing over torch.distributed.checkpoint), read and
written.
"""
