"""Issue 36 point 5: the planner knows where every byte lives, on the device or on the host, with offload.

ZeRO-Offload keeps the fp32 master partition, both Adam moments and the reduced gradient partition in host memory
(DeepSpeed's stage_1_and_2.py `.to(device='cpu')` and `copy_grads_in_partition`); ZeRO-3 Offload also the 16-bit
parameter shard (partition_parameters.py `remote_device`). Megatron-LM's hybrid optimizer (fraction 0.5,
zero/hybrid_offload.py) keeps the first part's master, moments and a gradient copy on the host, the rest on the
device.

The acceptance: for each placement (none, optimizer, optimizer + parameters, hybrid) and stage, the dry run's
device and host bytes of every rank equal what a live 2-rank run holds after one iteration, over the same tensors
(`optimizer.model_state_tensors()`). On a CPU the "device" is the CPU too, so both sides split by which buffer a
tensor is (`zero.memory.host_resident_tensors`), the rule a CUDA run's tensor.device agrees with.
"""

import pytest
import torch

from arguments.parser import parse_config
from parallel.state import destroy, initialize
from planner.dry_run import Cluster, dry_run
from tests.distributed import run_distributed
from training.build import build
from training.run_settings import resolve_run_settings
from zero.memory import MODEL_STATE_CATEGORIES, host_resident_tensors, measure_by_placement, measure_tensor_bytes

VOCAB = 512
WORLD = 2
COMMON = ["--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4", "--seq-length", "32",
          "--max-position-embeddings", "32", "--micro-batch-size", "2", "--global-batch-size", "4",
          "--vocab-size", str(VOCAB), "--reduce-bucket-size", "3000", "--allgather-bucket-size", "3000"]
# Sub-groups smaller than a partition: the host buffer is one sub-group, not the partition.
SUB_GROUP_ELEMENTS = 4096
SUB_GROUP = ["--sub-group-size", str(SUB_GROUP_ELEMENTS)]
PLACEMENTS = {
    "none": [],
    "optimizer": ["--offload-optimizer", *SUB_GROUP],
    "optimizer+param": ["--offload-optimizer", "--offload-param", *SUB_GROUP],
    # Megatron-LM's hybrid optimizer (zero/hybrid_offload.py): [0, cut) of the partition's states on the host
    "hybrid": ["--offload-optimizer", "--optimizer-offload-fraction", "0.5"],
}
PRECISIONS = {"fp32": [], "bf16": ["--bf16"],
              # 16-bit gradients: stages 2-3 accumulate the micro-batches in a bf16 host partition
              "bf16-grads": ["--bf16", "--no-accumulate-allreduce-grads-in-fp32"]}
CASES = [(placement, stage, precision) for placement in PLACEMENTS for stage in (1, 2, 3)
         for precision in ("fp32", "bf16") if not (placement == "optimizer+param" and stage != 3)] \
    + [("optimizer", 2, "bf16-grads")]


def flags(placement: str, stage: int, precision: str) -> list[str]:
    return [*COMMON, "--zero-stage", str(stage), *PLACEMENTS[placement], *PRECISIONS[precision]]


def spy_on_device_peak(gatherer) -> dict:
    """The most bytes stage 3's gathered chunks and offload's device copies of shard pieces hold at
    once, read from the storages themselves (not the gatherer's counters): they grow only when a
    gather starts, so sampling after each start finds the peak."""
    peak = {"bytes": 0}
    start = gatherer._start_gather

    def sample() -> None:
        held = sum(flat.untyped_storage().nbytes() for flat in gatherer.flat)
        held += sum(copy.untyped_storage().nbytes() for copy in gatherer._fetched.values())
        peak["bytes"] = max(peak["bytes"], held)

    def start_and_sample(unit) -> None:
        start(unit)
        sample()

    gatherer._start_gather = start_and_sample
    sample()
    return peak


