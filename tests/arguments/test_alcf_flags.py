"""ALCF's Megatron-DeepSpeed fork's flags (issue 64 item 4), read from argonne-lcf/Megatron-DeepSpeed at
ffa3456d68b630192fcaefcc3288bd18525b8d95:

- megatron/tokenizer/tokenizer.py: `elif args.tokenizer_type == "HFTokenizer": tokenizer = _HFTokenizer(
  args.tokenizer_model, ...)`, AutoTokenizer.from_pretrained, eod its eos token;
- megatron/optimizer/__init__.py: `args.optimizer == "adam"` builds `torch.optim.Adam` (or, with --ds_fused_adam,
  DeepSpeed's FusedAdam), `"adamw"` `torch.optim.AdamW`, `"sophiag"` its SophiaG;
- megatron/model/language_model.py Embedding: the word embedding takes `init_method=config.init_method` (so
  --adjust-word-embedding-init and --word-embedding-init-std, read by megatron/core/transformer/transformer_config.py
  into world_embedding_init_method, reach only megatron/core's GPT embedding, which pretrain_gpt_alcf.py does not build);
- megatron/data/gpt_dataset.py: --shuffle-sample-in-corpus and --blend-sample-in-corpus are read in the
  --data-file-list branch only.
"""

from __future__ import annotations

import pytest

from arguments.config import ConfigError
from arguments.megatron.defaults import ALCF_FORK
from arguments.parser import parse_arguments

MODEL = ["--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "2", "--seq-length", "16",
         "--max-position-embeddings", "16", "--micro-batch-size", "1", "--train-iters", "3"]
ALCF_FLAGS = ["--rotary-position-embeddings-theta", "50000", "--shuffle-sample-in-corpus", "--adjust-word-embedding-init",
              "--word-embedding-init-std", "0.632455532"]


def test_an_auroragpt_launch_takes_the_forks_generation_and_its_meanings():
    parsed = parse_arguments(MODEL + ALCF_FLAGS + ["--optimizer", "adamw", "--tokenizer-type", "HFTokenizer",
                                                   "--tokenizer-model", "/t/tokenizer.json"])
    assert parsed.megatron_generation == ALCF_FORK
    config = parsed.config
    assert config.optimizer.optimizer == "adam" and config.data.tokenizer_type == "HuggingFaceTokenizer"
    assert config.model.positions.rotary_base == 50000
    notes = "\n".join(parsed.notes)
    assert "--optimizer adamw (ALCF's fork: torch.optim.AdamW) is adam here" in notes
    assert "--shuffle-sample-in-corpus: accepted, no effect without --data-file-list" in notes
    no_effect = next(note for note in parsed.notes if note.startswith("Megatron-LM and DeepSpeed flags accepted"))
    assert "--adjust-word-embedding-init, --word-embedding-init-std 0.632455532 (ALCF's Megatron-DeepSpeed fork: its " \
        "pretrain_gpt_alcf.py builds the legacy megatron.model GPTModel" in no_effect


def test_a_megatron_deepspeed_launch_keeps_its_own_generation():
    """The fork's file defines Megatron-DeepSpeed's flags too; a launch it fits no better is Megatron-DeepSpeed's."""
    parsed = parse_arguments(MODEL + ["--use-rotary-position-embeddings", "--num-key-value-heads", "2",
                                      "--no-query-key-layer-scaling"])
    assert parsed.megatron_generation == "megatron-deepspeed"


@pytest.mark.parametrize("extra", [[], ["--optimizer", "adam"]], ids=["its default", "typed"])
def test_the_forks_adam_with_weight_decay_is_refused_in_one_line(extra):
    with pytest.raises(ConfigError, match="--optimizer adam in ALCF's Megatron-DeepSpeed fork is torch.optim.Adam, "
                                          "whose --weight-decay 0.1 is an L2 term") as error:
        parse_arguments(MODEL + ALCF_FLAGS + extra + ["--weight-decay", "0.1"])
    assert "\n" not in str(error.value)
    for accepted in (["--weight-decay", "0"], ["--weight-decay", "0.1", "--ds_fused_adam"],
                     ["--weight-decay", "0.1", "--optimizer", "adamw"]):
        assert parse_arguments(MODEL + ALCF_FLAGS + extra + accepted).config.optimizer.optimizer == "adam"


def test_sophiag_takes_the_forks_flags_and_says_what_its_training_runs():
    parsed = parse_arguments(MODEL + ALCF_FLAGS + ["--optimizer", "sophiag", "--sophiag-beta1", "0.8",
                                                   "--sophiag-rho", "0.04"])
    optimizer = parsed.config.optimizer
    assert (optimizer.optimizer, optimizer.algorithms.sophiag_beta1, optimizer.algorithms.sophiag_beta2, optimizer.algorithms.sophiag_rho) == \
        ("sophiag", 0.8, 0.95, 0.04)
    assert any("never calls SophiaG.update_hessian" in note for note in parsed.notes)
    with pytest.raises(ConfigError, match="--sophiag-rho >= 0"):
        parse_arguments(MODEL + ["--optimizer", "sophiag", "--sophiag-rho", "-1"])


@pytest.mark.parametrize("flag, says", [
    (["--lr_constant_plus_cooldown"], "ALCF's Megatron-DeepSpeed fork's constant schedule"),
    (["--muon-ns-steps", "5"], "ALCF's Megatron-DeepSpeed fork's Muon and MuonClip"),
    (["--use-mics"], "DeepSpeed's MiCS"),
    (["--train-iters-to-skip", "3"], "training iterations skipped"),
])
def test_what_the_fork_computes_and_is_not_here_is_refused_in_one_line(flag, says):
    with pytest.raises(ConfigError, match=says) as error:
        parse_arguments(MODEL + flag)
    assert "\n" not in str(error.value)
