"""The model's shape read from a one-block meta-device GPTModel (milliseconds at any size): parameter counts, each
forward matmul, and the activations a block saves, so metrics, memory prediction and the planner follow every model
option."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Optional, Union

from torch import nn

from base.options import replace_settings
from gpt.attention import SelfAttention
from gpt.gated_delta_net import CHUNK_SIZE as GDN_CHUNK_SIZE
from gpt.gated_delta_net import GatedDeltaNet
from gpt.glu import GatedActivation
from gpt.hybrid_pattern import ATTENTION, MLA, parse_hybrid_pattern
from gpt.hybrid_pattern import MLP as MLP_SYMBOL
from gpt.layer_spec import LayerSpec, mixer_symbols
from gpt.mamba import MambaMixer
from gpt.mamba_settings import MambaSettings
from gpt.mla import MLASelfAttention, ReplicatedLinear
from gpt.mlp import MLP, SwiGLUMLP
from gpt.model import GPTModel, TransformerBlock
from gpt.model_config import ModelConfig
from gpt.norms import RMSNorm
from gpt.parallel_plan import tensor_parallel_plan
from gpt.rotary import RotaryCache
from gpt.xielu import XIELU, XIELU_SAVED_BYTES
from parallel.config import ParallelismConfig
from parallel.layers import ColumnParallelLinear, RowParallelLinear, VocabParallelEmbedding
from parallel.sharding import record_of
from parallel.state import virtual_state
from zero.memory import LayerActivationTerms


@dataclass(frozen=True)
class LinearShape:
    """One linear on one TP rank: each token's `in_features` row times an [in, out] weight."""
    name: str
    in_features: int
    out_features: int


@dataclass(frozen=True)
class AttentionShape:
    """Attention's scores q k^T and context p v on one TP rank, per head."""
    heads: int
    head_dim: int
    value_head_dim: Optional[int] = None

    @property
    def flops_per_key(self) -> int:
        return 2 * self.heads * (self.head_dim + (self.value_head_dim or self.head_dim))


