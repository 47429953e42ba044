"""Megatron-Core's own torch_dist checkpoints, written and resumed by megatron-core itself, for tests/fixtures/.

Runs in the benchmark venv (megatron-core 0.16.1, torch CPU, gloo): megatron.training is not in the wheel, so this
driver does what Megatron-LM's pretrain_gpt.py + megatron/training/{training,checkpointing}.py do at core_v0.16.1
with megatron.core's own pieces: GPTModel on the local spec (no TransformerEngine), its DistributedDataParallel, its
optimizer (get_megatron_optimizer, the distributed optimizer when asked), its OptimizerParamScheduler, its
GPTDataset, its forward_backward_func, and megatron.core.dist_checkpointing.save / load with the state dict
checkpointing.py's generate_state_dict builds (args, checkpoint_version 3.0, iteration, model sharded_state_dict,
optimizer sharded_state_dict with the content metadata of _build_sharded_state_dict_metadata, opt_param_scheduler,
rng_state as its ShardedObject, num_floating_point_operations_so_far). The tracker file is written as its
iter_finalize_fn writes it.

    python scripts/megatron_checkpoint_fixtures.py fixtures [--only NAME] [--out tests/fixtures]
        every fixture: train iterations 1-2, save at 2; then a fresh launch loads the checkpoint and trains iteration 3
        on the same data; its loss (and the first two) go to DIR/megatron_losses.json, and a third launch's
        uninterrupted iterations 1-3 (the same losses: Megatron's own resume is exact) beside them
    python scripts/megatron_checkpoint_fixtures.py resume --load DIR --nproc N -- FLAGS...
        load a torch_dist save folder (Megatron's, or ours written with --ckpt-format torch_dist) with the given
        Megatron-LM flags and train one iteration; prints {"iteration": I, "loss": L} as one JSON line

The flags are Megatron-LM's, as a pretrain_gpt.py launch spells them (only those the fixtures use are understood;
any other is refused). What this driver cannot do as Megatron-LM does on a GPU, and why (CPU only):
- Megatron-Core allocates DDP's grad buffers on torch.cuda.current_device(), and some tensors (its optimizers'
  scale, the grad norm's buffers) with device="cuda" or .cuda(): all of them land on the CPU here; and its
  optimizers check `tensor.type() == 'torch.cuda.FloatTensor'`: a CPU tensor's type() answers with the CUDA name;
  its checkpoint writer calls torch.cuda.synchronize(): nothing to wait for on a CPU.
- Its CUDA RNG tracker (tensor_parallel.random) cannot hold CUDA states on a CPU: fork() runs on the default
  generator here. The runs have dropout 0, so no random number is drawn inside a fork.
- Its DistributedOptimizer builds a load's state dict from the optimizer's state, which torch's AdamW (the fallback
  without TransformerEngine or apex) holds only after a first step: before a load the states are initialized by its
  own _init_optimizer_states_with_dummy_values (a step on zero gradients), which the load then overwrites; and its
  _set_main_param_and_optimizer_states copies every key of that AdamW state, "step" included, which the saved
  states lack (the step is restored from the param groups): "step" keeps the value load_state_dict just set; and
  it copies outside torch.no_grad(), which fp32 parameters refuse (their main params are views of the model's
  leaves; on a GPU the usual bf16 run has fp32 copies): the copy runs under no_grad here.
- Its MoE router's gating reads moe_utils.te_general_gemm, a name bound only where TransformerEngine imports:
  it is bound to None here (the torch matmul path the code takes without TE).
- get_rng_state's cuda_rng_state and rng_tracker_states need CUDA: the saved rng_state holds the Python, NumPy and
  torch CPU states only, and a resume restores those three.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import random
import shutil
import signal
import socket
import sys
import tempfile
import warnings
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch
import torch.multiprocessing as mp

ROOT = Path(__file__).resolve().parents[1]

# The data: DOCUMENTS documents of seq-length tokens each, [1, 2, ..., 15, eod], written by Megatron-Core's own
# IndexedDatasetBuilder (megatron_data/identical_docs.{bin,idx}, shared by every fixture). Every sample (seq-length + 1
# tokens: one document and the next one's first token) is the same, so the tokens of an iteration do not depend on
# the sample order: this project's GPTDataset serves its samples in its own per-epoch order, not Megatron-Core's
# (data/gpt_dataset.py), and the fixtures test the checkpoint, not the order.
DATA_DIR, DATA_NAME, DOCUMENTS = "megatron_data", "identical_docs", 64
# The model and run every fixture shares: tiny, fp32, dropout 0, Megatron's NullTokenizer. 128 ids with its
# end-of-document, a multiple of 32 x TP at TP 1 and 2: no vocabulary padding, whose logits Megatron-Core's cross
# entropy includes in the softmax and this project's excludes (parallel/cross_entropy.py).
COMMON_FLAGS = [
    "--num-layers", "2", "--hidden-size", "16", "--num-attention-heads", "4", "--seq-length", "16",
    "--max-position-embeddings", "16", "--micro-batch-size", "2", "--global-batch-size", "4", "--train-iters", "3",
    "--lr", "0.001", "--min-lr", "0.0001", "--lr-decay-style", "cosine", "--lr-warmup-iters", "1",
    "--weight-decay", "0.1", "--adam-beta1", "0.9", "--adam-beta2", "0.95", "--clip-grad", "1.0",
    "--init-method-std", "0.02", "--seed", "1234", "--data-path", f"tests/fixtures/{DATA_DIR}/{DATA_NAME}",
    "--split", "100,0,0", "--tokenizer-type", "NullTokenizer", "--vocab-size", "127",
    "--make-vocab-size-divisible-by", "32", "--hidden-dropout", "0", "--attention-dropout", "0", "--eval-iters", "0",
    "--ckpt-format", "torch_dist", "--transformer-impl", "local", "--save-interval", "2",
]
GPT2_FLAGS = ["--no-bias-gelu-fusion"]
LLAMA_FLAGS = ["--normalization", "RMSNorm", "--swiglu", "--ffn-hidden-size", "32", "--group-query-attention",
               "--num-query-groups", "2",
               "--position-embedding-type", "rope", "--disable-bias-linear", "--untie-embeddings-and-output-weights"]

FIXTURES = {
    "megatron_tp1": (1, GPT2_FLAGS),
    "megatron_tp2_swiglu_gqa": (2, LLAMA_FLAGS + ["--tensor-model-parallel-size", "2"]),
    "megatron_distopt_dp_reshardable": (4, LLAMA_FLAGS + ["--tensor-model-parallel-size", "2",
                                                          "--use-distributed-optimizer"]),
    "megatron_distopt_fully_reshardable": (2, GPT2_FLAGS + ["--use-distributed-optimizer",
                                                            "--dist-ckpt-optim-fully-reshardable"]),
    # two pipeline stages, the tied embedding on both (its own bucket in each stage's distributed optimizer)
    "megatron_pp2_distopt_dp_reshardable": (2, GPT2_FLAGS + ["--pipeline-model-parallel-size", "2",
                                                             "--use-distributed-optimizer"]),
    # a mixture of experts on the local spec (SequentialMLP: one module per expert), the plain optimizer; without
    # the linears' biases, as MoE models train (the local MLP adds an expert's fc2 bias in place to a view
    # autograd refuses at TP 1: mlp.py forward, a path TransformerEngine's layers do not take)
    "megatron_moe_sequential": (1, GPT2_FLAGS + ["--disable-bias-linear", "--num-experts", "4",
                                                 "--moe-router-topk", "2", "--moe-ffn-hidden-size", "32"]),
}
SAVE_ITERATION = 2


def megatron_parser() -> argparse.ArgumentParser:
    """The Megatron-LM flags the fixtures use, with Megatron-LM's dest names and defaults (arguments.py)."""
    p = argparse.ArgumentParser(prog="megatron_checkpoint_fixtures.py", allow_abbrev=False)
    add = p.add_argument
    for name, kind, default in [
        ("num-layers", int, None), ("hidden-size", int, None), ("ffn-hidden-size", int, None),
        ("num-attention-heads", int, None), ("num-query-groups", int, 1), ("seq-length", int, None),
        ("max-position-embeddings", int, None), ("micro-batch-size", int, None), ("global-batch-size", int, None),
        ("train-iters", int, None), ("lr", float, None), ("min-lr", float, 0.0), ("lr-decay-style", str, "linear"),
        ("lr-warmup-iters", int, 0), ("lr-decay-iters", int, None), ("lr-warmup-init", float, 0.0),
        ("weight-decay", float, 0.01), ("adam-beta1", float, 0.9), ("adam-beta2", float, 0.999),
        ("adam-eps", float, 1e-8), ("clip-grad", float, 1.0), ("init-method-std", float, 0.02),
        ("seed", int, 1234), ("tokenizer-type", str, None), ("vocab-size", int, None),
        ("make-vocab-size-divisible-by", int, 128), ("hidden-dropout", float, 0.1),
        ("attention-dropout", float, 0.1), ("eval-iters", int, 100), ("eval-interval", int, 1000),
        ("ckpt-format", str, "torch_dist"), ("transformer-impl", str, "transformer_engine"),
        ("save-interval", int, None), ("normalization", str, "LayerNorm"), ("norm-epsilon", float, 1e-5),
        ("position-embedding-type", str, "learned_absolute"), ("rotary-base", int, 10000),
        ("tensor-model-parallel-size", int, 1), ("pipeline-model-parallel-size", int, 1),
        ("split", str, None), ("save", str, None), ("load", str, None), ("data-cache-path", str, None),
        ("num-experts", int, None), ("moe-router-topk", int, 2), ("moe-ffn-hidden-size", int, None),
        ("moe-token-dispatcher-type", str, "allgather"),
    ]:
        add(f"--{name}", type=kind, default=default)
    for name in ("swiglu", "group-query-attention", "untie-embeddings-and-output-weights",
                 "use-distributed-optimizer", "dist-ckpt-optim-fully-reshardable", "no-load-optim", "no-load-rng"):
        add(f"--{name}", action="store_true")
    add("--data-path", nargs="*", default=None)
    add("--disable-bias-linear", action="store_false", dest="add_bias_linear")
    add("--no-bias-gelu-fusion", action="store_false", dest="bias_gelu_fusion")
    add("--no-bias-swiglu-fusion", action="store_false", dest="bias_swiglu_fusion")
    return p


