#!/usr/bin/env python
"""Write tests/fixtures/deepspeed_checkpoints with DeepSpeed's own engine, and record DeepSpeed's next losses.

    DS_ACCELERATOR=cpu python scripts/tools/deepspeed_checkpoint_fixtures.py [--out DIR] [--cases NAME ...]

Each case (Megatron-DeepSpeed's GPT at ZeRO 1-3 and as GPTModelPipe; transformers' GPT-2, Llama, Mixtral, Phi-3)
trains on 2 gloo ranks and saves at iteration 2; DeepSpeed continues each save one step, from its ZeRO files and
their universal form. Needs requirements-bench.txt."""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

SCRIPT = Path(__file__).resolve()
REPO_ROOT = SCRIPT.parents[2]
for path in (str(REPO_ROOT), str(SCRIPT.parent), str(REPO_ROOT / "scripts" / "bench")):  # run_ranks
    if path not in sys.path:
        sys.path.insert(0, path)

from base.errors import OneLineArgumentParser, run_tool  # noqa: E402  (standard library only)

FIXTURES = REPO_ROOT / "tests" / "fixtures" / "deepspeed_checkpoints"
SEED, SEQ, HIDDEN, HEADS, LAYERS = 1234, 8, 16, 2, 2
MICRO_BATCH, WORLD, TRAIN_ITERS, SAVED_AT = 2, 2, 3, 2
GLOBAL_BATCH = MICRO_BATCH * WORLD
LR, MIN_LR, WEIGHT_DECAY, BETAS, EPS, CLIP = 1e-3, 1e-4, 0.01, (0.9, 0.999), 1e-8, 1.0
GPT2_VOCAB = 101   # NullTokenizer --vocab-size 100: ids 0..99 and the end of document, 100
MEGATRON_VOCAB = 128  # NullTokenizer 127, no padding rows: Megatron-DeepSpeed's loss counts padding columns, ours not
DATA_PREFIX = "data/tokens"
STAGES = (1, 2, 3)

# Our run that continues each case: pretrain_gpt.py OURS_FLAGS[case] --data-path FIXTURE/data/tokens --load CASE
COMMON_FLAGS = ["--num-layers", str(LAYERS), "--hidden-size", str(HIDDEN), "--num-attention-heads", str(HEADS),
                "--seq-length", str(SEQ), "--max-position-embeddings", str(SEQ), "--micro-batch-size",
                str(MICRO_BATCH), "--global-batch-size", str(GLOBAL_BATCH), "--train-iters", str(TRAIN_ITERS),
                "--lr", str(LR), "--min-lr", str(MIN_LR), "--lr-decay-style", "linear", "--lr-decay-iters",
                str(TRAIN_ITERS), "--weight-decay", str(WEIGHT_DECAY), "--adam-beta1", str(BETAS[0]),
                "--adam-beta2", str(BETAS[1]), "--adam-eps", str(EPS), "--clip-grad", str(CLIP),
                "--tokenizer-type", "NullTokenizer", "--split", "100,0,0", "--seed", str(SEED),
                "--hidden-dropout", "0", "--attention-dropout", "0", "--eval-iters", "0", "--log-interval", "1",
                "--device", "cpu"]
# Megatron-DeepSpeed's scheduler decays linearly over the run; the GPT-2 script has none (a constant rate), and
# GPT2LMHeadModel's activation is gelu_new, GeLU's tanh form
MEGATRON_FLAGS = COMMON_FLAGS + ["--vocab-size", str(MEGATRON_VOCAB - 1), "--activation", "gelu"]
PLAIN_FLAGS = COMMON_FLAGS[:COMMON_FLAGS.index("--min-lr")] + ["--lr-decay-style", "constant"] \
    + COMMON_FLAGS[COMMON_FLAGS.index("--weight-decay"):] + ["--vocab-size", str(GPT2_VOCAB - 1)]
