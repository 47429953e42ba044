"""Released config.json files (tests/fixtures/hf_configs/, as written: see the README there) plan with
`pretrain_gpt.py --init-from-hf DIR --dry-run` and no weights, and the model the plan builds has the published
parameter count within 0.5%.

The published counts: Qwen2.5-7B's model card ("Number of Parameters: 7.61B"), Qwen3-8B's ("Number of Parameters:
8.2B"), Llama-3.1-8B's safetensors total on its model page, 8.03B, OLMo-2-1124-13B's model.safetensors.index.json
total_size, 54,864,793,600 bytes of float32 (13,716,198,400 parameters; its model page: 13.7B). Mistral-7B-v0.1's
model.safetensors.index.json total_size, 14,483,464,192 bytes of bfloat16 (7,241,732,096 parameters; its model page:
7.24B). Gemma-3-27B's language model as the Gemma 3 technical report counts it (Table 1, 27B: 1,416M embedding and
25,600M non-embedding parameters, 27,016M together): the released folder is Gemma3ForConditionalGeneration and its
model page's 27.4B adds the 417M SigLIP vision tower (Table 1's "vision encoder") and the projector, which
--init-from-hf does not read (families/gemma3/config.py: the text_config is the model here). Phi-3-mini-128k's
exact count is its own test (below)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "hf_configs"
PUBLISHED = {"qwen2.5-7b": 7.61e9, "qwen3-8b": 8.2e9, "llama-3.1-8b": 8.03e9, "olmo-2-1124-13b": 54_864_793_600 / 4,
             "mistral-7b-v0.1": 14_483_464_192 / 2, "gemma-3-27b-it": 1_416e6 + 25_600e6}


@pytest.mark.slow
@pytest.mark.parametrize("model", sorted(PUBLISHED))
def test_a_released_config_plans_with_its_published_parameter_count(model, capsys):
    import pretrain_gpt

    code = pretrain_gpt.main(["--init-from-hf", str(FIXTURES / model), "--dry-run", "--micro-batch-size", "1",
                              "--global-batch-size", "1", "--seq-length", "64"])
    printed = capsys.readouterr().out
    assert code == 0, printed
    parameters = int(re.search(r"this rank's TP shard ([\d,]+)", printed).group(1).replace(",", ""))
    assert parameters == pytest.approx(PUBLISHED[model], rel=5e-3), parameters


@pytest.mark.slow
def test_the_released_phi_3_mini_128k_config_plans_with_its_longrope_and_its_exact_parameter_count(capsys):
    """Phi-3-mini-128k-instruct's first release writes rope_scaling type 'su' (transformers' older name for
    'longrope': gpt/longrope.py), read as --position-embedding-type longrope. Its parameters: the safetensors index's
    bfloat16 total_size 7,642,159,104 / 2 = 3,821,079,552 (the model card's 3.8B). The vocabulary, 32064, is a
    multiple of 64, so with --make-vocab-size-divisible-by 64 nothing pads it and the count is exact (the default
    128 pads the embedding and the untied output by 64 rows each: 393,216 more)."""
    import pretrain_gpt

    code = pretrain_gpt.main(["--init-from-hf", str(FIXTURES / "phi-3-mini-128k-instruct"), "--dry-run",
                              "--micro-batch-size", "1", "--global-batch-size", "1", "--seq-length", "64",
                              "--make-vocab-size-divisible-by", "64"])
    printed = capsys.readouterr().out
    assert code == 0, printed
    assert int(re.search(r"this rank's TP shard ([\d,]+)", printed).group(1).replace(",", "")) == 3_821_079_552
