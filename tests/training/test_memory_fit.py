"""Memory checked before the build from the planner's per-rank figures (issue 47, item 7).

Before, `check_machine_bounds` counted 2 bytes a parameter, so a ~4B model with ZeRO-2 and optimizer
offload on a 24 GB machine built the data and the model and died in an allocation. Now every rank's
dry run (planner/dry_run.py: device bytes and the host bytes of offload) is held against the host's
MemAvailable (or its cgroup's limit) and CUDA's free bytes before any output is claimed, data built or
model made (training/memory_fit.py). Neither Megatron-LM nor DeepSpeed checks this (DeepSpeed's
deepspeed/runtime/zero/stage_1_and_2.py `estimate_zero2_model_states_mem_needs` is an estimator a user
calls by hand), so no flag skips it.

The host's figures are files the test writes (training/memory_fit.py reads MEMINFO_PATH and
PROC_CGROUP_PATH): nothing here allocates the model it refuses.
"""

from __future__ import annotations

import math
import time

import pytest

import pretrain_gpt
import training.prepare
from arguments.batch_schedule import batch_schedule
from arguments.parser import parse_config
from planner.dry_run import Cluster, dry_run
from tests.distributed import run_distributed
from tests.reliability_helpers import TINY, run_main
from training import memory_fit
from training.memory_fit import RankMemory, cgroup_available_bytes, mem_available_bytes, memory_verdict

GIB = 2**30
# About 3.8B parameters (32 x 3072, GPT-2's vocabulary size), ZeRO-2 with the optimizer offloaded: 16 bytes a
# parameter of fp32 master, Adam moments and gradient partition on the host alone.
FOUR_B = ["--num-layers", "32", "--hidden-size", "3072", "--num-attention-heads", "32", "--seq-length", "1024",
          "--max-position-embeddings", "1024", "--micro-batch-size", "1", "--global-batch-size", "1",
          "--train-iters", "2", "--eval-iters", "0", "--device", "cpu", "--bf16", "--tokenizer-vocab-size", "50257",
          "--zero-stage", "2", "--offload-optimizer"]


def fake_host(directory, available_bytes: int) -> None:
    """This machine as the check reads it: MemAvailable `available_bytes` (rounded down to a kB, as the
    kernel writes it) and no memory cgroup."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "meminfo").write_text(f"MemTotal:       {available_bytes // 1024 + 4096} kB\n"
                                       f"MemFree:        {available_bytes // 1024} kB\n"
                                       f"MemAvailable:   {available_bytes // 1024} kB\n")
    (directory / "cgroup").write_text("0::/\n")
    memory_fit.MEMINFO_PATH = str(directory / "meminfo")
    memory_fit.PROC_CGROUP_PATH = str(directory / "cgroup")
    memory_fit.CGROUP_ROOT = str(directory / "no-cgroup-fs")


@pytest.fixture
def machine(tmp_path, monkeypatch):
    """A fake host under tmp_path/machine; the module's paths are put back after the test."""
    for name in ("MEMINFO_PATH", "PROC_CGROUP_PATH", "CGROUP_ROOT"):
        monkeypatch.setattr(memory_fit, name, getattr(memory_fit, name))
    return lambda available_bytes: fake_host(tmp_path / "machine", available_bytes)


def no_work(monkeypatch) -> None:
    """Make claiming the outputs (the first step of training/prepare.py, before the tokenizer, the
    data and the model) fail loudly: a run that gets there was not refused before any work."""
    def claimed(*args, **kwargs):
        raise AssertionError("the run went on to claim its outputs, build its data and its model")
    monkeypatch.setattr(training.prepare, "claim_run_start", claimed)


def planned_need(argv: list[str], vocab_size: int, world_size: int = 1, rank: int = 0) -> int:
    """The planner's bytes for a CPU rank, where the device is the host: device peak plus host bytes."""
    config = parse_config(argv)
    plan = dry_run(config, Cluster(world_size, world_size, None, "cpu"), vocab_size, rank,
                   batch=batch_schedule(config, world_size))
    return plan.total_bytes + plan.host_total_bytes


def test_a_4b_zero2_offload_run_on_a_24gb_host_is_one_line_before_any_work(tmp_path, machine, monkeypatch):
    """Issue 47 #7: the run that built its data and model and was OOM-killed is refused in seconds, in one
    line naming the figure (what this host's ranks need, what it has) and the levers."""
    machine(24 * GIB)
    no_work(monkeypatch)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    monkeypatch.chdir(run_dir)
    started = time.monotonic()
    outcome = run_main(pretrain_gpt.main, [*FOUR_B, "--data-cache-dir", run_dir / "cache"])
    elapsed = time.monotonic() - started
    need = planned_need(FOUR_B, 50257)
    line = outcome.one_error_line(f"needs {need / GIB:.2f} GiB of host memory", "for its 1 rank(s)",
                                  "24.00 GiB is available (MemAvailable)", "--offload-optimizer",
                                  "more hosts", "--zero-stage 3", "a smaller model")
    assert need > 64 * GIB, line  # 16 bytes a parameter on the host alone, and the device's share beside it
    assert elapsed < 30, f"the refusal took {elapsed:.1f} s"
    assert list(run_dir.iterdir()) == [], "a refused run created files"


