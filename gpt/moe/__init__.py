"""Mixture of experts as Megatron-Core defines it: router, balancing losses, experts, token dispatchers and the layer
joining them."""