GPT2_FLAGS = PLAIN_FLAGS + ["--activation", "gelu_tanh"]
# transformers' LlamaForCausalLM (LLAMA below): RMSNorm, SwiGLU, rotary halves, no biases, an untied output layer,
# one key/value head; Mixtral's experts on every layer, the top 2 of 4 renormalized (Megatron-Core's softmax over the
# top k), no auxiliary loss in the loss either side reports
FFN, KV_HEADS, EXPERTS, TOPK = 32, 1, 4, 2
LLAMA_FLAGS = PLAIN_FLAGS + ["--swiglu", "--normalization", "RMSNorm", "--position-embedding-type", "rope",
                             "--rotary-base", "10000", "--disable-bias-linear", "--untie-embeddings-and-output-weights",
                             "--group-query-attention", "--num-query-groups", str(KV_HEADS), "--ffn-hidden-size",
                             str(FFN), "--layernorm-epsilon", "1e-05"]
MIXTRAL_FLAGS = LLAMA_FLAGS + ["--num-experts", str(EXPERTS), "--moe-router-topk", str(TOPK), "--moe-ffn-hidden-size",
                               str(FFN)]
LLAMA = dict(vocab_size=GPT2_VOCAB, hidden_size=HIDDEN, intermediate_size=FFN, num_hidden_layers=LAYERS,
             num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, max_position_embeddings=SEQ, rms_norm_eps=1e-5,
             tie_word_embeddings=False, bos_token_id=None, eos_token_id=None, pad_token_id=None,
             rope_parameters={"rope_type": "default", "rope_theta": 10000.0},  # Mixtral's own default is 1e6
             attn_implementation="eager")  # plain matmuls and softmax (GPT-2's cases ran sdpa, its default)
# each plain-DeepSpeed transformers case: its config class and arguments, and our flags
TRANSFORMERS_MODELS = {
    "hf_gpt2": ("GPT2Config", dict(vocab_size=GPT2_VOCAB, n_positions=SEQ, n_embd=HIDDEN, n_layer=LAYERS,
                                   n_head=HEADS, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                                   layer_norm_epsilon=1e-5), GPT2_FLAGS),
    "hf_llama": ("LlamaConfig", LLAMA, LLAMA_FLAGS),
    "hf_mixtral": ("MixtralConfig", dict(LLAMA, num_local_experts=EXPERTS, num_experts_per_tok=TOPK), MIXTRAL_FLAGS),
    # Llama's blocks under Phi-3's fused names (qkv_proj, gate_up_proj): the same flags
    "hf_phi3": ("Phi3Config", dict(LLAMA, resid_pdrop=0.0, embd_pdrop=0.0, attention_dropout=0.0), LLAMA_FLAGS),
}


