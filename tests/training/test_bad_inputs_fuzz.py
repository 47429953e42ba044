"""Generated bad inputs, every one ending in one line and exit 2, or in a clean run (issue 11).

Several hundred inputs from a seeded generator: flag values (NaN, inf, text, negatives, empty) for
every float and integer flag, bad choices and paths; YAML presets and DeepSpeed JSON (random bytes,
non-UTF-8, nesting 10^4 deep, wrong types, unknown keys); `latest` and metadata.json contents;
checkpoint files truncated or with one bit flipped; the prepared corpus' .bin/.idx and tokenizer
damaged; and the offline tools given bad arguments. Each runs through the program's own `main` in
this process (no interpreter start-up per input), and must either exit 2 with exactly one stderr line
and no traceback, or exit 0 -- and every checkpoint present before must be byte-identical after.
"""

from __future__ import annotations

import json
import random
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pytest

import pretrain_gpt
from checkpoint.format import LATEST_FILE, METADATA_FILE
from data import preprocess
from scripts.tools import convert_to_hf, reshard_checkpoint, zero_to_fp32
from tests.reliability_helpers import TINY, run_main, snapshot

REPO = Path(__file__).resolve().parents[2]
SEED = 20261122
MINIMUM_CASES = 200

FLOAT_FLAGS = ["--lr", "--min-lr", "--clip-grad", "--adam-eps", "--weight-decay", "--adam-beta1", "--adam-beta2",
               "--hidden-dropout", "--attention-dropout", "--init-method-std", "--layernorm-epsilon", "--loss-scale",
               "--initial-loss-scale", "--min-loss-scale", "--distributed-timeout-minutes", "--exit-duration-in-mins"]
FLOAT_VALUES = ["nan", "inf", "-inf", "1e999", "-nan", "abc", "", "0x1p3"]
INT_FLAGS = ["--num-layers", "--hidden-size", "--num-attention-heads", "--seq-length", "--micro-batch-size",
             "--global-batch-size", "--train-iters", "--seed", "--tensor-model-parallel-size", "--eval-interval",
             "--log-interval", "--save-interval", "--keep-last", "--exit-interval", "--num-workers",
             "--reduce-bucket-size", "--zero-stage", "--checkpoint-num-layers", "--tokenizer-vocab-size",
             "--max-consecutive-skipped-iterations"]
INT_VALUES = ["-1", "1.5", "x", "", "nan"]
OTHER_FLAGS = [["--device", "foo"], ["--device", "cuda:x"], ["--device", "meta"], ["--device", "gpu"],
               ["--activation", "relu"], ["--lr-decay-style", "step"], ["--split", "nan,1,1"], ["--split", "a,b"],
               ["--split", "0,0,0"], ["--config", "no-such-preset"], ["--zero-config", "no-such.json"],
               ["--data-path", "0.5", "x"], ["--data-path", "x", "--tokenizer-file", "missing.json"],
               ["--vocab-file", "v.json"], ["--no-such-flag"], ["--lr"], ["--fp16", "--bf16"],
               ["--keep-last", "2"], ["--finetune"], ["--partition-activations"]]


@dataclass(frozen=True)
class Case:
    name: str
    run: Callable[["Workspace"], tuple]  # workspace -> (main, argv)


@dataclass
class Workspace:
    """One case's directory, with the module's prepared corpus and trained checkpoint at hand."""
    root: Path
    cache: str
    trained: Path
    corpus: Path

    def checkpoint(self) -> Path:
        return Path(shutil.copytree(self.trained, self.root / "ck"))

    def pretrain(self, *argv) -> tuple:
        return pretrain_gpt.main, TINY + ["--data-cache-dir", self.cache, "--metrics-file",
                                          self.root / "metrics.jsonl", *argv]

    def resume(self, ck: Path) -> tuple:
        # --train-iters 1: a load that succeeds has nothing left to train, so it writes no checkpoint.
        return self.pretrain("--load", ck, "--save", ck, "--train-iters", "1")


# ---- the generator --------------------------------------------------------------------------------

