"""Megatron-Core's flex token dispatcher and its benchmark routing (issue 64 item 2).

NVIDIA/Megatron-LM at d98e8a64:
- megatron/core/transformer/moe/token_dispatcher.py MoEFlexTokenDispatcher: one communication group over the
  expert TP x EP ranks, the routing map replicated over the expert TP ranks (`_initialize_metadata`), tokens moved by
  DeepEP, HybridEP or NCCL-EP GPU kernels (`_DeepepManager`, `_HybridEPManager`, `_NCCLEPManager`; the first and
  last assert `tp_size * ep_size > 1`). Those kernels do not run on a CPU; the alltoall dispatcher moves the same
  tokens to the same experts (gpt/moe/dispatchers.py), which is what runs here, said at start-up.
- transformer_config.py __post_init__: `moe_enable_deepep` needs the flex dispatcher and no hybridep backend;
  ncclep needs flex; deepep refuses `moe_pad_expert_input_to_capacity`.
- router.py TopKRouter.forward: `if self.config.moe_router_force_load_balancing: logits =
  apply_random_logits(logits)`; moe_utils.py RandomSTE: `random_logits = logits.clone().normal_()` under the
  expert-parallel RNG tracker (tensor_parallel/random.py: seed + 1024 + 100 * ep_rank + etp_rank), backward
  `return grad_output`.
"""

from __future__ import annotations

import json

import pytest
import torch

from arguments.parser import parse_arguments
from base.errors import ConfigError
from gpt.moe.router import RandomLogits, TopKRouter, random_logits_generator
from gpt.moe.settings import MoESettings
from parallel.state import ExpertParallel, ParallelState
from tests.distributed import free_port, run_distributed
from tests.reliability_helpers import TINY
from tests.training.test_moe_training import launch_rank

MOE = ["--num-layers", "2", "--num-experts", "4", "--moe-router-topk", "2", "--moe-grouped-gemm", "--seed", "5"]


def router(state: ParallelState, force: bool) -> TopKRouter:
    settings = MoESettings(num_experts=4, ffn_hidden_size=8, router_topk=2, router_force_load_balancing=force)
    module = TopKRouter(6, settings, init_std=0.02, bias=False, state=state)
    module.weight = torch.nn.Parameter(torch.linspace(-1, 1, 24).reshape(4, 6))
    return module


def test_forced_balancing_routes_on_standard_normal_draws_and_passes_the_gradient_straight_through():
    """The top-k is taken on the random logits, not the router's; the router's weight gets the gradient the random
    logits got (RandomSTE's backward is the identity)."""
    hidden = torch.randn(64, 6, generator=torch.Generator().manual_seed(0))
    state = ParallelState(device=torch.device("cpu"))
    forced = router(state, force=True)
    torch.manual_seed(11)
    probs, routing_map = forced(hidden, 64, 1)
    torch.manual_seed(11)  # the same default-stream draw keys the same generator: the logits drawn were these
    drawn = torch.empty(64, 4).normal_(generator=random_logits_generator(torch.device("cpu"), 0, 0))
    assert torch.equal(routing_map, torch.zeros_like(routing_map).scatter(1, drawn.topk(2, dim=1).indices, True))
    assert torch.allclose(probs.sum(dim=1), torch.ones(64))
    plain_probs, plain_map = router(state, force=False)(hidden, 64, 1)
    assert not torch.equal(plain_map, routing_map)
    assert abs(drawn.mean().item()) < 0.3 and 0.7 < drawn.std().item() < 1.3  # standard normal draws

    upstream = torch.randn(64, 4, generator=torch.Generator().manual_seed(1))
    logits = forced.gating(hidden).detach().requires_grad_()
    RandomLogits.apply(logits, None).backward(upstream)
    assert torch.equal(logits.grad, upstream)
    probs.sum().backward()
    assert forced.weight.grad is not None and forced.weight.grad.abs().sum() > 0


def test_each_expert_parallel_rank_draws_its_own_logits_and_a_recompute_draws_them_again():
    """Megatron's expert-parallel stream differs per (EP rank, expert TP rank) and is shared by the expert
    data-parallel ranks; a block recomputed under activation checkpointing restores the default stream
    (zero/activations.py), so the router draws the logits its forward drew."""
    hidden = torch.randn(32, 6, generator=torch.Generator().manual_seed(2))

    def routed(ep_rank: int, etp_rank: int = 0, data_rank: int = 0) -> torch.Tensor:
        state = ParallelState(device=torch.device("cpu"), expert_grid=ExpertParallel(
            model_size=2, model_rank=ep_rank, tensor_size=2, tensor_rank=etp_rank, data_size=2, data_rank=data_rank))
        torch.manual_seed(5)
        return router(state, force=True)(hidden, 32, 1)[1]

    assert torch.equal(routed(0), routed(0))  # the same default-stream state: the same draws (a recompute)
    assert torch.equal(routed(1, data_rank=0), routed(1, data_rank=1))
    assert not torch.equal(routed(0), routed(1))
    assert not torch.equal(routed(0, 0), routed(0, 1))


