"""`--ckpt-format torch_dist`: our save in Megatron-LM's layout (issues 62 and 78), continued here and by Megatron-LM.

Runs of the fixtures' Megatron-LM flags (tests/fixtures/megatron_*/megatron_losses.json) save at iteration 2 in
Megatron's layout and stop (--exit-interval 2), and the same runs go on uninterrupted to iteration 4: GPT-2's block
at TP 1 with the plain optimizer, SwiGLU with GQA at TP 2, and the Llama-shaped model under the distributed
optimizer on two data-parallel ranks, whose ZeRO partitions cut the tensors into boxes (fully_reshardable); GPT-2's
block in bf16, whose plain optimizer Megatron-LM keeps one level down (before, its load failed, KeyError
'pre_wd_mult'), and under the distributed optimizer at DP 2; the same two in fp16, the loss scaler as Megatron-Core's
grad scaler (a window of 3: the scale doubles at iteration 3 only from the tracker saved at 2); and at EP 2 (issue
92) Megatron's default MoE (biases on: the routers' and every expert's fc1 and fc2; 4 experts, top 2), plain and
under the distributed optimizer, the Mixtral-shaped one (SwiGLU experts without biases: one param group), with a
shared expert, with DeepSeek-V3's aux-loss-free balancing (sigmoid scores, each router's expert bias buffer), and a
dense first layer before an MoE layer with a gated shared expert (each layer under its own key); multi-latent
attention with a low-rank query and both latent norms (also at TP 2, under the distributed optimizer at DP 2, and
with an MTP layer), and with linear_q_proj; one multi-token prediction layer (issue 92); DeepSeek-V3's shape
(megatron_deepseek_v3's launch: its MTP layer an MoE layer) and Megatron's default MoE with an MTP layer, at EP 2;
MoE under tensor parallelism (TP 2 x EP 2 with --sequence-parallel, its experts at expert TP 2 and 1) and over two
pipeline stages (PP 2 x EP 2), plain and under the distributed optimizer.

- Here (CI): each save resumes in pretrain_gpt.py on one rank (checkpoint/torch_dist/source.py reads it) and trains
  iterations 3 and 4 to the losses the same run logs uninterrupted: bitwise for the saves of one process (the same
  kernels in the same order), within 1e-6 for those of several (the TP 2 partial sums taken whole; the MoE ones at
  EP 1, each expert's tokens in one GEMM: bitwise on some CPUs, 9.8e-8 at iteration 4 on an AVX-512 Xeon, where its
  GEMM blocking rounds the two groupings apart); fp16's loss scales the same run's.
- With Megatron-LM (the benchmark venv and MEGATRON_LM_KIT naming megatron-lm-core_v0.16.1-min.tar.xz or its
  extracted tree; skipped otherwise): Megatron-LM's own pretrain_gpt.py (scripts/tools/megatron_checkpoint_fixtures.py
  continue) loads each save with the same flags and --load, no other flag, the TP 2 one and the Llama one at TP 2,
  the MoE ones at EP 2, and trains iterations 3 and 4: its losses are ours to 1e-6 relative (bf16 and fp16: 2e-5 at
  iteration 3, 2e-4 at 4; the MoE ones measured bitwise), its fp16 loss scales ours; the MoE ones at TP 2 and PP 2 at
  their layout, but Megatron's default MoE saved at TP 2, continued at TP 1 x EP 2 (MEGATRON_RANKS' note says why).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.checkpoint.test_megatron_checkpoint import FIXTURES, data_workdir, record
from tests.readme import ROOT as REPO_ROOT

SCRIPT = REPO_ROOT / "scripts" / "tools" / "megatron_checkpoint_fixtures.py"
# (the fixture whose flags the run takes, ranks of our save, extra flags of ours, our TP size, Megatron's TP size)
CASES = {"gpt2_tp1_plain": ("megatron_tp1", 1, [], 1, 1),
         "swiglu_gqa_tp2": ("megatron_tp2_swiglu_gqa", 2, [], 2, 2),
         "llama_dp2_distributed_optimizer": ("megatron_llama", 2, ["--use-distributed-optimizer"], 1, 2),
         "gpt2_tp1_bf16": ("megatron_bf16", 1, [], 1, 1),
         "gpt2_bf16_dp2_distributed_optimizer": ("megatron_bf16", 2, ["--use-distributed-optimizer"], 1, 1),
         "gpt2_tp1_fp16": ("megatron_fp16", 1, [], 1, 1),
         "gpt2_fp16_dp2_distributed_optimizer": ("megatron_fp16", 2, ["--use-distributed-optimizer"], 1, 1),
         "moe_biases_ep2": ("megatron_moe_ep2_biases", 2, [], 1, 1),
         "moe_biases_ep2_distributed_optimizer": ("megatron_moe_ep2_biases", 2, ["--use-distributed-optimizer"], 1, 1),
         "mixtral_ep2": ("megatron_moe_ep2", 2, [], 1, 1),
         "mixtral_shared_expert_ep2": ("megatron_moe_ep2_shared", 2, [], 1, 1),
         "mixtral_expert_bias_ep2": ("megatron_moe_ep2_expert_bias", 2, [], 1, 1),
         "dense_first_gated_shared_ep2": ("megatron_moe_ep2_dense_first_gated_shared", 2, [], 1, 1),
         "mla_q_lora": ("megatron_mla_q_lora", 1, [], 1, 1),
         "mla": ("megatron_mla", 1, [], 1, 1),
         "mtp": ("megatron_mtp", 1, [], 1, 1),
         "mla_q_lora_dp2_distributed_optimizer": ("megatron_mla_q_lora", 2, ["--use-distributed-optimizer"], 1, 1),
         # an MTP layer of multi-latent attention (its transformer layer by MLA's names)
         "mla_q_lora_mtp": ("megatron_mla_q_lora", 1, ["--mtp-num-layers", "1"], 1, 1),
         # heads split over TP 2 (the up projections and linear_proj; Megatron-Core's local spec splits the down
         # projections' rows too, a layout its torch_dist save makes global)
         "mla_q_lora_tp2": ("megatron_mla_q_lora", 2, [], 2, 2),
         # DeepSeek-V3's shape (issue 92): MLA, a dense first layer, grouped sigmoid routing with the expert bias and a
         # shared expert, and an MTP layer that is an MoE layer (its experts, router and expert bias its own keys)
         "deepseek_v3_ep2": ("megatron_deepseek_v3", 2, [], 1, 1),
         # Megatron's default MoE (biases on) with an MTP layer: its MoE MTP layer's pre-MLP norm under both names
         "moe_biases_mtp_ep2": ("megatron_moe_ep2_biases", 2, ["--mtp-num-layers", "1", "--position-embedding-type",
                                                               "rope"], 1, 1),
         # MoE under tensor parallelism (with --sequence-parallel, as Megatron-Core's MoE layer requires at TP > 1):
         # the Mixtral-shaped one at TP 2 x EP 2, its experts at the default expert TP (= TP 2: each expert's fc1
         # rows and fc2 columns split; TP 2 x DP 2, four ranks) and at expert TP 1 (two ranks), continued there
         "mixtral_tp2_ep2": ("megatron_moe_ep2", 4, ["--sequence-parallel"], 2, 2),
         "mixtral_tp2_etp1_ep2": ("megatron_moe_ep2", 2, ["--sequence-parallel", "--expert-tensor-parallel-size",
                                                          "1"], 2, 2),
         # expert TP above TP (MoE parallel folding: TP 1 x DP 2, the experts at expert TP 2 x EP 1): Megatron-LM
         # there within 1e-6, not bitwise (measured: iteration 3 ours, 4 4.869940757751465 against our
         # 4.869942665100098, 3.9e-7, its grad norms 4.8e-6 off; cause not found); the same save continued by it at
         # TP 1 x EP 1 on one rank gives ours bitwise
         "mixtral_etp2": ("megatron_moe_ep2", 2, ["--expert-tensor-parallel-size", "2",
                                                  "--expert-model-parallel-size", "1"], 1, 1),
         # and under the distributed optimizer (fully_reshardable; TP 2 x DP 2 x EP 2, expert TP 2)
         "mixtral_tp2_ep2_distributed_optimizer": ("megatron_moe_ep2", 4, ["--sequence-parallel",
                                                                           "--use-distributed-optimizer"], 2, 2),
         # Megatron's default MoE (the experts' biases) at TP 2 x EP 2, at expert TP 2 and 1: continued by Megatron-LM
         # at TP 1 x EP 2 (below: why not at its own layout)
         "moe_biases_tp2_ep2": ("megatron_moe_ep2_biases", 4, ["--sequence-parallel"], 2, 1),
         "moe_biases_tp2_etp1_ep2": ("megatron_moe_ep2_biases", 2,
                                     ["--sequence-parallel", "--expert-tensor-parallel-size", "1"], 2, 1),
         # MoE over two pipeline stages (a layer each) at EP 2: PP 2 x DP 2, four ranks, continued there
         "moe_biases_pp2_ep2": ("megatron_moe_ep2_biases", 4, ["--pipeline-model-parallel-size", "2"], 1, 1),
         "moe_biases_pp2_ep2_distributed_optimizer": ("megatron_moe_ep2_biases", 4, [
             "--pipeline-model-parallel-size", "2", "--use-distributed-optimizer"], 1, 1)}
# Megatron-LM's ranks where they are not its TP size: the MoE save continues at its EP 2 (at EP 1 Megatron-Core's
# SequentialMLP with biases fails its own forward on CPU: "Output 0 of _ReduceFromModelParallelRegion is a view and
# is being modified inplace"; and Megatron-LM reads an EP 2 save's two chained optimizers only at EP > 1)
# Megatron's default MoE saved at TP 2 continues in Megatron-LM at TP 1: at TP 2 it refuses the experts' biases at
# expert TP 2 (transformer_config.py: "Bias in Moe is only supported when ETP==1"), and at expert TP 1 its
# RowParallelLinear marks each expert's fc2 bias sequence_parallel, so finalize_model_grads sums that gradient over
# the TP group, whose two ranks hold other experts (expert 0's with expert 2's): measured, iteration 3 ours bitwise,
# iteration 4 4.849104881286621 against our 4.849052429199219 (1.1e-5), and ours bitwise with that sum left out of
# its run (a diagnostic patch, not kept)
MEGATRON_RANKS = {"moe_biases_ep2": 2, "moe_biases_ep2_distributed_optimizer": 2, "mixtral_ep2": 2,
                  "mixtral_shared_expert_ep2": 2, "mixtral_expert_bias_ep2": 2, "dense_first_gated_shared_ep2": 2,
                  "deepseek_v3_ep2": 2, "moe_biases_mtp_ep2": 2,
                  "mixtral_tp2_ep2": 4, "mixtral_tp2_ep2_distributed_optimizer": 4, "mixtral_etp2": 2,
                  "mixtral_tp2_etp1_ep2": 2,
                  "moe_biases_tp2_ep2": 2, "moe_biases_tp2_etp1_ep2": 2, "moe_biases_pp2_ep2": 4,
                  "moe_biases_pp2_ep2_distributed_optimizer": 4}
CONTINUED = (3, 4)
# written by the same lines as other cases here (fp16's grad scaler is the bf16 distributed optimizer's common.pt plus
# the plain fp16 case's scaler; the MoE's distributed optimizer the dense one's layout and the MoE's chained groups):
# run where Megatron-LM continues them, to keep the default suite's time
WITH_MEGATRON_LM_ONLY = ("gpt2_fp16_dp2_distributed_optimizer", "moe_biases_ep2_distributed_optimizer",
                         "mla_q_lora_dp2_distributed_optimizer", "mla_q_lora_mtp", "mla_q_lora_tp2", "deepseek_v3_ep2",
                         "moe_biases_mtp_ep2", "mixtral_tp2_ep2", "mixtral_tp2_ep2_distributed_optimizer", "mixtral_tp2_etp1_ep2",
                         "moe_biases_tp2_ep2", "moe_biases_tp2_etp1_ep2", "moe_biases_pp2_ep2",
                         "moe_biases_pp2_ep2_distributed_optimizer", "mixtral_etp2")


def _flags(case: str, tensor_parallel: int, one_rank: bool = False) -> list[str]:
    """The case's flags at `tensor_parallel`; `one_rank`: without the fixture's expert parallelism, the case's
    expert TP and pipeline stages too."""
    name, _, extra, _, _ = CASES[case]
    flags = list(record(name)["flags"])
    if "--expert-model-parallel-size" in extra:  # the case's EP in place of the fixture's
        at = flags.index("--expert-model-parallel-size")
        del flags[at:at + 2]
    flags += extra
    for layout_flag in ("--tensor-model-parallel-size",) + (("--expert-model-parallel-size",
                                                              "--expert-tensor-parallel-size",
                                                              "--pipeline-model-parallel-size") if one_rank else ()):
        if layout_flag in flags:
            at = flags.index(layout_flag)
            del flags[at:at + 2]
    return flags + ["--tensor-model-parallel-size", str(tensor_parallel)]


def save_ours(rank: int, world_size: int, argv: list[str], workdir: str) -> None:
    import os

    import pretrain_gpt

    os.chdir(workdir)  # the flags' --data-path, relative (data_workdir)
    assert pretrain_gpt.main(argv) == 0


def _losses(metrics: Path, field: str = "loss") -> dict[int, float]:
    from tests.reliability_helpers import metrics_records

    return {r["iteration"]: r.get(field) for r in metrics_records(metrics) if "loss" in r}


@pytest.fixture(scope="module", params=sorted(CASES))
def our_save(request, tmp_path_factory):
    """(case, the save folder, our iterations 3 and 4 uninterrupted, their loss scales (fp16; None else)): the save
    at iteration 2 and its own run's."""
    from tests.distributed import run_distributed

    case = request.param
    if case in WITH_MEGATRON_LM_ONLY and not os.environ.get("MEGATRON_LM_KIT"):
        pytest.skip("run with MEGATRON_LM_KIT (Megatron-LM continuing it)")
    _, ranks, _, our_tp, _ = CASES[case]
    work = tmp_path_factory.mktemp(case)
    common = _flags(case, our_tp) + ["--device", "cpu", "--log-interval", "1", "--data-cache-dir", str(work / "cache")]
    saved, workdir = work / "save", str(data_workdir(work))
    for argv in (common + ["--save", str(saved), "--exit-interval", "2", "--metrics-file", str(work / "a.jsonl")],
                 common + ["--metrics-file", str(work / "straight.jsonl")]):
        run_distributed(save_ours, ranks, argv, workdir, timeout=300)
    straight, scales = _losses(work / "straight.jsonl"), _losses(work / "straight.jsonl", "loss_scale")
    return case, saved, {i: straight[i] for i in CONTINUED}, {i: scales[i] for i in CONTINUED} \
        if "fp16" in case else None


