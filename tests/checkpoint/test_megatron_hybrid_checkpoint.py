"""Megatron-Core 0.19's HybridModel torch_dist checkpoints continued here (issue 92 item 6).

tests/fixtures/megatron_hybrid_dense and megatron_hybrid_moe were written by Megatron-LM core_v0.19.0's own pretrain_hybrid.py on CPU
(scripts/tools/megatron_checkpoint_fixtures.py HYBRID_FIXTURES through scripts/bench/megatron_lm_cpu.py --script
pretrain_hybrid.py) with `--hybrid-layer-pattern "*-*-"`: GPT-2's block twice as four HybridModel layers (attention,
MLP, attention, MLP), fp32, the plain optimizer, the fixtures' corpus; and `*-*E`, the second block Megatron's
default MoE (biases on, 4 experts, top 2) at EP 2; and `*-*-` under the distributed optimizer at DP 2
(--dist-ckpt-optim-fully-reshardable: per-parameter states), and in its default dp_reshardable layout (the
gradient buckets, rebuilt here as a GPT model's: HybridModel's attention and MLP layers register a GPT layer's
parameters in the same order); and `*-*-/*-`, one MTP depth (rotary positions, which Megatron-Core's MTP needs); and
`*-|*-` at PP 2 (megatron_hybrid_pp2, a block per stage). One launch trained iterations 1-4 saving at 2,
a second resumed the save (Megatron-LM's own resume: the same losses). Its folder differs from a GPTModel save: a
layer per symbol (`decoder.layers.<0-3>.self_attention.*` / `.mlp.*`, checkpoint/torch_dist/names.py),
`decoder.final_norm`, and no common.pt (0.19 keeps the common state as the DCP object `common_state`).

- The quick tests read the files: our `--hybrid-layer-pattern "*-*-"` model's names and shapes, the progress, the
  common state out of the DCP files, the pairing of HybridModel's layers with our blocks.
- The continuation (committed fixture, no Megatron needed): pretrain_hybrid.py with the fixture's flags and --load
  trains iterations 3 and 4 to the losses Megatron-LM logged (measured bitwise).
- A GPTModel checkpoint (Megatron-LM core_v0.16.1's, tests/fixtures/megatron_tp1 and megatron_moe_ep2_biases) loads
  under the equivalent pattern (`*-*-`, `*E*E`), as Megatron-Core 0.19's load-time retarget
  (dist_checkpointing/gpt_checkpoint_interop.py) lets pretrain_hybrid.py load it: the same next losses, bitwise.
- With Megatron-LM core_v0.19.0 (MEGATRON_LM_0_19 naming its tree, megatron-core 0.16.1's wheel installed for the
  prebuilt dataset helpers; skipped otherwise): our torch_dist save under a pattern, HybridModel's own layout with
  the pattern in its args (names.py hybrid_megatron_placement), is continued by Megatron-LM's own
  pretrain_hybrid.py with the same flags to our uninterrupted run's iteration-3 and -4 losses: `*-*-` (and at TP 2),
  `*E*E` and `*-*E` at EP 2 (biases on), `*-*-` under the distributed optimizer at DP 2, `*-|*-` at PP 2 (bitwise),
  and `*-*-/*-` with an MTP depth, plain and under the distributed optimizer at DP 2 (OUT_TOLERANCE). Our save without a pattern (GPTModel's layout) still continues
  there under `*-*-` through Megatron-Core 0.19's retarget (bitwise).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from checkpoint.torch_dist.names import our_placements
from checkpoint.torch_dist.source import MegatronSource
from tests.checkpoint.test_megatron_checkpoint import (
    CONTINUED,
    FIXTURES,
    data_workdir,
    iteration_dir,
    megatrons_losses,
    our_flags,
    record,
)

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "tools" / "megatron_checkpoint_fixtures.py"
NAME = "megatron_hybrid_dense"
MOE = "megatron_hybrid_moe"
DISTOPT = "megatron_hybrid_distopt_fully_reshardable"
BUCKETS = "megatron_hybrid_distopt_dp_reshardable"
MTP = "megatron_hybrid_mtp"
PP2 = "megatron_hybrid_pp2"
PATTERNS = {NAME: "*-*-", MOE: "*-*E", DISTOPT: "*-*-", BUCKETS: "*-*-", MTP: "*-*-/*-", PP2: "*-|*-"}
# on one rank a pattern's `|` segments would be virtual stages of one stage (refused here): the same layers without
# them, which HybridModel numbers alike (`|` is not counted)
ONE_STAGE = {PP2: "*-*-"}


def one_rank_flags(name: str) -> list[str]:
    """The fixture's flags on one rank (our_flags), its pattern on one stage (ONE_STAGE)."""
    flags = our_flags(name)
    if name in ONE_STAGE:
        flags[flags.index("--hybrid-layer-pattern") + 1] = ONE_STAGE[name]
    return flags


