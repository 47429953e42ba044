"""One optimizer trained on every ZeRO grid of a test, the same way: a tiny GPT-2, four steps, each of two
data-parallel ranks on its share of the same tokens. The optimizer tests (SophiaG, AdEMAMix, precision-aware
moments) compare what each grid gives with ZeRO 0's; `summarize` says what each keeps of a grid's run."""

from __future__ import annotations

from typing import Callable, Iterable

import torch

from arguments.config import OptimizerConfig
from parallel.state import destroy, initialize
from tests.zero.test_zero_distributed import SEQ, VOCAB, tiny_gpt2
from tests.zero_harness import ZeroHarness
from zero.config import ZeroConfig

STEPS = 4


def four_steps_on_every_grid(rank: int, world_size: int, optimizer: dict, grids: Iterable[tuple[int, bool]],
                             summarize: Callable[[torch.nn.Module, ZeroHarness, list[float]], tuple]) -> dict:
    """Per (stage, offload_optimizer) of `grids`: summarize(the model, its harness after the steps, the steps'
    losses)."""
    state = initialize("cpu", 1)
    try:
        outcomes = {}
        tokens = torch.randint(0, VOCAB, (2 * world_size, SEQ), generator=torch.Generator().manual_seed(3))
        mine = tokens.chunk(world_size)[rank]
        for stage, offload in grids:
            model = tiny_gpt2()
            zero = ZeroHarness(model, OptimizerConfig.of(**optimizer),
                               ZeroConfig(stage=stage, reduce_bucket_size=3000, offload_optimizer=offload,
                                          sub_group_size=997), state)
            losses = []
            for _ in range(STEPS):
                zero.zero_grad()
                loss = model(input_ids=mine, labels=mine).loss
                losses.append(loss.item())
                zero.backward(loss)
                zero.step()
            outcomes[(stage, offload)] = summarize(model, zero, losses)
        return outcomes
    finally:
        destroy(state)
