"""The elements of each parameter in a DeepSpeed checkpoint's files, by its saved name, read from the memory-mapped
files without reading more: ZeRO 1/2's padded flat groups cut into equal partitions, ZeRO 3's per-parameter pieces, or
ds_to_universal's whole tensors (as DeepSpeed 0.19 writes them).
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Optional

import torch

from base.errors import CheckpointError
from checkpoint.deepspeed.files import OPTIMIZER_STATES_SUFFIX, UNIVERSAL_STATES, ZERO3_FILE, load_pt, pickle_bytes
from checkpoint.inside import inside
from checkpoint.regions import box_runs

STATE_KEYS = ("fp32", "exp_avg", "exp_avg_sq")  # DeepSpeed's names: the master is "fp32"


def optimizer_files(folder: Path) -> list[Path]:
    """The data-parallel ranks' optimizer files, in rank order (checked inside `folder`)."""
    files = []
    for path in folder.glob(f"*{OPTIMIZER_STATES_SUFFIX}"):
        match = ZERO3_FILE.fullmatch(path.name)
        if match is None or match.group(3) != "optim":
            raise CheckpointError(f"{path}: not a name DeepSpeed gives an optimizer file "
                                  f"(zero_pp_rank_N_mp_rank_MM_optim_states.pt)")
        if int(match.group(2)) != 0:
            raise CheckpointError(f"{path}: saved at a model-parallel (tensor or pipeline) size above 1; convert the "
                                  f"checkpoint with deepspeed/checkpoint/ds_to_universal.py and load it with "
                                  f"--universal-checkpoint")
        files.append((int(match.group(1)), inside(folder, path.name)))
    files.sort()
    if [rank for rank, _ in files] != list(range(len(files))):
        raise CheckpointError(f"{folder}: the optimizer files' data-parallel ranks are {[r for r, _ in files]}, not "
                              f"0..{len(files) - 1}: some are missing")
    return [path for _, path in files]


def _expect(condition: bool, path: Path, what: str) -> None:
    if not condition:
        raise CheckpointError(f"{path}: {what}; the checkpoint is corrupt or not DeepSpeed 0.19's layout")


def _moment(state: dict, key: str, path: Path) -> torch.Tensor:
    if key not in state:
        raise CheckpointError(f"{path}: no {key} in its optimizer state (DeepSpeed's optimizer was not Adam): pass "
                              f"--no-load-optim to take the weights with fresh moments")
    return state[key]


class Store(ABC):
    """Shapes, state keys and a flat reader; counts the bytes it reads (the tensors' elements and the pickles)."""

    shapes: dict[str, tuple[int, ...]]

    def __init__(self) -> None:
        self.bytes_read = 0

    @abstractmethod
    def read_flat(self, key: str, name: str, start: int, end: int) -> torch.Tensor:
        """Elements [start, end) of parameter `name`'s flat `key` state (fp32 master or an Adam moment)."""

    def _copy(self, tensor: torch.Tensor) -> torch.Tensor:
        """A copy detached from autograd (DeepSpeed saves partitions with requires_grad set)."""
        self.bytes_read += tensor.numel() * tensor.element_size()
        return tensor.detach().to(torch.float32, copy=True)


class _Pieces(Store):
    """A parameter as pieces of rank files' flat tensors: (rank, flat index, offset, param start, length)."""

    def __init__(self, folder: Path) -> None:
        super().__init__()
        self.files = optimizer_files(folder)
        if not self.files:
            raise CheckpointError(f"{folder}: no optimizer files (*{OPTIMIZER_STATES_SUFFIX}) beside the model states")
        self.states = [load_pt(path) for path in self.files]
        self.bytes_read += sum(pickle_bytes(path) for path in self.files)
        self.pieces: dict[str, list[tuple[int, int, int, int, int]]] = {}

    def optimizer_state(self, rank: int) -> dict:
        state = self.states[rank]
        _expect(isinstance(state, dict) and isinstance(state.get("optimizer_state_dict"), dict), self.files[rank],
                "no optimizer_state_dict")
        return state["optimizer_state_dict"]

    @abstractmethod
    def flat(self, key: str, rank: int, index: int) -> torch.Tensor:
        """Rank `rank`'s flat `key` tensor of parameter group `index` (ZeRO 1-2 and ZeRO 3 keep them apart)."""

    def read_flat(self, key: str, name: str, start: int, end: int) -> torch.Tensor:
        out = torch.empty(end - start, dtype=torch.float32)
        filled = 0
        for rank, index, at, param_start, length in self.pieces.get(name, []):
            lo, hi = max(start, param_start), min(end, param_start + length)
            if lo < hi:
                flat = self.flat(key, rank, index)
                _expect(at + (hi - param_start) <= flat.numel(), self.files[rank], f"its {key} of {name} is short")
                out[lo - start:hi - start] = self._copy(flat[at + lo - param_start:at + hi - param_start])
                filled += hi - lo
        if filled != end - start:
            raise CheckpointError(f"{self.files[0].parent}: the optimizer files hold {filled} of elements "
                                  f"[{start}, {end}) of {name}; the checkpoint is incomplete")
        return out