def megatron_args(flags: list[str], world_size: int) -> argparse.Namespace:
    """The flags as Megatron-LM's parse_args + validate_args leave them (the fields this driver and a load read)."""
    args = megatron_parser().parse_args(flags)
    tp, pp = args.tensor_model_parallel_size, args.pipeline_model_parallel_size
    args.world_size = world_size
    args.data_parallel_size = world_size // (tp * pp)
    args.rank = 0
    if not args.group_query_attention:
        args.num_query_groups = args.num_attention_heads
    if args.ffn_hidden_size is None:  # validate_args
        args.ffn_hidden_size = (int((4 * args.hidden_size * 2 / 3) / 64) * 64 if args.swiglu
                                else 4 * args.hidden_size)
    args.kv_channels = args.hidden_size // args.num_attention_heads
    if not args.add_bias_linear:
        args.bias_gelu_fusion = False
    args.add_qkv_bias = args.add_bias_linear
    args.add_position_embedding = args.position_embedding_type == "learned_absolute"
    args.use_dist_ckpt = args.ckpt_format != "torch"
    args.padded_vocab_size = vocab_size_with_padding(args.vocab_size + 1, args)  # _NullTokenizer: + eod
    args.params_dtype = torch.float32
    args.fp16 = args.bf16 = False
    args.consumed_train_samples = args.consumed_valid_samples = args.skipped_train_samples = 0
    if args.num_experts and args.moe_ffn_hidden_size is None:  # validate_args
        args.moe_ffn_hidden_size = args.ffn_hidden_size
    args.virtual_pipeline_model_parallel_size = None
    args.no_save_optim = args.no_save_rng = None
    args.finetune = False
    args.iteration = 0
    if args.split is None:
        args.split = "969, 30, 1"
    # Values of types outside Python's builtins that Megatron-LM's parse_args leaves in every args (the reason
    # megatron.core.safe_globals lists them for loading a checkpoint): a real common.pt holds them.
    from megatron.core.transformer.enums import AttnBackend
    args.attention_backend = AttnBackend.auto
    args.exit_signal = signal.SIGTERM
    return args


