"""--overlap-param-gather: no operation reads a unit's parameters before that unit's all-gather is waited for,
whoever reads them (issue 77, item 2).

Deterministic, in one process: the communicator's all-gathers never complete on their own, and each wait is
logged; a dispatch mode logs every operation that touches the flat parameter buffer, by unit. The output layer's
weight (or the tied embedding) is a unit of its own, as Llama 3 8B's 128256 x 4096 output layer is at the default
bucket size. Before the gated parameters, each module waited in a forward pre-hook for the parameters it owns,
and GPTModel.output, which reads `self.output_layer.weight` into F.linear or the fused cross entropy without
calling the module, read that unit un-waited (on a GPU, nothing ordered the forward after the gather)."""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from arguments.config import ModelConfig
from gpt.model import GPTModel
from parallel.init import materialize
from parallel.state import ParallelState
from zero.flat_buffer import DEFAULT_ALIGNMENT, FlatLayout, bucket_params, unique_trainable_parameters
from zero.gated_parameters import GatedParameter
from zero.param_storage import ReplicatedParameters, TensorSource

CPU = torch.device("cpu")
VOCAB, SEQ = 256, 8


class _LoggedWork:
    def __init__(self, log: list, unit: int) -> None:
        self.log, self.unit = log, unit

    def wait(self) -> None:
        self.log.append(("waited", self.unit))


class DeferredGathers:
    """A communicator whose all-gathers complete only when waited for (the buffer keeps what `fill` wrote);
    each wait is logged with the unit it gathers into."""

    def __init__(self, log: list, unit_at: dict[int, int]) -> None:
        self.log, self.unit_at = log, unit_at

    def all_gather(self, output, source, group, dim, async_op=False):
        return _LoggedWork(self.log, self.unit_at[output.data_ptr()])


class UnitReads(TorchDispatchMode):
    """Logs ("read", unit) for every operation with an argument that overlaps a unit of the flat buffer."""

    def __init__(self, flat: torch.Tensor, layout: FlatLayout, log: list) -> None:
        super().__init__()
        self.storage, self.layout, self.log = flat.untyped_storage().data_ptr(), layout, log

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        with torch._C.DisableTorchFunctionSubclass():  # looking at a gated parameter must not wait for it
            for tensor in tree_leaves((args, kwargs)):
                if isinstance(tensor, torch.Tensor) and tensor.device.type != "meta" and tensor.numel() \
                        and tensor.untyped_storage().data_ptr() == self.storage:
                    first = tensor.storage_offset()
                    last = first + sum((size - 1) * stride for size, stride in zip(tensor.shape, tensor.stride()))
                    self.log += [("read", unit.index) for unit in self.layout.units
                                 if unit.buffer_offset <= last and first < unit.buffer_offset + unit.numel]
        return func(*args, **(kwargs or {}))


def overlapped(config: ModelConfig):
    """A model whose parameters are views of a stage-1 buffer (part 0 of 2) with every unit's gather in flight, the
    output weight (the word embedding when tied) alone in the last unit; the log its gathers' waits go to."""
    model = materialize(GPTModel(config, ParallelState(device=CPU)), seed=1)
    head = (model.output_layer or model.word_embeddings).weight
    units = bucket_params([p for p in unique_trainable_parameters(model) if p is not head], 4000) + [[head]]
    layout = FlatLayout(units, parts=2, part=0, alignment=DEFAULT_ALIGNMENT)
    log: list = []
    storage = ReplicatedParameters(layout, torch.float32, CPU, None, group="dp", allgather_bucket_numel=1,
                                   overlap_param_gather=True)
    storage.comm = DeferredGathers(log, {unit.in_buffer(storage.flat).data_ptr(): unit.index for unit in layout.units})
    master = torch.zeros(layout.partition_numel)
    storage.fill(TensorSource(), master)
    storage.bind(model)
    storage.publish(master)
    return model, storage, log


MODELS = {
    "untied output layer": dict(untie_embeddings_and_output_weights=True),
    "untied, fused cross entropy": dict(untie_embeddings_and_output_weights=True, cross_entropy_loss_fusion=True),
    "tied output layer": {},
    "MTP's shared head": dict(untie_embeddings_and_output_weights=True, mtp_num_layers=1),
    "experts": dict(num_experts=4, moe_router_topk=2),
}


