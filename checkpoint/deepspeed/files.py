"""A DeepSpeed checkpoint's folders and files: which tag folder `--load` names (via `latest`, or `latest_universal` for
a universal one), and each .pt file read safely: CRC-checked, then unpickled weights-only with inert stand-ins for
DeepSpeed's and Megatron's classes, so a file carrying code is refused.
"""

from __future__ import annotations

import argparse
import enum
import re
import warnings
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import numpy as np
import torch

from base.errors import CheckpointError
from checkpoint.inside import inside
from checkpoint.unpickler import unpickler_reason
from checkpoint.zip_records import zip_damage

LATEST = "latest"                      # DeepSpeed's pointer to the tag folder
LATEST_UNIVERSAL = "latest_universal"  # ds_to_universal's
UNIVERSAL_STATES = "zero"              # a universal checkpoint's folder of per-parameter states
MODEL_STATES_SUFFIX = "_model_states.pt"
OPTIMIZER_STATES_SUFFIX = "_optim_states.pt"
ZERO3_FILE = re.compile(r"(?:bf16_)?zero_pp_rank_(\d+)_mp_rank_(\d+)_(model|optim)_states\.pt")
LAYER_FILE = re.compile(r"layer_\d+(?:-model_\d+)?-model_states\.pt")  # a pipeline module's layers (weights only)


class _Fields:
    """An object whose pickled fields are kept as attributes, nothing run."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}({vars(self)})"


class LossScaler(_Fields):
    """deepspeed.runtime.fp16.loss_scaler.LossScaler (static: cur_scale, dynamic False)."""


class DynamicLossScaler(_Fields):
    """deepspeed.runtime.fp16.loss_scaler.DynamicLossScaler (cur_scale, cur_iter, last_overflow_iter, ...)."""


class FragmentAddress(_Fields):
    """deepspeed.utils.tensor_fragment.fragment_address: a parameter's stretch (start, numel) of a partition."""


class ZeroStageEnum(enum.IntEnum):
    """deepspeed.runtime.zero.config.ZeroStageEnum."""
    disabled = 0
    optimizer_states = 1
    gradients = 2
    weights = 3
    max_stage = 4


class ModelType(enum.Enum):
    """Megatron's ModelType, which Megatron-DeepSpeed's args hold as `model_type`."""
    encoder_or_decoder = 1
    encoder_and_decoder = 2
    retro_encoder = 3
    retro_decoder = 4


def _numpy_reconstruct():
    try:
        from numpy._core.multiarray import _reconstruct
    except ImportError:  # numpy < 2
        from numpy.core.multiarray import _reconstruct
    return _reconstruct


# What the files hold beyond tensors and containers: DeepSpeed's optimizer state and Megatron-DeepSpeed's client state.
SAFE_GLOBALS = [
    (LossScaler, "deepspeed.runtime.fp16.loss_scaler.LossScaler"),
    (DynamicLossScaler, "deepspeed.runtime.fp16.loss_scaler.DynamicLossScaler"),
    (FragmentAddress, "deepspeed.utils.tensor_fragment.fragment_address"),
    (ZeroStageEnum, "deepspeed.runtime.zero.config.ZeroStageEnum"),
    (ModelType, "megatron.core.enums.ModelType"),
    (ModelType, "megatron.model.enums.ModelType"),
    argparse.Namespace,
    (_numpy_reconstruct(), "numpy._core.multiarray._reconstruct"),
    (_numpy_reconstruct(), "numpy.core.multiarray._reconstruct"),
    np.ndarray,
    np.dtype,
    type(np.dtype(np.uint32)),
]


def load_pt(path: Path) -> object:
    """One DeepSpeed .pt file, weights-only with the globals above; memory-mapped, so tensor bytes are read when used.
    """
    try:
        with warnings.catch_warnings(), torch.serialization.safe_globals(SAFE_GLOBALS):
            warnings.simplefilter("ignore")
            try:
                return torch.load(path, map_location="cpu", weights_only=True, mmap=True)
            except RuntimeError as error:
                if "zip" not in str(error).lower() or zipfile.is_zipfile(path):
                    raise
                return torch.load(path, map_location="cpu", weights_only=True)
    except OSError as error:
        raise CheckpointError(f"{path}: cannot be read ({error.strerror or error})") from None
    except Exception as error:  # noqa: BLE001 - torch raises pickle, zip and runtime errors alike
        raise CheckpointError(f"{path}: refused, not a DeepSpeed checkpoint file this reader can load "
                              f"({unpickler_reason(error)})") from None


