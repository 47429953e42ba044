"""The one shrink the replay corpus goes through: tiny sizes and local paths, every other flag and JSON key as written.
- model sizes: --num-layers 2, --hidden-size 32, --num-attention-heads 2 and what follows in the script's proportions
  (--ffn-hidden-size, --moe-ffn-hidden-size, --moe-shared-expert-intermediate-size rounded up to a multiple of the new
  TP size; --kv-channels even, its --rotary-percent share even too; MLA's --q-lora-rank and --kv-lora-rank in
  proportion to the hidden size, its head widths to the head's, even; --num-key-value-heads / --num-query-groups whole
  per TP rank), --seq-length 16 (positions in proportion; --goldfish-h at most 16), --pad-vocab-size-to just above the
  local vocabulary, a NullTokenizer's --vocab-size the local vocabulary; interleaved stages one layer a chunk, an
  uneven end stage one layer; a --moe-layer-freq list of runs or per-layer entries shrinks with the layers (else
  --num-layers stays); a --num-experts pyramid its first and last,
  more than 16 experts the fewest from 16 up that the new EP size and the router's groups divide (`fewest_experts`);
- parallel sizes the 2 ranks cannot hold (4 ranks where 2 stages of 1 would leave DeepEP the TP x EP of 1 it asserts
  against: `ranks_for`): PP above 2 becomes 2, then CP, TP (1 where optimizer instances need DP ranks) and EP to what
  the ranks leave, in that order; expert TP kept where it divides a stage's ranks, else their gcd;
- batch sizes alike on both sides: every micro-batch number (flags or JSON, given or derived) through one map (1 stays
  1, the others 2, 3, ... in order), accumulation numbers through another (a multiple of the stages under interleaving),
  global batch = micro x accumulation x new DP, so agreements and contradictions between script and JSON survive; a
  ramp starts at one micro batch per rank; a step schedule keeps its thresholds, its batches 1, 2, 3, ... x the global;
- lengths: --train-iters 3 (--train-samples / --train-tokens what 3 iterations consume), schedules keep their share
  (at least 1; 0 stays 0), fractions stay; intervals: --log-interval and steps_per_print through one map,
  --save-interval and --eval-interval 1 or 2, --eval-iters 1 (0 stays 0; added where left to the default of 100);
- paths: data prefixes the local corpus (weights stay), tokenizer files the local tokenizer's, save/load/TensorBoard/
  W&B/cache directories folders under `out_dir`, the JSON and split-list files there; a GPT2BPETokenizer left to download
  gets --vocab-file and --merge-file. Anything else is kept token for token, including flags this project does not know."""

from __future__ import annotations

import itertools
import json
import math
import os
import re
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Optional

from data.sentencepiece_tokenizer import SENTENCEPIECE_MODEL_FILE, SENTENCEPIECE_TYPES
from tests.replay_corpus.launch import Launch

WORLD_SIZE = 2
ITERATIONS = 3
TINY = {"--num-layers": 2, "--hidden-size": 32, "--num-attention-heads": 2, "--seq-length": 16}

TENSOR_PARALLEL = ("--tensor-model-parallel-size", "--model-parallel-size")
MOE_WIDTHS = ("--moe-ffn-hidden-size", "--moe-shared-expert-intermediate-size")
MLA_RANKS = ("--q-lora-rank", "--kv-lora-rank")  # the latent widths, compressions of the hidden state
MLA_HEAD_WIDTHS = ("--qk-head-dim", "--qk-pos-emb-head-dim", "--v-head-dim")  # widths a head of each
PIPELINE_PARALLEL = ("--pipeline-model-parallel-size", "--pipe-parallel-size")
CONTEXT_PARALLEL = ("--context-parallel-size", "--ds-sequence-parallel-size")
HIERARCHICAL_CONTEXT_PARALLEL = ("--hierarchical-context-parallel-sizes",)
EXPERT_PARALLEL = ("--expert-model-parallel-size", "--moe-expert-parallel-size")
EXPERT_TENSOR_PARALLEL = ("--expert-tensor-parallel-size",)
MICRO_BATCH = ("--micro-batch-size", "--batch-size")
ACCUMULATION = ("--gradient-accumulation-steps", "--num-microbatches-in-minibatch", "--gas")
JSON_CONFIG = ("--deepspeed_config", "--deepspeed-config")
CHECKPOINT_DIRS = ("--save", "--load")
DIRECTORIES = {"--tensorboard-dir": "tensorboard", "--cache-dir": "cache", "--codecarbon-dir": "codecarbon",
               "--data-cache-path": "data-cache", "--trigger-path": "triggers", "--wandb-save-dir": "wandb"}
