"""Megatron-Core's MoELayer: route, dispatch, run the experts, combine, and add the shared experts' output (optionally
gated); with --mlp-type residual, DeepSpeed's residual MoE mixes a dense MLP in per token. The router and dispatcher see
tokens in Megatron's [sequence, batch] order."""

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
    """SharedExpertMLP under tensor parallelism: column- then row-parallel through the plan, under the same names as
    SharedExperts, on the layer's sequence slice; the gate's gradient is summed over TP."""

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
        with first.entered(hidden) as whole:  # the sequence all-gathered once for both input projections
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
    """The shared experts (None without --moe-shared-expert-intermediate-size): split through the plan under TP, else
    whole."""
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
    """--mlp-type residual's dense MLP and mixing coefficient (DeepSpeed's MoE(use_residual=True)), or (None, None)."""
    if not settings.deepspeed.use_residual:
        return None, None
    residual_mlp = SharedExperts(hidden_size, settings.ffn_hidden_size, init_std=init_std, gate=False, **mlp)
    # nn.Linear(hidden, 2) in DeepSpeed; drawn here as every weight (normal, bias zero), not torch's uniform default
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
        """`dispatcher` and `local_experts`: an expert-parallel dispatcher and this rank's global expert indices; by
        default LocalDispatcher and every expert."""
        super().__init__()
        self.settings = settings
        # DeepSpeed-MoE's gate has no bias
        self.router = TopKRouter(hidden_size, settings, init_std=init_std,
                                 bias=bias and settings.deepspeed.gating != "deepspeed", state=state,
                                 layer_number=layer_number, tracker=tracker)
        if dispatcher is None and state.experts.tensor_size > 1:
            raise ValueError("experts split over the expert tensor-parallel group need a dispatcher that gathers "
                             "their peers' rows (gpt/parallel_plan.py TensorParallelPlan.experts)")
        # Experts held by a share of ranks reduce over the expert data-parallel group, as Megatron-Core's (allreduce =
        # False).
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
            if tokens.is_meta:  # no gating decision exists there
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
        """DeepSpeed's residual MoE: experts' and dense MLP's outputs weighted per token by softmax of the
        coefficient."""
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
        return self._experts_of(tokens, *choices_of(probs, routing_map, settings.router_topk))

    def _experts_of(self, tokens: torch.Tensor, choice_probs: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
        rows, tokens_per_expert = self.dispatcher.dispatch(tokens, choice_probs, indices)
        self._count_tokens(choices_per_expert(indices.detach(), self.settings.num_experts))
        return self.dispatcher.combine(self.experts(rows, tokens_per_expert))

    def _count_tokens(self, routed: torch.Tensor) -> None:
        """This rank's rows per expert on the device, reduced over DP once per iteration for the expert bias and logs
        (Megatron's local_tokens_per_expert)."""
        self.last_tokens_per_expert = routed
        tracker = self.router.tracker
        if tracker is not None and self.training and torch.is_grad_enabled():
            tracker.count_tokens(self.router.layer_number, routed)

    def _balanced_on_meta(self, tokens: torch.Tensor, probs: torch.Tensor) -> torch.Tensor:
        """On the meta device (the planner's dry run) no routing exists: tokens go to experts in equal shares, so shapes
        and exchanges are those of a balanced step."""
        k = self.settings.router_topk
        balanced = getattr(self.dispatcher, "dispatch_balanced", None)
        if balanced is not None:
            # an expert-parallel dispatcher runs its exchanges for the same routing, so the plan counts their bytes
            choice_probs = (probs.sum(dim=-1, keepdim=True) / k).expand(tokens.shape[0], k)
            rows, sizes = balanced(tokens, choice_probs)
            return self.dispatcher.combine(self.experts(rows, sizes))
        rows = tokens.repeat_interleave(k, dim=0)
        experts = len(self.experts._modules)
        sizes = [rows.shape[0] // experts + (expert < rows.shape[0] % experts) for expert in range(experts)]
        outputs = self.experts(rows, sizes)  # a list of sizes: the loop, through the module so hooks see it
        weights = probs.sum(dim=-1, keepdim=True).repeat_interleave(k, dim=0).to(outputs.dtype) / k
        return (outputs * weights).view(tokens.shape[0], k, -1).sum(dim=1)


def build_moe_layer(config, plan, spec, layer_number: int, tracker: Optional[MoELossTracker]) -> MoELayer:
    """An `E` layer's MoE layer of `spec.moe`, dispatched as the plan says."""
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
