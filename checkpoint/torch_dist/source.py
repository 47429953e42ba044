"""A Megatron-LM torch_dist checkpoint as a `GlobalStateSource`: our whole tensors by our names, read a region at a time
through DCP. It carries the weights, the optimizer in each of Megatron-Core's layouts, the progress and, at the saved TP
x PP layout only (Megatron-LM's rule), the CPU random states.
An MoE model's ChainedOptimizer keeps its dense and expert optimizers under `chained_0.` and `chained_1.`.
"""

from __future__ import annotations

import random
import re
from pathlib import Path
from typing import Optional

import numpy as np
import torch

from base.errors import CheckpointError, ConfigError
from checkpoint.global_state import (
    MODEL_KEY,
    GlobalStateSource,
    GlobalTensorInfo,
    SourceProgress,
    megatron_rows_multiple,
)
from checkpoint.pieces import Piece, read_pieces
from checkpoint.random_states import random_states_problem
from checkpoint.torch_dist.buckets import (
    BucketedParameter,
    Chunk,
    ModelShape,
    UnreadLayout,
    bucket_layout,
    buffer_dtypes,
    buffer_key,
    check_layout,
    local_expert_parameters,
    local_parameters,
)
from checkpoint.torch_dist.common import (
    FORMAT_NAME,
    arg,
    check_backend,
    load_common,
    safe_globals,
    saved_args,
    sharding_type,
)
from checkpoint.torch_dist.dcp_reader import DcpReader
from checkpoint.torch_dist.grad_scaler import GRAD_SCALER, STATIC, our_scaler_state
from checkpoint.torch_dist.names import (
    EXPERT_BIAS,
    LAYERS,
    MTP_LAYERS,
    MTP_TRANSFORMER,
    OUR_MTP_LAYERS,
    GdnHeads,
    Placement,
    hybrid_block,
    hybrid_layer_symbols,
    our_placements,
)
from checkpoint.torch_dist.null_tokenizer import saved_vocabulary
from gpt.hybrid_pattern import BLOCKS, GDN, parse_hybrid_pattern
from gpt.moe.settings import moe_layer_pattern

OPTIMIZER_STATE = "optimizer.state."
# Megatron-Core's ChainedOptimizer (a dense and an expert optimizer) puts `chained_<i>.` before each one's keys
OPTIMIZER_KEY = re.compile(r"(chained_\d+\.)?optimizer\.")
MOMENTS = ("exp_avg", "exp_avg_sq")
DP_RESHARDABLE = "dp_reshardable"


