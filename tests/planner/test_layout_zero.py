"""ZeRO stages 2 and 3 as choices of `python -m zero.plan search` (planner/layout_zero.py): found where only they
fit, with the memory the meta-device dry run plans for them; priced with the communication the ZeRO paper gives
(Rajbhandari et al. 2020, section 7.2: stages 1-2 move 2 Psi per step, stage 3 3 Psi) as this project runs them
(every micro-batch at stages 2-3); and no layout listed twice where data parallelism is 1."""

import dataclasses
import shlex

import pytest

from arguments.parser import parse_config
from planner.layout_perf import Layout, load_layout_constants, model_counts, predict_layout
from planner.layout_search import search
from planner.perf_model import load_hardware
from planner.search_check import check_picks
from planner.search_cli import search_command

# Six layers, four heads on 14 GPUs: TP divides 14 and the heads (1 or 2) and PP divides 14 / TP up to the six
# layers (1 or 2), so the distributed optimizer holds at least 1/4 of the 16-bit weights and fp32 gradients,
# where ZeRO-3 holds 1/14 of everything plus its gathered chunks and buckets.
ONLY_ZERO3_FLAGS = ["--num-layers", "6", "--hidden-size", "1024", "--num-attention-heads", "4", "--seq-length", "64",
                    "--max-position-embeddings", "64", "--vocab-size", "4096", "--global-batch-size", "56", "--bf16"]
# The search's count runs under the dry run (it only prunes; the dry run of the picks decides: planner/search_check.py),
# and within 10% of it here.
DRY_RUN_BAND = (0.90, 1.0)


def test_a_model_too_big_for_the_distributed_optimizer_is_found_with_zero3_at_the_dry_runs_memory():
    hardware = dataclasses.replace(load_hardware("h100-sxm"), gpu_memory_bytes=260 * 2**20)
    counts, candidates = search(parse_config(ONLY_ZERO3_FLAGS), 14, hardware, 4096)
    fitting = [c for c in candidates if c.fits]
    assert fitting and {c.layout.stage for c in fitting} == {3}
    assert min(c.memory_bytes for c in candidates if c.layout.stage == 1) > 1.1 * hardware.gpu_memory_bytes
    best = fitting[0]
    assert best.layout.pp == 1 and "--zero-stage 3" in best.flags() and best.to_json()["zero_stage"] == 3
    check_picks(fitting, ONLY_ZERO3_FLAGS, hardware, 1, 1)  # parses the printed flags: they run this layout
    ratio = best.memory_bytes / best.dry_run_bytes
    assert DRY_RUN_BAND[0] <= ratio <= DRY_RUN_BAND[1], ratio
    assert best.fits


@pytest.fixture(scope="module")
def gpt2():
    return model_counts(parse_config(["--config", "gpt2-350m", "--seq-length", "1024"]).model)


def test_on_ranks_sharing_cores_stage3_moves_three_psi_per_micro_batch_and_stage1_two(gpt2):
    # Nothing overlaps where ranks share cores (layout_perf.ranks_share_cores), so the dp term is every byte over
    # the link: a CPU profile moves fp32 values and gradients, the ZeRO paper's equal-width accounting.
    hardware = load_hardware("cpu-2core-4proc")
    constants = load_layout_constants(hardware.layout_calibration)
    base = Layout(gpus=4, micro_batch_size=1, global_batch_size=8)  # DP 4, 2 micro-batches
    dp = {stage: predict_layout(gpt2, dataclasses.replace(base, zero_stage=stage if stage >= 2 else None),
                                hardware, constants).terms["dp"] for stage in (1, 2, 3)}
    psi_s = 3 / 4 * (gpt2.dense_parameters * 4) / hardware.intra_node_bandwidth  # (N-1)/N Psi fp32 over the link
    m = base.micro_batches
    assert dp[1] == pytest.approx(2 * psi_s)            # one reduce-scatter, one all-gather per step
    assert dp[2] == pytest.approx((m + 1) * psi_s)      # a reduce-scatter every micro-batch, one all-gather
    assert dp[3] == pytest.approx(3 * m * psi_s)        # two gathers and a reduce-scatter every micro-batch