SCHEDULE_ITERS = ("--lr-decay-iters", "--lr-warmup-iters")
SCHEDULE_SAMPLES = ("--lr-decay-samples", "--lr-warmup-samples")
SCHEDULE_TOKENS = ("--lr-decay-tokens", "--lr-warmup-tokens")
WEIGHTED_SPLITS = ("--train-weighted-split-paths-path", "--valid-weighted-split-paths-path")
DATA = ("--data-path", "--train-data", "--train-data-path", "--valid-data-path", "--test-data-path")
DATA_FILE_LISTS = ("--data-file-list",)
TOKENIZER_FILES = ("--vocab-file", "--merge-file", "--tokenizer-name-or-path", "--tokenizer-model")

# Every flag whose values the shrink may change; any other flag keeps its values token for token.
CHANGED_FLAGS = frozenset({
    *TINY, "--ffn-hidden-size", *MOE_WIDTHS, "--kv-channels", *MLA_RANKS, *MLA_HEAD_WIDTHS, "--num-key-value-heads",
    "--num-query-groups",
    "--num-layers-per-virtual-pipeline-stage", "--decoder-first-pipeline-num-layers",
    "--decoder-last-pipeline-num-layers", "--microbatch-group-size-per-virtual-pipeline-stage",
    "--num-distributed-optimizer-instances",
    "--max-position-embeddings", "--encoder-seq-length", "--decoder-seq-length", "--pad-vocab-size-to", "--vocab-size",
    "--goldfish-h",
    *TENSOR_PARALLEL, *PIPELINE_PARALLEL, *CONTEXT_PARALLEL, *HIERARCHICAL_CONTEXT_PARALLEL, *EXPERT_PARALLEL, *EXPERT_TENSOR_PARALLEL, *MICRO_BATCH,
    "--global-batch-size", *ACCUMULATION, "--rampup-batch-size", "--step-batch-size-schedule", "--train-iters",
    "--train-samples",
    "--train-tokens", *SCHEDULE_ITERS, *SCHEDULE_SAMPLES, *SCHEDULE_TOKENS, "--log-interval", "--save-interval",
    "--eval-interval", "--eval-iters", *DATA, *TOKENIZER_FILES, *CHECKPOINT_DIRS, *DIRECTORIES,
    "--kill-switch-path", *WEIGHTED_SPLITS, *DATA_FILE_LISTS, *JSON_CONFIG, "--num-experts", "--moe-layer-freq",
})
# flags whose value list the shrink may shorten (a pyramid --num-experts: its first and last counts)
SHORTENED_LISTS = frozenset({"--num-experts"})
# The JSON keys it may change (top level); every other key and value stays as written.
CHANGED_JSON_KEYS = frozenset({"train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps",
                               "steps_per_print"})


@dataclass
class LocalFiles:
    """What the test prepared: a Megatron .bin/.idx corpus and the tokenizer it was made with: a GPT-2-format
    tokenizer trained on it, or, for a launch naming a SentencePiece type (`uses_sentencepiece`), a
    SentencePiece model trained on its text."""
    data_prefix: str
    tokenizer_dir: str  # vocab.json, merges.txt and tokenizer.json; or tokenizer.model
    vocab_size: int
    out_dir: str  # this launch's checkpoints, JSON, TensorBoard events


@dataclass
class Shrunk:
    argv: list[str]
    files: dict[str, str] = field(default_factory=dict)  # path -> text the test writes before the run
    added: list[str] = field(default_factory=list)  # flags added (a downloaded tokenizer's files, --eval-iters)


# Routed experts above this many are cut to the fewest the routing still holds: the tiny model's experts cost per
# expert, not per width (a launch of 256 took 13 s on the 2-core machine, its checkpoints most of it).
MOST_EXPERTS = 16