class MegatronSource(GlobalStateSource):
    """One Megatron-LM torch_dist iteration directory (module docstring)."""

    format_name = FORMAT_NAME
    saves_expert_bias = True

    def __init__(self, iteration_dir: Path) -> None:
        self.path = Path(iteration_dir)
        check_backend(self.path)
        self.common = load_common(self.path)
        self.reader = DcpReader(self.path)
        self.args = saved_args(self.common)
        self.layout = sharding_type(self.common)
        gated = gated_mlp(self.args)
        mla = bool(arg(self.common, "multi_latent_attention", False))
        self.hybrid_pattern = arg(self.common, "hybrid_layer_pattern")
        tensors = self.reader.tensors()
        # Our name -> where it lies: one tensor, or a Gated DeltaNet in_proj's or conv1d's parts.
        self._placements: dict[str, tuple[Placement, ...]] = {}
        gdn = GdnHeads.of(self.args) if hasattr(self.args, "linear_num_key_heads") else None
        self._expert_bias_keys = tuple(key for key in tensors if key.endswith(EXPERT_BIAS) and (
            key.startswith(LAYERS) or key.startswith(MTP_LAYERS) and self.hybrid_pattern is None))
        unknown = []
        for key, md in tensors.items():
            if OPTIMIZER_KEY.match(key) or key in self._expert_bias_keys:
                continue
            placements = our_placements(key, tuple(md.size), gated, mla, self.hybrid_pattern, gdn)
            if placements is None:
                unknown.append(key)
            for name, placement in (placements or {}).items():
                parts = self._placements.get(name, ()) if placement.stride else ()
                self._placements[name] = (*parts, placement)
        if unknown:
            raise CheckpointError(f"{self.path}: holds model tensors this project has no layer for ({len(unknown)}: "
                                  f"{', '.join(unknown[:3])}{', ...' if len(unknown) > 3 else ''}); it cannot be "
                                  f"continued here")
        self._dtypes = {key: md.properties.dtype for key, md in tensors.items()}
        model_dtype = next((self._dtypes[p[0].key] for p in self._placements.values()), torch.float32)
        # Where each state is read: an optimizer tensor prefix, the buckets, or the model.
        self._states: dict[str, str] = {}
        self._buckets: Optional[_Buckets] = None
        self._optimizer_not_read: Optional[str] = None
        # a ChainedOptimizer's dense optimizer (an MoE model's) saves its per-rank objects under chained_0.
        self._dense_prefix = "chained_0." if any(key.startswith("chained_0.optimizer.")
                                                 for key in self.reader.objects()) else ""
        if self.layout == DP_RESHARDABLE:
            try:
                self._buckets = _Buckets(self)
                self._states = {"master": "param", **{m: m for m in MOMENTS}}
            except UnreadLayout as unread:  # the weights still load (--no-load-optim); the reason is said
                self._optimizer_not_read = str(unread)
        else:
            for state in (*MOMENTS, "param", "fp32_param"):
                prefix = f"{OPTIMIZER_STATE}{state}."
                if any(key.startswith(prefix) for key in tensors):
                    self._states["master" if state in ("param", "fp32_param") else state] = prefix
        if "master" not in self._states:
            self._states["master" if model_dtype == torch.float32 else MODEL_KEY] = ""
        if not any(m in self._states for m in MOMENTS):
            self._states = {k: v for k, v in self._states.items() if k in ("master", MODEL_KEY)}

    @property
    def bytes_read(self) -> int:
        return self.reader.bytes_read

    def optimizer_not_read(self) -> Optional[str]:
        return self._optimizer_not_read

    def keys(self) -> tuple[str, ...]:
        return tuple(self._states)

    def tensors(self, key: str) -> dict[str, GlobalTensorInfo]:
        if key not in self._states:
            return {}
        if self._buckets is not None and key != MODEL_KEY:
            return {name: GlobalTensorInfo(p[0].shape, self._buckets.dtype) for name, p in self._placements.items()}
        prefix = self._states[key]
        return {name: GlobalTensorInfo(p[0].shape, self._dtypes.get(prefix + p[0].key, self._dtypes[p[0].key]),
                                       real_rows=self._real_rows, rows_multiple=megatron_rows_multiple(self.args))
                for name, p in self._placements.items()}

    @property
    def _real_rows(self) -> Optional[int]:
        """The saved vocabulary where the args size it (NullTokenizer's, as the writing release read --vocab-size)."""
        return saved_vocabulary(self.args)

    def read(self, key: str, name: str, region: tuple[slice, ...]) -> torch.Tensor:
        placements = self._placements.get(name)
        if placements is None:
            raise CheckpointError(f"{self.path}: holds no {name}")
        if self._buckets is not None and key != MODEL_KEY:
            return self._buckets.read(self._states[key], name, region)
        if len(placements) == 1 and not placements[0].stride:
            values = self.reader.read(self._states[key] + placements[0].key, placements[0].region(region))
            return values.reshape([part.stop - part.start for part in region])
        values = None  # a Gated DeltaNet part's rows, gathered from each part's tensor
        for placement in placements:
            for theirs, within in placement.pieces(region):
                piece = self.reader.read(self._states[key] + placement.key, theirs)
                if values is None:
                    values = piece.new_empty([part.stop - part.start for part in region])
                values[within] = piece.reshape(values[within].shape)
        return values if values is not None else torch.empty([part.stop - part.start for part in region])

    def progress(self) -> SourceProgress:
        common, args = self.common, self.args
        scheduler = common.get("opt_param_scheduler") or {}
        scaler = self._loss_scaler()
        return SourceProgress(
            iteration=int(common["iteration"]),
            consumed_samples=int(getattr(args, "consumed_train_samples", 0) or 0),
            schedule_samples=scheduler.get("num_steps"),
            optimizer_step=self._adam_step(), loss_scaler_state=scaler[1] if scaler else None,
            extra={"optimizer": getattr(args, "optimizer", "adam"),
                   "loss_scaler_type": scaler[0] if scaler else STATIC,
                   "tensor_parallel_size": getattr(args, "tensor_model_parallel_size", 1)})

    def _loss_scaler(self) -> Optional[tuple[str, dict]]:
        """(our scaler's class, its state) as the run left it; None where an fp16 save holds none."""
        if not arg(self.common, "fp16", False):
            return STATIC, {"scale": 1.0}  # bf16 and fp32 runs have no loss scaler in Megatron: a constant 1
        saved = self.common.get("optimizer") or {}
        if saved and all(isinstance(key, int) for key in saved):  # a ChainedOptimizer's parts step one scale
            saved = saved[min(saved)]
        if GRAD_SCALER in saved:
            scaler = saved[GRAD_SCALER]
        elif self.layout == DP_RESHARDABLE and _group_key(0, GRAD_SCALER, self._dense_prefix) in self.reader.objects():
            # dp_reshardable keeps it per TP x PP rank, all alike
            scaler = _group_object(self, 0, GRAD_SCALER, self._dense_prefix)
        else:
            return None
        dynamic = our_scaler_state(scaler, str(self.path))
        static = getattr(self.args, "loss_scale", None)
        return dynamic or ((STATIC, {"scale": float(static)}) if static else None)

    def expert_biases(self) -> Optional[dict[str, list]]:
        """Each router's expert bias under our router's name, each tensor's shape and values checked first."""
        found = {}
        symbols = hybrid_layer_symbols(self.hybrid_pattern) if self.hybrid_pattern is not None else None
        for key in self._expert_bias_keys:
            size = tuple(self.reader.tensors()[key].size)
            problem = self._expert_bias_shape_problem(key, size, symbols)
            if problem:
                raise CheckpointError(f"{self.path}: its {key} is {list(size)}; {problem}")
            values = self.reader.read(key, tuple(slice(0, n) for n in size)).to(torch.float32)
            bad = (~torch.isfinite(values)).nonzero()
            if len(bad):
                at = tuple(bad[0].tolist())
                raise CheckpointError(f"{self.path}: its {key} holds {values[at].item()} at {list(at)}: an expert "
                                      f"bias must be finite (it chooses the experts; the loss would not show the "
                                      f"damage)")
            if key.startswith(MTP_LAYERS):  # an MoE model's MTP layer's router: `mtp.layers.<k>.transformer_layer.`
                depth = key[len(MTP_LAYERS):].partition(".")[0]
                found[f"{OUR_MTP_LAYERS}{depth}.{MTP_TRANSFORMER}{EXPERT_BIAS}"] = values.tolist()
                continue
            layer = key[len(LAYERS):-len(EXPERT_BIAS)].rstrip(".")
            rows = {int(layer): values} if layer else dict(enumerate(values))
            if symbols is not None:  # HybridModel's layer of each MoE symbol: our block's number
                rows = {hybrid_block(symbols, number, EXPERT_BIAS): row for number, row in rows.items()}
            found.update({f"blocks.{number}.{EXPERT_BIAS}": row.tolist() for number, row in rows.items()})
        return found or None

    def _expert_bias_shape_problem(self, key: str, size: tuple[int, ...], symbols: Optional[str]) -> Optional[str]:
        """Why an expert-bias tensor of `size` does not fit the saved model ([num_experts] per layer, stacked unless
        per-layer keys); None where it fits."""
        experts = arg(self.common, "num_experts")
        layers = arg(self.common, "num_layers")
        experts_said = f"{experts} experts (num_experts)" if isinstance(experts, int) else None
        width = experts if isinstance(experts, int) else size[-1] if size else 0
        layer = key[len(LAYERS):-len(EXPERT_BIAS)].rstrip(".") if key.startswith(LAYERS) else None
        if layer == "":  # stacked over the decoder's layers
            if symbols is not None:
                return "HybridModel saves each layer's expert bias under its own key (decoder.layers.<layer>.)"
            if size != (layers, width):
                return (f"its args' {layers} layers (num_layers) x {experts_said or f'{width} experts'} make "
                        f"{[layers, width]}: one row of one value per expert for each layer")
            return None
        if size != (width,):
            return f"a router's bias holds one value per expert, {experts_said or f'{width} experts'}: {[width]}"
        if layer is not None:
            number = int(layer) if layer.isdigit() else -1
            if symbols is not None and hybrid_block(symbols, number, EXPERT_BIAS) is None:
                return f"layer {layer} is not an MoE layer of its args' pattern {self.hybrid_pattern!r}"
            if symbols is None and not 0 <= number < (layers or 0):
                return f"layer {layer} is not one of its args' {layers} layers (num_layers)"
        return None

    def not_carried(self) -> list[str]:
        missing = [f"its optimizer states ({self._optimizer_not_read})"] if self._optimizer_not_read else []
        if self._loss_scaler() is None:
            missing.append("its fp16 loss scale (the loss scaler starts from --initial-loss-scale)")
        if "rerun_state_machine" in self.common:
            missing.append("its rerun state machine's state")
        if "rng_state" in " ".join(self.reader.objects()):
            missing.append("its CUDA random states (Megatron-Core's cuda_rng_state and rng_tracker_states)")
        return missing

    def restore_random_states(self, rng, state, log=print) -> None:
        """Python's, NumPy's and torch's CPU generator, as Megatron-LM's load restores them."""
        saved = (int(getattr(self.args, "tensor_model_parallel_size", 1)),
                 int(getattr(self.args, "pipeline_model_parallel_size", 1)))
        if saved != (state.tensor_parallel_size, state.pipeline_parallel_size):
            if state.is_first_rank:
                log(f" note: {self.path} was saved at TP x PP {saved[0]} x {saved[1]}: its random states are not "
                    f"restored (as Megatron-LM ignores them at another layout); the random streams start from --seed",
                    flush=True)
            return
        pp_rank, tp_rank = state.pipeline_parallel_rank, state.tensor_parallel_rank
        key = f"rng_state/shard_{pp_rank}.{tp_rank}_{saved[1]}.{saved[0]}"
        if key not in self.reader.objects():
            if state.is_first_rank:
                log(f" note: {self.path} holds no random states (saved with --no-save-rng?); the random streams "
                    f"start from --seed", flush=True)
            return
        states = self.reader.read_objects([key], safe_globals())[key][0]  # a ShardedObject is saved as [its data]
        index = state.data_parallel_rank if arg(self.common, "data_parallel_random_init", False) else 0
        try:
            entry = states[index]
            kind, keys, position, has_gauss, cached = entry["np_rng_state"]
            version, python_words, gauss = entry["random_rng_state"]
            cpu_state = entry["torch_rng_state"]
        except (TypeError, KeyError, IndexError, ValueError) as error:
            raise CheckpointError(f"{self.path}: corrupt random states in {key} ({error})") from None
        problem = random_states_problem(
            {"numpy": [kind, position, has_gauss, cached], "python": [version, list(python_words), gauss]},
            {"numpy_keys": torch.from_numpy(np.asarray(keys, dtype=np.int64))})
        if problem or not isinstance(cpu_state, torch.Tensor) or cpu_state.dtype != torch.uint8:
            raise CheckpointError(f"{self.path}: corrupt random states in {key} ({problem or 'torch_rng_state'})")
        np.random.set_state((kind, np.asarray(keys, dtype=np.uint32), position, has_gauss, cached))
        random.setstate((version, tuple(python_words), gauss))
        torch.set_rng_state(cpu_state)
        if state.is_first_rank:
            log(f" note: {self.path}: Python's, NumPy's and torch's CPU random states restored; this run's "
                f"tensor-parallel dropout stream starts from --seed (Megatron-Core keeps it as a CUDA state)",
                flush=True)

    def _adam_step(self) -> Optional[int]:
        """Adam's step: state.common_step in the plain optimizer, the param groups in the distributed one; a
        ChainedOptimizer's parts step together."""
        saved = self.common.get("optimizer") or {}
        if saved and all(isinstance(key, int) for key in saved):  # a ChainedOptimizer's (dense, then experts'): one step
            steps = {self._step_of(part, f"chained_{index}.") for index, part in saved.items()}
            return steps.pop() if len(steps) == 1 else None
        return self._step_of(saved)

    def _step_of(self, saved: dict, prefix: str = "") -> Optional[int]:
        # A 16-bit run's plain optimizer keeps Adam's state one level down.
        inner = saved.get("optimizer") or {}
        common_step = (saved.get("state") or inner.get("state") or {}).get("common_step")
        if common_step is not None:
            return int(common_step)
        groups = inner.get("param_groups") or saved.get("param_groups")
        if not groups and self._buckets is not None:
            # its DistributedOptimizer's 'optimizer' (a ChainedOptimizer's i-th under `prefix`, chained_<i>.)
            groups = self._buckets.optimizer_state(0, prefix).get("param_groups")
        steps = {int(group["step"]) for group in groups or [] if group.get("step") is not None}
        return steps.pop() if len(steps) == 1 else None


