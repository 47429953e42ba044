"""Megatron-Core's MoELayer (megatron/core/transformer/moe/moe_layer.py): route, dispatch, run the experts,
combine, and add the shared experts' output (SharedExpertMLP of --moe-shared-expert-intermediate-size, gated by
sigmoid(x . gate) with --moe-shared-expert-gate, as Qwen2-MoE's shared_expert_gate).

With --mlp-type residual (PR-MoE, Megatron-DeepSpeed), DeepSpeed-MoE's residual MoE (deepspeed/moe/layer.py): a
dense MLP beside the experts, mixed per token by softmax(coefficient(x)) over the two outputs.

Hidden states arrive [batch, sequence, hidden]; the router and dispatcher see Megatron's [sequence, batch] token
order. At expert-parallel size 1 the dispatcher is `LocalDispatcher` (gpt/moe/dispatcher.py). Under tensor
parallelism the layer runs on this TP rank's sequence slice (sequence parallelism, which Megatron-Core requires
with TP), and the experts are whole (expert TP 1) or split over the expert tensor-parallel group, any size the grid
takes (gpt/moe/experts.py), the dispatcher gathering the peers' rows.
"""

from __future__ import annotations

import functools
from typing import Callable, Optional, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from base.errors import ConfigError
from gpt.glu import SWIGLU, GatedActivation, gated_activation
from gpt.mlp import activation_function
from gpt.moe.balancing import MoELossTracker
from gpt.moe.deepspeed_gating import deepspeed_gate
from gpt.moe.dispatcher import LocalDispatcher, TokenDispatcher, choices_of
from gpt.moe.expert_rows import capacity_routing, choices_per_expert
from gpt.moe.experts import ExpertMLP, Experts, expert_linear
from gpt.moe.router import TopKRouter, padded_capacity
from gpt.moe.settings import MoESettings
from parallel.init import InitMethod
from parallel.layers import meta_parameter
from parallel.mappings import copy_to_tensor_parallel_region
from parallel.state import ParallelState


class SharedExperts(ExpertMLP):
    """SharedExpertMLP: one MLP every token passes through, optionally gated per token."""

    def __init__(self, hidden_size: int, ffn_size: int, *, activation: Callable[[torch.Tensor], torch.Tensor],
                 swiglu: bool, init_std: float, output_init_std: float, bias: bool, gate: bool, xielu: bool = False,
                 glu: GatedActivation = SWIGLU):
        super().__init__(hidden_size, ffn_size, swiglu=swiglu, init_std=init_std, output_init_std=output_init_std,
                         bias=bias, xielu=xielu)
        self.activation, self.xielu, self.glu = activation, xielu, glu
        if gate:
            self.gate_weight = meta_parameter((1, hidden_size), InitMethod.normal(init_std))
        else:
            self.gate_weight = None

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        inputs = [expert_linear(linear, hidden) for linear in self.input_linears()]
        if self.xielu:
            activated = self.activation_func(inputs[0])
        else:
            activated = self.glu(inputs[0], inputs[1]) if self.swiglu else self.activation(inputs[0])
        output = expert_linear(self.dense_4h_to_h, activated)
        if self.gate_weight is not None:
            output = output * torch.sigmoid(F.linear(hidden, self.gate_weight))
        return output


