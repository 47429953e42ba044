"""`--load` of a Megatron-LM torch_dist folder: its files verified, its saved args read as our metadata.json's fields so
the same resume checks decide (data, samples left, block settings, schedule), then the load through
checkpoint/global_load.py.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Optional

from base.errors import CheckpointError, ConfigError
from base.options import setting_names, setting_value
from checkpoint.file_names import DCP_METADATA_FILE
from checkpoint.format import METADATA_FILE
from checkpoint.global_load import ResumePoint, load_from_source, parameter_records
from checkpoint.global_state import MODEL_KEY
from checkpoint.inside import inside
from checkpoint.lineage import SAMPLE_ORDER_KEY
from checkpoint.resume_checks import agreed_problem, check_resume
from checkpoint.resume_model import COMPARED, DEFAULTS_FROM
from checkpoint.torch_dist.common import (
    COMMON_FILE,
    FILE_DIGESTS_KEY,
    check_backend,
    common_object,
    load_common,
    saved_args,
)
from checkpoint.torch_dist.dcp_reader import DcpReader
from checkpoint.torch_dist.names import hybrid_layer_symbols
from checkpoint.torch_dist.null_tokenizer import null_tokenizer_view
from checkpoint.torch_dist.source import MegatronSource
from data.megatron_order import MEGATRON_ORDER
from gpt.hybrid_pattern import parse_hybrid_pattern
from parallel.state import ParallelState

# Megatron-LM's dests of our settings of another name (the rest share Megatron's names).
RENAMED = {"norm_epsilon": "layernorm_epsilon", "layernorm_zero_centered_gamma": "apply_layernorm_1p"}


def verify_megatron(iteration_dir: Path) -> None:
    """The checkpoint's files are there, inside it, and not truncated."""
    check_backend(iteration_dir)
    in_index = inside(iteration_dir, DCP_METADATA_FILE).is_file() and common_object(iteration_dir) is not None
    for name in (METADATA_FILE, *(() if in_index else (COMMON_FILE,)), DCP_METADATA_FILE):
        if not inside(iteration_dir, name).is_file():
            raise CheckpointError(f"{iteration_dir / name}: missing; the Megatron-LM save did not finish")
    load_common(iteration_dir)
    reader = DcpReader(iteration_dir)
    needed: dict[str, int] = {}
    for info in reader.metadata.storage_data.values():
        needed[info.relative_path] = max(needed.get(info.relative_path, 0), info.offset + info.length)
    for name, end in sorted(needed.items()):
        path = inside(iteration_dir, name)
        if not path.is_file():
            raise CheckpointError(f"{path}: missing from the checkpoint (its index places chunks in it)")
        size = path.stat().st_size
        if size < end:
            raise CheckpointError(f"{path}: {size} bytes, but the checkpoint's index places data up to byte {end}; "
                                  f"the file is truncated")


def verify_megatron_records(iteration_dir: Path, rank: int, world_size: int) -> Optional[str]:
    """This rank's share of the stored items (and recorded file digests) verified: the first problem, or None."""
    try:
        DcpReader(iteration_dir).verify(rank, world_size, load_common(iteration_dir).get(FILE_DIGESTS_KEY))
    except CheckpointError as error:
        return str(error)
    return None


def verify_megatron_completely(iteration_dir: Path) -> None:
    """`verify_megatron`, then every item and digest, in this one process."""
    verify_megatron(iteration_dir)
    DcpReader(iteration_dir).verify(digests=load_common(iteration_dir).get(FILE_DIGESTS_KEY))


def _activation(args: argparse.Namespace) -> Optional[str]:
    """The MLP activation Megatron-Core computed (None for SwiGLU): squared ReLU, tanh GeLU (also the fused bias-GeLU),
    else exact GeLU."""
    if getattr(args, "swiglu", False):
        return None
    if getattr(args, "squared_relu", False):
        return "squared_relu"
    if getattr(args, "openai_gelu", False):
        return "gelu_tanh"
    fused = getattr(args, "bias_gelu_fusion", True) and getattr(args, "add_bias_linear", True)
    return "gelu_tanh" if fused else "gelu"


def hybrid_settings(values: dict) -> dict:
    """A HybridModel checkpoint's settings as ours: its num_layers counts symbols, ours blocks; its MoE layers are the
    pattern's `E`s."""
    text = values.get("hybrid_layer_pattern")
    if not text:
        return {}
    try:
        pattern = parse_hybrid_pattern(text)
    except ConfigError:  # not GPT blocks: the tensors' mapping names what is not ours
        return {"num_layers": hybrid_layer_symbols(text).count("*")}
    settings = {"num_layers": pattern.num_layers}
    if values.get("num_experts"):
        settings["moe_layer_freq"] = pattern.moe_layer_freq()
    return settings


