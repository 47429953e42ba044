"""Generated damage to a torch_dist checkpoint, each loaded by a run: one line and exit 2, or a run that trains on
exactly what was saved (issue 79 item 7, as tests/training/test_bad_inputs_fuzz.py does for our own format).

From a fixed seed, over a checkpoint the program itself saved with --ckpt-format torch_dist: bits flipped at random
places in every file (the positions cubed toward the start, so headers and indexes are hit too, and in each tensor's
values), every file truncated, metadata.json rewritten (random bytes, other backends and versions, wrong types) and
common.pt's entries changed (types, NaN, negatives, 10**30). Each resume runs through pretrain_gpt.main in this process
with --load alone (nothing is saved) and must exit 2 with exactly one stderr line and no traceback, or exit 0 with the
loss of iteration 3 the undamaged checkpoint gives, bitwise: a damaged byte is refused or was never read, never
trained on. The checkpoint is byte-identical after each.
"""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path
from typing import Callable

import pytest

import pretrain_gpt
from tests.reliability_helpers import TINY, metrics_records, run_main, snapshot
from tests.torch_dist_damage import read_common, stored_items, write_common

SEED = 20261126
ITERATION = "iter_0000002"


def _flip(fraction: float, bit: int) -> Callable[[bytes], bytes]:
    def damage(data: bytes) -> bytes:
        data = bytearray(data)
        data[min(int(fraction * len(data)), len(data) - 1)] ^= 1 << bit
        return bytes(data)
    return damage


def _common(change: Callable[[dict], None]) -> Callable[[Path], None]:
    def damage(iteration_dir: Path) -> None:
        common = read_common(iteration_dir)
        change(common)
        write_common(iteration_dir, common)
    return damage


def _file(name: str, damage: Callable[[bytes], bytes]) -> Callable[[Path], None]:
    def apply(iteration_dir: Path) -> None:
        path = iteration_dir / name
        path.write_bytes(damage(path.read_bytes()))
    return apply


def _set_arg(name, value):
    return lambda common: setattr(common["args"], name, value)


def _set(key, value):
    return lambda common: common.__setitem__(key, value)


def _set_scheduler(key, value):
    return lambda common: common["opt_param_scheduler"].__setitem__(key, value)


FILES = (".metadata", "__0_0.distcp", "common.pt", "metadata.json")
COMMON_CHANGES = {
    "iteration 'two'": _set("iteration", "two"), "iteration -1": _set("iteration", -1),
    "iteration 10**30": _set("iteration", 10**30), "iteration 2.5": _set("iteration", 2.5),
    "no args": _set("args", None), "args a list": _set("args", [1, 2]),
    "consumed NaN": _set_arg("consumed_train_samples", float("nan")),
    "consumed -4": _set_arg("consumed_train_samples", -4), "consumed 10**30": _set_arg("consumed_train_samples", 10**30),
    "heads 0": _set_arg("num_attention_heads", 0), "heads 'x'": _set_arg("num_attention_heads", "x"),
    "hidden 10**30": _set_arg("hidden_size", 10**30), "layers -1": _set_arg("num_layers", -1),
    "seed NaN": _set_arg("seed", float("nan")), "lr inf": _set_arg("lr", float("inf")),
    "scheduler a string": _set("opt_param_scheduler", "x"), "num_steps -1": _set_scheduler("num_steps", -1),
    "num_steps 1e30": _set_scheduler("num_steps", 1e30), "max_lr NaN": _set_scheduler("max_lr", float("nan")),
    "optimizer a list": _set("optimizer", [1]), "checkpoint_version NaN": _set("checkpoint_version", float("nan")),
}
METADATA_JSON = {
    "random bytes": lambda rng: rng.randbytes(40), "a list": lambda rng: b"[1, 2]", "empty": lambda rng: b"",
    "backend zarr": lambda rng: json.dumps({"sharded_backend": "zarr"}).encode(),
    "version 2": lambda rng: json.dumps({"sharded_backend": "torch_dist", "sharded_backend_version": 2}).encode(),
    "version '1'": lambda rng: json.dumps({"sharded_backend": "torch_dist", "sharded_backend_version": "1"}).encode(),
    "backend a dict": lambda rng: json.dumps({"sharded_backend": {"a": 1}}).encode(),
    "common backend pickle": lambda rng: json.dumps({"sharded_backend": "torch_dist",
                                                     "common_backend": "pickle"}).encode(),
}


