"""Megatron's --attention-backend / --use-flash-attn as the SDPA kernel: the choice reaches the kernel
(a restricted kernel that cannot run says so), every kernel computes the same attention, and a choice
the device cannot run is refused before any work."""

import dataclasses

import pytest
import torch

import pretrain_gpt
from arguments.config import ModelConfig
from gpt.model import build_gpt_model
from parallel.state import ParallelState

CPU = ParallelState(device=torch.device("cpu"))
MODEL = ModelConfig(num_layers=2, hidden_size=32, num_attention_heads=2, seq_length=16, max_position_embeddings=16,
                    vocab_size=100, hidden_dropout=0.0, attention_dropout=0.0)


def loss_with(backend: str, **changes) -> torch.Tensor:
    config = dataclasses.replace(MODEL, attention_backend=backend, **changes)
    model = build_gpt_model(config, CPU, seed=5)
    tokens = torch.randint(0, 100, (2, 17), generator=torch.Generator().manual_seed(0))
    return model(tokens[:, :-1], tokens[:, 1:]).mean()


def test_every_cpu_kernel_computes_the_same_attention():
    reference = loss_with("auto")
    for backend in ("flash", "unfused", "local"):
        assert torch.allclose(loss_with(backend), reference, rtol=1e-5), backend


def test_the_choice_reaches_the_kernel():
    """PyTorch's CPU flash kernel has no dropout: restricted to it, a training forward with attention
    dropout finds no kernel, while the math kernel runs it. Only a live restriction can fail so."""
    with pytest.raises(RuntimeError, match="No available kernel"):
        loss_with("flash", attention_dropout=0.1)
    assert torch.isfinite(loss_with("unfused", attention_dropout=0.1))


@pytest.mark.parametrize("argv, words", [
    (["--attention-backend", "fused"], "--attention-backend fused needs CUDA"),
    (["--use-flash-attn"], "--attention-backend flash on a CPU has no dropout: set --attention-dropout 0"),
])
def test_a_kernel_the_cpu_cannot_run_is_refused_before_any_work(argv, words, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(pretrain_gpt, "build_data", lambda *args: pytest.fail("data work started"))
    assert pretrain_gpt.main(argv + ["--device", "cpu", "--metrics-file", str(tmp_path / "m.jsonl")]) == 2
    assert words in capsys.readouterr().err


def test_flash_on_cuda_needs_16_bit_inputs():
    """Checked without a GPU: the rule is the kernel's (flash attention takes fp16/bf16 only)."""
    from gpt.attention_backend import check_attention_backend
    from arguments.config import ConfigError

    flash = dataclasses.replace(MODEL, attention_backend="flash")
    with pytest.raises(ConfigError, match="--attention-backend flash on CUDA takes 16-bit inputs"):
        check_attention_backend(flash, "fp32", torch.device("cuda"))
    check_attention_backend(flash, "bf16", torch.device("cuda"))
    check_attention_backend(dataclasses.replace(MODEL, attention_backend="fused"), "fp32", torch.device("cuda"))
