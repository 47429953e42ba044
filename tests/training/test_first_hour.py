"""The first hour of a new user: what long work prints while it runs, and the surprises the issue
found on the way (each test names the surprise it guards against)."""

import re

import pytest

import pretrain_gpt
from arguments.batch_schedule import BatchSchedule
from base.progress import ProgressLines
from data.tokenizer import train_tokenizer
from training.metrics import format_duration, remaining_seconds

SMALL = ["--num-layers", "1", "--hidden-size", "32", "--num-attention-heads", "2", "--seq-length", "16",
         "--max-position-embeddings", "16", "--micro-batch-size", "2", "--global-batch-size", "2",
         "--train-iters", "2", "--eval-iters", "0", "--tokenizer-vocab-size", "300", "--device", "cpu"]


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_progress_lines_are_throttled_and_end_with_the_time_taken():
    lines, clock = [], FakeClock()
    progress = ProgressLines(emit=lines.append, interval_s=10.0, clock=clock)
    progress.start("work: starting")
    for step in range(1, 26):  # 25 steps of 1 s: lines at 10 s and 20 s only
        clock.now = float(step)
        progress.update(lambda: f"work: step {step}")
    progress.done("work: finished")
    assert lines == ["work: starting", "work: step 10 (10 s so far)", "work: step 20 (20 s so far)",
                     "work: finished in 25.0 s"]


def test_tokenizer_training_reports_what_it_read():
    lines = []
    texts = [f"document number {i} says hello to the tokenizer" for i in range(50)]
    tokenizer = train_tokenizer(texts, 300, progress=ProgressLines(emit=lines.append, interval_s=0.0))
    assert lines[0] == "tokenizer: training a byte-level BPE of up to 300 tokens"
    assert lines[-2].startswith("tokenizer: read all 50 documents") and "computing the merges" in lines[-2]
    assert lines[-1].startswith(f"tokenizer: trained {tokenizer.vocab_size} tokens on 50 documents")
    assert lines[-1].endswith(" s")


def test_a_run_says_when_it_builds_indices_and_when_a_save_starts_and_ends(tmp_path, capsys):
    code = pretrain_gpt.main(SMALL + ["--data-cache-dir", str(tmp_path / "cache"), "--save", str(tmp_path / "ck"),
                                      "--metrics-file", str(tmp_path / "m.jsonl")])
    captured = capsys.readouterr()
    assert code == 0
    assert "tokenizer: training a byte-level BPE" in captured.out
    assert "data: building the train index of" in captured.out and "data: built the train index" in captured.out
    assert captured.err == ""
    out = captured.out.splitlines()
    start = next(i for i, line in enumerate(out) if "saving checkpoint at iteration 2" in line)
    end = next(i for i, line in enumerate(out) if "saved checkpoint" in line)
    assert start < end


def test_a_presets_16_bit_is_fp32_on_a_cpu_and_an_explicit_one_is_warned_about():
    """Before: the gpt2-124m preset's bf16 made a CPU run 266 s an iteration against 18 s in fp32,
    with no word about it."""
    import torch

    from arguments.parser import parse_config
    from training.run_settings import resolve_run_settings

    preset = parse_config(["--config", "gpt2-124m"])
    on_cpu = resolve_run_settings(preset, 50257, 1, 1, "cpu")
    assert on_cpu.config.training.precision == "fp32" and on_cpu.param_dtype == torch.float32
    precision_notes = tuple(note for note in on_cpu.notes if "the model's vocabulary" not in note)  # the preset's
    assert precision_notes == ("> bf16 comes from preset gpt2-124m (configs/models/gpt2-124m.yaml), a setting for "
                            "GPUs: on this CPU the run trains in fp32, 10-15x faster here than bf16 (pass --bf16 "
                            "to keep it)",)
    assert preset.training.precision == "bf16"  # the user's config is never written to
    on_gpu = resolve_run_settings(preset, 50257, 1, 1, "cuda")
    assert on_gpu.config.training.precision == "bf16" and len(on_gpu.notes) == 1  # its vocabulary's only
    for argv in (["--config", "gpt2-124m", "--bf16"], ["--zero-config", "stage2"], ["--fp16"]):
        plan = resolve_run_settings(parse_config(argv), 1000, 1, 1, "cpu")
        precision = plan.config.training.precision
        assert precision != "fp32" and plan.notes[0].startswith(f"warning: {precision} on a CPU runs 10-15x slower")


