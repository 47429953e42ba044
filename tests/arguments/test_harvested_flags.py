"""Every flag that Megatron-LM, Megatron-DeepSpeed, DeepSpeedExamples' Megatron forks and DeepSpeed define
(harvested into arguments/megatron/flags_harvested.json by scripts/tools/harvest_megatron_flags.py) is honoured,
an alias of ours, accepted with no effect on the math (said in one line, with the reason), accepted at
its no-op value, or refused in one line with what to use -- never "unrecognized arguments"."""

import argparse
import difflib

import pytest

from arguments.config import ConfigError
from arguments.flag_equivalents import nearest_flag, unknown_flags_message
from arguments.megatron.flag_classes import (
    AT_VALUE,
    CLASS_OF,
    FORK_AT_VALUE,
    NO_EFFECT_CLASS,
    NO_PIPELINE_SPLIT,
    NOT_IN_MOE,
    REFUSED_CLASS,
)
from arguments.megatron.flags import NO_EFFECT_LINE, classify_harvested
from arguments.megatron.harvested_flags import harvested, harvested_options
from arguments.parser import build_parser, parse_arguments, parse_config

# Issue 22's schedule, exit and vocabulary flags, with Megatron's other spellings of them: all ours.
LEADS_LIST = ("--train-samples", "--lr-decay-samples", "--lr-warmup-samples", "--train-tokens", "--lr-decay-tokens",
              "--lr-warmup-tokens", "--override-opt_param-scheduler", "--use-checkpoint-opt_param-scheduler",
              "--kill-switch-path", "--pad-vocab-size-to", "--override-opt-param-scheduler",
              "--use-checkpoint-opt-param-scheduler", "--override-lr-scheduler", "--use-checkpoint-lr-scheduler",
              "--kill-switch-file", "--padded-vocab-size", "--no-pad-vocab-size", "--disable-pad-vocab-size",
              "--exit-duration-in-mins", "--exit-interval", "--init-method-std", "--lr-warmup-init")


@pytest.fixture(scope="module")
def parser():
    return build_parser()


@pytest.fixture(scope="module")
def classes(parser):
    return classify_harvested(parser)


def test_the_data_file_names_its_sources():
    data = harvested()
    repositories = {source["repository"] for source in data["sources"]}
    assert {"NVIDIA/Megatron-LM", "microsoft/Megatron-DeepSpeed", "bigscience-workshop/Megatron-DeepSpeed",
            "microsoft/DeepSpeedExamples", "microsoft/DeepSpeed"} <= repositories
    assert all(len(source["commit"]) == 40 and source["option_strings"] > 0 for source in data["sources"])
    assert len(data["flags"]) > 1000
    labels = {source["label"] for source in data["sources"]}
    assert all(set(entry["sources"]) <= labels for entry in data["flags"].values())


def test_every_harvested_flag_is_classified(classes):
    """A harvested name in no class fails here: classify it in arguments/megatron/flag_classes.py (or make it
    an alias in arguments/megatron/flags.py) after re-running scripts/tools/harvest_megatron_flags.sh."""
    assert [option for option in harvested_options() if option not in classes] == []


def test_the_class_tables_name_only_harvested_flags_that_are_not_ours(parser):
    assert sorted(set(CLASS_OF) - set(harvested_options())) == []  # a typo in the tables
    from arguments.megatron.harvested_flags import add_harvested
    from arguments.option_table import OptionTable
    bare = argparse.ArgumentParser()
    bare.option_table = OptionTable()
    generated = set(add_harvested(bare))
    ours = {option for option in parser._option_string_actions
            if parser._option_string_actions[option].dest != option}
    assert generated == set(CLASS_OF) and not generated & ours


def test_the_schedule_exit_and_vocabulary_flags_are_ours(classes):
    assert {option: classes[option] for option in LEADS_LIST if classes[option] not in ("honoured", "alias")} == {}


def test_class_counts(classes):
    counts = {kind: sum(1 for value in classes.values() if value == kind) for kind in set(classes.values())}
    assert counts["honoured"] > 60 and counts["alias"] > 30 and counts[NO_EFFECT_CLASS] > 500
    assert counts[REFUSED_CLASS] > 50 and counts["at-value"] == len(AT_VALUE)


# ---- (b) every harvested flag with a value of its harvested shape --------------------------------------

# Flags whose harvested choices are an expression (an enum's names), not a list: a value from that enum.
# Megatron-LM's InferenceCudaGraphScope (none, layer, block); "none" is the one it allows with --cuda-graph-impl none.
EXPRESSION_CHOICE = {"--inference-cuda-graph-scope": "none"}


