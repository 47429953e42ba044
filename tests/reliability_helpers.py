"""Shared by tests/training/test_reliability.py and tests/training/test_bad_inputs_fuzz.py: a tiny end-to-end run of
`pretrain_gpt.main` in this process, its exit status and stderr lines, and byte snapshots of
directories (so a test can say "every checkpoint present before is byte-identical after")."""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

import pretrain_gpt
from data.indexed import IndexedDatasetWriter

# One block of width 32 on 16-token samples: a run of a few iterations takes about a second.
TINY = ["--num-layers", "1", "--hidden-size", "32", "--num-attention-heads", "2", "--seq-length", "16",
        "--max-position-embeddings", "16", "--micro-batch-size", "2", "--global-batch-size", "2",
        "--train-iters", "2", "--eval-iters", "0", "--log-interval", "1", "--tokenizer-vocab-size", "300",
        "--device", "cpu", "--hidden-dropout", "0", "--attention-dropout", "0"]


@dataclass
class Outcome:
    code: int
    out: str
    err: str

    @property
    def err_lines(self) -> list[str]:
        return self.err.splitlines()

    def one_error_line(self, *words: str) -> str:
        """Assert exit 2 with exactly one stderr line and no traceback holding every word; the line."""
        assert self.code == 2, (self.code, self.err[-2000:], self.out[-2000:])
        assert len(self.err_lines) == 1 and "Traceback" not in self.err, self.err
        for word in words:
            assert word in self.err, (word, self.err)
        return self.err_lines[0]


def run_main(main, argv) -> Outcome:
    """`main(argv)` in this process with stdout and stderr captured."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main([str(a) for a in argv])
    return Outcome(code, out.getvalue(), err.getvalue())


def train(cache: str, workdir: Path, *extra) -> Outcome:
    """pretrain_gpt.main on the tiny model and the embedded corpus; metrics in workdir."""
    return run_main(pretrain_gpt.main, TINY + ["--data-cache-dir", cache, "--metrics-file",
                                               str(workdir / "metrics.jsonl"), *map(str, extra)])


def snapshot(directory: Path) -> dict[str, str]:
    """Relative path -> sha256 of every file under `directory` (empty when it does not exist)."""
    if not directory.exists():
        return {}
    return {str(path.relative_to(directory)): hashlib.sha256(path.read_bytes()).hexdigest()
            for path in sorted(directory.rglob("*")) if path.is_file()}


def metrics_records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def write_dataset(prefix: Path, documents: list[list[int]], dtype=np.uint16) -> str:
    with IndexedDatasetWriter(str(prefix), dtype) as writer:
        for tokens in documents:
            writer.add_document(np.asarray(tokens, dtype=np.int64))
    return str(prefix)


def straight_and_resumed(argv: list, workdir: Path, exit_interval: int) -> tuple[list[dict], list[dict], Path]:
    """pretrain_gpt.main on `argv` straight through, and again saved at --exit-interval and resumed
    from that checkpoint: (the first run's training records, the split run's, its save directory)."""
    full, parts, save = workdir / "full.jsonl", workdir / "parts.jsonl", workdir / "ckpt"
    assert pretrain_gpt.main(argv + ["--metrics-file", str(full)]) == 0
    assert pretrain_gpt.main(argv + ["--metrics-file", str(parts), "--save", str(save),
                                     "--exit-interval", str(exit_interval)]) == 0
    assert pretrain_gpt.main(argv + ["--metrics-file", str(parts), "--save", str(save), "--load", str(save)]) == 0
    training = [record for record in metrics_records(full) if "split" not in record and "memory" not in record]
    split = [record for record in metrics_records(parts) if "split" not in record and "memory" not in record]
    return training, split, save
