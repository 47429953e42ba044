"""`python -m zero.plan` with offload: host bytes in the dry-run table, and --host-memory (per node) as a
second budget that max-size reports when it is the one that binds (issue 36 point 5).

DeepSpeed's ZeRO-Offload puts 12 bytes per parameter of the rank's shard (fp32 master, exp_avg,
exp_avg_sq) in host memory (deepspeedai/DeepSpeed deepspeed/runtime/zero/stage_1_and_2.py @edaa722,
lines 492-497: `weights_partition ... .to(device='cpu')`), so with it a node's host memory, shared by the
node's ranks, can be what limits the model (Ren et al. 2021, ZeRO-Offload, section 4).
"""

import json

import pytest

from arguments.parser import parse_config
from planner import plan as planner_cli
from planner.dry_run import Cluster

SMALL = ["--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4", "--seq-length", "32",
         "--max-position-embeddings", "32", "--micro-batch-size", "2", "--global-batch-size", "8"]
OFFLOAD = ["--zero-stage", "3", "--bf16", "--offload-optimizer", "--offload-param"]


def test_dry_run_prints_host_bytes_and_the_host_verdict(capsys):
    argv = ["dry-run", "--world-size", "4", "--gpus-per-node", "4", "--gpu-memory", "16GB", "--host-memory", "1MB",
            *OFFLOAD, *SMALL]
    assert planner_cli.main(argv) == 0
    text = capsys.readouterr().out
    for words in ("host: fp32 master weights (offloaded)", "host: Adam moments (offloaded)",
                  "host: 16-bit parameter shard (offloaded)", "host: fp32 gradient partition (offloaded)",
                  "host total per rank; per node (4 ranks)", "host memory per node 976.56 KiB: does NOT fit; the tighter budget is the host's",
                  "budget 14.90 GiB: fits", "offloaded shards' device copies"):
        assert words in text, words
    assert planner_cli.main([*argv, "--json"]) == 0
    record = json.loads(capsys.readouterr().out)
    host = record["host_model_state_bytes"]
    assert record["model_state_bytes"]["master_weights"] == record["model_state_bytes"]["optimizer_states"] == 0
    assert host["optimizer_states"] == 2 * host["master_weights"] > 0 and host["parameters"] > 0
    # The reduced gradient partition lives on the host, fp32 like the master (zero/grad_reducer.py).
    assert host["gradients"] == host["master_weights"] and record["model_state_bytes"]["gradients"] == 0
    assert record["host_total_bytes"] == host["total"] + record["host_buffer_bytes"]
    assert record["host_budget_bytes"] == 10**6 and record["ranks_per_node"] == 4 and record["fits"] is False


def test_without_offload_nothing_is_on_the_host(capsys):
    assert planner_cli.main(["dry-run", "--world-size", "2", "--json", "--zero-stage", "2", *SMALL]) == 0
    record = json.loads(capsys.readouterr().out)
    assert record["host_model_state_bytes"]["total"] == record["host_buffer_bytes"] == record["host_total_bytes"] == 0


class _LinearPlan:
    """What max-size reads of a plan: device and host bytes, each a line in the layers."""

    def __init__(self, layers: int, cluster: Cluster):
        self.total_bytes, self.budget_bytes = 10**6 + 10**5 * layers, cluster.gpu_memory_bytes
        self.host_node_bytes, self.host_budget_bytes = 10**6 + 4 * 10**5 * layers, cluster.host_memory_bytes
        self.parameters_total, self.headroom_bytes = 10**4 * layers, self.budget_bytes - self.total_bytes

    @property
    def fits_device(self):
        return self.total_bytes <= self.budget_bytes

    @property
    def fits_host(self):
        return None if self.host_budget_bytes is None else self.host_node_bytes <= self.host_budget_bytes

    @property
    def fits(self):
        return self.fits_device and self.fits_host is not False

    def to_json(self):
        return {"total_bytes": self.total_bytes, "host_node_bytes": self.host_node_bytes}


@pytest.mark.parametrize("host_memory, layers, binds", [
    (None, 30, None),                       # the device alone: 1e6 + 1e5 x 30 = 4e6
    ("5e6", 10, "host memory"),             # the host binds first: 1e6 + 4e5 x 10 = 5e6
    ("1e9", 30, "device memory")])
def test_max_size_says_which_budget_binds(monkeypatch, capsys, host_memory, layers, binds):
    monkeypatch.setattr(planner_cli, "dry_run", lambda config, cluster, vocab, progress=None:
                        _LinearPlan(config.model.num_layers, cluster))
    argv = ["max-size", "--world-size", "1", "--gpu-memory", "4e6", "--zero-stage", "1", *SMALL, "--json"]
    assert planner_cli.main(argv + (["--host-memory", host_memory] if host_memory else [])) == 0
    record = json.loads(capsys.readouterr().out)
    assert {result["layers"] for result in record.values()} == {layers}
    if binds:
        assert {result["binds"] for result in record.values()} == {binds}
        assert planner_cli.main(argv[:-1] + ["--host-memory", host_memory]) == 0
        assert f"| {binds} |" in capsys.readouterr().out


def test_a_bad_host_memory_names_its_flag():
    with pytest.raises(planner_cli.ConfigError, match="--host-memory"):
        planner_cli.parse_planner(["--host-memory", "lots"], "zero.plan")


# The shape of docs/zero.md's check against ZeRO-Offload's headline (Ren et al. 2021: 13B on one 32 GB
# V100 of a DGX-2 with 1.5 TB of host memory); the shape, batch and sequence are assumptions stated there.
OFFLOAD_13B = ["--hidden-size", "5120", "--num-attention-heads", "40", "--seq-length", "1024",
               "--max-position-embeddings", "1024", "--micro-batch-size", "1", "--global-batch-size", "1", "--fp16",
               "--no-bf16", "--no-accumulate-allreduce-grads-in-fp32", "--zero-stage", "2", "--offload-optimizer",
               "--checkpoint-activations"]


def test_the_offload_headline_as_docs_zero_md_states_it():
    """43 layers (13.8B) fit one 32 GB GPU with 1.5 TB of host memory and 44 do not, the device binding:
    the reduced gradient partition goes to the host (fp16 to accumulate in and fp32 for the step, 6 bytes/
    parameter there, beside 12 of master and moments), so the device keeps
    the 16-bit parameters (2 bytes/parameter) and the reduce buckets, as ZeRO-Offload's does. Before the
    gradients went to the host during backward, 11 layers (3.7B) were the most: the device kept the
    16-bit gradient partition and the step's fp32 copy of it (6 more bytes/parameter)."""
    from planner.dry_run import dry_run

    cluster = Cluster(1, 1, 32 * 10**9, "cuda", host_memory_bytes=15 * 10**11)
    fits, too_deep = (dry_run(parse_config([*OFFLOAD_13B, "--num-layers", str(layers)]), cluster,
                              planner_cli.GPT2_VOCAB) for layers in (43, 44))
    assert fits.fits and round(fits.parameters_total / 1e9, 1) == 13.8
    assert not too_deep.fits_device and too_deep.fits_host
    assert 231 * 2**30 < fits.host_node_bytes < 232 * 2**30
    device, host = fits.model_state_bytes, fits.host_model_state_bytes
    assert device["gradients"] == 0 and host["gradients"] == 3 * device["parameters"]  # fp16 + fp32 on the host
    # The step holds publishing's bucket copies only, no fp32 gradient partition (2x the parameters).
    assert fits.step_working_bytes < device["parameters"] // 10
