"""A checkpoint's expert entries are checked before they are used (issue 79, round 5's last two): a router's expert
bias of another length than the model's experts is refused (it was taken as missing and reset to zeros), and an
expert file listed under an expert-parallel rank at or past the checkpoint's expert_model_parallel_size is refused
as corrupt (it was accepted). Each is one line, exit 2, and the checkpoint is left as it was."""

from __future__ import annotations

import json
import shutil

import pytest

from base.errors import CheckpointError
from checkpoint.format import resolve_checkpoint
from checkpoint.schema import check_metadata
from tests.reliability_helpers import snapshot, train
from tests.training.test_expert_parallel_training import MOE

BIAS = ["--moe-router-score-function", "sigmoid", "--moe-router-enable-expert-bias"]


@pytest.fixture(scope="module")
def saved(tmp_path_factory, corpus_cache_300):
    workdir = tmp_path_factory.mktemp("expert_bias")
    assert train(corpus_cache_300, workdir, *MOE, *BIAS, "--save", workdir / "ck", "--train-iters", "3",
                 "--exit-interval", "2").code == 0
    return workdir, resolve_checkpoint(workdir / "ck")


def test_an_expert_bias_of_another_length_is_refused_in_one_line(saved, corpus_cache_300, tmp_path):
    workdir, iteration_dir = saved
    damaged = tmp_path / "ck"
    shutil.copytree(workdir / "ck", damaged)
    path = damaged / iteration_dir.name / "metadata.json"
    metadata = json.loads(path.read_text())
    name = sorted(metadata["expert_bias"])[0]
    metadata["expert_bias"][name] = metadata["expert_bias"][name][:-1]
    path.write_text(json.dumps(metadata))
    before = snapshot(damaged)
    outcome = train(corpus_cache_300, tmp_path, *MOE, *BIAS, "--load", damaged, "--train-iters", "3")
    outcome.one_error_line(f"its {name} is [3]; this router has 4 experts (--num-experts), one value each: [4]")
    assert snapshot(damaged) == before


def test_an_expert_file_past_the_expert_parallel_ranks_is_refused_as_corrupt(saved):
    _, iteration_dir = saved
    metadata = json.loads((iteration_dir / "metadata.json").read_text())
    file = sorted(metadata["files"])[0]
    metadata.update(expert_model_parallel_size=2, expert_model_files=[[0, 0, file, []], [0, 2, file, []]])
    with pytest.raises(CheckpointError, match=r"'expert_model_files \(.*\)' must be an expert-parallel rank below "
                                              r"its 'expert_model_parallel_size' \(2\), got 2"):
        check_metadata(metadata, iteration_dir / "metadata.json")
    metadata["expert_model_files"] = [[0, 1, file, []]]
    check_metadata(metadata, iteration_dir / "metadata.json")  # in range: accepted