def sample_values(option):
    """A value list that the first source's parser accepts for `option`."""
    shape = harvested()["flags"][option]["shapes"][0]
    if shape["action"] in ("store_true", "store_false", "store_const", "BooleanOptionalAction", "count"):
        return []
    if option in EXPRESSION_CHOICE:
        return [EXPRESSION_CHOICE[option]]
    choices = shape.get("choices")
    value = (str(choices[0]) if isinstance(choices, list) and choices and choices[0] is not None
             else {"int": "1", "float": "0.5"}.get(shape.get("type"), "x"))
    nargs = shape.get("nargs")
    return [value] * (nargs if isinstance(nargs, int) else 1)


def test_no_harvested_flag_is_unrecognized(parser):
    """Each flag alone, through the parser pretrain_gpt.py uses: argparse may refuse a value it does not
    take (an invalid choice of one of our flags), never the flag."""
    for option in harvested_options():
        argv = [option, *sample_values(option)]
        try:
            _, unknown = parser.parse_known_args(argv)
        except ConfigError as error:
            assert "unrecognized" not in str(error) and option in str(error), (argv, str(error))
            continue
        assert unknown == [], argv


def no_effect_argv():
    argv = []
    for option, (kind, _) in CLASS_OF.items():
        if kind == NO_EFFECT_CLASS:
            argv += [option, *sample_values(option)]
    return argv


# What a no-effect flag needs beside it: --reuse-grad-buf-for-mxfp8-param-ag --fp8-param-gather, as Megatron-Core's
# DistributedDataParallelConfig asserts (tests/arguments/test_integer_flag_bounds.py)
PARTNERS = ("--fp8-param-gather",)


def test_every_no_effect_flag_is_accepted_and_said_in_the_one_line():
    argv = [*no_effect_argv(), *PARTNERS]
    parsed = parse_arguments(argv)
    lines = [note for note in parsed.notes if note.startswith(NO_EFFECT_LINE)]
    assert len(lines) == 1 and "\n" not in lines[0]
    for option, (kind, reason) in CLASS_OF.items():
        if kind == NO_EFFECT_CLASS:
            assert option in lines[0] and reason in lines[0], option
    assert parsed.config.to_dict() == parse_config(list(PARTNERS)).to_dict()  # no setting moved


def test_at_value_flags_are_accepted_at_their_no_op_value_and_refused_elsewhere():
    settings_argv = ["--hidden-size", "128", "--num-attention-heads", "4", "--num-layers", "4",
                     "--init-method-std", "0.02"]
    # (--expert-model-parallel-size, --moe-expert-parallel-size and --expert-tensor-parallel-size are settings now:
    # parallel/config.py, tests/training/test_expert_parallel_training.py; --error-injection-rate too:
    # resilience/rerun_state.py, tests/resilience/test_rerun_state.py)
    no_op = {"--num-experts-switch": "1",
             "--remote-device": "none",
             "--weight-decay-incr-style": "constant",
             "--vocab-extra-ids": "0",
             "--num-unique-layers": "4", "--export-model-type": "GPTModel", "--export-kv-cache-quant": "none",
             "--export-real-quant-cfg": "None", "--embedding-init-method-std": "0.02"}
    other = {"--num-experts-switch": "8",
             "--remote-device": "cpu",
             "--weight-decay-incr-style": "linear", "--vocab-extra-ids": "100",
             "--num-unique-layers": "2", "--export-model-type": "MambaModel", "--export-kv-cache-quant": "fp8",
             "--export-real-quant-cfg": "fp8_real_quant", "--embedding-init-method-std": "0.01"}
    # the forks' (arguments/megatron/flag_classes.toml) are tested in tests/arguments/test_fork_flags.py
    assert set(no_op) == set(other) == {option for option, at in AT_VALUE.items()
                                        if at.refused not in (NO_PIPELINE_SPLIT, NOT_IN_MOE)
                                        and option != "--enable-expert-tensor-parallelism"
                                        and option != "--expert-tensor-parallel-size"
                                        and option not in FORK_AT_VALUE
                                        # MTP's knobs, refused where set with MTP built (tests/gpt/test_mtp.py)
                                        and not option.startswith("--mtp-")
                                        # switches accepted with FP8: tests/gpt/test_moe_router_padding.py
                                        and not option.startswith("--moe-router-padding-for-")
                                        and option not in NO_OP_WITH_SETTINGS}
    parsed = parse_arguments(settings_argv + [token for option, value in no_op.items() for token in (option, value)])
    line = next(note for note in parsed.notes if note.startswith(NO_EFFECT_LINE))
    for option, value in no_op.items():
        assert f"{option} {value}" in line and AT_VALUE[option].no_effect in line, option
    with pytest.raises(ConfigError) as error:
        parse_arguments(settings_argv + [token for option, value in other.items() for token in (option, value)])
    message = str(error.value)
    assert "\n" not in message
    for option, value in other.items():
        assert f"{option} {value}: {AT_VALUE[option].refused}" in message, option


