"""A plan that does not fit names what makes it fit, with the figure after it; the host total is checked against this
machine's memory when no --host-memory is given; a step's micro-batches are planned as the schedule runs them
(issue 49).

A lever's figure is the dry run of the run with that lever (planner/levers.py): each test plans the lever's
command line on its own and compares. The levers are the ones a Megatron-LM / DeepSpeed user has: Megatron-LM's
`--recompute-granularity full` (megatron/training/arguments.py), DeepSpeed's ZeRO stages and `offload_optimizer`
(deepspeed/runtime/zero/config.py), and a wider pipeline or tensor-parallel grid.
"""

import json
import re

import pytest

from planner import plan as planner_cli

# Activations dominate: a long sequence, four layers, no recompute.
WIDE = ["--num-layers", "4", "--hidden-size", "64", "--num-attention-heads", "4", "--seq-length", "512",
        "--max-position-embeddings", "512", "--micro-batch-size", "8", "--global-batch-size", "16",
        "--tokenizer-vocab-size", "512"]
# Model states dominate: a short sequence, recompute already on.
DEEP = ["--num-layers", "8", "--hidden-size", "256", "--num-attention-heads", "4", "--seq-length", "16",
        "--max-position-embeddings", "16", "--micro-batch-size", "1", "--global-batch-size", "4",
        "--tokenizer-vocab-size", "512", "--checkpoint-activations"]


