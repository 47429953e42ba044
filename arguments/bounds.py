"""Bounds before work: every size, count and timeout against what this machine and the model can hold. Each estimate
(sample index, largest tensor, 16-bit parameters fully sharded, c10d timeout) is a lower bound of what the run needs, so
a refusal here is a run that could never start, never a guess."""

from __future__ import annotations

import os
from typing import Optional

from arguments.resiliency_bounds import check_launch_bounds
from base.errors import ConfigError
from base.options import flag_of, option_fields, setting_value
from base.waits import LONGEST_WAIT_S

INT64_MAX = 2**63 - 1
# Megatron's index arrays: two int32 and one int64 per sample.
INDEX_BYTES_PER_SAMPLE = 16
MIN_PARAMETER_BYTES = 2
ACTIVATION_BYTES = 2
FP32_BYTES = 4
# Beyond a year a timeout is none; below a few seconds the rendezvous itself times out on a loaded machine.
MAX_TIMEOUT_MINUTES = LONGEST_WAIT_S // 60
MIN_TIMEOUT_MINUTES = 5 / 60


def host_memory_bytes() -> int:
    """Physical memory (os.sysconf), or int64's maximum where the system will not say."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return INT64_MAX


def rank_memory_bytes() -> int:
    """The most one rank could hold, taken as the host's memory: querying an accelerator would initialise CUDA on device
    0 in every rank (a bound, not a budget)."""
    return host_memory_bytes()


def world_size_from_environment() -> int:
    """WORLD_SIZE or SLURM_NTASKS, else 1; malformed values count as 1 (the launcher checks report them)."""
    for name in ("WORLD_SIZE", "SLURM_NTASKS"):
        value = os.environ.get(name, "")
        if value.isdigit() and int(value) >= 1:
            return int(value)
    return 1


def gib(size: float) -> str:
    return f"{size / 2**30:.3g} GiB"


def check_int64(config) -> None:
    """Every whole-number setting fits an int64, as numpy and torch hold them."""
    for section in config.SECTIONS:
        for f, _ in option_fields(type(getattr(config, section))):
            value = setting_value(getattr(config, section), f.name)
            values = value if isinstance(value, list) else [value]
            for item in values:
                if isinstance(item, int) and not isinstance(item, bool) and not -INT64_MAX <= item <= INT64_MAX:
                    raise ConfigError(f"{flag_of(f)} {item} does not fit a 64-bit integer", flags=(flag_of(f),))


def sample_count(training) -> int:
    """Samples the train, validation and test indexes would hold, sized as Megatron sizes them."""
    batch = training.global_batch_size
    train = training.train_samples if training.train_samples is not None else (training.train_iters or 0) * batch
    train_iters = training.train_iters if training.train_iters is not None else train // max(batch, 1)
    evaluations = train_iters // max(training.eval_interval, 1) + 1
    return train + training.eval_batches * batch * (evaluations + 1)


def largest_tensor(config, vocab_size: Optional[int] = None) -> tuple[int, str, tuple[str, ...]]:
    """(elements, what, the flags that size it) of the largest single tensor a rank creates; `vocab_size` is the
    tokenizer's where --vocab-size is 0."""
    model, training = config.model, config.training
    vocab = vocab_size or model.vocab_size
    tp = max(config.parallel.tensor_model_parallel_size, 1)
    hidden, seq, micro = model.hidden_size, model.seq_length, training.micro_batch_size
    ffn = model.ffn_size
    candidates = [
        (ffn * hidden // tp, "one MLP weight (--ffn-hidden-size x --hidden-size / TP)",
         ("--ffn-hidden-size", "--hidden-size")),
        (vocab * hidden // tp, "the word embedding (--vocab-size x --hidden-size / TP)",
         ("--vocab-size", "--hidden-size")),
        (seq * hidden, "the position embedding (--seq-length x --hidden-size)", ("--seq-length", "--hidden-size")),
        (micro * seq * ffn // tp, "one micro batch's MLP activation (--micro-batch-size x --seq-length x "
                                  "--ffn-hidden-size / TP)",
         ("--micro-batch-size", "--seq-length", "--ffn-hidden-size")),
        (micro * seq * vocab // tp, "one micro batch's logits (--micro-batch-size x --seq-length x "
                                               "--vocab-size / TP)",
         ("--micro-batch-size", "--seq-length", "--vocab-size")),
    ]
    return max(candidates)


def parameter_lower_bound(model) -> tuple[int, tuple[str, ...]]:
    """(parameters the model has at least, the flags that size them): each block's attention and MLP (or smallest MoE
    layer), the MTP layers and the word embedding, computed without a per-layer list so 10^12 layers cost nothing."""
    hidden = model.hidden_size
    ffn = model.ffn_size
    flags = ["--num-layers", "--hidden-size"]
    attention = 4 * hidden * hidden
    if model.mla.multi_latent_attention:
        heads, q_head = model.num_attention_heads, model.mla.qk_head_dim + model.mla.qk_pos_emb_head_dim
        query = heads * q_head * (hidden if model.mla.q_lora_rank is None else model.mla.q_lora_rank) + \
            hidden * (model.mla.q_lora_rank or 0)
        key_value = hidden * (model.mla.kv_lora_rank + model.mla.qk_pos_emb_head_dim) + \
            model.mla.kv_lora_rank * heads * (model.mla.qk_head_dim + model.mla.v_head_dim)
        mla = query + key_value + heads * model.mla.v_head_dim * hidden
        # a pattern mixing `*` layers among `+` ones: each at least the smaller mixer
        attention = min(mla, attention) if "*" in (model.hybrid_layer_pattern or "") else mla
        flags += ["--q-lora-rank", "--kv-lora-rank", "--qk-head-dim", "--qk-pos-emb-head-dim", "--v-head-dim"]
    dense = attention + 2 * ffn * hidden
    moe_layers, experts = _moe_layers_and_experts(model)
    layer = dense
    if moe_layers:
        width = model.experts.ffn_hidden_size if model.experts.ffn_hidden_size is not None else ffn
        shared = model.experts.shared_expert_intermediate_size or 0
        moe = attention + experts * 2 * width * hidden + 2 * shared * hidden
        layer = min(dense, moe)
        flags += ["--num-experts", "--moe-ffn-hidden-size"]
    total = (model.num_layers - moe_layers) * dense + moe_layers * (moe if moe_layers else 0)
    if model.mtp.num_layers > 0:
        total += model.mtp.num_layers * (layer + 2 * hidden * hidden)
        flags.append("--mtp-num-layers")
    if model.vocab_size:  # 0 leaves the vocabulary to the tokenizer
        total += model.vocab_size * hidden
        flags.append("--vocab-size")
    return total, tuple(flags)


