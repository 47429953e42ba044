"""Hugging Face folders in and out, and which family's mapping a model takes (families/registry.py): an MoE family's
that claims it, a dense family's, the Llama-shaped one (families/common/llama_shaped.py), else GPT-2's
(families/gpt2/weights.py). A Hugging Face folder (config.json, model.safetensors, tokenizer files) is what people share
and what `from_pretrained` reads with no code of ours:
- `write_hf_folder` builds one in a staging directory beside OUT_DIR and renames it into place, so a failed
  conversion never leaves a half-written folder that loads as a model.
- `read_hf_folder` checks config.json with our own reader first (arguments/hf_config.py: one line naming a bad
  field), and reads weights with safetensors, or a `pytorch_model.bin` with torch's weights-only unpickler: a pickle
  from the internet that runs code is refused, never executed.
- checkpoint/hf/source.py's `initialize_from_hf` starts a run from such a folder (`--init-from-hf`) after its config's
  shape was compared with the run's flags (`check_hf_config`), each rank reading its own shard's regions.
- `checkpoint_to_hf_state` turns a checkpoint's fp32 master weights into transformers' names
(scripts/tools/convert_to_hf.py)."""

from __future__ import annotations

import glob
import os
import re
import shutil
import socket
import warnings
from pathlib import Path
from typing import Callable, Optional

import torch

from arguments.config import ModelConfig
from arguments.hf_config import CONFIG_FILE, HFConfig, read_hf_config, read_json_object, registered_family
from base.errors import ConfigError
from base.output_locks import process_is_running
from checkpoint.format import read_metadata, save_tensors
from checkpoint.hf.config_check import check_llama_hf_config
from checkpoint.hf.export_ids import set_token_ids, write_generation_config
from checkpoint.inside import folder_files, inside
from checkpoint.ours.source import consolidate
from checkpoint.output_paths import check_replaceable_folder, install_folder
from checkpoint.router_state import check_expert_biases, configured_biased_routers
from checkpoint.schema import recorded_model
from checkpoint.unpickler import unpickler_reason
from data.hf_special_tokens import GENERATION_CONFIG_FILE
from families.common import dense_weights as hf_dense
from families.common import llama_shaped as hf_llama
from families.common.layout import canonical_names, tensor_shapes
from families.registry import export_family, fallback_family, family_of, family_weights, llama_families
from gpt.hybrid_pattern import ATTENTION, BLOCKS, MLA, parse_hybrid_pattern
from gpt.layer_spec import mixer_symbols
from parallel.state import ParallelState

# GPT-2's mapping (families/gpt2/weights.py): what a model no other family claims exports as, under the names this
# module has always given its parts
GPT2 = fallback_family().export
ACTIVATION_FROM_HF, HF_ATTENTION_OPTIONS, HF_BUFFER_SUFFIXES = \
    GPT2.ACTIVATION_FROM_HF, GPT2.HF_ATTENTION_OPTIONS, GPT2.BUFFER_SUFFIXES
gpt2_misfits, check_gpt2_shaped, check_dense, hf_config = \
    GPT2.gpt2_misfits, GPT2.check_gpt2_shaped, GPT2.check_dense, GPT2.hf_config
name_table, from_hf_state_dict, gpt2_lm_head_names, hf_tensor_shapes, _qkv_hf_to_ours = \
    GPT2.name_table, GPT2.from_hf_state_dict, GPT2.canonical_names, GPT2.tensor_shapes, GPT2.qkv_hf_to_ours

def dense_family(config: ModelConfig):
    """The dense family the export writes `config` as (families/registry.py export_family), or None where
    GPT2LMHeadModel or LlamaForCausalLM (Mixtral, Qwen2-MoE, Apertus) holds it."""
    return export_family(config, not gpt2_misfits(config) or not hf_llama.llama_misfits(config))


def is_llama_shaped(config: ModelConfig) -> bool:
    """Converted as transformers' LlamaForCausalLM rather than GPT2LMHeadModel."""
    return bool(gpt2_misfits(config))


