"""A Hugging Face folder's config.json is checked by our own reader (arguments/hf_config.py) before
transformers sees it (issue 47, item 6): a wrongly typed or out-of-range field is one line naming the
file, the field, its value and what it must be, with exit status 2 at `--init-from-hf`.

Before, transformers 5's LlamaConfig (a huggingface_hub strict dataclass: transformers/models/llama/
configuration_llama.py, `@strict class LlamaConfig`) ended `"num_hidden_layers": "2"`, `"hidden_size": null`,
`"vocab_size": 2.5` or `"max_position_embeddings": true` in a StrictDataclassFieldValidationError traceback,
`"num_attention_heads": 3` (64 wide) in its validate_architecture's StrictDataclassClassValidationError, and 0
heads in a ZeroDivisionError; what it does not check (a negative size, NaN, a top-level rope_theta beside
rope_parameters) and every GPT-2 field (compared without transformers) became a confusing line such as
`pass --hidden-size 64 (config.json n_embd; this run has 64)` for `"n_embd": "64"`.

The many variants go through `load_hf_weights`, which opens the folder as `--init-from-hf` does; two launches (one a
real `python pretrain_gpt.py` process) check the wiring. The folders are saved by transformers'
save_pretrained (tests/checkpoint/test_hf_checkpoint.py, test_hf_llama.py) and their config.json edited.
"""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from base.errors import ConfigError
from base.options import replace_settings
from checkpoint.hf.source import load_hf_weights
from tests.checkpoint.test_hf_checkpoint import CPU, HF_VOCAB, pretrain_config, random_hf_folder
from tests.checkpoint.test_hf_llama import llama_run_config, random_llama_folder
from tests.reliability_helpers import TINY, train

REPO = Path(__file__).resolve().parents[2]
LLAMA_VARIANT = "mqa-tied-bias"
LLAMA_FLAGS = ["--normalization", "RMSNorm", "--swiglu", "--position-embedding-type", "rope"]


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> dict[str, Path]:
    """One folder per family, saved once by transformers; each test edits a copy."""
    root = tmp_path_factory.mktemp("hf-folders")
    return {"llama": random_llama_folder(root / "llama", LLAMA_VARIANT), "gpt2": random_hf_folder(root / "gpt2")}


def edited(saved: dict[str, Path], family: str, destination: Path, change: dict, drop: tuple = ()) -> Path:
    """A copy of the family's folder whose config.json has `change` applied and the keys `drop` removed."""
    folder = shutil.copytree(saved[family], destination)
    path = folder / "config.json"
    written = {key: value for key, value in json.loads(path.read_text()).items() if key not in drop}
    path.write_text(json.dumps({**written, **change}))  # NaN and Infinity as Python's json writes and reads them
    return folder


def run_model(family: str, **overrides):
    """The run's model settings that match the family's saved folder."""
    if family == "llama":
        return llama_run_config(LLAMA_VARIANT, **overrides).model
    return replace_settings(pretrain_config(HF_VOCAB).model, **overrides)


def refusal(folder: Path, family: str) -> str:
    with pytest.raises(ConfigError) as caught:
        load_hf_weights(folder, run_model(family), CPU)
    message = str(caught.value)
    assert "\n" not in message and str(folder / "config.json") in message, message
    return message


# (family, change, the words the line holds): the issue's variants first.
FIELD_VARIANTS = [
    ("llama", {"num_hidden_layers": "2"}, 'num_hidden_layers is "2" (a string); it must be a positive integer'),
    ("llama", {"hidden_size": None}, "hidden_size is null; it must be a positive integer"),
    ("llama", {"rms_norm_eps": "x"}, 'rms_norm_eps is "x" (a string); it must be a positive finite number'),
    ("llama", {"intermediate_size": -1}, "intermediate_size is -1; it must be a positive integer"),
    ("llama", {"num_attention_heads": 0}, "num_attention_heads is 0; it must be a positive integer"),
    ("llama", {"vocab_size": 2.5}, "vocab_size is 2.5; it must be a positive integer"),
    ("llama", {"rope_theta": "big"}, 'rope_theta is "big" (a string); it must be a positive finite number'),
    ("llama", {"max_position_embeddings": True},
     "max_position_embeddings is true (a boolean); it must be a positive integer"),
    ("llama", {"num_hidden_layers": 2.0},
     "num_hidden_layers is 2.0; it must be a positive integer (written without a decimal point: 2, not 2.0)"),
    ("llama", {"rms_norm_eps": math.nan}, "rms_norm_eps is NaN; it must be a positive finite number"),
    ("llama", {"max_position_embeddings": math.inf}, "max_position_embeddings is Infinity; it must be a positive integer"),
    ("llama", {"num_key_value_heads": "1"}, 'num_key_value_heads is "1" (a string); it must be a positive integer or null'),
    ("llama", {"tie_word_embeddings": 1}, "tie_word_embeddings is 1; it must be true or false"),
    ("llama", {"hidden_act": None}, "hidden_act is null; it must be a non-empty string"),
    ("llama", {"rope_parameters": {"rope_type": "default", "rope_theta": -1}},
     "rope_parameters.rope_theta is -1; it must be a positive finite number"),
    ("llama", {"rope_scaling": {"rope_type": "linear", "factor": "x"}},
     'rope_scaling.factor is "x" (a string); it must be a positive finite number'),
    ("llama", {"rope_parameters": [10000.0]}, "rope_parameters is [10000.0] (a list); it must be a JSON object or null"),
    ("gpt2", {"n_embd": "64"}, 'n_embd is "64" (a string); it must be a positive integer'),
    ("gpt2", {"n_layer": None}, "n_layer is null; it must be a positive integer"),
    ("gpt2", {"n_head": 0}, "n_head is 0; it must be a positive integer"),
    ("gpt2", {"layer_norm_epsilon": "x"}, 'layer_norm_epsilon is "x" (a string); it must be a positive finite number'),
    ("gpt2", {"n_positions": -1}, "n_positions is -1; it must be a positive integer"),
    ("gpt2", {"vocab_size": True}, "vocab_size is true (a boolean); it must be a positive integer"),
    ("gpt2", {"n_inner": 0}, "n_inner is 0; it must be a positive integer or null"),  # was taken as 4 * n_embd
    ("gpt2", {"attn_pdrop": 1.5}, "attn_pdrop is 1.5; it must be a number from 0 to 1"),
    ("gpt2", {"scale_attn_weights": "true"}, 'scale_attn_weights is "true" (a string); it must be true or false'),
    ("gpt2", {"hidden_size": "64"}, 'hidden_size is "64" (a string); it must be a positive integer'),  # n_embd's alias
]