def progress(message: str) -> None:
    print(f"[deepspeed fixtures {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# ----------------------------------------------------------------------------- the data both sides read

def write_tokens(out: Path) -> str:
    """Token documents of ids 0..99, each ended by 100 (a NullTokenizer's end of document at --vocab-size 100)."""
    import numpy as np

    from data.indexed import IndexedDatasetWriter

    prefix = out / DATA_PREFIX
    prefix.parent.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(SEED)
    with IndexedDatasetWriter(str(prefix), np.uint16) as writer:
        for _ in range(24):
            writer.add_document(np.append(rng.integers(0, GPT2_VOCAB - 1, rng.integers(3, 20)), GPT2_VOCAB - 1))
        writer.finalize()
    return str(prefix)


def global_batches(prefix: str, cache_dir: str) -> list[list[list[int]]]:
    """Each iteration's global batch of samples (seq + 1 tokens each), as our run builds them."""
    from data.gpt_dataset import build_train_valid_test_datasets

    train, _, _ = build_train_valid_test_datasets([prefix], "100,0,0", SEQ, SEED,
                                                  (TRAIN_ITERS * GLOBAL_BATCH, 0, 0), cache_dir=cache_dir,
                                                  vocab_size=GPT2_VOCAB)
    return [[train[i]["tokens"].tolist() for i in range(step * GLOBAL_BATCH, (step + 1) * GLOBAL_BATCH)]
            for step in range(TRAIN_ITERS)]


# ----------------------------------------------------------------------------- orchestration

def run_case(case: dict, workdir: Path) -> dict:
    """Both ranks of one case; returns rank 0's record (its losses)."""
    from benchmark_zero import run_ranks

    result_dir = workdir / f"{case['name']}-{case['phase']}"
    result_dir.mkdir(parents=True, exist_ok=True)
    spec_path = result_dir / "spec.json"
    spec_path.write_text(json.dumps(case))
    failure, ranks, _ = run_ranks(SCRIPT, spec_path, result_dir, WORLD, result_dir / "log", timeout=900)
    if failure:
        raise RuntimeError(f"{case['name']} ({case['phase']}): {failure}")
    return ranks[0]


def to_universal(save_dir: Path, inject_missing_state: bool) -> str | None:
    """deepspeed/checkpoint/ds_to_universal.py, as its command line runs it; None, or the last line of its error
    (its output folder then removed: nothing half-converted stays in the fixture). `inject_missing_state`: its own
    flag for a checkpoint whose client saved no universal_checkpoint_info (a plain DeepSpeed script)."""
    import subprocess

    output = save_dir / f"global_step{SAVED_AT}_universal"
    command = [sys.executable, "-m", "deepspeed.checkpoint.ds_to_universal", "--input_folder",
               str(save_dir / f"global_step{SAVED_AT}"), "--output_folder", str(output),
               "--num_extract_workers", "1", "--num_merge_workers", "1"]
    command += ["--inject_missing_state"] if inject_missing_state else []
    completed = subprocess.run(command, capture_output=True, text=True, env=dict(os.environ, DS_ACCELERATOR="cpu"))
    if completed.returncode == 0:
        return None
    shutil.rmtree(output, ignore_errors=True)
    return completed.stderr.strip().splitlines()[-1]


def remove_copied_tools(save_dir: Path) -> None:
    for tool in save_dir.glob("zero_to_*.py"):
        tool.unlink()


def main(argv=None) -> int:
    parser = OneLineArgumentParser(prog="deepspeed_checkpoint_fixtures.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=FIXTURES, help="where to write (default: the committed fixtures)")
    parser.add_argument("--cases", nargs="+", metavar="NAME", help="only these cases, the others kept")
    args = parser.parse_args(argv)
    import deepspeed
    import torch
    import transformers

    out = args.out.resolve()
    if out.exists() and not args.cases:
        shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)
    prefix = write_tokens(out)  # the same tokens each time (seeded)
    kept = json.loads((out / "losses.json").read_text())["cases"] if args.cases and (out / "losses.json").is_file() \
        else {}
    record = {"written_by": f"scripts/tools/deepspeed_checkpoint_fixtures.py with deepspeed {deepspeed.__version__}, "
                            f"torch {torch.__version__}, transformers {transformers.__version__}, "
                            f"{WORLD} gloo ranks (DS_ACCELERATOR=cpu)",
              "cases": kept}
    with tempfile.TemporaryDirectory(prefix="ds-fixtures-") as work:
        batches = global_batches(prefix, str(Path(work) / "cache"))
        for cache in (out / "data").glob("*.json"):  # the token-range check's cache beside the data: not data
            cache.unlink()
        cases = [("hf_gpt2_zero2", "hf_gpt2", 2)] + [(f"megatron_deepspeed_zero{stage}", "megatron_deepspeed", stage)
                                                     for stage in STAGES] \
            + [("megatron_deepspeed_pipe_zero1", "megatron_deepspeed_pipe", 1), ("hf_llama_zero2", "hf_llama", 2),
               ("hf_llama_zero3", "hf_llama", 3), ("hf_mixtral_zero3", "hf_mixtral", 3), ("hf_phi3_zero1", "hf_phi3", 1)]
        for name, model, stage in cases:
            if args.cases and name not in args.cases:
                continue
            save_dir = out / name
            shutil.rmtree(save_dir, ignore_errors=True)
            case = {"name": name, "model": model, "stage": stage, "save_dir": str(save_dir), "batches": batches}
            progress(f"{name}: training {TRAIN_ITERS} iterations, saving at {SAVED_AT}")
            trained = run_case(dict(case, phase="train"), Path(work))
            remove_copied_tools(save_dir)
            progress(f"{name}: DeepSpeed continues from its checkpoint")
            resumed = run_case(dict(case, phase="resume"), Path(work))
            losses = {"losses": trained["losses"], "deepspeed_resumed": resumed["losses"]}
            progress(f"{name}: ds_to_universal, and DeepSpeed continues from the universal checkpoint")
            failure = to_universal(save_dir, inject_missing_state=model in TRANSFORMERS_MODELS)
            if failure is None:
                losses["deepspeed_resumed_from_universal"] = run_case(dict(case, phase="universal"),
                                                                      Path(work))["losses"]
            else:
                progress(f"{name}: ds_to_universal failed: {failure}")
                losses["ds_to_universal_failed"] = failure
            flags = MEGATRON_FLAGS if model.startswith("megatron_deepspeed") else TRANSFORMERS_MODELS[model][2]
            record["cases"][name] = {"zero_stage": stage, "saved_at": SAVED_AT, **losses, "our_flags": flags}
    (out / "losses.json").write_text(json.dumps(record, indent=1) + "\n")
    progress(f"wrote {out} ({sum(p.stat().st_size for p in out.rglob('*') if p.is_file())} bytes)")
    return 0


# ----------------------------------------------------------------------------- one rank

class OptimizerParamScheduler:
    """Megatron-DeepSpeed's megatron/optimizer_param_scheduler.py at what these runs use (no warmup, linear or
    constant decay in samples, constant weight decay): `step(increment)` adds the update's samples, then sets each
    group's lr (x lr_mult) and weight decay (x wd_mult); `state_dict` has its keys, which its checkpoints hold under
    `lr_scheduler` (DeepSpeed's engine saves its client scheduler's state)."""

    def __init__(self, optimizer, max_lr: float, min_lr: float, decay_samples: int, style: str, wd: float):
        self.optimizer, self.max_lr, self.min_lr = optimizer, max_lr, min_lr
        self.lr_warmup_steps, self.lr_decay_steps, self.lr_decay_style = 0, decay_samples, style
        self.num_steps, self.num_tokens, self.start_wd, self.end_wd = 0, 0, wd, wd
        self.step(0)

    def get_lr(self) -> float:
        if self.lr_decay_style == "constant":
            return self.max_lr
        if self.num_steps > self.lr_decay_steps:
            return self.min_lr
        ratio = self.num_steps / self.lr_decay_steps
        return self.min_lr + (1.0 - ratio) * (self.max_lr - self.min_lr)

    def step(self, increment: int, token_num=None) -> None:
        self.num_steps += increment
        for group in self.optimizer.param_groups:
            group["lr"] = self.get_lr() * group.get("lr_mult", 1.0)
            group["weight_decay"] = self.end_wd * group.get("wd_mult", 1.0)

    def state_dict(self) -> dict:
        return {"max_lr": self.max_lr, "lr_warmup_steps": self.lr_warmup_steps, "lr_warmup_tokens": None,
                "num_steps": self.num_steps, "num_tokens": self.num_tokens, "lr_decay_style": self.lr_decay_style,
                "lr_decay_steps": self.lr_decay_steps, "lr_decay_tokens": None, "min_lr": self.min_lr,
                "start_wd": self.start_wd, "end_wd": self.end_wd, "wd_incr_style": "constant",
                "wd_incr_steps": self.lr_decay_steps}

    def load_state_dict(self, state: dict) -> None:
        self.num_steps, self.num_tokens = state["num_steps"], state["num_tokens"]
        self.step(0)


def megatron_args(iteration: int):
    """The argparse.Namespace Megatron-DeepSpeed stores as `args` (megatron/arguments.py's names; the values of these
    runs). Its load reads consumed_train_samples and consumed_valid_samples from it (checkpointing.py
    load_checkpoint), and check_checkpoint_args compares the model's shape; `model_type` is
    megatron.core.enums.ModelType in a real run (training.py pretrain)."""
    from argparse import Namespace

    import torch
    from megatron.core.enums import ModelType  # megatron-core, in the bench venv beside DeepSpeed

    return Namespace(
        num_layers=LAYERS, hidden_size=HIDDEN, ffn_hidden_size=4 * HIDDEN, num_attention_heads=HEADS,
        num_key_value_heads=HEADS, kv_channels=HIDDEN // HEADS, seq_length=SEQ, max_position_embeddings=SEQ,
        make_vocab_size_divisible_by=128, padded_vocab_size=MEGATRON_VOCAB, vocab_size=MEGATRON_VOCAB - 1,
        tokenizer_type="NullTokenizer", normalization="layernorm", layernorm_epsilon=1e-5, swiglu=False,
        openai_gelu=False, squared_relu=False, bias_gelu_fusion=False, add_bias_linear=True,
        add_position_embedding=True, use_rotary_position_embeddings=False,
        untie_embeddings_and_output_weights=False, apply_residual_connection_post_layernorm=False,
        apply_query_key_layer_scaling=True, hidden_dropout=0.0, attention_dropout=0.0,
        tensor_model_parallel_size=1, pipeline_model_parallel_size=1, data_parallel_size=WORLD,
        micro_batch_size=MICRO_BATCH, global_batch_size=GLOBAL_BATCH, train_iters=TRAIN_ITERS,
        lr=LR, min_lr=MIN_LR, lr_decay_style="linear", lr_decay_iters=TRAIN_ITERS, lr_warmup_iters=0,
        lr_warmup_samples=0, lr_warmup_fraction=None, weight_decay=WEIGHT_DECAY, adam_beta1=BETAS[0],
        adam_beta2=BETAS[1], adam_eps=EPS, clip_grad=CLIP, seed=SEED, data_path=[DATA_PREFIX], split="100,0,0",
        fp16=False, bf16=False, params_dtype=torch.float32, deepspeed=True, no_pipeline_parallel=True,
        ds_pipeline_enabled=False, zero_stage=None, ds_sequence_parallel_fpdt=False, universal_checkpoint=False,
        iteration=iteration, consumed_train_samples=iteration * GLOBAL_BATCH, consumed_valid_samples=0,
        consumed_train_tokens=iteration * GLOBAL_BATCH * SEQ, model_type=ModelType.encoder_or_decoder)


def megatron_client_state(iteration: int, stage: int, pipe: bool = False) -> dict:
    """What Megatron-DeepSpeed's save_checkpoint hands `model[0].save_checkpoint(..., client_state=state_dict)`."""
    import random

    import numpy as np
    import torch
    from deepspeed.checkpoint import (
        ORIGINAL_VOCAB_SIZE,
        PADDED_VOCAB_SIZE,
        PARAMETER_WITH_2_SUB_PARAMS_CAT_DIM_0,
        PIPELINE_REPLICATED_PARAMETER_PATTERNS,
        UNIVERSAL_CHECKPOINT_INFO,
        UNIVERSAL_CHECKPOINT_VERSION_KEY,
        UNIVERSAL_CHECKPOINT_VERSION_VALUE,
        VOCABULARY_PARAMETER_PATTERNS,
    )

    args = megatron_args(iteration)
    args.zero_stage, args.no_pipeline_parallel, args.ds_pipeline_enabled = stage, not pipe, pipe
    # gpt_model.py UniversalCheckpointInfo: the pipeline module's names, and its replicated (tied) parameters
    vocabulary = ["tied_modules.embed.word_embeddings.weight"] if pipe else \
        ["language_model.embedding.word_embeddings.weight"]
    replicated = {PIPELINE_REPLICATED_PARAMETER_PATTERNS: vocabulary + [
        "tied_modules.embed.position_embeddings.weight"]} if pipe else {}
    # get_rng_state(): one dict per data-parallel rank gathered only with --data-parallel-random-init
    rng_state = [{"random_rng_state": random.getstate(), "np_rng_state": np.random.get_state(),
                  "torch_rng_state": torch.get_rng_state(), "cuda_rng_state": torch.get_rng_state(),
                  "rng_tracker_states": {"model-parallel-rng": torch.get_rng_state()}}]
    return {"args": args, "checkpoint_version": 3.0, "iteration": iteration,
            "tokens": args.consumed_train_tokens, "rng_state": rng_state,
            UNIVERSAL_CHECKPOINT_INFO: {UNIVERSAL_CHECKPOINT_VERSION_KEY: UNIVERSAL_CHECKPOINT_VERSION_VALUE,
                                        ORIGINAL_VOCAB_SIZE: MEGATRON_VOCAB, PADDED_VOCAB_SIZE: MEGATRON_VOCAB,
                                        VOCABULARY_PARAMETER_PATTERNS: vocabulary, **replicated,
                                        PARAMETER_WITH_2_SUB_PARAMS_CAT_DIM_0: []}}


def deepspeed_config(stage: int, universal: bool) -> dict:
    config = {"train_batch_size": GLOBAL_BATCH, "train_micro_batch_size_per_gpu": MICRO_BATCH,
              "gradient_accumulation_steps": 1, "gradient_clipping": CLIP, "zero_allow_untested_optimizer": True,
              "zero_optimization": {"stage": stage}, "fp16": {"enabled": False}, "bf16": {"enabled": False},
              "steps_per_print": 10**9, "wall_clock_breakdown": False}
    if universal:  # Megatron-DeepSpeed's --universal-checkpoint (training.py _create_ds_config_dict)
        config["checkpoint"] = {"load_universal": True}
    return config


def param_groups(model) -> list[dict]:
    """Megatron-DeepSpeed's get_param_groups (megatron/optimizer/__init__.py): biases and 1-D parameters decay not."""
    decay, no_decay = [], []
    for name, param in model.named_parameters():
        (no_decay if name.endswith(".bias") or param.dim() == 1 else decay).append(param)
    return [{"name": "wd_no_scale_lr", "params": decay, "wd_mult": 1.0, "lr_mult": 1.0},
            {"name": "no_wd_no_scale_lr", "params": no_decay, "wd_mult": 0.0, "lr_mult": 1.0}]


def build_engine(spec: dict, universal: bool, seed: int):
    """The model, AdamW and (for Megatron-DeepSpeed) its scheduler, under deepspeed.initialize."""
    import deepspeed
    import torch

    from megatron_deepspeed_gpt import GPTModel, cross_entropy, gpt_model_pipe_specs, init_like_megatron

    if spec["model"] == "megatron_deepspeed":
        model = GPTModel(LAYERS, HIDDEN, HEADS, MEGATRON_VOCAB, SEQ, seed=seed)
        tied = model.language_model.embedding.word_embeddings.weight
    elif spec["model"] == "megatron_deepspeed_pipe":  # one stage; ZeRO 1 (DeepSpeed's pipeline takes no higher)
        from deepspeed.pipe import PipelineModule

        model = PipelineModule(layers=gpt_model_pipe_specs(LAYERS, HIDDEN, HEADS, MEGATRON_VOCAB, SEQ),
                               loss_fn=cross_entropy, num_stages=1, partition_method="type:transformer")
        init_like_megatron(model, seed)
        tied = None
    else:
        import transformers

        torch.manual_seed(seed)
        config_class, arguments, _ = TRANSFORMERS_MODELS[spec["model"]]
        model = transformers.AutoModelForCausalLM.from_config(getattr(transformers, config_class)(**arguments))
        tied = model.get_input_embeddings().weight if model.config.tie_word_embeddings else None
    if spec["stage"] == 3 and tied is not None:  # the output layer reads the word embedding outside its forward
        deepspeed.zero.register_external_parameter(model, tied)
    groups = param_groups(model)
    optimizer = torch.optim.AdamW(groups, lr=LR, betas=BETAS, eps=EPS, weight_decay=WEIGHT_DECAY)
    scheduler = OptimizerParamScheduler(optimizer, LR, MIN_LR, TRAIN_ITERS * GLOBAL_BATCH, "linear", WEIGHT_DECAY) \
        if spec["model"].startswith("megatron_deepspeed") else None
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, lr_scheduler=scheduler,
                                           config=deepspeed_config(spec["stage"], universal), dist_init_required=False)
    return engine