def refuse_mtp(config: ModelConfig, what: str) -> None:
    """Multi-token prediction's layers (gpt/mtp.py) have no place in a GPT2LMHeadModel or a LlamaForCausalLM: the
    export and --init-from-hf refuse them rather than drop them or leave them unloaded."""
    if config.mtp.num_layers:
        raise ConfigError(f"{what} of a model with --mtp-num-layers {config.mtp.num_layers} is not implemented: "
                          f"transformers' GPT-2 and Llama have no multi-token prediction layers; drop --mtp-num-layers",
                          flags=("--mtp-num-layers",))


def refuse_hybrid_layers(config: ModelConfig, what: str) -> None:
    """A --hybrid-layer-pattern with Mamba (`M`) layers or a mixer or an MLP alone (gpt/hybrid_pattern.py), unless the
    family claiming it holds them (FamilyWeights.holds_hybrid_blocks: NemotronH's `M`, `*`, `-` and `E` layers):
    refused in one line rather than written as a Llama without them."""
    family = family_of(config)
    if config.hybrid_layer_pattern is not None and not (family is not None and family.holds_hybrid_blocks) and \
            any(block not in BLOCKS for block in parse_hybrid_pattern(config.hybrid_layer_pattern).blocks):
        raise ConfigError(f"{what} of --hybrid-layer-pattern {config.hybrid_layer_pattern} is not implemented: its "
                          f"Mamba layers or one-part blocks beside its other layers are no Hugging Face family here "
                          f"(NemotronH's holds `M`, `*`, `-` and `E` layers alone)",
                          flags=("--hybrid-layer-pattern",))


def mtp_unloaded(config: ModelConfig) -> Optional[str]:
    """The one line an export of a model with MTP layers says where its family's class runs none (FamilyWeights.
    drops_mtp: DeepSeek-V3): their weights are written under a release's names, which transformers leaves unloaded;
    None where there are none."""
    family = family_of(config)
    if not config.mtp.num_layers or family is None or not family.drops_mtp:
        return None
    return (f" note: --mtp-num-layers {config.mtp.num_layers}: {family.architecture} runs no multi-token prediction "
            f"layer: their weights are written as a release's model.layers.{config.num_layers}.* (num_nextn_predict_layers "
            f"{config.mtp.num_layers}), which transformers does not load; its logits are the main model's")


def refuse_mixed_mixers(config: ModelConfig, what: str) -> None:
    """A --hybrid-layer-pattern with both `*` (attention) and `+` (MLA) layers: every transformers class holds one
    attention kind in all its layers (DeepseekV3's MLA; Llama's and the other families' attention)."""
    if {ATTENTION, MLA} <= set(mixer_symbols(config)):
        raise ConfigError(f"{what} of --hybrid-layer-pattern {config.hybrid_layer_pattern} is not implemented: its "
                          f"`*` (attention) and `+` (MLA) layers in one model are no transformers class (each holds "
                          f"one attention kind in every layer); export a pattern of `*` or of `+` layers alone",
                          flags=("--hybrid-layer-pattern",))


def check_convertible(config: ModelConfig, what: str) -> None:
    """A GPT2LMHeadModel or a LlamaForCausalLM can hold this model; anything else (GPT-2's blocks with an
    untied output layer, --qk-layernorm, ...) is refused in one line naming what a Llama would need, and so are
    multi-token prediction's layers (refuse_mtp) but where the family writes them (mtp_unloaded), a pattern
    mixing attention and MLA layers (refuse_mixed_mixers) and a pattern's Mamba or one-part layers
    (refuse_hybrid_layers)."""
    refuse_hybrid_layers(config, what)
    refuse_mixed_mixers(config, what)
    family = family_of(config)
    if family is not None:  # a family of families/ with weights of its own (MoE, or DeepSeek-V3's MLA)
        misfits = family.misfits(config)
        if misfits:
            raise ConfigError(f"{what} converts each model as the transformers class it is; as a "
                              f"{family.architecture} this one would need {', '.join(misfits)}")
    elif dense_family(config) is None and is_llama_shaped(config):
        hf_llama.check_llama_shaped(config, what, ("no --mtp-num-layers",) if config.mtp.num_layers else ())
    if family is None or not family.drops_mtp:  # after the blocks: dropping MTP alone must be the whole fix
        refuse_mtp(config, what)