def flag_cases(rng: random.Random) -> list[Case]:
    cases = [Case(f"flag {flag}={value!r}", lambda w, f=flag, v=value: w.pretrain(f"{f}={v}"))
             for flag in FLOAT_FLAGS for value in FLOAT_VALUES]
    cases += [Case(f"flag {flag}={value!r}", lambda w, f=flag, v=value: w.pretrain(f"{f}={v}"))
              for flag in INT_FLAGS for value in INT_VALUES]
    cases += [Case(f"flags {' '.join(argv)}", lambda w, a=argv: w.pretrain(*a)) for argv in OTHER_FLAGS]
    return cases


def _random_text(rng: random.Random, size: int) -> bytes:
    return rng.randbytes(size)


def _structured_documents(rng: random.Random, kind: str) -> list[tuple[str, bytes]]:
    """(name, file content) for a YAML preset or a DeepSpeed JSON: the ways such a file is bad."""
    deep = 10_000
    items = [(f"random bytes {i}", _random_text(rng, rng.randint(1, 400))) for i in range(6)]
    items += [("not UTF-8", b"num_layers: 2\nlr: \xff\xfe\xfa\n" if kind == "yaml" else b'{"fp16": "\xff\xfe"}'),
              ("UTF-16", "num_layers: 2\n".encode("utf-16") if kind == "yaml" else '{"fp16": {}}'.encode("utf-16")),
              ("nested lists", ("[" * deep + "]" * deep).encode()),
              ("nested mappings", ("{a: " * deep + "1" + "}" * deep).encode() if kind == "yaml"
               else ('{"a": ' * deep + "1" + "}" * deep).encode()),
              ("a list", b"[1, 2, 3]"), ("a scalar", b"42"), ("empty mapping key", b'{"": 1}'),
              ("truncated", b'{"zero_optimization": {"stage": ' if kind == "json" else b"num_layers: [1, 2\n")]
    if kind == "yaml":
        items += [(f"bad value {key}: {value}", f"{key}: {value}\n".encode()) for key, value in [
            ("num_layers", "abc"), ("num_layers", "[1, 2]"), ("num_layers", "{a: 1}"), ("lr", ".nan"),
            ("lr", ".inf"), ("lr", "-.inf"), ("clip_grad", ".nan"), ("seed", "-5"), ("bf16", "maybe"),
            ("zero_stage", "9"), ("no_such_key", "1"), ("config", "tiny"), ("device", "toaster"),
            ("hidden_size", "1e999"), ("data_path", "{x: 1}")]]
        items += [("alias bomb", b"a: &a [1, 1, 1]\nb: &b [*a, *a, *a]\nnum_layers: [*b, *b]\n"),
                  ("tab indentation", b"num_layers:\n\t- 1\n")]
    else:
        items += [(f"bad value {text}", text.encode()) for text in [
            '{"gradient_clipping": NaN}', '{"gradient_clipping": Infinity}', '{"gradient_clipping": "1"}',
            '{"zero_optimization": {"stage": 9}}', '{"zero_optimization": {"stage": "2"}}',
            '{"zero_optimization": []}', '{"zero_optimization": {"stage": 1, "stage": 2}}',
            '{"fp16": {"enabled": true}, "bf16": {"enabled": true}}', '{"fp16": {"loss_scale": -1}}',
            '{"fp16": {"initial_scale_power": 99}}', '{"optimizer": {"type": "Adam"}}',
            '{"train_batch_size": 1.5}', '{"activation_checkpointing": {"number_checkpoints": "x"}}',
            '{"zero_optimization": {"reduce_bucket_size": -1e308}}', '{"fp16": {"enabled": "yes"}}']]
    return items


def config_file_cases(rng: random.Random, kind: str, flag: str, label: str) -> list[Case]:
    """A bad YAML preset (`kind` "yaml", --config) or DeepSpeed JSON ("json", --zero-config) each."""
    def case(name, content):
        def run(w):
            path = w.root / f"config.{kind}"
            path.write_bytes(content)
            return w.pretrain(flag, path)
        return Case(f"{label}: {name}", run)
    return [case(name, content) for name, content in _structured_documents(rng, kind)]


