"""The systems the ZeRO benchmark compares, each behind the same `step(inputs, labels) -> loss`: ours (stages 0-3),
DeepSpeed (ZeRO 1-3), FSDP2 and DDP, training the same GPTModel from the same seed with the same AdamW, clipping and
precision. Under bf16 the peers autocast; ours trains bf16 parameters as pretrain_gpt.py does."""

from __future__ import annotations

import contextlib
import dataclasses
import time

import torch


def mark(marks: list | None) -> None:
    """Record the time a phase of the step ended (forward, backward; the step's end is timed outside),
    then call the list's `on_phase_end` if it has one: the benchmark's first step reads the memory
    high-water mark there, after the time is taken, so the phase's time does not include the read."""
    if marks is not None:
        marks.append(time.perf_counter())
        on_phase_end = getattr(marks, "on_phase_end", None)
        if on_phase_end is not None:
            on_phase_end()


def autocast(bf16: bool):
    return torch.autocast(device_type="cpu", dtype=torch.bfloat16) if bf16 else contextlib.nullcontext()


def model_config(spec: dict):
    from arguments.config import ModelConfig

    return ModelConfig.of(num_layers=spec["num_layers"], hidden_size=spec["hidden_size"],
                       num_attention_heads=spec["num_attention_heads"], seq_length=spec["seq_length"],
                       max_position_embeddings=spec["seq_length"], vocab_size=spec["vocab_size"],
                       hidden_dropout=0.0, attention_dropout=0.0)


def build_model(spec: dict, state):
    """The peers take a materialized model (each system's usual entry point); ours takes it on the meta
    device, as pretrain_gpt.py does, and materializes only what each rank owns (apply_zero). The
    values are the same: a pure function of (seed, parameter name, element index)."""
    from gpt.model import GPTModel, build_gpt_model

    if spec["system"] == "ours":
        return GPTModel(model_config(spec), state)
    return build_gpt_model(model_config(spec), state, seed=spec["seed"])