# Issue 81 item 5's sweep: no-ops only under other settings (arguments/megatron/flag_classes.py says why), each with
# the settings where it is one and where it is not.
NO_OP_WITH_SETTINGS = {
    "--fp32-residual-connection": ([], ["--bf16"]),
    # Megatron-LM's hybrid launch flags: beside --hybrid-layer-pattern only (tests/gpt/test_hybrid_pattern.py)
    "--is-hybrid-model": (["--hybrid-layer-pattern", "*-*-"], []),
    "--spec": (["--hybrid-layer-pattern", "*-*-"], []),
}
# each one's value, where it takes one
NO_OP_VALUES = {"--spec": ["megatron.core.models.hybrid.hybrid_layer_specs", "hybrid_stack_spec"]}


@pytest.mark.parametrize("option", sorted(NO_OP_WITH_SETTINGS))
def test_flags_that_are_no_ops_under_some_settings_are_accepted_there_and_refused_elsewhere(option):
    value = NO_OP_VALUES.get(option, [])
    no_op, changes = NO_OP_WITH_SETTINGS[option]
    line = next(note for note in parse_arguments([*no_op, option, *value]).notes if note.startswith(NO_EFFECT_LINE))
    assert option in line and AT_VALUE[option].no_effect in line
    with pytest.raises(ConfigError) as error:
        parse_arguments([*changes, option, *value])
    assert f"{show(option, value)}: {AT_VALUE[option].refused}" in str(error.value)


def show(option, value):
    return " ".join([option, *value])


def test_layer_and_activation_offloading_move_the_same_values_and_have_no_effect():
    parsed = parse_arguments(["--cpu-offloading-num-layers", "2", "--fine-grained-activation-offloading"])
    line = next(note for note in parsed.notes if note.startswith(NO_EFFECT_LINE))
    assert "--cpu-offloading-num-layers 2" in line and "--fine-grained-activation-offloading" in line
    assert parsed.config.to_dict() == parse_config([]).to_dict()


def test_pipeline_split_knobs_have_no_effect_without_stages_and_are_refused_with_them():
    knobs = [option for option, at in AT_VALUE.items() if at.refused == NO_PIPELINE_SPLIT]
    assert "--pipeline-model-parallel-layout" not in knobs and "--standalone-embedding-stage" in knobs  # now built
    argv = [token for option in knobs for token in (option, *sample_values(option))]
    line = next(note for note in parse_arguments(argv).notes if note.startswith(NO_EFFECT_LINE))
    assert all(option in line for option in knobs)
    with pytest.raises(ConfigError) as error:
        parse_arguments(["--pipeline-model-parallel-size", "2", *argv])
    assert "\n" not in str(error.value)
    assert all(f"{option}" in str(error.value) for option in knobs) and NO_PIPELINE_SPLIT in str(error.value)


def test_moe_knobs_not_implemented_have_no_effect_on_a_dense_model_and_are_refused_with_experts():
    """Issue 51: Megatron-Core's MoE knobs this layer lacks change nothing without experts and are refused with
    them, each in the one line."""
    knobs = [option for option, at in AT_VALUE.items() if at.refused == NOT_IN_MOE]
    assert {"--moe-input-jitter-eps", "--moe-latent-size"} <= set(knobs)
    argv = [token for option in knobs for token in (option, *sample_values(option))]
    line = next(note for note in parse_arguments(argv).notes if note.startswith(NO_EFFECT_LINE))
    assert all(option in line for option in knobs)
    with pytest.raises(ConfigError) as error:
        parse_arguments(["--num-experts", "4", *argv])
    message = str(error.value)
    assert "\n" not in message and NOT_IN_MOE in message
    assert all(option in message for option in knobs)


