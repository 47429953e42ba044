"""Megatron-LM's torch_dist checkpoints continued here (issues 62 and 78): `--load` of a Megatron-LM save folder.

The fixtures tests/fixtures/megatron_* were written by Megatron-LM's own pretrain_gpt.py (core_v0.16.1, on CPU over
gloo: scripts/tools/megatron_checkpoint_fixtures.py through scripts/bench/megatron_lm_cpu.py) over
tests/fixtures/megatron_data/varied_docs (200 documents of 8-60 tokens): one launch trains iterations 1-4 saving at
2 (megatron_losses.json `uninterrupted_losses`), and a second launch of Megatron-LM resumes the save at 2
(`resumed_losses`, equal). The twenty-three: TP 1 with the plain optimizer (GPT-2's block); TP 2 with SwiGLU and GQA; a
Llama-shaped model; the distributed optimizer's dp_reshardable layout at TP 2 x DP 2; its fully_reshardable layout
at DP 2; dp_reshardable over two pipeline stages (the tied embedding on both, loaded here on one); a Mixtral-shaped
MoE over 2 expert-parallel ranks (4 experts, top 2, SequentialMLP), also with a shared expert; Megatron's default
MoE, biases on (the router's and every expert's fc1 and fc2, issue 92); DeepSeek-V3's aux-loss-free balancing (sigmoid
scores, each router's expert bias buffer); a dense first layer before an MoE layer with a gated shared expert
(--moe-layer-freq [0,1]: each layer under its own key); dp_reshardable under PP 2 x VP 2 (a gradient buffer per virtual chunk);
bf16; fp16, its dynamic loss scale doubling at iteration 3 (--loss-scale-window 3) from the tracker saved at 2; both
under the distributed optimizer at DP 2, dp_reshardable (buckets keyed by the 16-bit dtypes); multi-latent attention
with a low-rank query and both latent norms, and with linear_q_proj; one multi-token prediction layer (issue 92);
MLA, a dense first layer, grouped sigmoid routing with the expert bias, a shared expert and an MTP layer at once,
DeepSeek-V3's shape at EP 2, its MTP layer an MoE layer (megatron_deepseek_v3); the
Mixtral-shaped MoE at TP 2 x EP 2 (expert TP 2, --sequence-parallel) and Megatron's default MoE at PP 2 x EP 2, four
ranks each (issue 92); the Mixtral-shaped MoE under the distributed optimizer's dp_reshardable layout at EP 2
(Megatron-Core's ChainedOptimizer: a dense and an expert optimizer's buckets, `chained_<i>.`), and at TP 2 x EP 2
read only by the quick tests (issue 114).

- The quick tests read the files: told from ours by content, our TP 1 model's names and shapes, the weights every
  layout holds read alike (a dp_reshardable bucket's fp32 master equals its model tensor, element by element), the
  progress, and the refusals (a truncated or linked-out file, a common.pt or DCP index that would run code).
- The slow tests are the proof: pretrain_gpt.py with the fixture's Megatron-LM flags and --load trains iterations 3
  and 4 to the losses Megatron-LM's uninterrupted run logged, within 1e-6 relative: weights, samples (Megatron-Core's
  order, data/megatron_order.py), Adam moments and step, schedule; the TP 2 checkpoints at TP 1 here, one also at TP 2,
  and the MoE one at TP 2 x EP 2 also at its layout."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import pickle
import shutil
from pathlib import Path

import pytest
import torch

from checkpoint.torch_dist.common import is_megatron_checkpoint
from checkpoint.torch_dist.names import our_placements
from checkpoint.torch_dist.source import OPTIMIZER_KEY, MegatronSource
from tests.readme import ROOT as REPO_ROOT

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
NAMES = ("megatron_tp1", "megatron_tp2_swiglu_gqa", "megatron_llama", "megatron_distopt_dp_reshardable",
         "megatron_distopt_fully_reshardable", "megatron_pp2_distopt_dp_reshardable", "megatron_moe_ep2",
         "megatron_moe_ep2_biases", "megatron_bf16", "megatron_pp2_vp2_distopt_dp_reshardable", "megatron_fp16",
         "megatron_bf16_distopt_dp_reshardable", "megatron_fp16_distopt_dp_reshardable", "megatron_moe_ep2_shared",
         "megatron_moe_ep2_expert_bias", "megatron_moe_ep2_dense_first_gated_shared", "megatron_mla_q_lora",
         "megatron_mla", "megatron_mtp", "megatron_deepseek_v3", "megatron_moe_tp2_ep2",
         "megatron_moe_pp2_ep2_biases", "megatron_moe_ep2_distopt_dp_reshardable")
CONTINUED = (3, 4)  # the iterations after the save at 2


def data_workdir(tmp_path: Path) -> Path:
    """A working directory holding a copy of the fixture data where the flags' relative --data-path names it
    (tests/fixtures/megatron_data): the data pipeline caches its token-range pass beside the index
    (data/token_range.py), and a test must not write into the repository."""
    root = tmp_path / "workdir"
    shutil.copytree(FIXTURES / "megatron_data", root / "tests" / "fixtures" / "megatron_data", dirs_exist_ok=True)
    return root


def record(name: str) -> dict:
    return json.loads((FIXTURES / name / "megatron_losses.json").read_text())


def iteration_dir(name: str) -> Path:
    return FIXTURES / name / "iter_0000002"


def our_flags(name: str, tensor_parallel: int = 1) -> list[str]:
    """The fixture's Megatron-LM flags at another TP size, on one pipeline stage and one expert-parallel rank."""
    flags = list(record(name)["flags"])
    for layout_flag in ("--tensor-model-parallel-size", "--pipeline-model-parallel-size",
                        "--num-layers-per-virtual-pipeline-stage", "--expert-model-parallel-size"):
        if layout_flag in flags:
            at = flags.index(layout_flag)
            del flags[at:at + 2]
    return flags + ["--tensor-model-parallel-size", str(tensor_parallel)]


