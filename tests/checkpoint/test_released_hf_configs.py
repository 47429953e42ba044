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
--init-from-hf does not read (arguments/hf_families/gemma3.py: the text_config is the model here)."""

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


def test_the_released_phi_3_mini_128k_config_is_refused_in_one_line_for_its_longrope(capsys):
    """Phi-3-mini-128k-instruct's first release writes rope_scaling type 'su' (transformers reads it as 'longrope':
    per-dimension short and long frequency factors and an attention factor on cos and sin), which changes the
    rotary math and is not built here: the plan stops in one line naming it, exit 2. Its parameter count, the
    safetensors index's bfloat16 total_size 7,642,159,104 / 2 = 3,821,079,552, waits on that."""
    import pretrain_gpt

    code = pretrain_gpt.main(["--init-from-hf", str(FIXTURES / "phi-3-mini-128k-instruct"), "--dry-run",
                              "--micro-batch-size", "1", "--global-batch-size", "1", "--seq-length", "64"])
    captured = capsys.readouterr()
    assert code == 2
    refusal = [line for line in (captured.out + captured.err).splitlines() if "rope_type" in line]
    assert len(refusal) == 1 and "'su' (transformers' older name for 'longrope') is not built here" in refusal[0]
