"""Step time of one parallel layout, from the model's shape and the hardware's datasheet, without a dry run.

The layout search (planner/layout_search.py) ranks thousands of layouts; a dry run of each would take hours, so
this is the cheap model every candidate gets. Every quantity is a count of the model (gpt/shape.py, the walk training/metrics.py's FLOPs come from)
or a number in configs/hardware/*.yaml; the fitted constants are GEMM_EFFICIENCY and the MoE layers' host sync time
(`moe_sync`), from the calibration file the hardware profile names (planner/layout_calibration.py), each fitted to
one published run. Per rank and iteration (m micro-batches per pipeline, each rank 1 / world of the FLOPs), the terms
of `predict_layout`, each told in docs/planning.md, "The layout model":

    gemm, attention   the linears' FLOPs (forward, 2x backward, recomputed forward) at GEMM_EFFICIENCY of the
                      precision's peak; attention at the BF16 peak over the keys each query sees (causal, window)
    elementwise       norms, residual adds, the gated activation, MoE's permutes: HBM bytes (ELEMENTWISE_BYTES)
    tp, cp, ep        SP's collectives (hidden with --tp-comm-overlap), the CP ring, EP's dispatches (layout_ep.py)
    moe_sync          each MoE layer forward's device-to-host sync (the alltoall dispatcher's split sizes)
    pp                the bubble (PP - 1) / VP, the p2p sends without interleaving, the output stage's excess
    dp                the distributed optimizer's reduce-scatter and all-gather beyond backward and forward (ZeRO 2
                      and 3: planner/layout_zero.py); none hidden where ranks share cores (`ranks_share_cores`)
    optimizer, host   Adam over the shard through HBM; the host's issue time per micro-batch beyond the device's
                      (host_*_ms_per_layer from scripts/bench/probe_host_overhead.py; on a CPU profile all of it)
Model TFLOP/s per GPU are Megatron's (training/metrics.py: no recompute counted) over the predicted step."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import yaml

from arguments.config import ConfigError
from gpt.attention_window import layer_windows
from gpt.hybrid_pattern import ATTENTION, MLA
from gpt.layer_spec import mixer_symbols
from gpt.model_config import ModelConfig
from gpt.shape import AttentionShape, LinearShape, ModelShape, model_shape, probe_mixer
from parallel.layers import padded_vocab_size
from planner.layout_ep import copies_per_token, exposed_ep_seconds, unpaired_fraction
from planner.layout_zero import sharded_dp_seconds, stage3_opening_elements
from planner.perf_model import CALIBRATION_DIR, Hardware, gemm_peak_flops
from planner.pipeline_split import rank_loads
from planner.recurrent_activations import RecurrentSavedBytes, recurrent_saved_bytes

BF16_BYTES, FP32_BYTES = 2, 4
# Elementwise bytes per token per layer in forward, in units of h (bf16): each norm reads and writes h
# (2 norms: 4), each residual add reads 2 and writes 1 (2 adds: 6); the gated activation reads gate and up
# and writes its product (3 x its width / h); MoE's permute and unpermute read and write k copies (4 k).
# Backward moves twice the forward's.
NORM_AND_RESIDUAL_UNITS = 10
# The distributed optimizer's Adam, per parameter of the shard: fp32 master, exp_avg, exp_avg_sq read and
# written (24), the bf16 parameter written (2), the fp32 gradient read (4).
ADAM_SHARD_BYTES = 30


@dataclass(frozen=True)
class Layout:
    """One way to run a model on `gpus` GPUs: Megatron's parallel sizes and the per-step choices."""
    gpus: int
    tp: int = 1
    pp: int = 1
    vp: int = 1                 # virtual stages per pipeline rank (1: no interleaving)
    cp: int = 1
    ep: int = 1
    micro_batch_size: int = 1
    global_batch_size: int = 1
    precision: str = "bf16"     # bf16 or fp8
    recompute_fraction: float = 0.0   # of the blocks' forward FLOPs recomputed in backward (full: 1.0)
    distributed_optimizer: bool = True
    # This project's --zero-stage 2 or 3 (gradients, then parameters, sharded too: planner/layout_zero.py), the
    # optimizer sharded as with distributed_optimizer; None: the stage distributed_optimizer says (1 or 0).
    zero_stage: Optional[int] = None
    tp_comm_overlap: bool = False
    # Megatron's MoE dispatcher (planner/layout_ep.py): alltoall (this project's too), or the flex dispatcher's deepep or
    # hybridep backend; and --overlap-moe-expert-parallel-comm (the combined 1F1B schedule; this project has none)
    moe_dispatcher: str = "alltoall"
    ep_overlap: bool = False
    overlap_grad_reduce: bool = True
    overlap_param_gather: bool = True
    # The output layer's stage given fewer layers (a --pipeline-model-parallel-layout such as Bridge's Llama 3
    # 70B "...|tL", or --account-for-loss-in-pipeline-split): False is Megatron's even split, where that stage
    # carries the logits on top of its share of the blocks.
    output_stage_balanced: bool = True
    # The layers of each pipeline rank's model chunks where the split is given (planner/pipeline_split.py, the
    # search's --pipeline-model-parallel-layout): the step is priced at its slowest rank's load.
    stage_counts: Optional[tuple[tuple[int, ...], ...]] = None
    # Under fp8, --fp8-recipe and whether the weight gradient's GEMM takes FP8 (--no-fp8-wgrad, delayed scaling only):
    # what an FP8 linear keeps for backward (planner/layout_activations.py)
    fp8_recipe: str = "delayed"
    fp8_wgrad: bool = True

    def __post_init__(self) -> None:
        if self.zero_stage is not None and (self.zero_stage not in (2, 3) or not self.distributed_optimizer):
            raise ValueError(f"zero_stage {self.zero_stage}: 2 or 3, with the optimizer sharded (distributed_optimizer)")

    @property
    def dp(self) -> int:
        return self.gpus // (self.tp * self.pp * self.cp)

    @property
    def micro_batches(self) -> int:
        return self.global_batch_size // (self.micro_batch_size * self.dp)

    @property
    def stage(self) -> int:
        """The ZeRO stage the layout runs: 0 plain DDP, 1 the distributed optimizer, 2 or 3 --zero-stage."""
        return self.zero_stage if self.zero_stage is not None else int(self.distributed_optimizer)