@pytest.mark.slow
def test_our_torch_dist_save_is_megatrons_layout_and_resumes_here_to_the_uninterrupted_loss(our_save, tmp_path,
                                                                                          monkeypatch):
    import pretrain_gpt
    from checkpoint.torch_dist.common import is_megatron_checkpoint, load_common
    from tests.reliability_helpers import run_main

    case, saved, expected, scales = our_save
    monkeypatch.chdir(data_workdir(tmp_path))
    assert (saved / "latest_checkpointed_iteration.txt").read_text() == "2"
    iteration_dir = saved / "iter_0000002"
    assert is_megatron_checkpoint(iteration_dir) and (iteration_dir / ".metadata").is_file()
    assert sorted(p.name for p in iteration_dir.iterdir() if not p.name.endswith(".distcp")) == \
        [".metadata", "common.pt", "metadata.json"]
    common = load_common(iteration_dir)
    assert (common["iteration"], common["args"].consumed_train_samples, common["opt_param_scheduler"]["num_steps"]) \
        == (2, 8, 8)
    layout = common["content_metadata"].get("distrib_optim_sharding_type")
    assert layout == ("fully_reshardable" if "distributed" in case else None)
    copy = shutil.copytree(saved, tmp_path / "resume")
    metrics = tmp_path / "resumed.jsonl"
    outcome = run_main(pretrain_gpt.main, _flags(case, 1, one_rank=True) + [
        "--load", copy, "--device", "cpu", "--log-interval", "1", "--data-cache-dir", tmp_path / "cache",
        "--metrics-file", metrics])
    assert outcome.code == 0, outcome.err[-3000:]
    if scales:  # the scale doubles at iteration 3 only from the growth tracker saved at 2
        assert _losses(metrics, "loss_scale") == scales == {3: 131072.0, 4: 131072.0}
    if CASES[case][1] == 1:  # saved by one process: the same sums in the same order
        assert _losses(metrics) == expected
    else:  # the TP 2 partial sums, the data-parallel halves, each expert's tokens from two ranks taken whole
        assert _losses(metrics) == pytest.approx(expected, rel=1e-6, abs=0)


