"""Muon (--optimizer muon) as Megatron-LM's TensorParallelMuon steps it: 2-D parameters but the embedding and output
layer take momentum, Newton-Schulz orthogonalization and a shape scale; the rest take Adam. Under ZeRO each rank sums
its piece into the whole matrix over the partition group, runs NS, and keeps its own elements."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional, Sequence

import torch
from torch import nn

from parallel.sharding import EXPERT_TENSOR_PARALLEL, TENSOR_PARALLEL, record_of

# emerging_optimizers' muon_utils._COEFFICIENT_SETS
COEFFICIENT_SETS = {
    "simple": [(3.4445, -4.7750, 2.0315)],
    "quintic": [(4.0848, -6.8946, 2.9270), (3.9505, -6.3029, 2.6377), (3.7418, -5.5913, 2.3037),
                (2.8769, -3.1427, 1.2046), (2.8366, -3.0525, 1.2012)],
    "polar_express": [(8.2051, -22.9019, 16.4607), (4.0664, -2.8612, 0.5184), (3.9096, -2.8234, 0.5250),
                      (3.2856, -2.4153, 0.4853), (2.2779, -1.6198, 0.3985), (1.8726, -1.2307, 0.3585),
                      (1.8564, -1.2132, 0.3568), (1.8750, -1.2500, 0.3750)],
    "aol": [(4.0098, -7.0585, 2.4635), (3.4585, -5.5479, 2.5959), (2.7573, -3.2939, 1.4254),
            (2.7215, -3.0494, 1.3169)],
}


def coefficients(kind: str, steps: int) -> list[tuple[float, float, float]]:
    """The (a, b, c) of each of `steps` Newton-Schulz steps."""
    sets = COEFFICIENT_SETS[kind]
    if kind == "simple":
        return sets * steps
    if kind == "polar_express":
        if steps < len(sets):
            raise ValueError(f"steps ({steps}) must be at least {len(sets)} for polar_express")
        return sets + [sets[-1]] * (steps - len(sets))
    if steps % len(sets):
        raise ValueError(f"steps ({steps}) must be a multiple of {len(sets)} for {kind}")
    return sets * (steps // len(sets))


def newton_schulz(x: torch.Tensor, steps: int, kind: str = "quintic", bf16: bool = True, eps: float = 1e-7,
                  transpose: Optional[bool] = None,
                  all_reduce: Optional[Callable[[torch.Tensor], None]] = None) -> torch.Tensor:
    """emerging_optimizers' newton_schulz on an fp32 2-D `x`; with `all_reduce`, `x` is one TP rank's columns."""
    if transpose is None:
        transpose = x.size(-2) > x.size(-1)
    if transpose:
        x = x.mT
    if all_reduce is None:
        X = torch.nn.functional.normalize(x, p=2, dim=(-2, -1), eps=eps)
    else:
        squares = (x * x).sum()
        all_reduce(squares)
        X = x / torch.sqrt(squares).clamp_min(eps)
    if bf16:
        X = X.to(torch.bfloat16)
    for a, b, c in coefficients(kind, steps):
        A = X @ X.mT
        if all_reduce is not None:
            all_reduce(A)
        B = torch.addmm(A, A, A, alpha=c, beta=b)
        X = torch.addmm(X, B, X, alpha=1.0, beta=a)
    X = X.to(torch.float32)
    return X.mT if transpose else X


def scale_factor(size_out: int, size_in: int, mode: str = "spectral") -> float:
    """emerging_optimizers' get_muon_scale_factor."""
    if mode == "shape_scaling":
        return max(1, size_out / size_in) ** 0.5
    if mode == "spectral":
        return max(size_out, size_in) ** 0.5
    if mode == "unit_rms_norm":
        return (size_out / size_in) ** 0.5
    raise ValueError(f"Invalid mode for Muon update scale factor: {mode}")


@dataclass(frozen=True)
class MuonTensorParallel:
    """The TP group as Muon's step uses it (--muon-tp-mode, rank, collectives)."""
    mode: str
    size: int
    rank: int
    all_gather: Callable[[torch.Tensor, torch.Tensor], None]
    all_reduce: Callable[[torch.Tensor], None]

    def gather(self, shard: torch.Tensor, dim: int) -> torch.Tensor:
        """The whole matrix from every rank's `shard`, concatenated along `dim`."""
        rows, cols = shard.shape
        pieces = torch.empty((self.size * rows, cols), dtype=shard.dtype, device=shard.device)
        self.all_gather(pieces, shard.contiguous())
        return torch.cat(pieces.view(self.size, rows, cols).unbind(0), dim=dim)


