"""A Megatron-LM torch_dist iteration directory: told from ours by its metadata.json's content (as
--auto-detect-ckpt-format does), and its common state (common.pt, or the `common_state` object in 0.19's DCP files)
unpickled with only Megatron-Core's safe globals, its enums as `ForeignValue`s: loading never runs code it holds.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import pathlib
import signal
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import numpy as np
import torch

from base.errors import CheckpointError
from checkpoint.file_names import DCP_METADATA_FILE
from checkpoint.format import METADATA_FILE
from checkpoint.torch_dist.common_check import check_common
from checkpoint.zip_records import zip_damage

COMMON_FILE = "common.pt"
COMMON_OBJECT = "common_state"  # Megatron-Core 0.19's common state, a ShardedObject in the DCP files
# Our torch_dist saves' SHA-256 of DCP's .metadata (Megatron-LM ignores the entry).
INDEX_DIGEST_KEY = "zero_gpt_dcp_metadata_sha256"
# ... and of each `.distcp` file: another save's file of the same model would pass the index and CRC checks.
FILE_DIGESTS_KEY = "zero_gpt_distcp_sha256"
FORMAT_NAME = "megatron torch_dist"
TORCH_DIST_BACKEND = "torch_dist"
# The (backend, version) pairs megatron-core registers a default load strategy for (zarr is deprecated).
LOAD_STRATEGIES = {"load_sharded": ((TORCH_DIST_BACKEND, 1),), "load_common": (("torch", 1),)}


@dataclass(frozen=True)
class ForeignValue:
    """A value of a megatron-core type not imported here (an enum member): its type's name and its value."""
    type_name: str
    value: object


# megatron.core.safe_globals' megatron types, each read as a ForeignValue.
MEGATRON_ENUMS = ("megatron.core.transformer.enums.AttnBackend", "megatron.core.transformer.enums.CudaGraphScope",
                  "megatron.core.transformer.enums.InferenceCudaGraphScope",
                  "megatron.core.transformer.enums.CudaGraphModule",
                  "megatron.core.enums.ModelType", "megatron.core.rerun_state_machine.RerunDiagnostic",
                  "megatron.core.rerun_state_machine.RerunMode", "megatron.core.rerun_state_machine.RerunState")
# NumPy's array pickling, data only (NumPy 1 and 2 name the reconstructor differently).
NUMPY_GLOBALS = [np._core.multiarray._reconstruct, (np._core.multiarray._reconstruct,
                                                   "numpy.core.multiarray._reconstruct"),
                 np.ndarray, np.dtype, type(np.dtype(np.uint32))]


def _stand_in(name: str):
    def build(*args):
        return ForeignValue(name, args[0] if len(args) == 1 else args)
    return build


def safe_globals() -> list:
    """The types a Megatron-LM checkpoint's pickles may hold."""
    return [argparse.Namespace, types.SimpleNamespace, pathlib.PosixPath, signal.Signals, *NUMPY_GLOBALS,
            *((_stand_in(name), name) for name in MEGATRON_ENUMS)]


def is_megatron_checkpoint(iteration_dir: Path) -> bool:
    """Megatron-Core's distributed-checkpoint metadata.json; False for ours and for anything unreadable."""
    try:
        config = json.loads((Path(iteration_dir) / METADATA_FILE).read_text())
    except (OSError, ValueError, RecursionError):  # RecursionError: nesting deeper than json can read
        return False
    return isinstance(config, dict) and "sharded_backend" in config and "format_version" not in config


def check_backend(iteration_dir: Path) -> None:
    """The backends metadata.json names (defaults where absent) are ones Megatron-Core has a load strategy for."""
    path = Path(iteration_dir) / METADATA_FILE
    config = json.loads(path.read_text())
    for action, backend_key, version_key, default in (("load_sharded", "sharded_backend", "sharded_backend_version",
                                                       None),
                                                      ("load_common", "common_backend", "common_backend_version",
                                                       "torch")):
        pair = (config.get(backend_key, default), config.get(version_key, 1))
        try:
            known = pair in LOAD_STRATEGIES[action]
        except TypeError:  # an unhashable value: no strategy is registered under it either
            known = False
        if not known:
            raise CheckpointError(f"{path}: names {backend_key} {pair[0]!r} version {pair[1]!r}, which Megatron-Core "
                                  f"has no load strategy for (\"Cannot find a default strategy for: "
                                  f"{(action, *pair)}\"); only {LOAD_STRATEGIES[action][0]} is read here")