@pytest.mark.slow
def test_megatron_lm_continues_our_torch_dist_save_to_our_next_losses(our_save):
    pytest.importorskip("megatron.core", reason="megatron-core is a benchmark-only peer (requirements-bench.txt)")
    kit = os.environ.get("MEGATRON_LM_KIT")
    if not kit:
        pytest.skip("MEGATRON_LM_KIT names no Megatron-LM tree (megatron-lm-core_v0.16.1-min.tar.xz)")
    case, saved, expected, scales = our_save
    _, _, _, _, megatron_tp = CASES[case]
    completed = subprocess.run(
        [sys.executable, str(SCRIPT), "continue", "--megatron-lm", kit, "--load", str(saved), "--nproc",
         str(MEGATRON_RANKS.get(case, megatron_tp)), "--", *_flags(case, megatron_tp)],
        capture_output=True, text=True, timeout=600, cwd=REPO_ROOT)
    assert completed.returncode == 0, completed.stderr[-3000:]
    continued = json.loads(completed.stdout.strip().splitlines()[-1])
    megatron = {int(i): loss for i, loss in continued["losses"].items()}
    if scales:
        assert {int(i): scale for i, scale in continued["loss_scales"].items()} == scales
    if "bf16" in case or "fp16" in case:  # 16-bit roundings land in other places (its ops fused otherwise than
        # Megatron's torch path, the same kernels rounding in another order)
        assert megatron[3] == pytest.approx(expected[3], rel=2e-5, abs=0)  # measured 8.5e-6 bf16, 1.7e-6 fp16
        assert megatron[4] == pytest.approx(expected[4], rel=2e-4, abs=0)  # measured 1.5e-5 bf16, 7.9e-7 fp16
    else:
        assert megatron == pytest.approx(expected, rel=1e-6, abs=0)


