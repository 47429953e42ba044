#!/usr/bin/env python
"""Index building for a blended GPT dataset: ours against Megatron-Core's own builders, same run.

    python scripts/bench/benchmark_index.py --small     # 2e6 tokens: checks the script runs (CI)

Both index a synthetic blend of three sources, alternately first; on Megatron-Core's document index ours must give
its sample index. Without megatron-core, ours runs alone."""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import shutil
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

import numpy as np

REPO_ROOT = Path(__file__).resolve().parents[2]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from data import gpt_dataset  # noqa: E402
from data.blending import build_blending_indices  # noqa: E402
from data.indexed import IndexedDataset, IndexedDatasetWriter, best_dtype  # noqa: E402

GPT2_VOCAB = 50257
LONGEST_DOCUMENT = 1 << 20


@dataclass(frozen=True)
class Source:
    name: str
    weight: float
    median_tokens: float
    sigma: float


SOURCES = (Source("web", 0.6, 400, 1.2), Source("code", 0.3, 300, 1.4), Source("books", 0.1, 60_000, 0.7))


# --------------------------------------------------------------------------- the synthetic corpus


def document_lengths(source: Source, tokens: int, seed: int) -> np.ndarray:
    """Lognormal lengths in [1, LONGEST_DOCUMENT] adding up to exactly `tokens`."""
    rng = np.random.default_rng([seed, SOURCES.index(source)])
    mean = source.median_tokens * np.exp(source.sigma ** 2 / 2)
    lengths = np.zeros(0, dtype=np.int64)
    while lengths.sum() < tokens:
        draw = rng.lognormal(np.log(source.median_tokens), source.sigma, size=int(tokens / mean * 1.1) + 16)
        lengths = np.concatenate([lengths, np.clip(np.rint(draw), 1, LONGEST_DOCUMENT).astype(np.int64)])
    ends = np.cumsum(lengths)
    count = int(np.searchsorted(ends, tokens)) + 1  # the first document reaching `tokens`, trimmed
    lengths = lengths[:count]
    lengths[-1] -= int(ends[count - 1]) - tokens
    return lengths[lengths > 0]


def write_corpus(directory: Path, tokens: int, seed: int) -> list[tuple[Source, str]]:
    """Write (or reuse, when its manifest matches) one .bin/.idx pair per source."""
    manifest = {"tokens": tokens, "seed": seed, "sources": [vars(s) for s in SOURCES], "format": 1}
    manifest_path = directory / "manifest.json"
    prefixes = [(source, str(directory / source.name)) for source in SOURCES]
    if manifest_path.is_file() and json.loads(manifest_path.read_text()) == manifest:
        return prefixes
    directory.mkdir(parents=True, exist_ok=True)
    dtype = best_dtype(GPT2_VOCAB)
    for source, prefix in prefixes:
        lengths = document_lengths(source, int(round(tokens * source.weight)), seed)
        tokens_of = np.zeros(int(lengths.max()), dtype=dtype)  # the values do not matter to the indices
        with IndexedDatasetWriter(prefix, dtype) as writer:
            for length in lengths.tolist():
                writer.add_document(tokens_of[:length])
        print(f"> wrote {prefix}: {lengths.size:,} documents, {int(lengths.sum()):,} tokens",
              file=sys.stderr, flush=True)
    manifest_path.write_text(json.dumps(manifest))
    return prefixes


# --------------------------------------------------------------------------- the two builders


def build_ours(prefixes: list[tuple[Source, str]], seq_length: int, num_samples: int, seed: int, cache: str):
    data_path = [str(value) for source, prefix in prefixes for value in (source.weight, prefix)]
    train, _, _ = gpt_dataset.build_train_valid_test_datasets(data_path, "1", seq_length, seed,
                                                              (num_samples, 0, 0), cache_dir=cache)
    return train