def test_the_fixture_is_hybridmodels_own_layout():
    """What a 0.19 HybridModel save holds and a GPTModel save does not: no common.pt, a layer per symbol."""
    folder = iteration_dir(NAME)
    assert not (folder / "common.pt").exists()
    keys = set(MegatronSource(folder).reader.tensors())
    assert "decoder.layers.1.mlp.linear_fc1.weight" in keys and "decoder.final_norm.weight" in keys
    assert "decoder.layers.self_attention.linear_qkv.weight" not in keys
    assert record(NAME)["megatron_lm"] == "core_v0.19.0" and record(NAME)["megatron_core"] == "0.19.1"


@pytest.mark.parametrize("name", sorted(PATTERNS))
def test_the_source_is_our_pattern_model_by_name_and_shape(name):
    from arguments.parser import parse_config
    from gpt.model import GPTModel
    from parallel.state import ParallelState

    config = parse_config(one_rank_flags(name))
    assert config.model.hybrid_layer_pattern == ONE_STAGE.get(name, PATTERNS[name]) and config.model.num_layers == 2
    model = GPTModel(config.model, ParallelState(device=torch.device("cpu")))
    ours = {n: tuple(p.shape) for n, p in model.named_parameters()}
    source = MegatronSource(iteration_dir(name))
    assert source.hybrid_pattern == PATTERNS[name]
    assert sorted(source.keys()) == ["exp_avg", "exp_avg_sq", "master"]
    for key in source.keys():
        assert {n: info.shape for n, info in source.tensors(key).items()} == ours, key
    progress = source.progress()
    assert (progress.iteration, progress.consumed_samples, progress.schedule_samples, progress.optimizer_step) == \
        (2, 8, 8, 2)


def test_hybrid_layers_pair_with_our_blocks_and_other_layers_are_not_ours():
    """The k-th `*` layer is block k's attention, the k-th `-`/`E` its MLP (Megatron-Core's own GPT retarget pairs
    them so); a name of the other kind of layer, a layer past the pattern, an `M` layer are no tensor of ours."""
    qkv = our_placements("decoder.layers.2.self_attention.linear_qkv.weight", (48, 16), False, hybrid_pattern="*-|*-")
    assert list(qkv) == ["blocks.1.attention.query_key_value.weight"] and qkv[
        "blocks.1.attention.query_key_value.weight"].index == ()
    norm = our_placements("decoder.layers.3.mlp.linear_fc1.layer_norm_weight", (16,), False, hybrid_pattern="*-*-")
    assert list(norm) == ["blocks.1.post_attention_layernorm.weight"]
    router = our_placements("decoder.layers.1.mlp.router.weight", (4, 16), False, hybrid_pattern="*E*-")
    assert list(router) == ["blocks.0.mlp.router.weight"]
    assert list(our_placements("decoder.final_norm.weight", (16,), False, hybrid_pattern="*-")) == \
        ["final_layernorm.weight"]
    assert our_placements("decoder.final_norm.weight", (16,), False) is None  # GPTModel's is final_layernorm
    assert our_placements("decoder.layers.1.self_attention.linear_qkv.weight", (48, 16), False,
                          hybrid_pattern="*-*-") is None
    assert our_placements("decoder.layers.0.mlp.linear_fc1.weight", (64, 16), False, hybrid_pattern="*-*-") is None
    assert our_placements("decoder.layers.4.mlp.linear_fc1.weight", (64, 16), False, hybrid_pattern="*-*-") is None
    assert our_placements("decoder.layers.0.mixer.in_proj.weight", (64, 16), False, hybrid_pattern="M*-") is None
    # an MTP depth: its own tensors, and its nested layers as our MTP block's transformer_layer
    assert list(our_placements("mtp.layers.0.eh_proj.weight", (16, 32), False, hybrid_pattern="*-*-/*-")) == \
        ["mtp_layers.0.eh_proj.weight"]
    assert list(our_placements("mtp.layers.0.mtp_model_layer.layers.1.mlp.linear_fc2.weight", (16, 64), False,
                               hybrid_pattern="*-*-/*-")) == ["mtp_layers.0.transformer_layer.mlp.dense_4h_to_h.weight"]
    assert our_placements("mtp.layers.1.eh_proj.weight", (16, 32), False, hybrid_pattern="*-*-/*-") is None  # one depth
    assert our_placements("mtp.layers.0.mtp_model_layer.layers.0.mlp.linear_fc2.weight", (16, 64), False,
                          hybrid_pattern="*-*-/*-") is None  # layer 0 of the MTP pattern is its attention