def class_of(config: ModelConfig) -> str:
    """The transformers class a model exports as."""
    family = family_of(config) or dense_family(config)
    if family is not None:
        return family.architecture
    return hf_llama.architecture_of(config) if is_llama_shaped(config) else "GPT2LMHeadModel"


def model_type_of(config: ModelConfig) -> str:
    """The model_type the export writes a model as (class_of's family)."""
    family = family_of(config) or dense_family(config)
    if family is not None:
        return family.model_type
    if not is_llama_shaped(config):
        return "gpt2"
    return hf_llama.APERTUS_TYPE if hf_llama.is_apertus(config) else hf_llama.moe_family(config) or hf_llama.MODEL_TYPE


def to_hf_state_dict(state_dict: dict[str, torch.Tensor], config: ModelConfig) -> dict[str, torch.Tensor]:
    """Our whole state dict under GPT2LMHeadModel's names, or LlamaForCausalLM's for a Llama-shaped model, or
    its family's (an MoE family's: families/<name>/weights.py; a dense family's: families/common/dense_weights.py)."""
    moe_family = family_of(config)
    if moe_family is not None:
        check_convertible(config, "the Hugging Face export")
        unloaded = mtp_unloaded(config)
        if unloaded:
            print(unloaded, flush=True)
        return moe_family.pack(moe_family.to_hf(shifted_gains(state_dict, config, moe_family, +1), config))
    family = dense_family(config)
    if family is not None:
        return hf_dense.to_hf(shifted_gains(state_dict, config, family, +1), config, family)
    state_dict = shifted_gains(state_dict, config, None, +1)
    if is_llama_shaped(config):
        return hf_llama.to_llama_state_dict(state_dict, config)
    return GPT2.to_hf(state_dict, config)


def shifted_gains(state_dict: dict[str, torch.Tensor], config: ModelConfig, family, sign: int
                  ) -> dict[str, torch.Tensor]:
    """--apply-layernorm-1p stores each norm's gain less one; a family that stores the gain itself (all but
    Gemma's, whose RMSNorm weights are also the gain less one) gets it with one added (`sign` +1, the export), and
    gives it with one taken away (-1, the import), in fp32; an MoE family's gain_norms name the norms it stores so
    (FamilyWeights: Qwen3-Next's gated DeltaNet norm alone)."""
    if not config.norms.apply_layernorm_1p or (family is not None and getattr(family, "fixed", {}).get(
            "apply_layernorm_1p")):
        return state_dict
    gains = getattr(family, "gain_norms", ("layernorm.weight",))
    return {name: (tensor.float() + sign).to(tensor.dtype) if name.endswith(gains) else tensor
            for name, tensor in state_dict.items()}


# ---- Hugging Face folders -----------------------------------------------------------------------

SAFETENSORS_FILE = "model.safetensors"
SAFETENSORS_INDEX_FILE = "model.safetensors.index.json"  # what save_pretrained writes for big models
PICKLE_FILE = "pytorch_model.bin"
MAX_LISTED = 12  # problems listed in one error before "... and N more"


def owned_names(tokenizer_dir: Optional[Path] = None) -> frozenset[str]:
    """The names an export writes into OUT_DIR, and so the only ones --overwrite may replace: the
    config, the weights, and the tokenizer files (ours, or whatever the checkpoint's tokenizer/ holds)."""
    from data.tokenizer import MERGES_FILE, TOKENIZER_CONFIG_FILE, TOKENIZER_FILE, VOCAB_FILE

    tokenizer_files = {TOKENIZER_FILE, VOCAB_FILE, MERGES_FILE, TOKENIZER_CONFIG_FILE}
    if tokenizer_dir is not None and tokenizer_dir.is_dir():
        tokenizer_files |= {path.name for path in tokenizer_dir.iterdir() if path.is_file()}
    return frozenset({CONFIG_FILE, GENERATION_CONFIG_FILE, SAFETENSORS_FILE, *tokenizer_files})