class ZeroStore(_Pieces):
    """ZeRO stage 1 or 2 (module docstring)."""

    def __init__(self, folder: Path, model_states: dict) -> None:
        super().__init__(folder)
        first = self.optimizer_state(0)
        counts = first.get("partition_count")
        world = max(counts) if isinstance(counts, list) else counts
        _expect(world == len(self.files), self.files[0], f"partition_count {counts} for {len(self.files)} optimizer "
                                                         f"files")
        groups = model_states.get("param_shapes")
        _expect(isinstance(groups, list), self.files[0].parent, "the model states file has no param_shapes")
        paddings = first.get("param_alignment_paddings") or [[0] * len(shapes) for shapes in groups]
        self.shapes, self._moment_index = {}, []
        lean = [self.optimizer_state(r).get("single_partition_of_fp32_groups") for r in range(world)]
        for group, shapes in enumerate(groups):
            offsets, position = {}, 0
            for (name, shape), padding in zip(shapes.items(), paddings[group]):
                self.shapes[name] = tuple(int(d) for d in shape)
                offsets[name] = position
                position += math.prod(self.shapes[name]) + padding
            partition = None
            for rank in range(world):
                _expect(isinstance(lean[rank], list) and len(lean[rank]) == len(groups), self.files[rank],
                        f"single_partition_of_fp32_groups for {len(groups)} groups")
                size = lean[rank][group].numel() + self.optimizer_state(rank)["group_paddings"][group]
                partition = size if partition is None else partition
                _expect(size == partition, self.files[rank], f"a partition of {size} elements, rank 0's has {partition}")
                begin, end = rank * partition, rank * partition + lean[rank][group].numel()
                for name, offset in offsets.items():
                    lo, hi = max(begin, offset), min(end, offset + math.prod(self.shapes[name]))
                    if lo < hi:
                        self.pieces.setdefault(name, []).append((rank, group, lo - begin, lo - offset, hi - lo))
        base = first.get("base_optimizer_state")
        self.elastic = isinstance(base, list)

    def _group_state(self, rank: int, group: int) -> dict:
        base = self.optimizer_state(rank)["base_optimizer_state"]
        if isinstance(base, list):  # elastic_checkpoint: the lean state of each group
            return base[group]
        index = base["param_groups"][group]["params"][0]
        return base["state"][index]

    def flat(self, key: str, rank: int, index: int) -> torch.Tensor:
        if key == "fp32":
            return self.optimizer_state(rank)["single_partition_of_fp32_groups"][index]
        return _moment(self._group_state(rank, index), key, self.files[rank])

    def step(self) -> Optional[int]:
        base = self.optimizer_state(0)["base_optimizer_state"]
        if isinstance(base, list):
            step = self.optimizer_state(0).get("base_optimizer_state_step")
        else:
            step = next((s.get("step") for s in base.get("state", {}).values() if "step" in s), None)
        return None if step is None else int(step)


