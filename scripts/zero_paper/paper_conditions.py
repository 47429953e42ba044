"""The software the ZeRO paper ran on, as named conditions applied on top of a dry run: each one
quantity with its value, unit and source, acting on the stacks it names (torch-ddp, megatron-ddp, deepspeed-0.2,
deepspeed-0.1). `condition_plan` adds their bytes to a rank's plan, `condition_prediction` their time; the empty set
changes nothing. docs/zero-paper-2019-conditions.md lists them."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Optional

from arguments.config import ConfigError, PretrainConfig
from arguments.training_config import TrainingConfig
from gpt.model_config import ModelConfig
from memory_parts import held_parts
from planner.dry_run import RankPlan
from planner.perf_model import Constants, Hardware, Prediction, predict
from training.metrics import flops_per_iteration
from training.run_settings import resolve_run_settings
from zero.config import ActivationCheckpointConfig, ZeroConfig

MIB = 2**20
STACKS = ("torch-ddp", "megatron-ddp", "deepspeed-0.2", "deepspeed-0.1")
PHASES = ("budget", "outside", "persistent", "passes", "step", "time", "procedure")


@dataclass(frozen=True)
class Condition:
    """One named quantity of the 2019 software. `phase` says where it acts: the GPU's `budget`;
    memory `outside` the caching allocator; `persistent` bytes held all iteration; bytes alive in the
    forward/backward `passes` or in the `step` (after backward); `time` for the performance model; a
    measurement `procedure`. `stacks` are the software stacks it applies to (all when empty)."""
    name: str
    value: object
    unit: str
    phase: str
    source: str
    why: str
    stacks: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        """A condition is a quantity with a source: one without is refused, as is an unknown phase or stack."""
        for field_name in ("name", "unit", "source", "why"):
            if not str(getattr(self, field_name)).strip():
                raise ConfigError(f"condition {self.name or '?'}: no {field_name}; every condition names its "
                                  f"value's unit, its source and why it matters")
        if self.phase not in PHASES:
            raise ConfigError(f"condition {self.name}: phase {self.phase!r} is not one of {', '.join(PHASES)}")
        unknown = set(self.stacks) - set(STACKS)
        if unknown:
            raise ConfigError(f"condition {self.name}: unknown stacks {sorted(unknown)}; stacks are {', '.join(STACKS)}")

    def applies(self, stack: str) -> bool:
        return not self.stacks or stack in self.stacks

    def to_json(self) -> dict:
        data = dataclasses.asdict(self)
        data["stacks"] = list(self.stacks) or list(STACKS)
        return data


@dataclass(frozen=True)
class Fitted:
    """The one free parameter a profile may fit, and what it was fitted on (None: nothing fitted)."""
    name: str
    value: float
    unit: str
    fitted_on: str
    how: str
    command: str

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class ConditionSet:
    name: str
    base_profile: str                  # the scripts/zero_paper profile whose points and hardware it uses
    description: str
    conditions: tuple[Condition, ...] = ()
    fitted: Optional[Fitted] = None

    def __post_init__(self) -> None:
        names = [c.name for c in self.conditions]
        if len(set(names)) != len(names):
            raise ConfigError(f"condition set {self.name}: a condition is named twice")

    def get(self, name: str) -> Optional[Condition]:
        return next((c for c in self.conditions if c.name == name), None)

    def value(self, name: str, default: float = 0.0) -> float:
        condition = self.get(name)
        return default if condition is None else float(condition.value)

    def __bool__(self) -> bool:
        return bool(self.conditions)

    def to_json(self) -> dict:
        return {"name": self.name, "base_profile": self.base_profile, "description": self.description,
                "conditions": [c.to_json() for c in self.conditions],
                "fitted": self.fitted.to_json() if self.fitted else None}


def stack_for(stage: int, tensor_parallel_size: int) -> str:
    """The paper's software for a run of this stage and MP degree (the module docstring)."""
    if stage == 0:
        return "torch-ddp" if tensor_parallel_size == 1 else "megatron-ddp"
    if stage in (1, 2):
        return "deepspeed-0.2"
    raise ConfigError(f"the paper ran no ZeRO stage {stage} (stage 3 came after it)")


