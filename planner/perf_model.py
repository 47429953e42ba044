"""Iteration time and TFLOP/s per GPU, predicted from a dry run (planner/dry_run.py) on a hardware profile.

`python -m zero.plan dry-run --hardware P` prints this model's figure only where P has no layout calibration
(dgx2-v100, cpu-2core); where it has one (h100-sxm), the layout model's (planner/layout_prediction.py).
    python -m zero.perf_model --hardware dgx2-v100 [zero.plan dry-run flags]     # one prediction
    python -m zero.perf_model --hardware h100-sxm --calibrate RUN/metrics.jsonl docs/h100-benchmark-gpu-mb1.json

Per rank and iteration, each term from the dry run's counts and the profile (configs/hardware/*.yaml): compute (every
GEMM of forward, backward and recompute at GEMM_EFFICIENCY of the dense peak, FP8 linears at the FP8 peak, plus
moving its operands through HBM, so thin GEMMs fall off the peak by the hardware's FLOP-per-byte ratio; the
memory-bound kernels, ELEMENTWISE_PASSES x b s h per layer and pass; the loss's softmax; Adam over the partition);
TP traffic (at the intra- or inter-node link, never overlapped: what collapses Megatron beyond one DGX-2 in Figure
2); DP traffic (reductions hide behind backward up to DP_OVERLAP; gathers after the step do not, unless
--overlap-param-gather); P_a+cpu (2 x the host bytes per micro-batch at PCIe speed); pipeline (the stage's compute,
the bubble (P - 1) / vp micro-batches, Narayanan et al. 2021 section 2.2, and the p2p sends on the critical path).

Three named constants (`Constants`), each from a calibration file (configs/hardware/calibrations/) that says what it
was fitted to: GEMM_EFFICIENCY, ELEMENTWISE_PASSES and DP_OVERLAP; everything else is a specification or a count.
`--calibrate` fits them to real runs (planner/perf_calibration.py)."""

from __future__ import annotations

import dataclasses
import math
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

import yaml

from arguments.config import ConfigError, PretrainConfig
from gpt.hybrid_pattern import parse_hybrid_pattern
from gpt.layer_spec import mixer_symbols
from gpt.shape import LinearShape, ScanShape, model_shape, probe_mixer
from parallel.comm import ring_bytes_sent
from parallel.fp8.linear import shape_rule_broken
from planner.dry_run import RankPlan
from training.metrics import flops_per_iteration
from training.recompute_share import recomputed_share
from training.run_settings import resolve_run_settings

HARDWARE_DIR = Path(__file__).resolve().parent.parent / "configs" / "hardware"
CALIBRATION_DIR = HARDWARE_DIR / "calibrations"
ELEMENT_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}
# Bytes Adam moves per element of this rank's partition, beside the gradient: fp32 master, exp_avg and
# exp_avg_sq each read and written (24), the 16-bit parameter written (2). The gradient is read twice
# (the norm for clipping, then the update).
ADAM_STATE_BYTES = 24 + 2
ADAM_GRADIENT_READS = 2
# --optimizer ademamix reads and writes a third fp32 state, the slow momentum (zero/ademamix.py): 8 more.
# Sophia-G (zero/sophia.py) reads and writes its two fp32 states as Adam does.
STATE_BYTES = {"adam": ADAM_STATE_BYTES, "ademamix": ADAM_STATE_BYTES + 8, "muon": ADAM_STATE_BYTES,
               "sophiag": ADAM_STATE_BYTES}
# The vocab-parallel loss keeps an fp32 softmax of the logits; writing it, reading it back in backward
# and writing the logits' gradient moves about 3 fp32 copies of the logits (the dry run's
# loss_softmax_bytes is one).
LOSS_SOFTMAX_PASSES = 3


