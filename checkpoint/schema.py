"""What a checkpoint's `metadata.json`, `latest` and Megatron's tracker file may contain, checked before anything trusts
them. Every bad value (a wrong type, a number beyond int64 or non-finite, a name that is not a plain file name, entries
that contradict each other) is a `CheckpointError` naming the entry, raised before any file is opened.
"""

from __future__ import annotations

import functools
import math
import re
from pathlib import Path
from typing import Any, Callable, Optional

from arguments.config import PretrainConfig
from base.errors import CheckpointError, ConfigError
from base.options import option_fields, setting_names, with_settings
from checkpoint.inside import inside
from checkpoint.rerun_machine_entry import is_entry as _rerun_entry
from gpt.model_config import ModelConfig
from parallel.config import RECORDED_SECTION, recorded_section

ITERATION_NAME = re.compile(r"iter_\d{7,}")
LATEST_MAX_BYTES = 256
PRECISIONS = ("fp32", "bf16", "fp16")
IDENTITY = re.compile(r"[0-9a-f]{32}")


# json's ints are unbounded and its 1e19 a float; counts must fit int64.
INT64_MIN, INT64_MAX = -2**63, 2**63 - 1
NON_NEGATIVE = "a non-negative integer (at most 2**63 - 1, int64)"
POSITIVE = "a positive integer (at most 2**63 - 1, int64)"
ANY_INT = "an integer within int64 (-2**63 to 2**63 - 1)"
FINITE = "a finite number"


def recorded_model(recorded: dict) -> ModelConfig:
    """The model of a recorded config's `model` section, without the parallel settings recorded there."""
    beside = {name for name, section in RECORDED_SECTION.items() if section == "model"}
    return with_settings(ModelConfig, {name: value for name, value in recorded.items() if name not in beside})


def is_int(value: Any, minimum: int = 0) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and minimum <= value <= INT64_MAX


def is_number(value: Any) -> bool:
    """A finite real: a float that is not NaN or infinite, or an int within int64."""
    if isinstance(value, float):
        return math.isfinite(value)
    return is_int(value, INT64_MIN)


def _is_plain_name(value: Any) -> bool:
    return (isinstance(value, str) and value not in ("", ".", "..") and "/" not in value and "\\" not in value
            and "\x00" not in value)


def _list_of(check: Callable[[Any], bool]) -> Callable[[Any], bool]:
    return lambda value: isinstance(value, list) and all(check(item) for item in value)


def _is_int32(value: Any) -> bool:
    return is_int(value, -2 ** 31) and value < 2 ** 31


def _fp8_entry(entry: Any) -> bool:
    """One linear's {amax_history: rows of 3 int32 bit patterns, scale: 3 of them}."""
    if not isinstance(entry, dict) or set(entry) != {"amax_history", "scale"}:
        return False
    rows, scale = entry["amax_history"], entry["scale"]
    return (isinstance(rows, list) and len(rows) >= 1 and all(isinstance(row, list) and len(row) == 3
                                                              and all(map(_is_int32, row)) for row in rows)
            and isinstance(scale, list) and len(scale) == 3 and all(map(_is_int32, scale)))


def _parameter_entry(entry: Any) -> bool:
    """{shape, tensor_parallel_dim} and optionally split_over, replicated_over, real_rows."""
    if not isinstance(entry, dict) or not _list_of(is_int)(entry.get("shape")):
        return False
    dim, rows = entry.get("tensor_parallel_dim"), entry.get("real_rows")
    return ((dim is None or (is_int(dim) and dim < len(entry["shape"])))
            and (rows is None or (is_int(rows) and bool(entry["shape"]) and 1 <= rows <= entry["shape"][0]))
            and entry.get("split_over") in (None, "tp", "etp")
            and _list_of(lambda name: name in ("pp", "dp", "cp", "tp", "edp", "etp", "ep"))(
                entry.get("replicated_over", [])))


def _shard(entry: Any) -> bool:  # [tp rank, dp rank, file name]
    return (isinstance(entry, list) and len(entry) == 3 and is_int(entry[0]) and is_int(entry[1])
            and _is_plain_name(entry[2]))


def _model_entry(entry: Any) -> bool:  # [tp rank, file name]
    return isinstance(entry, list) and len(entry) == 2 and is_int(entry[0]) and _is_plain_name(entry[1])


def _expert_model_entry(entry: Any) -> bool:  # [tp rank, ep rank, file name, [parameter names]]
    return (isinstance(entry, list) and len(entry) == 4 and is_int(entry[0]) and is_int(entry[1])
            and _is_plain_name(entry[2]) and _list_of(lambda name: isinstance(name, str))(entry[3]))


