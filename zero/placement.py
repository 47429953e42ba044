"""Where this rank's ZeRO states live: decided once, read by what holds them.

`placement_of` reads --offload-param, --offload-optimizer and --optimizer-offload-fraction (DeepSpeed's
zero_optimization.offload_param / offload_optimizer; Megatron-LM's --optimizer-cpu-offload) in zero/apply.py's
build_zero, once; the stage-3 parameter storage (zero/param_storage.py), its gatherer (zero/stage3.py), the optimizer
(zero/offload.py or zero/hybrid_offload.py, chosen by apply.py) and the memory report (zero/memory.py) are handed the
`Placement` and none of them reads the flags again.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Placement:
    # ZeRO-3 Offload: the 16-bit parameter shard in host memory (each gather copies its piece to the device)
    parameter_shard_on_host: bool = False
    # ZeRO-Offload: the fp32 master, the Adam moments and the fp32 gradient partition in host memory, stepped there
    optimizer_on_host: bool = False
    pin_memory: bool = False  # page-lock the host buffers (where CUDA is present)
    # Megatron-LM's hybrid optimizer (--optimizer-offload-fraction F, 0 < F < 1): the master and moments of the first
    # F of the partition in host memory, stepped there, the rest on the device (0.0: no such split)
    optimizer_host_fraction: float = 0.0

    @property
    def pins(self) -> bool:
        return self.pin_memory and torch.cuda.is_available()

    @property
    def optimizer_split(self) -> bool:
        """Whether the optimizer partition is split between host and device (zero/hybrid_offload.py)."""
        return 0.0 < self.optimizer_host_fraction < 1.0


def placement_of(zero_config) -> Placement:
    """The placement a ZeroConfig asks for: the optimizer offloaded whole at fraction 1 (Megatron-LM's default, and
    --offload-optimizer's), split below it, not at all at 0."""
    fraction = zero_config.optimizer_offload_fraction if zero_config.offload_optimizer else 0.0
    return Placement(parameter_shard_on_host=zero_config.offload_param, optimizer_on_host=fraction == 1.0,
                     pin_memory=zero_config.offload_pin_memory,
                     optimizer_host_fraction=fraction if 0.0 < fraction < 1.0 else 0.0)