def check_output_folder(out_dir: Path, overwrite: bool, tokenizer_dir: Optional[Path] = None) -> None:
    """OUT_DIR may be absent or empty; with --overwrite it may also hold an earlier export, and
    nothing else (checkpoint/output_paths.py)."""
    check_replaceable_folder(Path(os.path.abspath(out_dir)), owned_names(tokenizer_dir), overwrite, "OUT_DIR")


def write_hf_folder(out_dir: str | os.PathLike, hf_state: dict[str, torch.Tensor], model_config: ModelConfig,
                    tokenizer_dir: Optional[str | os.PathLike] = None, dtype: torch.dtype = torch.float32,
                    overwrite: bool = False, eod_token_id: Optional[int] = None,
                    folder_ids: Optional[dict] = None) -> Path:
    """Write a folder `GPT2LMHeadModel.from_pretrained` (and, with `tokenizer_dir`,
    `AutoTokenizer.from_pretrained`) loads: config.json, generation_config.json, model.safetensors in `dtype`,
    tokenizer files. `eod_token_id`: the end-of-document id where no tokenizer folder gives it (a Megatron-LM run's
    NullTokenizer); `folder_ids`: config.json's token ids of the folder the run started from (export_ids.py)."""
    out_dir = Path(os.path.abspath(out_dir))  # "." and "a/.." have no name to stage beside
    tokenizer_dir = Path(tokenizer_dir) if tokenizer_dir is not None else None
    check_output_folder(out_dir, overwrite, tokenizer_dir)
    tensors = _tensors_to_write(hf_state, dtype, tied=not model_config.output.untie_embeddings_and_output_weights)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging_prefix = f".{out_dir.name}.partial-{socket.gethostname()}-"
    for stale in out_dir.parent.glob(f"{glob.escape(staging_prefix)}*"):  # an export killed on this host left it
        pid = stale.name[len(staging_prefix):]
        if pid.isdigit() and (int(pid) == os.getpid() or not process_is_running(int(pid))):
            shutil.rmtree(stale, ignore_errors=True)
    staging = out_dir.with_name(f"{staging_prefix}{os.getpid()}")
    staging.mkdir()
    try:
        hf = folder_config(model_config, tokenizer_dir, dtype, eod_token_id, folder_ids)
        hf.save_pretrained(str(staging))
        write_generation_config(hf, staging, tokenizer_dir)
        save_tensors(staging / SAFETENSORS_FILE, tensors)
        if tokenizer_dir is not None:
            _copy_tokenizer(tokenizer_dir, staging)
        # An existing OUT_DIR goes only once the new one is in place, and only its owned files go.
        install_folder(staging, out_dir, owned_names(tokenizer_dir))
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return out_dir


def _tensors_to_write(hf_state: dict[str, torch.Tensor], dtype: torch.dtype, tied: bool = True
                      ) -> dict[str, torch.Tensor]:
    """The tensors in `dtype`, without a tied lm_head.weight: it is the token embedding, transformers
    re-ties it on load, and safetensors refuses two names for one storage. An untied one is written."""
    tensors = {}
    for name, tensor in hf_state.items():
        if (tied and name == "lm_head.weight") or name.endswith(HF_BUFFER_SUFFIXES):
            continue
        tensors[name] = tensor.detach().to(device="cpu", dtype=dtype).contiguous()
        if tensor.is_floating_point() and not torch.isfinite(tensors[name]).all():
            raise ConfigError(f"{name} has values outside {dtype}'s range (or already inf/NaN); "
                              f"choose a wider --dtype (bf16 or fp32)")
    return tensors


