#!/usr/bin/env python
"""Megatron-LM's own pretrain_gpt.py on a CPU over gloo: its training loop and command line, its device plumbing
patched at run time (its files are never edited; each _patch_* says why).

    torchrun --nproc-per-node N scripts/bench/megatron_lm_cpu.py --megatron-lm TREE [--record FILE] -- FLAGS...

TREE: Megatron-LM core_v0.16.1 beyond megatron.core (core_v0.19.0 whole for pretrain_hybrid.py)."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import runpy
import sys
from pathlib import Path
from types import SimpleNamespace

import torch

from megatron_lm_torch_adamw import patch_torch_adamw_resume
from op_counter import OUTSIDE, LaunchCounter
from saved_tensor_counter import SavedTensorCounter

CPU = torch.device("cpu")


class _CudaTensorsOnCpu(torch.overrides.TorchFunctionMode):
    """A tensor factory's device="cuda" (or torch.device("cuda"), or a CUDA index) is the CPU."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        device = kwargs.get("device")
        if device is not None and (isinstance(device, int) or str(device).startswith("cuda")):
            kwargs = {**kwargs, "device": CPU}
        return func(*args, **kwargs)


# What the device-architecture queries answer: an H100's compute capability, below the Blackwell (10.x) that
# validate_args' CUDA_DEVICE_MAX_CONNECTIONS checks single out; they decide CUDA stream settings, nothing computed
_H100 = SimpleNamespace(name="cpu (answering as an H100)", major=9, minor=0, total_memory=80 * 2**30,
                        multi_processor_count=132)


class _NoStream:
    """A CPU runs one stream: waiting on, recording into or synchronizing a stream is nothing."""

    def __init__(self, *args, **kwargs):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def __getattr__(self, name):
        if name == "record_event":  # an event, which the all-to-all dispatcher synchronizes on later
            return lambda *args, **kwargs: _NoStream()
        return lambda *args, **kwargs: None if name != "query" else True


def _cpu_type(original):
    def type_(self, *args, **kwargs):
        name = original(self, *args, **kwargs)
        if not args and not kwargs and self.device.type == "cpu" and isinstance(name, str) and ".cuda." not in name:
            return name.replace("torch.", "torch.cuda.", 1)
        return name
    return type_


def _patch_device_queries() -> None:
    """One device, an H100's: initialize.py builds the model-parallel groups only `if device_count > 0` and
    initialize_megatron asserts CUDA; set_device/current_device answer for the CPU (DDP buffers, the MoE aux-loss
    scale and batch broadcasts allocate on current_device()); synchronize, empty_cache and the memory queries do
    nothing or answer zero; the capability is 9.0, below the Blackwell 10.x that validate_args' CUDA_DEVICE_MAX_
    CONNECTIONS check singles out (the launch sets that variable to 1, as Megatron-LM's scripts do)."""
    cuda = torch.cuda
    cuda.is_available = lambda: True
    cuda.device_count = lambda: 1
    cuda.set_device = lambda device: None
    cuda.current_device = lambda: CPU
    cuda.synchronize = lambda *args, **kwargs: None
    cuda.empty_cache = lambda: None
    for query in ("memory_allocated", "max_memory_allocated", "memory_reserved", "max_memory_reserved"):
        setattr(cuda, query, lambda *args, **kwargs: 0)
    cuda.memory_stats = lambda *args, **kwargs: {}
    cuda.get_device_properties = lambda *args, **kwargs: _H100
    cuda.get_device_capability = lambda *args, **kwargs: (_H100.major, _H100.minor)
    cuda.get_device_name = lambda *args, **kwargs: _H100.name
    cuda.Stream = cuda.Event = _NoStream
    cuda.stream = lambda stream=None: contextlib.nullcontext()
    cuda.current_stream = lambda *args, **kwargs: _NoStream()


def _patch_placement() -> None:
    """Tensor.cuda() and Module.cuda() return their CPU selves (get_model's .cuda, get_batch_on_this_tp_rank's
    .cuda(non_blocking=True)); Tensor.type() answers a CPU float tensor's type with its CUDA name, which
    Megatron-Core's optimizers assert (`param.type() in ['torch.cuda.FloatTensor', ...]`)."""
    torch.Tensor.cuda = lambda self, *args, **kwargs: self
    torch.nn.Module.cuda = lambda self, *args, **kwargs: self
    torch.Tensor.type = _cpu_type(torch.Tensor.type)
    _CudaTensorsOnCpu().__enter__()