def test_the_fixtures_flags_are_the_ones_the_driver_writes():
    """The fixtures come from the driver as committed: its flags for each (a changed driver regenerates them)."""
    sys.path.insert(0, str(REPO_ROOT / "scripts" / "tools"))
    try:
        import megatron_checkpoint_fixtures as driver
    finally:
        sys.path.remove(str(REPO_ROOT / "scripts" / "tools"))
    for name, (ranks, extra) in driver.FIXTURES.items():
        written = record(name)
        assert (written["world_size"], written["flags"]) == (ranks, driver.COMMON_FLAGS + extra), name
        assert (FIXTURES / name / "iter_0000002" / "common.pt").is_file()


def test_another_megatron_format_writes_ours_and_says_so_in_one_line():
    """Megatron-LM's functional tests launch with --ckpt-format torch (its legacy per-rank files): accepted, as the
    format changes no math, and --save writes this project's checkpoints, said at start-up."""
    from arguments.parser import parse_arguments

    flags = list(record("megatron_tp1")["flags"])
    at = flags.index("--ckpt-format")
    flags[at + 1] = "torch"
    parsed = parse_arguments(flags + ["--save", "ckpt"])
    assert parsed.config.checkpoint.ckpt_format == "torch"
    said = [note for note in parsed.notes if "--ckpt-format torch:" in note]
    assert said == ["> --ckpt-format torch: Megatron-LM's legacy per-rank files are not written here; --save writes "
                    "this project's checkpoints (--ckpt-format torch_dist writes Megatron-LM's distributed checkpoint)"]
    assert not [note for note in parse_arguments(flags).notes if "--ckpt-format" in note]  # nothing saved: unsaid


