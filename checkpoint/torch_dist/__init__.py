"""Megatron-LM's torch_dist format (Megatron-Core's dist_checkpointing over torch.distributed.checkpoint): read
(source.py through dcp_reader.py, the registry's handler resume.py) and written (writer.py, --ckpt-format torch_dist)."""
