"""Every number a checkpoint's metadata.json holds, at the extremes: one line and exit 2, or a resume that
trains exactly as the untouched checkpoint does (issue 47, items 4 and 5).

The fuzz rewrites one numeric entry at a time (every number in the file: counts, sizes, ranks, shapes, loss scale,
learning rate, the recorded config's settings, null ones of a numeric type included) to 0, -1, 2**63 - 1, 2**63,
10**19, 1e19, 1e30, NaN, Infinity and a string, and resumes through pretrain_gpt's own `main` in this process.
metadata.json is in no checksum (checkpoint/integrity.py hashes the files it lists), so a hand edit reaches the range
checks directly, as here.

Two passes, to stay fast. First every variant starts with the tokenizer's load replaced by a stop: a refused variant
must exit 2 with one stderr line before reaching it (refusals come before any data or model work). Then the accepted
variants train for real, combined (one value per entry, many entries in one checkpoint): a combination whose losses
equal the untouched resume's clears its variants, one that does not is split until the variant that changes training
is alone, and the test names it. The accepted values that do change training are states a real run reaches: an
`adam_step` of 0 (what a resume with --no-load-optim saves) and an `lr_schedule_samples` of 0 (an fp16 run whose
every step was skipped); their resumes must train, with other losses."""

from __future__ import annotations

import collections
import functools
import itertools
import json
import math
import os
import shutil
from pathlib import Path

import pytest

import arguments.parser
import pretrain_gpt
from arguments.config import ConfigError, PretrainConfig
from arguments.parser import one_error
from base.errors import CheckpointError
from base.options import option_fields
from checkpoint.format import LATEST_FILE, METADATA_FILE
from tests.reliability_helpers import TINY, metrics_records, run_main

TRAIN = ["--global-batch-size", "4", "--train-iters", "4"]  # micro batch 2: two accumulation steps
SAVED = "iter_0000002"
EXTREMES = [0, -1, 2**63 - 1, 2**63, 10**19, 1e19, 1e30, float("nan"), float("inf"), "x"]
NUMERIC_SETTINGS = ("int", "float", "Optional[int]", "Optional[float]", "Optional[list[int]]")
# (entry, value) that a real run saves and that changes what the resume trains (module docstring).
LEGITIMATE = {(("adam_step",), 0), (("lr_schedule_samples",), 0)}


class ReachedData(BaseException):
    """Raised in place of the first data work: the variant got past every check."""


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """The corpus, a checkpoint at iteration 2 of a 4-iteration run, and its untouched resume's records."""
    from data.corpus import prepare_default_corpus

    root = tmp_path_factory.mktemp("ranges")
    cache = root / "cache"
    prepare_default_corpus(str(cache), 300)
    outcome = run_main(pretrain_gpt.main, TINY + TRAIN + ["--data-cache-dir", cache, "--metrics-file", root / "m.jsonl",
                                                          "--save", root / "ck", "--exit-interval", "2"])
    assert outcome.code == 0, outcome.err
    reference = resume(root, cache, root / "ck", "reference")
    assert reference.code == 0, reference.err
    return root, cache, training_records(root / "reference.jsonl")


def resume(root: Path, cache: Path, ck: Path, name: str, *extra):
    return run_main(pretrain_gpt.main, TINY + TRAIN + ["--data-cache-dir", cache, "--metrics-file",
                                                       root / f"{name}.jsonl", "--load", ck, *extra])


def training_records(path: Path) -> list[tuple]:
    """What the resumed iterations trained: (iteration, consumed samples, loss, lr, gradient norm)."""
    return [(r["iteration"], r["consumed_samples"], r["loss"], r["lr"], r["grad_norm"]) for r in metrics_records(path)
            if "loss" in r and "split" not in r]


def numeric_entries(value, where=()) -> list[tuple]:
    """Every number in the metadata, as a key path; the recorded config's numeric settings, null or not."""
    if isinstance(value, bool) or isinstance(value, str) or value is None:
        return []
    if isinstance(value, (int, float)):
        return [where]
    items = value.items() if isinstance(value, dict) else enumerate(value)
    found = []
    for key, item in items:
        if where == () and key == "config":
            config = PretrainConfig()
            found += [("config", section, f.name) for section in config.SECTIONS
                      for f, _ in option_fields(type(getattr(config, section)))
                      if str(f.type) in NUMERIC_SETTINGS and f.name in item.get(section, {})]
        else:
            found += numeric_entries(item, where + (key,))
    return found