def latest_cases(rng: random.Random) -> list[Case]:
    contents = [b"", b" \n", b"iter_", b"iter_abc", b"iter_9999999\n", b"../elsewhere/iter_0000002",
                b"/etc/passwd", b"iter_0000002/../../x", b"iter_0000002\x00", b"\xff\xfe\x00i\x00t\x00",
                b"iter_0000002" * 1000, b"latest", b".", b"..", b"iter_0000002.partial", b"iter_-000002",
                b"iter_0000002\n", b"iter_0000001", b"  iter_0000002  \n\n"]
    contents += [_random_text(rng, rng.randint(1, 64)) for _ in range(8)]

    def case(content):
        def run(w):
            ck = w.checkpoint()
            (ck / LATEST_FILE).write_bytes(content)
            return w.resume(ck)
        return Case(f"latest holds {content[:40]!r}", run)

    def latest_is_a_directory(w):
        ck = w.checkpoint()
        (ck / LATEST_FILE).unlink()
        (ck / LATEST_FILE).mkdir()
        return w.resume(ck)
    return [case(content) for content in contents] + [Case("latest is a directory", latest_is_a_directory)]


def _metadata_mutations(rng: random.Random) -> list[tuple[str, Callable[[dict], object]]]:
    """(name, mutation of the parsed metadata returning the new JSON value)."""
    def setting(key, value):
        def mutate(metadata):
            metadata[key] = value
            return metadata
        return mutate

    def dropping(key):
        def mutate(metadata):
            del metadata[key]
            return metadata
        return mutate

    def renaming_files(metadata):
        metadata["files"] = {f"../{name}": size for name, size in metadata["files"].items()}
        return metadata

    def wrong_hash(metadata):
        metadata["file_hashes"] = {name: "sha256:" + "0" * 64 for name in metadata["file_hashes"]}
        return metadata

    def unknown_hash(metadata):
        metadata["file_hashes"] = {name: "md99:abc" for name in metadata["file_hashes"]}
        return metadata

    def wrong_size(metadata):
        name = sorted(metadata["files"])[0]
        metadata["files"][name] += 1
        return metadata

    mutations = [(f"{key} = {value!r}", setting(key, value)) for key, value in [
        ("iteration", "2"), ("iteration", -1), ("iteration", None), ("iteration", 2.5), ("consumed_samples", []),
        ("tensor_parallel_size", 0), ("tensor_parallel_size", 3), ("data_parallel_size", "one"), ("zero_stage", 7),
        ("adam_step", True), ("parameters", []), ("parameters", {"x": {"shape": "big"}}), ("optimizer_shards", {}),
        ("optimizer_shards", [[0, 0]]), ("files", []), ("files", {"a": -1}), ("format_version", 2),
        ("precision", "fp64"), ("lr", "fast"), ("loss_scaler", 3), ("model_files", [[0, "/etc/passwd"]]),
        ("rng_files", [["a", 0, "x"]]), ("tokenizer", "../../tokenizer"), ("config", []),
        ("config", {"model": 1}), ("file_hashes", {"model_tp00.safetensors": 5})]]
    mutations += [(f"without {key}", dropping(key)) for key in
                  ("iteration", "parameters", "optimizer_shards", "files", "format_version")]
    mutations += [("file names outside", renaming_files), ("wrong hashes", wrong_hash),
                  ("unknown hash algorithm", unknown_hash), ("a wrong size", wrong_size)]
    return mutations


def metadata_cases(rng: random.Random) -> list[Case]:
    def from_mutation(name, mutate):
        def run(w):
            ck = w.checkpoint()
            path = ck / "iter_0000002" / METADATA_FILE
            path.write_text(json.dumps(mutate(json.loads(path.read_text()))))
            return w.resume(ck)
        return Case(f"metadata: {name}", run)

    def from_bytes(name, make):
        def run(w):
            ck = w.checkpoint()
            path = ck / "iter_0000002" / METADATA_FILE
            path.write_bytes(make(path.read_bytes()))
            return w.resume(ck)
        return Case(f"metadata: {name}", run)

    cases = [from_mutation(name, mutate) for name, mutate in _metadata_mutations(rng)]
    cuts = sorted(rng.sample(range(1, 4000), 5))
    cases += [from_bytes(f"truncated at {cut}", lambda data, c=cut: data[:c]) for cut in cuts]
    cases += [from_bytes("not UTF-8", lambda data: data.replace(b'"iteration"', b'"\xff\xfeiteration"')),
              from_bytes("nested 10^5 deep", lambda data: b"[" * 100_000 + b"]" * 100_000),
              from_bytes("random bytes", lambda data, r=rng.randbytes(300): r)]
    return cases


