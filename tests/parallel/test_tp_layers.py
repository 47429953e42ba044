"""Tensor-parallel layers and vocab-parallel cross entropy against the unsplit (TP=1) computation.

Each rank builds the TP=k layer and the TP=1 layer, materialized from the same seed, feeds both
the same input, and checks the TP=k outputs and gradients against the matching slices of TP=1's.
"""

import pytest
import torch
import torch.nn.functional as F

from parallel.cross_entropy import vocab_parallel_cross_entropy
from parallel.init import materialize
from parallel.layers import ColumnParallelLinear, RowParallelLinear, VocabParallelEmbedding
from parallel.mappings import copy_to_tensor_parallel_region
from parallel.state import ParallelState, destroy, initialize
from tests.distributed import run_distributed

SINGLE = ParallelState(device=torch.device("cpu"))
TOLERANCE = dict(atol=1e-5, rtol=1e-5)


def _close(actual, expected, what):
    torch.testing.assert_close(actual, expected, **TOLERANCE, msg=lambda m: f"{what}: {m}")


def _shard(tensor: torch.Tensor, dim: int, state: ParallelState) -> torch.Tensor:
    size = tensor.shape[dim] // state.tensor_parallel_size
    return tensor.narrow(dim, state.tensor_parallel_rank * size, size)


def _built(layer, seed: int, state: ParallelState = SINGLE):
    """`layer` (built on the meta device) with this TP rank's slice materialized from `seed`."""
    return materialize(layer, seed)  # each parameter's sharding record names its slice