def train_step(engine, spec: dict, step: int, rank: int) -> float:
    """One iteration on this rank's micro-batch of `step`'s global batch; the loss averaged over the ranks."""
    import torch
    import torch.distributed as dist

    samples = torch.tensor(spec["batches"][step][rank * MICRO_BATCH:(rank + 1) * MICRO_BATCH])
    inputs, labels = samples[:, :-1], samples[:, 1:]
    if spec["model"] == "megatron_deepspeed_pipe":
        # Megatron-DeepSpeed's train_step under the pipeline: model[0].train_batch(data_iter); DeepSpeed's pipeline
        # engine steps the scheduler by train_batch_size() (runtime/engine.py _take_model_step's fallback)
        loss = engine.train_batch(data_iter=iter([(inputs, labels)]))
        averaged = loss.detach().clone()
        dist.all_reduce(averaged)
        return averaged.item() / dist.get_world_size()
    if spec["model"] == "megatron_deepspeed":
        loss = engine(inputs, labels)
    else:  # a plain DeepSpeed script over transformers: the mean token loss of the logits
        logits = engine(input_ids=inputs).logits
        loss = torch.nn.functional.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), labels.reshape(-1))
    engine.backward(loss)
    engine.step(lr_kwargs={"increment": GLOBAL_BATCH} if spec["model"] == "megatron_deepspeed" else None)
    averaged = loss.detach().clone()
    dist.all_reduce(averaged)
    return averaged.item() / dist.get_world_size()