@pytest.mark.parametrize("extra", [[], ["--zero-stage", "2", "--offload-optimizer"]],
                         ids=["default-tiny", "zero2-offload"])
def test_the_check_holds_the_planners_figure_to_the_byte(tmp_path, machine, monkeypatch, extra):
    """The check and the planner agree: a host with one kB less than the dry run's device + host bytes
    (a CPU rank's device is the host) refuses the run, naming that figure; one with it trains."""
    argv = [*TINY, *extra]
    need = planned_need(argv, 300)  # TINY trains its tokenizer with --tokenizer-vocab-size 300
    monkeypatch.chdir(tmp_path)
    cache = str(tmp_path / "cache")
    machine(math.ceil(need / 1024) * 1024 - 1024)
    outcome = run_main(pretrain_gpt.main, [*argv, "--data-cache-dir", cache])
    outcome.one_error_line(f"needs {need / GIB:.2f} GiB of host memory")
    machine(math.ceil(need / 1024) * 1024)
    outcome = run_main(pretrain_gpt.main, [*argv, "--data-cache-dir", cache])
    assert outcome.code == 0 and "iteration        2/       2" in outcome.out, outcome.err[-2000:]


def refused_on_two_ranks(rank, world_size, machine_dir, available, argv):
    """One rank of a 2-rank launch on a host of `available` bytes: its status and stderr."""
    import pathlib

    fake_host(pathlib.Path(machine_dir), available)
    training.prepare.claim_run_start = lambda *args, **kwargs: (_ for _ in ()).throw(
        AssertionError("the run went on to claim its outputs"))
    outcome = run_main(pretrain_gpt.main, argv)
    return outcome.code, outcome.err


def test_ranks_on_one_host_add_up_and_every_rank_refuses(tmp_path):
    """Two ranks on one host each fit alone and not together: both exit 2 (the verdict is agreed, so
    neither waits in a collective for the other) and rank 0 names both ranks' need."""
    argv = [*TINY, "--global-batch-size", "4", "--zero-stage", "2", "--offload-optimizer",
            "--data-cache-dir", str(tmp_path / "cache")]
    needs = [planned_need(argv, 300, world_size=2, rank=rank) for rank in range(2)]
    available = sum(needs) - 4096
    assert available > max(needs)
    results = run_distributed(refused_on_two_ranks, 2, str(tmp_path / "machine"), available, argv, timeout=120)
    assert [code for code, _ in results] == [2, 2], results
    line = results[0][1].strip()
    assert f"needs {sum(needs) / GIB:.2f} GiB of host memory" in line and "for its 2 rank(s)" in line, line
    assert results[1][1] == ""  # only rank 0 speaks


def test_mem_available_and_the_cgroup_limit(tmp_path):
    """MemAvailable in kB; a cgroup v2 limit less its usage (less the inactive file cache) where lower, the
    tightest of the cgroup and its ancestors; v1's "no limit" is no limit."""
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       32000000 kB\nMemAvailable:   20000000 kB\nBuffers: 1 kB\n")
    assert mem_available_bytes(str(meminfo)) == 20000000 * 1024
    meminfo.write_text("MemTotal:       32000000 kB\n")  # a kernel before 3.14
    assert mem_available_bytes(str(meminfo)) is None
    assert mem_available_bytes(str(tmp_path / "missing")) is None

    root = tmp_path / "cgroup2"
    job = root / "jobs" / "job1"
    job.mkdir(parents=True)
    (job / "memory.max").write_text(f"{8 * GIB}\n")
    (job / "memory.current").write_text(f"{3 * GIB}\n")
    (job / "memory.stat").write_text(f"anon {2 * GIB}\ninactive_file {GIB}\n")
    (root / "jobs" / "memory.max").write_text("max\n")
    proc = tmp_path / "proc-cgroup"
    proc.write_text("0::/jobs/job1\n")
    assert cgroup_available_bytes(str(proc), str(root)) == 6 * GIB  # 8 - (3 - 1)
    (root / "jobs" / "memory.max").write_text(f"{5 * GIB}\n")
    (root / "jobs" / "memory.current").write_text(f"{4 * GIB}\n")
    assert cgroup_available_bytes(str(proc), str(root)) == GIB  # the parent's is tighter

    v1 = tmp_path / "cgroup1" / "memory" / "docker" / "abc"
    v1.mkdir(parents=True)
    (v1 / "memory.limit_in_bytes").write_text("9223372036854771712\n")
    proc.write_text("4:memory:/docker/abc\n1:cpu:/\n")
    assert cgroup_available_bytes(str(proc), str(tmp_path / "cgroup1")) is None
    (v1 / "memory.limit_in_bytes").write_text(f"{4 * GIB}\n")
    (v1 / "memory.usage_in_bytes").write_text(f"{GIB}\n")
    (v1 / "memory.stat").write_text(f"total_inactive_file {GIB // 2}\n")
    assert cgroup_available_bytes(str(proc), str(tmp_path / "cgroup1")) == 4 * GIB - GIB // 2


