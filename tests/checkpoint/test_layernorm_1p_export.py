"""A run with --apply-layernorm-1p (Megatron-LM's own Llama 3 example passes it) saved as torch_dist exports the model
it trained (issue 90 item 5). Before, the torch_dist writer left the flag out of common.pt's args and the export wrote
the stored gain - 1 as the gain: every norm weight ~0, transformers' logits uniform (loss ln V).

The args now carry Megatron-LM's dest of the flag, layernorm_zero_centered_gamma (its own saves always hold it:
tests/fixtures/megatron_*), read back as apply_layernorm_1p (checkpoint/torch_dist/resume.py RENAMED); a save whose
args lack the key is not exported, in one line (its norms could be off by 1). The save is this project's: Megatron-LM's
own loop cannot write a 1p checkpoint on a CPU (core_v0.16.1's torch path, WrappedTorchNorm, asserts
`not config.layernorm_zero_centered_gamma`, megatron/core/transformer/torch_norm.py; FusedLayerNorm needs apex)."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from scripts.tools import convert_to_hf
from tests.reliability_helpers import train

LLAMA_1P = ["--normalization", "RMSNorm", "--swiglu", "--position-embedding-type", "rope", "--disable-bias-linear",
            "--untie-embeddings-and-output-weights", "--apply-layernorm-1p", "--train-iters", "3", "--save-interval",
            "3", "--ckpt-format", "torch_dist"]


@pytest.mark.slow
def test_a_1p_runs_torch_dist_save_exports_its_gains_and_one_without_the_key_is_refused(tmp_path, corpus_cache,
                                                                                          capsys):
    save = tmp_path / "save"
    (tmp_path / "run").mkdir()
    outcome = train(corpus_cache, tmp_path / "run", *LLAMA_1P, "--save", save)
    assert outcome.code == 0, outcome.err[-2000:]
    assert convert_to_hf.main([str(save), str(tmp_path / "hf")]) == 0
    gains = {name: tensor for name, tensor in load_file(tmp_path / "hf" / "model.safetensors").items()
             if name.endswith("norm.weight")}
    # gains trained 3 steps from 1 (stored as 0); written as the stored value they were ~0
    assert gains and all(abs(float(gain.float().mean()) - 1.0) < 0.1 for gain in gains.values()), \
        {name: float(gain.float().mean()) for name, gain in gains.items()}

    common = save / "iter_0000003" / "common.pt"
    saved = torch.load(common, weights_only=False)
    del vars(saved["args"])["layernorm_zero_centered_gamma"]  # as this project's saves wrote them before
    torch.save(saved, common)
    capsys.readouterr()
    assert convert_to_hf.main([str(save), str(tmp_path / "hf-old")]) == 2
    assert "do not say whether the norms store gain - 1" in capsys.readouterr().err
