"""Single-process unit tests of zero/: the flat layout's arithmetic, the loss scaler's state machine, and
ZeRO stages 0-3 (zero.apply.build_zero) against plain `torch.optim.AdamW` on an identical copy of the model.

With one process the data-parallel group is None, so every collective is skipped (reduce-scatter and
all-gather of a one-rank group still copy), which isolates the bookkeeping: flattening, bucketing,
partition coordinates, accumulation, clipping, loss scaling and stage 3's gather/free lifecycle.
"""

import copy
import math

import pytest
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint, set_checkpoint_early_stop

from arguments.config import ModelConfig, OptimizerConfig
from gpt.model import GPTModel
from parallel.init import materialize
from parallel.random import TensorParallelRNG
from parallel.sharding import set_record, split_record
from parallel.state import ParallelState
from tests.zero_harness import ZeroHarness
from zero.config import ZeroConfig
from zero.flat_buffer import FlatLayout, ParamKind, bucket_params, unique_trainable_parameters
from zero.loss_scaler import DynamicLossScaler, LossScaler, build_loss_scaler
from zero.memory import measure_tensor_bytes, predict_model_state_bytes, within_tolerance
from zero.stage3 import ParameterGatherer

CPU = torch.device("cpu")
VOCAB, SEQ, LAYERS = 256, 16, 2
OPTIMIZER = OptimizerConfig(lr=1e-3, weight_decay=0.1, clip_grad=1.0, adam_beta1=0.9, adam_beta2=0.95,
                            adam_eps=1e-8)
LRS = [1e-3, 2e-3, 3e-3, 2e-3, 1e-3]  # a varying lr checks that param_groups' lr is what AdamW uses
# Small buckets so stages 0-2 use several units; the word embedding (256 x 32) exceeds one.
BUCKET = 3000


# ---- helpers -------------------------------------------------------------------------------------

@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """These models are tiny: intra-op threads only contend (the CI machine has 2 cores), so run on
    one and give the setting back afterwards."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def model_config() -> ModelConfig:
    return ModelConfig.of(num_layers=LAYERS, hidden_size=32, num_attention_heads=4, seq_length=SEQ,
                       max_position_embeddings=SEQ, vocab_size=VOCAB, hidden_dropout=0.0,
                       attention_dropout=0.0)


class CheckpointedGPT(GPTModel):
    """GPTModel whose blocks run under non-reentrant activation checkpointing. With `early_stop` off
    the recompute runs each block's forward to the end, so its forward hooks fire during backward."""

    early_stop = True

    def hidden_states(self, tokens, documents=None, fp8_parts=(0,)):  # no document masks or FP8 in these tests
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        hidden = self.word_embeddings(tokens) + self.position_embeddings(positions)
        with set_checkpoint_early_stop(self.early_stop):
            for block in self.blocks:
                hidden = checkpoint(block, hidden, use_reentrant=False)
        return self.final_layernorm(hidden)


def make_model(seed: int = 1, cls=GPTModel) -> GPTModel:
    state = ParallelState(device=CPU)
    return materialize(cls(model_config(), state, rng=TensorParallelRNG(seed, state)), seed)


def token_batches(count: int, batch: int = 4, seed: int = 0) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(0, VOCAB, (batch, SEQ + 1), generator=generator) for _ in range(count)]


def lm_loss(model: nn.Module, tokens: torch.Tensor) -> torch.Tensor:
    return model(tokens[:, :-1], tokens[:, 1:]).float().mean()


def zero_config(stage: int, **overrides) -> ZeroConfig:
    values = dict(stage=stage, reduce_bucket_size=BUCKET, allgather_bucket_size=BUCKET)
    values.update(overrides)
    return ZeroConfig(**values)


def wrap(model: GPTModel, stage: int, dtype=torch.float32, loss_scaler=None, **overrides) -> ZeroHarness:
    return ZeroHarness(model, OPTIMIZER, zero_config(stage, **overrides), model.state, dtype=dtype,
                         loss_scaler=loss_scaler)