def measured_after_one_iteration(rank, world_size):
    """Every case on this rank: build as the trainer does, one iteration, then bytes by placement."""
    state = initialize("cpu", 1)
    try:
        results = {}
        for case in CASES:
            config = parse_config(flags(*case))
            plan = resolve_run_settings(config, VOCAB, 1, state.data_parallel_size, "cpu")
            built = build(plan, state, dropout_rng=False, torch_compile=False)
            zero, optimizer = built.zero, built.zero.optimizer
            gatherer = getattr(optimizer.parameters, "gatherer", None)
            device_peak = spy_on_device_peak(gatherer) if gatherer is not None else None
            zero.reducer.zero_grad()
            tokens = torch.randint(0, VOCAB, (2, 33), generator=torch.Generator().manual_seed(rank))
            zero.scale_loss(built.model(tokens[:, :-1], tokens[:, 1:]).float().mean()).backward()
            zero.reducer.finish_grad_sync()
            optimizer.step()
            placed = measure_by_placement(optimizer.model_state_tensors(), host_resident_tensors(optimizer))
            results[case] = {"placed": placed,
                             "whole": measure_tensor_bytes(optimizer.model_state_tensors()),
                             "host_working_bytes": optimizer.host_working_bytes(),
                             "stage3_device_peak": device_peak and device_peak["bytes"],
                             "partition": optimizer.layout.partition_numel,
                             "cut": getattr(optimizer, "cut", None)}
        return results
    finally:
        destroy(state)


@pytest.fixture(scope="module")
def live():
    return run_distributed(measured_after_one_iteration, WORLD, timeout=300)


@pytest.mark.parametrize("case", CASES, ids=lambda case: "-".join(map(str, case)))
def test_dry_run_device_and_host_bytes_equal_the_live_run(live, case):
    placement, stage, precision = case
    config = parse_config(flags(*case))
    for rank, results in enumerate(live):
        measured = results[case]
        plan = dry_run(config, Cluster(WORLD, WORLD, device_type="cpu"), VOCAB, rank=rank)
        device, host = measured["placed"]["device"], measured["placed"]["host"]
        for category in (*MODEL_STATE_CATEGORIES, "total"):
            assert plan.model_state_bytes[category] == device[category], f"rank {rank} device {category}"
            assert plan.host_model_state_bytes[category] == host[category], f"rank {rank} host {category}"
        assert plan.buffer_bytes == device["buffers"] and plan.host_buffer_bytes == host["buffers"], f"rank {rank}"
        # Nothing is lost or counted twice by the split.
        assert device["total"] + host["total"] == measured["whole"]["total"]
        assert device["buffers"] + host["buffers"] == measured["whole"]["buffers"]
        if stage == 3:  # the gathered chunks' and offload's device copies' peak is the planned one
            assert plan.stage3_live_chunk_bytes + plan.offload_copy_bytes == measured["stage3_device_peak"]
            assert (plan.offload_copy_bytes > 0) == (placement == "optimizer+param")
        # What lives where, in the terms of the offload (independent of the planner's code path).
        partition = measured["partition"]
        if placement == "hybrid":  # the host part's master and moments, and the copy of its gradient for its step
            cut = measured["cut"]
            assert 0 < cut < partition
            assert (host["master_weights"], host["optimizer_states"], host["buffers"]) == (4 * cut, 8 * cut, 4 * cut)
            assert device["master_weights"] + device["optimizer_states"] == 12 * (partition - cut)
            assert host["gradients"] == host["parameters"] == 0 and device["gradients"] > 0
            assert plan.host_total_bytes == host["total"] + host["buffers"]
            continue
        offloaded = placement != "none"
        assert host["master_weights"] == (4 * partition if offloaded else 0)
        assert host["optimizer_states"] == (8 * partition if offloaded else 0)
        assert device["master_weights"] + device["optimizer_states"] == (0 if offloaded else 12 * partition)
        assert host["buffers"] == measured["host_working_bytes"] == 0
        # The gradient partition is on the host: fp32 for the step, plus the 16-bit one stages 2-3
        # accumulate the micro-batches in; the device keeps only stage 1's full accumulation buffer.
        grad_bytes = 2 if config.training.gradient_precision == "bf16" else 4
        accumulation = grad_bytes * partition if stage >= 2 and grad_bytes == 2 else 0
        assert host["gradients"] == ((4 * partition + accumulation) if offloaded else 0)
        if offloaded:
            assert (device["gradients"] > 0) if stage == 1 else device["gradients"] == 0
        shard_bytes = partition * (4 if precision == "fp32" else 2)
        assert host["parameters"] == (shard_bytes if placement == "optimizer+param" else 0)
        assert plan.host_total_bytes == host["total"] + host["buffers"]  # no P_a+cpu here