@dataclass(frozen=True)
class ScanShape:
    """A recurrent mixer's conv and chunked-scan matmuls on one TP rank (elementwise work uncounted, as
    FlopCounterMode); `backward_bytes_per_token`: the fp32 temporaries its backward holds."""
    conv_channels: int
    conv_width: int
    chunk: int
    chunk_flops_per_token: int
    backward_bytes_per_token: int = 0

    def flops_per_token(self, seq_length: int) -> int:
        padded = -(-seq_length // self.chunk) * self.chunk
        conv = 2 * self.conv_channels * self.conv_width * (seq_length + self.conv_width - 1)
        return (conv + self.chunk_flops_per_token * padded) // seq_length


BlockMatmul = Union[LinearShape, AttentionShape, ScanShape]


def forward_flops(matmul: BlockMatmul, seq_length: int) -> int:
    if isinstance(matmul, LinearShape):
        return 2 * matmul.in_features * matmul.out_features
    if isinstance(matmul, ScanShape):
        return matmul.flops_per_token(seq_length)
    return matmul.flops_per_key * seq_length


@dataclass(frozen=True)
class MixerDifference:
    """A layer whose mixer differs from the probe block's: what it holds and computes beyond the probe (negative where
    smaller)."""
    symbol: Optional[str]
    parameters: int
    linear_flops: int
    attention: Optional[AttentionShape]
    block_matmuls: tuple[BlockMatmul, ...]
    scan: Optional[ScanShape] = None


@dataclass(frozen=True)
class ModelShape:
    tensor_parallel_size: int
    num_layers: int
    seq_length: int
    hidden_size: int
    parameters_per_block: int
    parameters_outside_blocks: int
    parameters_per_vocabulary_row: int
    block_matmuls: tuple[BlockMatmul, ...]
    output_in_features: int  # [tokens, in] x [in, padded vocabulary / TP]
    activations: LayerActivationTerms
    # Activation-gradient features per token the dense MLP's backward holds at once, one TP rank's.
    mlp_gradient_features: int = 0
    # MoE: the layers, one block's parameters (all experts) and active ones, and its forward FLOPs per token as Megatron
    # counts them.
    moe_layers: int = 0
    parameters_per_moe_block: int = 0
    active_parameters_per_moe_block: int = 0
    moe_block_linear_flops: int = 0
    # as mlp_gradient_features, for an MoE block's experts and its widest every-token MLP
    moe_expert_gradient_features: int = 0
    moe_shared_gradient_features: int = 0
    # PR-MoE: what the MoE blocks hold fewer than moe_layers of the largest
    moe_parameters_below_largest: int = 0
    moe_active_parameters_below_largest: int = 0
    # MTP: each layer a block of the last layer's kind plus enorm, hnorm and eh_proj
    mtp_layers: int = 0
    mtp_layers_are_moe: bool = False
    parameters_per_mtp_extra: int = 0
    layer_mixers: tuple[Optional[str], ...] = ()
    other_mixers: tuple[MixerDifference, ...] = ()
    # a pattern's mixer-only blocks and what each lacks
    layers_without_mlp: int = 0
    without_mlp: Optional[MixerDifference] = None
    # the most a mixer-only `M` or `G` block's backward holds, per token on one TP rank
    mixer_only_gradient_bytes: int = 0

    def other_mixer_layers(self) -> list[MixerDifference]:
        others = {mixer.symbol: mixer for mixer in self.other_mixers}
        return [others[symbol] for symbol in self.layer_mixers if symbol in others]

    def layer_flops_per_key(self) -> tuple[int, ...]:
        probe = sum(matmul.flops_per_key for matmul in self.block_matmuls if isinstance(matmul, AttentionShape))
        others = {mixer.symbol: mixer.attention.flops_per_key if mixer.attention else 0 for mixer in self.other_mixers}
        per_layer = [others.get(symbol, probe) for symbol in self.layer_mixers] or \
            [probe] * (self.num_layers + self.mtp_layers)
        return tuple(flops * self.tensor_parallel_size for flops in per_layer)

    def blocks_differing_parameters(self) -> int:
        return sum(mixer.parameters for mixer in self.other_mixer_layers()) + \
            (self.layers_without_mlp * self.without_mlp.parameters if self.without_mlp else 0)

    @property
    def dense_layers(self) -> int:
        return self.num_layers - self.moe_layers + (0 if self.mtp_layers_are_moe else self.mtp_layers)

    @property
    def moe_blocks(self) -> int:
        return self.moe_layers + (self.mtp_layers if self.mtp_layers_are_moe else 0)

    def parameter_count(self, padded_vocab_size: int) -> int:
        return (padded_vocab_size * self.parameters_per_vocabulary_row + self.parameters_outside_blocks
                + self.dense_layers * self.parameters_per_block + self.moe_blocks * self.parameters_per_moe_block
                - self.moe_parameters_below_largest + self.mtp_layers * self.parameters_per_mtp_extra
                + self.blocks_differing_parameters())

    def active_parameter_count(self, padded_vocab_size: int) -> int:
        return (padded_vocab_size * self.parameters_per_vocabulary_row + self.parameters_outside_blocks
                + self.dense_layers * self.parameters_per_block
                + self.moe_blocks * self.active_parameters_per_moe_block - self.moe_active_parameters_below_largest
                + self.mtp_layers * self.parameters_per_mtp_extra + self.blocks_differing_parameters())

    def blocks_forward_flops_per_token(self) -> int:
        attention = sum(matmul.flops_per_key * self.seq_length for matmul in self.block_matmuls
                        if isinstance(matmul, AttentionShape)) * self.tensor_parallel_size
        mixed_attention = sum(self.layer_flops_per_key()) * self.seq_length - (self.num_layers + self.mtp_layers) * attention
        return (self.dense_layers * self.block_forward_flops_per_token()
                + self.moe_blocks * (self.moe_block_linear_flops + attention)
                + self.mtp_layers * 2 * 2 * self.hidden_size * self.hidden_size  # each MTP layer's eh_proj
                + sum(mixer.linear_flops + self.scan_flops_per_token(mixer) for mixer in self.other_mixer_layers())
                + (self.layers_without_mlp * self.without_mlp.linear_flops if self.without_mlp else 0)
                + mixed_attention)

    def scan_flops_per_token(self, mixer: MixerDifference) -> int:
        return mixer.scan.flops_per_token(self.seq_length) * self.tensor_parallel_size if mixer.scan else 0

    def output_matmul(self, padded_vocab_size: int) -> LinearShape:
        return LinearShape("output", self.output_in_features, padded_vocab_size // self.tensor_parallel_size)

    def block_forward_flops_per_token(self) -> int:
        """One block's forward matmul FLOPs per token, every TP rank's: 2 per multiply-add, attention over the whole s x
        s square, as Megatron counts."""
        return sum(forward_flops(matmul, self.seq_length) for matmul in self.block_matmuls) * self.tensor_parallel_size

    def logits_forward_flops_per_token(self, padded_vocab_size: int) -> int:
        output = self.output_matmul(padded_vocab_size)
        return 2 * output.in_features * output.out_features * self.tensor_parallel_size * (1 + self.mtp_layers)


# One shape per (model options, TP size): num_layers, seq_length and vocabulary only scale it.
_BUILT: dict[tuple, ModelShape] = {}
_MOE_BLOCKS: dict[tuple, dict] = {}
_OTHER_MIXERS: dict[tuple, tuple[MixerDifference, ...]] = {}
_SCALING_FIELDS = ("num_layers", "seq_length", "vocab_size", "pad_vocab_size_to", "make_vocab_size_divisible_by")
_SHAPING_FIELDS = tuple(field.name for field in dataclasses.fields(ModelConfig) if field.name not in _SCALING_FIELDS)


def model_shape(config: ModelConfig, tensor_parallel_size: int = 1, sequence_parallel: bool = False) -> ModelShape:
    """The shape of `GPTModel(config)` at `tensor_parallel_size`, read from a one-block meta model."""
    key = (tuple(getattr(config, name) for name in _SHAPING_FIELDS), tensor_parallel_size, sequence_parallel)
    if key not in _BUILT:
        # a per-layer window list: the probe's one block takes the first's (windows shape no parameter)
        probe = config.with_layers(1, vocab_size=tensor_parallel_size, pad_vocab_size_to=tensor_parallel_size,
                                   num_experts=None, mtp_num_layers=0)
        state = virtual_state(tensor_parallel_size, tensor_parallel_size)
        plan = tensor_parallel_plan(state, ParallelismConfig(tensor_model_parallel_size=tensor_parallel_size,
                                                             sequence_parallel=sequence_parallel))
        probe_model = GPTModel(probe, state, plan=plan)
        shape = _read_shape(probe_model, tensor_parallel_size)
        if config.mtp.num_layers:  # one MTP layer's norms and eh_proj beyond its block
            with_mtp = _read_shape(GPTModel(replace_settings(probe, mtp_num_layers=1), state, plan=plan),
                                   tensor_parallel_size)
            shape = dataclasses.replace(shape, parameters_per_mtp_extra=with_mtp.parameters_outside_blocks
                                        - shape.parameters_outside_blocks - shape.parameters_per_block)
        blocks = {}
        # an MoE layer under TP runs on the sequence-parallel slices; each expert split over TP (expert TP = TP)
        moe_plan = plan if tensor_parallel_size == 1 else tensor_parallel_plan(state, ParallelismConfig(
            tensor_model_parallel_size=tensor_parallel_size, sequence_parallel=True))
        for count in (config.experts.distinct_counts(config.num_layers) if config.moe is not None else ()):
            moe_probe = GPTModel(replace_settings(probe, num_experts=count, moe_layer_freq=1,
                                                     expert_interval=1), state, plan=moe_plan)
            block = _moe_block(moe_probe.blocks[0], config.moe.router_topk, tensor_parallel_size)
            blocks[count] = (block["parameters_per_moe_block"], block["active_parameters_per_moe_block"])
            if count == config.moe.num_experts:
                shape = dataclasses.replace(shape, **block)
        if config.hybrid_layer_pattern is not None:
            shape = dataclasses.replace(shape, without_mlp=_without_mlp(probe_model.blocks[0], tensor_parallel_size),
                                        layers_without_mlp=parse_hybrid_pattern(config.hybrid_layer_pattern).mlps()
                                        .count(None))
        _BUILT[key], _MOE_BLOCKS[key] = shape, blocks
        _OTHER_MIXERS[key] = tuple(_mixer_difference(symbol, probe, shape, state, plan, tensor_parallel_size)
                                   for symbol in sorted(set(mixer_symbols(config)) - {probe_mixer(config)}, key=str))
    moe_layers = sum(config.moe_layers())
    below = [0, 0]
    if config.experts.per_layer:
        largest = _MOE_BLOCKS[key][config.moe.num_experts]
        for count, is_moe in zip(config.experts_per_layer(), config.moe_layers()):
            if is_moe:
                below = [below[i] + largest[i] - _MOE_BLOCKS[key][count][i] for i in (0, 1)]
    return dataclasses.replace(_BUILT[key], num_layers=config.num_layers, seq_length=config.seq_length,
                               mixer_only_gradient_bytes=_mixer_only_gradient_bytes(config, _OTHER_MIXERS[key]),
                               moe_layers=moe_layers, mtp_layers=config.mtp.num_layers,
                               mtp_layers_are_moe=config.moe_layers()[-1], moe_parameters_below_largest=below[0],
                               moe_active_parameters_below_largest=below[1], other_mixers=_OTHER_MIXERS[key],
                               layer_mixers=_layer_mixers(config) if _OTHER_MIXERS[key] else ())


def probe_mixer(config: ModelConfig) -> str:
    return MLA if config.mla.multi_latent_attention else ATTENTION


def _layer_mixers(config: ModelConfig) -> tuple[str, ...]:
    mixers = mixer_symbols(config)
    return mixers + mixers[-1:] * config.mtp.num_layers


def _mixer_difference(symbol: str, probe: ModelConfig, shape: ModelShape, state, plan,
                      tensor_parallel_size: int) -> MixerDifference:
    """A one-block probe with `symbol`'s mixer, read against the probe block's `shape`."""
    if symbol in (ATTENTION, MLA):
        other = _read_shape(GPTModel(replace_settings(probe, multi_latent_attention=symbol == MLA), state, plan=plan),
                            tensor_parallel_size)
        parameters, matmuls = other.parameters_per_block, other.block_matmuls
    else:
        block = TransformerBlock(probe, plan, None, spec=LayerSpec(symbol, MLP_SYMBOL), rotary_cache=RotaryCache())
        parameters, matmuls = _parameters(block), _block_matmuls(block)
    return MixerDifference(symbol, parameters - shape.parameters_per_block,
                           _linear_flops(matmuls, tensor_parallel_size)
                           - _linear_flops(shape.block_matmuls, tensor_parallel_size),
                           next((m for m in matmuls if isinstance(m, AttentionShape)), None), matmuls,
                           next((m for m in matmuls if isinstance(m, ScanShape)), None))


def _mixer_only_gradient_bytes(config: ModelConfig, others: tuple[MixerDifference, ...]) -> int:
    if config.hybrid_layer_pattern is None:
        return 0
    pattern = parse_hybrid_pattern(config.hybrid_layer_pattern)
    alone = {mixer for mixer, mlp in zip(pattern.mixers(), pattern.mlps()) if mlp is None}
    return max([0, *(m.scan.backward_bytes_per_token for m in others if m.symbol in alone and m.scan)])


def _without_mlp(block: nn.Module, tensor_parallel_size: int) -> MixerDifference:
    half = [module for module in (block.post_attention_layernorm, block.mlp, block.mlp_output_layernorm)
            if module is not None]
    matmuls = tuple(matmul for module in half for matmul in _block_matmuls(module))
    return MixerDifference("", -sum(_parameters(module) for module in half),
                           -_linear_flops(matmuls, tensor_parallel_size), None, matmuls)


def _linear_flops(matmuls, tensor_parallel_size: int) -> int:
    return sum(2 * m.in_features * m.out_features for m in matmuls if isinstance(m, LinearShape)) * tensor_parallel_size


def _moe_block(block: nn.Module, topk: int, tensor_parallel_size: int) -> dict:
    moe = block.mlp
    experts = list(moe.experts.children())
    per_expert = _parameters(experts[0])
    total = _parameters(block)

    def weight_flops(module: nn.Module) -> int:
        return sum(2 * math.prod(record_of(parameter).global_shape)
                   for name, parameter in module.named_parameters() if name.endswith("weight") and name != "gate_weight")

    flops = sum(2 * matmul.in_features * matmul.out_features for matmul in _block_matmuls(block)
                if isinstance(matmul, LinearShape)) * tensor_parallel_size
    flops += topk * weight_flops(experts[0])
    if moe.shared_experts is not None:
        flops += weight_flops(moe.shared_experts)
    if moe.residual_mlp is not None:  # PR-MoE's dense MLP sees every token
        flops += weight_flops(moe.residual_mlp)
    every_token = [mlp for mlp in (moe.shared_experts, moe.residual_mlp) if mlp is not None]
    return dict(parameters_per_moe_block=total, active_parameters_per_moe_block=total - (len(experts) - topk) * per_expert,
                moe_block_linear_flops=flops, moe_expert_gradient_features=_input_features(experts[0], moe.experts.glu),
                moe_shared_gradient_features=max((_input_features(mlp, mlp.glu) for mlp in every_token), default=0))


def _input_features(mlp: nn.Module, glu: GatedActivation) -> int:
    """An MLP's activation-gradient features per row on one TP rank."""
    if hasattr(mlp, "dense_h_to_4h_gate"):
        return glu.backward_widths() * mlp.dense_h_to_4h_gate.weight.shape[0]
    return mlp.dense_h_to_4h.weight.shape[0]


def _read_shape(model: GPTModel, tensor_parallel_size: int) -> ModelShape:
    (block,) = model.blocks
    block_parameters = _parameters(block)
    vocabulary = [module for module in model.modules() if isinstance(module, VocabParallelEmbedding)]
    if model.output_layer is not None:
        vocabulary.append(model.output_layer)
    per_row = sum(_parameters(module) for module in vocabulary) // tensor_parallel_size
    outside = (_parameters(model) - block_parameters
               - sum(_parameters(module) for module in vocabulary))
    return ModelShape(tensor_parallel_size=tensor_parallel_size, num_layers=1, seq_length=1,
                      hidden_size=model.config.hidden_size, parameters_per_block=block_parameters,
                      parameters_outside_blocks=outside, parameters_per_vocabulary_row=per_row,
                      block_matmuls=_block_matmuls(block),
                      # the output layer's weight (the token embedding's when tied), [padded / TP, in]
                      output_in_features=model.word_embeddings.weight.shape[1],
                      activations=_activation_terms(block, tensor_parallel_size),
                      mlp_gradient_features=_mlp_gradient_features(block))


def _mlp_gradient_features(block: nn.Module) -> int:
    """The dense MLP's activation gradients alive at once in its backward, per token on one TP rank (a CPU profile: one
    ffn-wide for GPT-2, three gated)."""
    mlp = block.mlp
    if isinstance(mlp, SwiGLUMLP):
        return _input_features(mlp, mlp.glu)
    if isinstance(mlp, MLP):
        return mlp.dense_h_to_4h.weight.shape[0]
    return 0


def _parameters(module: nn.Module) -> int:
    return sum(math.prod(record_of(parameter).global_shape) for parameter in module.parameters())


def _block_matmuls(block: nn.Module) -> tuple[BlockMatmul, ...]:
    matmuls: list[BlockMatmul] = []
    attention_before_output = None
    for name, module in block.named_modules():
        if isinstance(module, MambaMixer):  # in_proj's parts are one GEMM; conv and scan before out_proj
            parts = [getattr(module.in_proj, f"{part}_weight") for part in module.in_proj.parts]
            matmuls.append(LinearShape(f"{name}.in_proj", parts[0].shape[1], sum(part.shape[0] for part in parts)))
            attention_before_output = _mamba_scan(module)
        elif isinstance(module, GatedDeltaNet):
            attention_before_output = _delta_rule_scan(module)
        elif isinstance(module, SelfAttention):
            # scores and context run between the projections and the first row-parallel linear
            attention_before_output = AttentionShape(module.layout.heads_per_rank, module.layout.head_dim)
        elif isinstance(module, MLASelfAttention):
            attention_before_output = AttentionShape(module.heads_per_rank, module.q_head_dim,
                                                     module.config.mla.v_head_dim)
        elif isinstance(module, (ColumnParallelLinear, RowParallelLinear, ReplicatedLinear)):
            if isinstance(module, RowParallelLinear) and attention_before_output is not None:
                matmuls.append(attention_before_output)
                attention_before_output = None
            out_features, in_features = module.weight.shape
            matmuls.append(LinearShape(name, in_features, out_features))
    return tuple(matmuls)


def _mamba_scan(mixer: MambaMixer) -> ScanShape:
    """gpt/mamba_scan.py's matmuls per token and head, and its backward's measured peak."""
    heads, head_dim, state, chunk = mixer.heads, mixer.head_dim, mixer.state_size, MambaSettings.CHUNK_SIZE
    return ScanShape(mixer.inner + 2 * mixer.groups * state, MambaSettings.CONV_WIDTH, chunk,
                     2 * heads * (chunk * (state + head_dim) + 2 * head_dim * state),
                     4 * max(3 * mixer.inner, chunk * heads))


def _delta_rule_scan(mixer: GatedDeltaNet) -> ScanShape:
    """gpt/gated_delta_net.py's matmuls per token and value head; its backward holds 1.75 fp32 [chunk x value heads] per
    token (measured)."""
    dk, dv, chunk = mixer.key_head_dim, mixer.value_head_dim, GDN_CHUNK_SIZE
    heads = mixer.local_key_heads * mixer.group
    channels, _, width = mixer.conv1d.weight.shape
    return ScanShape(channels, width, chunk, heads * (4 * chunk * dk + 2 * chunk * dv + 6 * dk * dv), 7 * chunk * heads)


def _activation_terms(block: nn.Module, tensor_parallel_size: int) -> LayerActivationTerms:
    """What each module keeps for backward in 16-bit, as Korthikanti et al. 2022 (4.1) count it, split into what every
    TP rank holds whole and what is split; sequence parallelism moves norm inputs and dropout masks into the split
    part."""
    replicated = partitioned = heads = 0
    for module in block.modules():
        if isinstance(module, (nn.LayerNorm, RMSNorm)):
            # LayerNorm and a recomputed RMSNorm keep the input; an RMSNorm otherwise its fp32 rsqrt too
            rsqrt_kept = isinstance(module, RMSNorm) and not module.recompute
            input_bytes = 2 * module.weight.shape[-1] + (4 if rsqrt_kept else 0)
            if getattr(module.weight, "sequence_parallel", False):
                partitioned += input_bytes
            else:
                replicated += input_bytes
        elif isinstance(module, ColumnParallelLinear):
            out_features, in_features = module.weight.shape
            if module.sequence_parallel:
                partitioned += 2 * in_features
            else:
                replicated += 2 * in_features
            partitioned += 2 * out_features * tensor_parallel_size
        elif isinstance(module, RowParallelLinear):
            out_features, in_features = module.weight.shape
            partitioned += 2 * in_features * tensor_parallel_size
            if module.sequence_parallel:
                partitioned += out_features
            else:
                replicated += out_features
        elif isinstance(module, XIELU) and module is getattr(block.mlp, "activation_func", None):
            partitioned += XIELU_SAVED_BYTES * block.mlp.dense_h_to_4h.weight.shape[0] * tensor_parallel_size
        elif isinstance(module, ReplicatedLinear):  # MLA's down projections keep their input, whole per rank
            input_bytes = 2 * module.weight.shape[1]
            if module.sequence_parallel_state is not None:
                partitioned += input_bytes
            else:
                replicated += input_bytes
        elif isinstance(module, MLASelfAttention):
            heads += module.heads_per_rank * tensor_parallel_size
        elif isinstance(module, SelfAttention):
            layout = module.layout
            heads += layout.heads_per_rank * tensor_parallel_size
            if layout.kv_replicas > 1:
                # fewer key/value groups than TP ranks: each rank keeps its group's key and value whole
                kv_bytes = 2 * 2 * layout.head_dim
                replicated += kv_bytes
                partitioned -= kv_bytes * (tensor_parallel_size // layout.kv_replicas)
            if layout.output_gate:
                partitioned += (2 + 4) * layout.heads_per_rank * layout.head_dim * tensor_parallel_size
    return LayerActivationTerms(replicated_bytes_per_token=replicated, partitioned_bytes_per_token=partitioned,
                                bytes_per_attention_score=5, attention_heads=heads)
