"""--decoupled-lr / --decoupled-min-lr: Megatron-LM's separate learning rate for the input embedding and
the output layer's weights (issue 34/37).

NVIDIA/Megatron-LM at commit 779c5b748dbcf00ad9e36d539c576b404ab4abe9:
- megatron/core/optimizer/__init__.py get_standard_config_overrides (lines 121-126): with decoupled_lr
  set, the parameters whose `is_embedding_or_output_parameter` is set get the group override
  {"max_lr": decoupled_lr} and, when decoupled_min_lr is set, {"min_lr": decoupled_min_lr};
- megatron/core/models/common/language_module/language_module.py (lines 212-219): that attribute is set on
  the word embedding's weight and on the output layer's weight when it exists (untied);
- megatron/core/optimizer_param_scheduler.py get_lr (lines 226-237): max_lr = param_group.get('max_lr',
  self.max_lr), min_lr likewise; warmup from the shared init_lr, the decay style and lengths shared.
"""

import math

import pytest
import torch

from arguments.config import OptimizerConfig
from arguments.parser import parse_config
from parallel.state import destroy, initialize
from tests.distributed import run_distributed
from tests.reliability_helpers import metrics_records, train
from tests.zero.test_zero_distributed import SEQ, VOCAB, tiny_gpt2
from tests.zero_harness import ZeroHarness
from training.run_settings import resolve_run_settings
from zero.config import ZeroConfig

LR, DECOUPLED = 1e-3, 7e-3
GRIDS = ((0, False), (1, False), (2, False), (3, False), (2, True), (3, True))  # (stage, offload_optimizer)


def one_step_moves(rank, world_size):
    """Per grid: the largest change of each parameter after one AdamW step at LR, the word embedding
    (tied to GPT-2's output layer) at DECOUPLED."""
    state = initialize("cpu", 1)
    try:
        moves = {}
        tokens = torch.randint(0, VOCAB, (2 * world_size, SEQ), generator=torch.Generator().manual_seed(3))
        mine = tokens.chunk(world_size)[rank]
        for stage, offload in GRIDS:
            model = tiny_gpt2()
            before = {name: param.detach().clone() for name, param in model.named_parameters()}
            # No weight decay, no clipping: Adam's first step moves every element with a gradient by
            # lr * g / (|g| + eps), so the largest move of a parameter is its learning rate.
            zero = ZeroHarness(model, OptimizerConfig(lr=LR, weight_decay=0.0, clip_grad=0.0),
                               ZeroConfig(stage=stage, reduce_bucket_size=3000, offload_optimizer=offload,
                                          sub_group_size=997), state,
                               decoupled_lr_params=[model.transformer.wte.weight])
            for group in zero.sharded.param_groups:  # what training/train_step.py does with the schedules
                group["lr"] = DECOUPLED if group["decoupled_lr"] else LR
            zero.zero_grad()
            zero.backward(model(input_ids=mine, labels=mine).loss)
            zero.step()
            after = zero.sharded.model_state_dict(model)
            moves[(stage, offload)] = {name: (after[name] - before[name]).abs().max().item() for name in before}
        return moves
    finally:
        destroy(state)


def test_one_step_moves_the_embedding_at_the_decoupled_rate_and_the_rest_at_lr_at_every_stage_and_offload():
    for rank_moves in run_distributed(one_step_moves, 2, timeout=300):
        for grid, moves in rank_moves.items():
            assert moves["transformer.wte.weight"] == pytest.approx(DECOUPLED, rel=1e-3), grid
            others = {name: move for name, move in moves.items() if name != "transformer.wte.weight"}
            assert others and all(move == pytest.approx(LR, rel=1e-3) for move in others.values()), (grid, others)


def test_the_decoupled_schedule_is_the_same_schedule_with_its_own_peak_and_floor():
    flags = ["--lr", "1e-3", "--min-lr", "1e-4", "--lr-warmup-iters", "2", "--train-iters", "10",
             "--lr-decay-style", "cosine", "--lr-warmup-init", "1e-5", "--micro-batch-size", "1",
             "--global-batch-size", "1"]
    plain = resolve_run_settings(parse_config(flags), 512, 1, 1, "cpu")
    assert plain.decoupled_lr_schedule is None
    settings = resolve_run_settings(parse_config(flags + ["--decoupled-lr", "5e-3", "--decoupled-min-lr", "5e-4"]),
                                    512, 1, 1, "cpu")
    ours, theirs = settings.lr_schedule, settings.decoupled_lr_schedule
    assert ours == plain.lr_schedule
    assert theirs.rate(0) == ours.rate(0) == 1e-5  # the warmup starts from the shared init_lr
    assert theirs.rate(2) == 5e-3 and ours.rate(2) == 1e-3  # each group's own peak
    middle = (ours.rate(6) - 1e-4) / (1e-3 - 1e-4)
    assert (theirs.rate(6) - 5e-4) / (5e-3 - 5e-4) == pytest.approx(middle)  # the same cosine
    assert theirs.rate(11) == 5e-4 and ours.rate(11) == 1e-4  # each group's own floor
    without_floor = resolve_run_settings(parse_config(flags + ["--decoupled-lr", "5e-3"]), 512, 1, 1, "cpu")
    assert without_floor.decoupled_lr_schedule.rate(11) == 1e-4  # --min-lr, as Megatron's get_lr falls back


def losses(corpus_cache, workdir, *flags):
    workdir.mkdir()
    outcome = train(corpus_cache, workdir, "--train-iters", "3", "--lr", "1e-3", "--min-lr", "1e-4",
                    "--untie-embeddings-and-output-weights", *flags)
    assert outcome.code == 0, outcome.err[-3000:]
    result = [record["loss"] for record in metrics_records(workdir / "metrics.jsonl") if "loss" in record]
    assert len(result) == 3 and all(math.isfinite(loss) for loss in result)
    return result


def test_a_run_with_decoupled_lr_equal_to_lr_trains_bit_identically_and_another_rate_changes_it(corpus_cache,
                                                                                                tmp_path):
    without = losses(corpus_cache, tmp_path / "without")
    assert losses(corpus_cache, tmp_path / "equal", "--decoupled-lr", "1e-3", "--decoupled-min-lr", "1e-4") == without
    assert losses(corpus_cache, tmp_path / "other", "--decoupled-lr", "2e-2")[1:] != without[1:]
