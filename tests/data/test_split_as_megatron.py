"""--split read as Megatron-LM reads it (issue 34/37).

NVIDIA/Megatron-LM megatron/core/datasets/blended_megatron_dataset_config.py (commit
779c5b748dbcf00ad9e36d539c576b404ab4abe9, lines 155-172), parse_and_normalize_split:
    split = list(map(float, re.findall(r"[.0-9]+", split)))
    split = split + [0.0 for _ in range(len(Split) - len(split))]
    assert len(split) == len(Split)
    assert all(map(lambda _: _ >= 0.0, split))
    split = normalize(split)
so every run of digits and dots is a weight whatever separates them. The same repository's
examples/llama/train_llama3_8b_h100_fp8.sh writes "--split '99,1,0'" inside a bash array it expands
unquoted, so the program receives the string with its single quotes (the replay corpus keeps it so)."""

import pytest

from arguments.parser import parse_config
from base.errors import ConfigError
from data import DataError
from data.gpt_dataset import parse_split


@pytest.mark.parametrize("split", ["'99,1,0'", "99 1 0", "99/1/0", " 99, 1 ,0 ", '"99,1"'])
def test_what_megatrons_regex_reads_is_read_the_same(split):
    assert parse_split(split) == pytest.approx((0.99, 0.01, 0.0))


def test_the_llama3_examples_quoted_split_passes_the_flag_checks():
    assert parse_config(["--split", "'99,1,0'"]).data.split == "'99,1,0'"


@pytest.mark.parametrize("split, words", [
    ("1,2,3,4", "up to three weights"),       # Megatron: assert len(split) == len(Split)
    ("1.2.3,1", "must be a number"),          # Megatron: float("1.2.3") raises
    ("0,0,0", "not all zero"),                # Megatron: normalize divides by a zero sum
    ("''", "not all zero"),                   # no weight at all
    ("-1,2,0", "plain numbers"),              # Megatron's regex would drop the sign and read 1,2,0
    ("1e2,1,0", "plain numbers"),             # ... and read 1e2 as two weights, 1 and 2
])
def test_what_megatron_refuses_or_would_misread_is_refused_in_one_line(split, words):
    with pytest.raises(DataError, match=words) as error:
        parse_split(split)
    assert "\n" not in str(error.value) and "--split" in str(error.value)
    with pytest.raises(ConfigError, match=words):
        parse_config([f"--split={split}"])  # = : argparse would take "-1,2,0" for a flag