class _DeviceGenerator:
    """The generator torch.cuda.* RNG calls stand for: one CPU generator, apart from the default one."""

    generator = torch.Generator()

    @classmethod
    def patch(cls) -> None:
        cuda = torch.cuda
        cuda.get_rng_state = cuda.random.get_rng_state = lambda device="cuda": cls.generator.get_state()
        cuda.set_rng_state = cuda.random.set_rng_state = lambda state, device="cuda": cls.generator.set_state(state)
        cuda.manual_seed = cuda.random.manual_seed = lambda seed: cls.generator.manual_seed(int(seed))
        cuda.manual_seed_all = cuda.random.manual_seed_all = cuda.manual_seed
        cuda.get_rng_state_all = lambda: [cls.generator.get_state()]


def _patch_rng_tracker() -> None:
    """The CUDA RNG tracker's named states ('model-parallel-rng', ...) as CPU generator states seeded as
    model_parallel_cuda_manual_seed seeds them; fork() swaps the CPU generator to the named state and back, as a GPU
    swaps the CUDA generator, so draws inside a fork leave the default stream untouched."""
    from megatron.core.tensor_parallel import random as tp_random

    class CpuRngStatesTracker(tp_random.CudaRNGStatesTracker):
        """Named CPU generator states; fork swaps the CPU generator to one and back (module docstring)."""

        def add(self, name, seed):
            self._is_initialized = True
            if seed in self.seeds_:
                raise Exception(f"seed {seed} already exists")
            self.seeds_.add(seed)
            if name in self.states_:
                raise Exception(f"cuda rng state {name} already exists")
            self.states_[name] = torch.Generator().manual_seed(seed).get_state()

        @contextlib.contextmanager
        def fork(self, name=tp_random._MODEL_PARALLEL_RNG_TRACKER_NAME):
            if name not in self.states_:
                raise Exception(f"cuda rng state {name} is not added")
            outside = torch.get_rng_state()
            torch.set_rng_state(self.states_[name])
            try:
                yield
            finally:
                self.states_[name] = torch.get_rng_state()
                torch.set_rng_state(outside)

    def initialize_rng_tracker(*args, force_reset=False, **kwargs):
        if tp_random._CUDA_RNG_STATE_TRACKER_INITIALIZED and not force_reset:
            return
        tp_random._CUDA_RNG_STATE_TRACKER = CpuRngStatesTracker()
        tp_random._CUDA_RNG_STATE_TRACKER_INITIALIZED = True

    tp_random.initialize_rng_tracker = initialize_rng_tracker
    tp_random._set_cuda_rng_state = lambda state, *args, **kwargs: _DeviceGenerator.generator.set_state(state)
    tp_random._get_cuda_rng_state = lambda *args, **kwargs: _DeviceGenerator.generator.get_state()


def _patch_megatron_core() -> None:
    """The wheel ships megatron.core.datasets' C++ helpers prebuilt: compile_helpers (a `make` in the wheel's
    folder) is skipped. The MoE router's moe_utils.te_general_gemm, bound only where TransformerEngine imports, is
    None: the torch matmul path the code takes without TE."""
    import megatron.core.datasets.utils as dataset_utils
    from megatron.core.transformer.moe import moe_utils

    dataset_utils.compile_helpers = lambda: None
    _dataset_helpers_of_the_wheel()
    if not hasattr(moe_utils, "te_general_gemm"):
        moe_utils.te_general_gemm = None
    _patch_moe_host_copies()
    _patch_local_attention_widths()
    _patch_sequence_parallel_torch_norm()
    patch_torch_adamw_resume()


