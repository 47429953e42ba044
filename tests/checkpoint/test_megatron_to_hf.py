"""A Megatron-LM torch_dist checkpoint -> `scripts/tools/convert_to_hf.py` -> a folder transformers loads, whose logits
and loss are Megatron-LM's (issue 78 item 4).

The checkpoints are the fixtures Megatron-LM's own pretrain_gpt.py saved at iteration 2 (tests/fixtures/megatron_*,
scripts/tools/megatron_checkpoint_fixtures.py). Iteration 3's global batch is the samples 8-11 of Megatron-Core's order
(data/megatron_order.py); Megatron-LM's forward of it, in the launch that --load-ed the save, left its tokens and
fp32 logits in NAME/megatron_logits.safetensors, and the loss it logged is their mean cross entropy. transformers'
model of the exported folder, on the same tokens, gives the same logits within 1e-6 of the largest |logit| (measured:
1.2e-7 to 1.9e-7, a few fp32 roundings) and the same loss within 1e-5 relative. GPT-2's block at TP 1 and over 2
pipeline stages, the Llama-shaped model (also saved at TP 2 x DP 2, its logits gathered over the vocabulary's two
halves), and the mixture of experts saved over 2 expert-parallel ranks. Its config.json carries the run's own args
(common.pt), and each field they do not give is named in one line with the value written (issue 92 item 5).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from checkpoint.megatron_hf_fields import FROM_SETTINGS
from checkpoint.torch_dist.common import load_common, saved_args
from data.gpt_dataset import build_train_valid_test_datasets
from data.megatron_order import MegatronOrderGPTDataset
from scripts.tools import convert_to_hf
from tests.checkpoint.test_megatron_checkpoint import FIXTURES, iteration_dir, record

SEQ_LENGTH, SEED, BATCH, SAVED_AT = 16, 1234, 4, 2


def iteration_3_tokens(tmp_path: Path) -> torch.Tensor:
    """The global batch Megatron-LM's iteration 3 read: its samples after 8 consumed."""
    train, _, _ = build_train_valid_test_datasets(
        [str(FIXTURES / "megatron_data" / "varied_docs")], "100,0,0", SEQ_LENGTH, SEED, (4 * BATCH, 0, 0),
        cache_dir=str(tmp_path / "cache"), dataset_class=MegatronOrderGPTDataset)
    return torch.stack([train[i]["tokens"] for i in range(SAVED_AT * BATCH, (SAVED_AT + 1) * BATCH)])


def megatron_logits(name: str) -> tuple[torch.Tensor, torch.Tensor]:
    """The tokens Megatron-LM's iteration-3 forward read and the logits its output layer gave (fp32, [4, 16, 128])."""
    from safetensors.torch import load_file

    saved = load_file(FIXTURES / name / "megatron_logits.safetensors")
    return saved["tokens"], saved["logits"]


@pytest.mark.parametrize("name,hf_class", [("megatron_tp1", "GPT2LMHeadModel"),
                                           ("megatron_llama", "LlamaForCausalLM"),
                                           ("megatron_distopt_dp_reshardable", "LlamaForCausalLM"),
                                           ("megatron_pp2_distopt_dp_reshardable", "GPT2LMHeadModel"),
                                           ("megatron_moe_ep2", "MixtralForCausalLM"),
                                           ("megatron_deepseek_v3", "DeepseekV3ForCausalLM")])
def test_the_exported_folders_logits_and_loss_are_megatron_lms(tmp_path, capsys, name, hf_class):
    from transformers import AutoModelForCausalLM

    out = tmp_path / "hf"
    assert convert_to_hf.main([str(FIXTURES / name), str(out)]) == 0
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == [hf_class]
    assert_the_runs_args(config, vars(saved_args(load_common(iteration_dir(name)))))
    said = capsys.readouterr().out.splitlines()
    notes = [line for line in said if line.startswith(" note: config.json ")]
    named = {line.split()[2] for line in notes}
    assert "pad_token_id" in named and not named & set(FROM_SETTINGS)  # every field of a setting: the args'
    # DeepSeek-V3's MTP layer has no place in transformers' DeepseekV3ForCausalLM (nor in its forward): written as a
    # release's, said in one line; its YaRN rope's factor is the run's --rotary-scaling-factor
    assert [line for line in said if "--mtp-num-layers" in line] == ([
        " note: --mtp-num-layers 1: DeepseekV3ForCausalLM runs no multi-token prediction layer: their weights are "
        "written as a release's model.layers.2.* (num_nextn_predict_layers 1), which transformers does not load; its "
        "logits are the main model's"] if name == "megatron_deepseek_v3" else [])
    if name == "megatron_deepseek_v3":
        assert (config["num_nextn_predict_layers"], config["rope_parameters"]["rope_type"],
                config["rope_parameters"]["factor"], config["routed_scaling_factor"], config["n_group"],
                config["topk_group"], config["first_k_dense_replace"]) == (1, "yarn", 40.0, 2.5, 2, 1, 1)
    model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    tokens = iteration_3_tokens(tmp_path)
    with torch.no_grad():
        logits = model(tokens[:, :-1]).logits
    megatron_tokens, expected = megatron_logits(name)
    assert torch.equal(megatron_tokens, tokens[:, :-1])  # the same batch, in the same order
    # relative to the largest logit: these barely trained logits are all small (|logit| < 0.4), so an elementwise
    # rtol would ask the near-zero ones for more than fp32 sums of 16-32 terms in another order give
    assert logits.shape == expected.shape
    assert float((logits - expected).abs().max()) <= 1e-6 * float(expected.abs().max())
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1))
    assert float(loss) == pytest.approx(record(name)["uninterrupted_losses"]["3"], rel=1e-5, abs=0)


def assert_the_runs_args(config: dict, args: dict) -> None:
    """config.json's dropout, norms' epsilon, initialization, rotary base and MoE loss coefficient are the run's
    (its --attention-dropout 0 was exported as this project's default 0.1 before issue 92 item 5)."""
    pairs = {"attention_dropout": "attention_dropout", "attn_pdrop": "attention_dropout",
             "resid_pdrop": "hidden_dropout", "embd_pdrop": "hidden_dropout", "rms_norm_eps": "layernorm_epsilon",
             "layer_norm_epsilon": "layernorm_epsilon", "initializer_range": "init_method_std",
             "router_aux_loss_coef": "moe_aux_loss_coeff", "num_experts_per_tok": "moe_router_topk"}
    written = {key: (config[key], args[arg]) for key, arg in pairs.items() if key in config}
    # NullTokenizer's end-of-document id follows its --vocab-size ids: this project's BOS and EOS
    written.update(eos_token_id=(config["eos_token_id"], args["vocab_size"]),
                   bos_token_id=(config["bos_token_id"], args["vocab_size"]))
    if "rope_parameters" in config:
        written["rope_theta"] = (config["rope_parameters"]["rope_theta"], args["rotary_base"])
    assert len(written) >= 4 and all(ours == theirs for ours, theirs in written.values()), written