def test_num_experts_in_a_megatron_deepspeed_launch_gates_as_deepspeed_moe():
    """A Megatron-DeepSpeed launch's --num-experts builds DeepSpeed-MoE (megatron/model/transformer.py there:
    MoE(k=args.topk, capacity_factor=args.moe_train_capacity_factor, eval_capacity_factor=...,
    min_capacity=args.moe_min_capacity, drop_tokens=args.moe_token_dropping, top2_2nd_expert_sampling=...) on
    every --expert-interval-th layer, get_num_experts_per_layer: `layer_num % expert_interval == 0`): its flags
    set that gating here; each side's flags beside the other gating are refused in one line, and so is an --mlp-type
    that is neither standard nor residual (PR-MoE, tests/gpt/test_pr_moe.py)."""
    parsed = parse_arguments(["--num-experts", "4", "--moe-expert-parallel-size", "1", "--no-pipeline-parallel",
                              "--deepspeed", "--topk", "2", "--moe-loss-coeff", "0.01", "--num-layers", "4",
                              "--moe-min-capacity", "2", "--disable-moe-top2-2nd-expert-sampling"])
    model = parsed.config.model
    assert model.experts.deepspeed.gating == "deepspeed" and model.moe_layers() == (False, True, False, True)
    moe = model.moe
    assert (moe.router_topk, moe.deepspeed.loss_coeff, moe.deepspeed.min_capacity, moe.deepspeed.top2_2nd_expert_sampling, moe.deepspeed.token_dropping) == \
           (2, 0.01, 2, False, True)
    assert "a Megatron-DeepSpeed launch (--deepspeed)" in parsed.config.sources["moe_gating"].describe()
    # our own flags the fork shares (--zero-stage) do not make a launch the fork's: Megatron-Core's router
    assert parse_arguments(["--num-experts", "4", "--zero-stage", "2"]).config.model.experts.deepspeed.gating == "megatron"
    for argv, named in ((["--num-experts", "4", "--topk", "2"], "--topk set DeepSpeed-MoE's gating"),
                        (["--num-experts", "4", "--moe-gating", "deepspeed", "--moe-router-topk", "1"],
                         "--moe-router-topk set Megatron-Core's router"),
                        (["--num-experts", "4", "--moe-gating", "deepspeed", "--mlp-type", "pyramid"],
                         "--mlp-type pyramid is not one of standard, residual")):
        with pytest.raises(ConfigError) as error:
            parse_arguments(argv)
        assert named in str(error.value) and "\n" not in str(error.value)


def test_refused_flags_end_in_their_one_line_reason():
    argv, expected = [], []
    for option, (kind, reason) in CLASS_OF.items():
        if kind == REFUSED_CLASS:
            values = sample_values(option)
            argv += [option, *values]
            expected.append(f"{' '.join([option, *values])}: {reason}")
    with pytest.raises(ConfigError) as error:
        parse_arguments(argv)
    message = str(error.value)
    assert "\n" not in message and "unrecognized" not in message
    assert [clause for clause in expected if clause not in message] == []


# ---- (c) the flags the issue names ----------------------------------------------------------------------

def test_the_issues_flags_are_accepted_in_the_one_no_effect_line():
    parsed = parse_arguments(["--data-impl", "mmap", "--num-experts-switch", "1", "--moe-input-jitter-eps", "0.01",
                              "--no-query-key-layer-scaling",
                              "--ds-sequence-parallel-size", "1", "--log-timers-to-tensorboard",
                              "--no-pipeline-parallel", "--tensorboard-queue-size", "1",
                              "--no-async-tensor-model-parallel-allreduce", "--scattered-embeddings",
                              "--split-transformers", "--log-batch-size-to-tensorboard",
                              "--log-validation-ppl-to-tensorboard", "--log-optimizer-states-to-tensorboard"])
    lines = [note for note in parsed.notes if note.startswith(NO_EFFECT_LINE)]
    assert len(lines) == 1
    line = lines[0]
    assert "--data-impl mmap (every implementation (mmap, cached, lazy, infer) reads the same .bin/.idx" in line
    assert "--num-experts-switch 1 (one expert is the dense model; the MoE loss coefficients then have no effect)" in line
    assert "--moe-input-jitter-eps 0.01 (mixture-of-experts knob" in line
    assert "--ds-sequence-parallel-size 1 (sequence parallelism over 1 rank is none)" in line
    assert "--log-timers-to-tensorboard, --tensorboard-queue-size 1, --log-batch-size-to-tensorboard, " \
           "--log-validation-ppl-to-tensorboard, --log-optimizer-states-to-tensorboard (logging:" in line
    for flag in ("--no-query-key-layer-scaling", "--no-pipeline-parallel", "--no-async-tensor-model-parallel-allreduce",
                 "--scattered-embeddings", "--split-transformers"):
        assert flag in line