def vocab_size_with_padding(orig: int, args) -> int:
    """megatron/training/tokenizer/tokenizer.py _vocab_size_with_padding."""
    multiple = args.make_vocab_size_divisible_by * args.tensor_model_parallel_size
    return int(math.ceil(orig / multiple) * multiple)


# ---- the CPU workarounds (module docstring) ---------------------------------------------------------------

class CudaToCpu(torch.overrides.TorchFunctionMode):
    """Tensors Megatron-Core creates with device="cuda" (its optimizers' scale, its grad-norm buffers) on the CPU."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if str(kwargs.get("device", "")).startswith("cuda"):
            kwargs["device"] = "cpu"
        return func(*args, **kwargs)


def cpu_workarounds() -> None:
    torch.cuda.current_device = lambda: "cpu"
    torch.cuda.synchronize = lambda *args, **kwargs: None
    torch.Tensor.cuda = lambda self, *args, **kwargs: self
    cpu_type = torch.Tensor.type

    def cuda_type(self, *args, **kwargs):
        name = cpu_type(self, *args, **kwargs)
        cpu = not args and not kwargs and self.device.type == "cpu" and ".cuda." not in name
        return name.replace("torch.", "torch.cuda.", 1) if cpu else name
    torch.Tensor.type = cuda_type
    CudaToCpu().__enter__()
    from megatron.core.tensor_parallel import random as tp_random

    class CpuTracker(tp_random.CudaRNGStatesTracker):
        @contextlib.contextmanager
        def fork(self, name=None):
            yield

    from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer
    set_states = DistributedOptimizer._set_main_param_and_optimizer_states

    def set_saved_states(self, model_param, tensors):
        group_index, group_order = self.model_param_group_index_map[model_param]
        main_param = self.optimizer.param_groups[group_index]["params"][group_order]
        with torch.no_grad():
            return set_states(self, model_param, _KeepStep(tensors, self.optimizer.state[main_param]))
    DistributedOptimizer._set_main_param_and_optimizer_states = set_saved_states

    # moe_utils.py imports te_general_gemm only where TransformerEngine is installed, and the router's gating
    # (RouterGatingLinearFunction.forward) reads the name either way: without TE it is None, the torch matmul path
    from megatron.core.transformer.moe import moe_utils
    if not hasattr(moe_utils, "te_general_gemm"):
        moe_utils.te_general_gemm = None

    tracker = CpuTracker()
    tp_random._CUDA_RNG_STATE_TRACKER = tracker
    tp_random._CUDA_RNG_STATE_TRACKER_INITIALIZED = True
    tp_random.get_cuda_rng_tracker = lambda *a, **k: tracker


class _KeepStep(dict):
    """The saved states, where torch's AdamW state also holds the per-parameter "step" that load_state_dict has just
    set from the param groups (a checkpoint does not save it): that entry reads the value already there."""

    def __init__(self, saved: dict, live: dict):
        super().__init__(saved)
        self.live = live

    def __missing__(self, key):
        if key == "step":
            return self.live["step"]
        raise KeyError(key)


# ---- the run ----------------------------------------------------------------------------------------------

class Run:
    """One launch's model, DDP, optimizer, scheduler and data, built as Megatron-LM's setup_model_and_optimizer."""

    def __init__(self, args):
        from megatron.core import parallel_state as mpu
        from megatron.core import tensor_parallel
        from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
        from megatron.core.models.gpt import GPTModel
        from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
        from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
        from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler
        from megatron.core.transformer import TransformerConfig

        self.args = args
        mpu.initialize_model_parallel(args.tensor_model_parallel_size, args.pipeline_model_parallel_size)
        # megatron/training/initialize.py _set_random_seed: seed + 100 x pipeline rank
        seed = args.seed + 100 * mpu.get_pipeline_model_parallel_rank()
        random.seed(seed)
        np.random.seed(seed)
        torch.manual_seed(seed)
        swiglu = args.swiglu
        config = TransformerConfig(
            num_layers=args.num_layers, hidden_size=args.hidden_size, ffn_hidden_size=args.ffn_hidden_size,
            num_attention_heads=args.num_attention_heads, num_query_groups=args.num_query_groups,
            kv_channels=args.kv_channels, hidden_dropout=args.hidden_dropout,
            attention_dropout=args.attention_dropout, layernorm_epsilon=args.norm_epsilon,
            init_method_std=args.init_method_std, normalization=args.normalization,
            add_bias_linear=args.add_bias_linear, add_qkv_bias=args.add_qkv_bias,
            gated_linear_unit=swiglu, activation_func=torch.nn.functional.silu if swiglu else
            torch.nn.functional.gelu,
            bias_activation_fusion=args.bias_swiglu_fusion if swiglu else args.bias_gelu_fusion,
            tensor_model_parallel_size=args.tensor_model_parallel_size,
            pipeline_model_parallel_size=args.pipeline_model_parallel_size,
            params_dtype=torch.float32, pipeline_dtype=torch.float32, use_cpu_initialization=True,
            perform_initialization=True, masked_softmax_fusion=False, bias_dropout_fusion=True,
            apply_rope_fusion=False, gradient_accumulation_fusion=False, persist_layer_norm=False,
            sequence_parallel=False, num_moe_experts=args.num_experts, moe_router_topk=args.moe_router_topk,
            moe_ffn_hidden_size=args.moe_ffn_hidden_size, moe_token_dispatcher_type=args.moe_token_dispatcher_type,
        )
        self.config = config
        spec = get_gpt_layer_local_spec(num_experts=args.num_experts, normalization=args.normalization)
        model = GPTModel(
            config=config, transformer_layer_spec=spec, vocab_size=args.padded_vocab_size,
            max_sequence_length=args.max_position_embeddings,
            pre_process=mpu.is_pipeline_first_stage(), post_process=mpu.is_pipeline_last_stage(),
            share_embeddings_and_output_weights=not args.untie_embeddings_and_output_weights,
            position_embedding_type=args.position_embedding_type, rotary_base=args.rotary_base)
        ddp_config = DistributedDataParallelConfig(
            grad_reduce_in_fp32=False, overlap_grad_reduce=False,
            use_distributed_optimizer=args.use_distributed_optimizer)
        self.model = [DistributedDataParallel(config=config, ddp_config=ddp_config, module=model)]
        self.model[0].broadcast_params()
        opt_config = OptimizerConfig(
            optimizer="adam", lr=args.lr, min_lr=args.min_lr, weight_decay=args.weight_decay,
            adam_beta1=args.adam_beta1, adam_beta2=args.adam_beta2, adam_eps=args.adam_eps,
            clip_grad=args.clip_grad, use_distributed_optimizer=args.use_distributed_optimizer,
            params_dtype=torch.float32)
        self.optimizer = get_megatron_optimizer(opt_config, self.model)
        # training.py train(): the loss scale and the end-of-step gradient work (the DP all-reduce) of the schedule
        from megatron.core.distributed import finalize_model_grads
        config.grad_scale_func = self.optimizer.scale_loss
        config.finalize_model_grads_func = finalize_model_grads
        # megatron/training/training.py get_optimizer_param_scheduler, iteration-based
        decay_iters = args.lr_decay_iters or args.train_iters
        self.scheduler = OptimizerParamScheduler(
            self.optimizer, init_lr=args.lr_warmup_init, max_lr=args.lr, min_lr=args.min_lr,
            lr_warmup_steps=args.lr_warmup_iters * args.global_batch_size,
            lr_decay_steps=decay_iters * args.global_batch_size, lr_decay_style=args.lr_decay_style,
            start_wd=args.weight_decay, end_wd=args.weight_decay,
            wd_incr_steps=args.train_iters * args.global_batch_size, wd_incr_style="constant")
        self.train_set = self._train_dataset()
        self.tensor_parallel = tensor_parallel
        self.mpu = mpu

    def _train_dataset(self):
        """pretrain_gpt.py's train_valid_test_datasets_provider: GPTDataset over --data-path, split by --split."""
        from megatron.core.datasets.blended_megatron_dataset_builder import BlendedMegatronDatasetBuilder
        from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig
        args = self.args
        tokenizer = SimpleNamespace(vocab_size=args.vocab_size + 1, eod=args.vocab_size, pad=-1,
                                    unique_identifiers={"class": "_NullTokenizer", "vocab_size": args.vocab_size})
        config = GPTDatasetConfig(
            random_seed=args.seed, sequence_length=args.seq_length, blend=([str(ROOT / path) for path in args.data_path], None),
            blend_per_split=None, split=args.split, tokenizer=tokenizer,
            path_to_cache=args.data_cache_path or os.environ["MEGATRON_FIXTURE_CACHE"],  # not beside the data
            reset_position_ids=False, reset_attention_mask=False, eod_mask_loss=False, create_attention_mask=True)
        # training.py build_train_valid_test_datasets: train_iters x global batch; no evaluation (--eval-iters 0)
        sizes = [args.train_iters * args.global_batch_size, 0, 0]
        with contextlib.redirect_stdout(sys.stderr):
            train, _, _ = BlendedMegatronDatasetBuilder(GPTDataset, sizes, lambda: True, config).build()
        return train

    def micro_batches(self, consumed: int):
        """MegatronPretrainingSampler: the global batch after `consumed` samples, this DP rank's micro-batches."""
        args, mpu = self.args, self.mpu
        dp_rank, dp = mpu.get_data_parallel_rank(), mpu.get_data_parallel_world_size()
        mbs = args.micro_batch_size
        per_rank = args.global_batch_size // dp
        batches = []
        for m in range(per_rank // mbs):
            # the sampler yields micro-batch-times-dp index windows; this rank's is [dp_rank x mbs, ...)
            start = consumed + m * mbs * dp + dp_rank * mbs
            samples = [self.train_set[i] for i in range(start, start + mbs)]
            batches.append({key: torch.stack([torch.as_tensor(s[key]) for s in samples]) for key in samples[0]})
        return batches

    def train_step(self, consumed: int) -> float:
        """megatron/training/training.py train_step with pretrain_gpt.py's forward_step and loss_func."""
        from megatron.core.pipeline_parallel import get_forward_backward_func
        args, mpu = self.args, self.mpu
        batches = self.micro_batches(consumed)
        for chunk in self.model:
            chunk.zero_grad_buffer()
        self.optimizer.zero_grad()

        def forward_step(data_iterator, model):
            batch = next(data_iterator)
            output = model(batch["tokens"], batch["position_ids"], batch["attention_mask"], labels=batch["labels"])

            def loss_func(output_tensor):
                losses = output_tensor.view(-1).float()
                mask = batch["loss_mask"].view(-1).float()
                loss = torch.sum(losses * mask)
                tokens = mask.sum().clone().detach().to(torch.int)
                return loss, tokens, {"lm loss": torch.cat([loss.clone().detach().view(1), tokens.view(1)])}
            return output, loss_func

        losses = get_forward_backward_func()(
            forward_step_func=forward_step, data_iterator=iter(batches), model=self.model,
            num_microbatches=len(batches), seq_length=args.seq_length, micro_batch_size=args.micro_batch_size,
            forward_only=False)
        success, _, _ = self.optimizer.step()
        if success:
            self.scheduler.step(increment=args.global_batch_size)
        # train_step's loss reduction: the sum of losses and of tokens over micro-batches and the DP group
        total = torch.zeros(2)
        if mpu.is_pipeline_last_stage():
            for report in losses:
                total += report["lm loss"].float()
        torch.distributed.all_reduce(total, group=mpu.get_data_parallel_group())
        torch.distributed.all_reduce(total, group=mpu.get_pipeline_model_parallel_group())
        return float(total[0] / total[1])


# ---- save and load, as megatron/training/checkpointing.py ---------------------------------------------------

def rng_state(run: Run):
    """get_rng_state for torch_dist (without CUDA: module docstring)."""
    from megatron.core.dist_checkpointing.mapping import ShardedObject
    mpu = run.mpu
    state = [{"random_rng_state": random.getstate(), "np_rng_state": np.random.get_state(),
              "torch_rng_state": torch.get_rng_state()}]
    return ShardedObject("rng_state", state,
                         (mpu.get_pipeline_model_parallel_world_size(), mpu.get_tensor_model_parallel_world_size()),
                         (mpu.get_pipeline_model_parallel_rank(), mpu.get_tensor_model_parallel_rank()),
                         replica_id=mpu.get_data_parallel_rank(with_context_parallel=True))


def sharded_metadata(args, mpu) -> dict:
    """_build_sharded_state_dict_metadata."""
    metadata = {}
    if args.use_distributed_optimizer:
        metadata["distrib_optim_sharding_type"] = ("fully_reshardable" if args.dist_ckpt_optim_fully_reshardable
                                                   else "dp_reshardable")
        if args.dist_ckpt_optim_fully_reshardable:
            metadata["distrib_optim_fully_reshardable_mem_efficient"] = False
    metadata["singleton_local_shards"] = False
    metadata["chained_optim_avoid_prefix"] = True
    metadata["dp_cp_group"] = mpu.get_data_parallel_group(with_context_parallel=True)
    return metadata


def generate_state_dict(run: Run, iteration, metadata, rng, optimizer=True, loading=False):
    """checkpointing.py generate_state_dict for ckpt_format torch_dist."""
    args = run.args
    state_dict = {"args": args, "checkpoint_version": 3.0}
    if iteration is not None:
        state_dict["iteration"] = iteration
    state_dict["model"] = run.model[0].module.sharded_state_dict(metadata=metadata)  # unwrap_model
    if optimizer:
        kwargs = dict(metadata=metadata, is_loading=True) if loading else dict(metadata=metadata)
        state_dict["optimizer"] = run.optimizer.sharded_state_dict(state_dict, **kwargs)
        state_dict["opt_param_scheduler"] = run.scheduler.state_dict()
    if rng is not None:
        state_dict["rng_state"] = rng
    return state_dict


def checkpoint_dir(save: str, iteration: int) -> str:
    return os.path.join(save, f"iter_{iteration:07d}")  # get_checkpoint_name(..., return_base_dir=True)


def preprocess_common_state_dict(common: dict) -> dict:
    """megatron/training/training.py preprocess_common_state_dict: the ranks' args differ in rank alone."""
    common = dict(common)
    common["args"] = {k: v for k, v in vars(common["args"]).items() if k not in ("rank", "local_rank")}
    return common


def save_checkpoint(run: Run, iteration: int, consumed: int) -> None:
    from megatron.core import dist_checkpointing
    from megatron.core.dist_checkpointing.serialization import get_default_save_sharded_strategy
    args, mpu = run.args, run.mpu
    args.consumed_train_samples = consumed
    args.iteration = iteration
    metadata = sharded_metadata(args, mpu)
    state_dict = generate_state_dict(run, iteration, metadata, rng_state(run))
    state_dict["num_floating_point_operations_so_far"] = 0
    name = checkpoint_dir(args.save, iteration)
    if torch.distributed.get_rank() == 0:
        os.makedirs(name, exist_ok=True)
    torch.distributed.barrier()
    content = {k: v for k, v in metadata.items() if k != "dp_cp_group"}  # _clean_metadata_for_serialization
    dist_checkpointing.save(state_dict, name, get_default_save_sharded_strategy(args.ckpt_format),
                            validate_access_integrity=True, content_metadata=content,
                            preprocess_common_before_consistancy_check=preprocess_common_state_dict)
    torch.distributed.barrier()
    if torch.distributed.get_rank() == 0:
        with open(os.path.join(args.save, "latest_checkpointed_iteration.txt"), "w") as f:
            f.write(str(iteration))
    torch.distributed.barrier()


def load_checkpoint(run: Run) -> tuple[int, int]:
    """checkpointing.py load_checkpoint for a torch_dist folder: (iteration, consumed samples)."""
    from megatron.core import dist_checkpointing
    from megatron.core.dist_checkpointing.serialization import get_default_load_sharded_strategy
    args, mpu = run.args, run.mpu
    with open(os.path.join(args.load, "latest_checkpointed_iteration.txt")) as f:
        iteration = int(f.read().strip())
    name = checkpoint_dir(args.load, iteration)
    common = dist_checkpointing.load_common_state_dict(name)
    ckpt_args = common.get("args", SimpleNamespace())
    ckpt_tp_pp = (getattr(ckpt_args, "tensor_model_parallel_size", 1),
                  getattr(ckpt_args, "pipeline_model_parallel_size", 1))
    run_tp_pp = (args.tensor_model_parallel_size, args.pipeline_model_parallel_size)
    load_rng = ckpt_tp_pp == run_tp_pp and not args.no_load_rng and not getattr(ckpt_args, "no_save_rng", False)
    metadata = dist_checkpointing.load_content_metadata(preloaded_state_dict=common) or {}
    load_optim = not args.no_load_optim and not getattr(ckpt_args, "no_save_optim", False)
    if load_optim and args.use_distributed_optimizer and ckpt_tp_pp != run_tp_pp:
        from megatron.core.optimizer import DistributedOptimizer
        kind = metadata.get("distrib_optim_sharding_type")
        if kind not in DistributedOptimizer.checkpoint_fully_reshardable_formats:
            raise RuntimeError(f"(TP, PP) mismatch after resume: not supported for the distributed optimizer with "
                               f"sharding type {kind}")
    metadata["dp_cp_group"] = mpu.get_data_parallel_group(with_context_parallel=True)
    if load_optim and args.use_distributed_optimizer:  # the CPU workaround (module docstring)
        for optimizer in getattr(run.optimizer, "chained_optimizers", [run.optimizer]):
            optimizer._init_optimizer_states_with_dummy_values()
    sharded = generate_state_dict(run, None, metadata, rng_state(run) if load_rng else None,
                                  optimizer=load_optim, loading=True)
    state_dict = dist_checkpointing.load(sharded, name, get_default_load_sharded_strategy(name),
                                         strict="assume_ok_unexpected")
    iteration = state_dict["iteration"]
    consumed = getattr(state_dict["args"], "consumed_train_samples", 0)
    args.consumed_train_samples = consumed
    run.model[0].load_state_dict(state_dict["model"], strict=True)
    if load_optim:
        run.optimizer.load_state_dict(state_dict["optimizer"])
        run.scheduler.load_state_dict(state_dict["opt_param_scheduler"])
    if load_rng:
        rng = state_dict["rng_state"][0]
        random.setstate(rng["random_rng_state"])
        np.random.set_state(rng["np_rng_state"])
        torch.set_rng_state(rng["torch_rng_state"])
    torch.distributed.barrier()
    return iteration, consumed


# ---- launches -------------------------------------------------------------------------------------------------

def rank_main(rank: int, world: int, port: int, flags: list[str], mode: str, result_file: str) -> None:
    os.chdir(ROOT)  # the flags' paths are the repository's, as a launch from its root types them
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_RANK=str(rank))
    torch.set_num_threads(1)
    warnings.simplefilter("ignore")
    torch.distributed.init_process_group("gloo", rank=rank, world_size=world)
    cpu_workarounds()
    from megatron.core.num_microbatches_calculator import init_num_microbatches_calculator
    args = megatron_args(flags, world)
    args.rank = args.local_rank = rank
    init_num_microbatches_calculator(rank, None, args.global_batch_size, args.micro_batch_size,
                                     args.data_parallel_size)
    run = Run(args)
    losses = {}
    if mode == "straight":
        iteration, consumed = 0, 0
        while iteration < args.train_iters:
            losses[iteration + 1] = run.train_step(consumed)
            iteration += 1
            consumed += args.global_batch_size
    elif mode == "save":
        iteration, consumed = 0, 0
        while iteration < SAVE_ITERATION:
            losses[iteration + 1] = run.train_step(consumed)
            iteration += 1
            consumed += args.global_batch_size
        save_checkpoint(run, iteration, consumed)
    else:
        iteration, consumed = load_checkpoint(run)
        losses[iteration + 1] = run.train_step(consumed)
    if rank == 0:
        with open(result_file, "w") as f:
            json.dump({str(k): v for k, v in losses.items()}, f)
    torch.distributed.destroy_process_group()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def write_data(out: Path) -> None:
    """The fixtures' data (see DATA_DIR), written by megatron.core's IndexedDatasetBuilder."""
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder
    folder = out / DATA_DIR
    folder.mkdir(parents=True, exist_ok=True)
    prefix = str(folder / DATA_NAME)
    builder = IndexedDatasetBuilder(prefix + ".bin", dtype=np.uint16)  # DType.optimal_dtype of a small vocabulary
    eod = int(megatron_args(COMMON_FLAGS, 1).vocab_size)
    seq = int(COMMON_FLAGS[COMMON_FLAGS.index("--seq-length") + 1])
    for _ in range(DOCUMENTS):
        builder.add_document(torch.tensor(list(range(1, seq)) + [eod]), [seq])
    builder.finalize(prefix + ".idx")


