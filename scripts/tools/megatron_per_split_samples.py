"""What Megatron-Core's BlendedMegatronDatasetBuilder builds for per-split blends (--train-data-path,
--valid-data-path, --test-data-path), written as a fixture the tests compare this repository's datasets with.

    python scripts/tools/megatron_per_split_samples.py --out tests/fixtures/megatron_per_split_samples.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import sys
import tempfile
import warnings
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from data.indexed import IndexedDatasetWriter  # noqa: E402

SEQ_LENGTH = 8
SEED = 1234
VOCAB = 300
# (documents, seed of their lengths and tokens) of each prefix
CORPUS = {"A": (60, 1), "B": (25, 2), "C": (90, 3)}
# Each case: its blends as a launch types them (prefix names stand for the corpus's paths) and the sample counts
# Megatron's schedule asks of each split (get_train_valid_test_num_samples).
CASES = [
    {"name": "weighted train, valid by size, one-prefix test",
     "blends": [["0.5", "A", "0.3", "B", "0.2", "C"], ["A", "C"], ["B"]], "sizes": [40, 12, 6]},
    {"name": "train by size, weighted valid, no test",
     "blends": [["A", "B", "C"], ["1", "B", "3", "C"], None], "sizes": [30, 16, 0]},
    {"name": "one weighted prefix per split, K2-V2's 1.0 weights",
     "blends": [["1.0", "C"], ["1.0", "A", "1.0", "B"], None], "sizes": [24, 8, 0]},
]


def write_corpus(directory: Path) -> dict[str, str]:
    """The three prefixes (module docstring), written under `directory`: {name: prefix}."""
    prefixes = {}
    for name, (documents, seed) in CORPUS.items():
        rng = np.random.default_rng(seed)
        prefix = str(directory / name)
        with IndexedDatasetWriter(prefix, np.uint16) as writer:
            for length in rng.integers(3, 30, documents):
                writer.add_document(rng.integers(0, VOCAB - 1, length).astype(np.int64))
        prefixes[name] = prefix
    return prefixes


def with_paths(blend, prefixes: dict[str, str]):
    return None if blend is None else [prefixes.get(token, token) for token in blend]


class _Tokenizer:
    """What megatron-core's GPTDatasetConfig reads from a tokenizer (no sample is read here)."""

    vocab_size = VOCAB
    eod = VOCAB - 1
    pad = -1
    unique_identifiers = {"class": "FixtureTokenizer", "vocab_size": VOCAB}


def megatron_splits(case: dict, prefixes: dict[str, str]) -> list:
    """Megatron-core's datasets for the case: BlendedMegatronDatasetBuilder(GPTDataset, sizes, ...).build()."""
    with contextlib.redirect_stdout(sys.stderr), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "apex / Transformer Engine not installed" on import
        from megatron.core.datasets.blended_megatron_dataset_builder import BlendedMegatronDatasetBuilder
        from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig
        from megatron.core.datasets.utils import get_blend_from_list
    logging.getLogger("megatron").setLevel(logging.WARNING)
    config = GPTDatasetConfig(
        random_seed=SEED, sequence_length=SEQ_LENGTH,
        blend_per_split=[get_blend_from_list(with_paths(blend, prefixes)) for blend in case["blends"]],
        tokenizer=_Tokenizer(), reset_position_ids=False, reset_attention_mask=False, eod_mask_loss=False)
    with contextlib.redirect_stdout(sys.stderr):
        return BlendedMegatronDatasetBuilder(GPTDataset, case["sizes"], lambda: True, config).build()


def describe(dataset, names: dict[str, str]) -> dict | None:
    """One split's dataset as the fixture records it (module docstring)."""
    if dataset is None:
        return None

    def member(gpt) -> dict:
        documents = np.asarray(gpt.indices)
        return {"prefix": names[gpt.dataset.path_prefix], "documents": [int(documents.min()), int(documents.max()) + 1],
                "contiguous": bool(np.array_equal(documents, np.arange(documents.min(), documents.max() + 1)))}

    if not hasattr(dataset, "dataset_index"):  # one prefix: its GPTDataset
        return {"kind": "single", "members": [member(dataset)], "length": len(dataset)}
    return {"kind": "blend", "members": [member(gpt) for gpt in dataset.datasets],
            "weights": [float(weight) for weight in dataset.weights], "length": len(dataset),
            "dataset_index": np.asarray(dataset.dataset_index).tolist(),
            "dataset_sample_index": np.asarray(dataset.dataset_sample_index).tolist()}


def generate() -> dict:
    with tempfile.TemporaryDirectory() as scratch:
        prefixes = write_corpus(Path(scratch))
        names = {path: name for name, path in prefixes.items()}
        cases = []
        for case in CASES:
            splits = megatron_splits(case, prefixes)
            cases.append({**case, "megatron": [describe(dataset, names) for dataset in splits]})
    import megatron.core

    return {"about": __doc__.split("\n\n")[0], "megatron_core": megatron.core.__version__,
            "seq_length": SEQ_LENGTH, "seed": SEED, "corpus": CORPUS, "cases": cases}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, type=Path)
    args = parser.parse_args(argv)
    args.out.write_text(json.dumps(generate(), indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