def train_reference(model: nn.Module, batches, lrs, kernel: str = "fused") -> tuple[list[float], list[float]]:
    """Plain AdamW, weight decay only for matrices, global-norm clipping: (losses, pre-clip norms).
    `kernel` is torch's AdamW implementation: "fused" (what our sharded AdamW runs) or "foreach"."""
    params = list(model.parameters())
    groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": OPTIMIZER.weight_decay},
              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
    optimizer = torch.optim.AdamW(groups, lr=OPTIMIZER.lr, betas=(OPTIMIZER.adam_beta1, OPTIMIZER.adam_beta2),
                                  eps=OPTIMIZER.adam_eps, **{kernel: True})
    losses, norms = [], []
    for tokens, lr in zip(batches, lrs):
        for group in optimizer.param_groups:
            group["lr"] = lr
        optimizer.zero_grad()
        loss = lm_loss(model, tokens)
        loss.backward()
        norms.append(torch.nn.utils.clip_grad_norm_(params, OPTIMIZER.clip_grad).item())
        optimizer.step()
        losses.append(loss.item())
    return losses, norms


def train_zero(model: nn.Module, optimizer: ZeroHarness, batches, lrs) -> tuple[list[float], list[float]]:
    losses, norms = [], []
    for tokens, lr in zip(batches, lrs):
        for group in optimizer.param_groups:
            group["lr"] = lr
        optimizer.zero_grad()
        loss = lm_loss(model, tokens)
        optimizer.backward(loss, last_micro_batch=True)
        result = optimizer.step()
        assert not result.skipped and result.loss_scale == 1.0
        norms.append(result.grad_norm)
        losses.append(loss.item())
    return losses, norms


def assert_close_lists(actual, expected, rel):
    assert len(actual) == len(expected)
    for a, e in zip(actual, expected):
        assert math.isclose(a, e, rel_tol=rel), (actual, expected)


# ---- 1. FlatLayout -------------------------------------------------------------------------------

PARTS = 4


def layout_params() -> list[list[nn.Parameter]]:
    """Three units (one empty, skipped), kinds interleaved, every element's value unique and > 0."""
    shapes_and_tp = [
        [((5, 3), True), ((7,), False), ((4, 4), False), ((9,), True), ((300,), False), ((2, 3), True),
         ((1,), False)],
        [],
        [((1000, 3), True)],
        [((3,), False)],
    ]
    counter = 1
    units = []
    for unit in shapes_and_tp:
        params = []
        for shape, tp in unit:
            numel = math.prod(shape)
            param = nn.Parameter(torch.arange(counter, counter + numel, dtype=torch.float64).reshape(shape))
            counter += numel
            if tp:  # TP rank 0's slice of 2
                set_record(param, split_record(shape, 0, 2, 0, "tp"))
            params.append(param)
        units.append(params)
    return units


def unit_contents(unit, fill_padding: float) -> torch.Tensor:
    full = torch.full((unit.numel,), fill_padding, dtype=torch.float64)
    for slot in unit.slots:
        full[slot.start:slot.end] = slot.param.detach().reshape(-1)
    return full


@pytest.mark.parametrize("alignment", [8, 64])
def test_units_are_padded_to_parts_times_alignment_and_split_into_equal_tiling_shards(alignment):
    units = layout_params()
    layout = FlatLayout(units, parts=PARTS, part=1, alignment=alignment)
    assert len(layout.units) == 3  # the empty unit is skipped
    quantum = PARTS * alignment
    buffer_offset = partition_offset = 0
    for index, (unit, params) in enumerate(zip(layout.units, [u for u in units if u])):
        assert unit.index == index
        assert unit.used == sum(p.numel() for p in params)
        assert unit.numel % quantum == 0 and unit.numel >= unit.used
        assert unit.padding == unit.numel - unit.used and 0 <= unit.padding < quantum  # minimal padding
        assert unit.shard_numel * PARTS == unit.numel
        bounds = [unit.shard_bounds(part) for part in range(PARTS)]
        assert bounds[0][0] == 0 and bounds[-1][1] == unit.numel
        assert all(hi - lo == unit.shard_numel for lo, hi in bounds)
        assert all(bounds[i][1] == bounds[i + 1][0] for i in range(PARTS - 1))
        assert all(lo % alignment == 0 for lo, _ in bounds)
        assert unit.buffer_offset == buffer_offset and unit.partition_offset == partition_offset
        buffer_offset += unit.numel
        partition_offset += unit.shard_numel
    assert layout.numel == buffer_offset and layout.partition_numel == partition_offset
    assert layout.num_parameters == sum(p.numel() for u in units for p in u)
    assert layout.padding == layout.numel - layout.num_parameters == sum(u.padding for u in layout.units)