def test_a_megatron_folder_is_told_from_ours_by_content():
    assert is_megatron_checkpoint(iteration_dir("megatron_tp1"))
    assert not is_megatron_checkpoint(FIXTURES / "checkpoint_84ae2c6" / "iter_0000002")


@pytest.mark.parametrize("name", NAMES)
def test_the_source_is_our_tp1_model_by_name_and_shape(name):
    from arguments.parser import parse_config
    from gpt.model import GPTModel
    from parallel.state import ParallelState

    config = parse_config(our_flags(name))
    model = GPTModel(config.model, ParallelState(device=torch.device("cpu")))
    ours = {n: tuple(p.shape) for n, p in model.named_parameters()}
    source = MegatronSource(iteration_dir(name))
    for key in source.keys():
        assert {n: info.shape for n, info in source.tensors(key).items()} == ours, key
    progress = source.progress()
    assert (progress.iteration, progress.consumed_samples, progress.schedule_samples, progress.optimizer_step) == \
        (2, 8, 8, 2)


def test_transformer_engines_fused_mla_norms_read_as_the_local_specs():
    """Megatron-Core's TransformerEngine spec fuses MLA's latent norms into the up projections after them
    (TELayerNormColumnParallelLinear): linear_q_up_proj.layer_norm_weight is q_layernorm's weight, as the local spec
    (the fixtures') saves it; the writer writes the local spec's names. Without `mla` linear_proj is the plain
    attention's."""
    from checkpoint.torch_dist.names import megatron_placement

    for theirs, ours in (("linear_q_up_proj.layer_norm_weight", "q_layernorm.weight"),
                         ("linear_kv_up_proj.layer_norm_bias", "kv_layernorm.bias")):
        placed = our_placements(f"decoder.layers.self_attention.{theirs}", (2, 8), False, mla=True)
        assert sorted(placed) == [f"blocks.{layer}.attention.{ours}" for layer in (0, 1)]
        assert megatron_placement(f"blocks.1.attention.{ours}", (8,), 2, mla=True)[0].key == \
            f"decoder.layers.self_attention.{ours}"
    assert list(our_placements("decoder.layers.self_attention.linear_proj.weight", (1, 4, 4), False)) == \
        ["blocks.0.attention.dense.weight"]
    assert list(our_placements("decoder.layers.self_attention.linear_proj.weight", (1, 4, 4), False, mla=True)) == \
        ["blocks.0.attention.linear_proj.weight"]


