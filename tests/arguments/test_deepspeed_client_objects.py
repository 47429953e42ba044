"""Issue 34, point 2 (every precedence row re-checked): under a Megatron launch with a DeepSpeed JSON, the JSON's
`optimizer` block (and, where the real pair's DeepSpeed prefers Megatron's scheduler, its `scheduler` block)
sets nothing, since the real pair never reads it; each value of theirs that differs from what runs is named
in one warning line. Under a preset launch (DeepSpeed's own use) both blocks stay honoured. The real code:
- Megatron-DeepSpeed 4efb479d: optimizer/__init__.py get_megatron_optimizer (68-116) returns Adam(lr, weight_decay,
  betas, eps from the flags) bare under --deepspeed; training.py setup_model_and_optimizer (566-576, 606-623)
  passes it and get_optimizer_param_scheduler's scheduler to deepspeed.initialize; train_step steps
  model[0].step(lr_kwargs={'increment': ...}) (746), which a JSON WarmupLR could not take.
- DeepSpeedExamples 5c6b1c8f v1.1.5 forks: Megatron-LM-v1.1.5-ZeRO3/megatron/training.py get_optimizer (161-196,
  torch AdamW from the flags) and setup_model_and_optimizer (240-256, deepspeed.initialize(model, optimizer,
  lr_scheduler)); train_step (344) model.step(), no lr_kwargs; -3D_parallelism alike with apex Adam (157-191, 232-248).
- The 2020 fork (Megatron-LM/pretrain_gpt2.py): get_optimizer (99-120) returns FusedAdam's param_groups and
  setup_model_and_optimizer (157-174) passes those groups and no optimizer; DeepSpeed builds the JSON's optimizer
  over them, but add_param_group only setdefault()s its defaults and the fork's Adam filled every group: the JSON's
  values run nowhere.
- DeepSpeed v0.19.5 runtime/engine.py: _configure_optimizer (1982-1994) uses a client optimizer, the JSON's only
  without one (_do_sanity_check 1650-1653 likewise); _configure_lr_scheduler (1517-1529) the client scheduler
  first. Before v0.14.5 the reverse for the scheduler (v0.3.13 engine.py 433-445: "First check for scheduler in json
  configuration"; swapped by f994fb2c, PR #5846): so the forks ran the JSON's scheduler and keep it here
  (arguments/deepspeed/client_objects.py, JSON_SCHEDULER_GENERATIONS)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from arguments.config import ConfigError
from arguments.parser import parse_arguments
from arguments.print_config import format_config
from tests.arguments.test_megatron_launch_defaults import _shrunk

MODEL = ["--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "2"]
OPTIMIZER = {"type": "Adam", "params": {"lr": 0.00015, "betas": [0.8, 0.95], "eps": 1e-6, "weight_decay": 0.1}}
SCHEDULER = {"type": "WarmupDecayLR", "params": {"warmup_min_lr": 0, "warmup_max_lr": 0.0002, "warmup_num_steps": 7,
                                                 "warmup_type": "linear", "total_num_steps": 100}}


def _json(tmp_path, blocks: dict) -> str:
    path = tmp_path / "ds.json"
    path.write_text(json.dumps({"train_micro_batch_size_per_gpu": 2, **blocks}))
    return str(path)


def _not_read_warnings(parsed) -> list[str]:
    return [note for note in parsed.notes if note.startswith("warning:") and "not read" in note]


def _not_read_lines(parsed) -> list[str]:
    """The short lines (arguments/deepspeed/differences.py) naming optimizer and scheduler values not read."""
    return [line for line in parsed.config.json_differences if "not read under --deepspeed" in line]


def _row(parsed, name: str) -> str:
    return next(line for line in format_config(parsed).splitlines() if line.split()[:1] == [name])


def test_a_megatron_deepspeed_launch_reads_neither_block_and_says_so_in_one_line(tmp_path):
    ds = _json(tmp_path, {"optimizer": OPTIMIZER, "scheduler": SCHEDULER})
    parsed = parse_arguments([*MODEL, "--no-pipeline-parallel", "--deepspeed", "--deepspeed_config", ds])
    assert parsed.megatron_generation == "megatron-deepspeed"
    optimizer = parsed.config.optimizer
    # Megatron's defaults (megatron/arguments.py: --adam-beta1 0.9, --adam-beta2 0.999, --adam-eps 1e-08,
    # --weight-decay 0.01, --lr-decay-style linear, --lr-warmup-iters 0), not the JSON's
    assert (optimizer.adam_beta1, optimizer.adam_beta2, optimizer.adam_eps, optimizer.weight_decay) == \
        (0.9, 0.999, 1e-8, 0.01)
    assert (optimizer.lr_decay_style, optimizer.lr_warmup_iters, optimizer.lr_decay_iters) == ("linear", 0, None)
    assert optimizer.lr != 0.0002  # the scheduler's warmup_max_lr is not the peak either
    assert not _not_read_warnings(parsed)  # a line a value, not one long warning
    lines = _not_read_lines(parsed)
    assert [line.split(" ")[1] for line in lines] == ["adam_beta1", "adam_beta2", "adam_eps", "weight_decay", "lr",
                                                      "lr_warmup_iters", "lr_decay_iters"], lines
    assert all(len(line) < 160 for line in lines)
    assert "> adam_beta2 0.999 (Megatron's default) where ds.json says 0.95: not read under --deepspeed, as in " \
           "Megatron-DeepSpeed; pass --adam-beta2 0.95 to use it" in lines
    # the info line does not say the same keys again
    assert not [note for note in parsed.notes if "accepted with no effect" in note and "optimizer.params.betas" in note]
    # --print-config: the setting's row names where its value came from, the key's row that it is not read
    assert "Megatron-LM's default" in _row(parsed, "adam_beta2")
    assert "not read: Megatron hands deepspeed.initialize its own Adam" in _row(parsed, "optimizer.params.betas")
    assert "not read" in _row(parsed, "scheduler.params") and "since v0.14.5" in _row(parsed, "scheduler.params")


def test_a_value_the_run_uses_anyway_is_not_named(tmp_path):
    ds = _json(tmp_path, {"optimizer": {"type": "AdamW", "params": {"lr": 3e-4, "betas": [0.9, 0.999]}}})
    parsed = parse_arguments([*MODEL, "--lr", "3e-4", "--deepspeed_config", ds])
    assert parsed.config.optimizer.lr == 3e-4 and not _not_read_warnings(parsed)


def test_a_v115_fork_launch_reads_the_jsons_scheduler_but_not_its_optimizer(tmp_path):
    ds = _json(tmp_path, {"optimizer": OPTIMIZER, "scheduler": SCHEDULER})
    parsed = parse_arguments([*MODEL, "--gas", "1", "--deepspeed", "--deepspeed_config", ds])
    assert parsed.megatron_generation == "dse-megatron-lm-v1.1.5-3d"
    optimizer = parsed.config.optimizer
    assert (optimizer.adam_beta1, optimizer.adam_beta2, optimizer.adam_eps) == (0.9, 0.999, 1e-8)
    # the JSON's WarmupDecayLR, which the fork's DeepSpeed took before Megatron's AnnealingLR
    assert (optimizer.lr, optimizer.lr_warmup_iters, optimizer.lr_decay_style, optimizer.lr_decay_iters) == \
        (0.0002, 7, "linear", 100)
    lines = _not_read_lines(parsed)
    assert [line.split(" ")[1] for line in lines] == ["adam_beta1", "adam_beta2", "adam_eps", "weight_decay"]


def test_the_2020_forks_param_groups_carry_its_flags_values(tmp_path):
    argv = _shrunk("deepspeedexamples-ds-pretrain-gpt2", tmp_path)
    ds = Path(argv[argv.index("--deepspeed_config") + 1])
    ds.write_text(json.dumps({**json.loads(ds.read_text()), "optimizer": {
        "type": "Adam", "params": {"lr": 0.00015, "betas": [0.8, 0.95], "eps": 1e-6, "weight_decay": 0.1}}}))
    parsed = parse_arguments(argv)
    assert parsed.megatron_generation == "dse-megatron-lm"
    optimizer = parsed.config.optimizer
    # --weight-decay 1e-2 from the script; FusedAdam's betas and eps, which are Megatron's defaults
    assert (optimizer.adam_beta1, optimizer.adam_beta2, optimizer.adam_eps, optimizer.weight_decay) == \
        (0.9, 0.999, 1e-8, 0.01)
    # --weight-decay 1e-2 is the script's: the JSON's 0.1 is not read either
    assert [line.split(" ")[1] for line in _not_read_lines(parsed)] == ["adam_beta1", "adam_beta2", "adam_eps",
                                                                       "weight_decay"]
    assert "the param groups that Adam already filled" in _row(parsed, "optimizer.params.betas")


def test_a_preset_launch_is_deepspeeds_own_use_and_reads_both_blocks(tmp_path):
    """Without a client optimizer or scheduler DeepSpeed builds both from the JSON (v0.19.5 engine.py
    _configure_optimizer line 1983-1986: _configure_basic_optimizer; _configure_lr_scheduler lines 1525-1529)."""
    ds = _json(tmp_path, {"optimizer": OPTIMIZER, "scheduler": SCHEDULER})
    parsed = parse_arguments(["--config", "tiny", "--zero-config", ds])
    optimizer = parsed.config.optimizer
    assert (optimizer.adam_beta1, optimizer.adam_beta2, optimizer.adam_eps, optimizer.weight_decay) == \
        (0.8, 0.95, 1e-6, 0.1)
    assert (optimizer.lr, optimizer.lr_warmup_iters, optimizer.lr_decay_iters) == (0.0002, 7, 100)
    assert not _not_read_warnings(parsed)


def test_a_block_the_real_pair_does_not_read_is_not_refused_but_an_optimizer_type_still_is(tmp_path):
    """DeepSpeed v0.19.5 reads the scheduler block only in _scheduler_from_config (engine.py lines 1557-1572,
    skipped beside a client scheduler) and the optimizer's params only in _configure_basic_optimizer (lines
    2041-2044, skipped beside a client optimizer); it still reads the optimizer's type (line 1655: Lamb needs
    dynamic loss scaling; line 2245: 1-bit Adam's fp16 path)."""
    ds = _json(tmp_path, {"optimizer": {"type": "Adam", "params": {"amsgrad": True}},
                          "scheduler": {"type": "OneCycle", "params": {"cycle_min_lr": 0}}})
    parsed = parse_arguments([*MODEL, "--deepspeed", "--deepspeed_config", ds])  # was refused: amsgrad, OneCycle
    assert "not read" in _row(parsed, "optimizer.params.amsgrad") and "not read" in _row(parsed, "scheduler.type")
    lamb = _json(tmp_path, {"optimizer": {"type": "Lamb", "params": {"lr": 1e-3}},
                            "scheduler": {"type": "WarmupLR", "params": {"warmup_max_lr": 1e-3}}})
    with pytest.raises(ConfigError) as refused:
        parse_arguments([*MODEL, "--deepspeed", "--deepspeed_config", lamb])
    assert "1 key(s) not supported" in str(refused.value) and "optimizer.type" in str(refused.value)
    assert "warmup_type" not in str(refused.value)  # the log warmup of a scheduler that is not read