def test_a_tiny_unit_still_gets_one_full_quantum():
    layout = FlatLayout([[nn.Parameter(torch.ones(1))]], parts=3, part=2, alignment=5)
    (unit,) = layout.units
    assert (unit.numel, unit.shard_numel, unit.padding) == (15, 5, 14)
    assert layout.partition_numel == 5 and layout.num_parameters == 1 and layout.padding == 14


def test_part_must_be_in_range():
    with pytest.raises(ValueError):
        FlatLayout([[nn.Parameter(torch.ones(3))]], parts=2, part=2)


def test_params_inside_a_unit_are_ordered_by_kind_stably():
    units = layout_params()
    layout = FlatLayout(units, parts=PARTS, part=0, alignment=8)
    first = layout.units[0]
    kinds = [ParamKind.of(slot.param) for slot in first.slots]
    assert kinds == sorted(kinds)
    assert len(set(kinds)) == 4  # all four kinds present in this unit
    # No decay first (biases/LayerNorm), decay last; TP-replicated before TP-sharded within each.
    assert kinds[0] == ParamKind(weight_decay=False, tensor_parallel=False)
    assert kinds[-1] == ParamKind(weight_decay=True, tensor_parallel=True)
    for kind in set(kinds):  # stable: the given order within a kind
        given = [id(p) for p in units[0] if ParamKind.of(p) == kind]
        placed = [id(slot.param) for slot in first.slots if ParamKind.of(slot.param) == kind]
        assert placed == given
    # Slots are back to back from 0, with their own numel and shape.
    cursor = 0
    for slot in first.slots:
        assert slot.start == cursor and slot.numel == slot.param.numel() and slot.shape == slot.param.shape
        cursor = slot.end
    assert cursor == first.used
    assert all(layout.unit_of[id(slot.param)] is first and layout.slot_of[id(slot.param)] is slot
               for slot in first.slots)


@pytest.mark.parametrize("alignment", [8, 64])
def test_each_part_owns_a_disjoint_piece_and_together_they_rebuild_every_parameter(alignment):
    units = layout_params()
    params = [p for unit in units for p in unit]
    layouts = [FlatLayout(units, parts=PARTS, part=part, alignment=alignment) for part in range(PARTS)]
    padding_value = -1.0
    assert len({ParamKind.of(p) for p in params}) == 4  # every kind takes part

    partitions = []
    for part, layout in enumerate(layouts):
        # What the optimizer does: rank `part` keeps shard `part` of every unit, end to end.
        pieces = []
        for unit in layout.units:
            lo, hi = unit.shard_bounds(part)
            assert unit.partition_offset == sum(piece.numel() for piece in pieces)
            pieces.append(unit_contents(unit, padding_value)[lo:hi])
        partition = torch.cat(pieces)
        assert partition.numel() == layout.partition_numel
        partitions.append(partition)

        # Segments tile [0, partition_numel) with no gap or overlap, and each holds one kind.
        segments = layout.segments()
        assert segments[0].start == 0 and segments[-1].end == layout.partition_numel
        assert all(a.end == b.start for a, b in zip(segments, segments[1:]))
        assert all(s.start < s.end for s in segments)
        kind_of_value = {}
        for unit in layout.units:
            for slot in unit.slots:
                for value in slot.param.detach().reshape(-1).tolist():
                    kind_of_value[value] = ParamKind.of(slot.param)
            assert len(unit.segments(part)) <= len({ParamKind.of(s.param) for s in unit.slots})
        for segment in segments:
            values = partition[segment.start:segment.end].tolist()
            assert all(v == padding_value or kind_of_value[v] == segment.kind for v in values), segment

    # Every parameter element is owned by exactly one part: the partitions' non-padding values are
    # exactly the parameters' values, each once.
    owned = torch.cat(partitions)
    owned = owned[owned != padding_value]
    expected = torch.cat([p.detach().reshape(-1) for p in params])
    assert torch.equal(owned.sort().values, expected.sort().values)

    # And the all-gather of every unit's shards puts each parameter back at its slot.
    layout = layouts[0]
    for unit in layout.units:
        full = torch.cat([partitions[part][unit.partition_offset:unit.partition_offset + unit.shard_numel]
                          for part in range(PARTS)])
        for slot in unit.slots:
            assert torch.equal(full[slot.start:slot.end].view(slot.shape), slot.param.detach())
        assert torch.all(full[unit.used:] == padding_value)