@dataclass(frozen=True)
class Hardware:
    """One GPU (or CPU process) and its links. Bandwidths in bytes/s per GPU and per direction."""
    name: str
    gpus_per_node: int
    gpu_memory_bytes: int
    peak_flops: float                 # dense 16-bit tensor-core peak (fp32 for a CPU profile)
    hbm_bandwidth: float
    intra_node_bandwidth: float
    inter_node_bandwidth: float       # a GPU's share of its node's network
    host_bandwidth: float             # device <-> host (PCIe), for P_a+cpu
    intra_node_latency_s: float
    inter_node_latency_s: float
    precision: str                    # what runs on it use: fp16 (V100), bf16 (H100), fp32 (CPU)
    device_type: str                  # cuda or cpu: the planner's attention kernel
    calibration: str                  # a file in configs/hardware/calibrations/
    fp8_peak_flops: Optional[float] = None   # dense FP8 tensor-core peak, where the GPU has one
    layout_calibration: Optional[str] = None  # the layout model's constant (planner/layout_perf.py)
    cores_per_node: Optional[int] = None      # where a node's ranks share fewer processors (a CPU profile); None: one each
    # This repository's training step on the profile's host: seconds to issue one layer's forward (and its recompute)
    # and backward per micro-batch, whatever its size (scripts/bench/probe_host_overhead.py); None: not measured,
    # no term
    host_forward_s_per_layer: Optional[float] = None
    host_backward_s_per_layer: Optional[float] = None


@dataclass(frozen=True)
class Constants:
    """The model's calibration constants (see the module docstring), and where they came from."""
    gemm_efficiency: float      # fraction of the dense peak a large GEMM reaches
    elementwise_passes: float   # HBM traffic of the non-GEMM kernels: elements moved per b*s*h per layer per pass
    dp_overlap: float           # fraction of the DP gradient reduction that can hide behind backward
    source: str = ""


def hardware_path(name_or_path: str) -> Path:
    path = Path(name_or_path)
    if path.suffix in (".yaml", ".yml"):
        return path
    candidate = HARDWARE_DIR / f"{name_or_path}.yaml"
    if not candidate.is_file():
        names = ", ".join(sorted(p.stem for p in HARDWARE_DIR.glob("*.yaml")))
        raise ConfigError(f"--hardware {name_or_path}: no such profile in {HARDWARE_DIR} ({names})")
    return candidate


def _read_yaml(path: Path) -> dict:
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as error:
        raise ConfigError(f"{path}: cannot read it ({error})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping")
    return data


def _milliseconds(data: dict, key: str) -> Optional[float]:
    return float(data[key]) * 1e-3 if key in data else None


def load_hardware(name_or_path: str) -> Hardware:
    path = hardware_path(name_or_path)
    data = _read_yaml(path)
    giga = 1e9
    try:
        return Hardware(
            name=path.stem, gpus_per_node=int(data["gpus_per_node"]), gpu_memory_bytes=int(float(data["gpu_memory_bytes"])),
            peak_flops=float(data["peak_tflops"]) * 1e12, hbm_bandwidth=float(data["hbm_bandwidth_gbs"]) * giga,
            intra_node_bandwidth=float(data["intra_node_bandwidth_gbs"]) * giga,
            inter_node_bandwidth=float(data["inter_node_bandwidth_gbs"]) * giga,
            host_bandwidth=float(data["host_bandwidth_gbs"]) * giga,
            intra_node_latency_s=float(data["intra_node_latency_us"]) * 1e-6,
            inter_node_latency_s=float(data["inter_node_latency_us"]) * 1e-6,
            precision=str(data["precision"]), device_type=str(data["device_type"]),
            calibration=str(data["calibration"]),
            fp8_peak_flops=float(data["fp8_peak_tflops"]) * 1e12 if "fp8_peak_tflops" in data else None,
            layout_calibration=data.get("layout_calibration"),
            cores_per_node=int(data["cores_per_node"]) if "cores_per_node" in data else None,
            host_forward_s_per_layer=_milliseconds(data, "host_forward_ms_per_layer"),
            host_backward_s_per_layer=_milliseconds(data, "host_backward_ms_per_layer"))
    except KeyError as missing:
        raise ConfigError(f"{path}: missing key {missing}") from None


def load_constants(name_or_path: str) -> Constants:
    path = Path(name_or_path)
    if path.suffix not in (".yaml", ".yml"):
        path = CALIBRATION_DIR / f"{name_or_path}.yaml"
    data = _read_yaml(path)
    try:
        return Constants(float(data["gemm_efficiency"]), float(data["elementwise_passes"]),
                         float(data["dp_overlap"]), source=str(path.relative_to(HARDWARE_DIR.parent.parent))
                         if path.is_relative_to(HARDWARE_DIR.parent.parent) else str(path))
    except KeyError as missing:
        raise ConfigError(f"{path}: missing key {missing}") from None