@pytest.mark.parametrize("options", MODELS.values(), ids=MODELS.keys())
def test_no_unit_is_read_before_its_gather_is_waited_for(options):
    config = ModelConfig.of(num_layers=2, hidden_size=32, num_attention_heads=4, seq_length=SEQ,
                            max_position_embeddings=SEQ, vocab_size=VOCAB, hidden_dropout=0.0, attention_dropout=0.0,
                            **options)
    model, storage, log = overlapped(config)
    assert all(isinstance(param, GatedParameter) for param in model.parameters())
    tokens = torch.randint(0, VOCAB, (2, SEQ + 1), generator=torch.Generator().manual_seed(0))
    with UnitReads(storage.flat, storage.layout, log):
        model(tokens[:, :-1], tokens[:, 1:]).mean().backward()
    units = range(len(storage.layout.units))
    first_read = {unit: log.index(("read", unit)) for unit in units if ("read", unit) in log}
    assert set(first_read) == set(units), "every unit is read in forward and backward"
    unwaited = [unit for unit in units if ("waited", unit) not in log[:first_read[unit]]]
    assert not unwaited, f"units read before their gather was waited for: {unwaited} of {len(units)} " \
                         f"(the output weight's is {len(units) - 1})"


def test_compiled_blocks_wait_at_entry_and_compile_once():
    """Under torch.compile dynamo guards on each gate's state; a block that waits for its gates as it is entered
    (zero.gated_parameters.wait_at_region_entry, which gpt.model.compile_blocks calls) sees them open every
    iteration and compiles once, where a gate closed at one entry and open at the next recompiled it each time."""
    import torch._dynamo

    from base.eager_under_compile import keep_marked_methods_eager
    from zero.gated_parameters import wait_at_region_entry

    keep_marked_methods_eager()
    config = ModelConfig.of(num_layers=1, hidden_size=32, num_attention_heads=4, seq_length=SEQ,
                         max_position_embeddings=SEQ, vocab_size=VOCAB, hidden_dropout=0.0, attention_dropout=0.0)
    model, storage, log = overlapped(config)
    tokens = torch.randint(0, VOCAB, (2, SEQ + 1), generator=torch.Generator().manual_seed(0))
    expected = model(tokens[:, :-1], tokens[:, 1:])
    for block in model.blocks:
        wait_at_region_entry(block)
        block.compile(backend="eager")
    torch._dynamo.reset()
    with torch._dynamo.config.patch(error_on_recompile=True):
        for _ in range(3):
            storage.publish(torch.zeros(storage.layout.partition_numel))  # every gate closed again
            assert torch.equal(model(tokens[:, :-1], tokens[:, 1:]), expected)
            assert all(gate.is_open for gate in storage._gates)
    torch._dynamo.reset()


def test_a_graphed_region_waits_for_its_gathers_before_each_replay():
    """A replayed CUDA graph runs no Python, so no GatedParameter waits inside it: each graphed region's modules get
    the entry hook (training/cuda_graphs.py calls wait_at_region_entry), which the region accepts as one to call
    before each replay (parallel/graph_capture.py), and calling it waits for every unit the block reads."""
    from parallel.graph_capture import GraphedRegion
    from zero.gated_parameters import wait_at_region_entry

    config = ModelConfig.of(num_layers=1, hidden_size=32, num_attention_heads=4, seq_length=SEQ,
                         max_position_embeddings=SEQ, vocab_size=VOCAB, hidden_dropout=0.0, attention_dropout=0.0)
    model, storage, log = overlapped(config)
    block = model.blocks[0]
    wait_at_region_entry(block)
    region = GraphedRegion("blocks.0", block, block, [block])
    before_replay = region.hooks_before_replay()
    assert len(before_replay) == 1
    storage.publish(torch.zeros(storage.layout.partition_numel))
    log.clear()
    for call in before_replay:
        call()
    block_units = {storage.layout.unit_of[id(param)].index for param in block.parameters()}
    assert {unit for event, unit in log if event == "waited"} == block_units