def test_zero3_is_predicted_slower_than_zero1_by_its_exposed_gathers(gpt2):
    hardware = load_hardware("h100-sxm")
    constants = load_layout_constants(hardware.layout_calibration)
    one = Layout(gpus=8, micro_batch_size=1, global_batch_size=32)
    three = dataclasses.replace(one, zero_stage=3)
    p1, p3 = (predict_layout(gpt2, layout, hardware, constants) for layout in (one, three))
    assert p1.terms["dp"] == 0.0  # ZeRO-1's reduce-scatter and all-gather hide behind the compute here
    assert {k: v for k, v in p3.terms.items() if k != "dp"} == {k: v for k, v in p1.terms.items() if k != "dp"}
    # at least the gathers that open each pass: the root chunk (tied embedding) forward and backward, the first
    # block in forward, every micro-batch, at 7/8 of them over NVLink
    opening = 2 * gpt2.root_parameters + gpt2.block_dense_parameters
    exposed = one.micro_batches * 7 / 8 * opening * 2 / hardware.intra_node_bandwidth
    assert p3.terms["dp"] >= exposed * (1 - 1e-9)
    assert p3.step_s - p1.step_s == pytest.approx(p3.terms["dp"])
    # and the search ranks them so: the same shape's ZeRO-3 after its ZeRO-1, by its dp term (against the best layout
    # overall, a larger micro-batch, both lose most to the host's per-micro-batch time: planner/layout_perf.py `host`)
    _, candidates = search(parse_config(["--config", "gpt2-350m", "--global-batch-size", "32"]), 8, hardware)
    same = [c for c in candidates if c.fits and (c.layout.tp, c.layout.pp, c.layout.cp, c.layout.micro_batch_size,
                                                  c.layout.recompute_fraction) == (1, 1, 1, 1, 0.0)]
    stages = [c.layout.stage for c in same]
    zero1, zero3 = same[stages.index(1)], same[stages.index(3)]
    assert stages.index(1) < stages.index(3)
    assert zero3.prediction.step_s - zero1.prediction.step_s == pytest.approx(
        zero3.prediction.terms["dp"] - zero1.prediction.terms["dp"])


def test_no_layout_is_listed_twice_at_data_parallel_size_one(capsys):
    assert search_command(["--config", "gpt2-350m", "--gpus", "1", "--hardware", "h100-sxm", "--global-batch-size",
                           "32", "--seq-length", "1024", "--bf16", "--json", "--no-dry-run-check"]) == 0
    import json

    layouts = json.loads(capsys.readouterr().out)
    shapes = [(x["micro_batch_size"], x["recompute"]) for x in layouts]
    assert len(shapes) == len(set(shapes)) == 8 and {x["zero"] for x in layouts} == {"none"}
    _, candidates = search(parse_config(["--config", "llama-tiny", "--global-batch-size", "16"]), 4,
                           load_hardware("h100-sxm"))
    single = [c.layout for c in candidates if c.layout.dp * c.layout.cp == 1]
    keys = [dataclasses.replace(layout, distributed_optimizer=False, zero_stage=None) for layout in single]
    assert single and len(keys) == len(set(keys)) and {layout.stage for layout in single} == {0}
    stages = {c.layout.stage for c in candidates if c.layout.dp * c.layout.cp > 1}
    assert stages == {0, 1, 2, 3}
    assert all(c.layout.pp == 1 for c in candidates if c.layout.stage == 3)  # refused with PP here


def test_the_zero2_flag_line_runs_stage_2_with_pipeline_stages():
    _, candidates = search(parse_config(["--config", "llama-tiny", "--global-batch-size", "16"]), 4,
                           load_hardware("h100-sxm"))
    pick = next(c for c in candidates if c.fits and c.layout.stage == 2 and c.layout.pp == 2)
    config = parse_config(["--config", "llama-tiny", *shlex.split(pick.flags())])
    assert config.zero.stage == 2 and config.zero.overlap_param_gather
    assert config.parallel.pipeline_model_parallel_size == 2
