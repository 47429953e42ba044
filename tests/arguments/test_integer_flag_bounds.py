"""The integer flags this project bounds (those the replay corpus gives first), against what Megatron-LM core_v0.16.1
does with the value just outside the bound (issue 93 item 2): the table BOUNDS, one row per flag with the line it
cites.

A bound stays only where Megatron-LM refuses the value, crashes on it or silently runs something else; where it
does something meaningful the value is accepted and means the same here (--exit-interval 0: never; --eval-iters
-1: no evaluation). Paths under megatron/training/ are Megatron-LM's tree at core_v0.16.1; paths under
megatron/core/ are megatron-core 0.16.1 (requirements-bench.txt), whose cited lines are read back where it is
installed. Flags of Megatron-DeepSpeed and DeepSpeed alone (--train-tokens, --zero-stage, ...) are not rows."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path

import pytest

from arguments.config import ConfigError
from arguments.parser import parse_config


@dataclass(frozen=True)
class Bound:
    flag: str
    accepted: int            # the least value our parser takes
    refused: int | None      # the value just under it, refused in one line; None: no bound
    megatron: str            # what Megatron-LM does with `refused` (or, unbounded, with `accepted`)
    source: str              # FILE:LINE of the code that does it
    quote: str               # the cited line, as it reads there
    context: tuple[str, ...] = ()  # flags the value needs to mean anything


TRAINING, CORE = "megatron/training/", "megatron/core/"
ZERO_DIVIDES = "ZeroDivisionError"
BOUNDS = (
    Bound("--micro-batch-size", 1, 0, "AssertionError in validate_args", TRAINING + "arguments.py:496",
          "assert args.micro_batch_size > 0"),
    Bound("--global-batch-size", 1, 0, "AssertionError in validate_args", TRAINING + "arguments.py:500",
          "assert args.global_batch_size > 0"),
    Bound("--train-iters", 1, 0, "0 reads as not given (`if args.train_iters:`), so without --train-samples the "
          "scheduler raises 'either train-iters or train-samples should be provided.'",
          TRAINING + "training.py:1387", "raise Exception('either train-iters or train-samples should be provided.')"),
    Bound("--train-samples", 1, 0, "0 reads as not given (`if args.train_samples:`): the same Exception",
          TRAINING + "training.py:1387", "raise Exception('either train-iters or train-samples should be provided.')"),
    Bound("--eval-interval", 1, 0, f"{ZERO_DIVIDES} sizing the validation set (a negative N evaluates every "
          "iteration: `iteration % args.eval_interval == 0`, training.py:2914)", TRAINING + "training.py:3307",
          "eval_iters = (args.train_iters // args.eval_interval + 1) * args.eval_iters"),
    Bound("--log-interval", 1, 0, f"{ZERO_DIVIDES} at the first iteration's log", TRAINING + "training.py:2008",
          "if iteration % args.log_interval == 0 or is_first_iteration:"),
    Bound("--save-interval", 1, 0, "AssertionError with --save (without --save it is never read: nothing is saved "
          "either way)", TRAINING + "arguments.py:839", "assert args.save_interval > 0"),
    Bound("--exit-interval", 0, -1, "0 never exits (`args.exit_interval and ...`); a negative N divides every "
          "iteration, so the run would stop after its first", TRAINING + "training.py:2395",
          "and iteration % args.exit_interval == 0"),
    Bound("--eval-iters", -1, None, "a negative count evaluates nothing", TRAINING + "training.py:3081",
          "while iteration < eval_iters:"),
    Bound("--lr-decay-iters", 1, 0, "AssertionError in OptimizerParamScheduler", CORE + "optimizer_param_scheduler.py:156",
          "assert self.lr_decay_steps > 0"),
    Bound("--lr-warmup-iters", 0, -1, "no check: the warm-up is skipped and the decay shifted by the negative "
          "steps, silently another schedule", CORE + "optimizer_param_scheduler.py:247",
          "num_steps_ = self.num_steps - self.lr_warmup_steps"),
    Bound("--lr-decay-samples", 1, 0, "AssertionError in OptimizerParamScheduler",
          CORE + "optimizer_param_scheduler.py:156", "assert self.lr_decay_steps > 0", ("--train-samples", "1000")),
    Bound("--lr-warmup-samples", 0, -1, "no check: the decay shifted, silently another schedule",
          CORE + "optimizer_param_scheduler.py:247", "num_steps_ = self.num_steps - self.lr_warmup_steps",
          ("--train-samples", "1000")),
    Bound("--lr-wsd-decay-iters", 0, -1, "no check: the anneal would start after the decay's end, so the rate "
          "stays at its peak and then drops to the minimum, silently", CORE + "optimizer_param_scheduler.py:260",
          "wsd_anneal_start_ = self.lr_decay_steps - self.wsd_decay_steps", ("--lr-decay-style", "WSD")),
    Bound("--lr-wsd-decay-samples", 0, -1, "no check: the same schedule without its anneal, silently",
          CORE + "optimizer_param_scheduler.py:260", "wsd_anneal_start_ = self.lr_decay_steps - self.wsd_decay_steps",
          ("--train-samples", "1000", "--lr-decay-style", "WSD")),
    Bound("--seed", 0, -1, "ValueError 'Seed must be between 0 and 2**32 - 1' from NumPy",
          TRAINING + "initialize.py:420", "np.random.seed(seed)"),
    Bound("--hysteresis", 1, 0, "AssertionError in DynamicGradScaler (fp16 without --loss-scale; unread otherwise)",
          CORE + "optimizer/grad_scaler.py:101", "assert hysteresis > 0"),
    Bound("--loss-scale-window", 1, 0, "AssertionError in DynamicGradScaler (its growth_interval)",
          CORE + "optimizer/grad_scaler.py:97", "assert growth_interval > 0"),
    Bound("--cuda-graph-warmup-steps", 0, -1, "no check: the whole-iteration graph is captured at the iteration "
          "equal to N, never reached, so no graph runs, silently", CORE + "full_cuda_graph.py:163",
          "if curr_iteration == self.cuda_graph_warmup_steps:"),
    Bound("--num-workers", 0, -1, "torch's DataLoader raises ValueError 'num_workers option should be "
          "non-negative'", TRAINING + "datasets/data_samplers.py:89", "num_workers=args.num_workers,"),
    Bound("--tensor-model-parallel-size", 1, 0, f"{ZERO_DIVIDES}: the world size modulo TP x PP x CP",
          TRAINING + "arguments.py:317", "assert args.world_size % total_model_size == 0, ("),
    Bound("--pipeline-model-parallel-size", 1, 0, f"{ZERO_DIVIDES}: the world size modulo TP x PP x CP",
          TRAINING + "arguments.py:317", "assert args.world_size % total_model_size == 0, ("),
    Bound("--context-parallel-size", 1, 0, f"{ZERO_DIVIDES}: the world size modulo TP x PP x CP",
          TRAINING + "arguments.py:317", "assert args.world_size % total_model_size == 0, ("),
    Bound("--expert-model-parallel-size", 1, 0, f"{ZERO_DIVIDES} building the expert grid",
          CORE + "parallel_state.py:791",
          "expert_data_parallel_size = world_size // expert_tensor_model_pipeline_parallel_size"),
    Bound("--num-distributed-optimizer-instances", 1, 0, f"{ZERO_DIVIDES} building the data-parallel groups",
          CORE + "parallel_state.py:835", ") % num_distributed_optimizer_instances == 0, ("),
    Bound("--make-vocab-size-divisible-by", 1, 0, f"{ZERO_DIVIDES} padding the vocabulary",
          TRAINING + "tokenizer/tokenizer.py:123", "after = int(math.ceil(after / multiple) * multiple)"),
    Bound("--num-attention-heads", 1, 0, f"{ZERO_DIVIDES} in validate_args", TRAINING + "arguments.py:814",
          "assert args.hidden_size % args.num_attention_heads == 0"),
    Bound("--hidden-size", 1, 0, f"{ZERO_DIVIDES}: heads of 0 channels, the softmax scale 1/sqrt(0)",
          CORE + "transformer/dot_product_attention.py:85",
          "self.softmax_scale = 1.0 / math.sqrt(self.hidden_size_per_attention_head)", ("--num-attention-heads", "1")),
    Bound("--kv-channels", 1, 0, f"{ZERO_DIVIDES}: the softmax scale 1/sqrt(0)",
          CORE + "transformer/dot_product_attention.py:85",
          "self.softmax_scale = 1.0 / math.sqrt(self.hidden_size_per_attention_head)"),
    Bound("--max-position-embeddings", 8, 7, "AssertionError: fewer positions than --seq-length",
          TRAINING + "arguments.py:830", "assert args.max_position_embeddings >= args.seq_length, \\",
          ("--seq-length", "8")),
    Bound("--num-layers", 1, 0, "no check: a model of no transformer layers is built, silently",
          CORE + "transformer/transformer_block.py:158",
          "num_layers_per_pipeline_rank = num_layers // config.pipeline_model_parallel_size"),
    Bound("--mtp-num-layers", 0, -1, "RuntimeError: the hidden states cut into 1 + N = 0 chunks",
          CORE + "models/gpt/gpt_model.py:613",
          "hidden_states_list = torch.chunk(hidden_states, 1 + self.config.mtp_num_layers, dim=0)"),
    Bound("--decoder-first-pipeline-num-layers", 1, 0, "ValueError in TransformerConfig",
          CORE + "transformer/transformer_config.py:1368", "if self.num_layers_in_first_pipeline_stage <= 0:",
          ("--pipeline-model-parallel-size", "2", "--num-layers", "4")),
    Bound("--decoder-last-pipeline-num-layers", 1, 0, "ValueError in TransformerConfig",
          CORE + "transformer/transformer_config.py:1387", "if self.num_layers_in_last_pipeline_stage <= 0:",
          ("--pipeline-model-parallel-size", "2", "--num-layers", "4")),
    Bound("--error-injection-rate", -1, None, "0 or less injects no error", CORE + "rerun_state_machine.py:1262",
          "self.should_inject_errors: bool = error_injection_rate > 0"),
    Bound("--num-layers-per-virtual-pipeline-stage", 1, 0, f"{ZERO_DIVIDES} in validate_args",
          TRAINING + "arguments.py:547",
          "assert num_layers_per_pipeline_stage % args.num_layers_per_virtual_pipeline_stage == 0, \\",
          ("--pipeline-model-parallel-size", "2", "--num-layers", "4")),
    Bound("--num-virtual-stages-per-pipeline-rank", 1, 0, f"{ZERO_DIVIDES}: a stage's layers modulo 0 chunks",
          CORE + "transformer/transformer_block.py:175", "num_layers_per_pipeline_rank % vp_size == 0",
          ("--pipeline-model-parallel-size", "4", "--num-layers", "8")),
    Bound("--checkpoint-num-layers", 1, 0, "as --recompute-num-layers under --recompute-method uniform, the "
          "group index never advances: the forward never ends", CORE + "transformer/transformer_block.py:542",
          "layer_idx += self.config.recompute_num_layers", ("--checkpoint-activations",)),
    Bound("--recompute-num-layers", 0, -1, "under --recompute-method block, 0 checkpoints no layer (`layer_idx < "
          "self.config.recompute_num_layers + recompute_skip_num_layers` never holds); a negative N the same, "
          "silently", CORE + "transformer/transformer_block.py:558",
          "and layer_idx < self.config.recompute_num_layers + recompute_skip_num_layers",
          ("--checkpoint-activations", "--recompute-method", "block")),
    Bound("--seq-length", 1, 0, "SIGFPE: the sample index divides the tokens by 0 (its `assert(seq_length > 1)` is "
          "compiled out of the wheel: 1 builds its index)", CORE + "datasets/helpers.cpp:174",
          "num_samples = (num_epochs * tokens_per_epoch - add_extra_token_to_sequence) / seq_length;"),
    Bound("--ffn-hidden-size", 1, 0, "no check (only None takes the default): an MLP 0 wide, whose output is its "
          "second linear's bias alone, silently", CORE + "transformer/mlp.py:124", "ffn_hidden_size,"),
    Bound("--vocab-size", 1, 0, "N + 1 ids, the end of document the last: 0 leaves that id alone, and the data's "
          "other ids land in the padding rows of the vocabulary, silently (read only by NullTokenizer and "
          "TikTokenizer; beside the others the value is not read)", TRAINING + "tokenizer/tokenizer.py:835",
          "return self._vocab_size_without_eod + 1", ("--mock-data", "--tokenizer-type", "NullTokenizer")),
    Bound("--q-lora-rank", 1, 0, "no check (only None means no low-rank query): a 0-wide latent, every query 0, "
          "attention uniform, silently", CORE + "transformer/multi_latent_attention.py:422",
          "self.config.q_lora_rank,", ("--multi-latent-attention",)),
    Bound("--kv-lora-rank", 1, 0, "no check: a 0-wide key/value latent, every value and key content 0, silently",
          CORE + "transformer/multi_latent_attention.py:485", "self.config.kv_lora_rank,",
          ("--multi-latent-attention",)),
    Bound("--qk-head-dim", 1, 0, "no check: heads of their rotary part alone, scores by position only, silently",
          CORE + "transformer/multi_latent_attention.py:113",
          "self.q_head_dim = self.config.qk_head_dim + self.config.qk_pos_emb_head_dim", ("--multi-latent-attention",)),
    Bound("--qk-pos-emb-head-dim", 2, 1, "ValueError in the unfused RoPE: the 1-wide rotary part halves into one "
          "chunk (0 runs MLA without any position, silently: refused here too)",
          CORE + "models/common/embeddings/rope_utils.py:83", "x1, x2 = torch.chunk(x, 2, dim=-1)",
          ("--multi-latent-attention",)),
    Bound("--v-head-dim", 1, 0, "no check: value heads 0 wide, the attention's output 0, silently",
          CORE + "transformer/multi_latent_attention.py:111",
          "self.query_projection_size = self.config.v_head_dim * self.config.num_attention_heads",
          ("--multi-latent-attention",)),
    Bound("--num-experts", 0, -1, "ValueError 'num_moe_experts must be non-negative.' in TransformerConfig (0 reads "
          "as no experts: `if args.num_experts == 0: args.num_experts = None`, arguments.py:1014)",
          CORE + "transformer/transformer_config.py:1051",
          "if self.num_moe_experts is not None and self.num_moe_experts <= 0:"),
    Bound("--moe-router-topk", 1, 0, f"{ZERO_DIVIDES} in the auxiliary load-balancing loss; without one, "
          "torch.topk(k=0) sends no token to an expert, silently", CORE + "transformer/moe/moe_utils.py:131",
          "num_experts * moe_aux_loss_coeff / (topk * total_num_tokens * total_num_tokens)",
          ("--num-experts", "4", "--moe-router-pre-softmax")),
    Bound("--moe-ffn-hidden-size", 1, 0, "no check (only None takes --ffn-hidden-size): experts 0 wide, each "
          "adding only its bias, silently", CORE + "transformer/moe/experts.py:128",
          "fc1_output_size = self.config.moe_ffn_hidden_size * self.num_local_experts", ("--num-experts", "4")),
    Bound("--moe-shared-expert-intermediate-size", 1, 0, "ValueError in TransformerConfig (None: no shared expert)",
          CORE + "transformer/transformer_config.py:1084", "if self.moe_shared_expert_intermediate_size <= 0:",
          ("--num-experts", "4")),
)

# Not a bound but a pair: Megatron-LM builds a DistributedDataParallelConfig for every run but torch FSDP2's
# (megatron/training/training.py get_model), whose __post_init__ asserts the flag's partner.
REUSE_GRAD_BUF = ("--reuse-grad-buf-for-mxfp8-param-ag", "--fp8-param-gather",
                  CORE + "distributed/distributed_data_parallel_config.py:154",
                  'assert self.fp8_param_gather, "Reuse grad buffer only when keeping params in MXFP8."')


@pytest.mark.parametrize("bound", BOUNDS, ids=lambda bound: bound.flag)
def test_our_bound_is_what_megatron_does(bound):
    parse_config([*bound.context, bound.flag, str(bound.accepted)])
    if bound.refused is None:
        return
    with pytest.raises(ConfigError) as refusal:
        parse_config([*bound.context, bound.flag, str(bound.refused)])
    message = str(refusal.value)
    assert "\n" not in message and bound.flag in message and str(bound.refused) in message, message


def test_every_row_cites_a_line_of_megatron():
    assert len({bound.flag for bound in BOUNDS}) == len(BOUNDS)
    for bound in BOUNDS:
        path, line = bound.source.rsplit(":", 1)
        assert path.startswith((TRAINING, CORE)) and path.endswith((".py", ".cpp")) and int(line) > 0, bound.source


def test_reuse_grad_buf_needs_fp8_param_gather_as_megatron_asserts():
    flag, partner, _, quote = REUSE_GRAD_BUF
    parse_config([flag, partner])
    with pytest.raises(ConfigError) as refusal:
        parse_config([flag])
    message = str(refusal.value)
    assert "\n" not in message and flag in message and partner in message, message
    assert quote.split('"')[1] in message, message


def test_the_cited_lines_of_megatron_core_read_as_quoted():
    spec = importlib.util.find_spec("megatron.core") if importlib.util.find_spec("megatron") else None
    if spec is None or spec.origin is None:
        pytest.skip("megatron-core is a benchmark-only peer (requirements-bench.txt)")
    root = Path(spec.origin).parent
    version = (root / "package_info.py").read_text()
    if "MINOR = 16" not in version or "PATCH = 1" not in version:
        pytest.skip("the rows cite megatron-core 0.16.1")
    cited = [(bound.source, bound.quote) for bound in BOUNDS] + [REUSE_GRAD_BUF[2:]]
    for source, quote in cited:
        if source.startswith(CORE):
            path, line = source.removeprefix(CORE).rsplit(":", 1)
            assert (root / path).read_text().splitlines()[int(line) - 1].strip() == quote, source
