"""Megatron-LM's and DeepSpeed-Megatron's flags with their meaning: aliases land in our settings,
Megatron meanings become settings or one line said once, flags we cannot honour are refused in one
line naming the alternative, unknown flags get "did you mean", and --print-config shows it all. Every
other harvested Megatron/DeepSpeed flag: tests/arguments/test_harvested_flags.py."""

import pytest

import pretrain_gpt
from arguments.config import ConfigError
from arguments.parser import parse_arguments, parse_config

SMALL = ["--num-layers", "1", "--hidden-size", "32", "--num-attention-heads", "2", "--seq-length", "16",
         "--max-position-embeddings", "16", "--micro-batch-size", "2", "--global-batch-size", "2",
         "--train-iters", "2", "--eval-iters", "0", "--tokenizer-vocab-size", "300", "--device", "cpu"]


@pytest.mark.parametrize("theirs, ours", [
    (["--batch-size", "3"], ["--micro-batch-size", "3"]),
    (["--model-parallel-size", "2"], ["--tensor-model-parallel-size", "2"]),
    (["--warmup", "0.05"], ["--lr-warmup-fraction", "0.05"]),
    (["--checkpoint-in-cpu"], ["--cpu-checkpointing"]),
    (["--contigious-checkpointing"], ["--contiguous-checkpointing"]),
    (["--synchronize-each-layer"], ["--synchronize-checkpoint-boundary"]),
    (["--train-data", "some/prefix"], ["--data-path", "some/prefix"]),
    (["--tokenizer-model", "tok.json"], ["--tokenizer-file", "tok.json"]),
    (["--recompute-num-layers", "2"], ["--checkpoint-num-layers", "2"]),
    (["--wandb-exp-name", "exp"], ["--wandb-run-name", "exp"]),
    (["--no-overlap-grad-reduce"], ["--no-overlap-comm"]),
    (["--deepspeed_config", "stage1"], ["--zero-config", "stage1"]),
    (["--deepspeed-config", "stage1"], ["--zero-config", "stage1"]),
])
def test_an_alias_sets_the_same_setting_as_our_flag(theirs, ours):
    extra = ["--checkpoint-activations"] if ours[0] in ("--cpu-checkpointing", "--contiguous-checkpointing",
                                                        "--synchronize-checkpoint-boundary") else []
    extra += ["--tokenizer-file", "t.json"] if ours[0] == "--data-path" else []
    theirs_config, ours_config = parse_config(extra + theirs), parse_config(extra + ours)
    assert theirs_config.to_dict() == ours_config.to_dict()
    assert theirs_config.to_dict() != parse_config(extra).to_dict()  # the alias did set something
    if ours[0] != "--zero-config":  # a JSON's settings name the JSON key as their source
        assert any(source.origin.startswith(theirs[0]) for source in theirs_config.sources.values())


def test_megatron_meanings_become_our_settings():
    config = parse_config(["--use-distributed-optimizer"])
    assert config.zero.stage == 1 and "--use-distributed-optimizer" in config.sources["stage"].describe()
    assert parse_config(["--use-distributed-optimizer", "--zero-stage", "3"]).zero.stage == 3  # shards it too
    config = parse_config(["--recompute-granularity", "full", "--recompute-method", "uniform",
                           "--recompute-num-layers", "2"])
    assert config.activations.checkpoint_activations and config.activations.checkpoint_num_layers == 2
    # Megatron's block method, once refused here: the first N layers of each model chunk (tests/training/
    # test_block_recompute.py trains it); Megatron-LM 2.x's spelling too
    for spelling in ("--recompute-method", "--activations-checkpoint-method"):
        block = parse_config(["--recompute-granularity", "full", spelling, "block", "--recompute-num-layers", "2"])
        assert block.activations.recompute_method == "block" and block.activations.checkpoint_num_layers == 2
    assert parse_config(["--use-flash-attn"]).model.attention.attention_backend == "flash"
    assert parse_config(["--lr-warmup-fraction", "0.1"]).optimizer.lr_warmup_fraction == 0.1


