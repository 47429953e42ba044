"""Megatron's --attention-backend / --use-flash-attn as the SDPA kernel: the choice reaches the kernel
(a restricted kernel that cannot run says so), every kernel computes the same attention, and a choice
the device cannot run is refused before any work."""


import pytest
import torch

import pretrain_gpt
from arguments.config import ModelConfig
from base.options import replace_settings
from gpt.attention_backend import backend_for_device
from gpt.model import build_gpt_model
from parallel.state import ParallelState

CPU = ParallelState(device=torch.device("cpu"))
MODEL = ModelConfig.of(num_layers=2, hidden_size=32, num_attention_heads=2, seq_length=16, max_position_embeddings=16,
                    vocab_size=100, hidden_dropout=0.0, attention_dropout=0.0)


def loss_with(backend: str, **changes) -> torch.Tensor:
    config = replace_settings(MODEL, attention_backend=backend, **changes)
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
    (["--attention-backend", "fused"], "> --attention-backend fused: the fused kernels need CUDA"),
    (["--use-flash-attn"], "> --use-flash-attn: the flash kernel on a CPU has no dropout"),
    (["--use-flash-attn-v2"], "> --use-flash-attn-v2: the flash kernel on a CPU has no dropout"),
])
def test_a_kernel_the_cpu_cannot_run_falls_back_with_an_info_line_naming_the_flag_typed(argv, words, tmp_path,
                                                                                          capsys, monkeypatch):
    """Issue 34, point 4: a kernel choice changes no math, so a launch the real pair runs (Megatron-LM's
    --use-flash-attn with its default attention dropout 0.1) trains here on the kernel the device has, with
    one info line naming the flag as typed (was: refused, naming our translated --attention-backend flash).
    The run stops at the data to keep the test fast: the fallback is decided before it."""
    monkeypatch.setattr("training.prepare.build_data", lambda *args: pytest.fail("reached the data"))
    with pytest.raises(pytest.fail.Exception, match="reached the data"):
        pretrain_gpt.main(argv + ["--device", "cpu", "--metrics-file", str(tmp_path / "m.jsonl")])
    out = capsys.readouterr().out
    assert [line for line in out.splitlines() if line.startswith(words) and "(auto)" in line], out


def test_flash_on_cuda_in_fp32_falls_back_and_16_bit_keeps_it():
    """Checked without a GPU: the rule is the kernel's (flash attention takes fp16/bf16 only)."""
    from gpt.attention_backend import backend_for_device

    flash = replace_settings(MODEL, attention_backend="flash")
    backend, line = backend_for_device(flash, "fp32", torch.device("cuda"), "--use-flash-attn")
    assert backend == "auto" and line.startswith("> --use-flash-attn: the flash kernel on CUDA takes 16-bit inputs")
    assert backend_for_device(flash, "bf16", torch.device("cuda")) == ("flash", None)
    fused = replace_settings(MODEL, attention_backend="fused")
    assert backend_for_device(fused, "fp32", torch.device("cuda")) == ("fused", None)


def test_flash_on_cuda_with_reset_attention_mask_falls_back_in_one_line():
    """SDPA's flash kernel on CUDA takes no attn_mask (PyTorch's sdp_utils check_for_attn_mask); --reset-attention-
    mask's block-diagonal mask needs one, so the choice falls back to auto before any work, said in one line. The
    CPU's flash kernel takes a mask: kept there."""
    config = replace_settings(MODEL, attention_backend="flash")
    cuda = torch.device("cuda")
    assert backend_for_device(config, "bf16", cuda) == ("flash", None)
    backend, line = backend_for_device(config, "bf16", cuda, attention_mask=True)
    assert backend == "auto" and "--reset-attention-mask" in line and "\n" not in line
    assert backend_for_device(config, "fp32", torch.device("cpu"), attention_mask=True) == ("flash", None)
