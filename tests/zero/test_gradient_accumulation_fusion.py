"""Gradient accumulation fusion under ZeRO (zero/fused_accumulation.py, parallel/grad_accumulation_fusion.py):
Megatron-LM's flag and default, the start-up line's path, and whole train steps at every stage against the same
steps with --no-gradient-accumulation-fusion.

Megatron-LM's megatron/training/arguments.py (NVIDIA/Megatron-LM):
    group.add_argument('--no-gradient-accumulation-fusion',
                       action='store_false',
                       help='Disable fusing gradient accumulation to weight '
                       'gradient computation of linear layers',
                       dest='gradient_accumulation_fusion')
so fusion is on unless the flag is given; Megatron-Core's ColumnParallelLinear / RowParallelLinear take it from
config.gradient_accumulation_fusion and LinearWithGradAccumulationAndAsyncCommunication.backward adds the weight
gradient into weight.main_grad (fused_weight_gradient_mlp_cuda.wgrad_gemm_accum_fp32).
"""

from __future__ import annotations

import contextlib
import math

import pytest
import torch

from arguments.parser import parse_config
from parallel.grad_accumulation_fusion import LinearIntoMainGrad
from parallel.state import destroy, initialize_grid
from training.build import build
from training.run_settings import resolve_run_settings
from training.step_observer import NoObserver
from training.train_step import DataParallelTrainStep

VOCAB, SEQ = 512, 32
MODEL = ["--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4", "--seq-length", str(SEQ),
         "--max-position-embeddings", str(SEQ), "--micro-batch-size", "2", "--global-batch-size", "6",
         "--tokenizer-vocab-size", str(VOCAB), "--hidden-dropout", "0", "--attention-dropout", "0", "--device", "cpu",
         "--train-iters", "10", "--seed", "3", "--reduce-bucket-size", "20000"]
LLAMA = ["--normalization", "RMSNorm", "--swiglu", "--position-embedding-type", "rope", "--disable-bias-linear"]


def test_megatron_turns_it_on_by_default_and_off_with_its_flag():
    assert parse_config([]).zero.gradient_accumulation_fusion is True
    assert parse_config(["--no-gradient-accumulation-fusion"]).zero.gradient_accumulation_fusion is False


class PhaseOfReductions(NoObserver):
    """Where each unit's reduction was issued: inside a backward (by the hooks) or after it (finish_grad_sync)."""

    def __init__(self):
        self.current, self.reduced_in = None, []

    @contextlib.contextmanager
    def phase(self, name):
        self.current = name
        try:
            yield
        finally:
            self.current = None

    def unit_reduced(self, unit):
        self.reduced_in.append(self.current)

    def grad_sync_finished(self):
        pass


def _batches():
    generator = torch.Generator().manual_seed(0)
    while True:
        yield {"tokens": torch.randint(0, VOCAB, (2, SEQ + 1), generator=generator)}


def train(*flags, iterations=2):
    """(the start-up line, [(loss, grad norm)] of each iteration, the phases each unit was reduced in)."""
    config = parse_config([*MODEL, *flags])
    state = initialize_grid("cpu", config.parallel, 1)
    try:
        settings = resolve_run_settings(config, VOCAB, 1, 1, "cpu")
        built = build(settings, state, dropout_rng=True, torch_compile=False)
        observer = PhaseOfReductions()
        for reducer in built.zero.reducer.gradient_reducers():
            reducer.subscribe(observer)
        step = DataParallelTrainStep(built.model, built.zero, _batches(), settings, state, built.activations,
                                     observer=observer)
        outcomes = []
        for iteration in range(iterations):
            outcome = step(iteration + 1, iteration * settings.batch.global_batch_size, measure_activations=False)
            outcomes.append((outcome.loss, outcome.grad_norm))
        return built.gradient_accumulation_fusion, outcomes, observer.reduced_in
    finally:
        destroy(state)


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_a_train_step_with_fusion_is_the_one_without(stage, precision):
    """fp32: the same GEMMs but for adding into the main gradient inside the weight gradient's GEMM (addmm_) rather
    than after it: only the sums' order may differ (on this CPU: the same bits). bf16: each micro-batch's weight
    gradient is no longer rounded to bf16 before it is added in fp32 (as in Megatron-LM): measured here, the gradient
    norms move by up to 5e-5 relative and the losses after a step by up to 7.5e-6."""
    dtype = ["--bf16"] if precision == "bf16" else []
    line, fused, reduced_in = train("--zero-stage", str(stage), *dtype, *LLAMA)
    _, plain, plain_reduced_in = train("--zero-stage", str(stage), *dtype, *LLAMA, "--no-gradient-accumulation-fusion")
    into = "their slot of the fp32 reduce bucket (ZeRO 2-3)" if stage >= 2 else "the fp32 main gradient"
    assert f"10 tensor-parallel linears add their weight gradient into {into} inside the GEMM" in line
    assert "keep the loss's gradient (the output layer)" not in line  # tied: no output layer
    loss_rel, norm_rel = (1e-6, 1e-6) if precision == "fp32" else (1e-4, 1e-3)
    for (loss, norm), (plain_loss, plain_norm) in zip(fused, plain):
        assert math.isclose(loss, plain_loss, rel_tol=loss_rel) and math.isclose(norm, plain_norm, rel_tol=norm_rel)
    # the fused weights' hooks still fired in the backward: each unit reduced there, as without fusion
    assert reduced_in == plain_reduced_in and set(reduced_in) == {"backward"}


