"""--optimizer sophiag: ALCF's Megatron-DeepSpeed fork's Sophia-G (issue 64 item 4).

`ForkSophiaG` below is argonne-lcf/Megatron-DeepSpeed's megatron/optimizer/sophia.py at
ffa3456d68b630192fcaefcc3288bd18525b8d95 (itself Liuhong99/Sophia's), copied with its capturable and complex branches
left out (neither runs there: `capturable` defaults to False and the parameters are real). The fork builds it in
megatron/optimizer/__init__.py as `SophiaG(param_groups, lr=args.lr, betas=(args.sophiag_beta1, args.sophiag_beta2),
rho=args.sophiag_rho, weight_decay=args.weight_decay)`, its groups from get_param_groups (no decay for biases and 1-D
parameters: `wd_mult` 0, which its scheduler multiplies into each group's weight_decay), and its training steps it with
`optimizer.step()` alone: nothing there calls `update_hessian`, so the Hessian estimate stays zero.
"""

from __future__ import annotations

import pytest
import torch

from arguments.config import OptimizerConfig
from parallel.state import destroy, initialize
from tests.distributed import run_distributed
from tests.reliability_helpers import TINY, straight_and_resumed, train
from tests.zero.grid_runs import four_steps_on_every_grid
from tests.zero.test_zero_distributed import SEQ, VOCAB, tiny_gpt2
from tests.zero_harness import ZeroHarness
from zero.config import ZeroConfig
from zero.sophia import SophiaG