def test_bucket_params_reverses_respects_the_size_and_isolates_big_params():
    sizes = [10, 20, 500, 5, 5, 30, 60, 1]
    params = [nn.Parameter(torch.zeros(n)) for n in sizes]
    buckets = bucket_params(params, bucket_size=50)
    by_size = [[p.numel() for p in bucket] for bucket in buckets]
    assert by_size == [[1], [60], [30, 5, 5], [500], [20, 10]]
    flat = [p for bucket in buckets for p in bucket]
    assert [id(p) for p in flat] == [id(p) for p in reversed(params)]
    assert all(sum(p.numel() for p in b) <= 50 or len(b) == 1 for b in buckets)
    # A bucket never exceeds the size when nothing is oversized, and fills greedily.
    buckets = bucket_params([nn.Parameter(torch.zeros(4)) for _ in range(7)], bucket_size=8)
    assert [len(b) for b in buckets] == [2, 2, 2, 1]
    assert bucket_params([], 8) == []


def test_unique_trainable_parameters_dedupes_tied_and_skips_frozen():
    class Tied(nn.Module):
        def __init__(self):
            super().__init__()
            self.embedding = nn.Embedding(10, 4)
            self.frozen = nn.Linear(4, 4)
            self.frozen.weight.requires_grad_(False)
            self.head = nn.Linear(4, 10, bias=False)
            self.head.weight = self.embedding.weight  # tied
            self.extra = nn.Parameter(torch.zeros(3))

    model = Tied()
    params = unique_trainable_parameters(model)
    # Registration order: the module's own parameters, then its children's.
    expected = [model.extra, model.embedding.weight, model.frozen.bias]
    assert [id(p) for p in params] == [id(p) for p in expected]


# ---- 2. Loss scaling -----------------------------------------------------------------------------

def test_hysteresis_delays_the_backoff():
    scaler = DynamicLossScaler(scale=1024.0, growth_interval=100, hysteresis=2)
    scaler.update(overflow=True)
    assert scaler.scale == 1024.0  # the first overflow only spends hysteresis
    scaler.update(overflow=True)
    assert scaler.scale == 512.0
    scaler.update(overflow=True)  # hysteresis stays spent until the scale grows again
    assert scaler.scale == 256.0
    assert scaler.skips_on_overflow


def test_clean_steps_short_of_growth_do_not_restore_hysteresis():
    scaler = DynamicLossScaler(scale=1024.0, growth_interval=100, hysteresis=2)
    scaler.update(True)
    for _ in range(5):
        scaler.update(False)
    scaler.update(True)
    assert scaler.scale == 512.0


def test_scale_never_drops_below_min_scale():
    scaler = DynamicLossScaler(scale=4.0, hysteresis=1, min_scale=2.0)
    scaler.update(True)
    assert scaler.scale == 2.0
    scaler.update(True)
    assert scaler.scale == 2.0
    scaler = DynamicLossScaler(scale=3.0, hysteresis=1, min_scale=2.0)
    scaler.update(True)
    assert scaler.scale == 2.0  # 1.5 is clamped


def test_growth_after_interval_clean_steps_and_overflow_restarts_the_count():
    scaler = DynamicLossScaler(scale=8.0, growth_interval=3, hysteresis=1)
    scaler.update(False)
    scaler.update(False)
    assert scaler.scale == 8.0
    scaler.update(False)
    assert scaler.scale == 16.0
    scaler.update(False)
    scaler.update(False)
    scaler.update(True)  # 2 clean steps, then an overflow: count restarts
    assert scaler.scale == 8.0
    scaler.update(False)
    scaler.update(False)
    assert scaler.scale == 8.0
    scaler.update(False)
    assert scaler.scale == 16.0
    for _ in range(3):
        scaler.update(False)
    assert scaler.scale == 32.0


def test_growth_restores_hysteresis():
    scaler = DynamicLossScaler(scale=64.0, growth_interval=2, hysteresis=2)
    scaler.update(True)
    scaler.update(True)
    assert scaler.scale == 32.0  # hysteresis spent
    scaler.update(False)
    scaler.update(False)
    assert scaler.scale == 64.0  # growth...
    scaler.update(True)
    assert scaler.scale == 64.0  # ...gave hysteresis back
    scaler.update(True)
    assert scaler.scale == 32.0