class MegatronCore:
    """Megatron-Core's dataset builders over the same files (they read our .bin/.idx as their own)."""

    def __init__(self, workdir: str):
        with contextlib.redirect_stdout(sys.stderr), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "apex / Transformer Engine not installed" on import
            import torch.distributed as dist
            from megatron.core.datasets import gpt_dataset as megatron_gpt
            from megatron.core.datasets import helpers
            from megatron.core.datasets.blended_megatron_dataset_builder import BlendedMegatronDatasetBuilder
            from megatron.core.datasets.indexed_dataset import IndexedDataset as MegatronIndexedDataset
        logging.getLogger("megatron").setLevel(logging.WARNING)
        self.helpers, self.gpt, self.builder = helpers, megatron_gpt, BlendedMegatronDatasetBuilder
        self.indexed = MegatronIndexedDataset
        # Its BlendedDataset asks torch.distributed for the rank before writing its cache.
        if not dist.is_initialized():
            dist.init_process_group("gloo", init_method=f"file://{workdir}/process_group", rank=0, world_size=1)

    def build(self, prefixes: list[tuple[Source, str]], seq_length: int, num_samples: int, seed: int, cache: str):
        config = self.gpt.GPTDatasetConfig(
            random_seed=seed, sequence_length=seq_length, split="100,0,0", path_to_cache=cache,
            blend=([prefix for _, prefix in prefixes], [source.weight for source, _ in prefixes]),
            tokenizer=_MegatronTokenizer(), reset_position_ids=False, reset_attention_mask=False,
            eod_mask_loss=False)
        with contextlib.redirect_stdout(sys.stderr):
            train, _, _ = self.builder(self.gpt.GPTDataset, [num_samples, 0, 0], lambda: True, config).build()
        return train

    def document_sample_shuffle(self, dataset) -> dict[str, Callable[[], np.ndarray]]:
        """Its three index stages for one of its GPTDatasets, as its _build_document_sample_shuffle_
        indices calls them (the epoch logic below is that method's)."""
        gpt, helpers, config = self.gpt, self.helpers, dataset.config
        tokens_per_epoch = dataset._get_num_tokens_per_epoch()
        epochs = dataset._get_num_epochs(tokens_per_epoch)
        separate_final_epoch, first_part = False, None
        if epochs > 1:
            first_part = ((epochs - 1) * tokens_per_epoch - 1) // config.sequence_length
            per_epoch = (tokens_per_epoch - 1) // config.sequence_length
            separate_final_epoch = dataset.num_samples - first_part < int(0.80 * per_epoch)
        lengths = dataset.dataset.sequence_lengths.copy()
        rng_state = np.random.RandomState(config.random_seed).get_state()

        def document():
            return gpt._build_document_index(dataset.indices, epochs, _restored(rng_state), separate_final_epoch)

        def sample():
            return helpers.build_sample_idx(lengths, dataset.document_index, config.sequence_length, epochs,
                                            tokens_per_epoch, True, True)

        def shuffle():
            total = dataset.sample_index.shape[0] - 1
            return gpt._build_shuffle_index(first_part if separate_final_epoch else total, total,
                                            _restored(rng_state))

        return {"document": document, "sample": sample, "shuffle": shuffle}

    def open_sources(self, prefixes: list[tuple[Source, str]]) -> Callable[[], list]:
        """What its GPTDataset reads before indexing: the memory-mapped .idx and its lengths."""
        return lambda: [self.indexed(prefix, multimodal=False, mmap=True).sequence_lengths for _, prefix in prefixes]

    def blending(self, weights: list[float], num_samples: int) -> Callable[[], np.ndarray]:
        def run():
            dataset_index = np.zeros(num_samples, dtype=np.int16)
            dataset_sample_index = np.zeros(num_samples, dtype=np.int64)
            self.helpers.build_blending_indices(dataset_index, dataset_sample_index, np.asarray(weights),
                                                len(weights), num_samples, False)
            return dataset_index
        return run


class _MegatronTokenizer:
    """What its GPTDatasetConfig reads from a tokenizer: the vocabulary size and the special ids."""

    vocab_size = GPT2_VOCAB
    eod = GPT2_VOCAB - 1
    pad = -1
    unique_identifiers = {"class": "SyntheticTokenizer", "vocab_size": GPT2_VOCAB}


def _restored(state) -> np.random.RandomState:
    rng = np.random.RandomState()
    rng.set_state(state)
    return rng


def load_megatron(workdir: str) -> Optional[MegatronCore]:
    try:
        return MegatronCore(workdir)
    except ImportError as error:
        print(f"> megatron-core is not installed ({error}); timing ours alone. "
              f"Install the peers with: pip install -r requirements-bench.txt", file=sys.stderr, flush=True)
        return None