@pytest.mark.parametrize("theirs, ours", [
    (["--zero-reduce-bucket-size", "1e7"], ["--reduce-bucket-size", "1e7"]),
    (["--zero-allgather-bucket-size", "1e7"], ["--allgather-bucket-size", "1e7"]),
    (["--zero-contigious-gradients"], ["--contiguous-gradients"]),
    (["--zero-reduce-scatter", "--no-reduce-scatter", "--zero-reduce-scatter"], ["--reduce-scatter"]),
    (["--deepscale_config", "stage2"], ["--zero-config", "stage2"]),
    (["--norm-epsilon", "1e-6"], ["--layernorm-epsilon", "1e-6"]),
    (["--distribute-saved-activations", "--checkpoint-activations"],
     ["--partition-activations", "--checkpoint-activations"]),
    (["--min-scale", "2"], ["--min-loss-scale", "2"]),
    (["--openai-gelu", "--activation", "gelu", "--openai-gelu"], ["--activation", "gelu_tanh"]),
    (["--use-flash-attn-v2"], ["--attention-backend", "flash"]),
    (["--bf16", "--grad-reduce-in-bf16"], ["--bf16", "--no-accumulate-allreduce-grads-in-fp32"]),
    (["--activations-checkpoint-method", "uniform", "--checkpoint-activations"], ["--checkpoint-activations"]),
])
def test_aliases_set_what_our_flag_sets(theirs, ours):
    assert parse_config(theirs).to_dict() == parse_config(ours).to_dict()


def test_the_deepspeed_fork_zero_spellings_are_aliases_and_show_as_such():
    config = parse_config(["--zero-reduce-bucket-size", "1e7"])
    assert config.zero.reduce_bucket_size == 10**7
    assert config.sources["reduce_bucket_size"].describe().startswith(
        "--zero-reduce-bucket-size (DeepSpeed-Megatron's name for --reduce-bucket-size)")


# ---- (d) hints only where the match is real -----------------------------------------------------------------

def test_no_wrong_hints_for_megatron_flags(parser):
    for flag, wrong in (("--data-impl", "--data-path"), ("--override-opt_param-scheduler", "--overlap-param-gather"),
                        ("--no-async-tensor-model-parallel-allreduce", "--tensor-model-parallel-size")):
        try:
            parse_arguments([flag, *sample_values(flag)])
        except ConfigError as error:
            assert wrong not in str(error) and "did you mean" not in str(error)
        own = [option for option in parser._option_string_actions
               if option.startswith("--") and parser._option_string_actions[option].dest != option]
        if flag not in own:  # (--override-opt_param-scheduler is ours now, with its hyphenated spelling)
            assert nearest_flag(flag, own) is None  # even against our own flags alone
        assert difflib.get_close_matches(flag, [wrong], cutoff=0.6)  # the old cutoff matched it


def test_unknown_flags_are_listed_together_with_real_hints_only(parser):
    message = unknown_flags_message(["--num-layer", "2", "--hidden_size", "--data-imp", "x", "--zzzz"], parser)
    assert message == ("unrecognized arguments: --num-layer 2 --hidden_size --data-imp x --zzzz (--num-layer: did "
                       "you mean --num-layers?; --hidden_size: did you mean --hidden-size?; --data-imp: did you mean "
                       "--data-impl?; --zzzz: no flag of that name or near it (python pretrain_gpt.py --help lists "
                       "them))")


def test_a_flag_cut_short_at_a_hyphen_is_answered_with_the_flags_it_begins(parser):
    """Issue 94 item 6e: `--lr-decay` was "no flag of that name or near it"; a value typed after it keeps only the
    flags that could take it (--lr-decay-iters, -samples and -tokens take numbers)."""
    assert unknown_flags_message(["--lr-decay", "cosine"], parser).endswith(
        "(--lr-decay: did you mean --lr-decay-style?)")
    assert unknown_flags_message(["--lr-decay"], parser).endswith(
        "(--lr-decay: did you mean one of --lr-decay-iters, --lr-decay-style, --lr-decay-samples or "
        "--lr-decay-tokens?)")
    assert unknown_flags_message(["--tensor-model=2"], parser).endswith(  # not difflib's --test-mode
        "(--tensor-model: did you mean --tensor-model-parallel-size?)")