def test_dynamic_scaler_state_dict_round_trip():
    scaler = DynamicLossScaler(scale=256.0, growth_interval=4, hysteresis=3, min_scale=1.0)
    for overflow in (True, False, False):
        scaler.update(overflow)
    state = scaler.state_dict()
    restored = DynamicLossScaler(scale=1.0, growth_interval=4, hysteresis=3, min_scale=1.0)
    restored.load_state_dict(state)
    assert restored.state_dict() == state and restored.scale == 256.0
    # Both now behave identically: two more clean steps grow; hysteresis (2 left) then needs 3 overflows
    # after the growth refill.
    for overflow in (False, False, True, True, True, False):
        scaler.update(overflow)
        restored.update(overflow)
        assert restored.scale == scaler.scale
    assert scaler.scale == 256.0  # 256 -> 512 (growth) -> 256 on the third overflow


def test_build_loss_scaler():
    for static_scale in (None, 128.0):  # bf16 / fp32: no scaling, whatever the fp16 settings say
        static = build_loss_scaler(False, static_scale, 2.0 ** 16, 1000, 2, 1.0)
        assert type(static) is LossScaler and static.scale == 1.0 and not static.skips_on_overflow
        static.update(True)
        static.update(True)
        assert static.scale == 1.0
    fixed = build_loss_scaler(True, 128.0, 2.0 ** 16, 1000, 2, 1.0)
    assert type(fixed) is LossScaler and fixed.scale == 128.0 and fixed.skips_on_overflow  # fp16 still skips
    fixed.update(True)
    assert fixed.scale == 128.0
    restored = LossScaler()
    restored.load_state_dict(fixed.state_dict())
    assert restored.scale == 128.0
    dynamic = build_loss_scaler(True, None, 2.0 ** 12, 7, 3, 0.5)
    assert isinstance(dynamic, DynamicLossScaler) and dynamic.skips_on_overflow
    assert (dynamic.scale, dynamic.growth_interval, dynamic.hysteresis, dynamic.min_scale) == (4096.0, 7, 3, 0.5)


# ---- 3. ZeRO against torch AdamW --------------------------------------------------------

@pytest.mark.parametrize("stage, options", [
    (0, {}), (1, {}), (2, {}), pytest.param(3, {}, marks=pytest.mark.smoke),
    # DeepSpeed's reduce_scatter=false path, synchronous reductions, one parameter per bucket.
    (1, {"reduce_scatter": False}), (2, {"reduce_scatter": False}), (2, {"overlap_comm": False}),
    (1, {"reduce_bucket_size": 1, "allgather_bucket_size": 1}),
    # Stage 3 with no prefetch, and with the root chunk persistent (never freed).
    (3, {"stage3_prefetch_bucket_size": 0}), (3, {"stage3_param_persistence_threshold": 9000}),
])
def test_stage_matches_plain_adamw_with_clipping(stage, options):
    model = make_model()
    reference = copy.deepcopy(model)
    batches = token_batches(len(LRS) + 1)
    optimizer = wrap(model, stage, **options)
    assert optimizer.num_parameters == sum(p.numel() for p in reference.parameters())

    expected_losses, expected_norms = train_reference(reference, batches, LRS)
    losses, norms = train_zero(model, optimizer, batches, LRS)
    assert max(expected_norms) > OPTIMIZER.clip_grad  # clipping is exercised
    assert_close_lists(losses, expected_losses, rel=1e-6)
    assert_close_lists(norms, expected_norms, rel=1e-5)
    with torch.no_grad():  # the last update too
        assert math.isclose(lm_loss(model, batches[-1]).item(), lm_loss(reference, batches[-1]).item(),
                            rel_tol=1e-6)
    # The fp32 master weights are the reference's parameters, laid out by the layout.
    for unit in optimizer.layout.units:
        master = optimizer.master[unit.partition_offset:unit.partition_offset + unit.shard_numel]
        ref_params = dict(zip(map(id, model.parameters()), reference.parameters()))
        for slot in unit.slots:
            torch.testing.assert_close(master[slot.start:slot.end].view(slot.shape), ref_params[id(slot.param)],
                                       rtol=1e-4, atol=1e-5)  # Adam amplifies ulps of ~0 gradients


@pytest.mark.parametrize("stage", [0, 1, 2])
def test_parameters_stay_views_of_the_flat_buffer_after_steps(stage):
    model = make_model()
    optimizer = wrap(model, stage)
    train_zero(model, optimizer, token_batches(2), LRS[:2])
    for unit in optimizer.layout.units:
        for slot in unit.slots:
            offset = unit.buffer_offset + slot.start
            assert slot.param.data_ptr() == optimizer.flat_params[offset:].data_ptr()
            if stage < 2:
                assert slot.param.grad.data_ptr() == optimizer.flat_grads[offset:].data_ptr()
            else:
                assert slot.param.grad is None  # stage 2 keeps no full gradient


