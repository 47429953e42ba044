"""--optimizer ademamix's three states in checkpoints (issue 54): saved beside the master like Adam's two and
resumed exactly; moments resume only into the optimizer that made them.

swiss-ai/Megatron-LM (main) megatron/core/optimizer/distrib_optimizer.py: the distributed optimizer's
checkpoint keys for AdEMAMix are ("param", "exp_avg_slow", "exp_avg_fast", "exp_avg_sq"), Adam's
("param", "exp_avg", "exp_avg_sq"): the slow momentum is saved and loaded with the others."""

import pytest
from safetensors import safe_open

from tests.reliability_helpers import TINY, straight_and_resumed, train

ADEMAMIX = ["--optimizer", "ademamix", "--ademamix-alpha", "8", "--ademamix-beta3", "0.9999",
            "--ademamix-alpha-warmup", "3", "--ademamix-beta3-warmup", "4"]


@pytest.mark.parametrize("stage", ["0", "2"])
def test_an_ademamix_run_saved_and_resumed_continues_exactly(corpus_cache_300, tmp_path, stage):
    """Saved at iteration 2 of 5 (both warmups still running), resumed: every loss and gradient norm equals the
    straight run's; the optimizer file holds the slow momentum."""
    argv = TINY + ADEMAMIX + ["--train-iters", "5", "--data-cache-dir", corpus_cache_300, "--zero-stage", stage]
    straight, split, save = straight_and_resumed(argv, tmp_path, exit_interval=2)
    assert len(straight) == 5
    assert [(r["iteration"], r["loss"], r["grad_norm"]) for r in straight] == \
           [(r["iteration"], r["loss"], r["grad_norm"]) for r in split]
    [optimizer_file] = (save / "iter_0000002").glob("optim_*.safetensors")
    with safe_open(str(optimizer_file), "pt") as reader:
        keys = set(reader.keys())
        assert keys == {"master", "exp_avg", "exp_avg_sq", "exp_avg_slow"}
        assert reader.get_tensor("exp_avg_slow").abs().sum() > 0


def test_moments_resume_only_into_the_optimizer_that_made_them(corpus_cache_300, tmp_path):
    """An AdEMAMix checkpoint resumed with --optimizer adam (its third state would be dropped, the two others read
    as Adam's) is refused in one line naming both and --no-load-optim; with --no-load-optim the weights load."""
    save = tmp_path / "ckpt"
    assert train(corpus_cache_300, tmp_path, *ADEMAMIX, "--save", save).code == 0
    refused = train(corpus_cache_300, tmp_path, "--train-iters", "3", "--override-opt_param-scheduler", "--load", save,
                    "--save", tmp_path / "other")
    line = refused.one_error_line("--optimizer ademamix's states", "--optimizer adam", "--no-load-optim")
    assert "\n" not in line
    fresh = train(corpus_cache_300, tmp_path, "--train-iters", "3", "--override-opt_param-scheduler", "--load", save,
                  "--no-load-optim",
                  "--save", tmp_path / "other")
    assert fresh.code == 0, fresh.err[-2000:]


def launch_rank(rank, world_size, argvs, ports):
    import os

    import pretrain_gpt

    for argv, port in zip(argvs, ports):
        os.environ["MASTER_PORT"] = str(port)
        assert pretrain_gpt.main(argv) == 0


