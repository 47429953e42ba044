"""Issue 51 item 3: a Megatron-DeepSpeed PR-MoE launch (a per-layer --num-experts list, --mlp-type residual) trains,
at expert-parallel size 2 as at 1, and its checkpoint resumes at another expert-parallel size.

Megatron-DeepSpeed's examples_deepspeed/MoE/ds_pretrain_gpt_*_PR-MoE*.sh pass `--num-experts 32 ... 32 64 64
--mlp-type residual --moe-expert-parallel-size N`: every layer's experts split over the one expert-parallel group
(DeepSpeed's MoE: `num_local_experts = num_experts // ep_size`), the residual MLP and its coefficient dense."""

from __future__ import annotations

import json
import math

import pytest

from tests.distributed import free_port, run_distributed
from tests.reliability_helpers import TINY, run_main, train
from tests.training.test_moe_training import launch_rank

# 4 layers: MoE layers 2 and 4 (--expert-interval 2) with 2 and 4 experts; top-2 without the sampled second choice
PR_MOE = ["--num-layers", "4", "--num-experts", "2", "4", "--mlp-type", "residual", "--deepspeed",
          "--no-pipeline-parallel", "--topk", "2", "--disable-moe-top2-2nd-expert-sampling", "--moe-loss-coeff", "0.01",
          "--moe-min-capacity", "4", "--create-moe-param-group", "--seed", "5"]


def logged(path):
    return [(r["loss"], r["grad_norm"], r["moe_loss"]) for r in map(json.loads, path.read_text().splitlines())
            if "loss" in r and "split" not in r]


@pytest.mark.slow
@pytest.mark.parametrize("stage", ["1", "3"])
def test_a_pr_moe_model_trains_at_expert_parallel_2_as_at_1_and_resumes_at_1_from_a_save_at_2(
        corpus_cache_300, tmp_path, stage):
    """Each MoE layer's experts (2 in one, 4 in the other) split over the same 2 expert-parallel ranks: the losses,
    gradient norms and moe_loss equal EP 1's (1e-6 relative: the experts' gradients reduce over other ranks). Saved
    at EP 2 after iteration 2, resumed at EP 1, the run continues as EP 1's straight run (the experts are named by
    global index, each layer's own, so the reshard is by name)."""
    common = TINY + PR_MOE + ["--train-iters", "5", "--data-cache-dir", corpus_cache_300, "--global-batch-size", "4",
                              "--zero-stage", stage]
    ep2 = ["--moe-expert-parallel-size", "2"]
    launches = [([], "ep1"), (ep2, "ep2"),
                (ep2 + ["--save", str(tmp_path / "ckpt"), "--exit-interval", "2"], "ep2_ep1"),
                (["--load", str(tmp_path / "ckpt")], "ep2_ep1")]
    argv = [common + extra + ["--metrics-file", str(tmp_path / f"{name}.jsonl")] for extra, name in launches]
    run_distributed(launch_rank, 2, argv, [free_port() for _ in argv], timeout=900)
    runs = {name: logged(tmp_path / f"{name}.jsonl") for name in ("ep1", "ep2", "ep2_ep1")}
    expected = [value for record in runs["ep1"] for value in record]
    assert len(runs["ep1"]) == 5 and all(math.isfinite(value) for value in expected)
    for name in ("ep2", "ep2_ep1"):
        assert [value for record in runs[name] for value in record] == pytest.approx(expected, rel=1e-6, abs=0), name