def damaged_file_cases(rng: random.Random) -> list[Case]:
    """Truncated and bit-flipped checkpoint files, loaded by a run and by the tools."""
    names = ["model_tp00.safetensors", "optim_tp00_dp000.safetensors", "rng_tp00_dp000.safetensors"]

    def case(description, name, damage, tool):
        def run(w):
            ck = w.checkpoint()
            path = ck / "iter_0000002" / name
            path.write_bytes(damage(path.read_bytes()))
            if tool == "zero_to_fp32":
                return zero_to_fp32.main, [ck, w.root / "out.safetensors"]
            if tool == "reshard":
                return reshard_checkpoint.main, [ck, w.root / "tp2", "--tensor-model-parallel-size", "2"]
            return w.resume(ck)
        return Case(f"{name} {description} ({tool})", run)

    def flip(fraction, bit):
        def damage(data):
            data = bytearray(data)
            data[min(int(fraction * len(data)), len(data) - 1)] ^= 1 << bit
            return bytes(data)
        return damage

    def truncate(fraction):
        return lambda data: data[:int(fraction * len(data))]

    cases = []
    for name in names:
        cases.append(case("flipped in the length prefix", name, flip(0.0, rng.randrange(8)), "pretrain"))
        for index, tool in enumerate(("pretrain", "pretrain", "zero_to_fp32", "reshard")):
            where, bit, cut = rng.random() ** 3, rng.randrange(8), rng.random()  # cubed: headers are hit too
            cases.append(case(f"bit {bit} flipped at {where:.4f} #{index}", name, flip(where, bit), tool))
            cases.append(case(f"truncated to {cut:.4f} #{index}", name, truncate(cut), tool))
    return cases


def corpus_cases(rng: random.Random) -> list[Case]:
    """The prepared corpus damaged in a private copy of the cache."""
    def case(name, suffix, damage):
        def run(w):
            cache = w.root / "cache"
            shutil.copytree(w.corpus.parent, cache / w.corpus.parent.name)
            target = next(path for path in cache.rglob("*") if path.name.endswith(suffix))
            target.write_bytes(damage(target.read_bytes()))
            return pretrain_gpt.main, TINY + ["--data-cache-dir", cache, "--metrics-file", w.root / "m.jsonl"]
        return Case(f"corpus {suffix}: {name}", run)

    def flip_at(offset):
        def damage(data):
            data = bytearray(data)
            data[offset % len(data)] ^= 0x80
            return bytes(data)
        return damage

    cases = [case("truncated", ".bin", lambda d: d[:-7]), case("truncated", ".idx", lambda d: d[:-3]),
             case("empty", ".idx", lambda d: b""), case("high bit of a token", ".bin", flip_at(1)),
             case("magic", ".idx", flip_at(0)), case("dtype code", ".idx", flip_at(17)),
             case("sequence count", ".idx", flip_at(20)), case("tokenizer.json", "tokenizer.json", flip_at(2)),
             case("a pointer", ".idx", flip_at(-9))]
    cases += [case(f"random bit {i}", ".bin", flip_at(rng.randrange(1 << 20))) for i in range(2)]
    return cases