def test_torch_dist_beside_what_its_layout_does_not_hold_writes_ours_and_says_so():
    """Megatron-LM launches give --ckpt-format torch_dist beside settings whose state the layout here does not hold
    (--keep-last's pruning): accepted, and the save is this project's, said once. fp16 is written (its loss scaler
    as Megatron-Core's grad scaler), so it is not said."""
    from arguments.parser import parse_arguments

    flags = list(record("megatron_tp1")["flags"]) + ["--save", "ckpt"]
    assert parse_arguments(flags).config.megatron_format_unwritten() is None
    assert parse_arguments(flags + ["--fp16"]).config.megatron_format_unwritten() is None
    parsed = parse_arguments(flags + ["--keep-last", "2"])
    assert [n for n in parsed.notes if "--ckpt-format torch_dist:" in n] == [
        "> --ckpt-format torch_dist: --keep-last's pruning: not written in Megatron-LM's layout here; "
        "--save writes this project's checkpoints"]
    # Megatron-LM 0.19's flag: its per-head offsets are written as core_attention.softmax_offset (issue 114)
    assert parse_arguments(flags + ["--softmax-type", "learnable"]).config.megatron_format_unwritten() is None


def test_a_setting_megatron_lm_has_no_flag_for_keeps_the_save_ours():
    """Megatron-LM's loop would resume a torch_dist save without a setting it has no flag for (Gemma's soft-capping,
    OLMoE's clip_qkv, llm-jp's z-loss, swiss-ai's xIELU): such a run saves this project's format, said once, read
    from the harvested flags (arguments/megatron/beyond_megatron.py). Megatron-LM's own flags (--apply-layernorm-1p,
    --squared-relu) and what changes no math (--attention-backend, --no-fp8-guard) keep its layout."""
    from arguments.parser import parse_arguments

    flags = list(record("megatron_tp1")["flags"]) + ["--save", "ckpt"]
    for megatrons in (["--apply-layernorm-1p"], ["--squared-relu"], ["--attention-backend", "unfused"]):
        assert parse_arguments(flags + megatrons).config.megatron_format_unwritten() is None, megatrons
    for beyond, named in ((["--final-logit-softcapping", "30"], "--final-logit-softcapping"),
                          (["--clip-qkv", "8"], "--clip-qkv"), (["--use-z-loss"], "--z-loss-strength"),
                          (["--activation", "xielu"], "--activation xielu")):
        assert parse_arguments(flags + beyond).config.megatron_format_unwritten() == (
            f"> --ckpt-format torch_dist: {named} (Megatron-LM has no such flag): not written in Megatron-LM's "
            f"layout here; --save writes this project's checkpoints"), beyond


