"""Mamba-2's section of the model settings: Megatron-LM's --mamba-* flags and the MambaMixer defaults no flag reaches,
apart from the mixer so ModelConfig need not import it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Optional

from base.errors import ConfigError
from base.options import flag_of_setting, option


@dataclass(frozen=True)
class MambaSettings:
    """An `M` layer's sizes, named as Megatron-LM's dests."""
    SETTING_PREFIX: ClassVar[str] = ""
    # MambaMixer.__init__'s defaults, which Megatron-LM's hybrid stack spec keeps
    CONV_WIDTH: ClassVar[int] = 4
    EXPAND: ClassVar[int] = 2
    CHUNK_SIZE: ClassVar[int] = 128
    DT_MIN: ClassVar[float] = 0.001
    DT_MAX: ClassVar[float] = 0.1
    DT_INIT_FLOOR: ClassVar[float] = 1e-4
    A_INIT_RANGE: ClassVar[tuple[float, float]] = (1.0, 16.0)
    NORM_EPSILON: ClassVar[float] = 1e-5

    mamba_state_dim: int = option(128, help="an `M` layer's SSM state size per group (d_state)")
    mamba_head_dim: int = option(64, help="an `M` layer's head width")
    mamba_num_groups: int = option(8, help="an `M` layer's B and C groups (each shared by its share of the heads)")
    mamba_num_heads: Optional[int] = option(
        None, help="an `M` layer's heads (default: 2 x --hidden-size / --mamba-head-dim, MambaMixer's expand 2)")

    def heads(self, hidden_size: int) -> int:
        """--mamba-num-heads, else d_inner (expand x hidden) over the head width."""
        return self.mamba_num_heads if self.mamba_num_heads is not None else \
            self.EXPAND * hidden_size // self.mamba_head_dim

    def inner_size(self, hidden_size: int) -> int:
        """d_inner: heads times their width."""
        return self.heads(hidden_size) * self.mamba_head_dim

    def validate(self, model, tensor_parallel_size: int = 1) -> None:
        """Under a pattern with `M` layers: the sizes MambaMixer asserts, heads and groups splitting over TP, and no FP8
        (whose in_proj would differ from Megatron's)."""
        pattern, hidden_size = model.hybrid_layer_pattern, model.hidden_size
        if pattern is None or "M" not in pattern:
            return
        if model.fp8.enabled:
            raise ConfigError(f"--fp8-format with `M` (Mamba) layers in {pattern}: their FP8 in-projection is not "
                              f"built; train them without --fp8-format", flags=("--fp8-format", "--hybrid-layer-pattern"))
        for name in ("mamba_state_dim", "mamba_head_dim", "mamba_num_groups", "mamba_num_heads"):
            value = getattr(self, name)
            if value is not None and value < 1:
                flag = flag_of_setting(MambaSettings, name)
                raise ConfigError(f"{flag} must be at least 1, got {value}", flags=(flag,))
        if self.mamba_num_heads is None and (self.EXPAND * hidden_size) % self.mamba_head_dim:
            raise ConfigError(f"--mamba-head-dim {self.mamba_head_dim} does not divide 2 x --hidden-size "
                              f"({self.EXPAND * hidden_size}, MambaMixer's d_inner): give --mamba-num-heads or "
                              f"another head width", flags=("--mamba-head-dim", "--mamba-num-heads"))
        heads = self.heads(hidden_size)
        if heads % self.mamba_num_groups:
            raise ConfigError(f"--mamba-num-groups {self.mamba_num_groups} does not divide the {heads} Mamba heads: "
                              f"each group takes an equal share of the heads (as Megatron-Core asserts)",
                              flags=("--mamba-num-groups", "--mamba-num-heads"))
        if self.mamba_num_groups % tensor_parallel_size:  # heads are a multiple of the groups
            raise ConfigError(f"--mamba-num-groups {self.mamba_num_groups} does not split over "
                              f"--tensor-model-parallel-size {tensor_parallel_size}: each rank takes whole groups "
                              f"and their heads (as Megatron-Core asserts)",
                              flags=("--mamba-num-groups", "--tensor-model-parallel-size"))