def folder_config(model_config: ModelConfig, tokenizer_dir: Optional[Path], dtype: torch.dtype,
                  eod: Optional[int] = None, folder_ids: Optional[dict] = None):
    """The transformers config the export writes as config.json (the family's class, its fields from the model's
    settings), its token ids the source folder's or the tokenizer's (export_ids.py), else BOS and EOS `eod`."""
    # generate() stops at the EOS id, which must be our tokenizer's.
    eod = _eod_id(tokenizer_dir) if tokenizer_dir is not None else eod
    moe_family = family_of(model_config)
    family = dense_family(model_config) if moe_family is None else None
    if moe_family is not None:
        hf = moe_family.hf_config(model_config, eod)
        hf.architectures = [moe_family.architecture]
    elif family is not None:
        hf = hf_dense.hf_config(model_config, family, eod)
    elif is_llama_shaped(model_config):
        hf = hf_llama.llama_hf_config(model_config, eod)
        hf.architectures = [hf_llama.architecture_of(model_config)]
    else:
        hf = hf_config(model_config, eod)
        hf.architectures = ["GPT2LMHeadModel"]
    set_token_ids(hf, tokenizer_dir, folder_ids)
    # from_pretrained(dtype="auto") loads in the dtype the weights were written in.
    if hasattr(hf, "dtype"):
        hf.dtype = dtype
    else:  # transformers before 4.56
        hf.torch_dtype = dtype
    return hf


def _eod_id(tokenizer_dir: Path) -> Optional[int]:
    """The saved tokenizer's own end-of-document id (its eos_token, as training read it: data/tokenizer.py)."""
    from data import DataError
    from data.tokenizer import TOKENIZER_FILE, load_tokenizer

    path = inside(tokenizer_dir.parent, tokenizer_dir.name, TOKENIZER_FILE)
    if not path.is_file():
        raise ConfigError(f"{path}: missing; the checkpoint's tokenizer folder is incomplete")
    try:
        return load_tokenizer(tokenizer_file=str(path)).eod_id
    except DataError as error:
        raise ConfigError(f"{path}: the checkpoint's tokenizer does not load ({error})") from None


def _copy_tokenizer(tokenizer_dir: Path, destination: Path) -> None:
    """Every file of the saved tokenizer (tokenizer.json, vocab.json, merges.txt, tokenizer_config.json),
    each resolved inside the checkpoint that holds the folder (checkpoint/inside.py): a link out is
    refused, never copied into the export."""
    for path in folder_files(tokenizer_dir.parent, tokenizer_dir.name):
        shutil.copyfile(path, destination / path.name)


def read_hf_folder(hf_dir: str | os.PathLike) -> tuple[dict, dict[str, torch.Tensor]]:
    """(config.json as a dict, the weights under GPT2LMHeadModel's names, or LlamaForCausalLM's when
    config.json is a Llama's). Only safetensors, JSON and weights-only pickles are read; every failure is
    a ConfigError naming the file."""
    config, tensors = read_hf_model(hf_dir)
    return config.fields, tensors


# An expert's weights in a Mixtral or Qwen2-MoE file: (layer, expert) from the name (a LlamaModel file lacks "model.")
_EXPERT_KEY = re.compile(r"^(?:model\.)?layers\.(\d+)\.(?:block_sparse_moe|mlp)\.experts\.(\d+)\.")


def expert_filter(held: Optional[set[tuple[int, int]]]) -> Optional[Callable[[str], bool]]:
    """With expert parallelism, which of a folder's tensors a rank reads: every one but the experts it does not
    hold ((layer, expert) pairs); None (read all) without it."""
    if held is None:
        return None

    def keep(name: str) -> bool:
        match = _EXPERT_KEY.match(name)
        return match is None or (int(match.group(1)), int(match.group(2))) in held
    return keep


def read_hf_model(hf_dir: str | os.PathLike, keep: Optional[Callable[[str], bool]] = None
                  ) -> tuple[HFConfig, dict[str, torch.Tensor]]:
    """The folder's config.json, checked by arguments/hf_config.py before any of it reaches transformers,
    and its weights under transformers' names for that family (with `keep`, only the tensors it keeps: a
    safetensors file is read tensor by tensor, so the others are never loaded)."""
    hf_dir = Path(hf_dir)
    config = read_hf_config(hf_dir)
    if config.family in family_weights():
        unpack = family_weights()[config.family].unpack or canonical_names
        state = unpack(_read_weights(hf_dir, keep), config.num_layers)
        return config, state if keep is None else {name: t for name, t in state.items() if keep(name)}
    family = registered_family(config.family)
    if family is not None:
        state = hf_dense.canonical_names(_read_weights(hf_dir, keep), family)
        return config, state if keep is None else {name: t for name, t in state.items() if keep(name)}
    if config.family in llama_families():
        state = hf_llama.canonical_names(_read_weights(hf_dir, keep), config.family)
        return config, state if keep is None else {name: t for name, t in state.items() if keep(name)}
    return config, gpt2_lm_head_names(_read_weights(hf_dir))