def _patch_moe_host_copies() -> None:
    """The all-to-all dispatcher copies its split sizes to the host as numpy arrays (moe_utils.
    maybe_move_tensor_to_cpu, for `tensor.is_cuda` alone): on the CPU they stayed tensors, which all_to_all_single
    refuses as split sizes ("incompatible function arguments"); they become numpy arrays here too, as on a GPU."""
    from megatron.core.transformer.moe import moe_utils, token_dispatcher

    move = moe_utils.maybe_move_tensor_to_cpu

    def maybe_move_tensor_to_cpu(tensor, as_numpy=False, record_stream=False):
        if as_numpy and torch.is_tensor(tensor) and tensor.device.type == "cpu":
            return tensor.numpy()
        return move(tensor, as_numpy=as_numpy, record_stream=record_stream)

    moe_utils.maybe_move_tensor_to_cpu = token_dispatcher.maybe_move_tensor_to_cpu = maybe_move_tensor_to_cpu


def _patch_local_attention_widths() -> None:
    """Multi-latent attention builds its core attention with the query/key and value head widths
    (MLASelfAttention: `k_channels=self.q_head_dim, v_channels=self.config.v_head_dim`), which only
    TransformerEngine's TEDotProductAttention takes: the local spec's DotProductAttention (the one a TE-less run
    builds, on a GPU as on a CPU) refuses them ("unexpected keyword argument 'k_channels'"). It takes them here:
    the scores at MLA's softmax_scale as before, the context [sq, b, heads x v_channels] (its own computation, the
    value's width instead of kv_channels'); k_channels changes nothing (the query's width is the tensor's)."""
    from megatron.core.extensions import transformer_engine as te_extension
    from megatron.core.transformer import multi_latent_attention
    from megatron.core.transformer.dot_product_attention import DotProductAttention

    # without TransformerEngine its extension module still imports (its classes built over a MagicMock), so
    # multi_latent_attention's HAVE_TE is True and `isinstance(self.linear_proj, TELinear)` (for FP8's saved inputs)
    # raises "isinstance() arg 2 must be a type": the extension's own HAVE_TE, False, is the answer
    multi_latent_attention.HAVE_TE = multi_latent_attention.HAVE_TE and te_extension.HAVE_TE
    init = DotProductAttention.__init__
    if getattr(init, "takes_head_widths", False):
        return

    def __init__(self, *args, k_channels=None, v_channels=None, **kwargs):
        init(self, *args, **kwargs)
        if v_channels is not None:
            self.hidden_size_per_partition = v_channels * self.num_attention_heads_per_partition

    __init__.takes_head_widths = True
    DotProductAttention.__init__ = __init__


def _patch_sequence_parallel_torch_norm() -> None:
    """Without apex and TransformerEngine the local spec's norm is WrappedTorchNorm, which asserts "sequence
    parallel not supported by torch LayerNorm", while Megatron-Core's MoE layer refuses tensor parallelism without
    --sequence-parallel in training: an MoE model at TP > 1 runs on no TE-less, apex-less machine, GPU or CPU. With
    apex the same spec builds FusedLayerNorm, which takes it: the same LayerNorm, its weight and bias marked
    `sequence_parallel` so finalize_model_grads sums their gradients over the TP ranks. WrappedTorchNorm does so
    here (torch's LayerNorm or RMSNorm, built as without the flag, its parameters marked)."""
    from megatron.core.transformer.torch_norm import WrappedTorchNorm

    new = WrappedTorchNorm.__new__
    if getattr(new, "takes_sequence_parallel", False):
        return

    def __new__(cls, config, *args, **kwargs):
        if not config.sequence_parallel:
            return new(cls, config, *args, **kwargs)
        config.sequence_parallel = False  # only its assertion reads it
        try:
            norm = new(cls, config, *args, **kwargs)
        finally:
            config.sequence_parallel = True
        for parameter in norm.parameters():
            setattr(parameter, "sequence_parallel", True)
        return norm

    __new__.takes_sequence_parallel = True
    WrappedTorchNorm.__new__ = staticmethod(__new__)