class ForkSophiaG(torch.optim.Optimizer):
    """The fork's SophiaG (module docstring), its arithmetic as written there."""

    def __init__(self, params, lr=1e-4, betas=(0.965, 0.99), rho=0.04, weight_decay=1e-1):
        super().__init__(params, dict(lr=lr, betas=betas, rho=rho, weight_decay=weight_decay))

    @torch.no_grad()
    def update_hessian(self):
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if len(state) == 0:
                    state["step"] = torch.tensor(0.0)
                    state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                    state["hessian"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                state["hessian"].mul_(beta2).addcmul_(p.grad, p.grad, value=1 - beta2)

    @torch.no_grad()
    def step(self, closure=None, bs=5120):
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if len(state) == 0:
                    state["step"] = torch.tensor(0.0)
                    state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                    state["hessian"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                grad, exp_avg, hess, step_t = p.grad, state["exp_avg"], state["hessian"], state["step"]
                # _single_tensor_sophiag, capturable=False
                step_t += 1
                p.mul_(1 - group["lr"] * group["weight_decay"])
                exp_avg.mul_(beta1).add_(grad, alpha=1 - beta1)
                step_size_neg = -group["lr"]
                ratio = (exp_avg.abs() / (group["rho"] * bs * hess + 1e-15)).clamp(None, 1)
                p.addcmul_(exp_avg.sign(), ratio, value=step_size_neg)


SOPHIA = dict(optimizer="sophiag", lr=3e-3, weight_decay=0.1, sophiag_beta1=0.9, sophiag_beta2=0.95,
              sophiag_rho=0.01, clip_grad=0.0)


def fork_param_groups(model, weight_decay):
    """get_param_groups' two groups, the scheduler's weight_decay = wd x wd_mult written into them."""
    decay, no_decay = [], []
    for name, param in model.named_parameters():
        (no_decay if name.endswith(".bias") or len(param.shape) == 1 else decay).append(param)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def test_sophiag_steps_as_the_forks_optimizer_over_five_steps_on_a_small_model():
    """A tiny GPT-2, five steps on one batch: the fork's SophiaG over the model's parameters, as its training runs it
    (step only), and ours over the ZeRO master partition: the same losses and parameters, bit for bit."""
    tokens = torch.randint(0, VOCAB, (2, SEQ), generator=torch.Generator().manual_seed(3))
    reference = tiny_gpt2()
    fork = ForkSophiaG(fork_param_groups(reference, SOPHIA["weight_decay"]), lr=SOPHIA["lr"], betas=(0.9, 0.95),
                       rho=0.01)
    state = initialize("cpu", 1)
    try:
        model = tiny_gpt2()
        zero = ZeroHarness(model, OptimizerConfig.of(**SOPHIA), ZeroConfig(stage=0), state)
        for _ in range(5):
            fork.zero_grad()
            expected = reference(input_ids=tokens, labels=tokens).loss
            expected.backward()
            fork.step()
            zero.zero_grad()
            loss = model(input_ids=tokens, labels=tokens).loss
            zero.backward(loss)
            zero.step()
            assert loss.item() == expected.item()
        ours = dict(model.named_parameters())
        for name, param in reference.named_parameters():
            assert torch.equal(ours[name].detach(), param.detach()), name
        assert zero.sharded.optimizer_name == "sophiag"
        assert zero.sharded.exp_avg.abs().sum() > 0 and zero.sharded.exp_avg_sq.abs().sum() == 0  # h stays zero
    finally:
        destroy(state)


def test_the_clipped_ratio_reads_the_hessian_estimate_as_the_forks():
    """Where the estimate holds values (the fork's update_hessian, which its training never calls, run here by
    hand), the ratio |m| / (rho x bs x h + 1e-15) clipped at 1 is the fork's, also stepped in 64-element windows."""
    generator = torch.Generator().manual_seed(0)
    values = torch.randn(1000, generator=generator)
    grads = [torch.randn(1000, generator=generator) * 0.01 for _ in range(5)]
    reference = torch.nn.Parameter(values.clone())
    fork = ForkSophiaG([reference], lr=1e-2, betas=(0.9, 0.95), rho=0.01, weight_decay=0.1)
    ours = torch.nn.Parameter(values.clone())
    mine = SophiaG([ours], lr=1e-2, betas=(0.9, 0.95), rho=0.01, weight_decay=0.1)
    mine.state[ours] = {"step": torch.tensor(0.0), "exp_avg": torch.zeros(1000), "exp_avg_sq": torch.zeros(1000)}
    for grad in grads:
        reference.grad, ours.grad = grad.clone(), grad.clone()
        fork.update_hessian()
        mine.state[ours]["exp_avg_sq"].copy_(fork.state[reference]["hessian"])
        fork.step()
        mine.step()
    ratio = fork.state[reference]["exp_avg"].abs() / (0.01 * 5120 * fork.state[reference]["hessian"] + 1e-15)
    assert (ratio < 1).any() and (ratio >= 1).any()  # both sides of the clip ran
    assert torch.equal(ours.detach(), reference.detach())


GRIDS = ((0, False), (1, False), (2, False), (3, False), (2, True))  # (stage, offload_optimizer)


def train_every_grid(rank, world_size):
    def summarize(model, zero, losses):
        shard = zero.sharded.sharded_state_dict(model)
        return losses, sorted(shard.tensors), shard.optimizer
    return four_steps_on_every_grid(rank, world_size, SOPHIA, GRIDS, summarize)


@pytest.mark.slow
def test_sophiag_under_zero_1_2_3_and_offload_trains_as_zero_0_on_two_ranks():
    """ZeRO 1-3 partition the momentum and the Hessian estimate as Adam's two moments and the offloaded host step runs
    the same update per sub-group: on two data-parallel ranks every grid's losses equal ZeRO 0's."""
    for outcomes in run_distributed(train_every_grid, 2, timeout=300):
        reference, keys, name = outcomes[(0, False)]
        assert keys == ["exp_avg", "exp_avg_sq", "master"] and name == "sophiag"
        assert reference[-1] < reference[0]
        for grid, (losses, grid_keys, _) in outcomes.items():
            assert grid_keys == keys, grid
            assert losses == pytest.approx(reference, rel=1e-6, abs=0), grid


SOPHIA_FLAGS = ["--optimizer", "sophiag", "--sophiag-rho", "0.02", "--lr", "3e-3"]


@pytest.mark.slow
def test_a_sophiag_run_saved_and_resumed_continues_exactly_and_resumes_only_into_sophiag(corpus_cache_300, tmp_path):
    """Saved at iteration 2 of 4 at ZeRO 1, resumed: every loss and gradient norm equals the straight run's; the
    checkpoint's states resume only into --optimizer sophiag (one line naming --no-load-optim otherwise)."""
    argv = TINY + SOPHIA_FLAGS + ["--train-iters", "4", "--data-cache-dir", corpus_cache_300, "--zero-stage", "1"]
    straight, split, save = straight_and_resumed(argv, tmp_path, exit_interval=2)
    assert len(straight) == 4
    assert [(r["iteration"], r["loss"], r["grad_norm"]) for r in straight] == \
           [(r["iteration"], r["loss"], r["grad_norm"]) for r in split]
    refused = train(corpus_cache_300, tmp_path, "--train-iters", "3", "--override-opt_param-scheduler", "--load", save,
                    "--save", tmp_path / "other")
    assert "\n" not in refused.one_error_line("--optimizer sophiag's states", "--optimizer adam", "--no-load-optim")


def test_the_planner_counts_sophiags_two_states_and_its_step_windows(capsys):
    """Two fp32 states per partition element beside the master, as Adam's (the fork's exp_avg and hessian), and the
    step's two fp32 window temporaries (zero/sophia.py), in the dry run and in the live optimizer."""
    from arguments.parser import parse_config
    from planner.dry_run import Cluster, dry_run
    from zero.memory import measure_tensor_bytes
    from zero.sophia import TEMPORARIES

    small = ["--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4", "--seq-length", "32",
             "--max-position-embeddings", "32", "--micro-batch-size", "2", "--global-batch-size", "8",
             "--zero-stage", "2"]
    plans = {name: dry_run(parse_config(small + ["--optimizer", name]), Cluster(2, 2, device_type="cuda"), 1000)
             for name in ("adam", "sophiag")}
    assert plans["sophiag"].model_state_bytes == plans["adam"].model_state_bytes
    assert plans["adam"].step_working_bytes == 0 and plans["sophiag"].step_working_bytes % (4 * TEMPORARIES) == 0
    assert plans["sophiag"].step_working_bytes > 0
    state = initialize("cpu", 1)
    try:
        zero = ZeroHarness(tiny_gpt2(), OptimizerConfig.of(**SOPHIA), ZeroConfig(stage=1), state)
        measured = measure_tensor_bytes(zero.sharded.model_state_tensors())
        assert measured["optimizer_states"] == 8 * (zero.sharded.num_parameters + zero.sharded.padding)
    finally:
        destroy(state)