def test_the_line_says_why_nothing_fuses():
    line, _, _ = train("--no-gradient-accumulation-fusion", iterations=0)
    assert line.startswith("> gradient accumulation fusion off (--no-gradient-accumulation-fusion)")
    # 16-bit gradients: no fp32 main gradient to add into
    line, _, _ = train("--bf16", "--no-accumulate-allreduce-grads-in-fp32", iterations=0)
    assert "no linear fuses; 8 keep autograd's gradient: their main gradient is 16-bit" in line


def test_the_line_names_the_emulation_on_the_cpu_and_what_keeps_autograds_gradient():
    line, _, _ = train("--bf16", "--untie-embeddings-and-output-weights", iterations=0)
    assert "8 tensor-parallel linears" in line and "CPU emulation: one custom op" in line
    assert "1 keep the loss's gradient (the output layer)" in line
    line, _, _ = train(iterations=0)
    assert "addmm_ into the fp32 main gradient" in line


def test_compiled_blocks_keep_autograds_gradient():
    config = parse_config(MODEL)
    state = initialize_grid("cpu", config.parallel, 1)
    try:
        built = build(resolve_run_settings(config, VOCAB, 1, 1, "cpu"), state, dropout_rng=False, torch_compile=True)
    finally:
        destroy(state)
    assert "no linear fuses; 8 keep autograd's gradient in the compiled blocks (--compile)" in \
        built.gradient_accumulation_fusion
    assert not any(isinstance(getattr(module, "linear", None), LinearIntoMainGrad) for module in built.model.modules())


FP8 = ("--bf16", *LLAMA, "--fp8-format", "hybrid", "--fp8-recipe", "tensorwise")


@pytest.mark.parametrize("stage", [1, 3])
def test_fp8_linears_add_their_fp32_weight_gradient_into_the_main_gradient(stage):
    """FP8 linears fuse too (TE's fuse_wgrad_accumulation): their weight gradient's GEMM writes fp32 and the backward's
    epilogue adds it into the main gradient (ZeRO 1's buffer, ZeRO 3's bucket slot). Against autograd's bf16 weight
    gradient added after the GEMM, only each micro-batch's bf16 rounding is gone: measured here, the gradient norms
    move by 2e-5 relative and the loss after a step by 1.7e-6; each unit is reduced in the backward as before."""
    line, fused, reduced_in = train("--zero-stage", str(stage), *FP8)
    _, plain, plain_reduced_in = train("--zero-stage", str(stage), *FP8, "--no-gradient-accumulation-fusion")
    assert "10 tensor-parallel linears add their weight gradient into" in line and \
        "inside the GEMM, 10 FP8: their GEMM FP8, the weight gradient's written in fp32" in line
    for (loss, norm), (plain_loss, plain_norm) in zip(fused, plain):
        assert math.isclose(loss, plain_loss, rel_tol=1e-4) and math.isclose(norm, plain_norm, rel_tol=1e-3)
    assert fused != plain  # the rounding is gone
    assert reduced_in == plain_reduced_in and set(reduced_in) == {"backward"}


def test_the_line_counts_fp8_and_high_precision_linears_apart():
    line, _, _ = train(*FP8, "--first-last-layers-bf16", "--num-layers-at-start-in-bf16", "1",
                       "--num-layers-at-end-in-bf16", "0", iterations=0)
    assert "10 tensor-parallel linears add their weight gradient into the fp32 main gradient inside the GEMM, 5 by " \
        "CPU emulation" in line and "; 5 FP8: their GEMM FP8" in line
