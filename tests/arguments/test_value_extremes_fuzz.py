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

import pytest

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


@pytest.mark.parametrize("argv", [["--hidden-size", "1000000000"],
                                  ["--micro-batch-size", "1000000000000", "--global-batch-size", "1000000000000",
                                   "--vocab-size", "50257"]])  # GPT-2's: the logits past int64's bytes
def test_zero_plan_dry_run_of_a_tensor_beyond_int64_bytes_is_one_line(tmp_path, monkeypatch, argv):
    """Issue 33 #15: these ended in torch's "Storage size calculation overflowed" traceback."""
    outcome = plan_dry_run(tmp_path, monkeypatch, *argv)
    assert outcome.code == 2 and "beyond what a tensor can address" in outcome.err.strip(), outcome.err
