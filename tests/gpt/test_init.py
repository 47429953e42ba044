"""parallel/init.py: initial values as a pure function of (seed, name, element index), computed for any
slice at a cost proportional to the slice."""

import math

import pytest
import torch
from torch import nn

from parallel.init import (
    CHUNK_ELEMENTS,
    InitMethod,
    ParameterInitializer,
    materialize,
    set_init_method,
    standard_normals,
    stream_key,
)
from parallel.sharding import set_record, split_record

CPU = torch.device("cpu")


def meta_param(shape, method=InitMethod.normal(0.02), tensor_parallel_dim=None, tp=1, rank=0) -> nn.Parameter:
    """With `tensor_parallel_dim`: TP rank `rank`'s slice of `tp` along it (its sharding record says so)."""
    param = set_init_method(nn.Parameter(torch.empty(shape, device="meta")), method)
    if tensor_parallel_dim is not None:
        set_record(param, split_record(shape, tensor_parallel_dim, tp, rank, "tp"))
    return param


def whole(name, shape, seed=3, method=InitMethod.normal(0.02)) -> torch.Tensor:
    param = meta_param(shape, method)
    return ParameterInitializer(seed).values(name, param, 0, math.prod(shape), CPU).view(shape)


def splitmix64_reference(key: int, index: int) -> int:
    """SplitMix64's output number `index` of the stream starting at `key`, in Python integers."""
    mask = (1 << 64) - 1
    z = (key + (index + 1) * 0x9E3779B97F4A7C15) & mask
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & mask
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & mask
    return z ^ (z >> 31)


def test_normals_follow_splitmix64_and_box_muller_exactly():
    key = stream_key(11, "blocks.0.mlp.dense_h_to_4h.weight")
    indices = [0, 1, 2, 1000, 123456789, 2**40 + 7]
    values = standard_normals(key, torch.tensor(indices, dtype=torch.int64))
    for index, value in zip(indices, values.tolist()):
        bits = splitmix64_reference(key & ((1 << 64) - 1), index)
        u1 = ((bits >> 40) + 1) * 2.0 ** -24
        u2 = ((bits >> 8) & 0xFFFFFF) * 2.0 * math.pi * 2.0 ** -24
        expected = math.sqrt(-2.0 * math.log(u1)) * math.cos(u2)
        assert value == pytest.approx(expected, rel=1e-6, abs=1e-6)


def test_values_are_standard_normal_scaled_by_std():
    values = whole("w", (1000, 1000), method=InitMethod.normal(0.02))
    assert abs(values.mean().item()) < 2e-4
    assert values.std().item() == pytest.approx(0.02, rel=5e-3)
    # Tails of a normal: P(|x| > 3 sigma) = 0.0027.
    assert (values.abs() > 0.06).float().mean().item() == pytest.approx(0.0027, rel=0.1)


def test_streams_differ_by_name_and_seed_and_repeat_exactly():
    a = whole("a", (64, 64))
    assert torch.equal(a, whole("a", (64, 64)))
    assert not torch.equal(a, whole("b", (64, 64)))
    assert not torch.equal(a, whole("a", (64, 64), seed=4))
    # Neighbouring names and seeds give uncorrelated values.
    assert abs(torch.corrcoef(torch.stack([a.flatten(), whole("a", (64, 64), seed=4).flatten()]))[0, 1]) < 0.05


@pytest.mark.parametrize("start, count", [(0, 1), (5, 13), (998, 2), (0, 1000)])
def test_any_range_equals_the_same_elements_of_the_whole(start, count):
    param = meta_param((40, 25))
    initializer = ParameterInitializer(7)
    full = initializer.values("w", param, 0, 1000, CPU)
    assert torch.equal(initializer.values("w", param, start, count, CPU), full[start:start + count])


def test_a_range_outside_the_parameter_is_refused():
    with pytest.raises(ValueError, match=r"elements \[999, 1001\) are outside 'w' \(1000 elements\)"):
        ParameterInitializer(7).values("w", meta_param((40, 25)), 999, 2, CPU)


def test_ranges_longer_than_a_chunk_equal_the_whole(monkeypatch):
    param = meta_param((10, 100))
    full = ParameterInitializer(7).values("w", param, 0, 1000, CPU)
    monkeypatch.setattr("parallel.init.CHUNK_ELEMENTS", 64)
    assert torch.equal(ParameterInitializer(7).values("w", param, 0, 1000, CPU), full)
    assert CHUNK_ELEMENTS >= 1 << 16  # the real chunk is large enough to amortise the Python loop


@pytest.mark.parametrize("dim", [0, 1])
@pytest.mark.parametrize("tp", [2, 4])
def test_tensor_parallel_slices_are_slices_of_the_whole(dim, tp):
    shape = (8, 12)
    reference = whole("w", shape)
    for rank in range(tp):
        local_shape = list(shape)
        local_shape[dim] //= tp
        param = meta_param(tuple(local_shape), tensor_parallel_dim=dim, tp=tp, rank=rank)
        local = ParameterInitializer(3).values("w", param, 0, param.numel(), CPU).view(local_shape)
        assert torch.equal(local, reference.narrow(dim, rank * local_shape[dim], local_shape[dim]))
        # And a DP shard of the TP slice (a stage-3 fragment) is that slice's elements.
        piece = ParameterInitializer(3).values("w", param, 3, 7, CPU)
        assert torch.equal(piece, local.reshape(-1)[3:10])


def test_rows_beyond_the_vocabulary_are_zero_and_the_others_do_not_depend_on_padding():
    method = InitMethod.normal(0.02, rows=10)
    small, padded = whole("emb", (16, 4), method=method), whole("emb", (32, 4), method=method)
    assert not small[:10].eq(0).any() and not small[10:].any()
    assert torch.equal(small[:10], padded[:10]) and not padded[10:].any()


def test_constants():
    assert torch.equal(whole("b", (5,), method=InitMethod.zeros()), torch.zeros(5))
    assert torch.equal(whole("g", (5,), method=InitMethod.ones()), torch.ones(5))
    with pytest.raises(ValueError, match="std > 0"):
        InitMethod.normal(0.0)


def test_materialize_fills_meta_parameters_keeps_ties_and_attributes():
    class Tied(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Module()
            self.embed.weight = meta_param((6, 4), tensor_parallel_dim=0, tp=2, rank=0)
            self.head = nn.Module()
            self.head.weight = self.embed.weight

    model = materialize(Tied(), seed=3, device="cpu", dtype=torch.bfloat16)
    assert model.embed.weight is model.head.weight
    assert model.embed.weight.dtype == torch.bfloat16 and model.embed.weight.sharding.split_dim == 0
    assert torch.equal(model.embed.weight, whole("embed.weight", (12, 4))[:6].to(torch.bfloat16))


def test_a_parameter_without_an_init_method_is_refused():
    param = nn.Parameter(torch.empty(3, device="meta"))
    with pytest.raises(ValueError, match="no init_method"):
        ParameterInitializer(1).values("stray", param, 0, 3, CPU)
