"""Per-split blends (--train-data-path, --valid-data-path, --test-data-path) read the samples Megatron-Core's
BlendedMegatronDatasetBuilder builds for the same blends and seed (issue 64 item 1).

tests/fixtures/megatron_per_split_samples.json is what megatron-core 0.16.1's own builder built
(scripts/tools/megatron_per_split_samples.py runs BlendedMegatronDatasetBuilder(GPTDataset, ...).build() with
`blend_per_split`); the last test re-runs it where megatron-core is installed (the bench venv) and finds the
committed file. For each split of each case the datasets here must hold the same thing: no dataset where Megatron
builds none; one prefix's dataset over all of its documents (`split_spoof[i] = (0.0, 1.0)`); a blend of the same
prefixes, in order, with Megatron's normalised weights (given, or each prefix's one-epoch sample count), whose
samples come from the same prefix and sample number as Megatron's blend's (`dataset_index`,
`dataset_sample_index`), for every sample the split reads.

Which tokens a prefix's sample number k holds follows this repository's per-epoch shuffle (docs/data.md), not
Megatron's numpy order: the identity is the prefix and its sample number, as for every --data-path blend here
(tests/data/test_blend_by_size.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from data.gpt_dataset import GPTDataset
from data.per_split import build_per_split_datasets

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = ROOT / "tests" / "fixtures" / "megatron_per_split_samples.json"
SCRIPT = ROOT / "scripts" / "tools" / "megatron_per_split_samples.py"
sys.path.insert(0, str(ROOT / "scripts" / "tools"))
import megatron_per_split_samples as generator  # noqa: E402

RECORDED = json.loads(FIXTURE.read_text())


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return generator.write_corpus(tmp_path_factory.mktemp("per-split-corpus"))


def member_of(dataset: GPTDataset, names: dict[str, str]) -> dict:
    ids = dataset.document_ids
    return {"prefix": names[dataset.indexed.prefix], "documents": [int(ids.min()), int(ids.max()) + 1],
            "contiguous": bool(np.array_equal(ids, np.arange(ids.min(), ids.max() + 1)))}


@pytest.mark.parametrize("case", RECORDED["cases"], ids=[case["name"] for case in RECORDED["cases"]])
def test_each_split_reads_the_samples_megatron_cores_builder_builds(case, corpus, tmp_path):
    names = {path: name for name, path in corpus.items()}
    ours = build_per_split_datasets([generator.with_paths(blend, corpus) for blend in case["blends"]],
                                    RECORDED["seq_length"], RECORDED["seed"], tuple(case["sizes"]),
                                    cache_dir=str(tmp_path))
    for split, (mine, theirs, size) in enumerate(zip(ours, case["megatron"], case["sizes"])):
        if theirs is None:
            assert mine is None, split
            continue
        if theirs["kind"] == "single":
            assert isinstance(mine, GPTDataset), split
            assert [member_of(mine, names)] == theirs["members"], split
            assert len(mine) == size  # the split's samples; Megatron's one-prefix dataset holds at least as many
            assert theirs["length"] >= size
            continue
        assert [member_of(part, names) for part in mine.datasets] == theirs["members"], split
        assert mine.weights == pytest.approx(theirs["weights"], rel=1e-12, abs=0), split
        assert len(mine) == size and theirs["length"] >= size, split
        assert mine.dataset_index.tolist() == theirs["dataset_index"][:size], split
        assert mine.dataset_sample_index.tolist() == theirs["dataset_sample_index"][:size], split


def test_the_fixture_spans_every_kind_of_split():
    kinds = {(split or {}).get("kind") for case in RECORDED["cases"] for split in case["megatron"]}
    weighted = [split for case in RECORDED["cases"] for blend, split in zip(case["blends"], case["megatron"])
                if split and split["kind"] == "blend" and len(blend) % 2 == 0]
    by_size = [split for case in RECORDED["cases"] for blend, split in zip(case["blends"], case["megatron"])
               if split and split["kind"] == "blend" and len(blend) % 2 == 1]
    assert kinds == {None, "single", "blend"} and weighted and by_size
    assert all(member["contiguous"] and member["documents"][0] == 0
               for case in RECORDED["cases"] for split in case["megatron"] if split for member in split["members"])


@pytest.mark.slow
def test_megatron_core_builds_what_the_fixture_records(tmp_path):
    """The committed fixture is megatron-core's own output: regenerated with it, the same JSON."""
    pytest.importorskip("megatron.core.datasets.blended_megatron_dataset_builder",
                        reason="megatron-core is a benchmark-only peer (requirements-bench.txt)")
    out = tmp_path / "regenerated.json"
    completed = subprocess.run([sys.executable, str(SCRIPT), "--out", str(out)], capture_output=True, text=True,
                               timeout=600, cwd=tmp_path)
    assert completed.returncode == 0, completed.stderr[-3000:]
    assert json.loads(out.read_text()) == RECORDED
