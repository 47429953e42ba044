"""The gated MLP's activation: act(gate) x (linear + offset), act SiLU (--swiglu), quick_gelu (--quick-geglu,
megatron/core/activations.py: x sigmoid(1.702 x)) or --activation's GeLU (--gated-linear-unit: Gemma's GeGLU), the two halves clamped first under --activation-func-clamp-value
(the gate at most the value, the linear half within +-it), as Megatron-Core's MLP.glu computes it
(megatron/core/transformer/mlp.py: `x_glu.clamp(min=None, max=val)`, `x_linear.clamp(min=-val, max=val)`,
`activation_func(x_glu) * (x_linear + glu_linear_offset)`). GPT-OSS's experts (transformers' GptOssExperts._apply_gate:
`gate * sigmoid(gate * alpha)` times `(up + 1)`, limit 7) are --quick-geglu --glu-linear-offset 1
--activation-func-clamp-value 7.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import torch
import torch.nn.functional as F

QUICK_GELU_ALPHA = 1.702  # megatron/core/activations.py quick_gelu; GPT-OSS's swiglu_alpha


@dataclass(frozen=True)
class GatedActivation:
    quick: bool = False
    clamp: Optional[float] = None
    offset: float = 0.0
    # --gated-linear-unit's gate activation (--activation's GeLU); None: SiLU, or quick_gelu with `quick`
    activation: Optional[Callable[[torch.Tensor], torch.Tensor]] = None

    def __call__(self, gate: torch.Tensor, linear: torch.Tensor) -> torch.Tensor:
        if self.clamp is not None:
            gate, linear = gate.clamp(max=self.clamp), linear.clamp(min=-self.clamp, max=self.clamp)
        if self.activation is not None:
            activated = self.activation(gate)
        else:
            activated = gate * torch.sigmoid(QUICK_GELU_ALPHA * gate) if self.quick else F.silu(gate)
        return activated * (linear + self.offset) if self.offset else activated * linear


SWIGLU = GatedActivation()


def gated_activation(architecture, activation: Optional[Callable[[torch.Tensor], torch.Tensor]] = None
                     ) -> GatedActivation:
    """The blocks' gated activation (gpt/architecture.py's quick_geglu, activation_func_clamp_value,
    glu_linear_offset, gated_linear_unit); `activation` is --activation's function, the gate's under
    --gated-linear-unit."""
    return GatedActivation(architecture.quick_geglu, architecture.activation_func_clamp_value,
                           architecture.glu_linear_offset,
                           activation if architecture.gated_linear_unit else None)