# ---- 4. Gradient accumulation --------------------------------------------------------------------

@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_two_micro_batches_equal_one_double_batch(stage):
    batches = token_batches(3, batch=4, seed=3)
    model_a, model_b = make_model(seed=2), make_model(seed=2)
    opt_a, opt_b = wrap(model_a, stage), wrap(model_b, stage)
    for tokens in batches:
        opt_a.zero_grad()
        for index, half in enumerate((tokens[:2], tokens[2:])):
            opt_a.backward(lm_loss(model_a, half) / 2, last_micro_batch=index == 1)
        result_a = opt_a.step()
        opt_b.zero_grad()
        opt_b.backward(lm_loss(model_b, tokens), last_micro_batch=True)
        result_b = opt_b.step()
        assert math.isclose(result_a.grad_norm, result_b.grad_norm, rel_tol=1e-5)
        torch.testing.assert_close(opt_a.master, opt_b.master, rtol=1e-4, atol=1e-5)  # lr 1e-3: a wrong sum is off by ~1e-3
    with torch.no_grad():
        assert math.isclose(lm_loss(model_a, batches[0]).item(), lm_loss(model_b, batches[0]).item(), rel_tol=1e-6)


# ---- 5. Stage 3 ----------------------------------------------------------------------------------

def block_params_freed(model) -> bool:
    return all(p.untyped_storage().nbytes() == 0 for p in model.parameters())


def test_stage3_frees_chunks_but_keeps_shapes_and_gathers_during_forward():
    model = make_model()
    reference = copy.deepcopy(model)
    shapes = {name: p.shape for name, p in model.named_parameters()}
    optimizer = wrap(model, 3)
    assert len(optimizer.layout.units) == LAYERS + 1  # root chunk + one per block
    assert block_params_freed(model)
    assert {name: p.shape for name, p in model.named_parameters()} == shapes

    reference_blocks = dict(zip(map(id, model.blocks), reference.blocks))
    seen = []

    def check_gathered(block, *_):
        # Registered after wrapping, so it runs after ZeRO's gather and before its release.
        ref = reference_blocks[id(block)]
        for p, q in zip(block.parameters(), ref.parameters()):
            assert p.untyped_storage().nbytes() > 0
            assert torch.equal(p, q)
        seen.append(id(block))

    handles = [block.register_forward_pre_hook(check_gathered) for block in model.blocks]
    handles += [block.mlp.register_forward_hook(lambda module, args, output, block=block: check_gathered(block))
                for block in model.blocks]
    tokens = token_batches(1)[0]
    with torch.no_grad():
        torch.testing.assert_close(model(tokens[:, :-1]), reference(tokens[:, :-1]), rtol=0, atol=0)
    assert len(seen) == 2 * LAYERS
    assert block_params_freed(model)
    for handle in handles:
        handle.remove()

    loss = lm_loss(model, tokens)
    assert loss.item() == lm_loss(reference, tokens).item()
    assert block_params_freed(model)  # released after forward, gradients graph notwithstanding
    optimizer.zero_grad()
    optimizer.backward(loss)
    assert block_params_freed(model)
    assert all(p.grad is None for p in model.parameters())
    optimizer.step()
    assert block_params_freed(model)
    assert {name: p.shape for name, p in model.named_parameters()} == shapes


def test_stage3_persistent_chunk_stays_gathered_and_follows_the_master_weights():
    model = make_model()
    optimizer = wrap(model, 3, stage3_param_persistence_threshold=9000)  # the root chunk (~8.7k) only
    assert optimizer.gatherer.persistent == {0}
    root = optimizer.layout.units[0]
    root_params = [slot.param for slot in root.slots]
    assert {id(p) for p in root_params} == {id(model.word_embeddings.weight), id(model.position_embeddings.weight),
                                            id(model.final_layernorm.weight), id(model.final_layernorm.bias)}
    train_zero(model, optimizer, token_batches(2), LRS[:2])
    assert all(p.untyped_storage().nbytes() > 0 for p in root_params)
    assert all(p.untyped_storage().nbytes() == 0 for p in model.blocks.parameters())
    master = optimizer.master[root.partition_offset:root.partition_offset + root.shard_numel]
    for slot in root.slots:
        assert torch.equal(slot.param.detach().reshape(-1), master[slot.start:slot.end])