def test_the_buckets_fp32_master_is_the_model_tensor_element_for_element():
    """The dp_reshardable buckets rebuilt from the args (its `*-*-` read as 2 GPT blocks) hold, element for element,
    the model tensors Megatron-Core saved under their own keys: a layout rebuilt in another order would not."""
    from checkpoint.torch_dist.dcp_reader import DcpReader

    source = MegatronSource(iteration_dir(BUCKETS))
    assert source.layout == "dp_reshardable" and source.optimizer_not_read() is None
    reader = DcpReader(iteration_dir(BUCKETS))
    model = {}
    for key, md in reader.tensors().items():
        if not key.startswith("optimizer."):
            model.update(our_placements(key, tuple(md.size), False, hybrid_pattern="*-*-"))
    assert sorted(model) == sorted(source.tensors("master"))
    for ours, placement in model.items():
        whole = tuple(slice(0, n) for n in placement.shape)
        expected = reader.read(placement.key, placement.region(whole)).reshape(placement.shape)
        assert torch.equal(source.read("master", ours, whole), expected), ours


def test_a_pattern_whose_buckets_are_not_rebuilt_is_refused_with_the_reason():
    from checkpoint.torch_dist.source import _unbucketed_pattern

    assert _unbucketed_pattern("*-*-") is None and _unbucketed_pattern(None) is None
    assert [_unbucketed_pattern(text) for text in ("*-|*-", "*-*-/*-", "*E*-", "M*-", "M-*-", "*--*")] == \
        ["*-|*-", "*-*-/*-", "*E*-", "M*-", "M-*-", "*--*"]


def test_the_common_state_is_read_from_the_dcp_files_without_running_code():
    from checkpoint.torch_dist.common import arg, common_object, load_common

    folder = iteration_dir(NAME)
    assert common_object(folder) == "common_state/shard_0_1"
    assert common_object(iteration_dir("megatron_tp1")) is None  # 0.16.1's common.pt
    common = load_common(folder)
    assert common["iteration"] == 2 and arg(common, "hybrid_layer_pattern") == "*-*-"
    assert arg(common, "num_layers") == 4  # HybridModel's layers, one per symbol


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(PATTERNS))
def test_pretrain_hybrid_continues_megatrons_hybrid_checkpoint_to_its_next_losses(tmp_path, monkeypatch, name):
    """The MoE one saved at EP 2 by Megatron-LM, continued here on one rank; the PP 2 one (`*-|*-`) on one rank
    under `*-*-`, the same layers on one stage."""
    import pretrain_hybrid
    from tests.reliability_helpers import metrics_records, run_main

    monkeypatch.chdir(data_workdir(tmp_path))
    checkpoint = shutil.copytree(FIXTURES / name, tmp_path / name)
    metrics = tmp_path / "metrics.jsonl"
    outcome = run_main(pretrain_hybrid.main, one_rank_flags(name) + [
        "--load", checkpoint, "--device", "cpu", "--log-interval", "1", "--data-cache-dir", tmp_path / "cache",
        "--metrics-file", metrics])
    assert outcome.code == 0, outcome.err[-3000:]
    assert "> loading Megatron-LM torch_dist checkpoint" in outcome.out
    assert "resuming after iteration 2 (8 samples consumed)" in outcome.out
    losses = {r["iteration"]: r["loss"] for r in metrics_records(metrics) if "loss" in r}
    assert tuple(sorted(losses)) == CONTINUED
    assert losses == megatrons_losses(name)  # bitwise, as measured (the same kernels in the same order)