def metadata_view(common: dict, config) -> dict:
    """Megatron-LM's common.pt as the fields of our metadata.json; a setting its args lack takes this run's value."""
    args = saved_args(common)
    values = {RENAMED.get(name, name): value for name, value in vars(args).items()}
    values.update(hybrid_settings(values))

    def section(ours, names) -> dict:
        return {name: values[name] if name in values and values[name] is not None else setting_value(ours, name)
                for name in names}

    model = section(config.model, [name for name in (*COMPARED, *DEFAULTS_FROM)
                                   if name in setting_names(type(config.model))] + ["seq_length"])
    if not getattr(args, "group_query_attention", True):
        model["num_query_groups"] = None
    if "add_qkv_bias" in model and model.get("add_bias_linear"):
        model["add_qkv_bias"] = False  # Megatron's validate_args sets it beside --add-bias-linear; ours means "beyond"
    activation = _activation(args)
    if activation is not None:
        model["activation"] = activation
    saved_path = values.get("data_path")  # Megatron-LM's --data-path: a list (nargs="*")
    data = {"data_path": [saved_path] if isinstance(saved_path, str) else list(saved_path or []),
            "split": values.get("split") or config.data.split}
    if getattr(args, "mock_data", False) or not saved_path:
        data = {}  # mock data, or a blend given otherwise: nothing typed to compare
    training = section(config.training, ("seed", "train_iters", "train_samples", "global_batch_size"))
    optimizer = {name: values[name] for name in vars(config.optimizer) if name in values}
    return {"iteration": int(common["iteration"]),
            "consumed_samples": int(getattr(args, "consumed_train_samples", 0) or 0),
            "config": {"model": model, "data": data, "training": training, "optimizer": optimizer},
            SAMPLE_ORDER_KEY: MEGATRON_ORDER,  # its consumed samples count positions in Megatron-Core's order
            **null_tokenizer_view(args)}


def megatron_metadata(iteration_dir: Path, config) -> dict:
    """The files verified, then common.pt as the metadata our resume checks read."""
    verify_megatron(iteration_dir)
    return metadata_view(load_common(iteration_dir), config)


def _verify_records(iteration_dir: Path, metadata: dict, state: ParallelState, check_content: bool) -> None:
    """Each rank verifies a share of the records' CRC-32."""
    if check_content:
        agreed_problem(state, verify_megatron_records(iteration_dir, state.rank, state.world_size))


def check_start(config, state: ParallelState, iteration_dir: Path, log, batch):
    """The format registry's call before any work (checkpoint/formats.py)."""
    return check_resume(megatron_metadata, _verify_records, config, state, iteration_dir, log, batch)


def load_resume(iteration_dir: Path, model, optimizer, rng, state: ParallelState, model_config, *,
                load_optimizer: bool, load_rng: bool, finetune: bool) -> ResumePoint:
    """The format registry's load (checkpoint/formats.py)."""
    return load_megatron_checkpoint(iteration_dir, model, optimizer, rng, state, load_optimizer=load_optimizer,
                                    load_rng=load_rng, finetune=finetune)


def _vocabulary_padding(source: MegatronSource, model) -> int:
    """The saved vocabulary rows beyond the real ones (0 where this rank holds no vocabulary tensor)."""
    records = parameter_records(model)
    for name in ("word_embeddings.weight", "output_layer.weight"):
        saved = source.tensors("master").get(name) or source.tensors(MODEL_KEY).get(name)
        if name in records and saved is not None:
            record = records[name][1]
            return max(0, saved.shape[0] - (record.real_rows or record.global_shape[0]))
    return 0


def load_megatron_checkpoint(iteration_dir: Path, model, optimizer, rng, state: ParallelState, *,
                             load_optimizer: bool, load_rng: bool, finetune: bool, log=print) -> ResumePoint:
    """The weights, optimizer states, progress and RNG carried from a Megatron-LM checkpoint; what is not, said in one
    line."""
    source = MegatronSource(iteration_dir)
    if state.is_first_rank:
        layout = source.layout or "the plain optimizer's"
        log(f"> loading Megatron-LM torch_dist checkpoint {iteration_dir} (optimizer states: {layout} layout)",
            flush=True)
        missing = source.not_carried()
        if missing:
            log(f" note: not carried from {iteration_dir}: {'; '.join(missing)}", flush=True)
        padding = _vocabulary_padding(source, model)
        if padding:
            log(f" note: {iteration_dir} pads the vocabulary with {padding} rows; Megatron-Core's cross entropy takes "
                f"their logits into its softmax and this project's leaves them out (parallel/cross_entropy.py), so "
                f"the losses from here on are not the ones Megatron-LM would log", flush=True)
    return load_from_source(source, model, optimizer, rng, state, load_optimizer=load_optimizer,
                            load_rng=load_rng, finetune=finetune, log=log)