def launch(nproc: int, flags: list[str], mode: str) -> dict[int, float]:
    result = Path(os.environ.get("TMPDIR", "/tmp")) / f"megatron_fixture_{os.getpid()}.json"
    mp.start_processes(rank_main, args=(nproc, free_port(), flags, mode, str(result)), nprocs=nproc,
                       start_method="spawn", join=True)
    losses = {int(k): v for k, v in json.loads(result.read_text()).items()}
    result.unlink()
    return losses


def write_fixture(name: str, out: Path) -> None:
    nproc, extra = FIXTURES[name]
    flags = COMMON_FLAGS + extra
    target = out / name
    if target.exists():
        shutil.rmtree(target)
    folder = str(target.relative_to(ROOT)) if target.is_relative_to(ROOT) else str(target)  # as a launch types it
    saved = launch(nproc, flags + ["--save", folder], "save")
    resumed = launch(nproc, flags + ["--load", folder], "load")
    straight = launch(nproc, flags, "straight")
    record = {"world_size": nproc, "flags": flags, "losses": {str(k): v for k, v in {**saved, **resumed}.items()},
              "uninterrupted_losses": {str(k): v for k, v in straight.items()},
              "megatron_core": __import__("megatron.core", fromlist=["__version__"]).__version__,
              "torch": torch.__version__,
              "written_by": "scripts/megatron_checkpoint_fixtures.py (iterations 1-2 and the save by one launch; "
                            "iteration 3 by a second launch resumed from the save)"}
    (target / "megatron_losses.json").write_text(json.dumps(record, indent=1) + "\n")
    size = sum(f.stat().st_size for f in target.rglob("*") if f.is_file())
    print(f"{name}: losses {record['losses']}; {size} bytes")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    fixtures = sub.add_parser("fixtures")
    fixtures.add_argument("--only", choices=sorted(FIXTURES))
    fixtures.add_argument("--out", type=Path, default=ROOT / "tests" / "fixtures")
    resume = sub.add_parser("resume")
    resume.add_argument("--load", required=True)
    resume.add_argument("--nproc", type=int, default=1)
    resume.add_argument("flags", nargs=argparse.REMAINDER)
    ns = parser.parse_args(argv)
    os.environ.setdefault("MEGATRON_FIXTURE_CACHE", tempfile.mkdtemp(prefix="megatron_fixture_cache_"))
    if ns.command == "fixtures":
        write_data(ns.out)
        for name in [ns.only] if ns.only else FIXTURES:
            write_fixture(name, ns.out)
        return 0
    flags = [f for f in ns.flags if f != "--"]
    losses = launch(ns.nproc, flags + ["--load", ns.load], "load")
    (iteration, loss), = losses.items()
    print(json.dumps({"iteration": iteration, "loss": loss}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
