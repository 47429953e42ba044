"""Value extremes for every numeric setting (issue 33, "Extend the fuzz test to value extremes"):
1e300, 1e-9, nan, inf, a negative and 0, each given alone to every int, float and count flag that is a
setting -- the list comes from the parser built from PretrainConfig's fields, not a hand list, so a
new flag is covered the day it is added.

Each case runs in this process through what pretrain_gpt.py runs before any work (parse_arguments:
the preset, the config's validation and arguments/bounds.py's limits; then check_machine_bounds),
behind the same one-line boundary (base.errors.run_tool). It must end in exactly one stderr line and
exit 2, or be accepted by those rules (0 disables several flags, 1e-9 is a fine learning rate) --
never a traceback -- and create nothing. The ones accepted go no further: what they train is the
training tests' work, and a run per case would take minutes. Also `python -m zero.plan dry-run`,
whose dry run builds meta tensors of the sizes given, at the size extremes.
"""

from __future__ import annotations

import itertools
import json

import pytest

import pretrain_gpt
from arguments.bounds import check_machine_bounds
from arguments.config import field_sections
from arguments.parser import build_parser, parse_arguments
from base.errors import run_tool
from base.options import count
from planner import plan as zero_plan
from tests.reliability_helpers import TINY, run_main

EXTREMES = ["1e300", "1e-9", "nan", "inf", "-3", "0"]
NUMERIC_TYPES = (int, float, count)


def numeric_setting_flags() -> list[tuple[str, int]]:
    """(flag, number of values it takes) for every setting whose flag parses a number."""
    settings = field_sections()
    flags = []
    for action in build_parser()._actions:
        if action.option_strings and action.dest in settings and action.type in NUMERIC_TYPES:
            flags.append((action.option_strings[0], action.nargs if isinstance(action.nargs, int) else 1))
    return flags


FLAGS = numeric_setting_flags()


def test_the_flag_list_is_generated_and_covers_the_known_numbers():
    names = {flag for flag, _ in FLAGS}
    assert len(names) >= 40
    assert {"--num-layers", "--lr", "--train-samples", "--rampup-batch-size", "--distributed-timeout-minutes",
            "--heartbeat-timeout-seconds", "--reduce-bucket-size", "--gradient-accumulation-steps"} <= names


def before_work(argv):
    """pretrain_gpt.py's steps before any work: the one-line boundary around parsing, validation and bounds."""
    def action():
        check_machine_bounds(parse_arguments(argv).config)
    return lambda _: run_tool("pretrain_gpt.py", action)


@pytest.mark.parametrize("flag, nargs", FLAGS, ids=[flag for flag, _ in FLAGS])
def test_every_numeric_flag_at_every_extreme_is_one_line_or_accepted(tmp_path, monkeypatch, flag, nargs):
    monkeypatch.chdir(tmp_path)
    for value in EXTREMES:
        argv = [*TINY, "--data-cache-dir", str(tmp_path / "cache"), flag, *[value] * nargs]
        outcome = run_main(before_work(argv), [])
        lines = outcome.err.strip().splitlines()
        assert "Traceback" not in outcome.err, (flag, value, outcome.err)
        assert (outcome.code == 2 and len(lines) == 1) or (outcome.code == 0 and not lines), (flag, value, outcome)
        assert list(tmp_path.iterdir()) == [], (flag, value, "created files")


PLAN_SIZES = ["--hidden-size", "--seq-length", "--micro-batch-size", "--num-layers", "--ffn-hidden-size"]


def plan_dry_run(tmp_path, monkeypatch, *argv):
    monkeypatch.chdir(tmp_path)
    outcome = run_main(zero_plan.command, ["dry-run", *argv])
    assert "Traceback" not in outcome.err and list(tmp_path.iterdir()) == [], outcome.err
    return outcome


@pytest.mark.parametrize("flag", PLAN_SIZES)
@pytest.mark.parametrize("value", ["1000000000000", "1e300", "nan", "-3", "0"])
def test_zero_plan_dry_run_at_size_extremes_is_one_line_or_a_plan(tmp_path, monkeypatch, flag, value):
    """A dry run plans on the meta device, so a model no cluster holds may still be planned (and shown
    not to fit); what it must never do is end in a traceback."""
    extra = ["--global-batch-size", value, "--max-position-embeddings", value] if flag != "--num-layers" else []
    outcome = plan_dry_run(tmp_path, monkeypatch, flag, value, *extra)
    assert outcome.code == 0 or (outcome.code == 2 and len(outcome.err.strip().splitlines()) == 1), outcome.err