def _dataset_helpers_of_the_wheel() -> None:
    """A tree with megatron.core of its own (core_v0.19.0's, whose megatron.core shadows the wheel's) holds
    datasets/helpers.cpp unbuilt: its helpers_cpp is the wheel's prebuilt extension (helpers.cpp is the same file at
    core_v0.16.1 and core_v0.19.0), loaded under the tree's module name instead of a `make` inside the tree."""
    import importlib.machinery
    import importlib.metadata
    import importlib.util

    import megatron.core.datasets as datasets

    try:
        import megatron.core.datasets.helpers_cpp  # noqa: F401  (built: nothing to do)
        return
    except ImportError:
        pass
    folder = Path(str(importlib.metadata.distribution("megatron-core").locate_file("megatron/core/datasets")))
    built = [path for suffix in importlib.machinery.EXTENSION_SUFFIXES for path in folder.glob("helpers_cpp" + suffix)]
    if not built:
        sys.exit(f"megatron.core.datasets.helpers_cpp: neither built in {Path(datasets.__file__).parent} nor in the "
                 f"installed megatron-core wheel ({folder})")
    name = "megatron.core.datasets.helpers_cpp"
    spec = importlib.util.spec_from_file_location(name, built[0])
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    sys.modules[name] = module
    datasets.helpers_cpp = module


def _patch_hybrid_local_spec() -> None:
    """pretrain_hybrid.py (core_v0.19.0) builds HybridModel from --spec, and Megatron-Core's one training spec,
    hybrid_layer_specs.hybrid_stack_spec, is TransformerEngine's (TELayerNormColumnParallelLinear, TEDotProductAttention,
    TENorm; none builds without TE), as is HybridStack's final norm (TENorm, hard-wired in hybrid_block.py).
    Without TE the spec --spec names is Megatron-Core's own local hybrid stack,
    post_training/modelopt/hybrid/model_specs.py's _get_hybrid_stack_local_spec(local_core_attention=True,
    remap_te_layernorm=True): ColumnParallelLinear/RowParallelLinear, DotProductAttention, SequentialMLP experts,
    and the norms under TE's names (`self_attention.linear_qkv.layer_norm_weight`, `mlp.linear_fc1.layer_norm_weight`)
    by its sharded_state_dict_keys_map, so the torch_dist keys are the TE spec's (less TE's _extra_state). Its norm
    (modelopt's Norm, TE's LayerNorm) and the final norm are Megatron-Core's WrappedTorchNorm, the norm of
    --transformer-impl local's GPT spec without apex."""
    from megatron.core.models.hybrid import hybrid_block, hybrid_layer_specs
    from megatron.core.post_training.modelopt.hybrid import model_specs
    from megatron.core.transformer.torch_norm import WrappedTorchNorm

    model_specs.Norm = WrappedTorchNorm
    hybrid_block.TENorm = WrappedTorchNorm
    local = model_specs._get_hybrid_stack_local_spec(local_core_attention=True, remap_te_layernorm=True)
    hybrid_layer_specs.hybrid_stack_spec = hybrid_layer_specs.mamba_stack_spec = local


def _patch_python_311() -> None:
    """core_v0.19.0 requires Python >= 3.12 (its pyproject.toml), and its megatron/training/models (gpt.py,
    hybrid.py, imported by pretrain_hybrid.py's megatron.training) import typing.override, new in 3.12: on an older
    Python typing.override is the decorator 3.12 defines, which returns the function unchanged (PEP 698; it only
    marks it for type checkers). The venv's torch 2.13.0+cpu wheel is cp311's."""
    import typing

    if not hasattr(typing, "override"):
        def override(method):
            try:
                method.__override__ = True
            except (AttributeError, TypeError):
                pass
            return method
        typing.override = override


def _patch_spawned_main() -> None:
    """Processes multiprocessing spawns (the torch_dist writer's results queue, a Manager) import the parent's
    __main__ file first, the training script: on Python 3.11 core_v0.19.0's imports fail there before
    _patch_python_311 could act. They import this launcher instead, whose top level patches typing.override when
    imported as a spawned process's __mp_main__ (and trains nothing: main() runs only as __main__)."""
    from multiprocessing import spawn

    preparation_data = spawn.get_preparation_data

    def launcher_as_main(name):
        data = preparation_data(name)
        if "init_main_from_path" in data:
            data["init_main_from_path"] = os.path.abspath(__file__)
        return data
    spawn.get_preparation_data = launcher_as_main


