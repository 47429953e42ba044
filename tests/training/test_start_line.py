"""What a run's log says it does (issue 49, "The first hour, round 3"): the start-up line names every
placement and dimension in force, the memory line splits device from host, the end of a run counts its
steps taken and skipped, and the torch thread count follows one rule."""

import json

import torch

import pretrain_gpt
from arguments.parser import parse_config
from parallel.state import virtual_state
from tests.reliability_helpers import TINY, run_main
from training.loop import TrainingSummary
from training.metrics import MemoryCheck
from training.run_description import host_placement, parallel_sizes
from training.threads import choose_intra_op_threads
from training.train_step import StepOutcome

# DeepSpeed's ZeRO-3 Offload tutorial JSON (its Megatron tutorial, "Training trillion-scale models with
# ZeRO-3 Offload"; tests/zero/test_offload_launch.py trains it against the run without offload).
ZERO3_OFFLOAD_TUTORIAL = {"zero_optimization": {
    "stage": 3, "cpu_offload": True, "cpu_offload_params": True, "overlap_comm": True,
    "contiguous_gradients": True, "stage3_max_live_parameters": 6000000, "stage3_max_reuse_distance": 100000000,
    "stage3_prefetch_bucket_size": 200000, "stage3_param_persistence_threshold": 100000,
    "reduce_bucket_size": 3000000, "sub_group_size": 1e6}}


def start_line(out: str) -> str:
    return next(line for line in out.splitlines() if line.startswith("> model: "))


def test_the_zero3_offload_json_run_says_at_start_what_is_on_the_host(tmp_path, corpus_cache_300):
    """Before: the start-up line was the plain ZeRO-3 line; only the memory line after iteration 1 hinted
    at the host."""
    ds = tmp_path / "zero3_offload.json"
    ds.write_text(json.dumps(ZERO3_OFFLOAD_TUTORIAL))
    outcome = run_main(pretrain_gpt.main, TINY + ["--train-iters", "1", "--data-cache-dir", corpus_cache_300,
                                                  "--metrics-file", tmp_path / "m.jsonl", "--zero-config", ds])
    assert outcome.code == 0, outcome.err
    line = start_line(outcome.out)
    assert "ZeRO stage 3, fp32 (fp32 gradients)" in line
    assert "parallel sizes TP 1, SP off, PP 1, DP 1" in line
    assert ("offloaded to host memory: optimizer states: fp32 master partition, Adam moments, gradient partition, "
            "AdamW step (--offload-optimizer); fp32 parameter shards (--offload-param)") in line


def test_a_run_without_offload_says_everything_is_on_the_device(tmp_path, corpus_cache_300):
    outcome = run_main(pretrain_gpt.main, TINY + ["--train-iters", "1", "--data-cache-dir", corpus_cache_300,
                                                  "--metrics-file", tmp_path / "m.jsonl"])
    assert outcome.code == 0, outcome.err
    assert start_line(outcome.out).endswith("ZeRO stage 0, fp32 (fp32 gradients); offload: none (everything on the "
                                            "device)")  # the tests keep OMP_NUM_THREADS=1: no thread words


def test_the_start_line_names_sequence_parallel_pipeline_and_optimizer_instances():
    """--sequence-parallel was invisible; the optimizer instances (parallel/state.py) are a placement too."""
    config = parse_config(["--sequence-parallel", "--tensor-model-parallel-size", "2"])
    state = virtual_state(16, tensor_parallel_size=2, pipeline_parallel_size=2, optimizer_instances=2)
    assert parallel_sizes(config.model, config.parallel, state) == (
        "parallel sizes TP 2, SP on, PP 2, DP 4; 2 distributed optimizer instances, each sharding the optimizer "
        "state over 2 DP ranks and replicated across the instances")
    # with experts on their own grid, their optimizer is cut into the same instances over the expert DP ranks
    moe = parse_config(["--num-experts", "4", "--expert-model-parallel-size", "2"])
    assert parallel_sizes(moe.model, moe.parallel, virtual_state(8, optimizer_instances=2, expert_model_parallel_size=2)).endswith(
        "; experts EP 2 x expert DP 4 (allgather dispatcher); 2 distributed optimizer instances, each sharding the "
        "optimizer state over 4 DP ranks and replicated across the instances, the experts' over 2 expert DP ranks")
    # Megatron-LM turns --sequence-parallel off at TP 1: said, not shown as on
    sequence_parallel = parse_config(["--sequence-parallel"])
    alone = parallel_sizes(sequence_parallel.model, sequence_parallel.parallel, virtual_state(2))
    assert alone.startswith("parallel sizes TP 1, SP off, PP 1, DP 2 (--sequence-parallel has nothing to split")


def _offload_sections(config):
    return config.zero, config.activations, config.training


def test_host_placement_names_each_offload():
    assert host_placement(*_offload_sections(parse_config([]))) == "offload: none (everything on the device)"
    optimizer_only = host_placement(*_offload_sections(parse_config(["--zero-stage", "2", "--offload-optimizer"])))
    assert optimizer_only.startswith("offloaded to host memory: optimizer states") and "--offload-param" not in optimizer_only
    both = host_placement(*_offload_sections(parse_config(["--zero-stage", "3", "--offload-optimizer", "--offload-param", "--bf16"])))
    assert both.endswith("(--offload-optimizer); bf16 parameter shards (--offload-param)")
    checkpoints = host_placement(*_offload_sections(parse_config(["--checkpoint-activations", "--cpu-checkpointing"])))
    assert checkpoints == "offloaded to host memory: activation checkpoints (--cpu-checkpointing)"