@pytest.mark.parametrize("family, change, words", FIELD_VARIANTS,
                         ids=[f"{family}-{next(iter(change))}={json.dumps(next(iter(change.values())))[:20]}"
                              for family, change, _ in FIELD_VARIANTS])
def test_a_wrong_field_is_one_line_naming_it_its_value_and_what_it_must_be(saved, tmp_path, family, change, words):
    message = refusal(edited(saved, family, tmp_path / "hf", change), family)
    assert f"config.json: {words}" in message, message


@pytest.mark.parametrize("family, change, words", [
    # LlamaConfig.validate_architecture; before, StrictDataclassClassValidationError's traceback
    ("llama", {"num_attention_heads": 3}, "hidden_size 64 is not a multiple of num_attention_heads 3"),
    # transformers' repeat_kv and our query groups need whole groups; before, "pass --num-query-groups 3"
    ("llama", {"num_key_value_heads": 3}, "num_attention_heads 4 is not a multiple of num_key_value_heads 3"),
    # transformers' validate_rope (odd rotary dimensions above 4); before, its traceback
    ("llama", {"head_dim": 7}, "the head dimension 7 (head_dim) is odd"),
    # transformers' GPT2Attention raises when building the model; before, "pass --num-attention-heads 3"
    ("gpt2", {"n_head": 3}, "n_embd 64 is not a multiple of n_head 3"),
])
def test_fields_that_contradict_each_other_are_named_together(saved, tmp_path, family, change, words):
    assert words in refusal(edited(saved, family, tmp_path / "hf", change), family)


def test_an_unsupported_model_type_is_named_with_the_supported_ones(saved, tmp_path):
    message = refusal(edited(saved, "gpt2", tmp_path / "hf", {"model_type": "bert"}), "gpt2")
    assert 'model_type "bert" is not read here' in message
    assert "'gpt2' (GPT2LMHeadModel)" in message and "'llama' (LlamaForCausalLM)" in message


def test_without_model_type_the_architectures_entry_names_the_family(saved, tmp_path):
    """AutoModel goes by `architectures`; before, a Llama folder without model_type was read as a GPT-2."""
    folder = edited(saved, "llama", tmp_path / "llama", {}, drop=("model_type",))
    assert load_hf_weights(folder, run_model("llama"), CPU)
    neither = edited(saved, "gpt2", tmp_path / "gpt2", {}, drop=("model_type", "architectures"))
    assert "has no model_type" in refusal(neither, "gpt2")


def test_an_integer_for_a_float_field_reaches_transformers_as_a_float(saved, tmp_path):
    """JSON's 1 is a number; transformers 5's strict LlamaConfig refuses an int for rms_norm_eps (float), so
    the reader hands it 1.0. Before, StrictDataclassFieldValidationError's traceback."""
    folder = edited(saved, "llama", tmp_path / "hf", {"rms_norm_eps": 1})
    assert load_hf_weights(folder, run_model("llama", layernorm_epsilon=1.0), CPU)


