"""Under --sequence-parallel a column-parallel entry keeps its input as this rank's slice and all-gathers it again in
backward (parallel/regathered_input.py), as Megatron-Core's LinearWithGradAccumulationAndAsyncCommunication does
(megatron/core/tensor_parallel/layers.py: `ctx.save_for_backward(input, weight)` of the *un-gathered* input when
sequence_parallel, and `_gather_along_first_dim` of it again in backward before the weight gradient).

Checked at TP 2 in one 2-rank run: gradients equal the plain gather's bit for bit (fp32, the same ops on the same
bits; and the FP8 linear's per-tensor recipes, which keep their FP8 rows of the slice and gather those bytes); an outer SavedTensorMeter counts the slice's bytes, once for the entry's every consumer; one all-gather per
entry in backward; a GPT-2 and a Llama block in bf16 keep the plain gather's bytes less half of each entry's gathered
input, and gpt/shape.py's per-rank count follows."""

import contextlib

import torch

from base.options import replace_settings
from parallel.comm import ring_bytes_sent
from tests.distributed import run_distributed
from tests.parallel.test_sequence_parallel import GPT2, LLAMA

BATCH = 2
CONFIGS = {"gpt2": replace_settings(GPT2, num_layers=1),
           "llama": replace_settings(LLAMA, num_layers=1, recompute_modules=("layernorm",))}


def _entry_checks(state) -> dict:
    from parallel.mappings import gather_from_sequence_parallel_region
    from parallel.regathered_input import gathered_for
    from zero.activations import SavedTensorMeter

    generator = torch.Generator().manual_seed(state.tensor_parallel_rank)
    shard = torch.randn(BATCH, 8, 16, generator=generator, requires_grad=True)
    gate, up = (torch.nn.Parameter(torch.randn(24, 16, generator=generator)) for _ in range(2))  # not counted

    def run(regather: bool):
        meter = SavedTensorMeter(torch.device("cpu"))
        with meter.hooks():
            if regather:
                with gathered_for(shard, state) as whole:
                    out = torch.nn.functional.linear(whole, gate) * torch.nn.functional.linear(whole, up)
            else:
                whole = gather_from_sequence_parallel_region(shard, state)
                out = torch.nn.functional.linear(whole, gate) * torch.nn.functional.linear(whole, up)
            saved = meter.live["device"]
        state.comm.stats.snapshot_and_reset()
        grads = torch.autograd.grad(out.square().sum(), (shard, gate, up))
        return saved, state.comm.stats.snapshot()["tp"]["all_gather"], grads

    plain_saved, plain_gathers, plain_grads = run(False)
    saved, gathers, grads = run(True)
    products = 2 * BATCH * 16 * 24 * 4  # the two GEMMs' outputs, kept by the product
    whole_bytes = BATCH * 16 * 16 * 4
    return {"equal": all(torch.equal(a, b) for a, b in zip(grads, plain_grads)),
            "plain_input": plain_saved - products, "input": saved - products, "whole": whole_bytes,
            "plain_gathers": plain_gathers, "gathers": gathers}


def _fp8_entry_checks(state, recipe: str) -> dict:
    """One FP8 linear (bf16, per-tensor recipe) on the entry's gathered input: it keeps its FP8 rows of the slice."""
    from parallel.fp8.linear import Fp8LinearState, fp8_linear
    from parallel.fp8.recipes import Fp8Recipe
    from parallel.mappings import gather_from_sequence_parallel_region
    from parallel.regathered_input import gathered_for
    from zero.activations import SavedTensorMeter

    generator = torch.Generator().manual_seed(state.tensor_parallel_rank)
    shard = torch.randn(BATCH, 16, 32, generator=generator).bfloat16().requires_grad_()
    weight = torch.nn.Parameter(torch.randn(48, 32, generator=generator).bfloat16() * 0.1)

    def run(regather: bool):
        fp8 = Fp8LinearState(Fp8Recipe(fp8_format="hybrid", recipe=recipe))  # each run its own first scales
        meter = SavedTensorMeter(torch.device("cpu"))
        with meter.hooks():
            with (gathered_for(shard, state) if regather else
                  contextlib.nullcontext(gather_from_sequence_parallel_region(shard, state))) as whole:
                out = fp8_linear(whole, weight, None, fp8)
            saved = meter.live["device"]
        state.comm.stats.snapshot_and_reset()
        grads = torch.autograd.grad(out.float().square().sum(), (shard, weight))
        return saved, state.comm.stats.snapshot()["tp"]["all_gather"], grads

    (plain_saved, _, plain_grads), (saved, gathers, grads) = run(False), run(True)
    return {"equal": all(torch.equal(a, b) for a, b in zip(grads, plain_grads)), "saved": plain_saved - saved,
            "gathers": gathers, "fp8_whole": BATCH * 32 * 32}


