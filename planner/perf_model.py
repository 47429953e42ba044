"""Iteration time and TFLOP/s per GPU, predicted from a dry run on a hardware profile: GEMMs at GEMM_EFFICIENCY of the
peak plus their HBM traffic, memory-bound kernels, Adam, TP and DP traffic, offload and the pipeline, with three
constants from a calibration file."""

from __future__ import annotations

import dataclasses
import math
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

import yaml

from arguments.config import ConfigError, PretrainConfig
from arguments.training_config import TrainingConfig
from gpt.hybrid_pattern import parse_hybrid_pattern
from gpt.layer_spec import mixer_symbols
from gpt.model_config import ModelConfig
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
# Adam's bytes per partition element beside the gradient
ADAM_STATE_BYTES = 24 + 2
ADAM_GRADIENT_READS = 2
STATE_BYTES = {"adam": ADAM_STATE_BYTES, "ademamix": ADAM_STATE_BYTES + 8, "muon": ADAM_STATE_BYTES,
               "sophiag": ADAM_STATE_BYTES}
# about 3 fp32 copies of the logits: softmax written, read back, gradient written
LOSS_SOFTMAX_PASSES = 3


@dataclass(frozen=True)
class Hardware:
    """One GPU (or CPU process) and its links. Bandwidths in bytes/s per GPU and direction."""
    name: str
    gpus_per_node: int
    gpu_memory_bytes: int
    peak_flops: float
    hbm_bandwidth: float
    intra_node_bandwidth: float
    inter_node_bandwidth: float
    host_bandwidth: float
    intra_node_latency_s: float
    inter_node_latency_s: float
    precision: str
    device_type: str
    calibration: str
    fp8_peak_flops: Optional[float] = None
    layout_calibration: Optional[str] = None
    cores_per_node: Optional[int] = None
    # seconds the host takes to issue one layer's passes per micro-batch; None: not measured
    host_forward_s_per_layer: Optional[float] = None
    host_backward_s_per_layer: Optional[float] = None


@dataclass(frozen=True)
class Constants:
    gemm_efficiency: float
    elementwise_passes: float  # elements moved per b*s*h per layer per pass
    dp_overlap: float
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
    iteration_s: float
    terms: dict[str, float]  # compute, tp, dp_reduce_exposed, dp_gather_exposed, optimizer, offload,
                                         # and with pipeline stages pipeline_bubble, pipeline_p2p
    model_tflops_per_gpu: float
    hardware_tflops_per_gpu: float
    tp_crosses_nodes: bool
    dp_crosses_nodes: bool

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


def gemm_peak_flops(hardware: Hardware, fp8: bool, fp8_peak_flops: Optional[float] = None) -> float:
    """The dense tensor-core peak a GEMM runs at: FP8's (twice the 16-bit one by default) or 16-bit."""
    return (fp8_peak_flops or 2 * hardware.peak_flops) if fp8 else hardware.peak_flops


@dataclass(frozen=True)
class Gemm:
    m: int
    k: int
    n: int
    count: int
    fp8: bool = False

    @property
    def flops(self) -> float:
        return 2.0 * self.m * self.k * self.n * self.count