def _read_weights(hf_dir: Path, keep: Optional[Callable[[str], bool]] = None) -> dict[str, torch.Tensor]:
    if (hf_dir / SAFETENSORS_FILE).is_file():
        return _read_safetensors(hf_dir / SAFETENSORS_FILE, keep)
    if (hf_dir / SAFETENSORS_INDEX_FILE).is_file():
        return _read_safetensors_shards(hf_dir / SAFETENSORS_INDEX_FILE, keep)
    if (hf_dir / PICKLE_FILE).is_file():
        return _read_weights_only_pickle(hf_dir / PICKLE_FILE)
    raise ConfigError(f"{hf_dir}: no weights ({SAFETENSORS_FILE}, {SAFETENSORS_INDEX_FILE} or {PICKLE_FILE})")


def _read_safetensors(path: Path, keep: Optional[Callable[[str], bool]] = None) -> dict[str, torch.Tensor]:
    from safetensors import safe_open
    from safetensors.torch import load_file

    try:
        if keep is None:
            return load_file(str(path), device="cpu")
        with safe_open(str(path), framework="pt", device="cpu") as reader:
            return {name: reader.get_tensor(name) for name in reader.keys() if keep(name)}
    except Exception as error:  # safetensors raises its own error types for malformed files
        raise ConfigError(f"{path}: not a valid safetensors file ({_first_line(error)})") from None


def _read_safetensors_shards(index_path: Path, keep: Optional[Callable[[str], bool]] = None
                             ) -> dict[str, torch.Tensor]:
    weight_map = read_json_object(index_path, "the safetensors index names the weight files").get("weight_map")
    if not isinstance(weight_map, dict):
        raise ConfigError(f"{index_path}: has no weight_map")
    tensors = {}
    for name in sorted(set(weight_map.values())):
        if not isinstance(name, str) or Path(name).name != name:  # only files beside the index
            raise ConfigError(f"{index_path}: names {name!r}, which is not a file in the folder")
        tensors.update(_read_safetensors(index_path.parent / name, keep))
    return tensors


def _read_weights_only_pickle(path: Path) -> dict[str, torch.Tensor]:
    """torch's weights-only unpickler rebuilds tensors and plain containers and refuses every other
    global, so a pickle carrying code is an error here rather than code that runs."""
    try:
        with warnings.catch_warnings():  # its pickle-protocol warning would be two more lines before ours
            warnings.simplefilter("ignore")
            state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:
        raise ConfigError(f"{path}: refused, not a plain file of tensors ({unpickler_reason(error)}); "
                          f"convert it to {SAFETENSORS_FILE} with a tool you trust") from None
    if not isinstance(state, dict) or not all(isinstance(k, str) and isinstance(v, torch.Tensor)
                                              for k, v in state.items()):
        raise ConfigError(f"{path}: expected a dict of tensor names to tensors")
    return state


def _first_line(error: Exception) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def check_hf_config(hf: dict, model_config: ModelConfig, source: str | os.PathLike = CONFIG_FILE) -> None:
    """Raise ConfigError listing every way the folder's config.json differs from this run's model,
    each with the flag and value that would make them agree."""
    from transformers import GPT2Config

    defaults = GPT2Config().to_dict()  # what transformers assumes for a key the file leaves out

    def value(key):
        return hf.get(key, defaults.get(key))

    problems = [*_family_problems(value, model_config), *_shape_problems(value, model_config),
                *_activation_problems(value, model_config)]
    if value("vocab_size") != model_config.vocab_size:
        problems.append(f"pass the folder's tokenizer.json as --tokenizer-file: config.json vocab_size is "
                        f"{value('vocab_size')}, this run's tokenizer has {model_config.vocab_size} tokens")
    for key, supported in HF_ATTENTION_OPTIONS.items():
        if value(key) is not None and value(key) != supported:
            problems.append(f"config.json {key} is {value(key)!r}: our model supports only {supported!r}")
    if problems:
        raise ConfigError(f"{source} does not match this run's model: {_listing(problems)}")