def _patch_megatron_training(record: str | None, logits: str | None = None) -> None:
    """initialize_megatron's allow_no_cuda is True (the CUDA assertion is answered by the device queries);
    megatron.legacy.fused_kernels.load, which at this tag compiles nothing but reads `nvcc -V` and makes a build
    folder inside the tree, is skipped, as the GPU kit does; so is the jit warm-up (nothing is compiled, and its
    draws would come from the CPU generator, which a GPU's never touch); the recording and logits hooks wrap in."""
    from megatron.training import initialize, training

    try:  # core_v0.16.1; core_v0.19.0's tree has no megatron.legacy, nor a load to skip
        import megatron.legacy.fused_kernels as fused_kernels
        fused_kernels.load = lambda args: None
    except ImportError:
        pass
    initialize._warmup_jit_function = lambda *args, **kwargs: None  # 0.19 passes tp_size

    initialize_megatron = training.initialize_megatron
    training.initialize_megatron = lambda *args, **kwargs: initialize_megatron(*args,
                                                                               **{**kwargs, "allow_no_cuda": True})
    if record:
        training.training_log = _recording(training.training_log, record)
    if logits:
        training.train_step = _capturing_logits(training.train_step, logits)


def _recording(training_log, path: str):
    """training_log, writing its iteration's losses at full precision to `path` first, from the last rank (the last
    pipeline stage, which holds the losses; Megatron-LM prints its log line there too: print_rank_last)."""
    def log(loss_dict, total_loss_dict, learning_rate, iteration, loss_scale, report_memory_flag, skipped_iter,
            grad_norm, *args, **kwargs):
        if torch.distributed.get_rank() == torch.distributed.get_world_size() - 1:
            line = {"iteration": iteration, "losses": {k: float(v) for k, v in loss_dict.items()},
                    "grad_norm": None if grad_norm is None else float(grad_norm),
                    "learning_rate": None if learning_rate is None else float(learning_rate),
                    "loss_scale": float(loss_scale), "skipped": int(skipped_iter)}
            with open(path, "a") as file:
                file.write(json.dumps(line) + "\n")
        return training_log(loss_dict, total_loss_dict, learning_rate, iteration, loss_scale, report_memory_flag,
                            skipped_iter, grad_norm, *args, **kwargs)
    return log


def _capturing_logits(train_step, path: str):
    """train_step, its first call's forward recorded: each micro-batch's input tokens and the output layer's logits
    (fp32, gathered over the tensor-parallel ranks as Megatron's gather_from_tensor_model_parallel_region does) on
    the last pipeline stage; the last rank writes every data-parallel rank's, in the global batch's order (micro-batch,
    then data-parallel rank: Megatron's sampler hands each rank consecutive slices), to `path` as safetensors
    {"tokens": [B, S] int64, "logits": [B, S, V] fp32}. The training step itself runs untouched."""
    from megatron.core import parallel_state as mpu
    from megatron.core.tensor_parallel.mappings import gather_from_tensor_model_parallel_region
    from megatron.core.utils import unwrap_model
    from safetensors.torch import save_file

    def step(forward_step_func, data_iterator, model, *args, **kwargs):
        if step.done:
            return train_step(forward_step_func, data_iterator, model, *args, **kwargs)
        step.done = True
        tokens, logits, hooks, last = [], [], [], []

        def inputs(module, args):
            # HybridModel's last stage is handed no input ids at PP > 1 (None): no tokens, so no file
            tokens.append(None if args[0] is None else args[0].clone())
            last.clear()

        def output_layer(module, args, output):
            # cloned: the loss (vocab_parallel_cross_entropy) then turns the logits into exponentials in place. The
            # forward's last call is the model's own: MTP layers (--mtp-num-layers) call it first, once each
            # (GPTModel._postprocess), so each call replaces the one before
            last[:] = [gather_from_tensor_model_parallel_region(output[0].detach().clone()).transpose(0, 1).float()]

        for chunk in unwrap_model(model):
            if getattr(chunk, "post_process", False):
                hooks.append(chunk.register_forward_pre_hook(inputs))
                hooks.append(chunk.output_layer.register_forward_hook(output_layer))
                hooks.append(chunk.register_forward_hook(lambda module, args, output: logits.append(last[0])))
        try:
            result = train_step(forward_step_func, data_iterator, model, *args, **kwargs)
        finally:
            for hook in hooks:
                hook.remove()
        mine = (mpu.get_data_parallel_rank(), list(zip(tokens, logits))) if (
            mpu.is_pipeline_last_stage(ignore_virtual=True) and mpu.get_tensor_model_parallel_rank() == 0) else None
        everyone = [None] * torch.distributed.get_world_size()
        torch.distributed.all_gather_object(everyone, mine)
        untokened = any(t is None for entry in everyone if entry is not None for t, _ in entry[1])
        if untokened and torch.distributed.get_rank() == torch.distributed.get_world_size() - 1:
            print(f"--logits: the last pipeline stage holds no input tokens (HybridModel's at PP > 1): {path} is "
                  f"not written", flush=True)
        elif torch.distributed.get_rank() == torch.distributed.get_world_size() - 1:
            ranks = dict(entry for entry in everyone if entry is not None)
            ordered = [ranks[rank][micro] for micro in range(len(ranks[0])) for rank in sorted(ranks)]
            save_file({"tokens": torch.cat([t for t, _ in ordered]).long().contiguous(),
                       "logits": torch.cat([lg for _, lg in ordered]).contiguous()}, path)
        return result

    step.done = False
    return step