def forward_gemms(model: ModelConfig, training: TrainingConfig, padded_vocab: int, tp: int,
                  mixers: Optional[Sequence[Optional[str]]] = None,
                  mlps: Optional[Sequence[Optional[str]]] = None) -> tuple[list[Gemm], Gemm]:
    """One TP rank's matrix products in one micro-batch's forward: the blocks' in order, then the logits'."""
    micro = training.micro_batch_size
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
        blocks += _block_gemms(matmuls, model, micro, count, fp8_layers * count // layers)
    logits = shape.output_matmul(padded_vocab)
    return blocks, Gemm(micro * model.seq_length, logits.in_features, logits.out_features, 1)


def block_kinds(model, stage: slice) -> tuple[Optional[Sequence[Optional[str]]], Optional[Sequence[Optional[str]]]]:
    """The blocks' mixers and MLPs where they differ from the probe block; (None, None) where alike."""
    if model.hybrid_layer_pattern is not None:
        return mixer_symbols(model)[stage], parse_hybrid_pattern(model.hybrid_layer_pattern).mlps()[stage]
    if model.gdn.gated_delta_net:
        return mixer_symbols(model)[stage], None
    return None, None


def _block_gemms(matmuls, model, micro: int, layers: int, fp8_layers: int) -> list[Gemm]:
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
        elif matmul.value_head_dim is None:
            blocks.append(Gemm(s, matmul.head_dim, s, 2 * matmul.heads * micro * layers))
        else:
            blocks += [Gemm(s, matmul.head_dim, s, matmul.heads * micro * layers),
                       Gemm(s, s, matmul.value_head_dim, matmul.heads * micro * layers)]
    return blocks


def layers_in_fp8(model, layers: int) -> int:
    """How many of `layers` blocks run their linears in FP8."""
    fp8 = model.fp8
    if not fp8.enabled:
        return 0
    if not fp8.first_last_layers_bf16:
        return layers
    return max(0, layers - fp8.num_layers_at_start_in_bf16 - fp8.num_layers_at_end_in_bf16)


def gemm_seconds(gemms: Sequence[Gemm], element_bytes: int, hardware: Hardware, constants: Constants) -> float:
    """Each product at GEMM_EFFICIENCY plus its HBM traffic: the achieved fraction is 1 / (1/E + peak x bytes / (flops x
    HBM)), so thin GEMMs fall off the peak."""
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
    """Ring time for `bytes_sent` and the calls it took."""
    if bytes_sent <= 0:
        return 0.0, 0
    bandwidth, latency = _bandwidth(crosses_nodes, hardware)
    calls = max(1, math.ceil(bytes_sent / max(bytes_per_call, 1.0)))
    return bytes_sent / bandwidth + calls * latency, calls


def predict(plan: RankPlan, config: PretrainConfig, vocab_size: int, world_size: int, hardware: Hardware,
            constants: Constants) -> Prediction:
    tp, dp = plan.tensor_parallel_size, plan.data_parallel_size
    run = resolve_run_settings(config, vocab_size, tp, dp)
    config, micro_batches = run.config, run.batch.final_accumulation_steps
    model = config.model
    element = ELEMENT_BYTES[config.training.precision]
    grad_element = ELEMENT_BYTES[config.training.gradient_precision]

    stages = plan.pipeline
    recompute = recomputed_share(config.activations, config.model, config.parallel,
                                 stages.pipeline_parallel_rank if stages is not None else None)
    pp, chunks = (stages.pipeline_parallel_size, stages.chunks) if stages is not None else (1, 1)
    layers = model.num_layers // pp
    rank = stages.pipeline_parallel_rank if stages is not None else 0
    mixers, mlps = block_kinds(model, slice(rank * layers, (rank + 1) * layers))
    if mixers is not None:  # each block by its own mixer: this rank's share of the even split
        blocks, logits = forward_gemms(config.model, config.training, run.padded_vocab_size, tp, mixers, mlps)
    else:
        blocks, logits = forward_gemms(model.with_layers(layers), config.training, run.padded_vocab_size, tp)
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

    # TP ranks are consecutive, DP ranks strided by TP
    tp_crosses = tp > hardware.gpus_per_node
    tp_bytes = sum(plan.comm_bytes["tp"].values())
    activation_call = ring_bytes_sent("all_reduce", tokens_hidden * element, tp)
    tp_s, _ = _collective_seconds(tp_bytes, activation_call, tp_crosses, hardware)

    dp_crosses = world_size > hardware.gpus_per_node
    dp_bytes = plan.comm_bytes["dp"]
    bucket_bytes = config.zero.reduce_bucket_size * grad_element
    reduce_kind = "all_reduce" if plan.stage == 0 or not config.zero.reduce_scatter else "reduce_scatter"
    reduce_s, reduce_calls = _collective_seconds(dp_bytes["reduce_scatter"] + dp_bytes["all_reduce"],
                                                 ring_bytes_sent(reduce_kind, bucket_bytes, dp), dp_crosses, hardware)
    reductions = micro_batches if plan.stage >= 2 else 1
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

    partition = plan.parameters_local if plan.stage == 0 else math.ceil(plan.parameters_local / dp)
    # a bf16 moment moves 4 bytes, not 8
    state_bytes = STATE_BYTES[config.optimizer.optimizer] - 2 * sum(
        4 - ELEMENT_BYTES[dtype] for dtype in (config.optimizer.algorithms.exp_avg_dtype,
                                               config.optimizer.algorithms.exp_avg_sq_dtype))
    optimizer_s = partition * (state_bytes + ADAM_GRADIENT_READS * grad_element) / hardware.hbm_bandwidth

    offload_s = micro_batches * 2 * plan.checkpoint_bytes["host"] / hardware.host_bandwidth

    bubble_s = (pp - 1) / chunks * (forward_s + backward_s)
    p2p_s = 0.0
    if stages is not None and stages.p2p_sent_bytes:
        p2p_crosses = tp * dp >= hardware.gpus_per_node
        p2p_s, _ = _collective_seconds(stages.p2p_sent_bytes, stages.p2p_message_bytes, p2p_crosses, hardware)

    # the tied embedding's gradient all-reduced between first and last stage
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