def _block_saved(state, config, sequence_parallel: bool, regather: bool) -> int:
    import contextlib

    import parallel.layers
    from gpt.model import build_gpt_model
    from gpt.parallel_plan import TensorParallelPlan
    from parallel.mappings import gather_from_sequence_parallel_region
    from zero.activations import SavedTensorMeter

    model = build_gpt_model(config, state, seed=3, dtype=torch.bfloat16, plan=TensorParallelPlan(state,
                                                                                                 sequence_parallel))
    seq = config.seq_length // (state.tensor_parallel_size if sequence_parallel else 1)
    hidden = torch.randn(BATCH, seq, config.hidden_size, generator=torch.Generator().manual_seed(0)
                         ).to(torch.bfloat16).requires_grad_()
    original = parallel.layers.gathered_for
    if not regather:  # the plain gather, kept whole by autograd
        parallel.layers.gathered_for = lambda h, s: contextlib.nullcontext(gather_from_sequence_parallel_region(h, s))
    try:
        meter = SavedTensorMeter(torch.device("cpu"))
        with meter.hooks():
            output = model.blocks[0](hidden)
            saved = meter.live["device"]
        del output
    finally:
        parallel.layers.gathered_for = original
    return saved


def _per_rank(rank, world_size):
    from gpt.shape import model_shape
    from parallel.state import destroy, initialize

    state = initialize("cpu", tensor_parallel_size=2)
    try:
        figures = {"entry": _entry_checks(state),
                   "fp8": {recipe: _fp8_entry_checks(state, recipe) for recipe in ("delayed", "tensorwise")}}
        # the Llama block as tests/gpt/test_kv_groups_below_tp.py plans it exactly: its norms keep only their input
        for name, config in CONFIGS.items():
            terms = model_shape(config, 2, sequence_parallel=True).activations
            tokens = BATCH * config.seq_length
            figures[name] = {
                "regathered": _block_saved(state, config, True, True),
                "plain": _block_saved(state, config, True, False),
                "predicted": tokens * (terms.replicated_bytes_per_token + terms.partitioned_bytes_per_token // 2)}
    finally:
        destroy(state)
    return figures


def test_the_entry_keeps_its_slice_and_blocks_keep_what_the_planner_predicts():
    for rank, figures in enumerate(run_distributed(_per_rank, 2, timeout=300)):
        entry = figures["entry"]
        assert entry["equal"], rank
        assert entry["plain_input"] == entry["whole"] and entry["input"] == entry["whole"] // 2, entry
        # in backward: nothing for the plain gather, one all-gather for both consumers of the regathered one
        assert entry["plain_gathers"] == 0 and entry["gathers"] == ring_bytes_sent("all_gather", entry["whole"], 2)
        for recipe, fp8 in figures["fp8"].items():  # half the FP8 rows kept; their bytes (1 each) gathered again
            assert fp8["equal"], (rank, recipe)
            assert fp8["saved"] == fp8["fp8_whole"] // 2, (recipe, fp8)
            assert fp8["gathers"] == ring_bytes_sent("all_gather", fp8["fp8_whole"], 2), (recipe, fp8)
        for name in ("gpt2", "llama"):
            block = figures[name]
            # gpt/shape.py's count (Korthikanti's terms, an upper bound: it counts dropout's masks at dropout 0) moved
            # each entry's input to the split terms: it is now below what the plain gather kept
            assert block["regathered"] <= block["predicted"] < block["plain"], (name, block)
            # two entries (attention, MLP), each keeping 1/2 of its gathered [b, s, h] bf16 input
            whole_input = BATCH * CONFIGS[name].seq_length * CONFIGS[name].hidden_size * 2
            assert block["plain"] - block["regathered"] == 2 * whole_input // 2, (name, block)
