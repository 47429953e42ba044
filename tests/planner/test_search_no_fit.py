"""`python -m zero.plan search` for a model that fits on no layout of the GPUs asked (issue 115): it says so, names
the smallest count that fits (found by the count, confirmed by the dry run) and the lever that gets closest on the
count asked. Llama 3 70B's widths at 8 layers: about 9e9 parameters, over two H100s whatever the layout."""

import json

from arguments.parser import parse_config
from planner.layout_memory import layout_memory_bytes
from planner.layout_perf import Layout, model_counts
from planner.plan import main

EIGHT_LAYERS = ["--num-layers", "8", "--hidden-size", "8192", "--num-attention-heads", "64", "--num-query-groups", "8",
                "--ffn-hidden-size", "28672", "--swiglu", "--normalization", "RMSNorm", "--position-embedding-type",
                "rope", "--untie-embeddings-and-output-weights", "--disable-bias-linear", "--vocab-size", "128256",
                "--seq-length", "8192", "--max-position-embeddings", "8192", "--global-batch-size", "16"]


def test_no_fit_names_the_smallest_count_the_search_then_fits_at_and_the_closest_lever(capsys):
    assert main(["search", *EIGHT_LAYERS, "--gpus", "2", "--hardware", "h100-sxm", "--top", "1"]) == 0
    out = capsys.readouterr().out
    assert not any(line.startswith("1. ") for line in out.splitlines())
    assert ("no layout fits on 2 GPUs of 80 GB at sequence 8,192: the smallest count that fits is 4 GPUs (by the "
            "count and the dry run), as ") in out

    # the count named is one the search fits at, and it is the smallest walked: 3 is neither a power of two nor a
    # multiple of the node's 8
    assert main(["search", *EIGHT_LAYERS, "--gpus", "4", "--hardware", "h100-sxm", "--json",
                 "--no-dry-run-check"]) == 0
    assert json.loads(capsys.readouterr().out)

    # the lever: from plain DDP at micro-batch 1 on 2 GPUs, each lever alone, counted here from its own Layout
    counts = model_counts(parse_config(EIGHT_LAYERS).model)
    plain = Layout(2, micro_batch_size=1, global_batch_size=16, distributed_optimizer=False)
    alone = {"--tensor-model-parallel-size 2": Layout(2, tp=2, micro_batch_size=1, global_batch_size=16,
                                                      distributed_optimizer=False),
             "--recompute-granularity full": Layout(2, micro_batch_size=1, global_batch_size=16,
                                                    distributed_optimizer=False, recompute_fraction=1.0),
             "--zero-stage 3": Layout(2, micro_batch_size=1, global_batch_size=16, zero_stage=3)}
    counted = {flags: layout_memory_bytes(counts, layout) for flags, layout in alone.items()}
    best = min(counted, key=counted.get)
    assert best == "--tensor-model-parallel-size 2" and counted[best] < layout_memory_bytes(counts, plain)
    assert (f"closest on 2 GPUs: from DP 2, MBS 1, no ZeRO ({layout_memory_bytes(counts, plain) / 1e9:,.0f} GB) the "
            f"lever that cuts the most is {best}, {counted[best] / 1e9:,.0f} GB counted against 80 GB; ") in out