@dataclass(frozen=True)
class LayoutConstants:
    gemm_efficiency: float
    source: str
    # The device's wait for the host at each MoE layer's forward (the `moe_sync` term): 0 where the calibration has none
    moe_sync_s: float = 0.0


@dataclass
class LayoutPrediction:
    step_s: float
    terms: dict[str, float]             # seconds per iteration, per term
    model_tflops_per_gpu: float
    tokens_per_s_per_gpu: float

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


def load_layout_constants(name: str) -> LayoutConstants:
    path = Path(name) if name.endswith((".yaml", ".yml")) else CALIBRATION_DIR / f"{name}.yaml"
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
        return LayoutConstants(float(data["gemm_efficiency"]), str(path.name),
                               float(data.get("moe_layer_sync_ms", 0.0)) / 1e3)
    except (OSError, yaml.YAMLError, KeyError, TypeError) as error:
        raise ConfigError(f"{path}: cannot read the layout calibration ({error})") from None


@dataclass(frozen=True)
class ModelCounts:
    """What the layout model reads off the model, once per model (gpt/shape.py's walk)."""
    layers: int
    moe_layers: int
    hidden: int
    seq_length: int
    padded_vocab: int
    linear_flops_per_token: float      # forward, every block and the logits
    attention_flops_per_token: float   # forward scores and context over the full square, every layer
    attention_executed_flops_per_token: float  # forward, what the masked kernels run (causal half, windows)
    blocks_flops_per_token: float      # forward, every block (Megatron's count, attention included)
    mlp_flops_per_token: float         # forward, the MLPs' GEMMs (the routed and shared experts' under MoE)
    logits_flops_per_token: float
    dense_parameters: int              # everything but the routed experts
    expert_parameters: int             # the routed experts of every MoE layer
    kv_width: int                      # K plus V features per token, every head
    gated_width_dense: int             # the dense MLP's activation width (ffn, x2 counted in the units)
    gated_width_moe: int               # an MoE layer's: k experts' widths plus the shared expert's
    topk: int
    root_parameters: int = 0           # outside the blocks: embeddings, final norm, an untied output layer
    embedding_parameters: int = 0      # the word embedding's, of root_parameters (the first pipeline stage's)
    tied_output: bool = False          # the output layer is the embedding (the last stage keeps a copy under PP)
    mlp_gradient_features: int = 0     # a dense MLP's activation gradients held at once in its backward, per token
    gated_mlp: bool = True             # the dense MLP is gated (gate, up and their product saved; else fc1's output
                                       # and the activation's)
    block_dense_parameters: int = 0    # the largest block's, its routed experts left out
    block_expert_parameters: int = 0   # an MoE block's routed experts (0 without MoE)
    experts: int = 0                   # routed experts per MoE layer
    dense_mlp_flops_per_token: float = 0.0   # forward, the dense blocks' MLPs (Megatron's recompute_modules "mlp")
    mla_up_flops_per_token: float = 0.0      # forward, MLA's q and kv up-projections, every layer ("mla_up_proj")
    router_groups: Optional[int] = None      # group-limited routing: the groups and those a token may use
    router_group_topk: Optional[int] = None
    # A pattern's layers by their halves (planner/layout_activations.py): those with an attention mixer (`*`, `+`) and
    # those with an MLP (None: every layer), and what the `M` and `G` mixer halves save
    attention_mixers: Optional[int] = None
    mlp_halves: Optional[int] = None
    recurrent_saved: RecurrentSavedBytes = RecurrentSavedBytes()


