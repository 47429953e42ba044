"""planner/meta_kernels.py: a dry run answered from the meta-kernel cache plans exactly what one that
runs every kernel plans, and the repeats are what the cache answers."""

import contextlib

import pytest
import torch

import planner.dry_run as dry_run_module
import planner.meta_kernels as meta_kernels
from arguments.parser import parse_config
from planner.dry_run import Cluster, dry_run
from planner.meta_kernels import CachedMetaKernels

META = torch.device("meta")
GB = 10**9

# Each exercises other kernels: stage 3 with partitioned checkpoints, CPU checkpointing at stage 1,
# sequence parallelism, pipeline stages, Llama blocks (RMSNorm, SwiGLU, RoPE, grouped queries), and
# a CPU target with dropout (the math attention path).
CASES = {
    "stage3-partitioned": "--num-layers 3 --tensor-model-parallel-size 2 --zero-stage 3 --checkpoint-activations "
                          "--partition-activations --fp16 --no-bf16",
    "stage1-cpu-checkpointing": "--num-layers 3 --zero-stage 1 --checkpoint-activations --partition-activations "
                                "--cpu-checkpointing",
    "sequence-parallel": "--num-layers 2 --tensor-model-parallel-size 2 --sequence-parallel --zero-stage 2",
    "pipeline": "--num-layers 4 --pipeline-model-parallel-size 2 --global-batch-size 16 --micro-batch-size 2 "
                "--zero-stage 1",
    "llama": "--num-layers 2 --swiglu --normalization RMSNorm --position-embedding-type rope "
             "--untie-embeddings-and-output-weights --disable-bias-linear --group-query-attention "
             "--num-query-groups 2 --zero-stage 3",
    "cpu-dropout": "--num-layers 2 --zero-stage 3 --attention-dropout 0.1",
}


def _plan(flags: str, cached: bool, monkeypatch):
    config = parse_config(["--config", "tiny", "--micro-batch-size", "2", "--global-batch-size", "16", *flags.split()])
    target = "cpu" if "dropout" in flags else "cuda"
    cluster = Cluster(world_size=4, gpus_per_node=4, gpu_memory_bytes=80 * GB, device_type=target)
    monkeypatch.setattr(dry_run_module, "CachedMetaKernels", CachedMetaKernels if cached else contextlib.nullcontext)
    plan = dry_run(config, cluster, vocab_size=512).to_json()
    plan.pop("process_baseline_bytes")  # this process's RSS when the plan began: a reading, not a prediction
    return plan


@pytest.mark.parametrize("case", CASES)
def test_a_cached_dry_run_plans_what_running_every_kernel_plans(case, monkeypatch):
    every_kernel = _plan(CASES[case], cached=False, monkeypatch=monkeypatch)
    assert _plan(CASES[case], cached=True, monkeypatch=monkeypatch) == every_kernel  # cold or warm cache alike
    assert _plan(CASES[case], cached=True, monkeypatch=monkeypatch) == every_kernel


def test_a_deeper_model_adds_only_cache_hits():
    """The same block on the same shapes: the layers a deeper model adds run no meta kernel again, though each
    layer's parameters and gradients are views at other offsets of ZeRO's flat buffers (the key leaves offsets out:
    no output's metadata follows them). What a warm dry run still runs are the few ops whose shapes follow the whole
    depth (the flat buffers)."""

    def counts(layers: int) -> tuple[int, int]:
        modes = []

        class Counted(CachedMetaKernels):
            def __init__(self):
                super().__init__()
                modes.append(self)

        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(dry_run_module, "CachedMetaKernels", Counted)
            patch.setattr(meta_kernels, "_cache", cache)
            config = parse_config(["--config", "tiny", "--micro-batch-size", "2", "--global-batch-size", "16",
                                   "--num-layers", str(layers), "--zero-stage", "3"])
            dry_run(config, Cluster(2, 2, 80 * GB, device_type="cuda"), vocab_size=512)
        return modes[0].misses, modes[0].hits

    cache: dict = {}  # the process's cache holds what earlier tests planned, depths included: start empty
    counts(2)  # warm the cache with every op the block runs
    misses_at_4, hits_at_4 = counts(4)
    misses_at_8, hits_at_8 = counts(8)
    assert misses_at_8 == misses_at_4 < hits_at_4 < hits_at_8