def _pipeline_stage(entry: Any) -> bool:  # {parameters: [names], files: [file names]}
    return (isinstance(entry, dict) and _list_of(lambda name: isinstance(name, str))(entry.get("parameters"))
            and _list_of(_is_plain_name)(entry.get("files")))


# Entry -> (what it must be, in words; the check).
REQUIRED = {
    "iteration": (NON_NEGATIVE, is_int),
    "consumed_samples": (NON_NEGATIVE, is_int),
    "tensor_parallel_size": (POSITIVE, lambda v: is_int(v, 1)),
    "data_parallel_size": (POSITIVE, lambda v: is_int(v, 1)),
    "zero_stage": ("0, 1, 2 or 3", lambda v: is_int(v) and v <= 3),
    "adam_step": (NON_NEGATIVE, is_int),
    "parameters": ("an object of {shape, tensor_parallel_dim[, split_over, replicated_over, real_rows]} entries",
                   lambda v: isinstance(v, dict) and all(isinstance(k, str) and _parameter_entry(e)
                                                         for k, e in v.items())),
    "optimizer_shards": ("a list of [tp rank, dp rank, file name]", _list_of(_shard)),
    "files": ("an object of file name -> size in bytes (int64)",
              lambda v: isinstance(v, dict) and all(_is_plain_name(k) and is_int(n) for k, n in v.items())),
}
OPTIONAL = {
    "precision": (f"one of {', '.join(PRECISIONS)}", lambda v: v in PRECISIONS),
    "lr": ("a non-negative finite number or null", lambda v: v is None or (is_number(v) and v >= 0)),
    "lr_schedule_samples": (NON_NEGATIVE, is_int),
    "loss_scaler": ("an object or null",
                    lambda v: v is None or (isinstance(v, dict) and isinstance(v.get("state", {}), dict))),
    "model_files": ("a list of [tp rank, file name]", _list_of(_model_entry)),
    "rng_files": ("a list of [tp rank, dp rank, file name]", _list_of(_shard)),
    "expert_model_parallel_size": (POSITIVE, lambda v: is_int(v, 1)),
    "expert_model_files": ("a list of [tp rank, ep rank, file name, [parameter names]]",
                           _list_of(_expert_model_entry)),
    "expert_bias": ("an object of router name -> list of numbers",
                    lambda v: isinstance(v, dict) and all(isinstance(k, str) and _list_of(is_number)(e)
                                                          for k, e in v.items())),
    "fp8_amax_history": ("an object of linear name -> {amax_history: [[int32 bits]], scale: [int32 bits]}",
                         lambda v: isinstance(v, dict) and all(isinstance(k, str) and _fp8_entry(e)
                                                               for k, e in v.items())),
    "rerun_state_machine": ("an object of {mode, state, current_iteration, ranks: [one part per rank]}", _rerun_entry),
    "pipeline_parallel_size": (POSITIVE, lambda v: is_int(v, 1)),
    "context_parallel_size": (POSITIVE, lambda v: is_int(v, 1)),
    "pipeline_stages": ("a list of {parameters: [names], files: [file names]}, one per stage",
                        _list_of(_pipeline_stage)),
    "tokenizer": ("a directory name or null", lambda v: v is None or _is_plain_name(v)),
    "tokenizer_vocab_size": (POSITIVE, lambda v: is_int(v, 1)),
    "hf_token_ids": ("an object of bos_token_id, eos_token_id, pad_token_id -> id, list of ids or null",
                     lambda v: isinstance(v, dict) and set(v) <= {"bos_token_id", "eos_token_id", "pad_token_id"}
                     and all(e is None or is_int(e) or _list_of(is_int)(e) for e in v.values())),
    # NullTokenizer's --vocab-size read otherwise than by default (checkpoint/null_tokenizer_reading.py)
    "null_tokenizer": ("an object of vocab_size, ids, eod_id (whole numbers) and written_by (text)",
                       lambda v: isinstance(v, dict) and set(v) == {"vocab_size", "ids", "eod_id", "written_by"}
                       and all(is_int(v[k], 0) for k in ("vocab_size", "ids", "eod_id"))
                       and isinstance(v["written_by"], str)),
    "tokenizer_digest": ("'sha256:' and 64 hex digits",
                         lambda v: isinstance(v, str) and re.fullmatch(r"sha256:[0-9a-f]{64}", v) is not None),
    "config": ("an object of config sections", lambda v: isinstance(v, dict)
               and all(isinstance(section, dict) for section in v.values())),
    "run_id": ("a lineage id (32 hex digits)", lambda v: isinstance(v, str) and IDENTITY.fullmatch(v) is not None),
    "launch_id": ("a launch id (32 hex digits)", lambda v: isinstance(v, str) and IDENTITY.fullmatch(v) is not None),
    "data_identity": ("a list of dataset objects or null",
                      lambda v: v is None or (isinstance(v, list) and all(isinstance(e, dict) for e in v))),
    "file_hashes": ("an object of file name -> 'algorithm:hex digest'",
                    lambda v: isinstance(v, dict) and all(_is_plain_name(k) and isinstance(d, str) and ":" in d
                                                          for k, d in v.items())),
}


