"""One rank of a replayed launch (tests/scripts/test_replay_corpus.py), in a module of its own: a rank forked by
tests/distributed.py imports the module its function lives in, and the corpus test's module (the corpus's launch
tables) is 0.08 s of imports a rank, ~450 rank starts a suite."""

from __future__ import annotations

import contextlib
import os
import traceback

import pretrain_gpt


def replay_on_rank(rank: int, world_size: int, argv: list[str], out_dir: str) -> int:
    """pretrain_gpt.main on one rank, its stdout and stderr in out_dir/rank{N}.out and .err."""
    with open(os.path.join(out_dir, f"rank{rank}.out"), "w") as out, \
            open(os.path.join(out_dir, f"rank{rank}.err"), "w") as err, \
            contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            return pretrain_gpt.main(argv)
        except Exception:  # noqa: BLE001 - a bug's traceback goes to the .err file, the next launch still runs
            traceback.print_exc()
            return -1


def replay_all_on_rank(rank: int, world_size: int, launches: list[tuple[list[str], str]]) -> list[int]:
    return [replay_on_rank(rank, world_size, argv, out_dir) for argv, out_dir in launches]