# ---- the dgx2-2019 conditions ---------------------------------------------------------------------

MEGATRON_2019 = "NVIDIA/Megatron-LM@93ab4bea59 (2019-09-12, the 'September 2019' Megatron-LM the paper names)"
DSE_MEGATRON = "microsoft/DeepSpeedExamples@405ce794 (2020-03-31) Megatron-LM/, DeepSpeed's copy of Megatron-LM for ZeRO-100B"
DEEPSPEED_02 = "microsoft/DeepSpeed v0.2.0 (96c4daab, 2020-06-12; its ZeRO code is PR #217 'ZeRO-2', f2ac7eaf, 2020-05-19)"
DEEPSPEED_01 = "microsoft/DeepSpeed@512a0d4d (2020-04-24, the last ZeRO-OS before ZeRO-2)"

DGX2_2019_CONDITIONS = (
    Condition(
        "device_memory", 32510 * MIB, "bytes", "budget",
        "nvidia-smi on a V100 32GB in 2020: '0MiB / 32510MiB' (deepspeedai/DeepSpeed issue #192, 2020-04-17, "
        "a DeepSpeed Megatron user on V100-SXM2-32GB); PyTorch reports the same card as '31.75 GiB total "
        "capacity' (deepspeedai/DeepSpeed issue #3312)",
        "what the driver gives a process, in place of the dgx2 profile's decimal 32e9 that stood in for "
        "everything a dry run cannot see; the rest of this list names those things"),
    Condition(
        "cuda_context", 1005 * MIB, "bytes", "outside",
        "pytorch/pytorch issue #28394 (2019-10, PyTorch 1.3, CUDA 10, Titan V, the GV100 chip of the V100): "
        "1008.19 MiB used after one small tensor against 0.94 MiB before, of which 2.0 MiB the caching "
        "allocator's; pytorch/pytorch #107667: before CUDA 11.7 every kernel loaded into the context, over 1000 MB",
        "the CUDA context with PyTorch's kernels, outside the caching allocator, on every process"),
    Condition(
        "attention_scores", 9, "bytes per attention score (b x heads/MP x s x s)", "passes",
        f"{DSE_MEGATRON} mpu/transformer.py GPT2ParallelSelfAttention.forward (the same lines in {MEGATRON_2019}): "
        "'attention_scores = torch.mul(attention_scores, ltor_mask) - 10000.0 * (1.0 - ltor_mask)', "
        "'torch.nn.Softmax(dim=-1)(attention_scores)', 'self.attention_dropout(attention_probs)', "
        "'torch.matmul(attention_probs, value_layer)'; the dropout mask is one byte (PyTorch 1.x "
        "aten/src/ATen/native/cuda/Dropout.cu fused_dropout_cuda: 'mask = at::empty_like(self, "
        "self.options().dtype(kByte))')",
        "the recomputed layer keeps the s x s scores for backward where flash attention keeps none: the "
        "fp16 scaled scores (the mask multiply saves them, 2 bytes), the softmax output (2), the dropout "
        "mask (1) and the dropout output (the context matmul saves it, 2), and while backward runs "
        "through them one fp16 gradient of the same shape (2): 9 bytes per score, one layer at a time "
        "(checkpoint-num-layers 1, the authors' sweeps)"),
    Condition(
        "loss_fp32_copies", 6, "bytes per logit (b x s x vocab/MP)", "passes",
        f"{DSE_MEGATRON} pretrain_gpt2.py forward_step: 'mpu.vocab_parallel_cross_entropy(output.contiguous()"
        ".float(), labels)'; mpu/cross_entropy.py _VocabParallelCrossEntropy.forward: 'logits = "
        f"vocab_parallel_logits.clone()', 'exp_logits = logits.exp()' (the same in {MEGATRON_2019})",
        "at the loss the fp16 logits (2 bytes), their fp32 copy (4), its fp32 clone (4) and the fp32 "
        "exponentials (4) are alive together: 14 bytes per logit, where the dry run counts 8 (the "
        "logits, the fp32 softmax and the logits' gradient)"),
    Condition(
        "fp32_master_gradients", 4, "bytes per parameter of the MP shard", "persistent",
        f"{MEGATRON_2019} fp16/fp16util.py model_grads_to_master_grads: 'if master.grad is None: master.grad "
        "= Variable(master.data.new(*master.data.size()))', 'master.grad.data.copy_(model.grad.data)'; "
        "fp16/fp16.py FP16_Optimizer.zero_grad zeroes them in place (set_grads_to_None=False)",
        "Megatron's FP16_Optimizer keeps an fp32 gradient for every master parameter across iterations: "
        "4 bytes per parameter all the time, where our stage 0 makes its fp32 gradient only in the step",
        ("torch-ddp", "megatron-ddp")),
    Condition(
        "ddp_bucket_copy", 2, "bytes per parameter", "persistent",
        "pytorch/pytorch PR #41954 (2020-08, in PyTorch 1.7: 'Make grad point to bucket buffer in DDP to save "
        "memory usage'; 'For roberta_base model with ~1GB parameters, peak memory dropped ~1GB'); the "
        "PyTorch 1.7 DDP documentation of gradient_as_bucket_view, off by default",
        "PyTorch 1.2-1.6 DDP copies every gradient into its all-reduce buckets, a second fp16 copy of the "
        "gradients held for the whole run",
        ("torch-ddp",)),
    Condition(
        "megatron_coalesced_allreduce", 2, "bytes per parameter of the MP shard", "step",
        f"{MEGATRON_2019} model/distributed.py allreduce_params: 'coalesced = _flatten_dense_tensors(grads)', "
        "'dist.all_reduce(coalesced, group=self.data_parallel_group)' over every fp16 gradient at once",
        "Megatron's own DDP flattens all gradients into one buffer after backward to all-reduce them",
        ("megatron-ddp",)),
    Condition(
        "stage1_flat_gradients", 2, "bytes per parameter of the MP shard, padded to the reduce bucket", "step",
        f"{DEEPSPEED_02} deepspeed/pt/zero_optimizer_stage1.py reduce_scatter_gradients: 'for rank in "
        "range(world_size): grad_sub_partitions, ... = self.get_flat_sub_partitions(...)' for every rank "
        "before the first 'dist.reduce_scatter'; deepspeed_light.py: 'Stage 1 only supports reduce scatter "
        "mode', max_elements_per_comm = the reduce bucket size (5e8 in the authors' sweeps)",
        "ZeRO-100B's stage 1 builds flat fp16 copies of every rank's gradient sub-partitions, the whole "
        "padded gradient, before it reduce-scatters them",
        ("deepspeed-0.2",)),
    Condition(
        "stage1_parameter_padding", 2, "bytes per padding element (to a multiple of the reduce bucket)",
        "persistent",
        f"{DEEPSPEED_02} deepspeed/pt/zero_optimizer_stage1.py flatten_dense_tensors_sub_partition_aligned: "
        "'aligned_comm_elements = num_comm_intervals * sub_partition_size * dp', 'pad_tensor = torch.zeros("
        "elements_to_add, ...)'",
        "stage 1's flat fp16 parameters are padded to whole communication intervals of the reduce bucket "
        "(up to 5e8 elements), and so are its flat gradient copies",
        ("deepspeed-0.2",)),
    Condition(
        "stage2_flat_fp16_gradient", 2, "bytes per parameter of the DP partition", "step",
        f"{DEEPSPEED_02} deepspeed/pt/deepspeed_zero_optimizer.py step: 'single_grad_partition = "
        "_flatten_dense_tensors(self.averaged_gradients[i]).to(self.single_partition_of_fp32_groups[i].dtype)'",
        "the step flattens the gradient partition in fp16 before its fp32 copy: both are alive at once",
        ("deepspeed-0.2", "deepspeed-0.1")),
    Condition(
        "zero_os_allreduce_bucket", 2, "bytes per element of the all-reduce bucket (up to 5e8 elements)", "step",
        f"{DEEPSPEED_01} deepspeed/pt/deepspeed_light.py: 'MEMORY_OPT_ALLREDUCE_SIZE = 500000000', "
        "allreduce_gradients -> buffered_allreduce_fallback(elements_per_buffer=bucket_size), allreduce_bucket: "
        "'tensor = flatten(bucket)'",
        "ZeRO-OS all-reduced the full gradients in flat fp16 buckets before its optimizer took its partition",
        ("deepspeed-0.1",)),
    Condition(
        "torch_ddp_overlap", 1.0, "fraction of the gradient all-reduce hidden behind backward", "time",
        "PyTorch's DDP design note (docs/source/notes/ddp.rst, 'written based on the state as of v1.4'): the "
        "reducer launches each bucket's asynchronous all-reduce as soon as backward fills it",
        "PyTorch DDP overlaps its bucketed all-reduce with backward by design (the performance model's "
        "DP_OVERLAP, 1.0, unchanged)",
        ("torch-ddp",)),
    Condition(
        "megatron_ddp_overlap", 0.0, "fraction of the gradient all-reduce hidden behind backward", "time",
        f"{MEGATRON_2019} model/distributed.py: the gradient hooks are commented out ('#    handle = "
        "param.register_hook(allreduce_hook)'); pretrain_gpt2.py backward_step calls "
        "model.allreduce_params(...) after loss.backward(), and allreduce_params ends with "
        "torch.cuda.synchronize()",
        "Megatron's own DDP all-reduces after backward: nothing overlaps",
        ("megatron-ddp",)),
    Condition(
        "deepspeed_overlap_comm", 0.0, "fraction of the gradient reduction hidden behind backward", "time",
        f"{DEEPSPEED_02} deepspeed/pt/deepspeed_zero_config.py: 'ZERO_OPTIMIZATION_OVERLAP_COMM_DEFAULT = False'; "
        "deepspeed_zero_optimizer.py average_tensor: 'stream = torch.cuda.current_stream()' unless overlap_comm; "
        f"{DSE_MEGATRON} scripts/ds_zero_stage_2_config.json (the hyperscale sweeps' config) sets no overlap_comm; "
        "stage 1 reduce-scatters after backward (deepspeed_light.py allreduce_gradients)",
        "ZeRO-100B reduced gradients on the compute stream: backward waits for every bucket",
        ("deepspeed-0.2", "deepspeed-0.1")),
    Condition(
        "attention_elementwise_traffic", 61, "bytes of HBM traffic per attention score per micro-batch", "time",
        f"{DSE_MEGATRON} mpu/transformer.py GPT2ParallelSelfAttention.forward (the lines of attention_scores "
        "above): the scale, the mask's multiply and subtract, the softmax and the dropout each read and write "
        "the s x s scores in fp16",
        "forward reads and writes each score in the scale (4 bytes), mask multiply (4), subtract (4), "
        "softmax (4) and dropout (4 + the 1-byte mask): 21; the recompute again: 21; backward through "
        "dropout (5), softmax (6), multiply (4) and scale (4): 19. The GEMMs' own traffic is already in "
        "the model; flash attention, which the calibration measured, does none of this"),
    Condition(
        "largest_model_sweep", "the 8192-wide models of Figures 2, 3 and 6-8: 50, 75, 100, 125, 150, 175, 187 "
        "and 212 layers (40B-170B)", "procedure", "procedure",
        f"{DSE_MEGATRON} scripts/ds_gpt_experiment_loop.sh: runs the rows of an experiment file in order, "
        "'grep \"CUDA out of memory\" ${deepscale_logfile}' then 'echo \"Found max model size, done.\"; "
        "break'; the sizes are the paper's (Table 4, Figures 6 and 8: 40B, 60B, 140B, 150B, 170B)",
        "Figure 6's largest model is the last size of a sweep that ran, not a continuous limit: the "
        "prediction is the largest size of the same sweep that fits (the continuous limit is shown beside it)"),
)

