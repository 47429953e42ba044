"""`--init-from-hf` takes the folder's dropouts, and the export writes what was trained (issue 79 item 5).

Before: a folder whose config.json says `attention_dropout: 0.0` (Qwen3, DeepSeek-V3, most 2025-2026 releases)
trained with Megatron's 0.1 attention and hidden dropout, said nothing, and the export wrote 0.1 back. transformers'
Llama-family models have no dropout on the residual branches (LlamaDecoderLayer adds no dropout), so the hidden
dropout is 0; GPT-2's are its attn_pdrop and resid_pdrop. A dropout typed on the command line wins, said in one line.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import pretrain_gpt
from arguments.parser import parse_arguments
from scripts.tools import convert_to_hf
from tests.checkpoint.test_hf_folder_is_the_model import RUN, gpt2_folder, llama_folder
from tests.reliability_helpers import run_main


@pytest.fixture(scope="module")
def llama(tmp_path_factory) -> Path:
    folder = llama_folder(tmp_path_factory.mktemp("llama") / "hf")
    assert json.loads((folder / "config.json").read_text())["attention_dropout"] == 0.0  # LlamaConfig's default
    return folder


def test_a_llama_folder_trains_at_its_dropouts(llama):
    model = parse_arguments(["--init-from-hf", str(llama)]).config.model
    assert (model.attention.attention_dropout, model.hidden_dropout) == (0.0, 0.0)


def test_a_gpt2_folder_trains_at_its_dropouts(tmp_path):
    folder = gpt2_folder(tmp_path / "hf")
    written = json.loads((folder / "config.json").read_text())
    written.update(attn_pdrop=0.05, resid_pdrop=0.02, embd_pdrop=0.02)
    (folder / "config.json").write_text(json.dumps(written))
    model = parse_arguments(["--init-from-hf", str(folder)]).config.model
    assert (model.attention.attention_dropout, model.hidden_dropout) == (0.05, 0.02)


def test_a_dropout_flag_overrides_the_folder_in_one_start_up_line(llama):
    parsed = parse_arguments(["--init-from-hf", str(llama), "--attention-dropout", "0.2"])
    assert parsed.config.model.attention.attention_dropout == 0.2 and parsed.config.model.hidden_dropout == 0.0
    said = [note for note in parsed.notes if "overrides the folder's" in note]
    assert said == [f"> --attention-dropout 0.2 on the command line overrides the folder's --attention-dropout 0.0 "
                    f"({llama / 'config.json'}: attention_dropout): the run trains with the flag's, and an export "
                    f"writes it"], parsed.notes


@pytest.mark.parametrize("flags,exported", [([], 0.0), (["--attention-dropout", "0.2"], 0.2)], ids=["folder", "flag"])
def test_the_export_writes_the_dropout_that_was_trained(llama, corpus_cache, tmp_path, flags, exported):
    run = RUN[:RUN.index("--hidden-dropout")]  # the folder's dropouts, not the flags'
    assert "dropout" not in " ".join(run)
    outcome = run_main(pretrain_gpt.main, ["--init-from-hf", llama, *run, *flags, "--data-cache-dir", corpus_cache,
                                           "--save", tmp_path / "ck", "--metrics-file", tmp_path / "m.jsonl"])
    assert outcome.code == 0, outcome.err
    assert convert_to_hf.main([str(tmp_path / "ck"), str(tmp_path / "back")]) == 0
    assert json.loads((tmp_path / "back" / "config.json").read_text())["attention_dropout"] == exported