def test_selective_recompute_and_no_effect_flags_are_said_once():
    parsed = parse_arguments(["--recompute-activations", "--no-masked-softmax-fusion", "--deepspeed",
                              "--distributed-backend", "nccl", "--pipeline-model-parallel-size", "1"])
    assert not parsed.config.activations.checkpoint_activations  # selective: nothing to checkpoint here
    notes = "\n".join(parsed.notes)
    assert "--recompute-activations selective: Megatron's selective recompute" in notes
    no_effect = [note for note in parsed.notes if note.startswith("Megatron-LM and DeepSpeed flags accepted with "
                                                                   "no effect on the math: ")]
    assert len(no_effect) == 1  # every flag with no effect, in one line
    assert "--deepspeed (DeepSpeed's engine switch" in no_effect[0]
    assert "--no-masked-softmax-fusion (SDPA computes the causal softmax" in no_effect[0]
    assert "--distributed-backend nccl: accepted; the backend follows the device" in notes
    # --pipeline-model-parallel-size is a setting now (pipeline stages, training/pipeline_step.py): no note
    assert len(parsed.notes) == 3 and parsed.config.parallel.pipeline_model_parallel_size == 1


def test_flags_that_would_change_the_math_are_refused_in_one_line_naming_the_alternative():
    with pytest.raises(ConfigError) as error:
        parse_config(["--pipeline-model-parallel-size", "2", "--pipeline-model-parallel-split-rank", "1",
                      "--use-mup"])
    message = str(error.value)
    assert "\n" not in message
    assert "--pipeline-model-parallel-split-rank 1: a pipeline split or schedule not implemented: with " \
           "--pipeline-model-parallel-size > 1 the layers split evenly" in message
    assert "--use-mup: not implemented: Megatron-Core's maximal update parameterization (muP)" in message
    with pytest.raises(ConfigError, match="--use-distributed-optimizer .ZeRO stage 1. contradicts ZeRO stage 0"):
        parse_config(["--use-distributed-optimizer", "--zero-stage", "0"])


def test_unknown_flags_get_did_you_mean_with_the_refused_megatron_flags_all_at_once():
    with pytest.raises(ConfigError) as error:
        parse_config(["--num-layer", "2", "--lr-warmup-samples", "100", "--apply-residual-connection-post-layernorm", "--zzzzzz"])
    assert str(error.value) == (
        "3 problems: (1) unrecognized arguments: --num-layer 2 --zzzzzz (--num-layer: did you mean --num-layers?; "
        "--zzzzzz: no flag of that name or near it (python pretrain_gpt.py --help lists them)); (2) --apply-residual-connection-post-layernorm: "
        "not implemented: the residual here is each sublayer's input; Megatron-LM's legacy models and "
        "Megatron-DeepSpeed take it after the input norm (BERT's order), while Megatron-Core never reads the flag: "
        "drop it; (3) "
        "--lr-warmup-samples 100 on the command line is a length in samples, and this run counts iterations "
        "(--train-iters 250, preset tiny (configs/models/tiny.yaml)): give --train-samples to count samples, or drop "
        "--lr-warmup-samples (Megatron-LM refuses the two kinds together)")


def test_an_error_about_a_presets_value_names_the_preset():
    """Before: `--lr 6e-5` failed on the tiny preset's hidden min_lr 1e-4, naming neither."""
    with pytest.raises(ConfigError) as error:
        parse_config(["--lr", "6e-5"])
    assert str(error.value) == ("need 0 <= --min-lr (0.0001) <= --lr (6e-05) and --lr > 0 (--min-lr 0.0001 comes from "
                                "the preset tiny (configs/models/tiny.yaml); set it on the command line to change it)")
    assert parse_config(["--lr", "6e-5", "--min-lr", "6e-6"]).optimizer.lr == 6e-5


def test_warmup_fraction_and_iters_given_together_are_refused():
    with pytest.raises(ConfigError, match="give one of --lr-warmup-fraction and --lr-warmup-iters"):
        parse_config(["--warmup", "0.01", "--lr-warmup-iters", "5"])
    assert parse_config(["--warmup", "0.01"]).optimizer.lr_warmup_iters == 20  # the preset's, replaced