def _family_problems(value: Callable[[str], object], model_config: ModelConfig) -> list[str]:
    """A GPT-2 folder on both sides: its model_type, and no Llama-shaped setting in this run."""
    problems = []
    if value("model_type") != "gpt2":
        problems.append(f"model_type is {value('model_type')!r}: only GPT-2 ('gpt2') and Llama ('llama') "
                        f"models load here")
    if is_llama_shaped(model_config):
        problems.append(f"this run has {', '.join(gpt2_misfits(model_config))}, which a GPT-2 folder lacks: drop them")
    return problems


def _shape_problems(value: Callable[[str], object], model_config: ModelConfig) -> list[str]:
    """The sizes every weight's shape follows from, and a sequence the position table covers."""
    n_embd = value("n_embd")
    ffn = value("n_inner") or (4 * n_embd if isinstance(n_embd, int) else None)  # GPT-2's n_inner None is 4 * n_embd
    ours = [("n_layer", value("n_layer"), model_config.num_layers, "--num-layers"),
            ("n_embd", n_embd, model_config.hidden_size, "--hidden-size"),
            ("n_head", value("n_head"), model_config.num_attention_heads, "--num-attention-heads"),
            ("n_inner", ffn, model_config.ffn_size, "--ffn-hidden-size"),
            ("n_positions", value("n_positions"), model_config.max_position_embeddings,
             "--max-position-embeddings"),
            ("layer_norm_epsilon", value("layer_norm_epsilon"), model_config.norms.layernorm_epsilon,
             "--layernorm-epsilon")]
    problems = [f"pass {flag} {theirs} (config.json {key}; this run has {mine})"
                for key, theirs, mine, flag in ours if theirs != mine]
    n_positions = value("n_positions")
    if isinstance(n_positions, int) and model_config.seq_length > n_positions:
        problems.append(f"pass --seq-length at most {n_positions} (config.json n_positions; this run has "
                        f"{model_config.seq_length})")
    return problems


def _activation_problems(value: Callable[[str], object], model_config: ModelConfig) -> list[str]:
    activation = value("activation_function")
    if activation not in ACTIVATION_FROM_HF:
        return [f"activation_function {activation!r} has no counterpart here "
                f"(supported: {', '.join(ACTIVATION_FROM_HF)})"]
    if ACTIVATION_FROM_HF[activation] != model_config.mlp.activation:
        return [f"pass --activation {ACTIVATION_FROM_HF[activation]} (config.json activation_function "
                f"{activation!r}; this run has {model_config.mlp.activation})"]
    return []


def _listing(problems: list[str]) -> str:
    shown = "; ".join(problems[:MAX_LISTED])
    return shown + (f"; ... and {len(problems) - MAX_LISTED} more" if len(problems) > MAX_LISTED else "")


def check_hf_tensors(hf_state: dict[str, torch.Tensor], model_config: ModelConfig, source: str | os.PathLike) -> None:
    """Every weight present with the shape config.json implies, none left over, and an lm_head (when
    the file has one) equal to the token embedding, since ours is tied to it."""
    check_tensors_fit(hf_state, hf_tensor_shapes(model_config), source, "transformer.wte.weight", tied=True)