def _group_key(group: int, name: str, prefix: str = "") -> str:
    """A dp_reshardable save's object per TP x PP rank; `prefix` is `chained_<i>.` under a ChainedOptimizer."""
    return f"{prefix}optimizer.distributed.dp_group_idx_{group}.{name}/shard_0_1"


def _group_object(source: MegatronSource, group: int, name: str, prefix: str = ""):
    key = _group_key(group, name, prefix)
    if key not in source.reader.objects():
        raise CheckpointError(f"{source.path}: holds no {key}; the checkpoint is incomplete")
    saved = source.reader.read_objects([key], safe_globals())[key]
    return saved[0] if isinstance(saved, list) and len(saved) == 1 else saved  # a ShardedObject: [its data]


def _refuse_unread(args) -> None:
    """The saves whose buckets this reader does not rebuild (their weights still load)."""
    unsupported = [flag for flag, value in (
        # the routed experts are rebuilt as SequentialMLP's; GroupedMLP's weight1/weight2 and a shared expert are not
        ("--moe-grouped-gemm", getattr(args, "moe_grouped_gemm", False)),
        ("--moe-shared-expert-intermediate-size", getattr(args, "moe_shared_expert_intermediate_size", None)),
        ("--num-experts with --num-layers-per-virtual-pipeline-stage", getattr(args, "num_experts", None) and
         getattr(args, "virtual_pipeline_model_parallel_size", None)),
        ("--multi-latent-attention", getattr(args, "multi_latent_attention", False)),
        # Gated DeltaNet's local in_proj and conv1d are [q|k|v|...] per rank, not our per-head rows.
        ("--experimental-attention-variant", getattr(args, "experimental_attention_variant", None)),
        ("--mtp-num-layers", getattr(args, "mtp_num_layers", None)),
        ("--decoder-first-pipeline-num-layers", getattr(args, "decoder_first_pipeline_num_layers", None)),
        ("--decoder-last-pipeline-num-layers", getattr(args, "decoder_last_pipeline_num_layers", None)),
        # HybridModel's buckets are rebuilt only for one stage of dense GPT blocks.
        ("--hybrid-layer-pattern", _unbucketed_pattern(getattr(args, "hybrid_layer_pattern", None))))
        if value]
    if unsupported:
        raise UnreadLayout(f"its distributed optimizer's dp_reshardable buckets are read here for models of plain "
                           f"attention on even pipeline stages, their experts SequentialMLP's without a shared "
                           f"expert, without MTP layers, and it was saved with {', '.join(unsupported)}")


