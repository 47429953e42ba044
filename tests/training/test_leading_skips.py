"""An fp16 run from Megatron-LM's initial loss scale, 2**32 (megatron/training/arguments.py `--initial-loss-scale`
default=2**32), skips its first iterations for gradient overflow while the scale comes down, as Megatron's
DynamicGradScaler does (megatron/core/optimizer/grad_scaler.py: the first --hysteresis - 1 overflows keep the scale,
each one after halves it); one line says so, naming the initial scale and --initial-loss-scale (issue 81 item 4)."""

import re

import pretrain_gpt
from arguments.parser import parse_config
from tests.reliability_helpers import TINY, metrics_records, run_main
from training.leading_skips import LeadingSkips

MEGATRON_SCALE = str(2 ** 32)


def test_the_line_comes_once_at_the_first_step_after_skips_with_the_scale_it_stepped_at():
    watch = LeadingSkips(2.0 ** 32, hysteresis=2)
    # the scale after each skip: kept once (hysteresis 2), then halved
    assert [watch.after(i, True, scale) for i, scale in ((1, 2.0 ** 32), (2, 2.0 ** 31), (3, 2.0 ** 30))] == \
        [None, None, None]
    line = watch.after(4, False, 2.0 ** 30)
    assert line == ("> iterations 1-3 skipped for fp16 gradient overflow before the first optimizer step, taken at "
                    "iteration 4 at loss scale 1073741824 (2^30): dynamic loss scaling starts at --initial-loss-scale "
                    "4294967296 (2^32, Megatron-LM's default) and keeps it for the first 1 overflow (--hysteresis 2) "
                    "and halves it on each one after, as Megatron-LM's does; give --initial-loss-scale 1073741824 to "
                    "start there")
    assert watch.after(5, True, 2.0 ** 30) is None and watch.at_end() is None  # said once; a later skip is not leading
    clean = LeadingSkips(65536.0, hysteresis=1)
    assert clean.after(1, False, 65536.0) is None and clean.at_end() is None  # no skip, nothing to say


def test_a_run_that_never_stepped_says_it_at_the_end():
    watch = LeadingSkips(2.0 ** 20, hysteresis=1, first_iteration=1)
    watch.after(1, True, 2.0 ** 19)
    assert watch.at_end() == (
        "> iteration 1 all skipped for fp16 gradient overflow, no optimizer step taken: dynamic loss scaling starts "
        "at --initial-loss-scale 1048576 (2^20) and halves it on each overflow (--hysteresis 1), as Megatron-LM's "
        "does, and it is 524288 (2^19) now; give a lower --initial-loss-scale (or a static --loss-scale), or train "
        "more iterations")


def test_only_a_dynamic_fp16_run_from_its_first_iteration_is_watched():
    def watched(*flags, start=0):
        return LeadingSkips.of(parse_config(list(flags)).training, start) is not None

    assert watched("--fp16")
    assert not watched("--bf16") and not watched()
    assert not watched("--fp16", "--loss-scale", "1024")  # a static scale is the user's own
    assert not watched("--fp16", start=10)  # a resumed run's scale is its checkpoint's


def test_a_short_fp16_run_from_two_to_the_32_says_why_its_first_iterations_skipped(tmp_path, corpus_cache_300):
    """The tiny model on a CPU overflows for a dozen or more iterations from 2**32: the line comes at the first step,
    its figures those of the metrics records (the skips before it, the scale it stepped at)."""
    metrics = tmp_path / "m.jsonl"
    outcome = run_main(pretrain_gpt.main, TINY + ["--train-iters", "30", "--fp16", "--initial-loss-scale",
                                                  MEGATRON_SCALE, "--data-cache-dir", corpus_cache_300,
                                                  "--metrics-file", metrics])
    assert outcome.code == 0, outcome.err
    lines = [line for line in outcome.out.splitlines() if "before the first optimizer step" in line]
    assert len(lines) == 1, outcome.out
    found = re.match(r"> iterations 1-(\d+) skipped for fp16 gradient overflow before the first optimizer step, taken "
                     r"at iteration (\d+) at loss scale (\d+) \(2\^\d+\): dynamic loss scaling starts at "
                     r"--initial-loss-scale 4294967296 \(2\^32, Megatron-LM's default\) and keeps it for the first 1 "
                     r"overflow \(--hysteresis 2\) and halves it on each one after, as Megatron-LM's does; give "
                     r"--initial-loss-scale (\d+) to start there$", lines[0])
    assert found, lines[0]
    skipped, stepped, scale, suggested = map(int, found.groups())
    records = {record["iteration"]: record for record in metrics_records(metrics) if "loss_scale" in record}
    assert stepped == skipped + 1 and scale == suggested
    assert records[skipped]["skipped_iterations"] == skipped and records[skipped]["loss_scale"] == scale
    assert records[stepped]["skipped_iterations"] == skipped  # the step taken
