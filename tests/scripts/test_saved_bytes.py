"""Issue 111: the bytes autograd saves for backward per layer, counted on the CPU, where the count is exact
(scripts/bench/saved_tensor_counter.py), and this project's held at their values
(scripts/bench/benchmark_saved_bytes.py;
docs/performance.md, "Activation memory per layer, counted").

The counter is checked on a hand-made graph whose saved bytes are known: a storage counted once however many ops
save it or views of it, and whole; parameters left out; nothing once the backward has released it. A layer's count
is the difference between a 2-layer and a 1-layer model's iteration-2 second micro-batch: exact whatever the
embedding and the loss save. Megatron-LM's side (scripts/bench/megatron_lm_cpu.py --count-saved) needs the benchmark
venv and its tree, not here."""

from __future__ import annotations

import torch
from torch import nn

from scripts.bench.benchmark_saved_bytes import count_our_saved, flags
from scripts.bench.saved_tensor_counter import SavedTensorCounter, per_layer
from tests.distributed import run_distributed

# this project's bytes saved per layer in one micro-batch, bf16, hidden 128, sequence 128, micro-batch 1 (s*b*h =
# 16,384), at the commit that made them: GPT-2 shape 527,360 (32.2 per s*b*h), Llama shape 478,208 (29.2); Llama at TP
# 2 with --sequence-parallel, rank 0: 239,104 (29.2 per s*b*h/t). Issue 111 took Llama's from 658,432 (40.2) and
# 361,984 (44.2 per s*b*h/t): the column-parallel linears keep their input's slice (parallel/regathered_input.py), the
# RMSNorms their input and rsqrt (gpt/rms_norm_backward.py), the value its own copy (gpt/attention_kernel.py
# _only_view_left)
GPT2_BF16, LLAMA_BF16, LLAMA_BF16_TP2_SP = 527_360, 478_208, 239_104
# the "mla" and "moe" shapes (scripts/bench/benchmark_saved_bytes.py) at TP 1: multi-latent attention 989,184 (60.4 per
# s*b*h; CPU SDPA's math kernel, its values not padded to the query's width); 4 experts, top 2, 868,112 (53.0;
# 1,965,840 when the grouped matmul kept the experts' weights stacked, 983,040 bytes, the combine its weighted rows,
# 65,536, and attention the QKV output for the value, 49,152: gpt/moe/experts.py, gpt/moe/dispatcher.py, gpt/model.py)
MLA_BF16, MOE_BF16 = 989_184, 868_112


def test_a_storage_counts_once_and_whole_and_parameters_not_at_all():
    linear = nn.Linear(16, 32, bias=False)  # its weight: a parameter, saved by the mm, never counted
    counter = SavedTensorCounter()
    counter.name_modules(linear, "linear")
    x = torch.randn(8, 16, requires_grad=True)  # fp32: 512 bytes, made before the count
    with counter.naming():
        with counter.saving():
            hidden = linear(x)  # saves x (and the weight)
            active = hidden.relu()  # saves its output: 8 x 32 x 4 = 1,024 bytes
            halves = active[:4] * active[4:]  # both views of relu's output saved: its storage again, once
            pairs = halves[:, :2] * x[:4, :2]  # views of halves (its 512 bytes, whole) and of x (again)
            loss = pairs.sum()
        saved = counter.saved()
        assert saved.total == 512 + 1024 + 512, saved
        assert saved.by_name == {"(made before the count)": 512, "(no module) aten.relu": 1024,
                                  "(no module) aten.mul": 512}
        loss.backward()
        assert counter.saved().total == 0  # the backward released every saved tensor


def test_per_layer_is_the_difference_over_the_layers_and_drops_what_does_not_grow():
    deep = {"total": 700, "by_name": {"embedding": 100, "layers.* mm": 600}, "saved_by": {"layers.* mm": ["x"]}}
    shallow = {"total": 400, "by_name": {"embedding": 100, "layers.* mm": 300}, "saved_by": {}}
    assert per_layer(deep, shallow, 1) == {"total": 300, "by_name": {"layers.* mm": 300},
                                           "saved_by": {"layers.* mm": ["x"]}}


def _layer(shape: str, tp: int = 1, sp: bool = False) -> dict:
    two, one = (count_our_saved(flags(shape, "bf16", layers, tp, sp)) for layers in (2, 1))
    return per_layer(two, one, 1)


def test_a_dense_layer_saves_what_it_did():
    for shape, held in (("gpt2", GPT2_BF16), ("llama", LLAMA_BF16)):
        layer = _layer(shape)
        assert layer["total"] == held, (shape, layer)
        # every name a layer's: the embedding's, the final norm's and the loss's drop out of the difference
        assert all(".*." in name or name.startswith("blocks.* ") for name in layer["by_name"]), layer["by_name"]
        assert sum(layer["by_name"].values()) == layer["total"]


def count_on_rank(rank: int, world_size: int, argv: list[str]) -> dict:
    return count_our_saved(argv)


def test_a_sequence_parallel_rank_saves_what_it_did():
    two, one = (run_distributed(count_on_rank, 2, flags("llama", "bf16", layers, 2, True), timeout=120)[0]
                for layers in (2, 1))
    assert per_layer(two, one, 1)["total"] == LLAMA_BF16_TP2_SP


def test_an_mla_and_an_moe_layer_save_what_they_did():
    for shape, held in (("mla", MLA_BF16), ("moe", MOE_BF16)):
        layer = _layer(shape)
        assert layer["total"] == held, (shape, layer)
    # no copy of the experts' weights stacked for the grouped matmul, nor of the combine's weighted rows
    assert not any("aten.stack" in name or name == "blocks.*.mlp aten.mul" for name in layer["by_name"]), layer


def test_the_planners_meter_counts_a_block_as_the_storage_counter_does():
    """The dry run's SavedTensorMeter (zero/activations.py) counts each saved tensor's own bytes; the counter, each
    storage whole: they agree where no saved view keeps a larger storage alive, as on a Llama and a GPT-2 block since
    attention's value got its own copy (gpt/attention_kernel.py _only_view_left; before, the meter missed 3 bytes
    per s*b*h)."""
    from base.options import replace_settings
    from gpt.model import build_gpt_model
    from parallel.state import ParallelState
    from tests.gpt.test_saved_activations import BATCH, LLAMA
    from zero.activations import SavedTensorMeter

    gpt2 = replace_settings(LLAMA, normalization="LayerNorm", swiglu=False, position_embedding_type="learned_absolute",
                            num_query_groups=LLAMA.num_attention_heads)
    for config in (LLAMA, gpt2):
        block = build_gpt_model(config, ParallelState(device=torch.device("cpu")), seed=3, dtype=torch.bfloat16
                                ).blocks[0]
        hidden = torch.randn(BATCH, config.seq_length, config.hidden_size).to(torch.bfloat16).requires_grad_()
        meter, counter = SavedTensorMeter(torch.device("cpu")), SavedTensorCounter()
        with meter.hooks():
            output = block(hidden)
            metered = meter.live["device"]
        del output
        with counter.saving():
            output = block(hidden)
            counted = counter.saved().total
        del output
        assert metered == counted > 0, (config.norms.normalization, metered, counted)
