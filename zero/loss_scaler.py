"""Loss scaling for fp16. The scaler only decides the scale; the optimizer applies it and skips a step whose gradients
overflowed on any rank, a verdict every rank shares, so every rank's scale stays the same."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional


class LossScaler:
    """A static scale: 1.0, or a fixed fp16 scale that skips overflowing steps."""

    def __init__(self, scale: float = 1.0, skips_on_overflow: bool = False) -> None:
        self.scale = float(scale)
        self._skips_on_overflow = skips_on_overflow

    @property
    def skips_on_overflow(self) -> bool:
        return self._skips_on_overflow

    def update(self, overflow: bool) -> None:
        """Called once per optimizer step with the agreed overflow verdict."""

    def state_dict(self) -> dict:
        return {"scale": self.scale}

    def load_state_dict(self, state: dict) -> None:
        self.scale = float(state["scale"])


@dataclass
class DynamicLossScaler(LossScaler):
    """Halve the scale after `hysteresis` overflows (not below `min_scale`); double it after `growth_interval` clean
    steps."""

    scale: float = 2.0 ** 16
    growth_interval: int = 1000
    hysteresis: int = 2
    min_scale: float = 1.0
    backoff_factor: float = 0.5
    growth_factor: float = 2.0

    def __post_init__(self) -> None:
        self.scale = float(self.scale)
        self._hysteresis_left = self.hysteresis
        self._good_steps = 0

    @property
    def skips_on_overflow(self) -> bool:
        return True

    def update(self, overflow: bool) -> None:
        if overflow:
            self._good_steps = 0
            self._hysteresis_left -= 1
            if self._hysteresis_left <= 0:
                self.scale = max(self.scale * self.backoff_factor, self.min_scale)
            return
        self._good_steps += 1
        if self._good_steps == self.growth_interval:
            self._good_steps = 0
            self._hysteresis_left = self.hysteresis
            self.scale *= self.growth_factor

    def state_dict(self) -> dict:
        return {"scale": self.scale, "good_steps": self._good_steps, "hysteresis_left": self._hysteresis_left}

    def load_state_dict(self, state: dict) -> None:
        self.scale = float(state["scale"])
        self._good_steps = int(state["good_steps"])
        self._hysteresis_left = int(state["hysteresis_left"])


def build_loss_scaler(fp16: bool, static_scale: Optional[float], initial_scale: float, growth_interval: int,
                      hysteresis: int, min_scale: float) -> LossScaler:
    if not fp16:
        return LossScaler(1.0)
    if static_scale is not None:
        return LossScaler(static_scale, skips_on_overflow=True)
    return DynamicLossScaler(scale=initial_scale, growth_interval=growth_interval, hysteresis=hysteresis,
                             min_scale=min_scale)
