"""The first hour of a new user: what long work prints while it runs, and the surprises the issue
found on the way (each test names the surprise it guards against)."""

import pytest

import pretrain_gpt
from data.progress import ProgressLines
from data.tokenizer import train_tokenizer

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
    assert "tokenizer: training a byte-level BPE" in captured.err
    assert "data: building the train index of" in captured.err and "data: built the train index" in captured.err
    out = captured.out.splitlines()
    start = next(i for i, line in enumerate(out) if "saving checkpoint at iteration 2" in line)
    end = next(i for i, line in enumerate(out) if "saved checkpoint" in line)
    assert start < end