def pickle_bytes(path: Path) -> int:
    """The bytes of a torch file's pickle (what loading it memory-mapped reads besides the tensors it touches)."""
    try:
        with zipfile.ZipFile(path) as archive:
            return sum(info.file_size for info in archive.infolist() if info.filename.endswith("data.pkl"))
    except (OSError, zipfile.BadZipFile):
        return path.stat().st_size  # torch's older format is read whole


def verify_pt(path: Path, check_content: bool = True) -> Optional[str]:
    """Why `path` is not an intact torch file, or None (`check_content`: every record's CRC-32; else only the
    directory)."""
    try:
        damage = zip_damage(path, check_content)
    except FileNotFoundError:
        return f"{path}: missing from the checkpoint"
    except OSError as error:
        return f"{path}: cannot be read ({error.strerror or error})"
    return f"{path}: {damage}" if damage else None


@dataclass(frozen=True)
class DeepSpeedCheckpoint:
    """A tag folder of DeepSpeed's (or a universal one) and how it was named."""
    path: Path          # the tag folder: global_stepN, or ds_to_universal's output
    universal: bool
    named_by: Optional[str] = None  # "latest" / "latest_universal" when a save directory was named


def model_state_files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.glob(f"*{MODEL_STATES_SUFFIX}") if not p.name.startswith("expert_")) \
        if folder.is_dir() else []


def is_tag_folder(folder: Path) -> bool:
    """Whether `folder` is a DeepSpeed tag folder (it holds model states files, or a pipeline module's layers)."""
    return bool(model_state_files(folder)) or (folder.is_dir() and any(LAYER_FILE.fullmatch(p.name)
                                                                      for p in folder.iterdir()))


POINTER_MAX_BYTES = 256


def _pointer(save_dir: Path, name: str) -> Optional[str]:
    """The tag a DeepSpeed pointer file names (a plain folder other than our iter_NNNNNNN), else None."""
    try:
        with open(inside(save_dir, name), "rb") as pointer:
            raw = pointer.read(POINTER_MAX_BYTES + 1)
        text = raw.decode("utf-8").strip()
    except (OSError, UnicodeDecodeError):
        return None
    if len(raw) > POINTER_MAX_BYTES or not re.fullmatch(r"[\w.+-]+", text) or text in (".", "..") \
            or re.fullmatch(r"iter_\d+", text):
        return None
    return text


def find_deepspeed_checkpoint(path: Path, universal: bool) -> Optional[DeepSpeedCheckpoint]:
    """The DeepSpeed checkpoint `path` names, or None; `universal` reads `latest_universal`."""
    path = Path(path)
    if not path.is_dir():
        return None
    if is_tag_folder(path):
        return DeepSpeedCheckpoint(path, (path / UNIVERSAL_STATES).is_dir())
    pointer = LATEST_UNIVERSAL if universal else LATEST
    tag = _pointer(path, pointer) if (path / pointer).is_file() else None
    if tag is not None:
        folder = inside(path, tag)
        if not is_tag_folder(folder):
            raise CheckpointError(f"{path / pointer} names {tag!r}, which holds no DeepSpeed model states "
                                  f"(*{MODEL_STATES_SUFFIX}): the checkpoint is incomplete")
        if universal and not (folder / UNIVERSAL_STATES).is_dir():
            raise CheckpointError(f"{path / pointer} names {tag!r}, which has no {UNIVERSAL_STATES}/ folder: not "
                                  f"ds_to_universal's output")
        return DeepSpeedCheckpoint(folder, universal, pointer)
    if not universal and (path / LATEST_UNIVERSAL).is_file() and not (path / LATEST).is_file():
        raise CheckpointError(f"--load {path} holds a universal checkpoint only ({LATEST_UNIVERSAL}, no {LATEST}): "
                              f"pass --universal-checkpoint to load it, as Megatron-DeepSpeed does")
    if universal and (path / LATEST).is_file():
        tag = _pointer(path, LATEST)
        if tag is not None and is_tag_folder(path / tag):
            raise CheckpointError(f"--universal-checkpoint: {path} has no {LATEST_UNIVERSAL} (its {LATEST} names "
                                  f"the ZeRO checkpoint {tag}); convert it with deepspeed/checkpoint/"
                                  f"ds_to_universal.py, or load it without --universal-checkpoint")
    return None


def holds_deepspeed_checkpoints(directory: Path) -> Optional[str]:
    """What in `directory` is DeepSpeed's (its `latest` naming a tag folder, `latest_universal`), or None."""
    for pointer in (LATEST, LATEST_UNIVERSAL):
        if (directory / pointer).is_file():
            try:
                tag = _pointer(directory, pointer)
            except CheckpointError:
                continue
            if tag is not None and is_tag_folder(directory / tag):
                return f"'{pointer}' names its {tag}"
    return None