def edited(metadata: dict, edits: list[tuple]) -> dict:
    metadata = json.loads(json.dumps(metadata))
    for where, value in edits:
        target = metadata
        for key in where[:-1]:
            target = target[key]
        target[where[-1]] = value
    return metadata


def variant(root: Path, original: Path, name: str, metadata: dict) -> Path:
    """A copy of the checkpoint (files hard-linked) with `metadata` as its metadata.json."""
    ck = root / name
    shutil.rmtree(ck, ignore_errors=True)
    (ck / SAVED).mkdir(parents=True)
    (ck / LATEST_FILE).write_text(SAVED + "\n")
    shutil.copytree(original / SAVED, ck / SAVED, dirs_exist_ok=True, copy_function=os.link,
                    ignore=lambda directory, names: [METADATA_FILE] if Path(directory) == original / SAVED else [])
    (ck / SAVED / METADATA_FILE).write_text(json.dumps(metadata))
    return ck


class Probe:
    """One copy of the checkpoint (files hard-linked) that every variant of a fuzz reuses: only metadata.json
    differs between variants, so it alone is rewritten (a new file renamed over the old), where a fresh copy
    a variant cost two thirds of the fuzz's file work (the copy, and removing it for the next variant). A
    resume (no --save) and the tools read the checkpoint and write nothing into it, as a fresh copy made sure:
    `write` asserts that the copy holds the same files as the original before each variant."""

    def __init__(self, root: Path, original: Path, name: str, metadata: dict):
        self.ck = variant(root, original, name, metadata)
        self.files = self.listing()

    def listing(self) -> list[str]:
        return sorted(str(path.relative_to(self.ck)) for path in self.ck.rglob("*"))

    def write(self, metadata: dict) -> Path:
        assert self.listing() == self.files, "a probe wrote into the checkpoint it read"
        path = self.ck / SAVED / METADATA_FILE
        temporary = path.with_name(METADATA_FILE + ".next")
        temporary.write_text(json.dumps(metadata))
        os.replace(temporary, path)
        return self.ck


def same(value, other) -> bool:
    if isinstance(value, float) and isinstance(other, float) and math.isnan(value) and math.isnan(other):
        return True
    return type(value) is type(other) and value == other