@pytest.mark.parametrize("name", sorted(PATTERNS))
def test_the_fixture_is_small(name):
    assert sum(path.stat().st_size for path in Path(FIXTURES / name).rglob("*") if path.is_file()) < 600_000


@pytest.mark.slow
@pytest.mark.parametrize("name, pattern", [("megatron_tp1", "*-*-"), ("megatron_moe_ep2_biases", "*E*E")])
def test_a_gpt_checkpoint_continues_under_the_equivalent_pattern(tmp_path, monkeypatch, name, pattern):
    import pretrain_hybrid
    from tests.reliability_helpers import metrics_records, run_main

    monkeypatch.chdir(data_workdir(tmp_path))
    checkpoint = shutil.copytree(FIXTURES / name, tmp_path / name)
    flags = our_flags(name)
    at = flags.index("--num-layers")
    del flags[at:at + 2]  # the pattern gives the depth
    metrics = tmp_path / "metrics.jsonl"
    outcome = run_main(pretrain_hybrid.main, flags + [
        "--hybrid-layer-pattern", pattern, "--load", checkpoint, "--device", "cpu", "--log-interval", "1",
        "--data-cache-dir", tmp_path / "cache", "--metrics-file", metrics])
    assert outcome.code == 0, outcome.err[-3000:]
    assert f"--hybrid-layer-pattern {pattern}: 2 blocks" in outcome.out
    losses = {r["iteration"]: r["loss"] for r in metrics_records(metrics) if "loss" in r}
    assert losses == megatrons_losses(name)  # bitwise, as measured


@pytest.mark.slow
def test_pretrain_hybrid_continues_megatrons_pp2_checkpoint_at_pp2(tmp_path):
    """megatron_hybrid_pp2 (`*-|*-` at PP 2) continued here at PP 2 under its own pattern and flags, a block per
    stage as in Megatron-LM: its iterations 3 and 4 (measured bitwise)."""
    from tests.distributed import run_distributed
    from tests.reliability_helpers import metrics_records

    checkpoint = shutil.copytree(FIXTURES / PP2, tmp_path / PP2)
    metrics = tmp_path / "metrics.jsonl"
    run_distributed(run_ours, 2, list(record(PP2)["flags"]) + [
        "--load", str(checkpoint), "--device", "cpu", "--log-interval", "1", "--data-cache-dir",
        str(tmp_path / "cache"), "--metrics-file", str(metrics)], str(data_workdir(tmp_path)), timeout=300)
    losses = {r["iteration"]: r["loss"] for r in metrics_records(metrics) if "loss" in r}
    assert losses == megatrons_losses(PP2)


def run_ours(rank: int, world_size: int, argv: list[str], workdir: str) -> None:
    import pretrain_hybrid

    os.chdir(workdir)  # the flags' --data-path, relative (data_workdir)
    assert pretrain_hybrid.main(argv) == 0


# (the fixture whose flags the run takes, the pattern, the ranks of both runs): the MoE one at EP 2, its layers all
# MoE (the torch_dist writer's MoE), Megatron's default with biases
OUT_CASES = {"dense": (NAME, "*-*-", 1), "moe_ep2": (MOE, "*E*E", 2), "distopt_dp2": (DISTOPT, "*-*-", 2),
             "mtp": (MTP, "*-*-/*-", 1), "pp2": (PP2, "*-|*-", 2), "moe_beside_dense_ep2": (MOE, "*-*E", 2),
             # our save of the same model without a pattern (GPTModel's layout), loaded under `*-*-` there
             "gpt_layout_retargeted": (NAME, None, 1)}
# flags both runs add to the fixture's
OUT_EXTRA = {"dense_tp2": ["--tensor-model-parallel-size", "2"],
             "mtp_distopt_dp2": ["--use-distributed-optimizer"]}