def test_a_field_the_reader_has_no_row_for_is_still_one_line(saved, tmp_path):
    """transformers' own validators (PreTrainedConfig.validate_layer_type here) raise huggingface_hub's
    StrictDataclassClassValidationError, which is neither a TypeError nor a ValueError."""
    message = refusal(edited(saved, "llama", tmp_path / "hf", {"layer_types": ["nonsense", "x"]}), "llama")
    assert "transformers cannot read it as a LlamaConfig" in message and "layer_types" in message


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_the_typed_result_is_what_transformers_reads(saved, family):
    """Every typed field against transformers' own parse of the same folder."""
    from transformers import AutoConfig

    from arguments.hf_config import read_hf_config

    ours, theirs = read_hf_config(saved[family]), AutoConfig.from_pretrained(str(saved[family]))
    assert_same_as_transformers(ours, theirs)


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_keys_left_out_take_transformers_defaults(tmp_path, family):
    """A config.json with only model_type: each default in the reader's table is transformers' own."""
    from transformers import AutoConfig

    from arguments.hf_config import read_hf_config

    (tmp_path / "config.json").write_text(json.dumps({"model_type": family}))
    assert_same_as_transformers(read_hf_config(tmp_path), AutoConfig.from_pretrained(str(tmp_path)))


def test_an_older_files_rope_theta_and_rope_scaling_are_read_as_transformers_moves_them(saved, tmp_path):
    """transformers 4.x wrote rope_theta at the top level and Llama 3's scaling as rope_scaling; transformers 5
    moves both into rope_parameters (modeling_rope_utils.py, convert_rope_params_to_dict)."""
    from transformers import AutoConfig

    from arguments.hf_config import read_hf_config

    scaling = {"rope_type": "llama3", "factor": 8, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 8}
    folder = edited(saved, "llama", tmp_path / "hf", {"rope_theta": 500000, "rope_scaling": scaling},
                    drop=("rope_parameters",))
    ours = read_hf_config(folder)
    assert ours.rope.rope_type == "llama3" and ours.rope.theta == 500000.0 and ours.rope.factor == 8.0
    assert_same_as_transformers(ours, AutoConfig.from_pretrained(str(folder)))


def assert_same_as_transformers(ours, theirs) -> None:
    if ours.family == "gpt2":
        expected = dict(vocab_size=theirs.vocab_size, hidden_size=theirs.n_embd, num_layers=theirs.n_layer,
                        num_attention_heads=theirs.n_head, num_key_value_heads=theirs.n_head,
                        head_dim=theirs.n_embd // theirs.n_head, ffn_hidden_size=theirs.n_inner or 4 * theirs.n_embd,
                        max_position_embeddings=theirs.n_positions, norm_epsilon=theirs.layer_norm_epsilon,
                        activation=theirs.activation_function, initializer_range=theirs.initializer_range)
        assert ours.rope is None
    else:
        rope = theirs.rope_parameters
        expected = dict(vocab_size=theirs.vocab_size, hidden_size=theirs.hidden_size,
                        num_layers=theirs.num_hidden_layers, num_attention_heads=theirs.num_attention_heads,
                        num_key_value_heads=theirs.num_key_value_heads, head_dim=theirs.head_dim,
                        ffn_hidden_size=theirs.intermediate_size, max_position_embeddings=theirs.max_position_embeddings,
                        norm_epsilon=theirs.rms_norm_eps, activation=theirs.hidden_act,
                        attention_bias=theirs.attention_bias, mlp_bias=theirs.mlp_bias,
                        initializer_range=theirs.initializer_range)
        assert (ours.rope.rope_type, ours.rope.theta) == (rope["rope_type"], rope["rope_theta"])
        for key in ("factor", "low_freq_factor", "high_freq_factor"):
            assert getattr(ours.rope, key) == rope.get(key), key
    expected["tie_word_embeddings"] = theirs.tie_word_embeddings
    assert {name: getattr(ours, name) for name in expected} == expected


def test_init_from_hf_launch_with_a_wrong_llama_field_is_one_line_and_exit_2(saved, tmp_path, corpus_cache_300):
    """The real program, as a user runs it: no traceback, exit status 2 (base/errors.py's boundary)."""
    folder = edited(saved, "llama", tmp_path / "hf", {"num_hidden_layers": "2"})
    result = subprocess.run([sys.executable, "pretrain_gpt.py", *TINY, *LLAMA_FLAGS, "--init-from-hf", str(folder),
                             "--data-cache-dir", corpus_cache_300, "--metrics-file", str(tmp_path / "m.jsonl")],
                            cwd=REPO, capture_output=True, text=True, timeout=300)
    assert result.returncode == 2, result.stderr[-3000:]
    assert "Traceback" not in result.stderr and len(result.stderr.splitlines()) == 1, result.stderr[-3000:]
    assert f'{folder / "config.json"}: num_hidden_layers is "2" (a string); it must be a positive integer' in result.stderr


def test_init_from_hf_with_a_wrong_gpt2_field_is_one_line_and_exit_2(saved, tmp_path, corpus_cache_300):
    folder = edited(saved, "gpt2", tmp_path / "hf", {"n_embd": "64"})
    outcome = train(corpus_cache_300, tmp_path, "--init-from-hf", folder)
    outcome.one_error_line(f'{folder / "config.json"}: n_embd is "64" (a string); it must be a positive integer')