class TensorParallelSharedExperts(nn.Module):
    """SharedExpertMLP under tensor parallelism (Megatron-Core's shared_experts.py: its linear_fc1 column- and
    linear_fc2 row-parallel, with sequence parallelism's gather before fc1 and reduce-scatter after fc2, as the
    dense MLP): built through the plan (gpt/parallel_plan.py, `mlp.shared_experts.*`), so its weights are split
    over the TP ranks under the same names as SharedExperts'. It takes the layer's [batch, sequence slice, hidden]
    and gives the slice's output; the gate (per token, on the slice) has its gradient summed over TP, as Megatron
    marks gate_weight sequence_parallel."""

    def __init__(self, hidden_size: int, ffn_size: int, *, plan, activation: Callable[[torch.Tensor], torch.Tensor],
                 swiglu: bool, init_std: float, output_init_std: float, bias: bool, gate: bool,
                 glu: GatedActivation = SWIGLU):
        super().__init__()
        self.state, self.activation, self.swiglu, self.glu = plan.state, activation, swiglu, glu
        for name in (("dense_h_to_4h_gate", "dense_h_to_4h_up") if swiglu else ("dense_h_to_4h",)):
            self.add_module(name, plan.linear(f"mlp.shared_experts.{name}", hidden_size, ffn_size, init_std=init_std,
                                              bias=bias))
        self.dense_4h_to_h = plan.linear("mlp.shared_experts.dense_4h_to_h", ffn_size, hidden_size,
                                         init_std=output_init_std, bias=bias)
        if gate:
            self.gate_weight = meta_parameter((1, hidden_size), InitMethod.normal(init_std))
        else:
            self.gate_weight = None

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        first = self.dense_h_to_4h_gate if self.swiglu else self.dense_h_to_4h
        with first.entered(hidden) as whole:  # the sequence all-gathered once for the input projections
            if self.swiglu:
                up = self.dense_h_to_4h_up
                activated = self.glu(first.linear(whole, first.weight, first.bias),
                                     up.linear(whole, up.weight, up.bias))
            else:
                activated = self.activation(first.linear(whole, first.weight, first.bias))
        output = self.dense_4h_to_h(activated)
        if self.gate_weight is not None:
            gate = copy_to_tensor_parallel_region(self.gate_weight, self.state)
            output = output * torch.sigmoid(F.linear(hidden, gate))
        return output


def shared_experts_of(hidden_size: int, settings: MoESettings, *, state: ParallelState, plan, xielu: bool,
                      **mlp) -> Optional[nn.Module]:
    """The MoE layer's shared experts (--moe-shared-expert-intermediate-size; None without it): under tensor
    parallelism split through the sequence-parallel `plan`, else whole. `mlp`: the experts' activation, init
    stds, bias and gated activation."""
    size = settings.shared_expert_intermediate_size
    if size is not None and state.tensor_parallel_size > 1:
        if plan is None or not plan.sequence_parallel:
            raise ValueError("shared experts under tensor parallelism are built through a sequence-parallel plan")
        return TensorParallelSharedExperts(hidden_size, size, plan=plan, gate=settings.shared_expert_gate, **mlp)
    if size is not None:
        return SharedExperts(hidden_size, size, gate=settings.shared_expert_gate, xielu=xielu, **mlp)
    return None


def residual_moe_of(hidden_size: int, settings: MoESettings, *, init_std: float,
                    **mlp) -> tuple[Optional[SharedExperts], Optional[nn.Module]]:
    """--mlp-type residual's dense MLP and its mixing coefficient (DeepSpeed's MoE(use_residual=True)), or (None,
    None). DeepSpeed's MoE keeps the expert module it was given as `mlp` (the experts are its copies): an MLP like
    each expert, dense (every rank holds it, reduced over data parallelism as any dense weight)."""
    if not settings.deepspeed.use_residual:
        return None, None
    residual_mlp = SharedExperts(hidden_size, settings.ffn_hidden_size, init_std=init_std, gate=False, **mlp)
    # nn.Linear(hidden_size, 2) there, with its bias; drawn here as every weight (normal(init_std), the bias zero:
    # the two outputs start mixed half and half), not by torch's default uniform draw
    coefficient = nn.Module()
    coefficient.weight = meta_parameter((2, hidden_size), InitMethod.normal(init_std))
    coefficient.bias = meta_parameter((2,), InitMethod.zeros())
    return residual_mlp, coefficient