def visible_keys_per_query(seq_length: int, window_left: Optional[int]) -> float:
    """Keys a causal query sees, averaged over the sequence's positions: (s + 1) / 2 over the whole context
    (taken as s / 2, half the square), min(i, L) + 1 at position i with a window of L keys before it."""
    if window_left is None or window_left >= seq_length - 1:
        return seq_length / 2
    full = window_left + 1  # positions L .. s-1 see L + 1 keys; positions i < L see i + 1
    return (full * (seq_length - window_left) + window_left * (window_left + 1) / 2) / seq_length


def model_counts(model: ModelConfig, vocab: Optional[int] = None) -> ModelCounts:
    """`vocab`: the launch's vocabulary (planner/vocabulary.py's launch_vocab) where the model config has none
    yet (an --init-from-hf model's comes from its folder at launch): without it the output layer's GEMM and the
    embedding's weights would be left out."""
    shape = model_shape(model, 1)
    vocab = padded_vocab_size(vocab, model.make_vocab_size_divisible_by, 1, model.pad_vocab_size_to) \
        if vocab else model.padded_vocab_size()
    attention_layers = shape.dense_layers + shape.moe_blocks  # the blocks and any multi-token-prediction layers
    flops_per_key = shape.layer_flops_per_key()  # each layer's, at its own mixer's shape (TP 1)
    attention = sum(flops_per_key) * model.seq_length
    windows = layer_windows(model.attention.window_size, model.attention.window_attn_skip_freq, model.num_layers)
    windows += (None,) * (attention_layers - len(windows))  # an MTP layer's attention has no window
    attention_executed = sum(flops * visible_keys_per_query(model.seq_length, w)
                             for flops, w in zip(flops_per_key, windows))
    def linear_flops(chosen) -> int:  # one dense block's forward FLOPs per token in the linears `chosen` names
        return sum(2 * m.in_features * m.out_features for m in shape.block_matmuls
                   if isinstance(m, LinearShape) and chosen(m.name))

    attention_linear = linear_flops(lambda name: name.startswith("attention."))
    dense_mlp = linear_flops(lambda name: name.startswith("mlp."))
    mla_up = linear_flops(lambda name: name in ("attention.linear_q_up_proj", "attention.linear_kv_up_proj"))
    blocks = shape.blocks_forward_flops_per_token()
    logits = shape.logits_forward_flops_per_token(vocab)
    total = shape.parameter_count(vocab)
    moe = model.moe
    topk = moe.router_topk if moe is not None else 0
    experts = moe.num_experts if moe is not None else 0
    moe_ffn = (moe.ffn_hidden_size or model.ffn_size) if moe is not None else 0
    per_expert = (shape.parameters_per_moe_block - shape.active_parameters_per_moe_block) // max(experts - topk, 1) \
        if moe is not None else 0
    expert_parameters = per_expert * experts * shape.moe_blocks
    shared = (moe.shared_expert_intermediate_size or 0) if moe is not None else 0
    mla_layers = shape.layer_mixers.count(MLA) if shape.layer_mixers else attention_layers  # where mla_up runs
    mixer_linear = attention_linear * attention_layers + sum(m.linear_flops + shape.scan_flops_per_token(m)
                                                             for m in shape.other_mixer_layers())
    return ModelCounts(
        layers=model.num_layers, moe_layers=shape.moe_blocks, hidden=model.hidden_size, seq_length=model.seq_length,
        padded_vocab=vocab, linear_flops_per_token=float(blocks - attention + logits),
        attention_flops_per_token=float(attention), attention_executed_flops_per_token=float(attention_executed),
        blocks_flops_per_token=float(blocks),
        mlp_flops_per_token=float(blocks - attention - mixer_linear),
        logits_flops_per_token=float(logits), dense_parameters=total - expert_parameters,
        expert_parameters=expert_parameters,
        kv_width=_kv_width(model, shape),
        gated_width_dense=model.ffn_size,
        gated_width_moe=topk * moe_ffn + shared, topk=topk,
        root_parameters=vocab * shape.parameters_per_vocabulary_row + shape.parameters_outside_blocks,
        # a vocabulary row is the embedding's alone when the output layer is tied to it (gpt/shape.py)
        embedding_parameters=vocab * model.hidden_size,
        tied_output=shape.parameters_per_vocabulary_row == model.hidden_size,
        mlp_gradient_features=shape.mlp_gradient_features if shape.dense_layers else 0,
        gated_mlp=any(getattr(m, "name", "") == "mlp.dense_h_to_4h_gate" for m in shape.block_matmuls),
        # the largest block's, a pattern's larger mixer (`*` beside `+`) included
        block_dense_parameters=max(shape.parameters_per_block if shape.dense_layers else 0,
                                   shape.parameters_per_moe_block - per_expert * experts if moe is not None else 0)
        + max([0, *(m.parameters for m in shape.other_mixers)]),
        block_expert_parameters=per_expert * experts, experts=experts,
        dense_mlp_flops_per_token=float(dense_mlp * shape.dense_layers),
        mla_up_flops_per_token=float(mla_up * mla_layers),
        router_groups=moe.router_num_groups if moe is not None else None,
        router_group_topk=moe.router_group_topk if moe is not None else None,
        attention_mixers=sum(symbol in (ATTENTION, MLA) for symbol in mixer_symbols(model)),
        mlp_halves=model.num_layers - shape.layers_without_mlp, recurrent_saved=recurrent_saved_bytes(model))