@pytest.mark.parametrize("argv, words", [(["--num-experts", "1000000000"], "a dry run plans at most 4096 experts"),
                                         # a sequence long enough for the depths (gpt/model_config.py: at most
                                         # --seq-length - 1 of them have a target)
                                         (["--mtp-num-layers", "4000", "--seq-length", "4096",
                                           "--max-position-embeddings", "4096"],
                                          "at most 1024 layers, MTP layers included")])
def test_zero_plan_dry_run_of_a_huge_count_of_experts_or_mtp_layers_is_one_line(tmp_path, monkeypatch, argv, words):
    """Issue 60: a dry run built 10^9 expert modules or MTP layers on the meta device (no machine bound applies to
    a plan of other machines): it never ended."""
    outcome = plan_dry_run(tmp_path, monkeypatch, *argv)
    assert outcome.code == 2 and words in outcome.err.strip() and len(outcome.err.strip().splitlines()) == 1


@pytest.mark.parametrize("argv", [["--hidden-size", "1000000000"],
                                  ["--micro-batch-size", "1000000000000", "--global-batch-size", "1000000000000",
                                   "--vocab-size", "50257"]])  # GPT-2's: the logits past int64's bytes
def test_zero_plan_dry_run_of_a_tensor_beyond_int64_bytes_is_one_line(tmp_path, monkeypatch, argv):
    """Issue 33 #15: these ended in torch's "Storage size calculation overflowed" traceback."""
    outcome = plan_dry_run(tmp_path, monkeypatch, *argv)
    assert outcome.code == 2 and "beyond what a tensor can address" in outcome.err.strip(), outcome.err


# ---- the surfaces built last (issue 60, item 4) ---------------------------------------------------------------
# Each surface's numeric flags, from the parser as above, each at 0, -1, 1, a huge value and one that divides no
# partner (3: not 4 experts, 2 heads, 16 tokens, 4 layers), given beside the flags that switch the surface on. The
# parser and validation decide most (fast); a launch they accept trains one iteration in this process (a run that
# needs more ranks than this one is refused in one line by the grid check): one line and exit 2, or a run that
# trains, never a traceback. A huge count that is only a cost (Newton-Schulz iterations) is accepted, as Megatron-LM
# accepts it, and not run.
SURFACE_VALUES = ["0", "-1", "1", "1000000000", "3"]
DEEPSPEED_MOE = {"topk", "moe_train_capacity_factor", "moe_eval_capacity_factor", "moe_min_capacity", "moe_loss_coeff",
                 "expert_interval"}
SURFACES = {
    "moe": (["--num-experts", "4", "--moe-router-topk", "2"],
            lambda dest: (dest.startswith("moe_") and dest not in DEEPSPEED_MOE) or
            dest in ("num_experts", "expert_model_parallel_size", "expert_tensor_parallel_size")),
    "deepspeed-moe": (["--num-experts", "4", "--moe-gating", "deepspeed", "--expert-interval", "1"],
                      lambda dest: dest in DEEPSPEED_MOE),
    "cp": ([], lambda dest: dest in ("context_parallel_size", "ds_sequence_parallel_size")),
    "mla": (["--multi-latent-attention", "--position-embedding-type", "rope"],
            lambda dest: dest in ("q_lora_rank", "kv_lora_rank", "qk_head_dim", "qk_pos_emb_head_dim", "v_head_dim",
                                  "rotary_scaling_factor", "mscale", "mscale_all_dim")),
    "mtp": (["--mtp-num-layers", "1"], lambda dest: dest.startswith("mtp_")),
    "muon": (["--optimizer", "muon"], lambda dest: dest.startswith("muon_")),
    "fim": (["--fim-data", "--fim-split-sample", "a"], lambda dest: dest.startswith("fim_")),
    "pipeline": (["--num-layers", "4", "--pipeline-model-parallel-size", "2"],
                 lambda dest: dest in ("pipeline_model_parallel_size", "num_layers_per_virtual_pipeline_stage",
                                       "num_virtual_stages_per_pipeline_rank",
                                       "microbatch_group_size_per_virtual_pipeline_stage",
                                       "decoder_first_pipeline_num_layers", "decoder_last_pipeline_num_layers")),
}
RUNS = itertools.count()
# the layout string's numbers: a stage's repetition count at the same values, on 4 layers over 2 stages
LAYOUTS = ["Et*{}|t*3L", "Et|t*{}L", "E(t|)*{}tL", "Ett|ttm*{}L", "(Et|)*{}ttL"]


def surface_flags(selects) -> list[str]:
    """The surface's flags that take a number (--num-experts' count type included; DeepSpeed-Ulysses' flag, which
    sets --context-parallel-size and --cp-comm-type, too)."""
    return sorted({action.option_strings[0] for action in build_parser()._actions
                   if action.option_strings and selects(action.dest)
                   and (action.type in NUMERIC_TYPES or action.dest == "num_experts")})