def test_views_and_out_ops_run_their_kernels():
    """Their outputs share other tensors' storage: a made-up fresh tensor would break that."""
    x = torch.empty(4, 6, device=META)
    outs = [torch.empty(4, 6, device=META) for _ in range(2)]
    with CachedMetaKernels() as mode:
        for out in outs:
            assert x.view(6, 4).untyped_storage()._cdata == x.untyped_storage()._cdata
            assert torch.add(x, x, out=out) is out
    assert mode.hits == 0


def test_an_in_place_op_is_answered_with_its_argument_unless_it_changes_its_metadata(monkeypatch):
    """add_ and addmm_ (gradient accumulation fusion's add into the main gradient) return their first argument as it
    was: a repeat on the same metadata is answered with the argument itself. t_ changes its argument's shape and
    strides, set_ its storage: they run every time (a cached t_ would leave the second transpose undone)."""
    monkeypatch.setattr(meta_kernels, "_cache", {})
    main_grad, grad_t, activations = (torch.empty(*shape, device=META) for shape in ((8, 4), (8, 3), (3, 4)))
    x, source, targets = torch.empty(4, 6, device=META), torch.empty(3, 3, device=META), torch.empty(2, 3, 3)
    with CachedMetaKernels() as mode:
        for _ in range(3):
            assert main_grad.addmm_(grad_t, activations) is main_grad
            assert main_grad.add_(1) is main_grad
    assert (mode.misses, mode.hits) == (2, 4) and main_grad.shape == (8, 4)
    with CachedMetaKernels() as mode:
        for target in targets.to(META):  # each a view of one storage, set_ to another's
            x.t_()
            target.set_(source)
            assert target.untyped_storage()._cdata == source.untyped_storage()._cdata
    assert x.shape == (4, 6) and mode.hits == 0
    with pytest.raises(RuntimeError):  # a repeat that fails the kernel's checks still fails: its key differs
        with CachedMetaKernels():
            main_grad.add_(torch.empty(5, device=META))


def test_a_repeated_op_gets_outputs_of_the_same_metadata_in_fresh_storage():
    x = torch.empty(2, 3, 8, device=META, dtype=torch.float16)
    weight, bias = torch.empty(8, device=META, dtype=torch.float16), torch.empty(8, device=META, dtype=torch.float16)
    with CachedMetaKernels() as mode:
        first = torch.ops.aten.native_layer_norm(x, [8], weight, bias, 1e-5)
        second = torch.ops.aten.native_layer_norm(x, [8], weight, bias, 1e-5)
    assert (mode.misses, mode.hits) == (1, 1)
    for made, ran in zip(second, first):
        assert (made.shape, made.stride(), made.dtype, made.device) == (ran.shape, ran.stride(), ran.dtype, ran.device)
        assert made.untyped_storage().nbytes() == ran.untyped_storage().nbytes()
        assert made.untyped_storage()._cdata != ran.untyped_storage()._cdata


def test_list_arguments_keep_their_boundaries_in_the_key(monkeypatch):
    """max_pool2d's kernel [2, 2] with stride [1], then kernel [2] with stride [2, 1]: the same numbers in
    the same order, other outputs (7 x 7, then 4 x 7). A key from the flattened arguments answered the
    second call with the first's shape."""
    monkeypatch.setattr(meta_kernels, "_cache", {})
    pool = torch.ops.aten.max_pool2d_with_indices
    x = torch.empty(1, 1, 8, 8, device=META)
    with CachedMetaKernels():
        square = pool(x, [2, 2], [1])[0]
        strided = pool(x, [2], [2, 1])[0]
    assert square.shape == (1, 1, 7, 7)
    assert strided.shape == pool(x, [2], [2, 1])[0].shape == (1, 1, 4, 7)