def _kv_width(model: ModelConfig, shape: ModelShape) -> int:
    """The keys' and values' features per token the CP ring passes, the layers' mean: attention's a head each per
    group, multi-latent attention's per head (its keys qk_head_dim + qk_pos_emb_head_dim wide, its values v_head_dim:
    gpt/mla.py); a pattern mixing them (`*-+-`) each layer by its own mixer, none for a layer without attention."""
    probe = next(m for m in shape.block_matmuls if isinstance(m, AttentionShape))
    shapes = {probe_mixer(model): probe, **{m.symbol: m.attention for m in shape.other_mixers}}
    groups = model.attention.num_query_groups or model.num_attention_heads

    def width(symbol: str) -> int:
        kv = shapes[symbol]
        if kv is None:  # `M`, `G`, an MLP-only block
            return 0
        return (model.num_attention_heads if symbol == MLA else groups) * (kv.head_dim + (kv.value_head_dim or kv.head_dim))

    mixers = shape.layer_mixers or (probe_mixer(model),)
    return round(sum(map(width, mixers)) / len(mixers))


def _link(spans_nodes: bool, hardware: Hardware) -> float:
    return hardware.inter_node_bandwidth if spans_nodes else hardware.intra_node_bandwidth


def _dispatch_seconds(counts: ModelCounts, layout: Layout, tokens: float, value_bytes: int, hardware: Hardware) -> float:
    """One dispatch (or combine) of `tokens` over the EP group: the copies for this node's ranks at NVLink and for the
    other nodes at the NIC (planner/layout_ep.py), the slower of the two (they run at once)."""
    nvlink, infiniband = copies_per_token(layout.moe_dispatcher, counts.experts, counts.topk, layout.ep,
                                          hardware.gpus_per_node, counts.router_groups, counts.router_group_topk)
    token_bytes = tokens * counts.hidden * value_bytes
    return max(nvlink * token_bytes / hardware.intra_node_bandwidth,
               infiniband * token_bytes / hardware.inter_node_bandwidth) + hardware.intra_node_latency_s