def test_a_pr_moe_checkpoint_is_refused_by_the_hf_export_in_one_line(corpus_cache_300, tmp_path):
    """transformers' MoE configs (Mixtral, Qwen2-MoE) hold one number of experts for every layer and no residual
    MLP: the export names both, with the rest it lacks, in one line (exit 2). The run itself trains, logging the
    moe_loss of its two MoE layers (l_aux x --moe-loss-coeff summed over them), each layer's tokens per expert
    (--moe-per-layer-logging: 2 and 4 counts, 2 sequences of 16 tokens x top-2 each) and the layers' counts in the
    start-up line."""
    from scripts.tools import convert_to_hf

    save = tmp_path / "ckpt"
    trained = train(corpus_cache_300, tmp_path, *PR_MOE, "--train-iters", "2", "--save", str(save),
                    "--moe-per-layer-logging")
    assert trained.code == 0, trained.err[-2000:]
    assert "(2 MoE layers of 2/4 experts, top-2, residual (PR-MoE))" in trained.out
    records = [r for r in map(json.loads, (tmp_path / "metrics.jsonl").read_text().splitlines()) if "loss" in r]
    assert all(math.isfinite(r["loss"]) and 0.01 < r["moe_loss"] < 0.05 for r in records)
    for record in records:
        tokens = record["moe_per_layer"]["tokens_per_expert"]
        assert tokens[0] is None and tokens[2] is None and [len(tokens[1]), len(tokens[3])] == [2, 4]
        assert sum(tokens[1]) <= 2 * 16 * 2 and sum(tokens[3]) <= 2 * 16 * 2  # the capacity may drop some
    exported = run_main(convert_to_hf.main, [str(save), str(tmp_path / "hf")])
    assert exported.code == 2, exported.err[-2000:]
    assert "one --num-experts for every MoE layer" in exported.err and "--mlp-type standard" in exported.err
    assert len(exported.err.strip().splitlines()) == 1


def test_the_dry_run_plans_a_pr_moe_launch_with_each_layers_experts():
    """zero.plan's dry run builds the same per-layer model on the meta device: its parameters are those counted by
    hand (each MoE layer's experts, router rows, residual MLP and coefficient), at EP 2 each rank holding half of
    each layer's experts."""
    from arguments.parser import parse_config
    from planner.dry_run import Cluster, dry_run

    argv = ["--num-layers", "4", "--hidden-size", "32", "--num-attention-heads", "2", "--seq-length", "16",
            "--max-position-embeddings", "16", "--micro-batch-size", "2", "--global-batch-size", "4",
            "--num-experts", "2", "4", "--mlp-type", "residual", "--moe-gating", "deepspeed", "--topk", "2",
            "--zero-stage", "0"]
    plans = {ep: dry_run(parse_config(argv + ["--moe-expert-parallel-size", str(ep)]), Cluster(2, 2, None, "cpu"),
                         300, 0) for ep in (1, 2)}
    h = 32
    mlp = 2 * h * 4 * h + 4 * h + h  # GPT-2's MLP, each expert's and the residual one
    attention_and_norms = (h * 3 * h + 3 * h) + (h * h + h) + 2 * 2 * h

    def moe_block(experts):
        return attention_and_norms + experts * h + experts * mlp + mlp + (2 * h + 2)  # router, experts, residual, coef

    outside = 384 * h + 16 * h + 2 * h  # the vocabulary padded to 384 rows, positions, the final norm
    assert plans[1].parameters_total == outside + 2 * (attention_and_norms + mlp) + moe_block(2) + moe_block(4)
    assert plans[2].parameters_total == plans[1].parameters_total
    assert plans[1].parameters_local - plans[2].parameters_local == (1 + 2) * mlp  # half of 2, half of 4


def test_pretrain_gpt_dry_run_of_a_pr_moe_launch_plans_it(monkeypatch, capsys):
    """pretrain_gpt.py --dry-run as rank 0 of a 2-process launch at EP 2 (the planner's meta model: each layer's
    count, the residual MLP) plans the rank and exits 0, no traceback."""
    import pretrain_gpt

    for name, value in {"WORLD_SIZE": "2", "RANK": "0", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2"}.items():
        monkeypatch.setenv(name, value)
    argv = ["--num-layers", "4", "--hidden-size", "32", "--num-attention-heads", "2", "--seq-length", "16",
            "--max-position-embeddings", "16", "--micro-batch-size", "2", "--global-batch-size", "4",
            "--num-experts", "2", "4", "--mlp-type", "residual", "--deepspeed", "--no-pipeline-parallel", "--topk",
            "2", "--moe-expert-parallel-size", "2", "--device", "cpu", "--train-iters", "2", "--dry-run"]
    assert pretrain_gpt.main(argv) == 0
    captured = capsys.readouterr()
    assert "MoE routing assumed uniform" in captured.out and "Traceback" not in captured.out + captured.err
