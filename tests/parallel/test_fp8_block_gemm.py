"""The block recipes' GEMM as one call (issue 87 item 1, parallel/fp8/block_gemm.py).

No GPU here: torch's native block-scaled GEMM (torch.nn.functional.scaled_mm with BlockWise1x128 / BlockWise128x128,
cuBLASLt on sm90) is not run. What is checked instead: the blockwise linear's three GEMMs, forward and backward, given
to scaled_mm on the meta device, whose kernel (torch/_meta_registrations.py, _check_scaled_mm_sizes_v2) applies CUDA's
rules to the operands and the scales' shapes and strides; a scale in another layout is refused there and by our own
check (check_block_operands, run on every device as kernel.py's is). On the CPU each GEMM is one call of the emulated
operator, whose K-block loop gives the bits tests/parallel/test_fp8_linear.py writes out."""

import pytest
import torch

from parallel.fp8 import block_gemm, kernel
from parallel.fp8.block_gemm import block_scaled_matmul, check_block_operands, outer_major, square_block_scale
from parallel.fp8.kernel import Fp8OperandError, kernel_name
from parallel.fp8.linear import Fp8LinearState, fp8_linear
from parallel.fp8.recipes import Fp8Recipe

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2


@pytest.fixture
def native_everywhere(monkeypatch):
    """Every device (the meta one included) treated as one with torch's native block-scaled GEMM; the calls given
    to it recorded."""
    calls = []
    from torch.nn import functional

    real = functional.scaled_mm

    def recording(*args, **kwargs):
        calls.append(args)
        return real(*args, **kwargs)
    monkeypatch.setattr(kernel, "native_block_gemm_missing", lambda device: None)
    monkeypatch.setattr(functional, "scaled_mm", recording)
    return calls


def test_the_blockwise_linears_three_gemms_pass_torchs_meta_checks(native_everywhere):
    """x [256, 384] -> 512 on meta: fprop (1x128 x 128x128), dgrad (1x128 x 128x128 of W), wgrad (1x128 x 1x128
    along the tokens), each one scaled_mm the meta kernel accepts; the output and gradients have their shapes. e4m3
    throughout: torch's native kernel takes no e5m2 operand (the hybrid test below)."""
    state = Fp8LinearState(Fp8Recipe(fp8_format="e4m3", recipe="blockwise"), device="meta")
    weight = torch.empty(512, 384, dtype=torch.bfloat16, device="meta", requires_grad=True)
    x = torch.empty(256, 384, dtype=torch.bfloat16, device="meta", requires_grad=True)
    y = fp8_linear(x, weight, None, state)
    y.backward(torch.empty_like(y))
    assert y.shape == (256, 512) and x.grad.shape == x.shape and weight.grad.shape == weight.shape
    fprop, wgrad, dgrad = native_everywhere  # the forward's, then the backward's (weight gradient first)
    assert (fprop[0].shape, fprop[1].shape) == ((256, 384), (384, 512))
    assert (wgrad[0].shape, wgrad[1].shape, wgrad[0].dtype) == ((512, 256), (256, 384), E4M3)
    assert (dgrad[0].shape, dgrad[1].shape, dgrad[0].dtype) == ((256, 512), (512, 384), E4M3)
    # scales as cuBLASLt takes them: 1x128 outer-dim-major, 128x128 with the K blocks padded to 4
    assert fprop[2].shape == (256, 3) and fprop[2].stride() == (1, 256)
    assert fprop[4].shape == (4, 4) and fprop[4].stride() == (1, 4)
    assert dgrad[4].shape == (4, 3) and dgrad[4].stride() == (1, 4)
    from torch.nn.functional import ScalingType

    assert [(args[3], args[5]) for args in native_everywhere] == [
        (ScalingType.BlockWise1x128, ScalingType.BlockWise128x128),
        (ScalingType.BlockWise1x128, ScalingType.BlockWise1x128),
        (ScalingType.BlockWise1x128, ScalingType.BlockWise128x128)]