def even_split_output_stage_s(counts: ModelCounts, layout: Layout, hardware: Hardware, constants: LayoutConstants,
                              fp8_peak_flops: Optional[float] = None) -> float:
    """What Megatron's even layer split costs over a balanced one: the last stage's ranks compute every token's
    logits, which the GEMM term spreads over all PP stages, and the other stages wait for it each micro-batch
    (the 1F1B pipeline runs at its slowest stage's pace): (PP - 1) x the logits' evenly spread time."""
    if layout.pp <= 1:
        return 0.0
    gemm_peak = gemm_peak_flops(hardware, layout.precision == "fp8", fp8_peak_flops)
    tokens = layout.global_batch_size * counts.seq_length
    logits_s = tokens * 3 * counts.logits_flops_per_token / layout.gpus / (gemm_peak * constants.gemm_efficiency)
    return (layout.pp - 1) * logits_s


def output_layer_units(counts: ModelCounts, layout: Layout) -> float:
    """The output layer's work (forward and backward of the logits GEMM) in transformer layers' work (forward,
    backward, the recomputed forward; attention as its masked kernels run): the unit of planner/pipeline_split.py."""
    per_layer = (counts.blocks_flops_per_token - counts.attention_flops_per_token
                 + counts.attention_executed_flops_per_token) / counts.layers
    return 3 * counts.logits_flops_per_token / ((3 + layout.recompute_fraction) * per_layer)


def stage_split_s(counts: ModelCounts, layout: Layout, compute_s: float) -> float:
    """What the given split (`layout.stage_counts`) costs over a perfectly even spread of the pipeline's work:
    the pipeline runs at its most loaded rank's pace. `compute_s`: the rank's GEMM and attention time under an
    even spread (the whole pipeline's work is PP x it, in layers + the output layer's units)."""
    units = output_layer_units(counts, layout)
    heaviest = max(rank_loads(layout.stage_counts, units))
    return compute_s * (heaviest * layout.pp / (counts.layers + units) - 1.0)


def ranks_share_cores(layout: Layout, hardware: Hardware) -> bool:
    """More ranks on a node than it has cores (a CPU profile's cores_per_node): no work overlaps another."""
    return hardware.cores_per_node is not None and min(layout.gpus, hardware.gpus_per_node) > hardware.cores_per_node


def pipeline_waits_idle_no_core(layout: Layout, hardware: Hardware) -> bool:
    """Whether a pipeline's waits (its bubble, a lighter stage waiting for the slowest) cost nothing: where a
    node's ranks share fewer cores than they are (`cores_per_node`, a CPU profile) and one stage's ranks alone
    are at least the cores, a waiting rank's core runs another rank's work, so the step is the work over the
    cores, which the compute terms already price (they run at the rate one rank gets with all ranks busy)."""
    if hardware.cores_per_node is None or layout.pp <= 1:
        return False
    ranks_here = min(layout.gpus, hardware.gpus_per_node)
    return ranks_here // layout.pp >= hardware.cores_per_node


def host_exposed_s(layout: Layout, layers_here: float, device_per_micro_s: float, hardware: Hardware) -> float:
    """The host's issue time of a step's micro-batches that the device does not hide (module docstring, `host`)."""
    if hardware.host_forward_s_per_layer is None or hardware.host_backward_s_per_layer is None:
        return 0.0
    host_per_micro = layers_here * (hardware.host_forward_s_per_layer * (1 + layout.recompute_fraction)
                                    + hardware.host_backward_s_per_layer)
    if hardware.device_type == "cpu":
        return layout.micro_batches * host_per_micro
    return layout.micro_batches * max(0.0, host_per_micro - device_per_micro_s)