class Zero3Store(_Pieces):
    """ZeRO stage 3 (module docstring)."""

    def __init__(self, folder: Path, model_states: dict) -> None:
        super().__init__(folder)
        world = len(self.files)
        for rank in range(world):
            state = self.optimizer_state(rank)
            _expect(state.get("partition_count") == world, self.files[rank],
                    f"partition_count {state.get('partition_count')} for {world} optimizer files")
        groups = model_states.get("param_shapes")
        _expect(isinstance(groups, list), self.files[0].parent, "the model states files have no param_shapes")
        self.shapes = {}
        for index, shapes in enumerate(groups):
            at = 0
            for name, shape in shapes.items():
                self.shapes[name] = tuple(int(d) for d in shape)
                numel = math.prod(self.shapes[name])
                piece = math.ceil(numel / world)
                for rank in range(world):
                    length = max(0, min(piece, numel - rank * piece))
                    if length:
                        self.pieces.setdefault(name, []).append((rank, index, at, rank * piece, length))
                at += piece
            for rank in range(world):
                flats = self.optimizer_state(rank).get("fp32_flat_groups")
                _expect(isinstance(flats, list) and len(flats) == len(groups) and flats[index].numel() == at,
                        self.files[rank], f"fp32_flat_groups[{index}] is not {at} elements")

    def flat(self, key: str, rank: int, index: int) -> torch.Tensor:
        state = self.optimizer_state(rank)
        if key == "fp32":
            return state["fp32_flat_groups"][index]
        return _moment(state["optimizer_state_dict"]["state"].get(index, {}), key, self.files[rank])

    def step(self) -> Optional[int]:
        return _zero3_step(self.optimizer_state(0))


def _zero3_step(optimizer_state: dict) -> Optional[int]:
    states = (optimizer_state.get("optimizer_state_dict") or {}).get("state", {})
    step = next((s.get("step") for s in states.values() if "step" in s), None)
    return None if step is None else int(step)


class UniversalStore(Store):
    """ds_to_universal's zero/<name>/<state>.pt (module docstring)."""

    def __init__(self, folder: Path, model_states: dict) -> None:
        super().__init__()
        self.root = inside(folder, UNIVERSAL_STATES)
        self._loaded: dict[tuple[str, str], torch.Tensor] = {}
        recorded = {name: tuple(int(d) for d in shape) for shapes in model_states.get("param_shapes") or []
                    for name, shape in shapes.items()}
        self.shapes, self.keys_of = {}, {}
        for directory in sorted(self.root.iterdir()):
            if not directory.is_dir():
                continue
            name = directory.name
            self.keys_of[name] = tuple(key for key in STATE_KEYS if (directory / f"{key}.pt").is_file())
            if "fp32" not in self.keys_of[name]:
                raise CheckpointError(f"{directory}: no fp32.pt; the universal checkpoint is incomplete")
            tensor = self._tensor("fp32", name)
            shape = tuple(tensor.shape)
            if tensor.dim() == 1 and name in recorded and math.prod(recorded[name]) == tensor.numel():
                shape = recorded[name]  # ZeRO 3's flat tensor
            self.shapes[name] = shape

    def _tensor(self, key: str, name: str) -> torch.Tensor:
        if (key, name) not in self._loaded:
            path = inside(self.root, name, f"{key}.pt")
            loaded = load_pt(path)
            self.bytes_read += pickle_bytes(path)
            tensor = loaded.get("param") if isinstance(loaded, dict) else loaded
            _expect(isinstance(tensor, torch.Tensor), path, "holds no tensor")
            self._loaded[key, name] = tensor.detach()
        return self._loaded[key, name]

    def read_flat(self, key: str, name: str, start: int, end: int) -> torch.Tensor:
        if key not in self.keys_of.get(name, ()):
            raise CheckpointError(f"{self.root / name}: no {key}.pt")
        tensor = self._tensor(key, name).reshape(-1)
        _expect(end <= tensor.numel(), self.root / name / f"{key}.pt", f"{tensor.numel()} elements, {end} needed")
        return self._copy(tensor[start:end])

    def step(self) -> Optional[int]:
        """Adam's step: zero/<name>/step.pt (from ZeRO 1/2), or the optimizer state ds_to_universal kept (ZeRO 3)."""
        for name in self.shapes:
            path = self.root / name / "step.pt"
            if path.is_file():
                step = load_pt(inside(self.root, name, "step.pt"))
                return int(step.item() if isinstance(step, torch.Tensor) else step)
        common = self.root / "optimizer_state.pt"
        if common.is_file():
            state = load_pt(inside(self.root, "optimizer_state.pt"))
            if isinstance(state, dict):
                return _zero3_step(state)
        return None


def read_region(store: Store, key: str, name: str, region: tuple[slice, ...],
                view: Optional[tuple[int, ...]] = None) -> torch.Tensor:
    """`region` of a source parameter's whole tensor (seen as `view`), a contiguous stretch at a time."""
    shape = store.shapes[name] if view is None else view
    out = torch.empty(math.prod(part.stop - part.start for part in region), dtype=torch.float32)
    for start, at, length in box_runs(shape, region):
        out[at:at + length] = store.read_flat(key, name, start, start + length)
    return out.view([part.stop - part.start for part in region])
