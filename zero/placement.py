"""Where this rank's ZeRO states live: decided once, read by what holds them.

`placement_of` reads --offload-param and --offload-optimizer (DeepSpeed's zero_optimization.offload_param /
offload_optimizer) in zero/apply.py's build_zero, once; the stage-3 parameter storage (zero/param_storage.py),
its gatherer (zero/stage3.py), the optimizer (zero/offload.py, chosen by apply.py) and the memory report
(zero/memory.py) are handed the `Placement` and none of them reads the flags again.
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

    @property
    def pins(self) -> bool:
        return self.pin_memory and torch.cuda.is_available()


def placement_of(zero_config) -> Placement:
    """The placement a ZeroConfig asks for."""
    return Placement(parameter_shard_on_host=zero_config.offload_param,
                     optimizer_on_host=zero_config.offload_optimizer, pin_memory=zero_config.offload_pin_memory)