def _patch_launch_counting(path: str) -> None:
    """--count-launches: the second train_step's launches (scripts/bench/op_counter.py's rule) by window, as
    scripts/bench/benchmark_host_ops.py counts this project's: each micro-batch's forward_step and backward_step (the
    schedule's, megatron/core/pipeline_parallel/schedules.py, looked up there at each call) and the rest of the
    step outside them; written to `path` as {"micro_batch_<i>": {"forward", "backward", "total"}, "outside"}."""
    from megatron.core.pipeline_parallel import schedules
    from megatron.training import training

    counter = LaunchCounter()
    forward_step, backward_step, train_step = schedules.forward_step, schedules.backward_step, training.train_step
    where = {"micro_batch": -1}

    def counted_forward(*args, **kwargs):
        where["micro_batch"] += 1
        counter.enter_window(f"micro_batch {where['micro_batch']}", "forward")
        try:
            return forward_step(*args, **kwargs)
        finally:
            counter.enter_window(f"micro_batch {where['micro_batch']}")

    def counted_backward(*args, **kwargs):
        counter.enter_window(f"micro_batch {where['micro_batch']}", "backward")
        try:
            return backward_step(*args, **kwargs)
        finally:
            counter.enter_window(OUTSIDE)

    def step(*args, **kwargs):
        step.calls += 1
        if step.calls != 2:
            return train_step(*args, **kwargs)
        where["micro_batch"] = -1
        with counter.counting():
            counter.active = True
            counter.enter_window(OUTSIDE)
            try:
                return train_step(*args, **kwargs)
            finally:
                counter.active = False
                counter.enter_window(OUTSIDE)
                _write_counts(counter, path, where["micro_batch"] + 1)

    step.calls = 0
    schedules.forward_step, schedules.backward_step, training.train_step = counted_forward, counted_backward, step


def _write_counts(counter: LaunchCounter, path: str, micro_batches: int) -> None:
    counts = counter.counts
    figures = {f"micro_batch_{index + 1}": {"forward": counts.total(f"micro_batch {index}", "forward"),
                                            "backward": counts.total(f"micro_batch {index}", "backward"),
                                            "total": counts.total(f"micro_batch {index}")}
               for index in range(micro_batches)}
    figures["outside"] = counts.total(OUTSIDE)
    Path(path).write_text(json.dumps(figures) + "\n", encoding="utf-8")


