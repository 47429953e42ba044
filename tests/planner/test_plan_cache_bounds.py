"""The plan cache (scripts/zero_paper/planning.py) at its edges (issue 33 #15, #16): an entry whose
values have the wrong types is a miss, planned again, not a TypeError later in run.py or report.py;
a cache that cannot be written is one line naming it and ZERO_GPT_PLAN_CACHE, not a bare OSError."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from arguments.config import ConfigError
from arguments.parser import parse_config
from planner.dry_run import Cluster

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts" / "zero_paper"))
import planning  # noqa: E402

TINY = ["--num-layers", "1", "--hidden-size", "32", "--num-attention-heads", "2", "--seq-length", "16",
        "--max-position-embeddings", "16", "--micro-batch-size", "2", "--global-batch-size", "2"]
CLUSTER = Cluster(world_size=1, gpus_per_node=1)


def test_a_wrong_typed_cache_entry_is_planned_again(tmp_path):
    first = planning.Planner(cache_dir=tmp_path).dry_run_config(parse_config(TINY), CLUSTER, 300)
    [entry] = list(tmp_path.glob("*.json"))
    data = json.loads(entry.read_text())
    data["total_bytes"], data["model_state_bytes"] = "12", {"total": [1]}
    entry.write_text(json.dumps(data))
    again = planning.Planner(cache_dir=tmp_path).dry_run_config(parse_config(TINY), CLUSTER, 300)
    assert again.total_bytes == first.total_bytes and isinstance(again.total_bytes, int)
    assert json.loads(entry.read_text())["total_bytes"] == first.total_bytes  # replaced by the new plan


def test_a_cache_that_cannot_be_written_is_one_line_naming_it(tmp_path):
    cache = tmp_path / "plans"
    cache.write_text("a file where the cache directory should be")
    with pytest.raises(ConfigError, match="ZERO_GPT_PLAN_CACHE") as error:
        planning.Planner(cache_dir=cache).dry_run_config(parse_config(TINY), CLUSTER, 300)
    assert str(cache) in str(error.value) and "\n" not in str(error.value)
    assert cache.read_text() == "a file where the cache directory should be"