def tool_cases(rng: random.Random) -> list[Case]:
    def tool(name, main, make_argv):
        return Case(f"tool {name}", lambda w: (main, make_argv(w)))

    return [
        tool("zero_to_fp32 no args", zero_to_fp32.main, lambda w: []),
        tool("zero_to_fp32 missing", zero_to_fp32.main, lambda w: [w.root / "none", w.root / "o.safetensors"]),
        tool("zero_to_fp32 into the checkpoint", zero_to_fp32.main,
             lambda w: [w.checkpoint(), w.root / "ck" / "iter_0000002" / "x.safetensors", "--overwrite"]),
        tool("zero_to_fp32 over an existing file", zero_to_fp32.main,
             lambda w: [w.checkpoint(), w.root / "ck" / LATEST_FILE]),
        tool("reshard tp 0", reshard_checkpoint.main,
             lambda w: [w.checkpoint(), w.root / "o", "--tensor-model-parallel-size", "0"]),
        tool("reshard tp x", reshard_checkpoint.main,
             lambda w: [w.checkpoint(), w.root / "o", "--tensor-model-parallel-size", "x"]),
        tool("reshard into itself", reshard_checkpoint.main,
             lambda w: [w.checkpoint(), w.root / "ck", "--tensor-model-parallel-size", "2"]),
        tool("convert bad dtype", convert_to_hf.main, lambda w: [w.checkpoint(), w.root / "hf", "--dtype", "fp8"]),
        tool("convert into the checkpoint", convert_to_hf.main,
             lambda w: [w.checkpoint(), w.root / "ck" / "iter_0000001", "--overwrite"]),
        tool("preprocess no input", preprocess.main, lambda w: ["--output-prefix", w.root / "o"]),
        tool("preprocess missing input", preprocess.main,
             lambda w: ["--input", w.root / "none.jsonl", "--output-prefix", w.root / "o",
                        "--train-tokenizer-vocab-size", "300"]),
        tool("preprocess output under a file", preprocess.main,
             lambda w: ["--input", REPO / "README.md", "--input-format", "text", "--output-prefix",
                        REPO / "README.md" / "o", "--train-tokenizer-vocab-size", "300"]),
        tool("preprocess workers -3", preprocess.main,
             lambda w: ["--input", w.root / "x.jsonl", "--output-prefix", w.root / "o", "--workers", "-3"]),
    ]


def all_cases() -> list[Case]:
    rng = random.Random(SEED)
    return (flag_cases(rng) + config_file_cases(rng, "yaml", "--config", "YAML preset")
            + config_file_cases(rng, "json", "--zero-config", "DeepSpeed JSON") + latest_cases(rng)
            + metadata_cases(rng) + damaged_file_cases(rng) + corpus_cases(rng) + tool_cases(rng))


CASES = all_cases()


# ---- the checks -----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    """The corpus and a save directory with checkpoints at iterations 1 and 2 (via the real program)."""
    from data.corpus import prepare_default_corpus

    root = tmp_path_factory.mktemp("fuzz")
    cache = root / "cache"
    corpus = Path(prepare_default_corpus(str(cache), 300).data_prefix)
    outcome = run_main(pretrain_gpt.main, TINY + ["--data-cache-dir", cache, "--metrics-file", root / "m.jsonl",
                                                  "--save", root / "ck", "--save-interval", "1"])
    assert outcome.code == 0, outcome.err
    return str(cache), root / "ck", corpus


def test_there_are_enough_cases():
    assert len(CASES) >= MINIMUM_CASES
    assert len({case.name for case in CASES}) == len(CASES)


@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_bad_input_is_one_line_or_a_clean_run(case, prepared, tmp_path):
    cache, trained, corpus = prepared
    workspace = Workspace(tmp_path, cache, trained, corpus)
    reference = snapshot(trained)
    main, argv = case.run(workspace)
    checkpoints = {path: snapshot(path) for path in [tmp_path / "ck"] if path.exists()}
    outcome = run_main(main, argv)
    assert outcome.code in (0, 2), (case.name, outcome.code, outcome.err[-3000:])
    assert "Traceback" not in outcome.err, (case.name, outcome.err)
    if outcome.code == 2:
        assert len(outcome.err_lines) == 1 and ": error: " in outcome.err, (case.name, outcome.err)
    for path, before in checkpoints.items():
        assert snapshot(path) == before, (case.name, path)
    assert snapshot(trained) == reference