def test_the_memory_line_splits_the_prediction_into_device_and_host():
    """A CPU process holds both, so its RSS is compared with their sum; the line now says the parts."""
    check = MemoryCheck(100 * 2**20, torch.device("cpu"), predicted_host_bytes=40 * 2**20)
    line = check.line(1)
    assert "predicted peak 140.0 MiB (zero.plan: device 100.0 MiB + host 40.0 MiB" in line
    plain = MemoryCheck(100 * 2**20, torch.device("cpu")).line(1)
    assert "predicted peak 100.0 MiB (zero.plan)," in plain


def test_an_fp16_run_whose_every_step_was_skipped_ends_with_a_warning(tmp_path, corpus_cache_300):
    """Before: 10 of 10 steps skipped ended like a success, the last words the metrics file's path. A
    static loss scale of 1e30 overflows fp16 gradients at every step (the exit stays 0: see step_lines)."""
    outcome = run_main(pretrain_gpt.main, TINY + ["--train-iters", "3", "--fp16", "--loss-scale", "1e30",
                                                  "--data-cache-dir", corpus_cache_300,
                                                  "--metrics-file", tmp_path / "m.jsonl"])
    assert outcome.code == 0, outcome.err
    lines = outcome.out.splitlines()
    counted = lines.index("> trained 3 iterations (iterations 1-3): 0 optimizer steps taken, 3 skipped for fp16 "
                          "gradient overflow")
    assert lines[counted + 1].startswith("> warning: every step of this run (3 of 3) was skipped for gradient "
                                         "overflow (loss scale now 1e+30)")


def test_the_step_count_of_a_run_that_took_its_steps_has_no_warning():
    summary = TrainingSummary(iterations=4)  # resumed after iteration 4
    for iteration, skipped in ((5, True), (6, False), (7, False)):
        summary.add(iteration, StepOutcome(loss=1.0, grad_norm=1.0, skipped=skipped, loss_scale=2.0,
                                           global_batch_size=2, lr=1e-3, seconds=0.1))
    assert summary.step_lines() == ["> trained 3 iterations (iterations 5-7): 2 optimizer steps taken, 1 skipped "
                                    "for fp16 gradient overflow"]
    assert TrainingSummary().step_lines() == []
    clean = TrainingSummary()
    clean.add(1, StepOutcome(loss=1.0, grad_norm=1.0, skipped=False, loss_scale=1.0, global_batch_size=2, lr=1e-3,
                             seconds=0.1))
    assert clean.step_lines() == ["> trained 1 iteration (iteration 1): 1 optimizer step taken, none skipped"]


def test_the_thread_rule():
    """The cores not busy, shared by the node's processes, never above torch's default; OMP_NUM_THREADS
    wins (torchrun sets it to 1 when it starts several processes a node: torch/distributed/run.py).
    The loaded case is issue 49's: torch's 2 threads on a 2-core machine at load 4-7 ran 2-5x slower
    than one (docs/cpu-benchmark-threads-tiny.json)."""
    loaded = choose_intra_op_threads(torch_default=2, cores=2, processes_on_node=None, omp_num_threads=None,
                                     load_average=5.73)
    assert (loaded.threads, loaded.differs) == (1, True)
    assert loaded.words() == ("1 torch thread (torch's default 2: load average 5.73 on 2 cores keeps every core "
                              "busy; OMP_NUM_THREADS overrides)")
    quiet = choose_intra_op_threads(2, 2, None, None, load_average=0.2)
    assert (quiet.threads, quiet.differs) == (2, False)
    two_ranks = choose_intra_op_threads(2, 2, processes_on_node=2, omp_num_threads=None, load_average=0.0)
    assert two_ranks.threads == 1 and "shared by 2 processes" in two_ranks.reason
    assert choose_intra_op_threads(2, 2, 2, None, load_average=9.0).threads == 1  # never below one
    kept = choose_intra_op_threads(4, 2, processes_on_node=2, omp_num_threads="4", load_average=9.0)
    assert (kept.threads, kept.differs) == (4, False) and kept.reason == "OMP_NUM_THREADS=4 kept"
    # a 64-core node: 8 processes on an idle node get 8 each; with 16 cores busy, 6 each
    assert choose_intra_op_threads(64, 64, 8, None, load_average=0.4).threads == 8
    assert choose_intra_op_threads(64, 64, 8, None, load_average=16.2).threads == 6
    assert choose_intra_op_threads(16, 64, 1, None, load_average=3.0).threads == 16  # never above torch's


def test_a_run_says_its_thread_count_where_it_is_not_torchs(tmp_path, corpus_cache_300, monkeypatch):
    """Without OMP_NUM_THREADS, on a machine whose load leaves one core free, a 2-thread torch default
    becomes one thread, said in the start-up line."""
    import training.threads as threads

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(threads, "TORCH_DEFAULT_THREADS", 2)
    monkeypatch.setattr(threads, "available_cores", lambda: 2)
    monkeypatch.setattr(threads, "load_average", lambda: 1.3)
    before = torch.get_num_threads()
    try:
        outcome = run_main(pretrain_gpt.main, TINY + ["--train-iters", "1", "--data-cache-dir", corpus_cache_300,
                                                      "--metrics-file", tmp_path / "m.jsonl"])
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)
    assert outcome.code == 0, outcome.err
    assert start_line(outcome.out).endswith("; 1 torch thread (torch's default 2: load average 1.30 on 2 cores "
                                            "leaves 1 free; OMP_NUM_THREADS overrides)")