def make_batches(spec: dict, rank: int, num_steps: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Each rank's micro-batch for each step: random but learnable token streams.

    A sequence follows a fixed random permutation of the vocabulary (token t+1 = perm[token t]) from a
    random start, with 10% of the tokens replaced by random ones. Loss falls quickly from log(vocab),
    so the trajectories that the systems are compared on actually move. Batches are a pure function of
    (seed, step, rank): every system sees the same data.
    """
    vocab, batch, seq = spec["vocab_size"], spec["micro_batch_size"], spec["seq_length"]
    perm = torch.randperm(vocab, generator=torch.Generator().manual_seed(spec["seed"]))
    batches = []
    for step in range(num_steps):
        g = torch.Generator().manual_seed(spec["seed"] * 1_000_003 + step * 1_009 + rank)
        tokens = torch.empty(batch, seq + 1, dtype=torch.long)
        tokens[:, 0] = torch.randint(vocab, (batch,), generator=g)
        for t in range(seq):
            noise = torch.rand(batch, generator=g) < 0.1
            tokens[:, t + 1] = torch.where(noise, torch.randint(vocab, (batch,), generator=g), perm[tokens[:, t]])
        batches.append((tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()))
    return batches


def adamw_groups(model: torch.nn.Module, weight_decay: float) -> list[dict]:
    """Our sharded AdamW's grouping: matrices decay, biases and LayerNorm parameters do not."""
    params = [p for p in model.parameters() if p.requires_grad]
    return [{"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
            {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]


def torch_adamw(model: torch.nn.Module, spec: dict, **kernel) -> torch.optim.AdamW:
    return torch.optim.AdamW(adamw_groups(model, spec["weight_decay"]), lr=spec["lr"],
                             betas=(spec["adam_beta1"], spec["adam_beta2"]), eps=spec["adam_eps"], **kernel)


class TorchSystem:
    """A wrapped model plus torch AdamW and torch's clipping: the step DDP and FSDP2 share."""

    def step(self, inputs, labels, marks=None) -> torch.Tensor:
        self.optimizer.zero_grad(set_to_none=True)
        with autocast(self.spec["bf16"]):
            loss = self.model(inputs, labels).mean()
        mark(marks)
        loss.backward()
        mark(marks)
        if self.spec["clip_grad"] > 0:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.spec["clip_grad"])
        self.optimizer.step()
        return loss.detach()


class DDPSystem(TorchSystem):
    name = "ddp"

    def __init__(self, model, spec: dict, state):
        from torch.nn.parallel import DistributedDataParallel

        self.spec = spec
        # Buckets of the same size as ZeRO's reduce buckets (elements of fp32 gradients -> MiB), and
        # gradients as views into them: DDP's own contiguous-gradient mode.
        bucket_mb = spec["reduce_bucket_size"] * 4 / 2**20
        self.model = DistributedDataParallel(model, bucket_cap_mb=bucket_mb, gradient_as_bucket_view=True,
                                             process_group=state.data_parallel_group)
        self.optimizer = torch_adamw(model, spec, foreach=True)
        self.info = {"bucket_cap_mb": bucket_mb}


class FSDP2System(TorchSystem):
    name = "fsdp2"

    def __init__(self, model, spec: dict, state):
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        self.spec = spec
        bf16 = torch.bfloat16 if spec["bf16"] else None
        policy = MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=bf16)
        mesh = state.mesh["dp"]
        for block in model.blocks:
            fully_shard(block, mesh=mesh, mp_policy=policy)
        fully_shard(model, mesh=mesh, mp_policy=policy)
        self.model = model
        self.optimizer = torch_adamw(model, spec, foreach=True)
        self.info = {"units": len(model.blocks) + 1, "reshard_after_forward": True}


def deepspeed_config(spec: dict) -> dict:
    return {
        "train_micro_batch_size_per_gpu": spec["micro_batch_size"],
        "gradient_accumulation_steps": 1,
        "train_batch_size": spec["micro_batch_size"] * spec["world_size"],
        "gradient_clipping": spec["clip_grad"],
        "bf16": {"enabled": spec["bf16"]},
        "fp16": {"enabled": False},
        "zero_allow_untested_optimizer": True,  # a torch.optim.AdamW client optimizer
        "zero_optimization": {
            "stage": spec["stage"],
            "overlap_comm": True,
            "contiguous_gradients": True,
            "reduce_scatter": True,
            "reduce_bucket_size": spec["reduce_bucket_size"],
            "allgather_bucket_size": spec["allgather_bucket_size"],
            "stage3_prefetch_bucket_size": spec["prefetch_bucket_size"],
            "stage3_param_persistence_threshold": spec["param_persistence_threshold"],
            "stage3_max_live_parameters": spec["max_live_parameters"],
            **({"stage3_max_reuse_distance": spec["ds_max_reuse_distance"]}
               if spec.get("ds_max_reuse_distance") is not None else {}),
        },
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
    }


class DeepSpeedSystem:
    name = "deepspeed"

    def __init__(self, model, spec: dict, state):
        import deepspeed

        self.spec = spec
        if spec["stage"] == 3:
            # The output layer reads the token embedding's weight outside the embedding module's
            # forward (tied weights); ZeRO-3 must be told to keep it gathered for the root's forward.
            deepspeed.zero.register_external_parameter(model, model.word_embeddings.weight)
        optimizer = torch_adamw(model, spec)
        self.engine, self.optimizer, _, _ = deepspeed.initialize(
            model=model, optimizer=optimizer, config=deepspeed_config(spec), dist_init_required=False)
        stage = self.engine.zero_optimization_stage()
        if stage != spec["stage"]:
            raise RuntimeError(f"DeepSpeed runs ZeRO stage {stage}, asked for {spec['stage']}")
        zero = self.engine._config.zero_config
        self.info = {"zero_stage": stage, "optimizer": type(self.optimizer).__name__,
                     "max_reuse_distance": getattr(zero, "max_reuse_distance", None),
                     "prefetch_bucket_size": getattr(zero, "prefetch_bucket_size", None),
                     "use_multi_rank_bucket_allreduce": getattr(zero, "use_multi_rank_bucket_allreduce", None),
                     "client_optimizer": type(optimizer).__name__, "deepspeed": deepspeed.__version__}

    def step(self, inputs, labels, marks=None) -> torch.Tensor:
        with autocast(self.spec["bf16"]):
            loss = self.engine(inputs, labels).mean()
        mark(marks)
        self.engine.backward(loss)
        mark(marks)
        self.engine.step()  # clips, steps and zeroes the gradients
        return loss.detach()


def our_config(spec: dict):
    from arguments.parser import parse_config

    argv = ["--num-layers", spec["num_layers"], "--hidden-size", spec["hidden_size"],
            "--num-attention-heads", spec["num_attention_heads"], "--seq-length", spec["seq_length"],
            "--max-position-embeddings", spec["seq_length"], "--hidden-dropout", 0, "--attention-dropout", 0,
            "--micro-batch-size", spec["micro_batch_size"],
            "--global-batch-size", spec["micro_batch_size"] * spec["world_size"],
            "--lr", spec["lr"], "--min-lr", 0, "--weight-decay", spec["weight_decay"],
            "--clip-grad", spec["clip_grad"],
            "--adam-beta1", spec["adam_beta1"], "--adam-beta2", spec["adam_beta2"], "--adam-eps", spec["adam_eps"],
            "--seed", spec["seed"], "--device", "cpu", "--bf16" if spec["bf16"] else "--no-bf16",
            "--zero-stage", spec["stage"], "--overlap-comm",
            "--reduce-bucket-size", spec["reduce_bucket_size"],
            "--allgather-bucket-size", spec["allgather_bucket_size"],
            "--stage3-prefetch-bucket-size", spec["prefetch_bucket_size"],
            "--stage3-param-persistence-threshold", spec["param_persistence_threshold"],
            "--stage3-max-live-parameters", spec["max_live_parameters"],
            # DeepSpeed's stages 1-2 reduce gradients in the training dtype: compare like with like.
            "--no-accumulate-allreduce-grads-in-fp32",
            "--overlap-param-gather" if spec.get("overlap_param_gather") else "--no-overlap-param-gather"]
    config = parse_config([str(a) for a in argv])
    return dataclasses.replace(config, model=model_config(spec))  # exactly the peers' model (vocab size filled in)


class OurSystem:
    name = "ours"

    def __init__(self, model, spec: dict, state):
        from zero.apply import apply_zero

        self.spec = spec
        self.zero = apply_zero(model, our_config(spec), state, blocks=model.blocks)
        self.optimizer = self.zero.optimizer
        self.model = model
        self.info = {"optimizer": type(self.optimizer).__name__}

    def step(self, inputs, labels, marks=None) -> torch.Tensor:
        for group in self.optimizer.param_groups:
            group["lr"] = self.spec["lr"]
        self.zero.reducer.zero_grad()
        loss = self.model(inputs, labels).mean()  # no autocast: pretrain_gpt.py's path
        mark(marks)
        self.zero.scale_loss(loss).backward()
        self.zero.reducer.finish_grad_sync()
        mark(marks)
        result = self.optimizer.step()
        if getattr(result, "skipped", False):
            raise RuntimeError("our optimizer skipped a step (overflow) in a benchmark without loss scaling")
        return loss.detach()


SYSTEMS = {cls.name: cls for cls in (OurSystem, DeepSpeedSystem, FSDP2System, DDPSystem)}