class MoELayer(nn.Module):
    def __init__(self, hidden_size: int, settings: MoESettings, *, state: ParallelState,
                 activation: Callable[[torch.Tensor], torch.Tensor], swiglu: bool, init_std: float,
                 output_init_std: float, bias: bool, layer_number: int = 0,
                 tracker: Optional[MoELossTracker] = None, dispatcher: Optional[TokenDispatcher] = None,
                 local_experts: Optional[Sequence[int]] = None, xielu: bool = False, plan=None,
                 glu: GatedActivation = SWIGLU):
        """`dispatcher` and `local_experts` (the global indices of this rank's experts, in the order the
        dispatcher groups their rows): an expert-parallel dispatcher and its rank's share; by default
        LocalDispatcher and every expert. `plan` (gpt/parallel_plan.py's TensorParallelPlan): under tensor
        parallelism, how the shared experts split over the TP ranks. `glu`: the gated activation of `swiglu`
        (gated) experts (gpt/glu.py)."""
        super().__init__()
        self.settings = settings
        # DeepSpeed-MoE's gate has no bias (sharded_moe.TopKGate: Linear(model_dim, num_experts, bias=False))
        self.router = TopKRouter(hidden_size, settings, init_std=init_std,
                                 bias=bias and settings.deepspeed.gating != "deepspeed", state=state,
                                 layer_number=layer_number, tracker=tracker)
        if dispatcher is None and state.experts.tensor_size > 1:
            raise ValueError("experts split over the expert tensor-parallel group need a dispatcher that gathers "
                             "their peers' rows (gpt/parallel_plan.py TensorParallelPlan.experts)")
        # Held by the expert-parallel ranks' share only, or (tensor parallelism with expert TP 1) each TP rank's
        # experts see its own sequence slice: ZeRO reduces them over the expert data-parallel group
        # (zero/experts.py), as Megatron-Core's experts (allreduce = False); their records say so.
        expert_parallel = (local_experts is not None and len(local_experts) < settings.num_experts) \
            or state.expert_grid is not None
        self.experts = Experts(settings.num_experts, hidden_size, settings.ffn_hidden_size, activation=activation,
                               swiglu=swiglu, init_std=init_std, output_init_std=output_init_std, bias=bias,
                               expert_ids=local_experts, xielu=xielu,
                               tensor_parallel=state.experts if dispatcher is not None else None, comm=state.comm,
                               expert_parallel=expert_parallel, glu=glu)
        self.dispatcher = dispatcher if dispatcher is not None else LocalDispatcher(settings.num_experts)
        mlp = dict(activation=activation, swiglu=swiglu, init_std=init_std, output_init_std=output_init_std,
                   bias=bias, glu=glu)
        self.shared_experts = shared_experts_of(hidden_size, settings, state=state, plan=plan, xielu=xielu, **mlp)
        self.residual_mlp, self.coefficient = residual_moe_of(hidden_size, settings, **mlp)
        self.last_tokens_per_expert: Optional[torch.Tensor] = None

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        batch, seq, width = hidden.shape
        tokens = hidden.transpose(0, 1).reshape(seq * batch, width)  # Megatron's [s, b] order
        if self.settings.deepspeed.gating == "deepspeed":
            if tokens.is_meta:  # no gating decision exists there (see _balanced_on_meta)
                k = self.settings.router_topk
                output = self._balanced_on_meta(tokens, tokens.new_ones(tokens.shape[0], k) / k)
            else:
                output = self._experts_of(tokens, *deepspeed_gate(self.router, tokens, self.training))
        else:
            probs, routing_map = self.router(tokens, seq, batch)
            if tokens.is_meta:
                output = self._balanced_on_meta(tokens, probs)
            else:
                output = self._routed(tokens, probs, routing_map)
        if isinstance(self.shared_experts, TensorParallelSharedExperts):  # on the sequence-parallel slice
            return output.view(seq, batch, width).transpose(0, 1) + self.shared_experts(hidden)
        if self.shared_experts is not None:
            output = output + self.shared_experts(tokens)
        if self.residual_mlp is not None:
            output = self.residual_mixed(tokens, output)
        return output.view(seq, batch, width).transpose(0, 1)

    def residual_mixed(self, tokens: torch.Tensor, moe_output: torch.Tensor) -> torch.Tensor:
        """DeepSpeed's residual MoE: the experts' output and the dense MLP's, weighted per token by the softmax
        of the coefficient's two logits (deepspeed/moe/layer.py MoE.forward)."""
        coef = F.softmax(F.linear(tokens, self.coefficient.weight, self.coefficient.bias), dim=-1)
        return moe_output * coef[..., 0:1] + self.residual_mlp(tokens) * coef[..., 1:]

    def _routed(self, tokens: torch.Tensor, probs: torch.Tensor, routing_map: torch.Tensor) -> torch.Tensor:
        settings = self.settings
        if settings.pad_expert_input_to_capacity:  # every expert takes exactly its capacity: shapes, no reads
            capacity = padded_capacity(tokens.shape[0], settings.num_experts, settings.router_topk,
                                       settings.expert_capacity_factor)
            rows, tokens_per_expert = self.dispatcher.dispatch_to_capacity(
                tokens, capacity_routing(probs, routing_map, capacity))
            self._count_tokens(torch.full((settings.num_experts,), capacity, dtype=torch.int64, device=tokens.device))
            return self.dispatcher.combine(self.experts(rows, tokens_per_expert))
        # at most k choices a token without padding (dropless, or dropping past the capacity)
        return self._experts_of(tokens, *choices_of(probs, routing_map, settings.router_topk))

    def _experts_of(self, tokens: torch.Tensor, choice_probs: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
        rows, tokens_per_expert = self.dispatcher.dispatch(tokens, choice_probs, indices)
        self._count_tokens(choices_per_expert(indices.detach(), self.settings.num_experts))
        return self.dispatcher.combine(self.experts(rows, tokens_per_expert))

    def _count_tokens(self, routed: torch.Tensor) -> None:
        """This rank's rows per expert, every expert (under expert parallelism the dispatcher's count is of the local
        experts' received rows), on the device: what the expert bias and the logs reduce over the data-parallel ranks
        once per iteration, as Megatron-Core's router counts its own tokens (router.py, local_tokens_per_expert)."""
        self.last_tokens_per_expert = routed
        tracker = self.router.tracker
        if tracker is not None and self.training and torch.is_grad_enabled():
            tracker.count_tokens(self.router.layer_number, routed)

    def _balanced_on_meta(self, tokens: torch.Tensor, probs: torch.Tensor) -> torch.Tensor:
        """On the meta device (the planner's dry run, planner/dry_run.py) no routing decision exists: every
        token's k rows go to the experts in equal shares, so shapes, parameters and the experts' activations
        have the sizes of a balanced step; under expert parallelism the dispatcher's exchanges run for that
        routing (its dispatch_balanced)."""
        k = self.settings.router_topk
        balanced = getattr(self.dispatcher, "dispatch_balanced", None)
        if balanced is not None:
            # an expert-parallel dispatcher (gpt/moe/dispatchers.py) runs its exchanges for the same routing, so
            # the plan counts their bytes; each row's weight as below
            choice_probs = (probs.sum(dim=-1, keepdim=True) / k).expand(tokens.shape[0], k)
            rows, sizes = balanced(tokens, choice_probs)
            return self.dispatcher.combine(self.experts(rows, sizes))
        rows = tokens.repeat_interleave(k, dim=0)
        experts = len(self.experts._modules)  # this rank's
        sizes = [rows.shape[0] // experts + (expert < rows.shape[0] % experts) for expert in range(experts)]
        outputs = self.experts(rows, sizes)  # a list of sizes: the loop (through the module: hooks see it)
        weights = probs.sum(dim=-1, keepdim=True).repeat_interleave(k, dim=0).to(outputs.dtype) / k
        return (outputs * weights).view(tokens.shape[0], k, -1).sum(dim=1)


def build_moe_layer(config, plan, spec, layer_number: int, tracker: Optional[MoELossTracker]) -> MoELayer:
    """An `E` layer's MoE layer (gpt/layer_spec.py) of its settings `spec.moe`: its experts this rank's share under
    expert parallelism, dispatched as the plan says (gpt/parallel_plan.py), each the MLP section's (gated or not)."""
    if plan.state.tensor_parallel_size > 1 and not plan.sequence_parallel:
        raise ConfigError("an MoE layer under tensor parallelism runs on the sequence-parallel slices: add "
                          "--sequence-parallel (Megatron-Core's MoELayer requires it with TP)",
                          flags=("--sequence-parallel", "--num-experts"))
    mlp = config.mlp
    dispatcher, local_experts = plan.experts(spec.moe.num_experts)
    return MoELayer(config.hidden_size, spec.moe, state=plan.state,
                    activation=functools.partial(activation_function, mlp.activation), swiglu=mlp.gated,
                    glu=gated_activation(mlp), init_std=config.init_method_std,
                    output_init_std=config.output_init_std, bias=config.add_bias_linear, layer_number=layer_number,
                    tracker=tracker, dispatcher=dispatcher, local_experts=local_experts,
                    xielu=mlp.activation == "xielu", plan=plan)