def _unbucketed_pattern(text: Optional[str]) -> Optional[str]:
    """A HybridModel pattern whose buckets are not rebuilt here (_refuse_unread), or None."""
    if not text:
        return None
    try:
        pattern = parse_hybrid_pattern(text)
    except ConfigError:
        return text
    plain = all(block in BLOCKS and GDN not in block for block in pattern.blocks)
    staged_or_moe = len(pattern.segments) > 1 or pattern.mtp_depth or any(pattern.moe_layers())
    return text if staged_or_moe or not plain else None


def gated_mlp(args) -> bool:
    """Whether linear_fc1 holds [gate; up] (Megatron-Core's gated_linear_unit): --swiglu's and --quick-geglu's."""
    return bool(getattr(args, "swiglu", False) or getattr(args, "quick_geglu", False))


def _model_shape(args) -> ModelShape:
    pattern = getattr(args, "hybrid_layer_pattern", None)  # HybridModel's num_layers counts a layer per symbol
    return ModelShape(
        num_layers=parse_hybrid_pattern(pattern).num_layers if pattern else args.num_layers, hidden_size=args.hidden_size, ffn_hidden_size=args.ffn_hidden_size,
        num_attention_heads=args.num_attention_heads, num_query_groups=args.num_query_groups
        if getattr(args, "group_query_attention", False) else args.num_attention_heads,
        kv_channels=args.kv_channels, padded_vocab_size=args.padded_vocab_size,
        max_position_embeddings=args.max_position_embeddings,
        learned_positions=getattr(args, "position_embedding_type", "learned_absolute") == "learned_absolute",
        layernorm=getattr(args, "normalization", "LayerNorm") == "LayerNorm", gated=gated_mlp(args),
        add_bias_linear=bool(args.add_bias_linear), add_qkv_bias=bool(getattr(args, "add_qkv_bias", False)),
        qk_layernorm=bool(getattr(args, "qk_layernorm", False)),
        tied=not getattr(args, "untie_embeddings_and_output_weights", False), **_moe_shape(args))