OUT_CASES.update(dense_tp2=(NAME, "*-*-", 2), mtp_distopt_dp2=(MTP, "*-*-/*-", 2))
# where Megatron-LM's continuation is not our uninterrupted run bitwise, the relative difference measured
OUT_TOLERANCE = {"mtp": 1e-6, "mtp_distopt_dp2": 1e-6}  # iteration 4: 4.847300052642822 there, 4.847299575805664 here (9.8e-8)


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(OUT_CASES))
def test_megatron_lm_019_continues_our_save_under_the_pattern(tmp_path, case):
    pytest.importorskip("megatron.core", reason="megatron-core is a benchmark-only peer (requirements-bench.txt)")
    tree = os.environ.get("MEGATRON_LM_0_19")
    if not tree or not (Path(tree) / "pretrain_hybrid.py").is_file():
        pytest.skip("MEGATRON_LM_0_19 names no Megatron-LM core_v0.19.0 tree (git archive core_v0.19.0)")
    from tests.distributed import run_distributed
    from tests.reliability_helpers import metrics_records

    name, pattern, ranks = OUT_CASES[case]
    flags = list(record(name)["flags"]) + OUT_EXTRA.get(case, [])
    ours = flags
    if pattern is None:  # our save without a pattern: GPTModel's layout, which Megatron-Core 0.19 retargets
        at, spec = flags.index("--hybrid-layer-pattern"), flags.index("--spec")
        ours = [flag for index, flag in enumerate(flags) if index not in (at, at + 1, spec, spec + 1, spec + 2)]
        ours += ["--num-layers", "2"]
    else:
        flags[flags.index("--hybrid-layer-pattern") + 1] = pattern
    saved = tmp_path / "save"
    # one run: saves at 2 (and 4, dropped), its iterations 3 and 4 the uninterrupted ones
    run_distributed(run_ours, ranks, ours + [
        "--device", "cpu", "--log-interval", "1", "--data-cache-dir", str(tmp_path / "c"), "--save", str(saved),
        "--save-interval", "2", "--metrics-file", str(tmp_path / "straight.jsonl")], str(data_workdir(tmp_path)),
        timeout=300)
    shutil.rmtree(saved / "iter_0000004")
    (saved / "latest_checkpointed_iteration.txt").write_text("2")
    straight = {r["iteration"]: r["loss"] for r in metrics_records(tmp_path / "straight.jsonl") if "loss" in r}
    completed = subprocess.run(
        [sys.executable, str(SCRIPT), "continue", "--megatron-lm", tree, "--script", "pretrain_hybrid.py",
         "--load", str(saved), "--nproc", str(ranks), "--", *flags],
        capture_output=True, text=True, timeout=600, cwd=SCRIPT.parents[1])
    assert completed.returncode == 0, completed.stderr[-3000:]
    continued = {int(i): loss for i, loss in json.loads(completed.stdout.strip().splitlines()[-1])["losses"].items()}
    if case in OUT_TOLERANCE:
        assert continued == pytest.approx({i: straight[i] for i in CONTINUED}, rel=OUT_TOLERANCE[case], abs=0)
    else:
        assert continued == {i: straight[i] for i in CONTINUED}
    print(f"{case}: ours {[straight[i] for i in CONTINUED]}, Megatron-LM's {[continued[i] for i in CONTINUED]}")


@pytest.mark.parametrize("name", sorted(PATTERNS))
def test_our_pattern_saves_write_hybridmodels_keys_and_shapes(name):
    """What a save here under the fixture's pattern writes (names.py hybrid_megatron_placement, every parameter of
    our model) is the fixture's tensors key for key and shape for shape, and the reader pairs each back with the
    parameter it came from (one table both ways)."""
    from arguments.parser import parse_config
    from checkpoint.torch_dist.dcp_reader import DcpReader
    from checkpoint.torch_dist.names import hybrid_megatron_placement
    from gpt.model import GPTModel
    from parallel.state import ParallelState

    config = parse_config(one_rank_flags(name))
    experts = config.model.moe.num_experts if config.model.moe is not None else None
    written = {}
    for ours, parameter in GPTModel(config.model, ParallelState(device=torch.device("cpu"))).named_parameters():
        placement, shape = hybrid_megatron_placement(ours, tuple(parameter.shape), PATTERNS[name], experts)
        assert our_placements(placement.key, shape, False, hybrid_pattern=PATTERNS[name])[ours] == placement
        written[placement.key] = shape
    theirs = {key: tuple(md.size) for key, md in DcpReader(iteration_dir(name)).tensors().items()
              if not key.startswith("optimizer.")}
    assert written == theirs