def cases() -> list[tuple[str, Callable[[Path], None]]]:
    rng = random.Random(SEED)
    found = []
    for name in FILES:
        for index in range(6 if name.endswith(".distcp") else 4):
            where, bit = rng.random() ** 3, rng.randrange(8)
            found.append((f"{name} bit {bit} flipped at {where:.4f} #{index}", _file(name, _flip(where, bit))))
        for index in range(2):
            cut = rng.random()
            found.append((f"{name} truncated to {cut:.4f} #{index}", _file(name, lambda d, c=cut: d[:int(c * len(d))])))
    for label, change in COMMON_CHANGES.items():
        found.append((f"common.pt {label}", _common(change)))
    for label, make in METADATA_JSON.items():
        found.append((f"metadata.json {label}", _file("metadata.json", lambda d, m=make: m(random.Random(SEED)))))
    return found


def _values_flip(key: str, bit: int) -> Callable[[Path], None]:
    """One bit of the middle value of stored item `key`'s record (its values, for a tensor)."""
    def damage(iteration_dir: Path) -> None:
        for fqn, path, offset, length in stored_items(iteration_dir):
            if fqn == key:
                _file(path.name, _flip((offset + length * 3 // 4) / path.stat().st_size, bit))(iteration_dir)
                return
        raise KeyError(key)
    return damage


CASES = cases()
VALUE_KEYS = ("embedding.word_embeddings.weight", "decoder.final_layernorm.weight",
              "optimizer.state.exp_avg_sq.decoder.layers.mlp.linear_fc2.weight")
CASES += [(f"{key} value bit {bit}", _values_flip(key, bit)) for key in VALUE_KEYS for bit in (0, 6)]


@pytest.fixture(scope="module")
def saved(corpus_cache_300, tmp_path_factory):
    """A torch_dist save at iteration 2 and the loss of iteration 3 a resume from it logs."""
    work = tmp_path_factory.mktemp("torch-dist-fuzz")
    first = run_main(pretrain_gpt.main, TINY + ["--data-cache-dir", corpus_cache_300, "--metrics-file",
                                                work / "first.jsonl", "--ckpt-format", "torch_dist", "--save",
                                                work / "ck", "--train-iters", "3", "--exit-interval", "2"])
    assert first.code == 0, first.err
    resumed = _resume(corpus_cache_300, work, work / "ck")
    assert resumed.code == 0, resumed.err
    return work / "ck", _loss(work)


def _resume(cache: str, workdir: Path, ck: Path):
    return run_main(pretrain_gpt.main, TINY + ["--data-cache-dir", cache, "--metrics-file", workdir / "metrics.jsonl",
                                               "--load", ck, "--train-iters", "3"])


def _loss(workdir: Path):
    return [r["loss"] for r in metrics_records(workdir / "metrics.jsonl") if r.get("iteration") == 3 and "loss" in r]


def test_there_are_enough_cases():
    assert len(CASES) >= 60 and len({name for name, _ in CASES}) == len(CASES)


@pytest.mark.parametrize("name,damage", CASES, ids=[name for name, _ in CASES])
def test_a_damaged_torch_dist_checkpoint_is_one_line_or_trains_on_what_was_saved(saved, corpus_cache_300, tmp_path,
                                                                                name, damage):
    ck_saved, loss = saved
    ck = Path(shutil.copytree(ck_saved, tmp_path / "ck"))
    damage(ck / ITERATION)
    before = snapshot(ck)
    outcome = _resume(corpus_cache_300, tmp_path, ck)
    assert "Traceback" not in outcome.err, (name, outcome.err[-3000:])
    assert outcome.code in (0, 2), (name, outcome.code, outcome.err[-3000:])
    if outcome.code == 2:
        assert len(outcome.err_lines) == 1 and ": error: " in outcome.err, (name, outcome.err)
    else:
        assert _loss(tmp_path) == loss, (name, outcome.out[-2000:])  # the bytes it read are the ones saved
    assert snapshot(ck) == before, name