def shown_value(value: Any) -> str:
    shown = repr(value)
    return shown[:80] + "..." if len(shown) > 80 else shown


def number_problem(value: Any, where: str) -> Optional[tuple[str, Any, str]]:
    """(entry, value, what it must be) for the first number under `value` beyond int64 or non-finite."""
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return None
    if isinstance(value, (int, float)):
        return None if is_number(value) else (where, value, ANY_INT if isinstance(value, int) else FINITE)
    if isinstance(value, dict):
        items = value.items()
    elif isinstance(value, list):
        items = ((f"[{index}]", item) for index, item in enumerate(value))
    else:
        return None
    for key, item in items:
        key = str(key)
        problem = number_problem(item, where + key if key.startswith("[") else f"{where}.{key}")
        if problem:
            return problem
    return None


@functools.cache
def _setting_kinds() -> dict[str, dict[str, str]]:
    """{section: {setting: annotation}} of every setting the recorded config holds, by the section it is recorded in."""
    config = PretrainConfig()
    kinds: dict[str, dict[str, str]] = {}
    for section in PretrainConfig.SECTIONS:
        for f, _ in option_fields(type(getattr(config, section))):
            kinds.setdefault(recorded_section(f.name) if section == "parallel" else section, {})[f.name] = str(f.type)
    return kinds


_SETTING_CHECKS = {
    "int": (ANY_INT, lambda v: is_int(v, INT64_MIN)),
    "Optional[int]": (f"{ANY_INT} or null", lambda v: v is None or is_int(v, INT64_MIN)),
    "float": (FINITE, is_number),
    "Optional[float]": (f"{FINITE} or null", lambda v: v is None or is_number(v)),
    "Optional[list[int]]": ("a list of integers within int64, or null",
                            lambda v: v is None or _list_of(lambda i: is_int(i, INT64_MIN))(v)),
}


def _config_problem(config: dict) -> Optional[tuple[str, Any, str]]:
    """The first recorded setting whose value does not fit its setting's type and range; a real setting recorded as an
    integer is made a float in place."""
    kinds = _setting_kinds()
    for section, values in config.items():
        for name, value in values.items():
            kind = kinds.get(section, {}).get(name)
            if kind in _SETTING_CHECKS:
                meaning, check = _SETTING_CHECKS[kind]
                if not check(value):
                    return f"config.{section}.{name}", value, meaning
                if kind in ("float", "Optional[float]") and isinstance(value, int):
                    values[name] = float(value)  # a real setting written as 1: read as 1.0, as a flag's would be
            else:
                problem = number_problem(value, f"config.{section}.{name}")
                if problem:
                    return problem
    return None


_UNSHOWN = object()  # a problem whose words already name the value


def _model_problem(metadata: dict) -> Optional[tuple[str, Any, str]]:
    """The recorded model settings must be valid and describe the parameter table (layers, width, padded vocabulary):
    the tools build the model from them."""
    recorded = (metadata.get("config") or {}).get("model")
    if not recorded:
        return None
    known = setting_names(ModelConfig)
    try:  # a name or choice setting holding a number is the rules' to name (an unknown --activation 5)
        model = with_settings(ModelConfig, {name: value for name, value in recorded.items() if name in known})
        model.validate()
    except (ConfigError, TypeError, ValueError, AttributeError) as error:
        return "config.model", _UNSHOWN, f"a model a run could train: {error}"
    table = metadata["parameters"]
    blocks = {name.split(".")[1] for name in table if name.startswith("blocks.") and name.count(".") >= 2}
    if blocks and len(blocks) != model.num_layers:
        return ("config.model.num_layers", model.num_layers,
                f"the number of blocks its 'parameters' hold ({len(blocks)})")
    embedding = table.get("word_embeddings.weight", {}).get("shape")
    if not embedding or len(embedding) != 2:
        return None
    if embedding[1] != model.hidden_size:
        return ("config.model.hidden_size", model.hidden_size,
                f"the width of its word embeddings in 'parameters' ({embedding[1]})")
    if model.vocab_size >= 1:  # 0: the tokenizer's, not recorded (a config built in code)
        try:
            rows = model.padded_vocab_size(metadata["tensor_parallel_size"])
        except ConfigError as error:
            return "config.model", _UNSHOWN, f"a model a run could train: {error}"
        if rows != embedding[0]:
            return ("config.model.vocab_size", model.vocab_size,
                    f"a vocabulary that pads to the {embedding[0]} rows of its word embeddings in 'parameters' "
                    f"(it pads to {rows})")
    return None