def _moe_shape(args) -> dict:
    """An MoE model's experts and which layers hold them (--moe-layer-freq as Megatron-LM reads it)."""
    experts = getattr(args, "num_experts", None)
    if not experts:
        return {}
    return {"num_experts": int(experts), "moe_ffn_hidden_size": int(getattr(args, "moe_ffn_hidden_size", None)
                                                                    or args.ffn_hidden_size),
            "moe_layers": moe_layer_pattern(str(getattr(args, "moe_layer_freq", 1)), int(args.num_layers))}


class _Buckets:
    """The dp_reshardable states of every TP x PP rank as pieces of our whole tensors; an MoE model's expert
    optimizer (`chained_1.`) per expert TP x EP x PP rank over the expert data-parallel group."""

    def __init__(self, source: MegatronSource) -> None:
        self.source, self.path = source, source.path
        args = source.args
        _refuse_unread(args)
        self.shape = _model_shape(args)
        tp = int(getattr(args, "tensor_model_parallel_size", 1))
        pp = int(getattr(args, "pipeline_model_parallel_size", 1))
        vp = int(getattr(args, "virtual_pipeline_model_parallel_size", None) or 1)
        dp = int(getattr(args, "data_parallel_size", 1)) * int(getattr(args, "context_parallel_size", 1) or 1)
        # DDP buckets only the first chunk of the first stage, and only with overlap.
        self.bucketed = bool(getattr(args, "overlap_grad_reduce", False)) and \
            not getattr(args, "overlap_param_gather_with_optimizer_step", False)
        self.bucket_size = getattr(args, "ddp_bucket_size", None) or max(40000000, 1000000 * dp)
        self.dtype = torch.float32  # the fp32 master and moments, whatever the model's dtype
        self.dtypes = buffer_dtypes(args)
        self.pieces: dict[str, list[Piece]] = {}
        self._seen: set[tuple] = set()
        self.prefixes = ("chained_0.", "chained_1.") if self.shape.num_experts else ("",)
        for pp_rank in range(pp):
            for tp_rank in range(tp):
                self._optimizer(self.prefixes[0], pp_rank * tp + tp_rank, dp, vp, lambda chunk: local_parameters(
                    self.shape, chunk), tp_rank, tp, pp_rank, pp, f"TP rank {tp_rank}, PP rank {pp_rank}")
        if not self.shape.num_experts:
            return
        ep = int(getattr(args, "expert_model_parallel_size", 1) or 1)
        etp = int(getattr(args, "expert_tensor_parallel_size", None) or tp)
        expert_dp = tp * pp * dp // (etp * ep * pp)
        for pp_rank in range(pp):
            for ep_rank in range(ep):
                for etp_rank in range(etp):  # the rank in Megatron-Core's tp-ep-pp group: its dp_group_idx
                    self._optimizer(self.prefixes[1], (pp_rank * ep + ep_rank) * etp + etp_rank, expert_dp, vp,
                                    lambda chunk, ep_rank=ep_rank: local_expert_parameters(self.shape, chunk, ep_rank,
                                                                                           ep),
                                    etp_rank, etp, pp_rank, pp, f"the experts of expert TP rank {etp_rank}, EP rank "
                                    f"{ep_rank}, PP rank {pp_rank}")

    def _optimizer(self, prefix: str, group: int, dp: int, vp: int, parameters, tp_rank: int, tp: int, pp_rank: int,
                   pp: int, where: str) -> None:
        """One DistributedOptimizer's buckets of one model-parallel rank (`group`, its dp_group_idx): a gradient
        buffer per virtual chunk, each rebuilt from `parameters(chunk)` over `dp` data-parallel ranks and checked
        against the sizes it recorded."""
        saved = self._object(group, "per_bucket_numel_unpadded", prefix)
        for vp_stage in range(vp):
            chunk = Chunk(tp_rank, tp, pp_rank, pp, vp_stage, vp)
            placed, unpadded = bucket_layout(parameters(chunk), dp,
                                             self.bucket_size if self.bucketed and chunk.first else None)
            check_layout(unpadded, saved, vp_stage, vp, self.dtypes,
                         f"{self.path} ({where}{f', virtual chunk {vp_stage}' if vp > 1 else ''})")
            self._add(placed, f"{prefix}optimizer.distributed.dp_group_idx_{group}.gbuf_idx_{vp_stage}."
                              f"{buffer_key(self.dtypes)}")

    def _add(self, placed: list[BucketedParameter], buffer: str) -> None:
        """The pieces of our tensors in one gradient buffer's buckets (`buffer`: their keys' stem)."""
        for entry in placed:
            row = int(np.prod(entry.parameter.shape[1:], dtype=np.int64))
            file = f"{buffer}.bucket_idx_{entry.bucket}"  # the bucket's key, less the state's name
            for piece in entry.parameter.pieces:
                copy = (piece.name, piece.global_offset, piece.shape)
                if copy in self._seen:  # a replicated parameter: every TP rank's bucket holds it
                    continue
                self._seen.add(copy)
                self.pieces.setdefault(piece.name, []).append(Piece(
                    file, 0, entry.start + piece.row_start * row,
                    int(np.prod(piece.shape, dtype=np.int64)), piece.shape, piece.global_offset))

    def _object(self, group: int, name: str, prefix: Optional[str] = None):
        return _group_object(self.source, group, name, self.prefixes[0] if prefix is None else prefix)

    def optimizer_state(self, group: int, prefix: Optional[str] = None) -> dict:
        state = self._object(group, "optimizer", prefix)
        return state if isinstance(state, dict) else {}

    def read(self, state: str, name: str, region: tuple[slice, ...]) -> torch.Tensor:
        def fetch(file: str, begin: int, end: int) -> torch.Tensor:
            return self.source.reader.read(f"{file}.{state}", (slice(begin, end),))
        return read_pieces(self.pieces.get(name, []), name, region, self.dtype, fetch, self.path)