def common_object(iteration_dir: Path) -> Optional[str]:
    """The DCP item holding 0.19's common state, where there is no common.pt; else None."""
    iteration_dir = Path(iteration_dir)
    if (iteration_dir / COMMON_FILE).exists() or not (iteration_dir / DCP_METADATA_FILE).is_file():
        return None
    from checkpoint.torch_dist.dcp_reader import DcpReader

    return next((key for key in DcpReader(iteration_dir).objects() if key.split("/")[0] == COMMON_OBJECT), None)


def _load_common_object(iteration_dir: Path, key: str) -> dict:
    from checkpoint.torch_dist.dcp_reader import DcpReader

    common = DcpReader(iteration_dir).read_objects([key], safe_globals())[key]
    if isinstance(common, list) and len(common) == 1:  # a ShardedObject's data is saved as [data]
        common = common[0]
    where = Path(iteration_dir) / f"{DCP_METADATA_FILE}[{key}]"
    if not isinstance(common, dict) or "iteration" not in common:
        raise CheckpointError(f"{where}: not Megatron-LM's common state (no iteration)")
    check_common(common, where)
    return common


def load_common(iteration_dir: Path) -> dict:
    """common.pt (or 0.19's `common_state`), CRC-checked, unpickled safely and range-checked."""
    path = Path(iteration_dir) / COMMON_FILE
    if not path.is_file():
        key = common_object(iteration_dir)
        if key is not None:
            return _load_common_object(Path(iteration_dir), key)
        raise CheckpointError(f"{iteration_dir}: no {COMMON_FILE}; the Megatron-LM save did not finish")
    try:
        damage = zip_damage(path)
    except OSError as error:
        raise CheckpointError(f"{path}: cannot be read ({error.strerror or error})") from None
    if damage:
        raise CheckpointError(f"{path}: {damage}")
    try:
        with torch.serialization.safe_globals(safe_globals()):
            common = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # an UnpicklingError names the global it refused; a truncated file fails otherwise
        line = next((text for text in str(error).splitlines() if "GLOBAL" in text or "Unsupported" in text),
                    str(error).splitlines()[0] if str(error) else type(error).__name__)
        raise CheckpointError(f"{path}: cannot be read without running code or is corrupt ({line.strip()[:240]})") \
            from None
    if not isinstance(common, dict) or "iteration" not in common:
        raise CheckpointError(f"{path}: not Megatron-LM's common state (no iteration)")
    check_common(common, path)
    check_index_digest(Path(iteration_dir), common)
    return common


def index_digest(iteration_dir: Path) -> str:
    """The SHA-256 of DCP's `.metadata` (the index of every chunk), which our torch_dist writer records in common.pt."""
    return hashlib.sha256((iteration_dir / DCP_METADATA_FILE).read_bytes()).hexdigest()


def check_index_digest(iteration_dir: Path, common: dict) -> None:
    """Where we wrote the checkpoint, its `.metadata` matches the digest beside it: the index has no checksum of its
    own, and a changed offset would misplace a verified chunk."""
    saved = common.get(INDEX_DIGEST_KEY)
    if saved is None:
        return
    path = iteration_dir / DCP_METADATA_FILE
    try:
        digest = index_digest(iteration_dir)
    except OSError as error:
        raise CheckpointError(f"{path}: cannot be read ({error.strerror or error})") from None
    if digest != saved:
        raise CheckpointError(f"{path}: corrupt, its SHA-256 is not the one common.pt recorded when the checkpoint "
                              f"was written ({str(saved)[:16]}..., now {digest[:16]}...)")


def saved_args(common: dict) -> argparse.Namespace:
    args = common.get("args")
    return args if isinstance(args, (argparse.Namespace, types.SimpleNamespace)) else argparse.Namespace()


def arg(common: dict, name: str, default=None):
    return getattr(saved_args(common), name, default)


def content_metadata(common: dict) -> dict:
    """dist_checkpointing.load_content_metadata: the sharded_state_dict metadata the save used."""
    return common.get("content_metadata") or {}


def sharding_type(common: dict) -> Optional[str]:
    """The distributed optimizer's layout (dp_reshardable, fully_reshardable, ...); None without one."""
    return ((common.get("optimizer") or {}).get("param_state_sharding_type")
            or content_metadata(common).get("distrib_optim_sharding_type"))