def test_a_cpu_run_of_a_16_bit_preset_says_it_trains_in_fp32(tmp_path, capsys):
    preset = tmp_path / "gpu.yaml"
    preset.write_text("bf16: true\n")
    code = pretrain_gpt.main(["--config", str(preset)] + SMALL + ["--data-cache-dir", str(tmp_path / "cache"),
                                                                  "--metrics-file", str(tmp_path / "m.jsonl")])
    out = capsys.readouterr().out
    assert code == 0
    assert f"> bf16 comes from preset {preset}, a setting for GPUs: on this CPU the run trains in fp32" in out
    assert "ZeRO stage 0, fp32 (fp32 gradients)" in out


def readme_commands(section_title):
    """The shell commands of the README's fenced bash blocks under `section_title`, one per command
    (continuation lines joined, comments dropped)."""
    import re
    import shlex

    from tests.readme import readme_section

    section = readme_section(section_title)
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", section, flags=re.S):
        text = re.sub(r"\\\n\s*", " ", block)
        commands += [shlex.split(line) for line in text.splitlines() if line.strip() and not line.strip().startswith("#")]
    return commands


def test_the_own_data_example_runs_offline_and_writes_outside_the_package(tmp_path, monkeypatch):
    """Before: it needed GPT-2's files (a download) and wrote into the repository's data/ package.
    The README's commands run as written, from a user's directory, with a corpus of their own; only
    the sizes are made small (appended flags win)."""
    import json

    from data import preprocess
    from data.corpus import default_corpus_documents
    from tests.repository_tree import repository_files

    before = repository_files()
    monkeypatch.chdir(tmp_path)
    with open("corpus.jsonl", "w") as corpus:
        for document in default_corpus_documents()[:300]:
            corpus.write(json.dumps({"text": document}) + "\n")
    first, second = readme_commands("Train on your own data")
    assert first[:3] == ["python", "-m", "data.preprocess"] and second[:2] == ["python", "pretrain_gpt.py"]
    assert preprocess.main(first[3:] + ["--workers", "1", "--train-tokenizer-vocab-size", "400"]) == 0
    assert pretrain_gpt.main(second[2:] + SMALL + ["--metrics-file", "runs/m.jsonl"]) == 0
    assert (tmp_path / "my_data" / "my_text_document.bin").is_file() and (tmp_path / "runs" / "m.jsonl").is_file()
    assert repository_files() == before


def test_iteration_lines_carry_an_eta_and_a_small_models_memory_line_no_leak_like_ratio(tmp_path, capsys, corpus_cache_300):
    """Issue 34, point 5: the progress line had no ETA, and on a 0.8 MiB model the memory line said
    'measured/predicted 9.67' (the fixed first-iteration cost of torch on a CPU, not a leak)."""
    code = pretrain_gpt.main(SMALL + ["--data-cache-dir", corpus_cache_300, "--log-interval", "1",
                                      "--metrics-file", str(tmp_path / "m.jsonl")])
    out = capsys.readouterr().out.splitlines()
    assert code == 0
    iteration_lines = [line for line in out if line.startswith("iteration ")]
    assert len(iteration_lines) == 2 and all(" | ETA: " in line for line in iteration_lines)
    assert iteration_lines[-1].endswith("ETA: 0 s |")  # the last iteration: nothing left
    memory = next(line for line in out if "memory after iteration 1" in line)
    # the sign depends on what this test process reached before (a peak RSS only grows)
    assert "measured/predicted" not in memory and re.search(r"measured-predicted [+-]\d+\.\d MiB", memory), memory