V115_LAUNCHES = {"deepspeedexamples-v1.1.5-zero3-ds-pretrain-gpt2-zero2": "dse-megatron-lm-v1.1.5-zero3",
                 "deepspeedexamples-zero3-run-gpt-1gpu": "dse-megatron-lm-v1.1.5-zero3",
                 # fits the ZeRO3 and 3D files equally (no flag only one defines); no default nor JSON
                 # behaviour differs between the two, and the first listed is taken
                 "deepspeedexamples-v1.1.5-3d-ds-pretrain-gpt2": "dse-megatron-lm-v1.1.5-zero3"}


@pytest.mark.parametrize("name", sorted(V115_LAUNCHES))
def test_a_v115_fork_launch_is_its_fork_and_runs_the_jsons_scheduler(name, tmp_path):
    """Each of these scripts types --batch-size, --warmup and --model-parallel-size, which every later
    generation parses only to refuse: validate_args asserts `args.batch_size is None` ('--batch-size argument
    is no longer valid, use --micro-batch-size instead'), and the same of the other two, in Megatron-DeepSpeed
    (github:deepspeedai/Megatron-DeepSpeed f4157bea and 4efb479d, megatron/arguments.py lines 126-134),
    BigScience's fork (github:bigscience-workshop/Megatron-DeepSpeed 8387ae17, megatron/arguments.py), and
    Megatron-LM (github:NVIDIA/Megatron-LM v2.6 megatron/arguments.py lines 85-93, 23.04 lines 94-102,
    core_v0.15.0 megatron/training/arguments.py lines 443-451). The v1.1.5 forks read them
    (github:microsoft/DeepSpeedExamples 5c6b1c8f Megatron-LM-v1.1.5-ZeRO3/megatron/arguments.py lines 227,
    304, 384). They were detected as megatron-deepspeed (the tie went to the newest), so the forks' JSON
    scheduler (their DeepSpeed before v0.14.5 took it first) never reached them."""
    # without its schedule flags: beside any of them the JSON's scheduler is dropped as a whole (not yet the
    # forks' behaviour: arguments/deepspeed/client_objects.py)
    argv = _shrunk(name, tmp_path, drop=("--lr-decay-style", "--lr-decay-iters", "--warmup", "--lr", "--min-lr"))
    assert "--batch-size" in argv and "--warmup" in _shrunk(name, tmp_path)
    ds = tmp_path / "with_scheduler.json"
    given = argv[argv.index("--deepspeed_config") + 1] if "--deepspeed_config" in argv else None
    ds.write_text(json.dumps({**(json.loads(Path(given).read_text()) if given else {}), "scheduler": SCHEDULER}))
    argv = [token if token != given else str(ds) for token in argv]
    parsed = parse_arguments(argv if given else [*argv, "--deepspeed", "--deepspeed_config", str(ds)])
    assert parsed.megatron_generation == V115_LAUNCHES[name]
    optimizer = parsed.config.optimizer
    assert (optimizer.lr, optimizer.lr_warmup_iters, optimizer.lr_decay_style) == (0.0002, 7, "linear")