def test_offload_param_adds_the_gathers_device_copies_and_host_memory_binds(live):
    """--offload-param moves the 16-bit shard off the device, and each gather holds a 1/N device copy of
    its unit until it completes (zero/stage3.py): the plan counts those copies in the passes, bounded by
    1/N of the gathered peak; --host-memory per node is a budget of its own."""
    base = flags("optimizer", 3, "bf16")
    cluster = Cluster(WORLD, WORLD, gpu_memory_bytes=10**9, device_type="cpu")
    optimizer_only = dry_run(parse_config(base), cluster, VOCAB)
    both = dry_run(parse_config([*base, "--offload-param"]), cluster, VOCAB)
    assert optimizer_only.offload_copy_bytes == 0
    # At most every gathered unit's 1/N piece is in flight at once.
    assert 0 < both.offload_copy_bytes <= -(-both.stage3_live_chunk_bytes // 2 // WORLD) * 2
    shard = optimizer_only.model_state_bytes["parameters"]
    assert both.model_state_bytes["parameters"] == 0 and both.host_model_state_bytes["parameters"] == shard
    assert both.fits and both.fits_host is None
    host_node = both.host_node_bytes
    assert host_node == WORLD * both.host_total_bytes
    tight = dry_run(parse_config([*base, "--offload-param"]),
                    Cluster(WORLD, WORLD, 10**9, "cpu", host_memory_bytes=host_node - 1), VOCAB)
    assert tight.fits_device and tight.fits_host is False and not tight.fits and tight.binding == "host"


def test_a_cpu_memory_line_compares_rss_with_device_and_host_predictions_together():
    """On a CPU the process's RSS holds the offloaded (host) states too: MemoryCheck compares it with the
    device and host predictions summed, so an offloaded CPU run does not read as 12 bytes/parameter over."""
    from training.metrics import MemoryCheck

    check = MemoryCheck(100 * 2**20, torch.device("cpu"), predicted_host_bytes=50 * 2**20)
    assert check.figures()[1] == 150 * 2**20
    assert "predicted peak 150.0 MiB" in check.line(1)
    assert MemoryCheck(100 * 2**20, torch.device("cpu")).figures()[1] == 100 * 2**20


def test_the_prefetch_window_counts_the_device_copies_of_offloaded_shards():
    """A window of two (padded) block chunks prefetches two blocks ahead; with --offload-param each gather
    also holds a device copy of its 1/N piece until it is waited for, which the window counts (zero/
    stage3.py), so two blocks plus their copies no longer fit and one block is prefetched. Without that, the window
    bounded the gathered parameters only, and the copies came on top of it on the device."""
    from tests.zero.test_stage3_budget import CHUNK

    def planned(*extra):
        config = parse_config(["--num-layers", "6", "--hidden-size", "64", "--num-attention-heads", "4",
                               "--seq-length", "32", "--max-position-embeddings", "32", "--zero-stage", "3",
                               "--micro-batch-size", "2", "--global-batch-size", "4",
                               "--stage3-prefetch-bucket-size", str(2 * CHUNK),
                               "--stage3-param-persistence-threshold", "0", "--offload-optimizer", *extra])
        return dry_run(config, Cluster(WORLD, WORLD, device_type="cpu"), 1000)

    resident, offloaded = planned(), planned("--offload-param")
    assert resident.stage3_live_chunk_bytes - offloaded.stage3_live_chunk_bytes == CHUNK * 4  # fp32
    window = 2 * CHUNK * 4
    # The peak: the root chunk and the block in use (each with its copy), and the window's worth ahead.
    root_and_block = resident.stage3_live_chunk_bytes - 2 * CHUNK * 4
    assert offloaded.stage3_live_chunk_bytes + offloaded.offload_copy_bytes <= root_and_block * 3 // 2 + window