def scaled_orthogonalize(update: torch.Tensor, config, split: Optional[Sequence[int]] = None,
                         tp_dim: Optional[int] = None, tp: Optional[MuonTensorParallel] = None) -> torch.Tensor:
    """The scaled orthogonalized update of this rank's piece of a matrix cut along `tp_dim`, per --muon-tp-mode;
    `split`: QKV blocks orthogonalized one by one."""
    mode = "blockwise" if tp is None or tp_dim is None else tp.mode

    def one(matrix: torch.Tensor) -> torch.Tensor:
        steps, kind, bf16 = config.muon_num_ns_steps, config.muon_coefficient_type, \
            config.muon_fp32_matmul_prec == "medium"
        shape = list(matrix.shape)
        if mode == "duplicated":
            orth = newton_schulz(tp.gather(matrix, tp_dim), steps, kind, bf16).chunk(tp.size, dim=tp_dim)[tp.rank]
            shape[tp_dim] *= tp.size
        elif mode == "distributed":
            orth = newton_schulz(matrix, steps, kind, bf16, transpose=tp_dim == 0, all_reduce=tp.all_reduce)
            shape[tp_dim] *= tp.size
        else:
            orth = newton_schulz(matrix, steps, kind, bf16)
        return orth * scale_factor(shape[0], shape[1], config.muon_scale_mode) * config.muon_extra_scale_factor

    if split is None or not config.muon_split_qkv:
        return one(update)
    rows, cols = update.shape
    groups = rows // sum(split)
    blocks = torch.split(update.view(groups, sum(split), cols), list(split), dim=1)
    done = [one(block.reshape(-1, cols)).view(groups, -1, cols) for block in blocks]
    return torch.cat(done, dim=1).view(rows, cols)


def takes_muon(param: nn.Parameter, excluded_ids: set[int]) -> bool:
    """`_is_muon_excluded`'s complement."""
    return param.dim() == 2 and id(param) not in excluded_ids and getattr(param, "use_muon", True)


@dataclass(frozen=True)
class MuonMatrix:
    """One Muon parameter as the step sees it: shape, QKV blocks, decay, this rank's fragment, TP cut."""
    shape: torch.Size
    split: Optional[tuple[int, ...]]
    weight_decay: bool
    fragment: Optional[tuple[int, int, int]]
    tp_dim: Optional[int] = None

    @property
    def numel(self) -> int:
        return self.shape[0] * self.shape[1]

    def newton_schulz_numel(self, mode: str, tp_size: int) -> int:
        """Elements of the largest matrix NS holds for it under `mode`."""
        if self.tp_dim is None or tp_size == 1 or mode == "blockwise":
            return self.numel
        if mode == "duplicated":
            return self.numel * tp_size
        return max(self.numel, self.shape[1 - self.tp_dim] ** 2)


def muon_matrices(layout, params: Sequence[nn.Parameter]) -> list[MuonMatrix]:
    """The Muon parameters in the layout's order (the collectives'), with this rank's fragments."""
    wanted = {id(param) for param in params}
    mine = {id(f.slot.param): (f.partition_offset, f.param_offset, f.numel) for f in layout.fragments()}
    matrices = []
    for unit in layout.units:
        for slot in unit.slots:
            if id(slot.param) in wanted:
                split = getattr(slot.param, "qkv_split_shapes", None)
                decays = getattr(slot.param, "apply_weight_decay", True)
                record = record_of(slot.param)
                # an expert cut over expert TP is stepped by the experts' ZeRO
                tp_dim = record.split_dim if record.split_over in (TENSOR_PARALLEL, EXPERT_TENSOR_PARALLEL) else None
                matrices.append(MuonMatrix(slot.shape, None if split is None else tuple(split), decays,
                                           mine.get(id(slot.param)), tp_dim))
    return matrices


def muon_ranges(matrices: Sequence[MuonMatrix]) -> list[tuple[int, int]]:
    """This rank's partition ranges that Muon steps."""
    return [(m.fragment[0], m.fragment[0] + m.fragment[2]) for m in matrices if m.fragment is not None]


@torch.no_grad()
def muon_step(matrices: Sequence[MuonMatrix], master: torch.Tensor, momentum: torch.Tensor, grads: torch.Tensor,
              lr: float, weight_decay: float, config, all_reduce,
              tp: Optional[MuonTensorParallel] = None) -> None:
    """One Muon update of this rank's pieces of `matrices`."""
    beta = config.muon_momentum
    for matrix in matrices:
        full = torch.zeros(matrix.numel, dtype=torch.float32, device=master.device)
        if matrix.fragment is not None:
            start, offset, numel = matrix.fragment
            grad, buf = grads[start:start + numel], momentum[start:start + numel]
            buf.lerp_(grad, 1 - beta)
            full[offset:offset + numel] = grad.lerp(buf, beta) if config.muon_nesterov else buf
        all_reduce(full)
        orth = scaled_orthogonalize(full.view(matrix.shape), config, matrix.split, matrix.tp_dim, tp)
        if matrix.fragment is not None:
            weights = master[start:start + numel]
            decay = weight_decay if matrix.weight_decay else 0.0
            if decay > 0:
                weights.add_(weights, alpha=-decay * lr)
            weights.add_(orth.reshape(-1)[offset:offset + numel], alpha=-lr)