@dataclass
class Prediction:
    """One rank's iteration, in seconds per term, and the throughput that follows."""
    iteration_s: float
    terms: dict[str, float]              # compute, tp, dp_reduce_exposed, dp_gather_exposed, optimizer, offload,
                                         # and with pipeline stages pipeline_bubble, pipeline_p2p
    model_tflops_per_gpu: float          # Megatron's FLOPs without recompute, per GPU per second
    hardware_tflops_per_gpu: float       # with recompute when checkpointing: what the GPU executes
    tp_crosses_nodes: bool
    dp_crosses_nodes: bool

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


def gemm_peak_flops(hardware: Hardware, fp8: bool, fp8_peak_flops: Optional[float] = None) -> float:
    """The dense tensor-core peak a GEMM runs at: the FP8 one for an FP8 GEMM (`fp8_peak_flops`, the profile's
    fp8_peak_tflops; twice the 16-bit peak where the profile names none, Hopper's ratio), else the 16-bit one.
    Shared by this model and the layout search's (planner/layout_perf.py)."""
    return (fp8_peak_flops or 2 * hardware.peak_flops) if fp8 else hardware.peak_flops


@dataclass(frozen=True)
class Gemm:
    m: int
    k: int
    n: int
    count: int  # how many of this shape, per micro-batch, in one forward
    fp8: bool = False  # its operands cast to FP8 (--fp8-format: a block's linear that runs in FP8)

    @property
    def flops(self) -> float:
        return 2.0 * self.m * self.k * self.n * self.count