def test_a_cgroup_limit_below_mem_available_is_the_figure(tmp_path, machine, monkeypatch):
    """A container of 1 GiB on a host with 100 GiB free: the container's limit is what the run gets."""
    machine(100 * GIB)
    root = tmp_path / "cg"
    (root / "job").mkdir(parents=True)
    (root / "job" / "memory.max").write_text(f"{GIB}\n")
    (root / "job" / "memory.current").write_text("0\n")
    (tmp_path / "machine" / "cgroup").write_text("0::/job\n")
    monkeypatch.setattr(memory_fit, "CGROUP_ROOT", str(root))
    assert memory_fit.available_host_memory() == (GIB, "the memory cgroup's limit less its usage")


def rank(index, host="a", device=0, host_bytes=0, on_cpu=True, host_free=None, device_free=None):
    return RankMemory(rank=index, host=host, device_bytes=device, host_bytes=host_bytes, device_is_host=on_cpu,
                      host_available=host_free, host_source="MemAvailable", device_available=device_free,
                      device_name=f"cuda:{index}")


def test_the_verdict_over_hosts_and_devices():
    """Hosts sum their ranks' needs (the device's too on a CPU); a CUDA rank's device bytes meet its
    own free bytes; the levers follow the config (no offload lever where the device is the host)."""
    config = parse_config([*TINY, "--zero-stage", "2", "--offload-optimizer"])
    assert memory_verdict([rank(0, device=GIB, host_bytes=GIB, host_free=4 * GIB),
                           rank(1, device=GIB, host_bytes=GIB, host_free=4 * GIB)], config.zero, config.activations) is None
    line = memory_verdict([rank(0, device=GIB, host_bytes=GIB, host_free=3 * GIB),
                           rank(1, device=GIB, host_bytes=GIB, host_free=3 * GIB)], config.zero, config.activations)
    assert "needs 4.00 GiB of host memory on host a for its 2 rank(s)" in line and "3.00 GiB is available" in line
    assert "drop --offload-optimizer" not in line  # on a CPU, offloading moves bytes within the same memory
    # Two hosts: each holds its own ranks.
    assert memory_verdict([rank(0, "a", GIB, host_free=GIB), rank(1, "b", GIB, host_free=GIB)], config.zero,
                          config.activations) is None
    # CUDA: offloaded bytes on the host, the rest on each rank's device.
    cuda = [rank(0, device=10 * GIB, host_bytes=30 * GIB, on_cpu=False, host_free=50 * GIB, device_free=70 * GIB),
            rank(1, device=10 * GIB, host_bytes=30 * GIB, on_cpu=False, host_free=50 * GIB, device_free=70 * GIB)]
    line = memory_verdict(cuda, config.zero, config.activations)
    assert "needs 60.00 GiB of host memory" in line and "offload only what fits (drop --offload-optimizer" in line
    cuda = [rank(0, device=10 * GIB, host_bytes=30 * GIB, on_cpu=False, host_free=80 * GIB, device_free=70 * GIB),
            rank(1, device=10 * GIB, host_bytes=30 * GIB, on_cpu=False, host_free=80 * GIB, device_free=9 * GIB)]
    line = memory_verdict(cuda, config.zero, config.activations)
    assert line.startswith("rank 1 needs 10.00 GiB on cuda:1") and "9.00 GiB is free (torch.cuda.mem_get_info)" in line
    assert "--zero-stage 3" in line and "--checkpoint-activations" in line
    # A host whose memory cannot be read is not checked.
    assert memory_verdict([rank(0, device=GIB, host_bytes=GIB)], config.zero, config.activations) is None


def test_a_rank_the_planner_cannot_plan_is_said_and_not_checked(machine):
    """A failed plan must not stop a run (planner/launch.py's predicted_peak): the first rank says which
    rank went unchecked and why; a planned figure on the same host is still held to its memory."""
    import torch

    from arguments.config import ConfigError
    from parallel.state import virtual_state

    machine(GIB)
    config = parse_config(TINY)
    state = virtual_state(1, 1, 0, torch.device("cpu"))
    said = []
    memory_fit.check_memory_fits(config, state, batch_schedule(config, 1),
                                 lambda *args: (None, 0, "the planner failed: RuntimeError: x"), said.append)
    assert said == ["> memory not checked before the build for rank 0: the planner failed: RuntimeError: x"]
    with pytest.raises(ConfigError, match=r"needs 2.00 GiB of host memory .* 1.00 GiB is available"):
        memory_fit.check_memory_fits(config, state, batch_schedule(config, 1),
                                     lambda *args: (GIB, GIB, ""), said.append)