def fewest_experts(experts: int, new_ep: int, topk: int, groups: Optional[int], group_topk: Optional[int]) -> int:
    """The routed experts of a shrunk launch: `experts` up to MOST_EXPERTS, else the fewest from MOST_EXPERTS up that
    the new expert-parallel size and the router's groups divide (Megatron asserts both), with --moe-router-topk
    experts inside the --moe-router-group-topk groups a token may choose. Never more than the script's."""
    step = math.lcm(new_ep, groups or 1)
    for count in range(-(-MOST_EXPERTS // step) * step, experts, step):
        if count >= topk and (not groups or not group_topk or topk <= group_topk * (count // groups)):
            return count
    return experts


def uses_sentencepiece(launch: Launch) -> bool:
    """Whether the launch names one of Megatron's SentencePiece tokenizer types: its --tokenizer-model is
    then a SentencePiece .model, and its corpus must be one tokenized with such a model."""
    given = {flag: values for flag, values, _ in split_flags(launch.argv)}
    return given.get("--tokenizer-type", [None])[0] in SENTENCEPIECE_TYPES


def ranks_for(launch: Launch) -> int:
    """WORLD_SIZE, or 4 (2 stages of 2 ranks) for a pipelined launch whose MoE dispatcher is Megatron-LM's flex one
    with the DeepEP backend (its default) over TP x EP > 1: Megatron-Core asserts TP x EP > 1 there, which 2 stages
    of 1 rank could not keep (slime's DeepSeek-V3 and GLM-4.5 launches)."""
    pairs = split_flags(launch.argv)
    given = {flag: values for flag, values, _ in pairs}
    scalar = {flag: number(values[0]) for flag, values in given.items() if len(values) == 1 and values[0].isdigit()}
    dispatcher = given.get("--moe-token-dispatcher-type", [None])[-1]
    backend = "deepep" if "--moe-enable-deepep" in given else given.get("--moe-flex-dispatcher-backend", ["deepep"])[-1]
    deepep = dispatcher == "flex" and backend == "deepep" and \
        first(scalar, TENSOR_PARALLEL, 1) * first(scalar, EXPERT_PARALLEL, 1) > 1
    return 2 * WORLD_SIZE if deepep and first(scalar, PIPELINE_PARALLEL, 1) > 1 else WORLD_SIZE


def split_flags(argv) -> list[tuple[str, list[str], bool]]:
    """[(flag, values, inline)] in order. A value is any token after a flag up to the next `--` token;
    `--flag=value` is one token (inline). Negative numbers are values."""
    pairs: list[tuple[str, list[str], bool]] = []
    for token in argv:
        if token.startswith("--"):
            flag, eq, value = token.partition("=")
            pairs.append((flag, [value] if eq else [], bool(eq)))
        elif pairs:
            pairs[-1][1].append(token)
        else:
            raise ValueError(f"a value before any flag: {token!r}")
    return pairs


def join_flags(pairs) -> list[str]:
    argv: list[str] = []
    for flag, values, inline in pairs:
        argv += [f"{flag}={values[0]}"] if inline else [flag, *values]
    return argv


def step_schedule(values: list[str], new_global: int) -> list[str]:
    """Megatron-LM's --step-batch-size-schedule "THRESHOLD:BATCH ...": the thresholds (token counts, far beyond
    a 3-iteration run) as written; the distinct batches, in increasing order, become 1, 2, 3, ... times the new
    global batch (the first, at threshold 0, is then the batch the 3 iterations run at)."""
    entries = [entry.split(":", 1) for value in values for entry in value.replace(",", " ").split()]
    order = sorted({number(batch) for _, batch in entries})
    shrunk = [f"{threshold}:{(order.index(number(batch)) + 1) * new_global}" for threshold, batch in entries]
    return shrunk if len(values) == len(shrunk) else [" ".join(shrunk)]


def rank_map(values) -> dict[int, int]:
    """1 stays 1; the other distinct values become 2, 3, ... in increasing order."""
    others = sorted({v for v in values if v is not None and v != 1})
    return {1: 1, **{value: index + 2 for index, value in enumerate(others)}}


def number(text: str) -> int:
    return int(float(text.replace("_", "")))


def shrink_levels(sizes: list[int], context_parallel_size: int) -> list[int]:
    """Hierarchical CP levels over a smaller CP size: each level its greatest common divisor with what the levels
    before it leave, the last taking any rest, so they still multiply to the size (Megatron asserts it)."""
    levels, rest = [], context_parallel_size
    for size in sizes:
        levels.append(math.gcd(size, rest))
        rest //= levels[-1]
    levels[-1] *= rest
    return levels


def first(flags: dict, names, default=None):
    for name in names:
        if name in flags:
            return flags[name]
    return default


def shrink(launch: Launch, files: LocalFiles) -> Shrunk:
    pairs = split_flags(launch.argv)
    given = {flag: values for flag, values, _ in pairs}  # the last value wins, as in argparse
    scalar = {flag: number(values[0]) for flag, values in given.items()
              if len(values) == 1 and re.fullmatch(r"-?[\d_]+(\.\d*)?(e[+-]?\d+)?", values[0])}
    config = json.loads(launch.json_text) if launch.json_text else {}

    # Parallel sizes: the original grid, and the one on 2 ranks.
    tp = first(scalar, TENSOR_PARALLEL, 1)
    pp = first(scalar, PIPELINE_PARALLEL, 1)
    cp = first(scalar, CONTEXT_PARALLEL, 1)
    dp = max(1, launch.world_size // (tp * pp * cp))
    world = ranks_for(launch)
    new_pp = min(pp, WORLD_SIZE)
    new_cp = min(cp, world // new_pp)
    new_tp = min(tp, world // (new_pp * new_cp))
    instances = scalar.get("--num-distributed-optimizer-instances", 1)
    if instances > 1 and world // (new_tp * new_pp * new_cp) < 2:
        new_tp = new_cp = 1  # the data-parallel ranks must hold several optimizer instances, as they did
    new_dp = max(1, world // (new_tp * new_pp * new_cp))
    new_instances = max(1, min(instances, new_dp))
    # The experts' grid folds into the data-, context- and tensor-parallel ranks of a stage (parallel/mesh.py,
    # Megatron-Core's parallel folding): the given expert tensor-parallel size is kept where it divides those ranks
    # (ETP 2 at TP 1 stays 2 on the 2 ranks of a stage), else cut to the largest size that does (their gcd; the
    # default stays the default, the new TP size); the expert-parallel size at most what ETP leaves (a power of two,
    # as every original here, so it still divides the experts).
    stage_ranks = new_dp * new_cp * new_tp
    given_etp = first(scalar, EXPERT_TENSOR_PARALLEL, None)
    new_etp = None if given_etp is None else math.gcd(given_etp, stage_ranks)
    new_ep = min(first(scalar, EXPERT_PARALLEL, 1), max(1, stage_ranks // (new_etp or new_tp)))
    if new_ep > 1 or (new_etp or new_tp) != new_tp:
        # the experts' optimizer is cut into the same instances over the expert data-parallel ranks, which must
        # hold them (Megatron asserts it divides the expert DP size): at most those
        new_instances = max(1, min(new_instances, new_dp * new_cp * new_tp // (new_ep * (new_etp or new_tp))))
    # Interleaved stages keep their number of model chunks per stage, one layer each; an uneven first or last
    # stage keeps one layer.
    chunks = 1
    if "--num-layers-per-virtual-pipeline-stage" in scalar and "--num-layers" in scalar:
        chunks = max(1, scalar["--num-layers"] // (pp * scalar["--num-layers-per-virtual-pipeline-stage"]))
    elif "--num-virtual-stages-per-pipeline-rank" in scalar:
        chunks = scalar["--num-virtual-stages-per-pipeline-rank"]
    # Megatron's --account-for-embedding/loss-in-pipeline-split count each as a layer in that split.
    counted = sum(flag in given for flag in ("--account-for-embedding-in-pipeline-split",
                                             "--account-for-loss-in-pipeline-split")) if new_pp > 1 else 0
    new_layers = TINY["--num-layers"]
    if new_pp > 1:
        per_split = new_pp * chunks
        new_layers = max(new_layers, per_split - counted)
        new_layers += -(new_layers + counted) % per_split
    pyramid = len(set(given.get("--num-experts", []))) > 1
    new_experts = None if pyramid or "--num-experts" not in scalar else \
        fewest_experts(scalar["--num-experts"], new_ep, scalar.get("--moe-router-topk", 2),
                       scalar.get("--moe-router-num-groups"), scalar.get("--moe-router-group-topk"))
    if pyramid:
        # Megatron-DeepSpeed's per-layer --num-experts (PR-MoE's "32 ... 32 64 64"): its first and last counts, on
        # two MoE layers (a list has one count per --expert-interval-th layer, as Megatron-DeepSpeed asserts)
        new_layers = max(new_layers, 2 * scalar.get("--expert-interval", 2))
    freq_runs = None
    if "[" in given.get("--moe-layer-freq", [""])[-1] and "--num-layers" in scalar:
        # a list --moe-layer-freq (Megatron-LM's "([0]*3+[1]*5)") names each layer dense or MoE, and Megatron asserts
        # its length is --num-layers: a list of runs (or of one 0/1 per layer) shrinks with the layers, each run
        # keeping at least one layer (the dense-first pattern stays); a list of another form, or one a
        # --pipeline-model-parallel-layout places layer by layer, keeps its layers as written
        freq_runs = layer_runs(given["--moe-layer-freq"][-1])
        if freq_runs is None or "--pipeline-model-parallel-layout" in given:
            freq_runs, new_layers = None, scalar["--num-layers"]
        else:
            new_layers = max(new_layers, len(freq_runs))
            if new_pp > 1:
                new_layers += -(new_layers + counted) % (new_pp * chunks)

    # Batch sizes: one map for micro batches, one for accumulation steps, on both sides.
    flag_micro = first(scalar, MICRO_BATCH)
    flag_global = scalar.get("--global-batch-size")
    flag_accumulation = first(scalar, ACCUMULATION)
    if flag_accumulation is None and flag_global and flag_micro:
        flag_accumulation = max(1, flag_global // (flag_micro * dp))
    json_global = config.get("train_batch_size")
    json_micro = config.get("train_micro_batch_size_per_gpu")
    json_accumulation = config.get("gradient_accumulation_steps")
    if json_global and json_micro is None:  # DeepSpeed: micro = train_batch_size / (accumulation x dp)
        json_micro = max(1, json_global // ((json_accumulation or 1) * dp))
    if json_global and json_accumulation is None:
        json_accumulation = max(1, json_global // (json_micro * dp))
    micro_map = rank_map([flag_micro, json_micro])
    accumulation_map = rank_map([flag_accumulation, json_accumulation])
    new_micro = micro_map[flag_micro] if flag_micro else micro_map[json_micro] if json_micro else 1
    new_accumulation = accumulation_map.get(flag_accumulation or json_accumulation or 1, 1)
    group = scalar.get("--microbatch-group-size-per-virtual-pipeline-stage")
    new_group = None if group is None else max(new_pp, new_pp + group - pp)  # as far above the stages as it was
    if chunks > 1 or "--num-layers-per-virtual-pipeline-stage" in scalar:
        # Megatron's interleaved schedule asserts the micro-batches per iteration are a multiple of the stages
        # (and of the micro-batch group, so that no group holds fewer than the stages)
        step = math.lcm(new_pp, new_group or 1)
        new_accumulation = -(-new_accumulation // step) * step
    if "--rampup-batch-size" in given and new_accumulation == 1:
        # a ramp grows to its global batch, which was above its start: at the 2 ranks' one accumulation step it
        # could not grow (Apertus' 2048 = 4 x 512 ranks), so it gets two, as a larger world would have
        new_accumulation = 2
    new_global = new_micro * new_accumulation * new_dp

    ramp = None
    if "--rampup-batch-size" in given:
        step = new_micro * new_dp
        if new_global <= step:
            raise ValueError(f"{launch.name}: a batch ramp needs a global batch above one step")
        ramp = (step, step, step * ((new_global - step) // step))
    consumed = samples_in(ITERATIONS, new_global, ramp)

    # Lengths: the original run's length in samples (the first limit it meets), and the new one.
    seq = scalar.get("--seq-length", 1024)
    original_global = flag_global or \
        (flag_micro or json_micro or 1) * (flag_accumulation or json_accumulation or 1) * dp
    limits = []
    if "--train-iters" in scalar:
        limits.append(scalar["--train-iters"] * original_global)
    if "--train-samples" in scalar:
        limits.append(scalar["--train-samples"])
    if "--train-tokens" in scalar:
        limits.append(scalar["--train-tokens"] / seq)
    length = min(limits) if limits else None
    new_seq = TINY["--seq-length"]

    def share(value: float, of: float, into: float) -> str:
        return "0" if value == 0 else str(max(1, round(value / of * into)))  # 0 (none) stays 0

    def hidden_share(width: int) -> float:
        """A width in its proportion to the hidden size, at the tiny hidden size."""
        return width / scalar["--hidden-size"] * TINY["--hidden-size"]

    def head_share(width: int) -> float:
        """A width in its proportion to a head's (hidden / heads), at the tiny head's."""
        return width / (scalar["--hidden-size"] / scalar["--num-attention-heads"]) * \
            (TINY["--hidden-size"] / TINY["--num-attention-heads"])

    # Intervals.
    log_map = rank_map([scalar.get("--log-interval"), config.get("steps_per_print")])

    out, added = [], []
    json_path = None
    checkpoint_dirs: dict[str, str] = {}
    shrunk_files: dict[str, str] = {}
    for flag, values, inline in pairs:
        new = values
        value = scalar.get(flag)
        if flag == "--num-layers":
            new = [str(new_layers)]
        elif flag == "--moe-layer-freq" and freq_runs is not None:
            new = [*values[:-1], shrink_layer_runs(values[-1], freq_runs, new_layers)]
        elif flag == "--num-experts" and pyramid:
            new = [values[0], values[-1]]
        elif flag == "--num-experts" and new_experts is not None:
            new = [str(new_experts)]
        elif flag in TINY:
            new = [str(TINY[flag])]
        elif flag == "--num-layers-per-virtual-pipeline-stage":
            new = [str(max(1, (new_layers + counted) // (new_pp * chunks)))]
        elif flag in ("--decoder-first-pipeline-num-layers", "--decoder-last-pipeline-num-layers"):
            new = ["1"]
        elif flag == "--ffn-hidden-size" and "--hidden-size" in scalar:
            # in its proportion to the hidden size, a multiple of the new TP size as the original's was of its (the
            # MLP's columns split over the TP ranks): Qwen2-1.5B's 8960 of 1536 is 187 of 32, 188 at TP 2
            width = max(1, round(hidden_share(value)))
            new = [str(-(-width // new_tp) * new_tp if value % tp == 0 else width)]
        elif flag in MOE_WIDTHS and "--hidden-size" in scalar:
            # each expert's (and the shared expert's) width in its proportion to the hidden size, a multiple of the
            # new TP size as the original's was of its (the shared experts split over the TP ranks), and the routed
            # experts' of the new expert TP size too (they split over the expert TP ranks)
            width = max(1, round(hidden_share(value)))
            split = math.lcm(new_tp, new_etp or new_tp) if flag == "--moe-ffn-hidden-size" else new_tp
            new = [str(-(-width // split) * split)]
        elif flag == "--kv-channels" and "--hidden-size" in scalar and "--num-attention-heads" in scalar:
            # even, as the original's: rotary positions rotate pairs of a head's dims (an even number of them under a
            # --rotary-percent below 1: a multiple of 4 at GLM-4.5's 0.5)
            step = 2 * Fraction(float(given.get("--rotary-percent", ["1"])[-1])).limit_denominator(64).denominator
            new = [str(max(step, step * round(head_share(value) / step)))]
        elif flag in MLA_RANKS and "--hidden-size" in scalar:
            new = [str(max(1, round(hidden_share(value))))]
        elif flag in MLA_HEAD_WIDTHS and "--hidden-size" in scalar and "--num-attention-heads" in scalar:
            # in proportion to the head width, as --kv-channels; even (the rotary part rotates pairs)
            new = [str(max(2, 2 * round(head_share(value) / 2)))]
        elif flag in ("--num-key-value-heads", "--num-query-groups") and "--num-attention-heads" in scalar:
            groups = max(1, value * TINY["--num-attention-heads"] // scalar["--num-attention-heads"])
            # each tensor-parallel rank holds whole groups, as it did at the original sizes
            new = [str(-(-groups // new_tp) * new_tp if value % tp == 0 else groups)]
        elif flag in ("--max-position-embeddings", "--encoder-seq-length", "--decoder-seq-length"):
            new = [str(max(new_seq, round(value / seq * new_seq)))]
        elif flag == "--goldfish-h":
            new = [str(min(value, new_seq))]  # swiss-ai's hash window lies within a sample
        elif flag == "--vocab-size" and given.get("--tokenizer-type") == ["NullTokenizer"]:
            new = [str(files.vocab_size)]  # NullTokenizer's vocabulary: the local corpus's token ids
        elif flag == "--pad-vocab-size-to":
            new = [str((files.vocab_size // 128 + 1) * 128)]
        elif flag in TENSOR_PARALLEL:
            new = [str(new_tp)]
        elif flag in PIPELINE_PARALLEL:
            new = [str(new_pp)]
        elif flag in CONTEXT_PARALLEL:
            new = [str(new_cp)]
        elif flag in HIERARCHICAL_CONTEXT_PARALLEL and all(value.isdigit() for value in values):
            new = [str(size) for size in shrink_levels([int(value) for value in values], new_cp)]
        elif flag in EXPERT_PARALLEL:
            new = [str(new_ep)]
        elif flag in EXPERT_TENSOR_PARALLEL:
            new = [str(new_etp)]
        elif flag in MICRO_BATCH:
            new = [str(micro_map[value])]
        elif flag == "--global-batch-size":
            new = [str(new_global)]
        elif flag in ACCUMULATION:
            new = [str(accumulation_map[value])]
        elif flag == "--rampup-batch-size":
            new = [str(n) for n in ramp]
        elif flag == "--microbatch-group-size-per-virtual-pipeline-stage":
            new = [str(new_group)]
        elif flag == "--num-distributed-optimizer-instances":
            new = [str(new_instances)]
        elif flag == "--step-batch-size-schedule":
            new = step_schedule(values, new_global)
        elif flag == "--train-iters":
            new = [str(ITERATIONS)]
        elif flag == "--train-samples":
            new = [str(consumed)]
        elif flag == "--train-tokens":
            new = [str(consumed * new_seq)]
        elif flag in SCHEDULE_ITERS and length:
            new = [share(value, length / original_global, ITERATIONS)]
        elif flag in SCHEDULE_SAMPLES and length:
            new = [share(value, length, consumed)]
        elif flag in SCHEDULE_TOKENS and length:
            new = [share(value, length * seq, consumed * new_seq)]
        elif flag == "--log-interval":
            new = [str(log_map[value])]
        elif flag in ("--save-interval", "--eval-interval"):
            new = ["1" if value == 1 else "2"]
        elif flag == "--eval-iters":
            new = ["0" if value == 0 else "1"]
        elif flag in DATA:
            new = [v if _is_weight(v) else files.data_prefix for v in values]
        elif flag == "--vocab-file":
            new = [os.path.join(files.tokenizer_dir, "vocab.json")]
        elif flag == "--merge-file":
            new = [os.path.join(files.tokenizer_dir, "merges.txt")]
        elif flag == "--tokenizer-model" and uses_sentencepiece(launch):
            new = [os.path.join(files.tokenizer_dir, SENTENCEPIECE_MODEL_FILE)]
        elif flag in ("--tokenizer-name-or-path", "--tokenizer-model"):
            new = [files.tokenizer_dir]
        elif flag in CHECKPOINT_DIRS:  # --save and --load naming one folder keep naming one folder
            new = [checkpoint_dirs.setdefault(values[0],
                                              os.path.join(files.out_dir, f"checkpoints{len(checkpoint_dirs)}"))]
        elif flag in DIRECTORIES:
            new = [os.path.join(files.out_dir, DIRECTORIES[flag])]
        elif flag == "--kill-switch-path":
            new = [os.path.join(files.out_dir, "kill-switch")]
        elif flag in WEIGHTED_SPLITS:
            split = "TRAIN" if flag.startswith("--train") else "VALID"
            path = os.path.join(files.out_dir, f"{split.lower()}-splits.txt")
            shrunk_files[path] = f"{split}: 1 0:1 {files.data_prefix}\n"
            new = [path]
        elif flag in DATA_FILE_LISTS:
            # ALCF's list of `weight prefix corpus` lines: one line naming the local corpus, its corpus named after
            # the list (the list itself is the run's data, not part of the launch)
            path = os.path.join(files.out_dir, "data-file-list.txt")
            corpus = os.path.splitext(os.path.basename(values[0]))[0] or "corpus"
            shrunk_files[path] = f"1.0 {files.data_prefix} {corpus}\n"
            new = [path]
        elif flag in JSON_CONFIG:
            # The JSON's own file name (a generated one: the name the script gave it, without `$`).
            name = os.path.basename(values[0]) if launch.json_generated or launch.json is None else \
                os.path.basename(launch.json.path)
            json_path = os.path.join(files.out_dir, name.replace("$", "") or "ds_config.json")
            new = [json_path]
        out.append((flag, new, inline))

    if (given.get("--tokenizer-type") == ["GPT2BPETokenizer"] and "--vocab-file" not in given
            and "--tokenizer-model" not in given):
        added += ["--vocab-file", "--merge-file"]
        out += [("--vocab-file", [os.path.join(files.tokenizer_dir, "vocab.json")], False),
                ("--merge-file", [os.path.join(files.tokenizer_dir, "merges.txt")], False)]
    if "--eval-iters" not in given:
        # A size the launch left to its default: Megatron-LM's is 100 batches per evaluation
        # (megatron/training/arguments.py, `--eval-iters`, default=100), which at 3 iterations is most
        # of the replay's time. It becomes 1, as a launch giving --eval-iters gets.
        added.append("--eval-iters")
        out.append(("--eval-iters", ["1"], False))

    if launch.json_text is not None:
        if json_path is None:
            raise ValueError(f"{launch.name}: a JSON but no --deepspeed_config naming it")
        text = launch.json_text
        if "train_batch_size" in config:
            text = _set_json_number(text, "train_batch_size",
                                    micro_map[json_micro] * accumulation_map[json_accumulation] * new_dp)
        if "train_micro_batch_size_per_gpu" in config:
            text = _set_json_number(text, "train_micro_batch_size_per_gpu", micro_map[json_micro])
        if "gradient_accumulation_steps" in config:
            text = _set_json_number(text, "gradient_accumulation_steps", accumulation_map[json_accumulation])
        if "steps_per_print" in config:
            text = _set_json_number(text, "steps_per_print", log_map[config["steps_per_print"]])
        shrunk_files[json_path] = text

    argv = join_flags(out)
    assert [f for f, _, _ in out[:len(pairs)]] == [f for f, _, _ in pairs]  # every flag kept, in its place
    return Shrunk(argv, shrunk_files, added)


LAYER_RUN = re.compile(r"\[([01])\]\*(\d+)")


LAYER_LIST = re.compile(r"\[\s*[01](\s*,\s*[01])*\s*\]")


def layer_runs(expression: str) -> Optional[list[tuple[str, int]]]:
    """[(0 or 1, layers)] of a --moe-layer-freq list written as runs, "([0]*3+[1]*58)", or one 0/1 per layer,
    "[0,1,1,1]" (slime's model scripts print theirs so); None for another form."""
    body = expression.strip()
    if LAYER_LIST.fullmatch(body):
        return [(value, len(list(group))) for value, group in itertools.groupby(re.findall(r"[01]", body))]
    if body.startswith("(") and body.endswith(")"):
        body = body[1:-1]
    runs = [LAYER_RUN.fullmatch(part.strip()) for part in body.split("+")]
    return None if not all(runs) else [(run.group(1), int(run.group(2))) for run in runs]


def shrink_layer_runs(expression: str, runs: list[tuple[str, int]], layers: int) -> str:
    """The expression with one layer per run and the rest in its last run (its MoE layers, after the dense first
    ones), `layers` in all; its spacing and parentheses as written (a list of one 0/1 per layer stays one)."""
    counts = [1] * (len(runs) - 1) + [layers - len(runs) + 1]
    if LAYER_LIST.fullmatch(expression.strip()):
        separator = ", " if ", " in expression else ","
        return "[" + separator.join(value for (value, _), count in zip(runs, counts) for _ in range(count)) + "]"
    counts = iter(counts)
    return LAYER_RUN.sub(lambda match: f"[{match.group(1)}]*{next(counts)}", expression)


def samples_in(iterations: int, global_batch: int, ramp: Optional[tuple[int, int, int]]) -> int:
    """Samples consumed by the first `iterations` iterations, with Megatron's batch ramp
    (megatron/core/num_microbatches_calculator.py: the batch grows by `increment` every
    ramp_samples / increments consumed samples, then stays at the global batch)."""
    consumed = 0
    for _ in range(iterations):
        consumed += batch_at(consumed, global_batch, ramp)
    return consumed


def batch_at(consumed: int, global_batch: int, ramp: Optional[tuple[int, int, int]]) -> int:
    if ramp is None:
        return global_batch
    start, increment, ramp_samples = ramp
    increments = (global_batch - start) // increment
    if consumed > ramp_samples:
        return global_batch
    steps = int(consumed / (ramp_samples / increments))
    return min(global_batch, start + steps * increment)


def _is_weight(token: str) -> bool:
    try:
        return math.isfinite(float(token))
    except ValueError:
        return False


def _set_json_number(text: str, key: str, value: int) -> str:
    """`text` with the number after "key": replaced, the rest of the text (spacing, key order) untouched."""
    pattern = re.compile(r'("' + re.escape(key) + r'"\s*:\s*)-?\d+(\.\d+)?([eE][+-]?\d+)?')
    new, count = pattern.subn(lambda m: m.group(1) + str(value), text, count=1)
    if count != 1:
        raise ValueError(f"no number for {key} in the JSON")
    return new