def test_print_config_shows_each_given_flag_with_what_it_does(capsys, monkeypatch):
    import pretrain_gpt

    monkeypatch.setattr(pretrain_gpt, "initialize_grid", lambda *args, **kwargs: pytest.fail("training started"))
    assert pretrain_gpt.main(["--print-config", "--data-impl", "mmap", "--num-experts-switch", "1",
                              "--zero-reduce-bucket-size", "1e7"]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("  ")]
    assert any(row.split()[:2] == ["--data-impl", "mmap"] and "# accepted, no effect on the math: every "
               "implementation" in row for row in rows)
    assert any(row.split()[:2] == ["--num-experts-switch", "1"] and "one expert is the dense model" in row for row in rows)
    assert any(row.split()[:2] == ["reduce_bucket_size", "10000000"] and "--zero-reduce-bucket-size (DeepSpeed-"
               "Megatron's name for --reduce-bucket-size)" in row for row in rows)


def test_expert_tensor_parallel_size_is_no_effect_on_a_dense_model_and_any_size_with_experts():
    """Megatron-LM reads --expert-tensor-parallel-size for the experts' grid only (megatron/core/parallel_state.py
    initialize_model_parallel builds the expert groups from it; a dense model has none), so its dense
    functional tests give it (gpt3_mcore_te_tp2_pp2_cp2_etp4_*): accepted there; with experts any size the
    parse takes, as initialize_model_parallel does (ETP 2 at TP 1, ETP 4 at TP 2: whether it divides the ranks
    is the grid's check, parallel/mesh.py), and one that does not split the experts' ffn evenly is refused."""
    settings_argv = ["--hidden-size", "128", "--num-attention-heads", "4", "--num-layers", "4"]
    dense = parse_arguments(settings_argv + ["--expert-tensor-parallel-size", "4"])
    assert dense.config.parallel.expert_tensor_parallel_size is None
    assert any("--expert-tensor-parallel-size 4: no effect on a dense model" in note for note in dense.notes)
    for etp, tp in (("1", []), ("2", []), ("2", ["--tensor-model-parallel-size", "2", "--sequence-parallel"]),
                    ("4", ["--tensor-model-parallel-size", "2", "--sequence-parallel"])):
        parsed = parse_arguments(settings_argv + ["--num-experts", "4", "--expert-tensor-parallel-size", etp] + tp)
        assert parsed.config.parallel.expert_tensor_parallel_size == int(etp)
    with pytest.raises(ConfigError, match="--moe-ffn-hidden-size 6 is not divisible by --expert-tensor-parallel-size 4"):
        parse_arguments(settings_argv + ["--num-experts", "4", "--expert-tensor-parallel-size", "4",
                                         "--moe-ffn-hidden-size", "6"])


def test_use_mup_is_refused_naming_megatrons_mup_rules():
    """--use-mup (Megatron-LM's functional test gpt3_mcore_te_tp1_pp1_mup) was refused as "every block is the same
    GPT-2 block", which is not what muP is. Megatron-Core's muP (transformer_config.py __post_init__: width_mult =
    hidden_size / mup_base_hidden_size, init_method std / sqrt(width_mult), softmax_scale 1 / kv_channels ** 1.0,
    mup_output_mult 1 / width_mult; utils.py mup_scaled_init_method_normal; optimizer/__init__.py
    get_mup_config_overrides: hidden matrices' Adam lr and eps / width_mult) is not built here: the refusal says so."""
    with pytest.raises(ConfigError) as error:
        parse_config(["--use-mup", "--mup-base-hidden-size", "256"])
    message = str(error.value)
    assert "--use-mup: not implemented: Megatron-Core's maximal update parameterization (muP)" in message
    assert "softmax scale 1/d_head" in message and "\n" not in message


def test_per_token_loss_is_ours_with_any_loss_mask():
    """Megatron-LM's --calculate-per-token-loss divides the iteration's masked loss sum by its token count over DP x CP
    (megatron/core/pipeline_parallel/schedules.py forward_step_calc_loss leaves the sum undivided; finalize_model_grads
    scales by the all-reduced count): here too (training/per_token_loss.py), with or without a loss mask."""
    for mask in ([], ["--eod-mask-loss"], ["--goldfish-loss"]):
        parsed = parse_arguments(["--calculate-per-token-loss", *mask])
        assert parsed.config.training.calculate_per_token_loss
        assert not any("--calculate-per-token-loss" in note for note in parsed.notes), parsed.notes