def _meaning_problem(metadata: dict) -> Optional[tuple[str, Any, str]]:
    """(entry, value, what it must be) for the first number the other entries contradict."""
    iteration, consumed, step = metadata["iteration"], metadata["consumed_samples"], metadata["adam_step"]
    if step > iteration:  # skipped fp16 steps and --no-load-optim resumes make it less, never more
        return "adam_step", step, f"at most its 'iteration' ({iteration}): an iteration takes one optimizer step at most"
    if iteration == 0 and consumed != 0:
        return "consumed_samples", consumed, "0 at iteration 0: nothing has been trained"
    if consumed < iteration:
        return ("consumed_samples", consumed,
                f"at least its 'iteration' ({iteration}): every iteration consumes a global batch of samples")
    schedule = metadata.get("lr_schedule_samples", consumed)
    if schedule > consumed:
        return ("lr_schedule_samples", schedule,
                f"at most its 'consumed_samples' ({consumed}): the schedule counts the samples of the updates taken")
    tp_size, dp_size = metadata["tensor_parallel_size"], metadata["data_parallel_size"]
    ranked = [("optimizer_shards", entry) for entry in metadata["optimizer_shards"]]
    ranked += [("rng_files", entry) for entry in metadata.get("rng_files", [])]
    ranked += [("model_files", [tp, None, name]) for tp, name in metadata.get("model_files", [])]
    cp_size = metadata.get("context_parallel_size", 1)
    for key, (tp, dp, name) in ranked:
        if tp >= tp_size:
            return f"{key} ({name})", tp, f"a tensor-parallel rank below its 'tensor_parallel_size' ({tp_size})"
        if key == "optimizer_shards" and cp_size > 1:
            if dp >= dp_size * cp_size:
                return (f"{key} ({name})", dp, f"a partition rank below its 'data_parallel_size' x "
                                               f"'context_parallel_size' ({dp_size * cp_size})")
        elif dp is not None and dp >= dp_size:
            return f"{key} ({name})", dp, f"a data-parallel rank below its 'data_parallel_size' ({dp_size})"
    ep_size = metadata.get("expert_model_parallel_size", 1)
    for tp, ep, name, _ in metadata.get("expert_model_files", []):
        if tp >= tp_size:
            return f"expert_model_files ({name})", tp, f"a tensor-parallel rank below its 'tensor_parallel_size' ({tp_size})"
        if ep >= ep_size:
            return (f"expert_model_files ({name})", ep,
                    f"an expert-parallel rank below its 'expert_model_parallel_size' ({ep_size})")
    for name, entry in metadata["parameters"].items():
        dim = entry["tensor_parallel_dim"]
        if dim is not None and entry["shape"][dim] % tp_size:
            return (f"parameters.{name}.shape", entry["shape"],
                    f"divisible by its 'tensor_parallel_size' ({tp_size}) along its tensor_parallel_dim {dim}")
    stages = metadata.get("pipeline_stages")
    pp_size = metadata.get("pipeline_parallel_size", 1 if stages is None else len(stages))
    if stages is not None and pp_size != len(stages) or stages is None and pp_size != 1:
        return "pipeline_parallel_size", pp_size, f"the number of its 'pipeline_stages' ({len(stages or [])})"
    scaler = metadata.get("loss_scaler") or {}
    state = scaler.get("state") or {}
    if "scale" in state:
        scale = state["scale"]
        if not is_number(scale) or scale <= 0:
            return "loss_scaler.state.scale", scale, "a positive finite number"
        if metadata.get("precision", "fp32") != "fp16" and scale != 1:
            return ("loss_scaler.state.scale", scale,
                    f"1: a {metadata.get('precision', 'fp32')} run does not scale its loss")
    for key in ("good_steps", "hysteresis_left"):  # DynamicLossScaler's counters
        if key in state and not is_int(state[key], 0 if key == "good_steps" else INT64_MIN):
            return f"loss_scaler.state.{key}", state[key], NON_NEGATIVE if key == "good_steps" else ANY_INT
    return None