def test_the_eta_follows_the_samples_left_through_a_batch_ramp():
    # 0.5 s a sample; the ramp 2 -> 6 by 2 over 12 samples grows every 6 samples: from 4 consumed, the
    # 3 iterations left read 2 + 4 + 4 = 10 samples, 5 s (at the last iteration's batch of 2 it would be 3 s)
    ramp = BatchSchedule(micro_batch_size=2, data_parallel_size=1, global_batch_size=6, rampup=(2, 2, 12))
    assert remaining_seconds(0.5, 4, 3, ramp.consumed_after) == 5.0
    assert [format_duration(s) for s in (0.4, 59.6, 425, 11_520)] == ["0 s", "1 min 00 s", "7 min 05 s", "3 h 12 min"]


def test_between_iteration_lines_far_apart_a_short_line_gives_the_eta(tmp_path, capsys, monkeypatch, corpus_cache_300):
    """After the model line a default CPU run printed nothing until iteration 10 (about a minute on a
    loaded machine). The loop's heartbeat prints, every 10 s between iteration lines, the iteration and
    the ETA; here its interval is 0 so that every iteration without a line gets one."""
    import training.interval_metrics

    lines = []
    monkeypatch.setattr(training.interval_metrics, "ProgressLines", lambda: ProgressLines(emit=lines.append, interval_s=0.0))
    code = pretrain_gpt.main(SMALL + ["--data-cache-dir", corpus_cache_300, "--log-interval", "5",
                                      "--metrics-file", str(tmp_path / "m.jsonl")])
    assert code == 0
    assert len(lines) == 1 and lines[0].startswith(" iteration        1/       2, ETA: "), lines
    assert [line for line in capsys.readouterr().out.splitlines() if line.startswith("iteration ")][0].startswith(
        "iteration        2/")  # the logged iteration has its own line, and no heartbeat


def test_a_deepspeed_jsons_lr_runs_under_zero_config_and_not_under_deepspeed_each_said_last(tmp_path, capsys,
                                                                                          corpus_cache_300):
    """Issue 115, item 1: under --zero-config alone the JSON's optimizer lr 3e-4 ran at --lr 0.001 (default), said
    only inside a long warning. Now it runs (the logged lr follows its linear decay); under --deepspeed the real
    pair's rule stays (Megatron's own optimizer, tests/arguments/test_deepspeed_client_objects.py cites the code),
    and the differing value is one short line, the last before the first iteration."""
    import json

    ds = tmp_path / "ds_config.json"
    ds.write_text(json.dumps({"optimizer": {"type": "Adam", "params": {"lr": 3e-4}}}))
    launch = SMALL + ["--train-iters", "3", "--data-cache-dir", corpus_cache_300, "--log-interval", "1",
                      "--zero-config", str(ds)]
    for extra, lrs, said in (([], [3e-4, 2e-4, 1e-4], None),
                             (["--deepspeed"], [1e-3, 2e-3 / 3, 1e-3 / 3],
                              "> lr 0.001 (default) where ds_config.json says 0.0003: not read under --deepspeed, as "
                              "in Megatron-DeepSpeed; pass --lr 0.0003 to use it"),
                             (["--lr", "1e-3"], [1e-3, 2e-3 / 3, 1e-3 / 3],
                              "> lr 0.001 (--lr) where ds_config.json says 0.0003: the command line wins; drop --lr "
                              "to use it")):
        metrics = tmp_path / f"m{len(extra)}{extra[:1]}.jsonl"
        assert pretrain_gpt.main(launch + extra + ["--metrics-file", str(metrics)]) == 0
        out = capsys.readouterr().out.splitlines()
        logged = [json.loads(line)["lr"] for line in metrics.read_text().splitlines() if '"lr"' in line]
        assert logged == pytest.approx(lrs), extra
        before_first = [line for line in out[:next(i for i, line in enumerate(out) if line.startswith("iteration "))]
                        if line.startswith(">")]
        said_lines = [line for line in out if "ds_config.json says" in line]
        assert said_lines == ([said] if said else []) and all(len(line) < 160 for line in said_lines)
        if said:
            assert before_first[-1] == said