def test_flex_is_accepted_with_each_backend_and_named_at_start_up():
    for backend in ("hybridep", "deepep", "ncclep"):
        parsed = parse_arguments(["--num-experts", "4", "--expert-model-parallel-size", "2",
                                  "--moe-token-dispatcher-type", "flex", "--moe-flex-dispatcher-backend", backend])
        assert parsed.config.parallel.token_dispatcher == "alltoall"
        (line,) = [note for note in parsed.notes if note.startswith("> --moe-token-dispatcher-type flex")]
        assert f"({backend} backend)" in line and "the alltoall dispatcher moves the same tokens" in line
    deepep = parse_arguments(["--num-experts", "4", "--expert-model-parallel-size", "2", "--moe-token-dispatcher-type",
                              "flex", "--moe-enable-deepep"])
    assert deepep.config.parallel.flex_backend == "deepep"
    # HybridEP has no TPxEP > 1 assertion: the MoE functional tests' proxies shrunk to EP 1 keep it
    assert parse_arguments(["--num-experts", "4", "--moe-token-dispatcher-type", "flex",
                            "--moe-flex-dispatcher-backend", "hybridep"]).config.parallel.token_dispatcher == "alltoall"
    no_experts = parse_arguments(["--moe-token-dispatcher-type", "flex"])
    assert not [note for note in no_experts.notes if "flex" in note]


@pytest.mark.parametrize("argv, says", [
    (["--moe-enable-deepep"], "--moe-enable-deepep needs --moe-token-dispatcher-type flex"),
    (["--moe-token-dispatcher-type", "flex", "--moe-enable-deepep", "--moe-flex-dispatcher-backend", "hybridep"],
     "takes one backend"),
    (["--moe-flex-dispatcher-backend", "ncclep"], "ncclep needs --moe-token-dispatcher-type flex"),
    (["--moe-token-dispatcher-type", "flex"], "DeepEP dispatcher requires TPxEP > 1"),
    (["--moe-token-dispatcher-type", "flex", "--expert-model-parallel-size", "2", "--moe-expert-capacity-factor", "1",
      "--moe-pad-expert-input-to-capacity"], "does not pad to capacity"),
])
def test_megatrons_flex_assertions_are_one_line_refusals(argv, says):
    with pytest.raises(ConfigError, match=says) as error:
        parse_arguments(["--num-experts", "4"] + argv)
    assert "\n" not in str(error.value)


@pytest.mark.slow
def test_flex_at_expert_parallel_2_trains_as_alltoall_and_forced_balancing_recomputes_its_draws(
        corpus_cache_300, tmp_path):
    """One launch of 2 ranks: EP 2 flex (hybridep) logs alltoall's losses bit for bit (it is the same dispatcher);
    forced balancing under full recompute logs the losses and gradient norms of the run without recompute (a
    recomputed router drew other logits would route other tokens and change the gradients)."""
    common = TINY + MOE + ["--train-iters", "3", "--data-cache-dir", corpus_cache_300, "--global-batch-size", "4",
                           "--expert-model-parallel-size", "2", "--zero-stage", "1"]
    variants = {"alltoall": ["--moe-token-dispatcher-type", "alltoall"],
                "flex": ["--moe-token-dispatcher-type", "flex", "--moe-flex-dispatcher-backend", "hybridep"],
                "forced": ["--moe-token-dispatcher-type", "alltoall", "--moe-router-force-load-balancing"],
                "forced_recompute": ["--moe-token-dispatcher-type", "alltoall", "--moe-router-force-load-balancing",
                                     "--checkpoint-activations"]}
    argv = [common + extra + ["--metrics-file", str(tmp_path / f"{name}.jsonl")] for name, extra in variants.items()]
    run_distributed(launch_rank, 2, argv, [free_port() for _ in variants], timeout=600)

    def logged(name):
        return [(r["loss"], r["grad_norm"]) for r in map(json.loads, (tmp_path / f"{name}.jsonl").read_text()
                                                         .splitlines()) if "loss" in r and "split" not in r]

    assert len(logged("alltoall")) == 3 and logged("flex") == logged("alltoall")
    assert logged("forced") == logged("forced_recompute")
    assert logged("forced") != logged("alltoall")