def planned(argv, capsys) -> dict:
    assert planner_cli.main(["dry-run", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_a_plan_short_of_memory_names_recompute_and_the_headroom_after_it(capsys):
    """Before: "does NOT fit, short by ..." and nothing about recompute."""
    without = planned(WIDE, capsys)["total_bytes"]
    with_recompute = planned([*WIDE, "--recompute-granularity", "full"], capsys)["total_bytes"]
    assert with_recompute < without
    budget = (without + with_recompute) // 2
    assert planner_cli.main(["dry-run", *WIDE, "--gpu-memory", str(budget)]) == 0
    text = capsys.readouterr().out
    short, spare = without - budget, budget - with_recompute
    line = next(line for line in text.splitlines() if "does NOT fit" in line)
    assert re.search(r"short by [0-9.]+ [KM]iB; with --recompute-granularity full it fits with [0-9.]+ [KM]iB to "
                     r"spare$", line), line
    from zero.memory import format_bytes

    assert f"short by {format_bytes(short)}; with --recompute-granularity full it fits with {format_bytes(spare)}" \
        in line
    record = planned([*WIDE, "--gpu-memory", str(budget)], capsys)
    assert record["levers"][0] == {"flags": "--recompute-granularity full", "total_bytes": with_recompute,
                                   "budget_bytes": budget, "fits": True, "host_node_bytes": 0,
                                   "host_budget_bytes": record["host_budget_bytes"], "headroom_bytes": spare}


def test_the_next_zero_stage_is_a_lever_where_dp_shards(capsys):
    argv = [*DEEP, "--world-size", "4"]
    stage1 = planned([*argv, "--zero-stage", "1"], capsys)["total_bytes"]
    stage0 = planned(argv, capsys)["total_bytes"]
    budget = (stage0 + stage1) // 2
    record = planned([*argv, "--gpu-memory", str(budget)], capsys)
    levers = {lever["flags"]: lever for lever in record["levers"]}
    assert levers["--zero-stage 1"]["total_bytes"] == stage1 and levers["--zero-stage 1"]["fits"]
    assert "--recompute-granularity full" not in levers  # already on


def test_a_model_no_single_lever_fits_gets_a_wider_grid(capsys):
    """One GPU, recompute on, no DP to shard over, a host of 1 MB: offload does not fit the host, so the planner goes
    on to more pipeline stages (on more GPUs, since one cannot hold them), re-planned as that run."""
    two_stages = planned([*DEEP, "--pipeline-model-parallel-size", "2", "--world-size", "2"], capsys)
    budget = max(stage["total_bytes"] for stage in two_stages["stages"])
    argv = [*DEEP, "--gpu-memory", str(budget), "--host-memory", "1MB"]
    record = planned(argv, capsys)
    wider = [(lever["flags"], lever["fits"], lever["total_bytes"]) for lever in record["levers"]][1:]
    assert wider[0] == ("--pipeline-model-parallel-size 2 on 2 GPUs", True, budget)
    assert wider[1][:2] == ("--tensor-model-parallel-size 2 on 2 GPUs", True) and len(wider) == 2
    assert record["levers"][0]["flags"] == "--zero-stage 1 --offload-optimizer" and not record["levers"][0]["fits"]
    assert planner_cli.main(["dry-run", *argv]) == 0
    assert "with --pipeline-model-parallel-size 2 on 2 GPUs it fits with 0 B to spare" in capsys.readouterr().out


def test_a_pipeline_plans_stage_hint_names_the_lever(capsys):
    """Megatron-LM's GPT-3 175B at TP 8 x PP 8 shape, shrunk: the worst stage's line said "its largest part: model
    states" where recompute is what fits it."""
    argv = [*WIDE, "--num-layers", "4", "--pipeline-model-parallel-size", "2", "--world-size", "2"]
    without = max(stage["total_bytes"] for stage in planned(argv, capsys)["stages"])
    with_recompute = max(stage["total_bytes"] for stage in
                         planned([*argv, "--recompute-granularity", "full"], capsys)["stages"])
    budget = (without + with_recompute) // 2
    assert planner_cli.main(["dry-run", *argv, "--gpu-memory", str(budget)]) == 0
    worst = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("worst stage"))
    assert "; with --recompute-granularity full it fits with" in worst, worst


def test_the_host_total_is_checked_against_this_machine(tmp_path, monkeypatch, capsys):
    """No --host-memory: the offloaded states are compared with this machine's MemAvailable (training/memory_fit.py's
    reader), and the line says whose memory it is. Before: no verdict at all."""
    import training.memory_fit as memory_fit

    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       8000 kB\nMemAvailable:       1000 kB\n")
    monkeypatch.setattr(memory_fit, "MEMINFO_PATH", str(meminfo))
    monkeypatch.setattr(memory_fit, "PROC_CGROUP_PATH", str(tmp_path / "no-cgroup"))
    argv = [*DEEP, "--zero-stage", "1", "--offload-optimizer", "--gpu-memory", "80GB"]
    record = planned(argv, capsys)
    assert record["host_budget_bytes"] == 1000 * 1024 and record["host_total_bytes"] > 1000 * 1024
    assert record["fits"] is False and "this machine's" in record["host_budget_source"]
    assert planner_cli.main(["dry-run", *argv]) == 0
    assert "host memory per node 1000.00 KiB (this machine's: MemAvailable; --host-memory for the cluster's): " \
           "does NOT fit" in capsys.readouterr().out
    assert planned([*argv, "--host-memory", "1TB"], capsys)["host_budget_source"] == ""  # the cluster's, as given


@pytest.mark.parametrize("steps", [2, 512])
def test_a_step_plans_two_micro_batches_and_says_so(steps, capsys):
    """llama3-8b at one GPU has 512 micro-batches a step; a plan runs the first and the last (one at a time under
    gradient accumulation, so one micro-batch's activations are the peak) and says how many it planned."""
    argv = [*WIDE, "--micro-batch-size", "1", "--global-batch-size", str(steps)]
    record = planned(argv, capsys)
    assert (record["micro_batches"], record["simulated_micro_batches"]) == (steps, 2)
    assert record["total_bytes"] == planned([*WIDE, "--micro-batch-size", "1", "--global-batch-size", "2"],
                                            capsys)["total_bytes"]
    assert planner_cli.main(["dry-run", *argv]) == 0
    assert f"micro batch 1, {steps} micro-batches a step on each DP rank" in capsys.readouterr().out


def test_block_recompute_short_of_memory_names_uniform_recompute(capsys):
    """--recompute-method block leaves layers keeping their activations (Megatron-LM's first N of each chunk): the
    lever is to recompute every layer, uniform, each planned on its own."""
    block = [*WIDE, "--recompute-granularity", "full", "--recompute-method", "block", "--recompute-num-layers", "1"]
    uniform = planned([*block, "--recompute-method", "uniform", "--recompute-num-layers", "1"], capsys)["total_bytes"]
    with_block = planned(block, capsys)["total_bytes"]
    assert uniform < with_block < planned(WIDE, capsys)["total_bytes"]
    budget = (uniform + with_block) // 2
    lever = planned([*block, "--gpu-memory", str(budget)], capsys)["levers"][0]
    assert (lever["flags"], lever["total_bytes"], lever["fits"]) == \
        ("--recompute-method uniform --recompute-num-layers 1", uniform, True)
