"""Where this rank's ZeRO states live (host or device), decided once from the offload flags and handed to what holds
them, so nothing reads the flags again."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Placement:
    # ZeRO-3 Offload: the 16-bit parameter shard in host memory
    parameter_shard_on_host: bool = False
    # ZeRO-Offload: master, moments and gradient partition on the host
    optimizer_on_host: bool = False
    pin_memory: bool = False
    # --optimizer-offload-fraction F < 1: the first F of the partition on the host
    optimizer_host_fraction: float = 0.0

    @property
    def pins(self) -> bool:
        return self.pin_memory and torch.cuda.is_available()

    @property
    def optimizer_split(self) -> bool:
        return 0.0 < self.optimizer_host_fraction < 1.0


def placement_of(zero_config) -> Placement:
    """Offloaded whole at fraction 1 (Megatron-LM's default), split below it."""
    fraction = zero_config.optimizer_offload_fraction if zero_config.offload_optimizer else 0.0
    return Placement(parameter_shard_on_host=zero_config.offload_param, optimizer_on_host=fraction == 1.0,
                     pin_memory=zero_config.offload_pin_memory,
                     optimizer_host_fraction=fraction if 0.0 < fraction < 1.0 else 0.0)