def test_every_surface_has_its_known_numeric_flags():
    flags = {name: set(surface_flags(selects)) for name, (_, selects) in SURFACES.items()}
    assert {"--num-experts", "--moe-ffn-hidden-size", "--moe-router-topk", "--moe-expert-capacity-factor",
            "--expert-model-parallel-size", "--moe-shared-expert-intermediate-size"} <= flags["moe"]
    assert {"--fim-rate", "--fim-spm-rate", "--fim-fragment-rate"} <= flags["fim"]
    assert {"--mtp-num-layers", "--mtp-loss-scaling-factor"} <= flags["mtp"]
    assert {"--muon-momentum", "--muon-num-ns-steps", "--muon-extra-scale-factor"} <= flags["muon"]
    assert {"--q-lora-rank", "--kv-lora-rank", "--v-head-dim", "--mscale"} <= flags["mla"]
    assert {"--context-parallel-size", "--ds-sequence-parallel-size"} <= flags["cp"]
    assert {"--pipeline-model-parallel-size", "--decoder-first-pipeline-num-layers"} <= flags["pipeline"]


def one_line_or_trains(argv: list, workdir, cache: str) -> str:
    """'' when pretrain_gpt.py given `argv` (and one iteration) ends in one line and exit 2, or trains; else what
    went wrong. A launch the parser refuses stops there, before any work, so most cases cost a parse."""
    try:
        outcome = run_main(pretrain_gpt.main, [*argv, "--train-iters", "1", "--data-cache-dir", cache,
                                               "--metrics-file", workdir / f"metrics-{next(RUNS)}.jsonl"])
    except BaseException as error:  # noqa: BLE001 - a traceback is what this test exists to catch
        return f"raised {type(error).__name__}: {error}"
    lines = outcome.err.strip().splitlines()
    if "Traceback" in outcome.err or not ((outcome.code == 0 and not lines) or (outcome.code == 2 and len(lines) == 1)):
        return f"exit {outcome.code}: {outcome.err[-500:]}"
    return ""


@pytest.mark.slow
@pytest.mark.parametrize("surface", sorted(SURFACES))
def test_every_numeric_flag_of_a_surface_at_the_extremes_is_one_line_or_trains(surface, tmp_path, corpus_cache_300):
    base, selects = SURFACES[surface]
    failures = [f"{flag} {value}: {why}" for flag in surface_flags(selects) for value in SURFACE_VALUES
                if (why := one_line_or_trains([*TINY, *base, flag, value], tmp_path, corpus_cache_300))]
    assert failures == []


@pytest.mark.slow
def test_the_pipeline_layouts_numbers_at_the_extremes_are_one_line_or_train(tmp_path, corpus_cache_300):
    """Before: `t*1000000000` was unrolled in memory (10^9 characters, parse_str_to_list's way) before any check."""
    base = [*TINY, "--num-layers", "4", "--pipeline-model-parallel-size", "2", "--mtp-num-layers", "1"]
    failures = [f"{layout}: {why}" for template in LAYOUTS for value in SURFACE_VALUES
                if (why := one_line_or_trains([*base, "--pipeline-model-parallel-layout",
                                               layout := template.format(value)], tmp_path, corpus_cache_300))]
    assert failures == []


# ---- issue 60's probes: each ended in a traceback, trained silently or ran unbounded ---------------------------
ISSUE_60_REFUSED = [
    (["--fim-data", "--fim-rate", "2"], "--fim-rate must be a probability, between 0 and 1, got 2"),
    (["--fim-data", "--fim-rate", "-0.5"], "--fim-rate must be a probability, between 0 and 1, got -0.5"),
    (["--fim-data", "--fim-spm-rate", "1.5"], "--fim-spm-rate must be a probability, between 0 and 1, got 1.5"),
    (["--fim-data", "--fim-split-sample", "a", "--fim-fragment-rate", "-1"],
     "--fim-fragment-rate must be a probability, between 0 and 1, got -1"),
    (["--lr-decay-style", "WSD", "--lr-wsd-decay-iters", "-5"], "--lr-wsd-decay-iters must be 0 or more"),
    (["--lr-decay-style", "WSD", "--train-samples", "8", "--train-iters", None, "--lr-wsd-decay-samples", "-5"],
     "--lr-wsd-decay-samples must be 0 or more"),
    (["--num-experts", "4", "--moe-ffn-hidden-size", "0"], "--moe-ffn-hidden-size must be at least 1, got 0"),
    (["--num-layers", "4", "--pipeline-model-parallel-size", "2", "--pipeline-model-parallel-layout",
      "Et*1000000000000|tL"], "unrolls to 1e+12 characters"),
]