def save(engine, spec: dict, iteration: int) -> None:
    import torch.distributed as dist

    save_dir = spec["save_dir"]
    if spec["model"] == "megatron_deepspeed_pipe":  # save_checkpoint without --no-pipeline-parallel: no state_dict swap
        engine.save_checkpoint(save_dir, client_state=megatron_client_state(iteration, spec["stage"], pipe=True))
        dist.barrier()
        if dist.get_rank() == 0:
            Path(save_dir, "latest_checkpointed_iteration.txt").write_text(str(iteration))
    elif spec["model"] == "megatron_deepspeed":
        # megatron/checkpointing.py save_checkpoint under --deepspeed --no-pipeline-parallel: the module's
        # state_dict is its state_dict_for_save_checkpoint while DeepSpeed saves, then the tracker file
        module = engine.module
        original = module.state_dict
        module.state_dict = lambda destination=None, prefix="", keep_vars=False: \
            module.state_dict_for_save_checkpoint(prefix=prefix, keep_vars=keep_vars)
        engine.save_checkpoint(save_dir, client_state=megatron_client_state(iteration, spec["stage"]))
        module.state_dict = original
        dist.barrier()
        if dist.get_rank() == 0:
            Path(save_dir, "latest_checkpointed_iteration.txt").write_text(str(iteration))
    else:
        engine.save_checkpoint(save_dir)
    dist.barrier()


