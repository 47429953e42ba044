"""--fp8-param-gather's bytes: units holding only FP8 linears' weights keep this rank's shard as FP8 bytes cast from the
fp32 master after each step, and all-gather those bytes (1 per element; MXFP8 2). Each gather is dequantized into the
unit's high-precision parameters, so device memory is not reduced, only the gathered bytes."""

from __future__ import annotations

from typing import Optional

import torch
import torch.distributed as dist

from parallel.fp8.kernel import E4M3
from parallel.fp8.param_gather import (
    Fp8Weight,
    block_amax,
    block_index,
    block_scale,
    cast_block_shard,
    cast_mx_shard,
    cast_shard,
    dequantized,
    mx_block_index,
    mx_dequantizing_scales,
    mx_exponents,
    mx_scale_shapes,
    scale_shape,
    weight_scale,
)
from zero.flat_buffer import FlatLayout, Unit


class Fp8WeightBytes:
    """The FP8 bytes of `layout`'s all-FP8 units: this rank's `shard` and the gathered `flat` of each, whose views are
    the linears' Fp8Weights."""

    def __init__(self, layout: FlatLayout, states: dict, model_dtype: torch.dtype, device: torch.device, comm,
                 group: Optional[dist.ProcessGroup], released_between_uses: bool) -> None:
        self.layout, self.model_dtype, self.comm, self.group = layout, model_dtype, comm, group
        self.units = [unit for unit in layout.units if unit.slots and all(id(s.param) in states for s in unit.slots)]
        self.states = {unit.index: [states[id(slot.param)] for slot in unit.slots] for unit in self.units}
        self.shard = {unit.index: torch.zeros(unit.shard_numel, dtype=torch.uint8, device=device)
                      for unit in self.units}
        self.flat = {unit.index: torch.zeros(unit.numel, dtype=torch.uint8, device=device) for unit in self.units}
        # MXFP8's columnwise cast: a second shard and gathered unit
        mx = [unit for unit in self.units if self.states[unit.index][0].recipe.recipe == "mxfp8"]
        self.columnwise_shard = {unit.index: torch.zeros(unit.shard_numel, dtype=torch.uint8, device=device)
                                 for unit in mx}
        self.columnwise_flat = {unit.index: torch.zeros(unit.numel, dtype=torch.uint8, device=device) for unit in mx}
        self.weights: dict[int, list[Fp8Weight]] = {}
        for unit in self.units:
            self.weights[unit.index] = [self._weight(unit, slot, state.recipe.recipe, device)
                                        for slot, state in zip(unit.slots, self.states[unit.index])]
            for state, weight in zip(self.states[unit.index], self.weights[unit.index]):
                state.fp8_weight = weight
            if released_between_uses:  # the views above were taken while the storage had its size
                for flat in self._flats(unit):
                    flat.untyped_storage().resize_(0)

    def _weight(self, unit: Unit, slot, recipe: str, device: torch.device) -> Fp8Weight:
        """A slot's Fp8Weight: views of the gathered unit(s)."""
        def view(flat):
            return flat[slot.start:slot.end].view(E4M3).view(slot.shape)

        weight = Fp8Weight(view(self.flat[unit.index]),
                           torch.ones(scale_shape(recipe, slot.shape), dtype=torch.float32, device=device))
        if recipe == "mxfp8":
            weight.columnwise = view(self.columnwise_flat[unit.index])
            weight.columnwise_scale_inv = torch.ones(mx_scale_shapes(slot.shape)[1], dtype=torch.float32,
                                                     device=device)
        return weight

    def _flats(self, unit: Unit) -> list[torch.Tensor]:
        return [self.flat[unit.index]] + ([self.columnwise_flat[unit.index]]
                                          if unit.index in self.columnwise_flat else [])

    def _blocks(self, weight: Fp8Weight) -> int:
        """Amaxes a weight's shards reduce: 1, or one a block."""
        return weight.scale_inv.numel() + \
            (0 if weight.columnwise_scale_inv is None else weight.columnwise_scale_inv.numel())

    @property
    def numel(self) -> int:
        """Bytes one gather of every FP8 unit moves (padding included)."""
        return sum(flat.numel() for unit in self.units for flat in self._flats(unit))

    def resident_bytes(self) -> int:
        """Bytes held now: shards, allocated gathered units and scales."""
        shards = [*self.shard.values(), *self.columnwise_shard.values()]
        scales = [scale for weights in self.weights.values() for weight in weights
                  for scale in (weight.scale_inv, weight.columnwise_scale_inv) if scale is not None]
        return sum(shard.numel() for shard in shards) + sum(scale.nbytes for scale in scales) + \
            sum(flat.untyped_storage().nbytes() for unit in self.units for flat in self._flats(unit))

    def holds(self, unit: Unit) -> bool:
        return unit.index in self.shard

    def quantize(self, master: torch.Tensor) -> None:
        """Cast this rank's shard of every FP8 weight from the master (one max all-reduce of the amaxes over
        `group`)."""
        # the master may live in host memory (--offload-optimizer)
        device = self.shard[self.units[0].index].device if self.units else master.device
        pieces, amax = self._shard_amaxes(master, device)
        if not amax:
            return
        amaxes = torch.cat(amax)
        if self.group is not None:
            self.comm.all_reduce(amaxes, self.group, "dp", op=dist.ReduceOp.MAX)
        scales, k = {}, 0
        for unit in self.units:
            for position, (state, weight) in enumerate(zip(self.states[unit.index], self.weights[unit.index])):
                count = self._blocks(weight)
                scales[unit.index, position] = self._scale(state, weight, amaxes[k:k + count])
                k += count
        for unit, position, fragment, piece, index in pieces:
            self._cast(unit, fragment, piece, index, scales[unit.index, position])

    def _shard_amaxes(self, master: torch.Tensor, device: torch.device) -> tuple[list, list]:
        """This rank's pieces of each FP8 weight, and each weight's amaxes."""
        pieces, amax = [], []
        for unit in self.units:
            for position, slot in enumerate(unit.slots):
                recipe = self.states[unit.index][position].recipe.recipe
                blocks = self._blocks(self.weights[unit.index][position])
                local = torch.zeros(blocks if recipe in ("blockwise", "mxfp8") else (), dtype=torch.float32,
                                    device=device)
                for fragment in [f for f in unit.fragments(self.layout.part) if f.slot.start == slot.start]:
                    piece = master[fragment.partition_offset:fragment.partition_offset + fragment.numel].to(device)
                    if recipe == "blockwise":  # from the fp32 master, as TE's blockwise cast
                        index = block_index(fragment.param_offset, fragment.numel, slot.shape, device)
                        local = torch.maximum(local, block_amax(piece, index, blocks))
                    elif recipe == "mxfp8":  # in the model's dtype, as the forward casts the weight
                        piece = piece.to(self.model_dtype).float()
                        index = mx_block_index(fragment.param_offset, fragment.numel, slot.shape, device)
                        local = torch.maximum(local, block_amax(piece.repeat(2), index.reshape(-1), blocks))
                    else:
                        index = None
                        local = torch.maximum(local, piece.to(self.model_dtype).abs().amax().float())
                    pieces.append((unit, position, fragment, piece, index))
                amax.append(local.reshape(-1))
        return pieces, amax

    def _scale(self, state, weight: Fp8Weight, amax: torch.Tensor) -> torch.Tensor:
        """A weight's scales from its reduced amaxes; returns the quantizing one."""
        if state.recipe.recipe == "mxfp8":
            exponent = mx_exponents(amax)
            rowwise, columnwise = mx_dequantizing_scales(exponent, weight.data.shape)
            weight.scale_inv.copy_(rowwise)
            weight.columnwise_scale_inv.copy_(columnwise)
            return exponent
        if state.recipe.recipe == "blockwise":
            scale = block_scale(amax).reshape(weight.scale_inv.shape)
        else:
            scale = weight_scale(state, amax[0], self.model_dtype)
        weight.scale_inv.copy_(torch.reciprocal(scale))
        return scale

    def _cast(self, unit: Unit, fragment, piece: torch.Tensor, index, scale: torch.Tensor) -> None:
        """A piece of the master cast into this rank's shard bytes."""
        at = fragment.partition_offset - unit.partition_offset
        end = at + fragment.numel
        if unit.index in self.columnwise_shard:
            self.shard[unit.index][at:end], self.columnwise_shard[unit.index][at:end] = \
                cast_mx_shard(piece, index, scale)
        else:
            self.shard[unit.index][at:end] = cast_shard(piece, scale, self.model_dtype) \
                if index is None else cast_block_shard(piece, index, scale)

    def start_gather(self, unit: Unit, async_op: bool):
        """All-gather `unit`'s bytes into its gathered flat."""
        shards = [self.shard[unit.index]] + ([self.columnwise_shard[unit.index]]
                                             if unit.index in self.columnwise_shard else [])
        works = []
        for flat, shard in zip(self._flats(unit), shards):
            flat.untyped_storage().resize_(unit.numel)
            works.append(self.comm.all_gather(flat, shard, self.group, "dp", async_op=async_op))
        return _Both(works) if async_op else None

    def dequantize(self, unit: Unit, chunk: torch.Tensor) -> None:
        """Write the gathered weights, dequantized, into the unit's high-precision chunk."""
        for slot, weight in zip(unit.slots, self.weights[unit.index]):
            chunk[slot.start:slot.end] = dequantized(weight).to(chunk.dtype).reshape(-1)

    def release(self, unit: Unit) -> None:
        for flat in self._flats(unit):
            flat.untyped_storage().resize_(0)


class _Both:
    """One handle for a unit's gathers."""

    def __init__(self, works: list) -> None:
        self.works = works

    def wait(self, timeout=None) -> bool:
        for work in self.works:
            work.wait()
        return True