def _leaf(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.detach().clone().requires_grad_(True)


def _pair(layer_class, *sizes, state, seed, **kwargs):
    """The same layer at TP=1 and TP=k, with a non-zero bias so that its handling is tested too."""
    reference = _built(layer_class(*sizes, state=SINGLE, init_std=0.2, **kwargs), seed, SINGLE)
    parallel = _built(layer_class(*sizes, state=state, init_std=0.2, **kwargs), seed, state)
    with torch.no_grad():
        reference.bias.normal_()
        parallel.bias.copy_(reference.bias if parallel.bias.shape == reference.bias.shape
                            else _shard(reference.bias, 0, state))
    return reference, parallel


def check_column_parallel_linear(state):
    for gather_output in (False, True):
        reference, parallel = _pair(ColumnParallelLinear, 8, 12, state=state, seed=1, gather_output=gather_output)
        hidden = torch.randn(3, 5, 8)
        x_ref, x_par = _leaf(hidden), _leaf(hidden)
        y_ref, y_par = reference(x_ref), parallel(x_par)
        grad = torch.randn_like(y_ref)
        y_ref.backward(grad)
        if gather_output:
            _close(y_par, y_ref, "gathered column output")
            y_par.backward(grad)
        else:
            _close(y_par, _shard(y_ref, -1, state), "column output shard")
            y_par.backward(_shard(grad, -1, state))
        _close(x_par.grad, x_ref.grad, f"column input grad (gather_output={gather_output})")
        _close(parallel.weight.grad, _shard(reference.weight.grad, 0, state), "column weight grad")
        _close(parallel.bias.grad, _shard(reference.bias.grad, 0, state), "column bias grad")


def check_row_parallel_linear(state):
    for input_is_parallel in (True, False):
        reference, parallel = _pair(RowParallelLinear, 12, 8, state=state, seed=2,
                                    input_is_parallel=input_is_parallel)
        hidden = torch.randn(3, 5, 12)
        x_ref = _leaf(hidden)
        x_par = _leaf(_shard(hidden, -1, state) if input_is_parallel else hidden)
        y_ref, y_par = reference(x_ref), parallel(x_par)
        _close(y_par, y_ref, "row output")
        grad = torch.randn_like(y_ref)
        y_ref.backward(grad)
        y_par.backward(grad)
        expected_x_grad = _shard(x_ref.grad, -1, state) if input_is_parallel else x_ref.grad
        _close(x_par.grad, expected_x_grad, f"row input grad (input_is_parallel={input_is_parallel})")
        _close(parallel.weight.grad, _shard(reference.weight.grad, 1, state), "row weight grad")
        _close(parallel.bias.grad, reference.bias.grad, "row bias grad")


def check_row_parallel_reduce_is_counted(state):
    _, parallel = _pair(RowParallelLinear, 12, 8, state=state, seed=2)
    state.comm.stats.snapshot_and_reset()
    parallel(torch.randn(3, 5, 12 // state.tensor_parallel_size))
    full_output_bytes = 3 * 5 * 8 * 4
    n = state.tensor_parallel_size
    assert state.comm.stats.snapshot_and_reset()["tp"]["all_reduce"] == 2 * full_output_bytes * (n - 1) // n


def check_vocab_parallel_embedding(state):
    vocab, padded, dim = 1000, 1024, 6
    reference = _built(VocabParallelEmbedding(vocab, padded, dim, state=SINGLE, init_std=0.2), 3, SINGLE)
    parallel = _built(VocabParallelEmbedding(vocab, padded, dim, state=state, init_std=0.2), 3, state)
    # Ids from every shard, including the last real row and rows owned by the last rank.
    tokens = torch.cat([torch.randint(0, vocab, (2, 7)), torch.tensor([[0, 999, 767, 768, 511, 512, 256]])])
    out_ref, out_par = reference(tokens), parallel(tokens)
    _close(out_par, out_ref, "embedding output")
    grad = torch.randn_like(out_ref)
    out_ref.backward(grad)
    out_par.backward(grad)
    _close(parallel.weight.grad, _shard(reference.weight.grad, 0, state), "embedding weight grad")
    assert torch.count_nonzero(reference.weight.grad[vocab:]) == 0


def check_vocab_parallel_cross_entropy(state):
    vocab, padded = 1000, 1024
    logits = torch.randn(3, 5, padded) * 3
    logits[..., vocab:] = 50.0  # padding columns with large logits: must not enter the softmax
    target = torch.randint(0, vocab, (3, 5))
    target[0, :4] = torch.tensor([0, 999, 1000 // state.tensor_parallel_size, 511])
    logits_ref, logits_par = _leaf(logits), _leaf(_shard(logits, -1, state))
    loss_ref = F.cross_entropy(logits_ref[..., :vocab].flatten(0, 1), target.flatten(), reduction="none")
    start = state.tensor_parallel_rank * (padded // state.tensor_parallel_size)
    loss_par = vocab_parallel_cross_entropy(logits_par, target, start, vocab, state)
    assert loss_par.shape == target.shape and loss_par.dtype == torch.float32
    _close(loss_par.flatten(), loss_ref, "vocab-parallel loss")
    weights = torch.rand(3, 5)
    (loss_ref * weights.flatten()).sum().backward()
    (loss_par * weights).sum().backward()
    _close(logits_par.grad, _shard(logits_ref.grad, -1, state), "vocab-parallel logits grad")


def check_tied_output_loss_is_independent_of_tp_and_padding(state):
    """A tied output layer end to end: TP=1 with the vocabulary padded to 1024 against TP=k padded
    to 2048. The padding rows of the embedding are zeros, so their logits (0) would shift the
    softmax if they were not excluded."""
    vocab, dim = 1000, 16
    reference = _built(VocabParallelEmbedding(vocab, 1024, dim, state=SINGLE, init_std=0.2), 4, SINGLE)
    parallel = _built(VocabParallelEmbedding(vocab, 2048, dim, state=state, init_std=0.2), 4, state)
    hidden = torch.randn(2, 6, dim)
    target = torch.randint(0, vocab, (2, 6))
    h_ref, h_par = _leaf(hidden), _leaf(hidden)
    loss_ref = vocab_parallel_cross_entropy(F.linear(h_ref, reference.weight), target, 0, vocab, SINGLE)
    logits_par = F.linear(copy_to_tensor_parallel_region(h_par, state), parallel.weight)
    loss_par = vocab_parallel_cross_entropy(logits_par, target, parallel.vocab_start_index, vocab, state)
    unpadded = F.cross_entropy(F.linear(hidden, reference.weight[:vocab]).flatten(0, 1), target.flatten(),
                               reduction="none")
    _close(loss_ref.flatten(), unpadded, "TP=1 padded loss against the unpadded vocabulary")
    _close(loss_par, loss_ref, "TP=k loss (padded to 2048) against TP=1 (padded to 1024)")
    loss_ref.mean().backward()
    loss_par.mean().backward()
    _close(h_par.grad, h_ref.grad, "hidden-state grad through the tied output layer")
    _close(parallel.weight.grad, _shard(torch.cat([reference.weight.grad, torch.zeros(1024, dim)]), 0, state),
           "tied embedding grad")


def _layers_worker(rank, world_size, tensor_parallel_size):
    state = initialize("cpu", tensor_parallel_size=tensor_parallel_size)
    # Same data within a TP group, different across DP groups: a collective on the wrong group shows.
    torch.manual_seed(1000 + state.data_parallel_rank)
    try:
        check_column_parallel_linear(state)
        check_row_parallel_linear(state)
        check_row_parallel_reduce_is_counted(state)
        check_vocab_parallel_embedding(state)
        check_vocab_parallel_cross_entropy(state)
        check_tied_output_loss_is_independent_of_tp_and_padding(state)
    finally:
        destroy(state)


@pytest.mark.slow
@pytest.mark.parametrize("world_size, tensor_parallel_size", [(2, 2), (4, 4), (4, 2)])
def test_tensor_parallel_layers_match_the_unsplit_computation(world_size, tensor_parallel_size):
    run_distributed(_layers_worker, world_size, tensor_parallel_size, timeout=120)


def test_layers_at_tp1_are_plain_linear_and_embedding():
    """At TP=1 the mappings are identities: the layers are exactly F.linear / F.embedding."""
    torch.manual_seed(0)
    column = _built(ColumnParallelLinear(8, 12, state=SINGLE, init_std=0.2), 1, SINGLE)
    row = _built(RowParallelLinear(12, 8, state=SINGLE, init_std=0.2), 1, SINGLE)
    embedding = _built(VocabParallelEmbedding(10, 16, 8, state=SINGLE, init_std=0.2), 1, SINGLE)
    hidden = torch.randn(2, 3, 8)
    assert torch.equal(column(hidden), F.linear(hidden, column.weight, column.bias))
    assert torch.equal(row(column(hidden)), F.linear(column(hidden), row.weight, row.bias))
    tokens = torch.randint(0, 10, (2, 3))
    assert torch.equal(embedding(tokens), F.embedding(tokens, embedding.weight))
    with pytest.raises(IndexError):
        embedding(torch.tensor([[16]]))  # out of range fails loudly instead of reading a zero row


def test_cross_entropy_at_tp1_matches_torch_and_ignores_padding():
    torch.manual_seed(0)
    logits = torch.randn(2, 4, 40, dtype=torch.float64)
    logits[..., 37:] = 100.0
    target = torch.randint(0, 37, (2, 4))
    ours, theirs = _leaf(logits), _leaf(logits)
    losses = vocab_parallel_cross_entropy(ours, target, 0, 37, SINGLE)
    expected = F.cross_entropy(theirs[..., :37].flatten(0, 1), target.flatten(), reduction="none")
    torch.testing.assert_close(losses.flatten(), expected)
    weights = torch.rand(2, 4, dtype=torch.float64)
    (losses * weights).sum().backward()
    (expected * weights.flatten()).sum().backward()
    torch.testing.assert_close(ours.grad, theirs.grad)
    assert torch.count_nonzero(ours.grad[..., 37:]) == 0


def test_cross_entropy_of_bf16_logits_is_computed_in_fp32():
    torch.manual_seed(0)
    logits = (torch.randn(2, 4, 64) * 4).to(torch.bfloat16)
    target = torch.randint(0, 60, (2, 4))
    logits_leaf = _leaf(logits)
    losses = vocab_parallel_cross_entropy(logits_leaf, target, 0, 60, SINGLE)
    assert losses.dtype == torch.float32
    expected = F.cross_entropy(logits.float()[..., :60].flatten(0, 1), target.flatten(), reduction="none")
    torch.testing.assert_close(losses.flatten(), expected, atol=1e-6, rtol=1e-6)
    losses.sum().backward()
    assert logits_leaf.grad.dtype == torch.bfloat16