def forward_gemms(config: PretrainConfig, padded_vocab: int, tp: int,
                  mixers: Optional[Sequence[Optional[str]]] = None,
                  mlps: Optional[Sequence[Optional[str]]] = None) -> tuple[list[Gemm], Gemm]:
    """One TP rank's matrix products in one micro-batch's forward, read from the model's shape
    (gpt/shape.py): the blocks' (per layer x layers), in forward order, and the logits'. Their FLOPs x 3
    (x 4 blocks with recompute) are training.metrics.flops_per_iteration. `mixers`: the blocks' mixer symbols
    (gpt/layer_spec.py) where a pattern mixes them (`*-+-`), each block then by its own mixer; else every one of
    --num-layers blocks the shape's probe block. `mlps`: their MLP symbols, None for a mixer-only block (`M` alone),
    which runs no MLP GEMMs."""
    model, micro = config.model, config.training.micro_batch_size
    shape = model_shape(model, tp)
    layers = len(mixers) if mixers else model.num_layers
    fp8_layers = layers_in_fp8(model, layers)
    kinds = {probe_mixer(model): shape.block_matmuls, **{m.symbol: m.block_matmuls for m in shape.other_mixers}}
    blocks = []
    kinds_of_blocks = Counter(zip(mixers, mlps or [True] * layers)) if mixers else \
        Counter({(probe_mixer(model), True): layers})
    for (symbol, mlp), count in kinds_of_blocks.items():
        matmuls = kinds[symbol] if mlp is not None else \
            tuple(m for m in kinds[symbol] if not (isinstance(m, LinearShape) and m.name.startswith("mlp.")))
        # (FP8's bf16 first and last blocks shared out over the mixers by their counts)
        blocks += _block_gemms(matmuls, model, micro, count, fp8_layers * count // layers)
    logits = shape.output_matmul(padded_vocab)
    return blocks, Gemm(micro * model.seq_length, logits.in_features, logits.out_features, 1)


def block_kinds(model, stage: slice) -> tuple[Optional[Sequence[Optional[str]]], Optional[Sequence[Optional[str]]]]:
    """The mixers and MLPs (forward_gemms' `mixers` and `mlps`) of the blocks in `stage` where they may differ from
    the shape's probe block: a pattern's, or the GPT flags' Gated DeltaNet layers; (None, None) where all are alike."""
    if model.hybrid_layer_pattern is not None:
        return mixer_symbols(model)[stage], parse_hybrid_pattern(model.hybrid_layer_pattern).mlps()[stage]
    if model.gdn.gated_delta_net:
        return mixer_symbols(model)[stage], None
    return None, None


def _block_gemms(matmuls, model, micro: int, layers: int, fp8_layers: int) -> list[Gemm]:
    """`layers` blocks of one kind: each linear (in FP8 on `fp8_layers` of them where its shape allows), and
    attention's scores and context per head and sequence; a recurrent mixer's conv and scan as products of the
    chunk's width (tokens x its FLOPs per token / 2 chunk x chunk)."""
    tokens, s = micro * model.seq_length, model.seq_length
    blocks = []
    for matmul in matmuls:
        if isinstance(matmul, LinearShape):
            in_fp8 = fp8_layers if shape_rule_broken(matmul.in_features, matmul.out_features, tokens,
                                                      model.fp8.recipe) is None else 0
            blocks += [gemm for gemm in (Gemm(tokens, matmul.in_features, matmul.out_features, in_fp8, fp8=True),
                                         Gemm(tokens, matmul.in_features, matmul.out_features, layers - in_fp8))
                       if gemm.count]
        elif isinstance(matmul, ScanShape):
            blocks.append(Gemm(tokens, matmul.flops_per_token(s) // (2 * matmul.chunk), matmul.chunk, layers))
        elif matmul.value_head_dim is None:  # scores and context, per head and sequence: [s, d] x [d, s], [s, s] x [s, d]
            blocks.append(Gemm(s, matmul.head_dim, s, 2 * matmul.heads * micro * layers))
        else:  # multi-latent attention: the context's value heads have their own width
            blocks += [Gemm(s, matmul.head_dim, s, matmul.heads * micro * layers),
                       Gemm(s, s, matmul.value_head_dim, matmul.heads * micro * layers)]
    return blocks


def layers_in_fp8(model, layers: int) -> int:
    """How many of `layers` blocks run their linears in FP8: none without --fp8-format, all but
    --first-last-layers-bf16's (gpt/fp8.py). Under pipeline stages the kept blocks are counted off this
    stage's as if it held the first and last (an upper bound on its high-precision blocks)."""
    fp8 = model.fp8
    if not fp8.enabled:
        return 0
    if not fp8.first_last_layers_bf16:
        return layers
    return max(0, layers - fp8.num_layers_at_start_in_bf16 - fp8.num_layers_at_end_in_bf16)


def gemm_seconds(gemms: Sequence[Gemm], element_bytes: int, hardware: Hardware, constants: Constants) -> float:
    """Each product at GEMM_EFFICIENCY of its peak (gemm_peak_flops) plus its operands' and result's HBM traffic:
    the achieved fraction of peak is 1 / (1/E + peak x bytes / (flops x HBM)), so it depends on the
    GEMM's size through its arithmetic intensity and on the hardware through its FLOP-per-byte ratio. An FP8
    GEMM reads 1-byte operands and writes its result in the training dtype."""
    seconds = 0.0
    for gemm in gemms:
        operand_bytes = 1 if gemm.fp8 else element_bytes
        traffic = ((gemm.m * gemm.k + gemm.k * gemm.n) * operand_bytes + gemm.m * gemm.n * element_bytes) * gemm.count
        peak = gemm_peak_flops(hardware, gemm.fp8, hardware.fp8_peak_flops)
        seconds += gemm.flops / (peak * constants.gemm_efficiency) + traffic / hardware.hbm_bandwidth
    return seconds


def _bandwidth(crosses_nodes: bool, hardware: Hardware) -> tuple[float, float]:
    if crosses_nodes:
        return hardware.inter_node_bandwidth, hardware.inter_node_latency_s
    return hardware.intra_node_bandwidth, hardware.intra_node_latency_s


def _collective_seconds(bytes_sent: int, bytes_per_call: float, crosses_nodes: bool, hardware: Hardware) -> tuple[float, int]:
    """Ring time for `bytes_sent` (parallel/comm.py's per-rank ring volume) and the calls it took."""
    if bytes_sent <= 0:
        return 0.0, 0
    bandwidth, latency = _bandwidth(crosses_nodes, hardware)
    calls = max(1, math.ceil(bytes_sent / max(bytes_per_call, 1.0)))
    return bytes_sent / bandwidth + calls * latency, calls


def predict(plan: RankPlan, config: PretrainConfig, vocab_size: int, world_size: int, hardware: Hardware,
            constants: Constants) -> Prediction:
    """The iteration time of `plan` (a dry run of `config` on `world_size` GPUs), term by term."""
    tp, dp = plan.tensor_parallel_size, plan.data_parallel_size
    run = resolve_run_settings(config, vocab_size, tp, dp)
    config, micro_batches = run.config, run.batch.final_accumulation_steps
    model = config.model
    element = ELEMENT_BYTES[config.training.precision]
    grad_element = ELEMENT_BYTES[config.training.gradient_precision]

    # Compute of one micro-batch: forward, backward (2x forward's products) and the recompute (of the stage's blocks
    # --recompute-method picks: all, or under block the first N of each chunk).
    stages = plan.pipeline
    recompute = recomputed_share(config, stages.pipeline_parallel_rank if stages is not None else None)
    pp, chunks = (stages.pipeline_parallel_size, stages.chunks) if stages is not None else (1, 1)
    layers = model.num_layers // pp  # this rank's stage (Megatron's split is even)
    # (the GEMMs of a stage's layers; a per-layer window list, of the whole model's layers, shapes none of them)
    rank = stages.pipeline_parallel_rank if stages is not None else 0
    mixers, mlps = block_kinds(model, slice(rank * layers, (rank + 1) * layers))
    if mixers is not None:  # each block by its own mixer: this rank's share of the even split
        blocks, logits = forward_gemms(config, run.padded_vocab_size, tp, mixers, mlps)
    else:
        blocks, logits = forward_gemms(dataclasses.replace(config, model=model.with_layers(layers)),
                                       run.padded_vocab_size, tp)
    holds_logits = stages is None or stages.pipeline_parallel_rank == pp - 1
    block_s, logits_s = (gemm_seconds(blocks, element, hardware, constants),
                         gemm_seconds([logits], element, hardware, constants) if holds_logits else 0.0)
    tokens_hidden = config.training.micro_batch_size * model.seq_length * model.hidden_size
    elementwise_pass_s = (constants.elementwise_passes * tokens_hidden * element * layers
                          / hardware.hbm_bandwidth)
    loss_s = LOSS_SOFTMAX_PASSES * plan.loss_softmax_bytes / hardware.hbm_bandwidth
    forward_s = block_s + logits_s + elementwise_pass_s + loss_s / LOSS_SOFTMAX_PASSES
    backward_s = 2 * (block_s + logits_s + elementwise_pass_s) + loss_s * (LOSS_SOFTMAX_PASSES - 1) / LOSS_SOFTMAX_PASSES
    backward_s += recompute * (block_s + elementwise_pass_s)
    compute_s = micro_batches * (forward_s + backward_s)

    # Tensor parallelism: consecutive ranks, so a group spans nodes only when it outgrows one.
    tp_crosses = tp > hardware.gpus_per_node
    tp_bytes = sum(plan.comm_bytes["tp"].values())
    activation_call = ring_bytes_sent("all_reduce", tokens_hidden * element, tp)
    tp_s, _ = _collective_seconds(tp_bytes, activation_call, tp_crosses, hardware)

    # Data parallelism: ranks strided by TP, so a group spans nodes when the job does.
    dp_crosses = world_size > hardware.gpus_per_node
    dp_bytes = plan.comm_bytes["dp"]
    bucket_bytes = config.zero.reduce_bucket_size * grad_element
    reduce_kind = "all_reduce" if plan.stage == 0 or not config.zero.reduce_scatter else "reduce_scatter"
    reduce_s, reduce_calls = _collective_seconds(dp_bytes["reduce_scatter"] + dp_bytes["all_reduce"],
                                                 ring_bytes_sent(reduce_kind, bucket_bytes, dp), dp_crosses, hardware)
    reductions = micro_batches if plan.stage >= 2 else 1  # stages 2-3 keep no full gradient to accumulate into
    last_buckets_s = reduce_s / max(reduce_calls, 1) * min(reductions, reduce_calls)
    backward_window = backward_s * reductions
    reduce_exposed = max(reduce_s - min(constants.dp_overlap * reduce_s, backward_window), last_buckets_s) \
        if reduce_s else 0.0
    gather_s, _ = _collective_seconds(dp_bytes["all_gather"] + dp_bytes["broadcast"],
                                      ring_bytes_sent("all_gather", config.zero.allgather_bucket_size * element, dp),
                                      dp_crosses, hardware)
    gather_window = micro_batches * (forward_s + backward_s) if plan.stage == 3 else \
        forward_s if config.zero.overlap_param_gather else 0.0
    gather_exposed = gather_s - min(constants.dp_overlap * gather_s, gather_window)

    # Adam over this rank's partition (the whole TP shard at stage 0), memory-bound.
    partition = plan.parameters_local if plan.stage == 0 else math.ceil(plan.parameters_local / dp)
    # a bf16 moment (--exp-avg-dtype / --exp-avg-sq-dtype bf16, zero/precision_aware.py) moves 4 bytes, not 8
    state_bytes = STATE_BYTES[config.optimizer.optimizer] - 2 * sum(
        4 - ELEMENT_BYTES[dtype] for dtype in (config.optimizer.exp_avg_dtype, config.optimizer.exp_avg_sq_dtype))
    optimizer_s = partition * (state_bytes + ADAM_GRADIENT_READS * grad_element) / hardware.hbm_bandwidth

    # P_a+cpu: each micro-batch's checkpoints go to the host in forward and come back for the recompute.
    offload_s = micro_batches * 2 * plan.checkpoint_bytes["host"] / hardware.host_bandwidth

    # Pipeline stages: neighbours are TP x DP ranks apart, so they share a node only while that fits in one.
    bubble_s = (pp - 1) / chunks * (forward_s + backward_s)
    p2p_s = 0.0
    if stages is not None and stages.p2p_sent_bytes:
        p2p_crosses = tp * dp >= hardware.gpus_per_node
        p2p_s, _ = _collective_seconds(stages.p2p_sent_bytes, stages.p2p_message_bytes, p2p_crosses, hardware)

    # The tied word embedding's gradient summed over the first and last stage, after the passes and before the
    # step (Megatron's _allreduce_word_embedding_grads): one all-reduce, between ranks (P - 1) x TP x DP apart.
    embedding_s = 0.0
    embedding_bytes = plan.comm_bytes["embedding"]["all_reduce"]
    if stages is not None and embedding_bytes:
        embedding_crosses = (pp - 1) * tp * dp >= hardware.gpus_per_node
        embedding_s, _ = _collective_seconds(embedding_bytes, embedding_bytes, embedding_crosses, hardware)

    terms = {"compute": compute_s, "tp": tp_s, "dp_reduce_exposed": reduce_exposed,
             "dp_gather_exposed": gather_exposed, "optimizer": optimizer_s, "offload": offload_s}
    if stages is not None:
        terms.update(pipeline_bubble=bubble_s, pipeline_p2p=p2p_s, pipeline_embedding=embedding_s)
    iteration_s = sum(terms.values())
    model_flops = flops_per_iteration(model, run.batch.global_batch_size, activation_recompute=False,
                                      padded_vocab_size=run.padded_vocab_size)
    return Prediction(iteration_s=iteration_s, terms=terms,
                      model_tflops_per_gpu=model_flops / world_size / iteration_s / 1e12,
                      hardware_tflops_per_gpu=plan.flops_per_gpu / iteration_s / 1e12,
                      tp_crosses_nodes=tp_crosses, dp_crosses_nodes=dp_crosses)


def format_prediction(prediction: Prediction, hardware: Hardware, constants: Constants) -> str:
    lines = [f"predicted on {hardware.name} (constants from {constants.source}: GEMM efficiency "
             f"{constants.gemm_efficiency:.3f}, elementwise passes {constants.elementwise_passes:.1f}, "
             f"DP overlap {constants.dp_overlap:.2f}):",
             f"  iteration {prediction.iteration_s * 1e3:,.1f} ms"]
    for name, seconds in prediction.terms.items():
        share = seconds / prediction.iteration_s if prediction.iteration_s else 0.0
        lines.append(f"    {name:<18} {seconds * 1e3:>12,.1f} ms  {share:6.1%}")
    lines.append(f"  {prediction.hardware_tflops_per_gpu:.1f} TFLOP/s per GPU counting the recompute, "
                 f"{prediction.model_tflops_per_gpu:.1f} without (model FLOPs)")
    if prediction.tp_crosses_nodes:
        lines.append("  the TP group spans nodes: its collectives run at the inter-node bandwidth")
    return "\n".join(lines)