# --------------------------------------------------------------------------- timing


def timed(function: Callable):
    began = time.perf_counter()
    result = function()
    return time.perf_counter() - began, result


def our_stages(dataset) -> dict[str, Callable[[], np.ndarray]]:
    """Our three index stages for one GPTDataset, on the inputs its constructor used."""
    lengths, boundaries = dataset.document_lengths, gpt_dataset.epoch_sample_boundaries(
        dataset.tokens_per_epoch, dataset.seq_length, dataset.num_epochs)
    epochs = dataset.document_index.size // dataset.document_ids.size
    return {"document": lambda: gpt_dataset.build_document_index(dataset.document_ids, epochs, dataset.seed),
            "sample": lambda: gpt_dataset.build_sample_index(lengths, dataset.document_index, dataset.seq_length,
                                                             int(boundaries[-1])),
            "shuffle": lambda: gpt_dataset.build_shuffle_index(boundaries, dataset.seed)}


def check_agreement(ours, theirs) -> list[str]:
    """Where the algorithms are the same, identical output; elsewhere, the properties both promise."""
    notes = []
    for mine, megatron in zip(ours.datasets, theirs.datasets):
        document_index = np.asarray(megatron.document_index)
        count = megatron.sample_index.shape[0] - 1
        mine_on_theirs = gpt_dataset.build_sample_index(mine.document_lengths, document_index, mine.seq_length, count)
        if not np.array_equal(mine_on_theirs, np.asarray(megatron.sample_index)):
            raise SystemExit(f"benchmark_index.py: our sample index on Megatron-Core's document index of "
                             f"{mine.indexed.prefix} differs from its own")
        for name, order in (("ours", mine.document_index), ("megatron", document_index)):
            epochs = len(order) // mine.document_ids.size
            if not np.array_equal(np.sort(order), np.repeat(mine.document_ids, epochs)):
                raise SystemExit(f"benchmark_index.py: {name}'s document index is not {epochs} copies of the documents")
    notes.append("sample index: identical (ours run on Megatron-Core's document index) for every source; "
                 "document index: each a permutation of whole epochs")
    for name, index in (("ours", ours.dataset_index), ("megatron", theirs.dataset_index)):
        drawn = np.bincount(np.asarray(index), minlength=len(ours.weights))
        worst = float(np.abs(drawn - np.asarray(ours.weights) * len(index)).max())
        if worst > 1.0:
            raise SystemExit(f"benchmark_index.py: {name}'s blend is {worst:.1f} samples off its shares")
        notes.append(f"blending ({name}): every source within {worst:.2f} samples of its exact share")
    return notes


def run_rounds(args, prefixes, megatron: Optional[MegatronCore], scratch: str) -> tuple[dict, list[str]]:
    num_samples = args.tokens // args.seq_length
    weights = [source.weight for source, _ in prefixes]
    times: dict[tuple[str, str], list[float]] = {}
    notes: list[str] = []

    def record(impl: str, what: str, seconds: float) -> None:
        times.setdefault((what, impl), []).append(seconds)

    for round_index in range(args.rounds):
        builders = [("ours", lambda cache: build_ours(prefixes, args.seq_length, num_samples, args.seed, cache))]
        if megatron is not None:
            builders.append(("megatron", lambda cache: megatron.build(prefixes, args.seq_length, num_samples,
                                                                        args.seed, cache)))
        if round_index % 2:
            builders.reverse()
        built = {}
        for impl, build in builders:
            cache = tempfile.mkdtemp(prefix=f"{impl}-cache-", dir=scratch)
            seconds, built[impl] = timed(lambda: build(cache))
            record(impl, "end-to-end build, cold cache", seconds)
            record(impl, "end-to-end build, warm cache", timed(lambda: build(cache))[0])
            shutil.rmtree(cache)
        if round_index == 0 and megatron is not None:
            notes = check_agreement(built["ours"], built["megatron"])
        stages = {"ours": [our_stages(d) for d in built["ours"].datasets]}
        blends = {"ours": lambda: build_blending_indices(weights, num_samples)}
        # Ours validates every pointer of the .idx against the lengths when it opens a dataset.
        opens = {"ours": lambda: [IndexedDataset(prefix).document_lengths for _, prefix in prefixes]}
        if megatron is not None:
            stages["megatron"] = [megatron.document_sample_shuffle(d) for d in built["megatron"].datasets]
            blends["megatron"] = megatron.blending(weights, num_samples)
            opens["megatron"] = megatron.open_sources(prefixes)
        for impl, _ in builders:
            record(impl, "open the sources (.idx, lengths)", timed(opens[impl])[0])
        for stage in ("document", "sample", "shuffle"):
            for impl, _ in builders:
                record(impl, f"{stage} index", sum(timed(per_source[stage])[0] for per_source in stages[impl]))
        for impl, _ in builders:
            record(impl, "blending index", timed(blends[impl])[0])
        cold = {impl: times[("end-to-end build, cold cache", impl)][-1] for impl, _ in builders}
        print(f"  round {round_index + 1}/{args.rounds}: cold build " +
              ", ".join(f"{impl} {seconds:.3f} s" for impl, seconds in cold.items()) +
              f"; load average {os.getloadavg()[0]:.2f}", file=sys.stderr, flush=True)
    return times, notes