def test_the_hybrid_fixtures_flags_are_the_ones_the_driver_writes():
    sys.path.insert(0, str(SCRIPT.parent))
    try:
        import megatron_checkpoint_fixtures as driver
    finally:
        sys.path.remove(str(SCRIPT.parent))
    assert sorted(driver.HYBRID_FIXTURES) == sorted(PATTERNS)
    for name in driver.HYBRID_FIXTURES:
        written = record(name)
        assert (written["world_size"], written["flags"]) == (driver.fixture_ranks(name), driver.fixture_flags(name))
        assert "--num-layers" not in written["flags"]


def test_the_hugging_face_export_reads_the_blocks_not_megatrons_layer_count():
    """Megatron's args count a HybridModel layer per symbol (num_layers 4 for `*-*-`): the export's model is the
    pattern's 2 blocks, GPT-2's as megatron_tp1's (before, it asked for blocks.2 and stopped)."""
    import dataclasses

    from checkpoint.megatron_hf import megatron_to_hf_state

    config, weights, _ = megatron_to_hf_state(iteration_dir(NAME))
    gpt_config, gpt_weights, _ = megatron_to_hf_state(iteration_dir("megatron_tp1"))
    assert config.num_layers == 2 and config.hybrid_layer_pattern == "*-*-"
    assert dataclasses.replace(config, hybrid_layer_pattern=None) == gpt_config
    assert {n: tuple(w.shape) for n, w in weights.items()} == {n: tuple(w.shape) for n, w in gpt_weights.items()}


MLA = ["--multi-latent-attention", "--kv-lora-rank", "8", "--qk-head-dim", "4", "--qk-pos-emb-head-dim", "4",
       "--v-head-dim", "4", "--position-embedding-type", "rope"]


def test_mla_latent_norms_under_a_pattern_save_this_projects_format_said_at_start_up():
    """HybridModel's `+` layers build no latent norms (hybrid_layer_specs.py mla_layer: q_layernorm and kv_layernorm
    IdentityOp): MLA with --qk-layernorm under a pattern is said once at start-up and saved in this project's
    format; without them, HybridModel's layout is written."""
    from arguments.parser import parse_config

    flags = [*one_rank_flags(NAME), *MLA, "--hybrid-layer-pattern", "+-+-", "--save", "ckpt"]
    line = parse_config([*flags, "--qk-layernorm"]).megatron_format_unwritten()
    assert line is not None and "latent norms (--qk-layernorm) under --hybrid-layer-pattern" in line
    assert parse_config(flags).megatron_format_unwritten() is None


@pytest.mark.parametrize("pattern, q_lora_rank", [("*-+E+-*-/*-", []), ("+E+-/+-", ["--q-lora-rank", "8"])])
def test_mla_layers_write_megatrons_hybrid_names_and_read_back(pattern, q_lora_rank):
    """Each `+` layer's tensors are HybridModel's mla_layer names (MLASelfAttention's linears under
    `self_attention.`, its input norm `input_layernorm.*`), each `*` layer's attention's, every place one
    parameter's, and the reader pairs each back with the parameter it came from, beside attention blocks and in an MTP depth."""
    from arguments.parser import parse_config
    from checkpoint.torch_dist.names import hybrid_megatron_placement
    from gpt.model import GPTModel
    from parallel.state import ParallelState

    flags = [*one_rank_flags(NAME), *MLA, *q_lora_rank, "--num-experts", "4", "--hybrid-layer-pattern", pattern]
    config = parse_config(flags)
    written, taken = {}, set()
    for ours, parameter in GPTModel(config.model, ParallelState(device=torch.device("cpu"))).named_parameters():
        placement, shape = hybrid_megatron_placement(ours, tuple(parameter.shape), pattern, 4)
        assert our_placements(placement.key, shape, False, hybrid_pattern=pattern)[ours] == placement, ours
        assert (placement.key, placement.index, placement.row_offset) not in taken, ours
        taken.add((placement.key, placement.index, placement.row_offset))
        written[placement.key] = ours
    down = "linear_q_down_proj" if q_lora_rank else "linear_q_proj"
    first_mla = pattern.index("+")
    assert written[f"decoder.layers.{first_mla}.self_attention.{down}.weight"].endswith(f"attention.{down}.weight")
    assert written[f"decoder.layers.{first_mla}.input_layernorm.weight"].endswith(".input_layernorm.weight")
    if pattern.startswith("*"):  # the attention block's input norm under TE's fused name, as before
        assert written["decoder.layers.0.self_attention.linear_qkv.layer_norm_weight"] == \
            "blocks.0.input_layernorm.weight"
    if "/+" in pattern:
        assert "mtp.layers.0.mtp_model_layer.layers.0.self_attention.linear_kv_down_proj.weight" in written


