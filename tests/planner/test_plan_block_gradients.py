"""The gradients a block's backward holds beside its saved tensors, planned (planner/dry_run.py: the plan's
gradient_working_bytes less the logits) against one real block's recompute and backward on the CPU.

The measure: torch.profiler's allocation trace (profile_memory) of one block run as the checkpoint's backward runs it
(zero/activations.py: the forward again under enable_grad, then torch.autograd.backward(output, grad_output), the
output held until it returns, as Megatron-LM's CheckpointFunction.backward). Its peak in backward, less the block's
saved activations (what autograd's saved-tensor hooks see, without parameters and the checkpointed input), plus the
gradient arriving at the block's output, is what the plan must count beside the saved tensors. Each parameter's
gradient is dropped as it is accumulated, as the ZeRO reducer's hook takes it (the planner counts the largest apart:
parameter_gradient_bytes); the one alive at GPT-2's peak (dense_4h_to_h's) is in the measure, hence the band's
lower end.

Held there, in hidden-wide tensors: GPT-2's block (ffn 4 x hidden) 6.25, the arriving gradient, the recomputed output
and the MLP's activation gradient (one ffn-wide for GeLU); the Llama-style block (RMSNorm, SwiGLU at ffn 2.5 x
hidden, rotary, GQA) 9.5, three ffn-wide (the gated activation keeps only gate and up and makes the activation again
in backward, gpt/glu.py: its gradient, up's and the activation made again); GPT-OSS's clamped quick_gelu 22 (five
ffn-wide at ffn 4 x hidden; 23 with the clamp's bool mask, alive at the peak before gate and up ran as one GEMM, whose
backward clamps in place, gpt/gate_up_gemm.py), Gemma's GeGLU 14 (three): GatedActivation.backward_widths."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from arguments.parser import parse_config
from gpt.model import GPTModel
from parallel.init import materialize
from parallel.state import ParallelState
from planner.dry_run import Cluster, dry_run

MODEL = ["--num-layers", "1", "--hidden-size", "128", "--seq-length", "256", "--max-position-embeddings", "256",
         "--micro-batch-size", "8", "--global-batch-size", "8", "--train-iters", "1", "--seed", "1",
         "--tokenizer-vocab-size", "512", "--device", "cpu", "--zero-stage", "1", "--attention-dropout", "0",
         "--hidden-dropout", "0", "--recompute-granularity", "full", "--recompute-method", "uniform",
         "--recompute-num-layers", "1"]
BLOCKS = {
    "gpt2": ["--num-attention-heads", "4"],
    "llama": ["--num-attention-heads", "8", "--group-query-attention", "--num-query-groups", "2", "--normalization",
              "RMSNorm", "--swiglu", "--position-embedding-type", "rope", "--disable-bias-linear"],
}
_LLAMA_BUT_THE_MLP = [flag for flag in BLOCKS["llama"] if flag != "--swiglu"]
BLOCKS["gpt-oss-glu"] = [*_LLAMA_BUT_THE_MLP, "--quick-geglu", "--glu-linear-offset", "1", "--activation-func-clamp-value",
                         "7"]
BLOCKS["geglu"] = [*_LLAMA_BUT_THE_MLP, "--gated-linear-unit", "--activation", "gelu_tanh"]


def measured_block_gradients(config, micro_batch: int) -> int:
    """Bytes alive at one block's backward peak beside its saved activations (module docstring)."""
    torch.manual_seed(0)
    model = materialize(GPTModel(config, ParallelState(device=torch.device("cpu"))), seed=1, device="cpu",
                        dtype=torch.float32)
    (block,) = model.blocks
    parameters = {p.untyped_storage().data_ptr() for p in model.parameters()}
    for parameter in block.parameters():  # the reducer takes each gradient as it is accumulated
        parameter.register_post_accumulate_grad_hook(lambda p: setattr(p, "grad", None))
    shape = (micro_batch, config.seq_length, config.hidden_size)
    hidden = torch.randn(shape).requires_grad_(True)  # the checkpoint, kept before: not counted
    grad_output = torch.randn(shape)  # the gradient arriving from the block above
    block(hidden)  # warm: lazily built tables (rotary's) are not a backward's
    saved: dict[int, int] = {}

    def pack(tensor):
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in parameters and storage.data_ptr() != hidden.untyped_storage().data_ptr():
            saved[storage.data_ptr()] = storage.nbytes()
        return tensor

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
            output = block(hidden)
        with torch.profiler.record_function("block backward"):
            torch.autograd.backward(output, grad_output)
    events = prof.profiler.kineto_results.events()
    (backward_start,) = [event.start_ns() for event in events if event.name() == "block backward"]
    live = peak = 0
    for event in sorted((event for event in events if event.name() == "[memory]"), key=lambda e: e.start_ns()):
        live += event.nbytes()
        if event.start_ns() >= backward_start:
            peak = max(peak, live)
    return peak - sum(saved.values()) + grad_output.nbytes


@pytest.mark.parametrize("block", list(BLOCKS))
def test_the_plan_counts_what_a_blocks_backward_holds_beside_its_saved_tensors(block, corpus_cache):
    config = parse_config([*MODEL, *BLOCKS[block], "--data-cache-dir", corpus_cache])
    from data.corpus import prepare_default_corpus

    vocab = prepare_default_corpus(corpus_cache, 512).vocab_size
    plan = dry_run(config, Cluster(1, 1, device_type="cpu"), vocab, rank=0)
    planned = plan.gradient_working_bytes - plan.logits_bytes
    measured = measured_block_gradients(dataclasses.replace(config.model, vocab_size=vocab),
                                        config.training.micro_batch_size)
    hidden = config.training.micro_batch_size * config.model.seq_length * config.model.hidden_size * 4
    print(block, f"planned {planned / hidden:.2f} measured {measured / hidden:.2f} hidden-wide")
    assert 0.95 <= planned / measured <= 1.02, (block, planned / hidden, measured / hidden)