STAGES = ("open the sources (.idx, lengths)", "document index", "sample index", "shuffle index", "blending index",
          "end-to-end build, cold cache", "end-to-end build, warm cache")


def format_table(times: dict, with_megatron: bool) -> tuple[str, Optional[float]]:
    lines = ["| stage (3 sources + blend) | ours (s) | Megatron-Core (s) | ours/Megatron |", "|---|---:|---:|---:|"]
    ratio = None
    for stage in STAGES:
        ours = min(times[(stage, "ours")])
        if with_megatron:
            theirs = min(times[(stage, "megatron")])
            lines.append(f"| {stage} | {ours:.3f} | {theirs:.3f} | {ours / theirs:.2f} |")
            if stage == "end-to-end build, cold cache":
                ratio = ours / theirs
        else:
            lines.append(f"| {stage} | {ours:.3f} | - | - |")
    return "\n".join(lines), ratio


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--tokens", type=float, default=1e9, help="tokens in the synthetic corpus (all sources)")
    p.add_argument("--seq-length", type=int, default=2048)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--data-dir", default=None,
                   help="where to write (and later reuse) the synthetic corpus; default: a temporary directory")
    p.add_argument("--json", default=None, help="write every timing to this file")
    p.add_argument("--small", action="store_true", help="2e6 tokens, sequence 128, 2 rounds: checks the script runs")
    args = p.parse_args(argv)
    if args.small:
        args.tokens, args.seq_length, args.rounds = 2e6, 128, 2
    args.tokens = int(args.tokens)
    if args.rounds < 1 or args.seq_length < 1 or args.tokens < 100 * args.seq_length:
        p.error("need --rounds >= 1, --seq-length >= 1 and --tokens >= 100 x --seq-length")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    scratch = tempfile.mkdtemp(prefix="benchmark_index-")
    try:
        data_dir = Path(args.data_dir) if args.data_dir else Path(scratch) / "corpus"
        print(f"> {args.tokens:,} tokens in {len(SOURCES)} sources, sequence {args.seq_length}, "
              f"{args.rounds} rounds; {os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f}",
              file=sys.stderr, flush=True)
        prefixes = write_corpus(data_dir, args.tokens, args.seed)
        documents = sum(IndexedDataset(prefix).num_documents for _, prefix in prefixes)
        megatron = load_megatron(scratch)
        times, notes = run_rounds(args, prefixes, megatron, scratch)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    table, ratio = format_table(times, megatron is not None)
    if args.json:
        Path(args.json).write_text(json.dumps({
            "tokens": args.tokens, "seq_length": args.seq_length, "rounds": args.rounds, "documents": documents,
            "load_average": os.getloadavg(), "times_s": {f"{stage} | {impl}": values
                                                        for (stage, impl), values in times.items()}}, indent=1))
    for note in notes:
        print(f"> {note}", file=sys.stderr)
    print(f"{args.tokens:,} tokens, {documents:,} documents, sequence {args.seq_length}, "
          f"{args.tokens // args.seq_length:,} samples; best of {args.rounds} rounds; "
          f"load average after the run {os.getloadavg()[0]:.2f}")
    print(table)
    print(f"ours/megatron index build ratio: {ratio:.2f}" if ratio is not None
          else "ours/megatron index build ratio: skipped (megatron-core not installed)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