@pytest.mark.slow
def test_saved_at_zero_3_on_two_ranks_resumes_on_one_rank_at_zero_0(corpus_cache_300, tmp_path):
    """The three states are cut over two ranks at ZeRO 3 and saved by fragment: one rank at ZeRO 0 refills its
    whole partition from both files, and its iterations 3-4 are the two-rank straight run's (fp32, the same
    global batch: 2 ranks x 2, or 1 rank x 2 micro-batches of 2)."""
    from tests.distributed import free_port, run_distributed
    from tests.reliability_helpers import metrics_records

    common = TINY + ADEMAMIX + ["--global-batch-size", "4", "--train-iters", "4", "--lr", "0.01", "--min-lr", "0.01",
                                "--lr-warmup-iters", "0", "--data-cache-dir", corpus_cache_300]
    save = tmp_path / "ckpt"
    straight = common + ["--zero-stage", "3", "--metrics-file", str(tmp_path / "straight.jsonl")]
    first = common + ["--zero-stage", "3", "--metrics-file", str(tmp_path / "first.jsonl"), "--save", str(save),
                      "--exit-interval", "2"]
    run_distributed(launch_rank, 2, [straight, first], [free_port(), free_port()], timeout=600)
    import pretrain_gpt

    assert pretrain_gpt.main(common + ["--zero-stage", "0", "--metrics-file", str(tmp_path / "resumed.jsonl"),
                                       "--load", str(save), "--save", str(save)]) == 0

    def losses(name):
        return {r["iteration"]: r["loss"] for r in metrics_records(tmp_path / name) if "loss" in r and "split" not in r}

    reference, resumed = losses("straight.jsonl"), losses("resumed.jsonl")
    assert sorted(resumed) == [3, 4]
    assert [resumed[i] for i in (3, 4)] == pytest.approx([reference[i] for i in (3, 4)], rel=1e-5, abs=0)


def test_the_live_memory_record_predicts_the_three_states(corpus_cache_300, tmp_path):
    """training/memory_report.py's record of a live AdEMAMix run: the predicted optimizer-state bytes are 12 per
    element (zero/memory.py with the run's --optimizer), the measured ones the same up to alignment padding."""
    from tests.reliability_helpers import metrics_records

    assert train(corpus_cache_300, tmp_path, *ADEMAMIX, "--zero-stage", "1", "--report-memory").code == 0
    (memory,) = [r["memory"] for r in metrics_records(tmp_path / "metrics.jsonl") if "memory" in r]
    for record in memory:
        elements = record["num_parameters"]
        assert record["predicted_optimizer_states_bytes"] == 12 * elements
        padding = record["padding_elements"]
        assert record["measured_optimizer_states_bytes"] == 12 * (elements + padding)
        assert record["measured_master_weights_bytes"] * 3 == record["measured_optimizer_states_bytes"]


@pytest.mark.slow
@pytest.mark.parametrize("stage", ["0", "1"])
def test_an_expert_parallel_ademamix_run_saves_the_slow_momentum_and_resumes_exactly(corpus_cache_300, tmp_path,
                                                                                     stage):
    """EP 2 on 2 ranks: each rank's optimizer file holds its dense part and its experts' (at stage 0 only the span
    its rank owns, checkpoint/ours/sharded.py _owned_partition), the slow momentum among them; resumed, the losses and
    gradient norms are the straight run's bitwise. (Merged beside expert-parallel checkpoints, the owned span was
    first cut from Adam's three tensors only, and the slow momentum was not written.)"""
    from tests.checkpoint.test_expert_parallel_checkpoint import MOE
    from tests.distributed import free_port, run_distributed
    from tests.reliability_helpers import metrics_records

    common = TINY + MOE + ADEMAMIX + ["--train-iters", "4", "--global-batch-size", "4", "--zero-stage", stage,
                                      "--expert-model-parallel-size", "2", "--data-cache-dir", corpus_cache_300]
    save = tmp_path / "ckpt"
    argvs = [common + ["--metrics-file", str(tmp_path / "straight.jsonl")],
             common + ["--metrics-file", str(tmp_path / "split.jsonl"), "--save", str(save), "--exit-interval", "2"],
             common + ["--metrics-file", str(tmp_path / "split.jsonl"), "--load", str(save)]]
    run_distributed(launch_rank, 2, argvs, [free_port() for _ in argvs], timeout=600)

    def records(name):
        return [(r["iteration"], r["loss"], r["grad_norm"]) for r in metrics_records(tmp_path / name)
                if "loss" in r and "split" not in r]
    assert len(records("straight.jsonl")) == 4 and records("split.jsonl") == records("straight.jsonl")
    files = sorted((save / "iter_0000002").glob("optim_*.safetensors"))
    assert files
    for optimizer_file in files:
        with safe_open(str(optimizer_file), "pt") as reader:
            assert set(reader.keys()) == {"master", "exp_avg", "exp_avg_sq", "exp_avg_slow"}, optimizer_file.name