def check_tensors_fit(hf_state: dict[str, torch.Tensor], expected: dict[str, tuple[int, ...]],
                      source: str | os.PathLike, embedding_name: str, tied: bool) -> None:
    """Every `expected` weight present with its shape, none left over; with `tied`, an lm_head (when the
    file has one) equal to the token embedding, since our output layer is then the embedding."""
    problems = [f"{name}: missing" for name in expected if name not in hf_state]
    problems += [f"{name}: shape {list(hf_state[name].shape)}, expected {list(shape)}"
                 for name, shape in expected.items() if name in hf_state and tuple(hf_state[name].shape) != shape]
    problems += [f"{name}: not a weight we have a place for" for name in hf_state
                 if name not in expected and not (tied and name == "lm_head.weight")]
    head, embedding = hf_state.get("lm_head.weight"), hf_state.get(embedding_name)
    if tied and head is not None and embedding is not None and not torch.equal(head, embedding):
        problems.append(f"lm_head.weight differs from {embedding_name}: our output layer is tied to the "
                        "token embedding")
    if problems:
        raise ConfigError(f"{source}: the weights do not fit this model ({len(problems)} problems): "
                          f"{_listing(problems)}")


def read_whole_folder(hf_dir: str | os.PathLike, model_config: ModelConfig, state: ParallelState,
                      held_experts: Optional[set[tuple[int, int]]] = None) -> dict[str, torch.Tensor]:
    """What checkpoint/hf/source.py cannot read by offset (its module docstring says which families), read whole
    but for the experts not in `held_experts`, checked against `model_config` and under our names."""
    hf_dir = Path(hf_dir)
    keep = expert_filter(held_experts)
    config, hf_state = read_hf_model(hf_dir, keep)
    hf = config.fields
    padded_vocab = model_config.padded_vocab_size(state.tensor_parallel_size)
    if config.family in family_weights():
        check_llama_hf_config(hf, model_config, hf_dir / CONFIG_FILE)
        moe_family = family_weights()[config.family]
        shapes = tensor_shapes(moe_family, model_config)
        check_tensors_fit(hf_state, shapes if keep is None else {n: s for n, s in shapes.items() if keep(n)}, hf_dir,
                          "model.embed_tokens.weight", tied=not model_config.output.untie_embeddings_and_output_weights)
        return shifted_gains(moe_family.from_hf(hf_state, model_config, padded_vocab), model_config, moe_family, -1)
    family = registered_family(config.family)
    if family is not None or config.family in llama_families():
        check_llama_hf_config(hf, model_config, hf_dir / CONFIG_FILE)
        shapes = hf_dense.tensor_shapes(model_config, family) if family is not None else \
            hf_llama.llama_tensor_shapes(model_config, config.family)
        check_tensors_fit(hf_state, shapes if keep is None else {n: s for n, s in shapes.items() if keep(n)}, hf_dir,
                          "model.embed_tokens.weight", tied=not model_config.output.untie_embeddings_and_output_weights)
        ours = hf_dense.from_hf(hf_state, model_config, padded_vocab, family) if family is not None else \
            hf_llama.from_llama_state_dict(hf_state, model_config, padded_vocab, config.family)
        return shifted_gains(ours, model_config, family, -1)
    check_hf_config(hf, model_config, hf_dir / CONFIG_FILE)
    check_hf_tensors(hf_state, model_config, hf_dir)
    return shifted_gains(from_hf_state_dict(hf_state, model_config, padded_vocab), model_config, None, -1)


def checkpoint_to_hf_state(iteration_dir: str | os.PathLike, progress: bool = False
                           ) -> tuple[ModelConfig, dict[str, torch.Tensor]]:
    """A checkpoint's model config and its weights under transformers' names, from the fp32 master
    (the exact weights, whatever precision trained them), consolidated over every TP and DP rank."""
    iteration_dir = Path(iteration_dir)
    metadata = read_metadata(iteration_dir)
    model_config = recorded_model(metadata["config"]["model"])
    check_convertible(model_config, "the Hugging Face export")  # before any weight is read
    # the routers' expert bias (checkpoint/router_state.py), saved by name in the metadata, checked as a resume does
    biases = metadata.get("expert_bias") or {}
    check_expert_biases(biases, configured_biased_routers(model_config), str(iteration_dir), required=False)
    master = consolidate(iteration_dir, ("master",), progress=progress)["master"]
    master.update({name: torch.tensor(values, dtype=torch.float32) for name, values in biases.items()})
    return model_config, to_hf_state_dict(master, model_config)