def run_rank(spec: dict, rank: int) -> dict:
    import deepspeed
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    deepspeed.init_distributed(dist_backend="gloo")  # a PipelineModule asks DeepSpeed's own communication backend
    phase = spec["phase"]
    engine = build_engine(spec, universal=phase == "universal", seed=SEED if phase == "train" else SEED + 1)
    losses = {}
    if phase == "train":
        for step in range(TRAIN_ITERS):
            losses[step + 1] = train_step(engine, spec, step, rank)
            if step + 1 == SAVED_AT:
                save(engine, spec, SAVED_AT)
    else:
        path, client_state = engine.load_checkpoint(spec["save_dir"])
        if path is None:
            raise RuntimeError(f"DeepSpeed loaded nothing from {spec['save_dir']}")
        start = client_state.get("iteration", engine.global_steps) if client_state else engine.global_steps
        for step in range(start, TRAIN_ITERS):
            losses[step + 1] = train_step(engine, spec, step, rank)
    dist.destroy_process_group()
    return {"losses": losses}


def worker(spec_path: str) -> int:
    spec = json.loads(Path(spec_path).read_text())
    rank = int(os.environ["RANK"])
    out = Path(spec_path).parent / f"rank{rank}.json"
    try:
        record = run_rank(spec, rank)
    except BaseException:  # noqa: BLE001 - the parent prints it
        import traceback

        out.write_text(json.dumps({"error": traceback.format_exc()}))
        return 1
    out.write_text(json.dumps(record))
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--worker":
        sys.exit(worker(sys.argv[2]))
    sys.exit(run_tool("deepspeed_checkpoint_fixtures.py", main))