def _moe_layers_and_experts(model) -> tuple[int, int]:
    """(how many layers are MoE layers, the fewest experts one has); (0, 1) for a dense model."""
    counts = model.experts.num_experts if isinstance(model.experts.num_experts, tuple) else (model.experts.num_experts or 1,)
    experts = min(counts)
    if max(counts) <= 1:
        return 0, 1
    if model.experts.deepspeed.gating == "deepspeed":
        return model.num_layers // max(model.experts.deepspeed.expert_interval, 1), max(experts, 1)
    freq = model.experts.layer_freq
    if isinstance(freq, int):
        return -(-model.num_layers // abs(freq)), experts  # -N places as N, as Megatron-LM's %
    return str(freq).count("1"), experts


def check_bounds(config) -> None:
    """What no machine could run: whole numbers within int64, c10d's timeout range, and no tensor whose fp32 bytes
    overflow torch's storage size (an error even on the meta device)."""
    check_int64(config)
    minutes = config.training.faults.distributed_timeout_minutes
    if not MIN_TIMEOUT_MINUTES <= minutes <= MAX_TIMEOUT_MINUTES:
        raise ConfigError(f"--distributed-timeout-minutes must be between {MIN_TIMEOUT_MINUTES:.3g} (5 seconds) and "
                          f"{MAX_TIMEOUT_MINUTES} (a year), got {minutes:g}", flags=("--distributed-timeout-minutes",))
    check_tensor_sizes(config)


def check_tensor_sizes(config, vocab_size: Optional[int] = None) -> None:
    """No tensor whose fp32 bytes overflow torch's storage size; the dry run calls it again with the vocabulary it plans
    for."""
    elements, what, flags = largest_tensor(config, vocab_size)
    if elements * FP32_BYTES > INT64_MAX:
        raise ConfigError(f"{what} would be {elements:.3g} elements, beyond what a tensor can address (2**63 bytes): "
                          f"lower those sizes", flags=flags)


def check_machine_bounds(config, world_size: Optional[int] = None, memory: Optional[int] = None,
                         host_memory: Optional[int] = None) -> None:
    """Refuse a training run this machine could not hold, before the data index or the model is built. The machine's
    figures can be passed explicitly for a test."""
    training, model = config.training, config.model
    host_memory = host_memory_bytes() if host_memory is None else host_memory
    memory = rank_memory_bytes() if memory is None else memory
    world_size = world_size_from_environment() if world_size is None else world_size
    elements, what, flags = largest_tensor(config)  # the tokenizer's vocabulary is not loaded yet
    if elements * ACTIVATION_BYTES > memory:
        raise ConfigError(f"{what} would be {elements:.3g} elements ({gib(elements * ACTIVATION_BYTES)} in 16 bits), "
                          f"more than one rank here can hold ({gib(memory)}): lower those sizes", flags=flags)
    check_parameters_fit(model, world_size, memory)
    check_launch_bounds(training, world_size, host_memory)
    samples = sample_count(training)
    if samples * INDEX_BYTES_PER_SAMPLE > host_memory:
        raise ConfigError(f"--train-iters/--train-samples, --global-batch-size and --eval-iters ask for {samples:.3g} "
                          f"samples, whose index needs at least {gib(samples * INDEX_BYTES_PER_SAMPLE)} of host "
                          f"memory; this machine has {gib(host_memory)}: lower them",
                          flags=("--train-iters", "--train-samples", "--global-batch-size", "--eval-iters"))


def check_parameters_fit(model, world_size: int, memory: int, ranks: str = "rank(s)") -> None:
    """Refuse a model whose parameters alone (2 bytes each) overflow `world_size` ranks of `memory` bytes even fully
    sharded."""
    parameters, sized_by = parameter_lower_bound(model)
    if parameters * MIN_PARAMETER_BYTES > memory * world_size:
        sizes = [f"{flag} {_setting_text(model, flag)}" for flag in sized_by if _setting_text(model, flag) is not None]
        sizes = ", ".join(sizes[:-1]) + f" and {sizes[-1]}"
        raise ConfigError(f"{sizes} make at least {parameters:.3g} parameters ({gib(parameters * MIN_PARAMETER_BYTES)} "
                          f"in 16 bits), more than {world_size} {ranks} of {gib(memory)} can hold even fully sharded: "
                          f"lower them", flags=sized_by)


def _setting_text(model, flag: str) -> Optional[str]:
    value = setting_value(model, flag.lstrip("-").replace("-", "_"))
    if value is None:
        return None
    return " ".join(map(str, value)) if isinstance(value, tuple) else str(value)
