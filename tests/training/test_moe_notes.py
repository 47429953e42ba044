"""training/moe_notes.py: the two MoE options Megatron-Core defines by the layout are kept so and said in one start-up
line each, naming the option and the dimension, only where that dimension is above 1 (issue 77 item 5). The lines
are among the resolved settings' notes, which pretrain_gpt.py prints at the start (training/prepare.py)."""

from __future__ import annotations

import pytest

from arguments.parser import parse_config
from training.run_settings import resolve_run_settings

MOE = ["--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "2", "--seq-length", "16",
       "--max-position-embeddings", "16", "--micro-batch-size", "2", "--global-batch-size", "8", "--num-experts", "4",
       "--moe-router-topk", "2"]
GLOBAL_AUX_LOSS = ["--moe-router-load-balancing-type", "global_aux_loss", "--moe-aux-loss-coeff", "1e-2"]
CAPACITY = ["--moe-expert-capacity-factor", "0.5"]


def layout_lines(flags: list[str], tensor_parallel_size: int = 1, data_parallel_size: int = 1) -> list[str]:
    settings = resolve_run_settings(parse_config(MOE + flags), 300, tensor_parallel_size, data_parallel_size, "cpu")
    return [note for note in settings.notes if "as in Megatron-Core" in note]


@pytest.mark.parametrize("data_parallel_size", [2, 4])
def test_global_aux_loss_names_the_data_parallel_size_above_1(data_parallel_size):
    assert layout_lines(GLOBAL_AUX_LOSS, data_parallel_size=data_parallel_size) == [
        f"> --moe-router-load-balancing-type global_aux_loss depends on the data-parallel size ({data_parallel_size}) "
        "as in Megatron-Core: each micro-batch's balancing loss counts the tokens per expert of every data-parallel "
        "rank, averaged over the iteration's micro-batches so far (TopKRouter._apply_global_aux_loss), so the same "
        "global batch trains otherwise at another data-parallel size"]


def test_global_aux_loss_says_nothing_at_one_data_parallel_rank_or_beside_dimensions_it_does_not_depend_on():
    assert layout_lines(GLOBAL_AUX_LOSS) == []
    assert layout_lines(GLOBAL_AUX_LOSS + ["--tensor-model-parallel-size", "2", "--sequence-parallel",
                                           "--context-parallel-size", "2"], tensor_parallel_size=2) == []
    assert layout_lines(["--moe-router-load-balancing-type", "aux_loss", "--moe-aux-loss-coeff", "1e-2"],
                        data_parallel_size=2) == []


@pytest.mark.parametrize("flags, tensor_parallel_size, sizes", [
    (["--tensor-model-parallel-size", "2", "--sequence-parallel"], 2, "tensor-parallel size (2, --sequence-parallel)"),
    (["--context-parallel-size", "2"], 1, "context-parallel size (2)"),
    (["--tensor-model-parallel-size", "2", "--sequence-parallel", "--context-parallel-size", "2"], 2,
     "tensor-parallel size (2, --sequence-parallel) and the context-parallel size (2)")])
def test_the_capacity_factor_names_the_sequence_slicing_sizes_above_1(flags, tensor_parallel_size, sizes):
    assert layout_lines(CAPACITY + flags, tensor_parallel_size=tensor_parallel_size) == [
        f"> --moe-expert-capacity-factor 0.5 depends on the {sizes} as in Megatron-Core: each rank's capacity, "
        "ceil(tokens x k / experts x factor), counts the tokens it routes, its share of the sequence "
        "(moe_utils.apply_router_token_dropping), so other tokens are dropped at another size"]


def test_the_capacity_factor_says_nothing_where_each_rank_routes_whole_sequences():
    """Data and expert parallelism leave each rank its whole micro-batches: every rank drops among its own tokens
    before any is sent, as at one rank."""
    assert layout_lines(CAPACITY) == []
    assert layout_lines(CAPACITY + ["--expert-model-parallel-size", "2"], data_parallel_size=2) == []
    assert layout_lines(["--moe-expert-capacity-factor", "-1", "--context-parallel-size", "2"]) == []  # dropless