def test_hybrid_runs_only_its_forward_natively(native_everywhere):
    """--fp8-format hybrid: the backward's GEMMs take the e5m2 gradient, which torch's block-scaled GEMM refuses
    (check_deepseek_recipe: e4m3 operands only; seen on an H200): they run the K-block loop."""
    state = Fp8LinearState(Fp8Recipe(fp8_format="hybrid", recipe="blockwise"), device="meta")
    weight = torch.empty(512, 384, dtype=torch.bfloat16, device="meta", requires_grad=True)
    x = torch.empty(256, 384, dtype=torch.bfloat16, device="meta", requires_grad=True)
    fp8_linear(x, weight, None, state).backward(torch.empty(256, 512, dtype=torch.bfloat16, device="meta"))
    assert len(native_everywhere) == 1 and native_everywhere[0][0].dtype == E4M3
    assert x.grad.shape == x.shape and weight.grad.shape == weight.shape


def test_a_scale_in_another_layout_is_refused_by_torchs_meta_kernel_and_ours():
    from torch.nn.functional import ScalingType, scaled_mm

    a = torch.empty(256, 384, dtype=E4M3, device="meta")
    w = torch.empty(512, 384, dtype=E4M3, device="meta")
    row_major = torch.empty(256, 3, device="meta")  # [rows, K blocks] row-major: cuBLASLt wants it outer-dim-major
    w_scale = square_block_scale(torch.empty(4, 3, device="meta"))
    with pytest.raises(RuntimeError, match="scale a must have shape"):
        scaled_mm(a, w.t(), row_major, ScalingType.BlockWise1x128, w_scale, ScalingType.BlockWise128x128,
                  output_dtype=torch.bfloat16)
    with pytest.raises(Fp8OperandError, match=r"scale_a must be fp32 \[256, 3\] with strides \(1, 256\)"):
        check_block_operands(a, row_major, w.t(), w_scale, 128, True)
    check_block_operands(a, outer_major(row_major), w.t(), w_scale, 128, True)  # the layout the casts give


def test_the_cpu_runs_one_call_per_gemm_and_the_native_gemm_only_on_multiples_of_128(monkeypatch):
    generator = torch.Generator().manual_seed(0)
    a = (torch.randn(64, 160, generator=generator) * 10).to(E4M3)
    b = (torch.randn(96, 160, generator=generator) * 10).to(E4M3)
    a_scale = outer_major(torch.rand(64, 2, generator=generator))
    b_scale = outer_major(torch.rand(96, 2, generator=generator))
    with torch.backends.mkldnn.flags(enabled=False):
        want = block_gemm.per_block_loop(a, a_scale, b.t(), b_scale, 128, False, torch.float32)
    assert torch.equal(block_scaled_matmul(a, a_scale, b.t(), b_scale, 128, False, torch.float32), want)
    monkeypatch.setattr(kernel, "native_block_gemm_missing", lambda device: None)
    assert not block_gemm._runs_natively(a, b.t(), 128, False)  # K = 160: the loop
    whole = torch.empty(64, 256, dtype=E4M3)
    assert block_gemm._runs_natively(whole, torch.empty(256, 128, dtype=E4M3), 128, True)
    assert not block_gemm._runs_natively(whole, torch.empty(256, 96, dtype=E4M3), 128, True)  # N off 128
    # hybrid's e5m2 gradient: torch's block-scaled GEMM takes e4m3 only (an H200's torch 2.11 refused it)
    assert not block_gemm._runs_natively(torch.empty(64, 256, dtype=torch.float8_e5m2),
                                         torch.empty(256, 128, dtype=E4M3), 128, True)
    assert not block_gemm._runs_natively(torch.empty(64, 256, dtype=E4M3), torch.empty(256, 96, dtype=E4M3), 32,
                                         False)  # MXFP8: the loop on sm90


def test_the_start_up_names_the_gemm_each_device_runs(monkeypatch):
    assert "one operator per GEMM (fp8_kernel::cpu_emulated_block_scaled_mm" in kernel_name(torch.device("cpu"),
                                                                                             "blockwise")
    monkeypatch.setattr(kernel, "native_block_gemm_missing", lambda device: None)
    assert kernel_name(torch.device("cuda"), "blockwise").startswith("CUDA scaled_mm with native 1x128 / 128x128")
    assert "MXFP8's native GEMM is Blackwell's" in kernel_name(torch.device("cuda"), "mxfp8")
    monkeypatch.setattr(kernel, "native_block_gemm_missing", lambda device: "sm80: no")
    assert kernel_name(torch.device("cuda"), "blockwise") == \
        "emulated: one CUDA _scaled_mm per 128-wide K block, block scales applied in fp32 (sm80: no)"