def check_metadata(metadata: Any, path: Path) -> None:
    """Raise CheckpointError naming `path` and the first entry that is missing, mistyped, out of range or contradicted.
    """
    if not isinstance(metadata, dict):
        raise CheckpointError(f"{path}: corrupt, it is not a JSON object")
    missing = [key for key in REQUIRED if key not in metadata]
    if missing:
        raise CheckpointError(f"{path}: corrupt, it lacks {', '.join(missing)}")
    for table, required in ((REQUIRED, True), (OPTIONAL, False)):
        for key, (meaning, check) in table.items():
            if (required or key in metadata) and not check(metadata[key]):
                raise CheckpointError(f"{path}: corrupt, its {key!r} must be {meaning}, got {shown_value(metadata[key])}")
    problem = (_config_problem(metadata.get("config") or {})
               or number_problem({key: value for key, value in metadata.items() if key != "config"}, "")
               or _meaning_problem(metadata) or _model_problem(metadata))
    if problem:
        where, value, meaning = problem
        got = "" if value is _UNSHOWN else f", got {shown_value(value)}"
        raise CheckpointError(f"{path}: corrupt, its {where.lstrip('.')!r} must be {meaning}{got}")
    listed = set(metadata["files"])
    for name in listed_files(metadata):
        if name not in listed:
            raise CheckpointError(f"{path}: corrupt, it names {name} but its 'files' manifest has no size for it")


def listed_files(metadata: dict) -> list[str]:
    """Every file the checkpoint says it holds: the manifest and the per-rank lists."""
    names = set(metadata["files"])
    names.update(name for _, _, name in metadata["optimizer_shards"])
    names.update(name for stage in metadata.get("pipeline_stages", []) for name in stage["files"])
    names.update(name for _, name in metadata.get("model_files", []))
    names.update(name for _, _, name, _ in metadata.get("expert_model_files", []))
    names.update(name for _, _, name in metadata.get("rng_files", []))
    return sorted(names)


def member(iteration_dir: Path, name: str) -> Path:
    """`iteration_dir / name`, refused unless `name` is a plain name resolving inside the directory."""
    if not _is_plain_name(name):
        raise CheckpointError(f"{iteration_dir}: the checkpoint names {name!r}, which is not a file name inside it")
    return inside(iteration_dir, name)


def _read_pointer(path: Path, holds: str) -> tuple[bytes, str]:
    """A pointer file's first bytes (one more than allowed, so an oversized one shows) and their stripped text."""
    try:
        with open(path, "rb") as f:
            raw = f.read(LATEST_MAX_BYTES + 1)
        return raw, raw.decode("utf-8").strip()
    except OSError as error:
        raise CheckpointError(f"{path}: unreadable ({error.strerror or error})") from None
    except UnicodeDecodeError:
        raise CheckpointError(f"{path}: not UTF-8 text; it should hold {holds}") from None


def read_latest(path: Path) -> str:
    """The iteration directory name a `latest` file holds, checked to be one."""
    raw, text = _read_pointer(path, "an iteration directory name")
    if len(raw) > LATEST_MAX_BYTES or not ITERATION_NAME.fullmatch(text):
        shown = repr(text[:40]) + ("..." if len(text) > 40 else "")
        raise CheckpointError(f"{path} holds {shown}, not an iteration directory name like iter_0001000")
    return text


def read_tracker(path: Path) -> str:
    """The iteration directory Megatron-LM's tracker file names: an integer iteration; "release" and anything else are
    refused."""
    raw, text = _read_pointer(path, "an iteration number")
    if text == "release":
        raise CheckpointError(f"{path} names Megatron-LM's release checkpoint (a 'release' directory), which "
                              f"this checkpoint format has not; pass --load an iter_* directory instead")
    if len(raw) > LATEST_MAX_BYTES or not re.fullmatch(r"\d+", text):
        shown = repr(text[:40]) + ("..." if len(text) > 40 else "")
        raise CheckpointError(f"{path} holds {shown}, not an iteration number like 1000 (Megatron-LM's tracker "
                              f"file holds the iteration of the checkpoint to load)")
    return f"iter_{int(text):07d}"