def _sharded_dp_s(counts: ModelCounts, layout: Layout, parameters: float, group: int, experts: bool, link: float,
                  value_bytes: int, compute_s: float, hidden: bool) -> float:
    """ZeRO-2/3's data-parallel time (planner/layout_zero.py), its compute split into the forward's pass and
    backward's (2 passes, and the recomputed forward, which under stage 3 reuses the backward's gather)."""
    passes = 3 + layout.recompute_fraction
    return sharded_dp_seconds(layout.stage, parameters, group, stage3_opening_elements(counts, layout, experts),
                              link, value_bytes, layout.micro_batches, compute_s / passes,
                              compute_s * (passes - 1) / passes, hidden)


def predict_layout(counts: ModelCounts, layout: Layout, hardware: Hardware, constants: LayoutConstants,
                   fp8_peak_flops: Optional[float] = None) -> LayoutPrediction:
    """The step time of `layout`, term by term (the module docstring says what each term is)."""
    b, s, h = layout.micro_batch_size, counts.seq_length, counts.hidden
    # activations and gathered parameters move in the run's 16-bit type; a CPU profile's runs are fp32 throughout
    value_bytes = FP32_BYTES if hardware.precision == "fp32" else BF16_BYTES
    tokens = layout.global_batch_size * s
    world = layout.gpus
    gemm_peak = gemm_peak_flops(hardware, layout.precision == "fp8", fp8_peak_flops)
    passes = 3 + layout.recompute_fraction  # forward, backward (2x), the recomputed forward
    linear_flops = tokens * (3 * counts.linear_flops_per_token
                             + layout.recompute_fraction * (counts.blocks_flops_per_token - counts.attention_flops_per_token))
    attention_flops = tokens * passes * counts.attention_executed_flops_per_token  # the masks' visible keys
    gemm_s = linear_flops / world / (gemm_peak * constants.gemm_efficiency)
    attention_s = attention_flops / world / (hardware.peak_flops * constants.gemm_efficiency)

    layers_here = counts.layers / layout.pp
    moe_here = counts.moe_layers / layout.pp
    tokens_here = b * s / (layout.tp * layout.cp)  # a rank's share of a micro-batch (sequence parallel)
    m = layout.micro_batches
    units = (NORM_AND_RESIDUAL_UNITS * layers_here
             + 3 * ((layers_here - moe_here) * counts.gated_width_dense + moe_here * counts.gated_width_moe) / h
             + 4 * counts.topk * moe_here)
    elementwise_s = m * passes * tokens_here * h * units * value_bytes / hardware.hbm_bandwidth

    compute_per_micro = (gemm_s + attention_s + elementwise_s) / m
    activation = b * s * h * value_bytes / layout.cp
    tp_s = 0.0
    if layout.tp > 1:
        tp_bytes = 8 * (layout.tp - 1) / layout.tp * activation * layers_here
        tp_s = m * (tp_bytes / _link(layout.tp > hardware.gpus_per_node, hardware)
                    + 8 * layers_here * hardware.intra_node_latency_s)
        if layout.tp_comm_overlap:
            tp_s = max(0.0, tp_s - gemm_s)
    cp_s = 0.0
    if layout.cp > 1:
        kv_chunk = b * (s / layout.cp) * counts.kv_width / layout.tp * value_bytes
        ring = 3 * (layout.cp - 1) * kv_chunk * layers_here  # K, V forward; K, V, dK, dV backward
        cp_s = m * ring / _link(layout.tp * layout.cp > hardware.gpus_per_node, hardware)
        cp_s = max(0.0, cp_s - attention_s)
    ep_s = 0.0
    if layout.ep > 1 and counts.moe_layers:
        ep_s = m * 4 * moe_here * _dispatch_seconds(counts, layout, tokens_here, value_bytes, hardware)
        ep_s = exposed_ep_seconds(ep_s, gemm_s + attention_s + elementwise_s, layout.ep_overlap,
                                  unpaired_fraction(layout.pp, layout.vp, m))

    # each MoE layer's forward (and its recomputed forward under full recompute) stops the host at the dispatcher's
    # device-to-host sync; the device then waits while the host issues the rest of the layer (module docstring)
    moe_forwards = 2 if layout.recompute_fraction >= 1.0 else 1
    moe_sync_s = m * moe_here * moe_forwards * constants.moe_sync_s
    per_micro = compute_per_micro + (tp_s + cp_s + ep_s + moe_sync_s) / m
    host_s = host_exposed_s(layout, layers_here, per_micro, hardware)
    bubble_s = (layout.pp - 1) / layout.vp * per_micro
    p2p_s = 0.0
    if layout.pp > 1 and layout.vp == 1:
        p2p_s = m * 2 * activation / layout.tp / _link(layout.tp * layout.cp * layout.dp >= hardware.gpus_per_node,
                                                        hardware)

    # Data parallel: this rank's dense shard over DP x CP (Megatron reduces over both), experts over expert-DP.
    dense_here = counts.dense_parameters / (layout.tp * layout.pp)
    expert_here = counts.expert_parameters / (layout.ep * layout.pp)
    dp_group = layout.dp * layout.cp
    expert_dp = max(world // (layout.ep * layout.pp), 1)
    dp_s = 0.0
    shared = ranks_share_cores(layout, hardware)
    for parameters, group, experts in ((dense_here, dp_group, False), (expert_here, expert_dp, True)):
        if group > 1 and parameters:
            spans = world // layout.pp > hardware.gpus_per_node
            if layout.stage >= 2:  # this project's ZeRO-2/3 (planner/layout_zero.py)
                dp_s += _sharded_dp_s(counts, layout, parameters, group, experts, _link(spans, hardware),
                                      value_bytes, gemm_s + attention_s, layout.overlap_grad_reduce and not shared)
                continue
            reduce_bytes = (group - 1) / group * parameters * FP32_BYTES
            gather_bytes = (group - 1) / group * parameters * value_bytes if layout.distributed_optimizer else 0.0
            if not layout.distributed_optimizer:
                reduce_bytes *= 2  # an all-reduce moves twice a reduce-scatter
            reduce_s = reduce_bytes / _link(spans, hardware)
            gather_s = gather_bytes / _link(spans, hardware)
            backward = (gemm_s + attention_s) * 2 / 3
            forward = (gemm_s + attention_s) / 3
            # ranks sharing cores hide nothing: the cores run backward, gloo's copies and sums need them too
            dp_s += max(0.0, reduce_s - backward) if layout.overlap_grad_reduce and not shared else reduce_s
            dp_s += max(0.0, gather_s - forward) if layout.overlap_param_gather and not shared else gather_s
    shard = (dense_here / (dp_group if layout.distributed_optimizer else 1)
             + expert_here / (expert_dp if layout.distributed_optimizer else 1))
    optimizer_s = shard * ADAM_SHARD_BYTES / hardware.hbm_bandwidth

    if layout.stage_counts is not None and layout.pp > 1:
        imbalance_s = stage_split_s(counts, layout, gemm_s + attention_s)
    else:
        imbalance_s = 0.0 if layout.output_stage_balanced else \
            even_split_output_stage_s(counts, layout, hardware, constants, fp8_peak_flops)

    if pipeline_waits_idle_no_core(layout, hardware):
        bubble_s = imbalance_s = 0.0

    terms = {"gemm": gemm_s, "attention": attention_s, "elementwise": elementwise_s, "tp": tp_s, "cp": cp_s,
             "ep": ep_s, "moe_sync": moe_sync_s, "pp_bubble": bubble_s, "pp_p2p": p2p_s, "pp_output_stage": imbalance_s, "dp": dp_s,
             "optimizer": optimizer_s, "host": host_s}
    step = sum(terms.values())
    model_flops = 3 * tokens * (counts.blocks_flops_per_token + counts.logits_flops_per_token)
    return LayoutPrediction(step_s=step, terms=terms, model_tflops_per_gpu=model_flops / world / step / 1e12,
                            tokens_per_s_per_gpu=tokens / world / step)