def _without_unset(argv: list) -> list:
    """TINY + argv, where a flag followed by None is dropped from both."""
    dropped = {argv[i - 1] for i, value in enumerate(argv) if value is None}
    base = [item for i, item in enumerate(TINY) if item not in dropped and (i == 0 or TINY[i - 1] not in dropped)]
    return base + [item for item in argv if item is not None and item not in dropped]


@pytest.mark.parametrize("argv, words", ISSUE_60_REFUSED, ids=[" ".join(filter(None, argv)) for argv, _ in ISSUE_60_REFUSED])
def test_issue_60s_bad_values_are_one_line_naming_the_flag_before_any_work(argv, words, tmp_path, monkeypatch):
    """Before: --fim-rate 2 / -0.5 ended in a data-loader worker's 69-line traceback ("p < 0, p > 1 or p is NaN"),
    --lr-wsd-decay-iters -5 never decayed, --moe-ffn-hidden-size 0 trained experts of the MLP's width, and the
    layout's t*10^12 was unrolled in memory."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("training.prepare.build_data", lambda *args: pytest.fail("data work started"))
    outcome = run_main(pretrain_gpt.main, [*_without_unset(argv), "--data-cache-dir", tmp_path / "cache"])
    outcome.one_error_line(words)
    assert list(tmp_path.iterdir()) == []


def test_mtp_layers_count_in_the_models_size_bound():
    """Before: --mtp-num-layers 100000 on the default model built 100000 layers for minutes, where --num-layers
    100000 is refused in one line before any build (arguments/bounds.py); each MTP layer is at least a block."""
    from base.errors import ConfigError

    gib = 2**30
    long = ["--seq-length", "131072", "--max-position-embeddings", "131072"]  # room for 100000 MTP depths
    for argv in (["--mtp-num-layers", "100000", *long], ["--num-layers", "100000"]):
        with pytest.raises(ConfigError, match="more than 1 rank.* of 24 GiB can hold even fully sharded") as error:
            check_machine_bounds(parse_arguments(argv).config, world_size=1, memory=24 * gib, host_memory=24 * gib)
        assert f"{argv[0]} 100000" in str(error.value) and "\n" not in str(error.value)
    check_machine_bounds(parse_arguments(["--mtp-num-layers", "1"]).config, world_size=1, memory=24 * gib,
                         host_memory=24 * gib)


def test_mtp_depths_past_the_sequence_are_one_line_before_any_build():
    """Issue 79 (round 5's): --mtp-num-layers 100000 on a 16-token model of width 32 passed the size bound and built
    for minutes. Depth k's labels are the sequence rolled k places with zeros (Megatron-Core's roll_tensor in
    multi_token_prediction.py), so from depth --seq-length on no position has a target."""
    from base.errors import ConfigError

    with pytest.raises(ConfigError, match="no position has a target: at most 15") as error:
        parse_arguments(["--num-layers", "1", "--hidden-size", "32", "--num-attention-heads", "2", "--seq-length", "16",
                         "--max-position-embeddings", "16", "--mtp-num-layers", "100000"])
    assert "\n" not in str(error.value)
    assert parse_arguments(["--seq-length", "16", "--max-position-embeddings", "16", "--mtp-num-layers",
                            "15"]).config.model.mtp.num_layers == 15


def test_a_negative_capacity_factor_is_dropless_as_megatron_reads_it(tmp_path, corpus_cache_300):
    """Megatron-Core's TransformerConfig.__post_init__ sets a negative --moe-expert-capacity-factor to None: no
    capacity. Before: torch.topk's "selected index k out of range" (exit 1). Now the losses are the dropless run's,
    and the start-up line says how the value was read."""
    def losses(*extra):
        metrics = tmp_path / f"m{next(RUNS)}.jsonl"
        outcome = run_main(pretrain_gpt.main, [*TINY, "--num-experts", "4", *extra, "--data-cache-dir", corpus_cache_300,
                                               "--metrics-file", metrics])
        assert outcome.code == 0, outcome.err
        return outcome.out, [record["loss"] for record in map(json.loads, metrics.read_text().splitlines())
                             if "loss" in record and "split" not in record]
    out, capacity_minus_one = losses("--moe-expert-capacity-factor", "-1")
    assert "> --moe-expert-capacity-factor -1: a negative factor is no capacity, every routed token kept" in out
    assert capacity_minus_one == losses()[1] and len(capacity_minus_one) == 2
