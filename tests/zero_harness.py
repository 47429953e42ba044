"""ZeRO's reducer and optimizer driven the way training/train_step.py drives them, for tests.

    zero = ZeroHarness(model, optimizer_config, zero_config, state, dtype=torch.bfloat16)
    zero.zero_grad(); zero.backward(loss, last_micro_batch=True); result = zero.step()

`backward` is one micro-batch of the loop: backward under `no_sync()` unless it is the last micro-batch,
then `finish_grad_sync()`. Everything else (layout, master, exp_avg, adam_step, param_groups,
model_state_tensors, ...) is the sharded optimizer's (`.sharded`; `.optimizer` is its torch AdamW);
the storages are reachable by their old names.
"""

from __future__ import annotations

import contextlib
from typing import Optional, Sequence

import torch
from torch import nn

from zero.apply import ZeroParts, apply_zero, build_zero
from zero.flat_buffer import DEFAULT_ALIGNMENT


class ZeroHarness:
    def __init__(self, model: nn.Module, optimizer_config, zero_config, state, *, dtype: torch.dtype = torch.float32,
                 grad_dtype: Optional[torch.dtype] = None, loss_scaler=None,
                 stage3_units: Optional[Sequence[nn.Module]] = None, seed: Optional[int] = None,
                 alignment: int = DEFAULT_ALIGNMENT, decoupled_lr_params: Sequence[nn.Parameter] = (),
                 muon_excluded_params: Sequence[nn.Parameter] = ()) -> None:
        self._adopt(build_zero(model, zero_config, optimizer_config, state, param_dtype=dtype, grad_dtype=grad_dtype,
                               loss_scaler=loss_scaler, seed=seed, blocks=stage3_units, alignment=alignment,
                               decoupled_lr_params=decoupled_lr_params, muon_excluded_params=muon_excluded_params))

    @classmethod
    def from_config(cls, model: nn.Module, config, state, blocks: Optional[Sequence[nn.Module]] = None
                    ) -> "ZeroHarness":
        """What pretrain_gpt.py builds for a (resolved) PretrainConfig."""
        harness = cls.__new__(cls)
        harness._adopt(apply_zero(model, config, state, blocks=blocks))
        return harness

    def _adopt(self, parts: ZeroParts) -> None:
        self.parts, self.reducer, self.sharded = parts, parts.reducer, parts.optimizer

    def zero_grad(self) -> None:
        self.reducer.zero_grad()

    def backward(self, loss: torch.Tensor, last_micro_batch: bool = True) -> None:
        with contextlib.nullcontext() if last_micro_batch else self.reducer.no_sync():
            self.parts.scale_loss(loss).backward()
        self.reducer.finish_grad_sync()

    def step(self):
        return self.sharded.step()

    @property
    def flat_params(self) -> Optional[torch.Tensor]:
        return getattr(self.sharded.parameters, "flat", None)

    @property
    def param_shard(self) -> Optional[torch.Tensor]:
        return getattr(self.sharded.parameters, "shard", None)

    @property
    def gatherer(self):
        return getattr(self.sharded.parameters, "gatherer", None)

    @property
    def flat_grads(self) -> Optional[torch.Tensor]:
        return getattr(self.reducer, "buffer", None)

    @property
    def grad_partition(self) -> Optional[torch.Tensor]:
        return getattr(self.reducer, "partition", None)

    @property
    def adam_step(self) -> int:
        return self.sharded.adam_step

    @adam_step.setter
    def adam_step(self, step: int) -> None:
        self.sharded.adam_step = step

    def __getattr__(self, name: str):
        if name in ("parts", "reducer", "sharded"):  # not adopted yet: no recursion through __getattr__
            raise AttributeError(name)
        return getattr(self.sharded, name)
