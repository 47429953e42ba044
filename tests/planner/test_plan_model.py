"""One model for the planner and the trainer (issue 49): `python -m zero.plan dry-run` with a launch's flags plans
the model `pretrain_gpt.py` with the same flags builds, vocabulary included, and a preset carries its own.

Each comparison reads the two programs' lines as a user sees them: the planner's "model: N parameters" and the
trainer's start-up line "> model: N parameters (...)" (training/prepare.py's describe_model), printed after the
tokenizer is loaded and the model built. The training itself is left out (`train_run` replaced): the start-up line
comes before it.
"""

import json
import re

import pytest

import pretrain_gpt
from planner import plan as planner_cli
from training.loop import TrainingSummary

# Llama 3 8B as transformers counts it (LlamaForCausalLM of meta-llama/Meta-Llama-3-8B: 32 layers, hidden 4096,
# ffn 14336, 8 key/value groups, an untied output layer, a 128256-token vocabulary): its published size.
LLAMA3_8B_PARAMETERS = 8_030_261_248
# llama3-8b's blocks, shrunk to train on a CPU; the vocabulary is the preset's.
SHRUNK = ["--num-layers", "1", "--hidden-size", "64", "--num-attention-heads", "8",
          "--ffn-hidden-size", "128", "--seq-length", "32", "--max-position-embeddings", "32",
          "--micro-batch-size", "2", "--global-batch-size", "2"]


def planned_parameters(argv, capsys) -> int:
    assert planner_cli.main(["dry-run", *argv]) == 0
    text = capsys.readouterr().out
    return int(re.search(r"^model: ([0-9,]+) parameters", text, re.MULTILINE).group(1).replace(",", ""))


def started_parameters(argv, tmp_path, capsys, monkeypatch) -> tuple[int, str]:
    """The parameter count of pretrain_gpt.py's start-up line, and everything it printed."""
    monkeypatch.setattr(pretrain_gpt, "train_run",
                        lambda prepared, fault_tolerance=None: TrainingSummary(exit_reason="test"))
    assert pretrain_gpt.main([*argv, "--data-cache-dir", str(tmp_path / "cache"),
                              "--metrics-file", str(tmp_path / "metrics.jsonl")]) == 0
    text = capsys.readouterr().out
    return int(re.search(r"^> model: ([0-9,]+) parameters", text, re.MULTILINE).group(1).replace(",", "")), text


def test_the_default_plan_is_the_default_run(tmp_path, capsys, monkeypatch):
    """`python -m zero.plan dry-run` and `python pretrain_gpt.py`, no flags: before, the planner took GPT-2's
    50257 tokens (7,248,640 parameters) where the run trains the embedded corpus's 4096 (1,334,016)."""
    planned = planned_parameters([], capsys)
    started, _ = started_parameters([], tmp_path, capsys, monkeypatch)
    assert planned == started


def test_a_presets_vocabulary_is_planned_and_trained(tmp_path, capsys, monkeypatch):
    """llama3-8b's vocabulary (128256) is the model's on the embedded corpus too, in both programs, and the run says
    in one line that its tokenizer uses only the first ids."""
    planned = planned_parameters(["--config", "llama3-8b", *SHRUNK], capsys)
    started, text = started_parameters(["--config", "llama3-8b", *SHRUNK, "--device", "cpu"], tmp_path, capsys,
                                       monkeypatch)
    assert planned == started
    assert "vocab 128256 padded to 128256" in text
    assert "> the model's vocabulary is --vocab-size 128256 (vocab_size of the preset llama3-8b" in text


def test_llama3_8b_plans_its_published_size(capsys):
    assert planner_cli.main(["dry-run", "--config", "llama3-8b", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["parameters_total"] == LLAMA3_8B_PARAMETERS
    assert planner_cli.main(["dry-run", "--config", "llama3-8b"]) == 0
    assert "model: 8.03B parameters" in capsys.readouterr().out


@pytest.mark.parametrize("preset, vocab", [("gpt2-124m", 50257), ("llama2-7b", 32000), ("llama3-8b", 128256),
                                           ("zero_paper/1.5b-48x1600", 50257)])
def test_presets_carry_their_vocabulary(preset, vocab):
    from arguments.parser import parse_config
    from planner.launch import launch_vocab

    config = parse_config(["--config", preset])
    assert launch_vocab(config.checkpoint, config.data, config.model, config.sources)[0] == vocab