@pytest.mark.parametrize("name", ["megatron_distopt_dp_reshardable", "megatron_distopt_fully_reshardable",
                                  "megatron_pp2_distopt_dp_reshardable", "megatron_pp2_vp2_distopt_dp_reshardable",
                                  "megatron_bf16_distopt_dp_reshardable", "megatron_fp16_distopt_dp_reshardable",
                                  "megatron_moe_ep2_distopt_dp_reshardable",
                                  "megatron_moe_tp2_ep2_distopt_dp_reshardable"])
def test_the_distributed_optimizers_fp32_master_is_the_model_tensor_element_for_element(name):
    """An fp32 run's master weights are its weights, a 16-bit run's weights are its master rounded (Megatron-Core
    copies the master into the model by a cast): read through the optimizer's layout (the buckets of each TP rank,
    rebuilt here; or the per-parameter states), each of our tensors is the model tensor Megatron-Core saved under
    its own key, in every region a rank might ask."""
    from checkpoint.torch_dist.dcp_reader import DcpReader

    source = MegatronSource(iteration_dir(name))
    assert source.layout == name.rsplit("_", 2)[-2] + "_reshardable"
    reader = DcpReader(iteration_dir(name))
    model = {}
    for key, md in reader.tensors().items():
        if not OPTIMIZER_KEY.match(key):  # `optimizer.`, or a ChainedOptimizer's `chained_<i>.optimizer.`
            model.update(our_placements(key, tuple(md.size), "swiglu" in " ".join(record(name)["flags"])))
    assert sorted(model) == sorted(source.tensors("master"))
    for ours, placement in model.items():
        whole = tuple(slice(0, n) for n in placement.shape)
        expected = reader.read(placement.key, placement.region(whole)).reshape(placement.shape)
        assert torch.equal(source.read("master", ours, whole).to(expected.dtype), expected), ours
        middle = tuple(slice(n // 3, n - n // 3) if n > 2 else slice(0, n) for n in placement.shape)
        assert torch.equal(source.read("master", ours, middle).to(expected.dtype), expected[middle]), ours
        for moment in ("exp_avg", "exp_avg_sq"):
            values = source.read(moment, ours, whole)
            assert torch.isfinite(values).all() and values.abs().sum() > 0, (ours, moment)


def test_a_resume_reads_its_checkpoints_sample_order_and_a_fresh_start_its_formats():
    """The order is the lineage's (checkpoint/lineage.py): a Megatron-LM checkpoint's consumed samples count positions
    in Megatron-Core's order whatever --ckpt-format the continuing run names; a save of ours from before the key was
    read in this project's order; a fresh start and --finetune take the order --ckpt-format starts a run in."""
    from arguments.parser import parse_config
    from base.errors import CheckpointError
    from checkpoint.lineage import identity_on_start
    from checkpoint.torch_dist.common import load_common
    from checkpoint.torch_dist.resume import metadata_view
    from data.gpt_dataset import APPENDABLE_ORDER
    from data.megatron_order import MEGATRON_ORDER

    megatron = metadata_view(load_common(iteration_dir("megatron_tp1")), parse_config(our_flags("megatron_tp1")))
    assert identity_on_start(megatron, False, "r", "l", APPENDABLE_ORDER).sample_order == MEGATRON_ORDER
    assert identity_on_start(megatron, True, "r", "l", APPENDABLE_ORDER).sample_order == APPENDABLE_ORDER
    assert identity_on_start({"run_id": "a"}, False, "r", "l", MEGATRON_ORDER).sample_order == APPENDABLE_ORDER
    assert identity_on_start(None, False, "r", "l", MEGATRON_ORDER).sample_order == MEGATRON_ORDER
    with pytest.raises(CheckpointError, match="sample_order 'shuffled'"):
        identity_on_start({"sample_order": "shuffled"}, False, "r", "l")


# ---- refused in one line ---------------------------------------------------------------------------------

def _resume(tmp_path: Path, checkpoint: Path, name: str = "megatron_tp1"):
    import pretrain_gpt
    from tests.reliability_helpers import run_main

    return run_main(pretrain_gpt.main, our_flags(name) + ["--load", checkpoint, "--device", "cpu",
                                                          "--data-cache-dir", tmp_path / "cache",
                                                          "--metrics-file", tmp_path / "metrics.jsonl"])


@pytest.fixture
def megatron_copy(tmp_path, monkeypatch):
    monkeypatch.chdir(data_workdir(tmp_path))  # the flags' --data-path, relative
    return Path(shutil.copytree(FIXTURES / "megatron_tp1", tmp_path / "megatron"))


def test_a_truncated_chunk_file_is_refused_in_one_line(tmp_path, megatron_copy):
    victim = megatron_copy / "iter_0000002" / "__0_1.distcp"
    with open(victim, "r+b") as file:
        file.truncate(victim.stat().st_size // 2)
    outcome = _resume(tmp_path, megatron_copy)
    outcome.one_error_line(str(victim), "truncated")


def test_a_file_linked_out_of_the_checkpoint_is_refused_in_one_line(tmp_path, megatron_copy):
    victim = megatron_copy / "iter_0000002" / "__0_0.distcp"
    outside = tmp_path / "elsewhere.distcp"
    shutil.move(victim, outside)
    os.symlink(outside, victim)
    outcome = _resume(tmp_path, megatron_copy)
    outcome.one_error_line(str(victim), "points outside the checkpoint")


class _RunsCode:
    def __reduce__(self):
        return (os.system, ("touch ran-code-from-a-checkpoint",))


@pytest.mark.parametrize("victim", ["common.pt", ".metadata"])
def test_a_pickle_that_would_run_code_is_refused_and_not_run(tmp_path, megatron_copy, victim):
    path = megatron_copy / "iter_0000002" / victim
    if victim == "common.pt":
        torch.save({"iteration": 2, "args": argparse.Namespace(num_layers=2, exploit=_RunsCode())}, path)
    else:
        path.write_bytes(pickle.dumps(_RunsCode()))
    outcome = _resume(tmp_path, megatron_copy)
    outcome.one_error_line(str(path))
    assert "posix.system" in outcome.err or "system" in outcome.err
    assert not (REPO_ROOT / "ran-code-from-a-checkpoint").exists()


def test_interleavings_buckets_are_a_buffer_per_virtual_chunk_and_another_layout_is_refused_not_misread():
    """Issue 92 item 3: under PP 2 x VP 2 Megatron-Core's distributed optimizer keeps a gradient buffer per virtual
    chunk (gbuf_idx_<v>), each laid out as a stage of its own; before, the save was refused ("holds no exp_avg,
    exp_avg_sq", false). The sizes rebuilt per chunk are the ones it recorded; read as one buffer per stage (what
    this reader did before) they are not, and that is refused as a layout this reader does not know."""
    from checkpoint.torch_dist.buckets import Chunk, UnreadLayout, bucket_layout, check_layout, local_parameters

    name = "megatron_pp2_vp2_distopt_dp_reshardable"
    source = MegatronSource(iteration_dir(name))
    assert source.keys() == ("master", "exp_avg", "exp_avg_sq") and source.optimizer_not_read() is None
    shape = source._buckets.shape
    for pp_rank in (0, 1):
        saved = source._buckets._object(pp_rank, "per_bucket_numel_unpadded")
        assert len(saved) == 2  # a buffer per virtual chunk
        for vp_stage in (0, 1):
            _, unpadded = bucket_layout(local_parameters(shape, Chunk(0, 1, pp_rank, 2, vp_stage, 2)), 1, None)
            check_layout(unpadded, saved, vp_stage, 2, (torch.float32, torch.float32), name)
        with pytest.raises(UnreadLayout, match=r"2 gradient buffers, the layout rebuilt from its args 1"):
            _, unpadded = bucket_layout(local_parameters(shape, Chunk(0, 1, pp_rank, 2)), 1, None)
            check_layout(unpadded, saved, 0, 1, (torch.float32, torch.float32), name)


@pytest.mark.parametrize("field, value, flag", [("multi_latent_attention", True, "--multi-latent-attention"),
                                               ("mtp_num_layers", 1, "--mtp-num-layers")])
def test_dp_reshardable_buckets_of_mla_or_mtp_are_refused_with_the_flag_not_misread(field, value, flag):
    """The buckets rebuilt here are a plain attention layer's and the decoder's (checkpoint/torch_dist/buckets.py):
    a multi-latent attention or MTP model's dp_reshardable save is refused with its flag named (its weights load)."""
    import types

    from checkpoint.torch_dist.buckets import UnreadLayout
    from checkpoint.torch_dist.source import _refuse_unread

    _refuse_unread(types.SimpleNamespace(**{field: None if value == 1 else False}))
    with pytest.raises(UnreadLayout, match=f"saved with {flag}$"):
        _refuse_unread(types.SimpleNamespace(**{field: value}))


@pytest.mark.parametrize("field, value, said", [
    ("moe_shared_expert_intermediate_size", 32, "and it was saved with --moe-shared-expert-intermediate-size$"),
    ("expert_model_parallel_size", 1, r"\(the experts of expert TP rank 0, EP rank 0, PP rank 0\): the distributed "
                                      r"optimizer's buckets hold \[6144\] elements, the layout rebuilt from its args "
                                      r"\[12288\]")])
def test_moe_buckets_not_rebuilt_here_are_refused_with_their_reason_and_the_weights_still_read(monkeypatch, field,
                                                                                                value, said):
    """An MoE save whose ChainedOptimizer buckets are not rebuilt here (a shared expert's; or sizes other than the
    args give, here as if saved at EP 1) names that reason; its `chained_<i>.` keys are the optimizer's, so the
    weights still read (--no-load-optim)."""
    import re

    from checkpoint.torch_dist import source as source_module

    name = "megatron_moe_ep2_distopt_dp_reshardable"
    real = source_module.saved_args

    def changed(common):
        args = real(common)
        setattr(args, field, value)
        return args

    monkeypatch.setattr(source_module, "saved_args", changed)
    source = MegatronSource(iteration_dir(name))
    assert re.search(said, source.optimizer_not_read()) and source.keys() == ("master",)
    weight = "blocks.1.mlp.experts.3.dense_4h_to_h.weight"
    placement = source._placements[weight][0]
    whole = tuple(slice(0, n) for n in placement.shape)
    assert torch.equal(source.read("master", weight, whole),
                       source.reader.read(placement.key, placement.region(whole)).reshape(placement.shape))


def test_a_layout_the_reader_does_not_rebuild_is_refused_at_the_resume_with_the_ways_on():
    """Where the rebuilt buckets are not the recorded ones (UnreadLayout) the optimizer's states are not read: the
    resume names that reason, --no-load-optim and Megatron-LM's --dist-ckpt-optim-fully-reshardable in one line."""
    from checkpoint.global_load import _optimizer_problem

    class Unread:  # a source whose optimizer states were not read, for the reason it gives
        path, format_name = Path("megatron_ckpt/iter_0000002"), "Megatron-LM torch_dist"

        def optimizer_not_read(self):
            return "the distributed optimizer's buckets hold [3840] elements, the layout rebuilt from its args [3536]"

    line = _optimizer_problem(Unread(), None, "adam", ("master", "exp_avg", "exp_avg_sq"), ("master",))
    assert line.startswith("megatron_ckpt/iter_0000002 (Megatron-LM torch_dist): its optimizer states are not read "
                           "here: the distributed optimizer's buckets hold [3840]")
    assert "--no-load-optim" in line and "--dist-ckpt-optim-fully-reshardable" in line and "\n" not in line


def test_fp16s_grad_scaler_is_our_dynamic_loss_scaler_both_ways():
    """Megatron-LM's fp16 save keeps its DynamicGradScaler's state in common.pt (optimizer.grad_scaler; under the
    distributed optimizer's dp_reshardable layout in each TP x PP rank's object): after 2 clean steps of a window of
    3, scale 65536, growth tracker 2, hysteresis tracker 2 (the default); ours is the same state under our names,
    and written back it is what Megatron-Core saved. A damaged state is one line."""
    from base.errors import CheckpointError
    from checkpoint.torch_dist.common import load_common
    from checkpoint.torch_dist.grad_scaler import megatron_grad_scaler, our_scaler_state

    source = MegatronSource(iteration_dir("megatron_fp16"))
    progress = source.progress()
    assert progress.extra["loss_scaler_type"] == "DynamicLossScaler"
    assert progress.loss_scaler_state == {"scale": 65536.0, "good_steps": 2, "hysteresis_left": 2}
    assert not [line for line in source.not_carried() if "loss scale" in line]
    bucketed = MegatronSource(iteration_dir("megatron_fp16_distopt_dp_reshardable")).progress()
    assert (bucketed.extra["loss_scaler_type"], bucketed.loss_scaler_state) == \
        ("DynamicLossScaler", progress.loss_scaler_state)
    saved = load_common(iteration_dir("megatron_fp16"))["optimizer"]["grad_scaler"]
    written = megatron_grad_scaler("DynamicLossScaler", progress.loss_scaler_state)
    assert written.keys() == saved.keys() and torch.equal(written["scale"], saved["scale"])
    assert (written["growth_tracker"], written["hysteresis_tracker"]) == (saved["growth_tracker"],
                                                                         saved["hysteresis_tracker"])
    assert megatron_grad_scaler("LossScaler", {"scale": 128.0}) == {}  # ConstantGradScaler: --loss-scale's
    assert our_scaler_state({}, "x") is None
    with pytest.raises(CheckpointError, match="not a loss scaler's state"):
        our_scaler_state({**saved, "scale": torch.tensor([float("inf")])}, "x")
    assert MegatronSource(iteration_dir("megatron_bf16")).progress().loss_scaler_state == {"scale": 1.0}


# ---- the next loss is Megatron's ------------------------------------------------------------------------------

def _continued_losses(tmp_path: Path, name: str, flags: list[str]) -> tuple[dict[int, float], str]:
    import pretrain_gpt
    from tests.reliability_helpers import metrics_records, run_main

    checkpoint = shutil.copytree(FIXTURES / name, tmp_path / name)
    metrics = tmp_path / f"{name}.jsonl"
    outcome = run_main(pretrain_gpt.main, flags + ["--load", checkpoint, "--device", "cpu", "--log-interval", "1",
                                                   "--data-cache-dir", tmp_path / "cache", "--metrics-file", metrics])
    assert outcome.code == 0, outcome.err[-3000:]
    losses = {r["iteration"]: r["loss"] for r in metrics_records(metrics) if "loss" in r}
    assert tuple(sorted(losses)) == CONTINUED
    return losses, outcome.out


def megatrons_losses(name: str) -> dict[int, float]:
    """Megatron-LM's uninterrupted iterations 3 and 4 (its own resume of the save logged the same)."""
    written = record(name)
    uninterrupted = {i: written["uninterrupted_losses"][str(i)] for i in CONTINUED}
    assert uninterrupted == {i: written["resumed_losses"][str(i)] for i in CONTINUED}
    return uninterrupted


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_pretrain_gpt_continues_a_megatron_checkpoint_to_megatrons_next_losses_at_tp1(tmp_path, monkeypatch, name):
    monkeypatch.chdir(data_workdir(tmp_path))
    losses, out = _continued_losses(tmp_path, name, our_flags(name))
    assert "> loading Megatron-LM torch_dist checkpoint" in out
    assert "resuming after iteration 2 (8 samples consumed)" in out
    assert "Megatron-Core's order" in out
    expected = megatrons_losses(name)
    if "16" in name:  # 16-bit roundings land in other places (its ops fused otherwise than Megatron's torch path)
        assert losses[3] == pytest.approx(expected[3], rel=2e-5, abs=0)  # measured 2.0e-6 bf16, 6.9e-7 fp16
        assert losses[4] == pytest.approx(expected[4], rel=2e-4, abs=0)  # measured 8.4e-6 bf16, 9.8e-8 fp16
        if "fp16" in name:  # the scale doubles at iteration 3 only from the growth tracker saved at 2
            from tests.reliability_helpers import metrics_records

            scales = {r["iteration"]: r["loss_scale"] for r in metrics_records(tmp_path / f"{name}.jsonl")
                      if "loss" in r}
            assert scales == {i: record(name)["uninterrupted_loss_scales"][str(i)] for i in CONTINUED} == \
                {3: 131072.0, 4: 131072.0}
    else:
        assert losses == pytest.approx(expected, rel=1e-6, abs=0)


def resume_at_tp2(rank: int, world_size: int, checkpoint: str, cache: str, metrics: str, workdir: str) -> None:
    import pretrain_gpt

    os.chdir(workdir)  # the flags' --data-path, relative (data_workdir)
    assert pretrain_gpt.main(our_flags("megatron_tp2_swiglu_gqa", 2) + [
        "--load", checkpoint, "--device", "cpu", "--log-interval", "1", "--data-cache-dir", cache,
        "--metrics-file", metrics]) == 0


@pytest.mark.slow
def test_the_tp2_checkpoint_continues_at_tp2(tmp_path):
    from tests.distributed import run_distributed
    from tests.reliability_helpers import metrics_records

    name = "megatron_tp2_swiglu_gqa"
    checkpoint = shutil.copytree(FIXTURES / name, tmp_path / name)
    metrics = tmp_path / "metrics.jsonl"
    run_distributed(resume_at_tp2, 2, str(checkpoint), str(tmp_path / "cache"), str(metrics),
                    str(data_workdir(tmp_path)), timeout=300)
    losses = {r["iteration"]: r["loss"] for r in metrics_records(metrics) if "loss" in r}
    assert losses == pytest.approx(megatrons_losses(name), rel=1e-6, abs=0)


def resume_moe_at_tp2_ep2(rank: int, world_size: int, checkpoint: str, cache: str, metrics: str, workdir: str) -> None:
    import pretrain_gpt

    os.chdir(workdir)  # the flags' --data-path, relative (data_workdir)
    assert pretrain_gpt.main(our_flags("megatron_moe_tp2_ep2", 2) + [
        "--expert-model-parallel-size", "2", "--load", checkpoint, "--device", "cpu", "--log-interval", "1",
        "--data-cache-dir", cache, "--metrics-file", metrics]) == 0


@pytest.mark.slow
def test_the_moe_checkpoint_at_tp2_ep2_continues_at_its_layout(tmp_path):
    """Megatron-LM's Mixtral-shaped save at TP 2 x EP 2 (expert TP 2, --sequence-parallel) continues here at its own
    layout, four ranks: measured bitwise (4.865856170654297, 4.848658084869385)."""
    from tests.distributed import run_distributed
    from tests.reliability_helpers import metrics_records

    name = "megatron_moe_tp2_ep2"
    checkpoint = shutil.copytree(FIXTURES / name, tmp_path / name)
    metrics = tmp_path / "metrics.jsonl"
    run_distributed(resume_moe_at_tp2_ep2, 4, str(checkpoint), str(tmp_path / "cache"), str(metrics),
                    str(data_workdir(tmp_path)), timeout=300)
    losses = {r["iteration"]: r["loss"] for r in metrics_records(metrics) if "loss" in r}
    assert losses == pytest.approx(megatrons_losses(name), rel=1e-6, abs=0)


def resume_moe_distopt_at_ep2(rank: int, world_size: int, checkpoint: str, cache: str, metrics: str,
                              workdir: str) -> None:
    import pretrain_gpt

    os.chdir(workdir)  # the flags' --data-path, relative (data_workdir)
    assert pretrain_gpt.main(our_flags("megatron_moe_ep2_distopt_dp_reshardable") + [
        "--expert-model-parallel-size", "2", "--load", checkpoint, "--device", "cpu", "--log-interval", "1",
        "--data-cache-dir", cache, "--metrics-file", metrics]) == 0


@pytest.mark.slow
def test_the_moe_distributed_optimizers_chained_buckets_continue_at_their_layout(tmp_path):
    """Megatron-Core's ChainedOptimizer in the dp_reshardable layout: the dense optimizer's buckets (`chained_0.`,
    DP 2) and the expert one's (`chained_1.`, one per EP rank, expert DP 1), continued here at EP 2 x DP 2 with
    Adam's moments: Megatron-LM's iterations 3 and 4 (the TP 1 continuation is in NAMES)."""
    from tests.distributed import run_distributed
    from tests.reliability_helpers import metrics_records

    name = "megatron_moe_ep2_distopt_dp_reshardable"
    source = MegatronSource(iteration_dir(name))
    assert source.optimizer_not_read() is None and source.keys() == ("master", "exp_avg", "exp_avg_sq")
    checkpoint = shutil.copytree(FIXTURES / name, tmp_path / name)
    metrics = tmp_path / "metrics.jsonl"
    run_distributed(resume_moe_distopt_at_ep2, 2, str(checkpoint), str(tmp_path / "cache"), str(metrics),
                    str(data_workdir(tmp_path)), timeout=300)
    losses = {r["iteration"]: r["loss"] for r in metrics_records(metrics) if "loss" in r}
    assert losses == pytest.approx(megatrons_losses(name), rel=1e-6, abs=0)


@pytest.mark.slow
def test_no_load_optim_takes_the_moe_distributed_optimizers_weights(tmp_path, monkeypatch):
    """--no-load-optim on the MoE dp_reshardable save (its `chained_<i>.` optimizer keys are not model tensors):
    the weights load, so iteration 3's loss is Megatron-LM's (the weights and samples alone decide it); Adam starts
    afresh, so iteration 4's is not (measured 4.8477325 against Megatron's 4.8478212)."""
    name = "megatron_moe_ep2_distopt_dp_reshardable"
    monkeypatch.chdir(data_workdir(tmp_path))
    losses, out = _continued_losses(tmp_path, name, our_flags(name) + ["--no-load-optim"])
    assert "resuming after iteration 2 (8 samples consumed)" in out
    expected = megatrons_losses(name)
    assert losses[3] == pytest.approx(expected[3], rel=1e-6, abs=0)
    assert losses[4] != pytest.approx(expected[4], rel=1e-6, abs=0)


@pytest.mark.parametrize("flag, value, said", [("--num-layers", "3", "--num-layers 3 (the checkpoint's: 2)"),
                                               ("--hidden-size", "32", "--hidden-size 32 (the checkpoint's: 16)")])
def test_another_depth_or_width_than_common_pts_args_is_one_line_at_start_up(tmp_path, monkeypatch, flag, value,
                                                                             said):
    """Megatron-LM's check_checkpoint_args compares num_layers and hidden_size first (megatron/training/
    checkpointing.py); so does the start-up here, from common.pt's args, before any tensor is read (issue 79)."""
    import pretrain_gpt
    from tests.reliability_helpers import run_main

    monkeypatch.chdir(data_workdir(tmp_path))
    flags = our_flags("megatron_tp1")
    assert [flags[flags.index(name) + 1] for name in ("--num-layers", "--hidden-size")] == ["2", "16"]
    flags[flags.index(flag) + 1] = value
    checkpoint = shutil.copytree(FIXTURES / "megatron_tp1", tmp_path / "megatron_tp1")
    outcome = run_main(pretrain_gpt.main, flags + ["--load", checkpoint, "--device", "cpu", "--data-cache-dir",
                                                   tmp_path / "cache", "--metrics-file", tmp_path / "m.jsonl"])
    line = outcome.one_error_line(said, "the model would not be the one trained")
    assert "mismatched keys" not in line


def test_a_padded_vocabulary_is_named_at_the_load():
    """Megatron-Core's softmax takes the padding rows' logits, ours leaves them out: a checkpoint whose vocabulary
    is padded beyond the real ids is said to continue with other losses (here 101 real ids in its 128 rows)."""
    from arguments.parser import parse_config
    from checkpoint.torch_dist.resume import _vocabulary_padding
    from gpt.model import GPTModel
    from parallel.state import ParallelState
    from training.run_settings import model_vocabulary

    source = MegatronSource(iteration_dir("megatron_tp1"))
    for vocab, padding in ((127, 0), (100, 27)):
        flags = our_flags("megatron_tp1")
        flags[flags.index("--vocab-size") + 1] = str(vocab)
        config = parse_config(flags)
        # the model's vocabulary as a run decides it: NullTokenizer's ids and its end-of-document id
        model_config = dataclasses.replace(config.model, vocab_size=model_vocabulary(
            config.checkpoint, config.data, config.model, config.sources, vocab + 1))
        model = GPTModel(model_config, ParallelState(device=torch.device("cpu")))
        assert _vocabulary_padding(source, model) == padding