def _patch_saved_counting(path: str) -> None:
    """--count-saved: what the second train_step's second micro-batch saves for backward, at the end of its
    forward_step, by saved_tensor_counter.py's rule, as benchmark_saved_bytes.py counts this project's; rank 0 writes
    {"total", "by_name", "saved_by"} to `path`."""
    from megatron.core.pipeline_parallel import schedules
    from megatron.training import training

    counter = SavedTensorCounter()
    forward_step, train_step = schedules.forward_step, training.train_step
    where = {"counting": False, "micro_batch": -1}

    def counted_forward(*args, **kwargs):
        where["micro_batch"] += 1
        if not (where["counting"] and where["micro_batch"] == 1):
            return forward_step(*args, **kwargs)
        with counter.saving():
            output = forward_step(*args, **kwargs)
        if torch.distributed.get_rank() == 0:
            Path(path).write_text(json.dumps(counter.saved().as_json()) + "\n", encoding="utf-8")
        return output

    def step(*args, **kwargs):
        step.calls += 1
        if step.calls != 2:
            return train_step(*args, **kwargs)
        model = kwargs["model"] if "model" in kwargs else args[2]
        for chunk in model:
            counter.name_modules(chunk)
        where.update(counting=True, micro_batch=-1)
        try:
            with counter.naming():
                return train_step(*args, **kwargs)
        finally:
            where["counting"] = False

    step.calls = 0
    schedules.forward_step, training.train_step = counted_forward, step


def _eager(model=None, **options):
    """torch.compile standing aside: the function itself, as a decorator with or without options."""
    return model if model is not None else (lambda function: function)


def _patch_compile() -> None:
    """megatron.core.jit's jit_fuser is torch.compile (Triton kernels on a GPU for SwiGLU, GeLU, bias-dropout-add,
    the router's helpers): it returns the function before megatron.core binds it (--disable-jit-fuser acts too late,
    after the decorators ran at import), so they run eagerly, the same functions."""
    torch.compile = _eager  # before megatron.core.jit binds jit_fuser to it


def apply_cpu_patches(record: str | None = None, logits: str | None = None, count_launches: str | None = None,
                      hybrid: bool = False, count_saved: str | None = None) -> None:
    """Every patch of the module docstring (and --count-launches' and --count-saved's); call before pretrain_gpt.py runs (`hybrid`:
    before pretrain_hybrid.py, with its local spec)."""
    _patch_compile()
    _patch_python_311()
    _patch_spawned_main()
    _patch_device_queries()
    _patch_placement()
    _DeviceGenerator.patch()
    _patch_rng_tracker()
    _patch_megatron_core()
    _patch_megatron_training(record, logits)
    if hybrid:
        _patch_hybrid_local_spec()
    if count_launches:
        _patch_launch_counting(count_launches)
    if count_saved:
        _patch_saved_counting(count_saved)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--megatron-lm", required=True, type=Path,
                        help="Megatron-LM's tree (core_v0.16.1; core_v0.19.0 for pretrain_hybrid.py)")
    parser.add_argument("--script", default="pretrain_gpt.py", choices=("pretrain_gpt.py", "pretrain_hybrid.py"),
                        help="the tree's training script (pretrain_hybrid.py: core_v0.19.0's, HybridModel)")
    parser.add_argument("--record", help="append each logged iteration's losses here (the last rank)")
    parser.add_argument("--logits", help="write the first training step's tokens and logits here (the last rank)")
    parser.add_argument("--count-launches", help="write the second iteration's kernel launches here, by micro-batch "
                                                 "and phase (scripts/bench/op_counter.py; one rank)")
    parser.add_argument("--count-saved", help="write the bytes the second iteration's second micro-batch saves for "
                                              "backward here (scripts/bench/saved_tensor_counter.py; rank 0)")
    parser.add_argument("flags", nargs=argparse.REMAINDER)
    ns = parser.parse_args(argv)
    flags = [flag for flag in ns.flags if flag != "--"] if ns.flags[:1] == ["--"] else ns.flags
    if "--distributed-backend" not in flags:
        flags += ["--distributed-backend", "gloo"]
    os.environ.setdefault("CUDA_DEVICE_MAX_CONNECTIONS", "1")
    tree = str(ns.megatron_lm.resolve())
    sys.path.insert(0, tree)
    torch.set_num_threads(1)
    apply_cpu_patches(ns.record, ns.logits, ns.count_launches, hybrid=ns.script == "pretrain_hybrid.py",
                      count_saved=ns.count_saved)
    script = os.path.join(tree, ns.script)
    sys.argv = [script, *flags]
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main()
elif __name__ == "__mp_main__":  # a process spawned by the run (_patch_spawned_main)
    _patch_python_311()