class Blocks(nn.Module):
    """Every trainable parameter inside the ModuleList: stage 3 has no root chunk."""

    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(8, 8) for _ in range(3))

    def forward(self, x):
        for layer in self.layers:
            x = torch.tanh(layer(x))
        return x


def test_stage3_without_root_chunk_trains_like_adamw():
    torch.manual_seed(0)
    model = Blocks()
    reference = copy.deepcopy(model)
    optimizer = ZeroHarness(model, OPTIMIZER, zero_config(3), ParallelState(device=CPU))
    assert optimizer.gatherer.root is None and len(optimizer.layout.units) == 3
    inputs = torch.randn(4, 8)
    ref_optimizer = torch.optim.AdamW(
        [{"params": [p for p in reference.parameters() if p.dim() >= 2], "weight_decay": OPTIMIZER.weight_decay},
         {"params": [p for p in reference.parameters() if p.dim() < 2], "weight_decay": 0.0}],
        lr=OPTIMIZER.lr, betas=(OPTIMIZER.adam_beta1, OPTIMIZER.adam_beta2), eps=OPTIMIZER.adam_eps)
    for _ in range(3):
        optimizer.zero_grad()
        loss = model(inputs).square().mean()
        optimizer.backward(loss)
        optimizer.step()
        ref_optimizer.zero_grad()
        expected = reference(inputs).square().mean()
        expected.backward()
        torch.nn.utils.clip_grad_norm_(list(reference.parameters()), OPTIMIZER.clip_grad)
        ref_optimizer.step()
        assert math.isclose(loss.item(), expected.item(), rel_tol=1e-6)
        assert block_params_freed(model)


def test_stage3_forward_trace_does_not_grow_without_root_chunk():
    torch.manual_seed(0)
    model = Blocks()
    optimizer = ZeroHarness(model, OPTIMIZER, zero_config(3), ParallelState(device=CPU))
    inputs = torch.randn(4, 8)
    for _ in range(4):
        optimizer.zero_grad()
        optimizer.backward(model(inputs).square().mean())
        optimizer.step()
    assert len(optimizer.gatherer._trace) <= len(optimizer.layout.units)


def count_gathers(optimizer: ZeroHarness) -> dict:
    """Wrap the gatherer's `_start_gather` (on the instance): calls, and calls that really gather."""
    gatherer = optimizer.gatherer
    counts = {"calls": 0, "gathers": 0}
    original = gatherer._start_gather

    def counting(unit):
        counts["calls"] += 1
        if gatherer._state[unit.index] == "released":
            counts["gathers"] += 1
        return original(unit)

    gatherer._start_gather = counting
    return counts


def count_forwards(model) -> list:
    calls = [0]
    for block in model.blocks:
        block.register_forward_pre_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
    return calls


@pytest.mark.parametrize("early_stop", [True, False])
@pytest.mark.parametrize("prefetch", [0, 50_000_000])
def test_stage3_activation_checkpointing_shares_the_backward_gather(prefetch, early_stop):
    batches = token_batches(3, seed=5)
    runs = {}
    for cls in (GPTModel, CheckpointedGPT):
        model = make_model(seed=4, cls=cls)
        model.early_stop = early_stop
        optimizer = wrap(model, 3, stage3_prefetch_bucket_size=prefetch)
        counts = count_gathers(optimizer)
        forwards = count_forwards(model)
        per_step = []
        losses = []
        for tokens, lr in zip(batches, LRS):
            before = dict(counts)
            for group in optimizer.param_groups:
                group["lr"] = lr
            optimizer.zero_grad()
            loss = lm_loss(model, tokens)
            optimizer.backward(loss)
            optimizer.step()
            losses.append(loss.item())
            per_step.append((counts["calls"] - before["calls"], counts["gathers"] - before["gathers"]))
            assert block_params_freed(model)
        runs[cls] = (losses, per_step, forwards[0])

    plain_losses, plain_counts, plain_forwards = runs[GPTModel]
    ckpt_losses, ckpt_counts, ckpt_forwards = runs[CheckpointedGPT]
    assert plain_forwards == LAYERS * len(batches)
    assert ckpt_forwards == 2 * LAYERS * len(batches)  # the recompute did run (pre-hooks count calls)
    assert_close_lists(ckpt_losses, plain_losses, rel=1e-6)
    assert ckpt_counts == plain_counts
    # Each chunk is gathered once for forward and once for backward.
    assert all(gathers == 2 * (LAYERS + 1) for _, gathers in plain_counts), plain_counts