DGX2_2019 = ConditionSet(
    name="dgx2-2019", base_profile="dgx2",
    description="the paper's cluster (the dgx2 profile's 25 DGX-2 nodes of 16 V100 32GB) with the software "
                "the paper ran on: PyTorch 1.x, Megatron-LM (September 2019) and DeepSpeed 0.1-0.2",
    conditions=DGX2_2019_CONDITIONS)
NO_CONDITIONS = ConditionSet(name="none", base_profile="", description="this repository's code, as planned")
CONDITION_SETS = {"dgx2-2019": DGX2_2019}


# ---- memory ---------------------------------------------------------------------------------------

def _padded(elements: int, bucket: int, data_parallel: int) -> int:
    """DeepSpeed 0.2 stage 1's flat length: whole communication intervals of (bucket // dp) x dp."""
    bucket = min(bucket, elements)
    interval = max(1, bucket // data_parallel) * data_parallel
    return math.ceil(elements / interval) * interval


def condition_terms(plan: RankPlan, model: ModelConfig, training: TrainingConfig, zero: ZeroConfig,
                    activations: ActivationCheckpointConfig, conditions: ConditionSet,
                    stack: Optional[str] = None) -> dict[str, tuple[str, int]]:
    """{condition name: (phase, bytes)} that `conditions` add to `plan`, a dry run of `config`, under
    `stack` (by default the stack of the plan's stage and MP degree)."""
    if not conditions:
        return {}
    stack = stack or stack_for(plan.stage, plan.tensor_parallel_size)
    tp, dp = plan.tensor_parallel_size, plan.data_parallel_size
    psi = plan.parameters_local
    micro, seq = training.micro_batch_size, model.seq_length
    scores = micro * (model.num_attention_heads // tp) * seq * seq
    bucket = int(zero.reduce_bucket_size)
    terms: dict[str, tuple[str, int]] = {}

    def add(name: str, bytes_: float) -> None:
        condition = conditions.get(name)
        if condition is not None and condition.applies(stack) and bytes_:
            terms[name] = (condition.phase, int(bytes_))

    add("cuda_context", conditions.value("cuda_context"))
    if activations.checkpoint_activations:  # one recomputed layer at a time
        add("attention_scores", conditions.value("attention_scores") * scores)
    else:  # every layer keeps its saved scores (7 of the 9 bytes); one gradient in flight
        per_score = conditions.value("attention_scores")
        add("attention_scores", ((per_score - 2) * model.num_layers + 2) * scores)
    add("loss_fp32_copies", conditions.value("loss_fp32_copies") * plan.loss_softmax_bytes / 4)
    add("fp32_master_gradients", conditions.value("fp32_master_gradients") * psi)
    add("ddp_bucket_copy", conditions.value("ddp_bucket_copy") * psi)
    add("megatron_coalesced_allreduce", conditions.value("megatron_coalesced_allreduce") * psi)
    if plan.stage == 1 and stack == "deepspeed-0.2":
        padded = _padded(psi, bucket, dp)
        add("stage1_flat_gradients", conditions.value("stage1_flat_gradients") * padded)
        add("stage1_parameter_padding", conditions.value("stage1_parameter_padding") * (padded - psi))
    if plan.stage == 2 or stack == "deepspeed-0.1":
        add("stage2_flat_fp16_gradient", conditions.value("stage2_flat_fp16_gradient") * math.ceil(psi / dp))
    add("zero_os_allreduce_bucket", conditions.value("zero_os_allreduce_bucket") * min(bucket, psi))
    return terms


def condition_plan(plan: RankPlan, model: ModelConfig, training: TrainingConfig, zero: ZeroConfig,
                   activations: ActivationCheckpointConfig, conditions: ConditionSet,
                   stack: Optional[str] = None) -> RankPlan:
    """`plan` with the memory of `conditions` (a copy; `plan` itself is untouched): its total, budget
    and headroom recomputed, and one note per term. The total is the dry run's, in its two phases
    (planner/dry_run.py: what is held throughout, M_D's checkpoints among it, plus the larger of the
    passes and the step), with each term in its phase. Under the stage-0 stacks the step's fp32 gradient is Megatron's persistent
    fp32 master gradient (`fp32_master_gradients`), so the dry run's step copy is not counted twice."""
    if not conditions:
        return plan
    stack = stack or stack_for(plan.stage, plan.tensor_parallel_size)
    terms = condition_terms(plan, model, training, zero, activations, conditions, stack)
    # held as the dry run holds it, M_D's contiguous checkpoints included: saved_activation_bytes leaves them out
    held = sum(held_parts(plan))
    passes = (plan.stage3_live_chunk_bytes + plan.saved_activation_bytes["device"] + plan.logits_bytes
              + plan.gradient_working_bytes + plan.parameter_gradient_bytes + plan.transport_copy_bytes["passes"])
    extra = {phase: sum(b for p, b in terms.values() if p == phase) for phase in ("outside", "persistent", "passes")}
    flat_fp16 = terms.get("stage2_flat_fp16_gradient", ("step", 0))[1]
    # The step phase: what is alive after backward beside the model states, the larger of a flat
    # gradient copy made for the reduction and the optimizer step's own temporaries.
    if "fp32_master_gradients" in terms:  # the dry run's step copy is Megatron's persistent fp32 gradient
        step = terms.get("megatron_coalesced_allreduce", ("step", 0))[1]
    elif stack == "deepspeed-0.2" and plan.stage == 1:
        step = max(plan.step_working_bytes, terms.get("stage1_flat_gradients", ("step", 0))[1])
    else:  # the fp16 flatten beside the fp32 copy the dry run counts; ZeRO-OS's all-reduce bucket before
        step = max(plan.step_working_bytes + flat_fp16, terms.get("zero_os_allreduce_bucket", ("step", 0))[1])
    total = extra["outside"] + held + extra["persistent"] + max(passes + extra["passes"], step)
    budget = int(conditions.value("device_memory", plan.budget_bytes or 0)) if conditions.get("device_memory") \
        else plan.budget_bytes
    notes = list(plan.notes) + [f"{conditions.name}: {name} ({phase}) {bytes_:,} bytes"
                                for name, (phase, bytes_) in terms.items()]
    return dataclasses.replace(plan, total_bytes=total, budget_bytes=budget,
                               headroom_bytes=None if budget is None else budget - total, notes=notes,
                               unknowns=list(plan.unknowns))


# ---- time -----------------------------------------------------------------------------------------

def condition_constants(constants: Constants, conditions: ConditionSet, stack: str) -> Constants:
    """The performance model's constants under `conditions`: DP_OVERLAP from the stack's own overlap."""
    for name in ("torch_ddp_overlap", "megatron_ddp_overlap", "deepspeed_overlap_comm"):
        condition = conditions.get(name)
        if condition is not None and condition.applies(stack):
            return dataclasses.replace(constants, dp_overlap=float(condition.value),
                                       source=f"{constants.source}; DP_OVERLAP from {conditions.name} {name}")
    return constants


def condition_prediction(plan: RankPlan, config: PretrainConfig, vocab_size: int, world_size: int,
                         hardware: Hardware, constants: Constants, conditions: ConditionSet,
                         stack: Optional[str] = None) -> Prediction:
    """planner.perf_model.predict under `conditions`: the stack's DP overlap, and the 2019 attention's
    elementwise traffic as one more term. The empty set returns `predict`'s prediction unchanged."""
    if not conditions:
        return predict(plan, config, vocab_size, world_size, hardware, constants)
    stack = stack or stack_for(plan.stage, plan.tensor_parallel_size)
    prediction = predict(plan, config, vocab_size, world_size, hardware,
                         condition_constants(constants, conditions, stack))
    traffic = conditions.value("attention_elementwise_traffic")
    if not traffic:
        return prediction
    tp, dp = plan.tensor_parallel_size, plan.data_parallel_size
    run = resolve_run_settings(config, vocab_size, tp, dp)
    model = run.config.model
    scores = run.config.training.micro_batch_size * (model.num_attention_heads // tp) * model.seq_length ** 2
    attention_s = (traffic * scores * model.num_layers * run.batch.final_accumulation_steps
                   / hardware.hbm_bandwidth)
    terms = dict(prediction.terms, attention_2019=attention_s)
    iteration_s = sum(terms.values())
    model_flops = flops_per_iteration(model, run.batch.global_batch_size, activation_recompute=False,
                                      padded_vocab_size=run.padded_vocab_size)
    return dataclasses.replace(prediction, iteration_s=iteration_s, terms=terms,
                               model_tflops_per_gpu=model_flops / world_size / iteration_s / 1e12,
                               hardware_tflops_per_gpu=plan.flops_per_gpu / iteration_s / 1e12)