@pytest.mark.parametrize("name, extra, said", [
    ("megatron_moe_ep2_biases", [], None), ("megatron_moe_ep2_shared", [], None),
    ("megatron_moe_ep2_biases", ["--moe-shared-expert-intermediate-size", "32"],
     "the shared experts' biases (Megatron-Core builds none)"),
    ("megatron_moe_ep2_expert_bias", [], None), ("megatron_moe_ep2_dense_first_gated_shared", [], None),
    ("megatron_mla_q_lora", [], None), ("megatron_mla", [], None),
    ("megatron_mla", ["--qk-layernorm"],
     "multi-latent attention's query norm without --q-lora-rank (Megatron-Core builds none)"),
    ("megatron_mtp", [], None), ("megatron_moe_ep2_biases", ["--mtp-num-layers", "1"], None),
    ("megatron_deepseek_v3", [], None)])
def test_megatrons_moe_is_written_in_its_layout_and_what_it_does_not_hold_is_said(name, extra, said):
    """The MoE the writer holds (MoE layers of one expert count, dense ones between, SequentialMLP's layout, the
    router's weight, bias and expert bias, a shared expert and its gate) saves in Megatron-LM's layout; the shared
    expert's biases, which Megatron-Core does not build, are this project's format, said once (arguments/config.py
    _unwritten_experts). So is multi-latent attention's: written, but for the query norm without --q-lora-rank
    Megatron-Core 0.16.1 lacks; and multi-token prediction's, an MoE model's too (its MTP layer an MoE layer, as
    Megatron-Core builds it: the last decoder layer's kind)."""
    from arguments.parser import parse_arguments

    flags = list(record(name)["flags"]) + ["--save", "ckpt"] + extra
    unwritten = parse_arguments(flags).config.megatron_format_unwritten()
    assert unwritten == (said and f"> --ckpt-format torch_dist: {said}: not written in Megatron-LM's layout here; "
                                  f"--save writes this project's checkpoints")