def test_stage3_gatherer_is_the_instance_attribute():
    optimizer = wrap(make_model(), 3)
    assert isinstance(optimizer.gatherer, ParameterGatherer)
    assert optimizer.flat_params is None and optimizer.param_shard is not None
    assert optimizer.param_shard.numel() == optimizer.layout.partition_numel


# ---- 6. Memory accounting ------------------------------------------------------------------------

@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_measured_model_states_match_the_prediction_bf16(stage):
    model = make_model()
    optimizer = wrap(model, stage, dtype=torch.bfloat16)
    tokens = token_batches(1)[0]
    optimizer.zero_grad()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = lm_loss(model, tokens)
    optimizer.backward(loss)
    optimizer.step()
    measured = measure_tensor_bytes(optimizer.model_state_tensors())
    predicted = predict_model_state_bytes(optimizer.num_parameters, stage, 1, "bf16")
    padding_bytes = optimizer.padding * 16
    assert within_tolerance(measured["total"], predicted["total"], padding_bytes), (measured, predicted)
    # Exactly: 2 + 2 bytes of 16-bit params and grads, 4 + 8 of fp32 master and moments, per element
    # of the padded layout (one rank: the partition is the whole buffer).
    numel = optimizer.layout.numel
    assert measured["parameters"] == 2 * numel
    assert measured["gradients"] == 2 * numel
    assert measured["master_weights"] == 4 * numel
    assert measured["optimizer_states"] == 8 * numel
    assert measured["total"] == 16 * numel


def test_measured_optimizer_states_include_one_element_segments():
    torch.manual_seed(0)
    model = nn.Linear(4, 1)  # bias: 1 element, no decay -> a 1-element segment of its own
    state = ParallelState(device=CPU)
    optimizer = ZeroHarness(model, OPTIMIZER, zero_config(0), state, alignment=8)
    optimizer.zero_grad()
    optimizer.backward(model(torch.randn(3, 4)).square().mean())
    optimizer.step()
    assert [s.end - s.start for s in optimizer.layout.segments()] == [1, 7]
    measured = measure_tensor_bytes(optimizer.model_state_tensors())
    assert measured["optimizer_states"] == 8 * optimizer.layout.partition_numel


# ---- 7. fp16 overflow --------------------------------------------------------------------------

@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_fp16_overflow_skips_the_step_and_halves_the_scale(stage):
    model = make_model()
    # fp32 reference at the fp16-rounded weights, for the norm of the (unscaled) clean gradient.
    reference = copy.deepcopy(model)
    with torch.no_grad():
        for p in reference.parameters():
            p.copy_(p.half().float())
    scaler = DynamicLossScaler(scale=1024.0, growth_interval=1000, hysteresis=1)
    optimizer = wrap(model, stage, dtype=torch.float16, loss_scaler=scaler)
    assert all(p.dtype == torch.float16 for p in model.parameters())
    batches = token_batches(2, seed=7)

    def snapshot():
        params = optimizer.param_shard if stage == 3 else optimizer.flat_params
        return optimizer.master.clone(), params.clone()

    target = model.blocks[0].mlp.dense_h_to_4h.weight
    handle = target.register_hook(lambda grad: torch.full_like(grad, float("inf")))
    master_before, params_before = snapshot()
    optimizer.zero_grad()
    optimizer.backward(lm_loss(model, batches[0]))
    result = optimizer.step()
    handle.remove()
    assert result.skipped and result.loss_scale == 1024.0 and not math.isfinite(result.grad_norm)
    assert scaler.scale == 512.0
    master_after, params_after = snapshot()
    assert torch.equal(master_after, master_before) and torch.equal(params_after, params_before)
    assert all(not s.get("exp_avg", torch.zeros(())).abs().sum() for s in optimizer.optimizer.state.values())

    optimizer.zero_grad()
    optimizer.backward(lm_loss(model, batches[1]))
    result = optimizer.step()
    assert not result.skipped and result.loss_scale == 512.0
    lm_loss(reference, batches[1]).backward()
    expected_norm = torch.nn.utils.get_total_norm([p.grad for p in reference.parameters()]).item()
    assert math.isclose(result.grad_norm, expected_norm, rel_tol=1e-3), (result.grad_norm, expected_norm)
    assert scaler.scale == 512.0
    master_after, params_after = snapshot()
    assert not torch.equal(master_after, master_before)
    assert torch.equal(params_after, master_after.to(torch.float16))  # one rank: partition == buffer
