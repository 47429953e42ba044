"""--fp8-param-gather's bytes: the units that hold only FP8 linears' weights (stage3_unit_params and build_zero
give them units of their own) are kept, per rank, as e4m3 bytes of this rank's shard, cast from the fp32 master
after each step (parallel/fp8/param_gather.py), and all-gathered as bytes: 1 byte per element where the other
units move the parameter dtype's 2 or 4.

After a gather the bytes are also dequantized into the unit's high-precision chunk, whose parameters stay the
autograd leaves that receive the weight gradients (TransformerEngine's Float8Tensor parameter has no such copy;
here it holds exactly the dequantized FP8 weight, so anything reading the parameter, such as the guard's
high-precision fallback, sees what the FP8 GEMM computes with). Device memory is therefore not reduced, only the
gathered bytes; the start-up line says so.
"""

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
    cast_shard,
    dequantized,
    scale_shape,
    weight_scale,
)
from zero.flat_buffer import FlatLayout, Unit


class Fp8WeightBytes:
    """The FP8 bytes of the units of `layout` whose every parameter is in `states` (id -> the FP8 linear's
    Fp8LinearState): this rank's shard of each (`shard`) and the gathered unit (`flat`, whose storage a stage-3
    gatherer frees between uses when `released_between_uses`). Each linear's state gets its Fp8Weight, a view
    of the gathered bytes. `group`: the ranks the units are cut over (None: one part, nothing to reduce)."""

    def __init__(self, layout: FlatLayout, states: dict, model_dtype: torch.dtype, device: torch.device, comm,
                 group: Optional[dist.ProcessGroup], released_between_uses: bool) -> None:
        self.layout, self.model_dtype, self.comm, self.group = layout, model_dtype, comm, group
        self.units = [unit for unit in layout.units if unit.slots and all(id(s.param) in states for s in unit.slots)]
        self.states = {unit.index: [states[id(slot.param)] for slot in unit.slots] for unit in self.units}
        self.shard = {unit.index: torch.zeros(unit.shard_numel, dtype=torch.uint8, device=device)
                      for unit in self.units}
        self.flat = {unit.index: torch.zeros(unit.numel, dtype=torch.uint8, device=device) for unit in self.units}
        self.weights: dict[int, list[Fp8Weight]] = {}
        for unit in self.units:
            flat = self.flat[unit.index]
            self.weights[unit.index] = [
                Fp8Weight(flat[slot.start:slot.end].view(E4M3).view(slot.shape),
                          torch.ones(scale_shape(state.recipe.recipe, slot.shape), dtype=torch.float32, device=device))
                for slot, state in zip(unit.slots, self.states[unit.index])]
            for state, weight in zip(self.states[unit.index], self.weights[unit.index]):
                state.fp8_weight = weight
            if released_between_uses:  # the views above were taken while the storage had its size
                flat.untyped_storage().resize_(0)

    @property
    def numel(self) -> int:
        """Elements of every FP8 unit (padding included): what one gather of them all moves, in bytes."""
        return sum(unit.numel for unit in self.units)

    def resident_bytes(self) -> int:
        """Bytes held now: the shards, and the gathered units whose storage is allocated (all of them under ZeRO
        1-2; under ZeRO 3 those gathered at this moment)."""
        return sum(shard.numel() for shard in self.shard.values()) + \
            sum(flat.untyped_storage().nbytes() for flat in self.flat.values())

    def holds(self, unit: Unit) -> bool:
        return unit.index in self.shard

    def quantize(self, master: torch.Tensor) -> None:
        """Cast this rank's shard of every FP8 weight from the fp32 master partition. Collective over `group`:
        one max all-reduce of every weight's shard amaxes (one a tensor, or blockwise one a 128 x 128 block,
        parallel/fp8/param_gather.py), so each scale is the whole tensor's or the whole block's."""
        pieces, amax = [], []
        # on the device the casts and collectives run on (the master may live in host memory: --offload-optimizer)
        device = self.shard[self.units[0].index].device if self.units else master.device
        for unit in self.units:
            for position, slot in enumerate(unit.slots):
                blockwise = self.states[unit.index][position].recipe.recipe == "blockwise"
                fragments = [f for f in unit.fragments(self.layout.part) if f.slot.start == slot.start]
                blocks = self.weights[unit.index][position].scale_inv.numel()
                local = torch.zeros(blocks if blockwise else (), dtype=torch.float32, device=device)
                for fragment in fragments:
                    piece = master[fragment.partition_offset:fragment.partition_offset + fragment.numel].to(device)
                    if blockwise:  # from the fp32 master itself, as TE's blockwise cast
                        index = block_index(fragment.param_offset, fragment.numel, slot.shape, device)
                        local = torch.maximum(local, block_amax(piece, index, blocks))
                    else:
                        index = None
                        local = torch.maximum(local, piece.to(self.model_dtype).abs().amax().float())
                    pieces.append((unit, position, fragment, piece, index))
                amax.append(local.reshape(-1))
        if not amax:
            return
        amaxes = torch.cat(amax)
        if self.group is not None:
            self.comm.all_reduce(amaxes, self.group, "dp", op=dist.ReduceOp.MAX)
        scales, k = {}, 0
        for unit in self.units:
            for position, (state, weight) in enumerate(zip(self.states[unit.index], self.weights[unit.index])):
                count = weight.scale_inv.numel()
                if state.recipe.recipe == "blockwise":
                    scale = block_scale(amaxes[k:k + count]).reshape(weight.scale_inv.shape)
                else:
                    scale = weight_scale(state, amaxes[k], self.model_dtype)
                weight.scale_inv.copy_(torch.reciprocal(scale))
                scales[unit.index, position] = scale
                k += count
        for unit, position, fragment, piece, index in pieces:
            at = fragment.partition_offset - unit.partition_offset
            scale = scales[unit.index, position]
            self.shard[unit.index][at:at + fragment.numel] = cast_shard(piece, scale, self.model_dtype) \
                if index is None else cast_block_shard(piece, index, scale)

    def start_gather(self, unit: Unit, async_op: bool):
        """All-gather `unit`'s bytes into its (re-sized) gathered flat: the unit's elements, 1 byte each."""
        flat = self.flat[unit.index]
        flat.untyped_storage().resize_(unit.numel)
        return self.comm.all_gather(flat, self.shard[unit.index], self.group, "dp", async_op=async_op)

    def dequantize(self, unit: Unit, chunk: torch.Tensor) -> None:
        """Write the gathered weights, dequantized, into the unit's high-precision chunk (its parameters)."""
        for slot, weight in zip(unit.slots, self.weights[unit.index]):
            chunk[slot.start:slot.end] = dequantized(weight).to(chunk.dtype).reshape(-1)

    def release(self, unit: Unit) -> None:
        self.flat[unit.index].untyped_storage().resize_(0)