def _saved_at_2_and_resumed(tmp_path, common: list) -> tuple[set, list]:
    """`common` trained to iteration 4 saving every 2 iterations, the save of 4 removed, then resumed from the save of
    2 by the reader of Megatron-LM's checkpoints: the save's tensor names and both runs' losses by iteration."""
    import pretrain_hybrid
    from tests.reliability_helpers import metrics_records, run_main

    saved, straight, resumed = tmp_path / "save", tmp_path / "straight.jsonl", tmp_path / "resumed.jsonl"
    outcome = run_main(pretrain_hybrid.main, common + ["--save", saved, "--save-interval", "2", "--metrics-file",
                                                      straight])
    assert outcome.code == 0, outcome.err[-3000:]
    shutil.rmtree(saved / "iter_0000004")
    (saved / "latest_checkpointed_iteration.txt").write_text("2")
    tensors = set(MegatronSource(saved / "iter_0000002").reader.tensors())
    outcome = run_main(pretrain_hybrid.main, common + ["--load", saved, "--metrics-file", resumed])
    assert outcome.code == 0, outcome.err[-3000:]
    return tensors, [{r["iteration"]: r["loss"] for r in metrics_records(path) if "loss" in r}
                     for path in (straight, resumed)]


@pytest.mark.slow
@pytest.mark.parametrize("name", [MTP, MOE])
def test_our_hybridmodel_layout_save_resumes_here_to_our_uninterrupted_losses(tmp_path, monkeypatch, name):
    """Our save under the fixture's pattern (HybridModel's layout) read back here by the same reader as
    Megatron-LM's: the resumed iterations 3 and 4 are the uninterrupted run's (measured bitwise)."""
    monkeypatch.chdir(data_workdir(tmp_path))
    common = one_rank_flags(name) + ["--device", "cpu", "--log-interval", "1", "--data-cache-dir",
                                     tmp_path / "cache"]
    tensors, losses = _saved_at_2_and_resumed(tmp_path, common)
    assert "decoder.final_norm.weight" in tensors
    assert losses[1] == {i: losses[0][i] for i in CONTINUED}


@pytest.mark.slow
def test_a_mixed_attention_and_mla_save_in_hybridmodels_layout_resumes_to_the_uninterrupted_losses(tmp_path,
                                                                                                     monkeypatch):
    """`*-+-/+-` saved in HybridModel's layout (a `*` layer's attention names, a `+` layer's MLA names, an MTP depth
    of MLA) and read back by the reader of Megatron-LM's checkpoints: iterations 3 and 4 are the uninterrupted
    run's, bitwise."""
    monkeypatch.chdir(data_workdir(tmp_path))
    common = one_rank_flags(NAME) + [*MLA, "--hybrid-layer-pattern", "*-+-/+-", "--device", "cpu", "--log-interval",
                                     "1", "--data-cache-dir", tmp_path / "cache"]
    tensors, losses = _saved_at_2_and_resumed(tmp_path, common)
    assert {"decoder.layers.2.self_attention.linear_kv_down_proj.weight", "decoder.layers.2.input_layernorm.weight",
            "decoder.layers.0.self_attention.linear_qkv.weight"} <= tensors
    assert losses[1] == {i: losses[0][i] for i in CONTINUED}
