"""Mixture of experts as Megatron-Core defines it (megatron/core/transformer/moe/): the router, the balancing
losses, the experts, the token dispatcher and the layer that joins them (issue 51)."""