def test_print_config_shows_each_value_and_its_source_and_exits_without_training(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(pretrain_gpt, "initialize_grid", lambda *args, **kwargs: pytest.fail("training started"))
    code = pretrain_gpt.main(["--print-config", "--batch-size", "4", "--lr", "2e-4", "--deepspeed",
                              "--use-distributed-optimizer", "--zero-config", "stage2"])
    out = capsys.readouterr().out
    assert code == 0
    lines = {line.split()[0]: line for line in out.splitlines() if line.startswith("  ")}
    assert all("  # " in line for line in lines.values())
    assert lines["micro_batch_size"].split()[1] == "4" and "--batch-size (DeepSpeed-Megatron's name" in lines["micro_batch_size"]
    assert lines["lr"].split()[1] == "0.0002" and "--lr (command line)" in lines["lr"]
    assert lines["num_layers"].split()[1] == "4" and "preset tiny" in lines["num_layers"]
    assert "stage2.json: zero_optimization.stage" in lines["stage"]
    assert lines["weight_decay"].endswith("default")
    assert "accepted, no effect on the math" in lines["--deepspeed"]
    assert "bf16.enabled" in lines and "honoured: --bf16" in lines["bf16.enabled"]


def test_print_configs_model_rows_keep_the_flat_class_order_and_name_each_setting_once():
    """Issue 91: the model's settings became sections, its --print-config rows kept their order (a logged
    configuration diffs line for line across the change): the first rows as the flat class had them, the rest in
    their sections' order; each setting printed once, none lost."""
    from arguments.print_config import FLAT_MODEL_ORDER, format_config
    from base.options import setting_values

    parsed = parse_arguments(["--print-config", "--swiglu", "--num-query-groups", "2"])
    text = format_config(parsed).splitlines()
    rows = [line.split()[0] for line in text[text.index("model") + 1:text.index("optimizer")]]
    settings = list(setting_values(parsed.config.model))
    assert sorted(rows) == sorted(settings) and len(rows) == len(set(rows))
    assert tuple(rows[:len(FLAT_MODEL_ORDER)]) == FLAT_MODEL_ORDER
    assert rows[len(FLAT_MODEL_ORDER):] == [name for name in settings if name not in FLAT_MODEL_ORDER]
    assert rows[:3] == ["num_layers", "hybrid_layer_pattern", "hidden_size"]
    assert rows.index("attention_dropout") < rows.index("layernorm_epsilon") < rows.index("num_query_groups")


def test_the_docs_table_names_every_megatron_and_deepspeed_flag():
    import re

    from arguments.megatron.flags import ALIASES, MEANINGS
    from tests.readme import doc_section

    section = doc_section("docs/coming-from-megatron-deepspeed.md", "Coming from Megatron-LM / DeepSpeed")
    flags = list(ALIASES) + [option for meaning in MEANINGS for option in meaning.options[:1]]
    assert [flag for flag in flags if not re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", section)] == []


def test_modelopt_distillation_flags_are_named_and_refused_not_unrecognized():
    """Megatron-LM's pretrain_gpt.py adds ModelOpt's flags (megatron/post_training/arguments.py, add_modelopt_args)
    when nvidia-modelopt is installed, as its gpt3_mcore_te_tp2_pp1_modelopt_distill_resume test does: distillation
    from a teacher changes the loss and is refused in one line that says what it is; the layer-spec switch beside it
    computes the same model and is accepted."""
    with pytest.raises(ConfigError) as error:
        parse_config(["--export-te-mcore-model", "--export-kd-teacher-load", "teacher/", "--export-kd-cfg", "kd.yaml"])
    message = str(error.value)
    assert "unrecognized" not in message and "\n" not in message
    assert "--export-kd-teacher-load teacher/: NVIDIA ModelOpt's post-training" in message
    assert "--export-kd-cfg kd.yaml" in message and "--export-te-mcore-model" not in message
    assert parse_config(["--export-te-mcore-model"]).model.num_layers == 4


def test_main_grads_dtype_bf16_is_bf16_gradients_as_megatron_validates_it():
    """Megatron-LM's validate_args under --bf16 (megatron/training/arguments.py): main_grads_dtype bf16 leaves
    accumulate_allreduce_grads_in_fp32 off (gradients accumulate and reduce in bf16), and it asserts
    "--main-grads-dtype can only be fp32 when --accumulate-allreduce-grads-in-fp32 is set". Before, bf16 was refused."""
    aware = ["--use-precision-aware-optimizer", "--use-distributed-optimizer"]
    assert parse_config(aware + ["--bf16", "--main-grads-dtype", "bf16"]).training.gradient_precision == "bf16"
    assert parse_config(["--bf16", "--main-grads-dtype", "fp32"]).training.gradient_precision == "fp32"
    with pytest.raises(ConfigError, match="can only be fp32|Megatron-LM asserts the main gradients are fp32"):
        parse_config(aware + ["--bf16", "--main-grads-dtype", "bf16", "--accumulate-allreduce-grads-in-fp32"])
    with pytest.raises(ConfigError, match="--main-grads-dtype bf16 without --bf16"):
        parse_config(aware + ["--main-grads-dtype", "bf16"])


def test_precision_aware_optimizer_flags_follow_megatrons_rules(tmp_path, capsys):
    """Megatron-Core's OptimizerConfig.__post_init__ (megatron/core/optimizer/optimizer_config.py) asserts, without
    use_precision_aware_optimizer, "main_grads_dtype can only be fp32 when not using precision-aware optimizer" (and
    so for main_params_dtype, exp_avg_dtype, exp_avg_sq_dtype); get_megatron_optimizer
    (megatron/core/optimizer/__init__.py) raises "--use-precision-aware-optimizer only supported with distributed
    optimizer". swiss-ai's submit-llama3-8b.sh gives --use-precision-aware-optimizer --main-grads-dtype bf16 beside
    --use-distributed-optimizer. fp32 states (the defaults) are the AdamW here; lower ones (TransformerEngine's
    FusedAdam storage, megatron/core/optimizer/__init__.py: exp_avg_dtype, exp_avg_sq_dtype, master_weight_dtype)
    are refused in one line. Before, --main-grads-dtype bf16 needed no flag and the flag needed no distributed
    optimizer."""
    aware = ["--use-precision-aware-optimizer", "--use-distributed-optimizer"]
    parsed = parse_arguments(aware + ["--bf16", "--main-grads-dtype", "bf16", "--main-params-dtype", "fp32",
                                      "--exp-avg-dtype", "fp32", "--exp-avg-sq-dtype", "fp32"])
    assert parsed.config.zero.stage == 1 and parsed.config.training.gradient_precision == "bf16"
    assert ("--use-precision-aware-optimizer, --main-params-dtype fp32, --exp-avg-dtype fp32, --exp-avg-sq-dtype fp32: "
            "accepted; the master weights and Adam moments are fp32 here") in "\n".join(parsed.notes)
    assert parse_config(["--use-precision-aware-optimizer", "--zero-stage", "3"]).zero.stage == 3
    assert parse_config(["--use-precision-aware-optimizer", "--use-megatron-fsdp"]).zero.stage == 3
    assert parse_config(["--exp-avg-dtype", "fp32", "--main-params-dtype", "fp32"]).zero.stage == 0
    with pytest.raises(ConfigError, match="--main-grads-dtype bf16 without --use-precision-aware-optimizer"):
        parse_config(["--bf16", "--main-grads-dtype", "bf16"])
    with pytest.raises(ConfigError, match="^--use-precision-aware-optimizer without the distributed optimizer: "
                                          "Megatron-LM supports it only with distributed optimizer"):
        parse_config(["--use-precision-aware-optimizer"])
    with pytest.raises(ConfigError, match="--use-precision-aware-optimizer with --use-torch-fsdp2"):
        parse_config(["--use-precision-aware-optimizer", "--use-torch-fsdp2", "--untie-embeddings-and-output-weights"])
    with pytest.raises(ConfigError) as error:
        parse_config(aware + ["--main-params-dtype", "fp16", "--exp-avg-dtype", "fp16", "--exp-avg-sq-dtype", "fp8"])
    message = str(error.value)
    assert "\n" not in message and "only with --use-precision-aware-optimizer" not in message
    for clause in ("--main-params-dtype fp16: master weights stored in fp16 are not implemented",
                   "--exp-avg-dtype fp16: Adam first moments stored in fp16 are not implemented",
                   "--exp-avg-sq-dtype fp8: Adam second moments stored in fp8 are not implemented"):
        assert clause in message
    with pytest.raises(ConfigError, match="--exp-avg-dtype fp16: .* only with --use-precision-aware-optimizer"):
        parse_config(["--use-distributed-optimizer", "--exp-avg-dtype", "fp16"])
    code = pretrain_gpt.main(aware + ["--bf16", "--exp-avg-dtype", "fp16", "--data-cache-dir", str(tmp_path)])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "--exp-avg-dtype fp16: Adam first moments" in err


def test_bf16_moments_are_taken_with_the_precision_aware_optimizer_and_adam_only(tmp_path, capsys):
    """--exp-avg-dtype bf16 / --exp-avg-sq-dtype bf16 with --use-precision-aware-optimizer (Megatron-Core's
    OptimizerConfig asserts the flag for any dtype other than fp32) store the moments as bf16
    (zero/precision_aware.py); before, they were refused. Without the flag they stay refused, as are bf16 moments of
    --optimizer ademamix (swiss-ai's fork steps AdEMAMix as a torch optimizer with fp32 states, not through
    TransformerEngine's FusedAdam), each in one line."""
    aware = ["--use-precision-aware-optimizer", "--use-distributed-optimizer"]
    parsed = parse_arguments(aware + ["--bf16", "--exp-avg-dtype", "bf16", "--exp-avg-sq-dtype", "bf16"])
    optimizer = parsed.config.optimizer
    assert (optimizer.algorithms.exp_avg_dtype, optimizer.algorithms.exp_avg_sq_dtype, parsed.config.zero.stage) == ("bf16", "bf16", 1)
    assert ("--exp-avg-dtype bf16, --exp-avg-sq-dtype bf16: accepted; the master weights are fp32 and the Adam "
            "moments first bf16, second bf16") in "\n".join(parsed.notes)
    assert parse_config(aware + ["--exp-avg-sq-dtype", "bf16"]).optimizer.algorithms.exp_avg_dtype == "fp32"
    with pytest.raises(ConfigError, match="^--exp-avg-dtype bf16 without --use-precision-aware-optimizer"):
        parse_config(["--use-distributed-optimizer", "--exp-avg-dtype", "bf16"])
    with pytest.raises(ConfigError, match="^--exp-avg-sq-dtype bf16 with --optimizer ademamix"):
        parse_config(aware + ["--optimizer", "ademamix", "--exp-avg-sq-dtype", "bf16"])
    code = pretrain_gpt.main(["--use-distributed-optimizer", "--exp-avg-dtype", "bf16", "--data-cache-dir",
                              str(tmp_path)])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "without --use-precision-aware-optimizer" in err


def test_document_masking_flags_are_read_and_inter_document_masking_refused():
    """Megatron-LM's --reset-position-ids, --reset-attention-mask and --eod-mask-loss (megatron/training/arguments.py
    _add_data_args; built by megatron/core/datasets/gpt_dataset.py _get_ltor_masks_and_position_ids) are the run's
    document masking (data/documents.py); before, all three were refused. --dataloader-inter-document-masking, whose
    documents come from the dataset's index as cu_seqlens, stays refused."""
    data = parse_config(["--reset-position-ids", "--reset-attention-mask", "--eod-mask-loss"]).data
    assert (data.reset_position_ids, data.reset_attention_mask, data.eod_mask_loss) == (True, True, True)
    data = parse_config([]).data
    assert (data.reset_position_ids, data.reset_attention_mask, data.eod_mask_loss) == (False, False, False)
    with pytest.raises(ConfigError, match="--dataloader-inter-document-masking: not implemented"):
        parse_config(["--dataloader-inter-document-masking"])


@pytest.mark.parametrize("typed", ["--recompute-num-layers", "--checkpoint-num-layers"])
def test_a_refusal_names_the_flag_as_typed(typed):
    """A check names a setting by its first option string; the line names the spelling the user typed (issue 90:
    `--recompute-num-layers 0` was refused as `--checkpoint-num-layers must be at least 1`)."""
    with pytest.raises(ConfigError) as refused:
        parse_config(["--recompute-granularity", "full", "--recompute-method", "uniform", typed, "0"])
    # (0 is taken under --recompute-method block, as Megatron-LM takes it: tests/arguments/test_integer_flag_bounds.py)
    assert str(refused.value).startswith(f"{typed} must be at least 1") and str(refused.value).endswith("got 0")
    other = {"--recompute-num-layers", "--checkpoint-num-layers"} - {typed}
    assert other.pop() not in str(refused.value)