def test_a_launch_in_todays_spelling_is_not_a_fork():
    parsed = parse_arguments([*MODEL, "--micro-batch-size", "2", "--deepspeed-activation-checkpointing"])
    assert parsed.megatron_generation == "megatron-deepspeed"


def test_a_scheduler_set_aside_beside_a_schedule_flag_leaves_megatrons_defaults_not_ours(tmp_path):
    """Beside --lr the JSON's scheduler block is not used as a whole; what it would have set takes the
    generation's Megatron defaults (the v1.1.5 3D fork: --warmup 0.01, linear decay), not this program's
    (was: --lr-warmup-iters 20, cosine, named in the "leaves these out" line)."""
    ds = _json(tmp_path, {"scheduler": SCHEDULER})
    parsed = parse_arguments([*MODEL, "--gas", "1", "--lr", "1e-4", "--deepspeed", "--deepspeed_config", ds])
    assert parsed.megatron_generation == "dse-megatron-lm-v1.1.5-3d"
    optimizer = parsed.config.optimizer
    assert (optimizer.lr, optimizer.lr_warmup_iters, optimizer.lr_warmup_fraction, optimizer.lr_decay_style) == \
        (1e-4, 0, 0.01, "linear")
    assert not [note for note in parsed.notes if "leaves these out" in note]


def test_where_a_fork_fits_as_well_the_tie_rules_choice_is_named_with_the_scheduler(tmp_path):
    """Issue 34 round 2: a launch whose flags fit a fork as well as a later generation keeps the tie rule (the
    newest), but the scheduler it sets aside is one the fork's DeepSpeed would have run: --print-config says so."""
    ds = _json(tmp_path, {"scheduler": SCHEDULER})
    parsed = parse_arguments([*MODEL, "--deepspeed", "--deepspeed_config", ds])
    assert _not_read_lines(parsed)
    assert "fit dse-megatron-lm-v1.1.5-zero3 as well, which ran the JSON's scheduler" in _row(parsed, "scheduler.params")
    # a flag no fork defines: no tie, nothing more to say
    parsed = parse_arguments([*MODEL, "--micro-batch-size", "2", "--deepspeed", "--deepspeed_config", ds])
    assert _not_read_lines(parsed) and "as well" not in _row(parsed, "scheduler.params")