def test_every_numeric_entry_at_the_extremes(saved, monkeypatch):
    root, cache, reference = saved
    original = root / "ck"
    metadata = json.loads((original / SAVED / METADATA_FILE).read_text())
    entries = numeric_entries(metadata)
    assert len(entries) > 100  # the counts, sizes, ranks, shapes, loss scale, lr and ~75 config settings
    current = {}
    for where in entries:
        value = metadata
        for key in where:
            value = value[key]
        current[where] = value

    # Pass 1: each variant up to the first data work.
    def stop(*args, **kwargs):
        raise ReachedData()

    # Every probe's command line is the same (only metadata.json differs), and the memory-fit check before the
    # checkpoint is read (pretrain_gpt.run: check_memory_fits, then claim_run_start) planned it anew each time
    # with a dry run of the model on meta tensors: half a probe's time. The dry run is made once and its figures
    # given to every probe's check, which still runs; `planned_once` asserts its inputs are the first probe's.
    planned: list[tuple] = []

    def planned_once(config, state, vocab_size, batch):
        inputs = (config, state.world_size, state.rank, state.device, vocab_size, batch)
        if not planned:
            planned.append((inputs, real_planned_peaks(config, state, vocab_size, batch)))
        assert inputs == planned[0][0], "a probe's memory check planned another launch"
        return planned[0][1]

    import planner.launch
    real_planned_peaks = planner.launch._planned_peaks

    # Every probe's command line is the same, so what the flags alone make of it is the same too: the flags are
    # parsed into their config once (three quarters of a probe's time) and every probe runs the checks that read
    # the disk (training/late_checks.py's LATE_CHECKS: check_load reads the variant's metadata.json) against that
    # config, its problems raised as arguments/parser.py's parse_arguments raises them. `parsed_once` asserts its
    # command line is the first probe's.
    real_parse_arguments = pretrain_gpt.parse_arguments
    parsed: list[tuple] = []

    def parsed_once(argv, late_checks=()):
        if not parsed:
            parsed.append((list(argv), real_parse_arguments(argv)))  # no late check: the flags alone, no problem
        assert list(argv) == parsed[0][0], "a probe parsed another command line"
        assert late_checks, "the probe's late checks are run here"
        problems = []
        for check in late_checks:
            try:
                check(parsed[0][1].config)
            except (ConfigError, CheckpointError) as error:
                problems.append(str(error))
        if problems:
            raise ConfigError(one_error(problems))
        return parsed[0][1]

    probe = Probe(root, original, "probe", metadata)
    accepted = []
    with monkeypatch.context() as patch:
        patch.setattr("training.prepare.load_tokenizer_and_data_sources", stop)
        # The flags' parser is built once for the ~1200 probes; parsing does not change it.
        patch.setattr("arguments.parser.build_parser", functools.cache(arguments.parser.build_parser))
        patch.setattr(planner.launch, "_planned_peaks", planned_once)
        patch.setattr(pretrain_gpt, "parse_arguments", parsed_once)
        for where in entries:
            for value in EXTREMES:
                if same(value, current[where]):
                    continue
                ck = probe.write(edited(metadata, [(where, value)]))
                try:
                    outcome = resume(root, cache, ck, "probe")
                except ReachedData:
                    accepted.append((where, value))
                    continue
                label = f"{'.'.join(map(str, where))} = {value!r}"
                assert outcome.code == 2, (label, outcome.code, outcome.err[-2000:])
                assert "Traceback" not in outcome.err, (label, outcome.err)
                lines = [line for line in outcome.err.splitlines() if line.strip()]
                assert len(lines) == 1, (label, outcome.err)
    assert len(planned) == 1 and planned[0][1][0][0], planned  # one plan, with a peak: the check had figures
    assert len(parsed) == 1  # one parse of the flags
    refused = len(entries) * len(EXTREMES) - len(accepted)
    assert accepted and refused > len(accepted)  # most extremes are no count at all

    # Pass 2: the accepted variants trained for real, many at once, split where the losses differ.
    def train(group: list[tuple], name: str) -> tuple[int, list]:
        outcome = resume(root, cache, variant(root, original, name, edited(metadata, group)), name)
        if outcome.code == 2:
            assert len(outcome.err.splitlines()) == 1 and "Traceback" not in outcome.err, outcome.err
        return outcome.code, training_records(root / f"{name}.jsonl") if outcome.code == 0 else []

    runs = itertools.count()

    def check(group: list[tuple]) -> None:
        code, records = train(group, f"group{next(runs)}")
        if code == 0 and records == reference:
            return
        if len(group) == 1:
            label = f"{'.'.join(map(str, group[0][0]))} = {group[0][1]!r}"
            assert group[0] in LEGITIMATE, (label, code, records, reference)
            assert code == 0 and records != reference and all(math.isfinite(r[2]) for r in records), label
            return
        check(group[:len(group) // 2])
        check(group[len(group) // 2:])

    # The two values that change training (LEGITIMATE) train alone: in a group, each split the group in halves down
    # to itself (about 2 log2(group) runs each); the rest train in groups, split as before.
    for legitimate in [edit for edit in accepted if edit in LEGITIMATE]:
        check([legitimate])
    rounds: list[list[tuple]] = []  # round k holds each entry's k-th accepted value
    seen: dict[tuple, int] = collections.Counter()
    for where, value in [edit for edit in accepted if edit not in LEGITIMATE]:
        if len(rounds) <= seen[where]:
            rounds.append([])
        rounds[seen[where]].append((where, value))
        seen[where] += 1
    for group in rounds:
        check(group)


def one_line(outcome, *words) -> str:
    assert outcome.code == 2, (outcome.code, outcome.err[-2000:])
    assert len(outcome.err.splitlines()) == 1 and "Traceback" not in outcome.err, outcome.err
    for word in words:
        assert word in outcome.err, (word, outcome.err)
    return outcome.err


def edited_checkpoint(root: Path, name: str, edit=None, text=None) -> Path:
    """The fixture's checkpoint with its metadata edited: `edit(metadata)` on the parsed JSON, or `text(raw)`."""
    original = root / "ck"
    metadata = json.loads((original / SAVED / METADATA_FILE).read_text())
    if edit is not None:
        edit(metadata)
    ck = variant(root, original, name, metadata)
    if text is not None:
        path = ck / SAVED / METADATA_FILE
        path.write_text(text(path.read_text()))
    return ck


def test_an_adam_step_beyond_int64_is_refused_in_one_line(saved):
    """Issue 47, item 4: an `adam_step` of 10**19 (beyond int64) trained on with other losses, without a
    word, and 10**30 was a traceback; an integer of 5000 digits is more than Python's json converts."""
    root, cache, _ = saved
    for value in (10**19, 10**30, 2**63):
        ck = edited_checkpoint(root, f"step{value}", lambda m, v=value: m.__setitem__("adam_step", v))
        one_line(resume(root, cache, ck, f"step{value}"), "metadata.json", "'adam_step'", str(value), "int64")
    ck = edited_checkpoint(root, "digits", text=lambda raw: raw.replace('"adam_step": 2', '"adam_step": ' + "7" * 5000))
    one_line(resume(root, cache, ck, "digits"), "metadata.json", "too long")


def test_consumed_samples_past_the_runs_schedule_is_one_line_naming_the_flag(saved):
    """Issue 47, item 5: a checkpoint that consumed more samples than the resumed run's schedule covers
    ended in data/sampler.py's ValueError traceback. Megatron-LM trains nothing when the loaded iteration
    is at --train-iters (training.py's `while iteration < args.train_iters`), and otherwise asserts in
    MegatronPretrainingSampler.__init__ (megatron/training/datasets/data_samplers.py, "no samples left to
    consume"); here that assertion is a refusal before any data work, naming the flag that fits."""
    root, cache, _ = saved
    # Saved at global batch 4 (8 samples in 2 iterations), resumed at 2: the 8 samples --train-iters 4 covers
    # are all consumed already.
    outcome = resume(root, cache, root / "ck", "smaller", "--global-batch-size", "2", "--override-opt_param-scheduler")
    one_line(outcome, "consumed 8 samples", "--global-batch-size 4")
    # More samples than its iterations' batches (an upcycled lineage's: Megatron-LM's setup_model_and_optimizer keeps
    # the dense run's consumed_train_samples) read on, as Megatron-LM's sampler reads on from them ...
    ck = edited_checkpoint(root, "thousand", lambda m: m.__setitem__("consumed_samples", 1000))
    outcome = resume(root, cache, ck, "thousand")
    assert outcome.code == 0 and "(1000 samples consumed)" in outcome.out, outcome.err[-2000:]
    # ... until the sample index to read on could not be held here (2**62 fits an int64)
    ck = edited_checkpoint(root, "huge", lambda m: m.__setitem__("consumed_samples", 2**62))
    one_line(resume(root, cache, ck, "huge"), f"consumed {2**62} samples", "sample index", "--finetune")
    for value in (2e19, 10**20, 1e20):
        ck = edited_checkpoint(root, f"c{value}", lambda m, v=value: m.__setitem__("consumed_samples", v))
        one_line(resume(root, cache, ck, f"c{value}"), "metadata.json", "'consumed_samples'", "int64")
    # At --train-iters there is nothing to train, whatever was consumed: the run says so and ends, as Megatron's.
    ck = edited_checkpoint(root, "done", lambda m: m.__setitem__("consumed_samples", 1000))
    outcome = resume(root, cache, ck, "done", "--train-iters", "2", "--override-opt_param-scheduler")
    assert outcome.code == 0, outcome.err
    assert "nothing to train" in outcome.out


def test_random_states_out_of_range_are_one_line_naming_the_file(saved):
    """The numbers the checkpoint files' own metadata hold are read too: an RNG file's NumPy and Python
    Mersenne Twister states (NumPy took a position of 2**70 with an OverflowError traceback, and -1
    silently) and an optimizer file's fragment table. The edit is made as a user would have to: the
    file rewritten, its size and hash in metadata.json recomputed (checkpoint/integrity.py covers the
    listed files, not metadata.json)."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    from checkpoint.integrity import file_digest

    root, cache, _ = saved

    def rewrite(name: str, entry: str, change) -> Path:
        ck = edited_checkpoint(root, "files")
        path = ck / SAVED / name
        with safe_open(str(path), framework="pt") as reader:
            tensors = {key: reader.get_tensor(key) for key in reader.keys()}
            extra = reader.metadata()
        state = json.loads(extra[entry])
        change(state)
        extra[entry] = json.dumps(state)
        path.unlink()  # a hard link to the fixture's file: write a new one
        save_file(tensors, str(path), metadata=extra)
        metadata = json.loads((ck / SAVED / METADATA_FILE).read_text())
        metadata["files"][name] = path.stat().st_size
        metadata["file_hashes"][name] = file_digest(path, metadata["file_hashes"][name].split(":")[0])
        (ck / SAVED / METADATA_FILE).write_text(json.dumps(metadata))
        return ck

    rng, optimizer = "rng_tp00_dp000.safetensors", "optim_tp00_dp000.safetensors"
    for name, entry, change, words in [
            (rng, "numpy", lambda state: state.__setitem__(1, 2**70), "corrupt random states"),
            (rng, "numpy", lambda state: state.__setitem__(1, -1), "corrupt random states"),
            (rng, "python", lambda state: state[1].__setitem__(0, 2**70), "corrupt random states"),
            (optimizer, "fragments", lambda table: table[0].__setitem__(1, 2**64), "corrupt fragment table")]:
        one_line(resume(root, cache, rewrite(name, entry, change), "files"), name, words)


def test_the_tools_read_every_numeric_entry_at_the_extremes_in_one_line_or_cleanly(saved, tmp_path, monkeypatch):
    """The offline tools trust the same metadata: zero_to_fp32.py, reshard_checkpoint.py and convert_to_hf.py
    on every variant of the fuzz above end in one stderr line and exit 2, or exit 0. Before, the recorded
    model settings went unchecked: convert_to_hf.py looped over a num_layers of 2**63 - 1 until memory ran
    out (the address space is capped here, so that ends in a MemoryError, not in the machine's OOM killer),
    reshard_checkpoint.py allocated a vocabulary of 2**63 - 1 rows, and transformers refused a layernorm
    epsilon written as an integer, each with a traceback."""
    import resource

    from scripts.tools import convert_to_hf, reshard_checkpoint, zero_to_fp32

    root, _, _ = saved
    original = root / "ck"
    metadata = json.loads((original / SAVED / METADATA_FILE).read_text())
    tools = [("zero_to_fp32", zero_to_fp32.main, lambda ck: [ck, tmp_path / "fp32.safetensors", "--overwrite"]),
             ("reshard", reshard_checkpoint.main,
              lambda ck: [ck, tmp_path / "tp2", "--tensor-model-parallel-size", "2", "--overwrite"]),
             ("convert_to_hf", convert_to_hf.main, lambda ck: [ck, tmp_path / "hf", "--overwrite"])]
    probe = Probe(root, original, "tool-probe", metadata)
    # The tools' writes are fsynced (checkpoint/format.py's durable writes): a third of this test's time on the
    # CI machine's disk, for ~1000 outputs that are removed at once. What is asserted (exit status, stderr) does
    # not depend on the data reaching the disk, so os.fsync returns at once here (the calls are still made).
    fsyncs = []
    monkeypatch.setattr(os, "fsync", fsyncs.append)
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    resource.setrlimit(resource.RLIMIT_AS, (8 << 30 if hard == resource.RLIM_INFINITY else min(8 << 30, hard), hard))
    try:
        for where in numeric_entries(metadata):
            current = metadata
            for key in where:
                current = current[key]
            for value in EXTREMES:
                if same(value, current):
                    continue
                ck = probe.write(edited(metadata, [(where, value)]))
                for name, main, argv in tools:
                    outcome = run_main(main, argv(ck))
                    label = f"{name}: {'.'.join(map(str, where))} = {value!r}"
                    assert outcome.code in (0, 2), (label, outcome.code, outcome.err[-2000:])
                    assert "Traceback" not in outcome.err, (label, outcome.err[-2000:])
                    if outcome.code == 2:
                        assert len(outcome.err.splitlines()) == 1, (label, outcome.err)
                    for output in ("tp2", "hf"):
                        shutil.rmtree(tmp_path / output, ignore_errors=True)
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
    assert fsyncs  # the tools wrote outputs (the variants they accept)