def test_every_tensor_of_megatrons_moe_save_is_where_our_writer_puts_it():
    """The writer's placement (names.py megatron_placement) inverts the reader's on Megatron-LM's own MoE save with
    biases: each of our tensors read from a key is written back to that key, at its (layer, expert) and shape."""
    from torch.distributed.checkpoint import FileSystemReader

    from checkpoint.torch_dist.names import megatron_placement, our_placements

    index = FileSystemReader(str(FIXTURES / "megatron_moe_ep2_biases" / "iter_0000002")).read_metadata()
    written = 0
    for key, entry in index.state_dict_metadata.items():
        placements = None if key.startswith("optimizer.") or not hasattr(entry, "size") else \
            our_placements(key, tuple(entry.size), gated=False)
        for ours, placement in (placements or {}).items():
            assert megatron_placement(ours, placement.shape, 2, 4) == (placement, tuple(entry.size)), ours
            written += 1
    # the embeddings and the final norm; per layer: attention's and the norms' 8, the router's weight and bias; per
    # (layer, expert): fc1's and fc2's weight and bias
    assert written == 4 + 2 * (8 + 2) + 2 * 4 * 4


@pytest.mark.parametrize("name, linears", [("megatron_mla_q_lora", ("linear_q_down_proj", "linear_q_up_proj")),
                                           ("megatron_mla", ("linear_q_proj",)), ("megatron_mtp", ("linear_qkv",)),
                                           ("megatron_deepseek_v3", ("linear_q_down_proj", "linear_q_up_proj"))])
def test_every_tensor_of_megatrons_mla_and_mtp_saves_is_where_our_writer_puts_it_and_its_objects_too(name, linears):
    """Multi-latent attention (issue 92 item 1): each tensor of Megatron-LM's own save (the local spec's
    MLASelfAttention: the query's projections, linear_kv_down_proj, linear_kv_up_proj, the latent norms,
    linear_proj's weight and bias; the layer's norms under their own names, input_layernorm and pre_mlp_layernorm,
    where a plain attention layer's are saved under TransformerEngine's) is one of our model's, and the writer puts it
    back at its key, layer and shape; the _extra_state objects the writer plans are the ones Megatron-LM saved. So
    for a multi-token prediction layer's (its enorm, hnorm, eh_proj, transformer layer and final norm, unstacked under
    `mtp.layers.0.`), and for DeepSeek-V3's shape, whose MTP layer is an MoE layer (its experts, router and shared
    expert under `mtp.layers.0.transformer_layer.`, the dense first layer's and the MoE layer's each under its own
    key; the routers' expert bias buffers are not parameters: checkpoint/torch_dist/writer.py _expert_bias_chunks)."""
    from torch.distributed.checkpoint import FileSystemReader

    from arguments.parser import parse_config
    from checkpoint.torch_dist.names import megatron_placement, our_placements
    from checkpoint.torch_dist.writer import _experts_per_layer, _extra_states, _per_layer
    from gpt.model import GPTModel
    from parallel.state import ParallelState

    index = FileSystemReader(str(FIXTURES / name / "iter_0000002")).read_metadata()
    config = parse_config(record(name)["flags"])
    mla, gated = config.model.mla.multi_latent_attention, "--swiglu" in record(name)["flags"]
    model = GPTModel(config.model, ParallelState(device=torch.device("cpu")))
    ours = {n: tuple(p.shape) for n, p in model.named_parameters()}
    placed = {}
    for key, entry in index.state_dict_metadata.items():
        if key.startswith("optimizer.") or not hasattr(entry, "size") or key.endswith("mlp.router.expert_bias"):
            continue
        for our_name, placement in our_placements(key, tuple(entry.size), gated=gated, mla=mla).items():
            assert megatron_placement(our_name, placement.shape, 2, _experts_per_layer(config), _per_layer(config),
                                      mla=mla) == (placement, tuple(entry.size)), our_name
            placed[our_name] = placement.shape
    assert placed == ours
    assert {f"self_attention.{linear}.weight" for linear in linears} <= {  # stacked, or per layer (`<layer>.`)
        re.sub(r"^\d+\.", "", key[len("decoder.layers."):]) for key in index.state_dict_metadata}
    objects = {key for key in index.state_dict_metadata if "_extra_state" in key}
    state = ParallelState(device=torch.device("cpu"))
    assert set(_extra_states(model, config, state)) == objects
