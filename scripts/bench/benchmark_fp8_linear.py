#!/usr/bin/env python
"""One FP8 linear of gpt2-1.5b's shapes (4096 tokens), forward and backward, against bf16's, on a CUDA GPU; and the
bf16-output FP8 GEMM against the fp32 one cast afterwards, bitwise (docs/fp8.md, "On one H100").

    python scripts/bench/benchmark_fp8_linear.py        # milliseconds a forward + backward, each the mean of 20
"""

import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from parallel.fp8.guard import LayerGuard  # noqa: E402
from parallel.fp8.kernel import scaled_matmul  # noqa: E402
from parallel.fp8.linear import Fp8LinearState, fp8_linear  # noqa: E402
from parallel.fp8.recipes import Fp8Recipe  # noqa: E402

SHAPES = [("qkv", 4096, 1600, 4800), ("h_to_4h", 4096, 1600, 6400), ("4h_to_h", 4096, 6400, 1600)]


def mean_ms(action, repeats: int = 20) -> float:
    for _ in range(3):
        action()
    torch.cuda.synchronize()
    started = time.perf_counter()
    for _ in range(repeats):
        action()
    torch.cuda.synchronize()
    return (time.perf_counter() - started) / repeats * 1e3


def fp8_state(recipe: str, guarded: bool, device: torch.device) -> Fp8LinearState:
    state = Fp8LinearState(Fp8Recipe(recipe=recipe), device)
    if guarded:
        state.guard = LayerGuard("benchmark", 0.05, None, lambda line: None)
    return state


def main() -> int:
    if not torch.cuda.is_available():
        print("scripts/bench/benchmark_fp8_linear.py: needs a CUDA GPU", file=sys.stderr)
        return 2
    device = torch.device("cuda")
    torch.manual_seed(0)
    for name, tokens, inputs, outputs in SHAPES:
        x = torch.randn(tokens, inputs, device=device, dtype=torch.bfloat16, requires_grad=True)
        weight = (torch.randn(outputs, inputs, device=device, dtype=torch.bfloat16) * 0.02).requires_grad_()
        bias = torch.zeros(outputs, device=device, dtype=torch.bfloat16, requires_grad=True)
        grad = torch.randn(tokens, outputs, device=device, dtype=torch.bfloat16)

        def fp8_pass(state, with_bias=None):
            return lambda: fp8_linear(x, weight, with_bias, state).backward(grad)

        row = {"bf16": mean_ms(lambda: torch.nn.functional.linear(x, weight).backward(grad))}
        for recipe in ("tensorwise", "delayed"):
            row[f"{recipe}_noguard"] = mean_ms(fp8_pass(fp8_state(recipe, False, device)))
            row[f"{recipe}_guard"] = mean_ms(fp8_pass(fp8_state(recipe, True, device)))
        row["tensorwise_noguard_bias"] = mean_ms(fp8_pass(fp8_state("tensorwise", False, device), bias))
        a = (x.detach() * 3).to(torch.float8_e4m3fn)
        b = weight.detach().mul(50).to(torch.float8_e4m3fn).t()
        scale_a, scale_b = torch.tensor(0.37, device=device), torch.tensor(1.9, device=device)
        same = torch.equal(scaled_matmul(a, b, scale_a, scale_b, torch.float32).to(torch.bfloat16),
                           scaled_matmul(a, b, scale_a, scale_b, torch.bfloat16))
        print(name, {key: round(value, 3) for key, value in row.items()}, "bf16-out == fp32-out cast:", same,
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
