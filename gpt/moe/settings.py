"""The MoE settings as one frozen view (as gpt/architecture.py is for the blocks): built from ModelConfig's
fields, which are Megatron-LM's argument dests (--num-experts, --moe-router-topk, ...), and holding the rules
that read them together (megatron/core/transformer/transformer_config.py, TransformerConfig.__post_init__;
megatron/training/arguments.py, validate_args and moe_freq_type)."""

from __future__ import annotations

import argparse
from argparse import ArgumentTypeError
from dataclasses import dataclass
from typing import Optional, Union

from base.errors import ConfigError
from gpt.layer_pattern import layer_flags

LOAD_BALANCING_TYPES = ("aux_loss", "seq_aux_loss", "global_aux_loss", "sinkhorn", "none")
SCORE_FUNCTIONS = ("softmax", "sigmoid")
DROP_POLICIES = ("probs", "position")
ROUTER_DTYPES = ("fp32", "fp64")


def num_experts_value(text: str):
    """--num-experts: Megatron-LM's int, or Megatron-DeepSpeed's list (its default `[1]`, `type=int, nargs='+'`)
    given as one text: one count (1, one expert: the dense MLP, and 0, Megatron-LM's "no MoE", are None, the dense
    model), or a count per MoE layer (a tuple where they differ: PR-MoE's pyramid, "32 32 ... 64 64")."""
    values = str(text).strip().strip("[]()").replace(",", " ").split()
    try:
        numbers = [int(value) for value in values]
    except ValueError:
        raise ArgumentTypeError(f"invalid int value: {text!r}") from None
    if not numbers:
        raise ArgumentTypeError(f"invalid int value: {text!r}")
    return expert_counts(numbers)


def expert_counts(numbers) -> Optional[Union[int, tuple[int, ...]]]:
    """One count for every MoE layer (None: the dense model), or a tuple of counts per MoE layer where they differ
    (Megatron-DeepSpeed's get_num_experts_per_layer: a count <= 1 there is a dense layer)."""
    numbers = [1 if number is None else int(number) for number in numbers]
    if len(set(numbers)) == 1:
        return None if numbers[0] in (0, 1) else numbers[0]
    return tuple(numbers)


def largest_expert_count(value) -> Optional[int]:
    """The most experts any MoE layer has (None: a dense model), for --num-experts' int or per-layer tuple."""
    if isinstance(value, (tuple, list)):
        value = max(value)
    return None if not value or value == 1 else int(value)


class OneExpertCount(argparse.Action):
    """--num-experts N (Megatron-LM), or N N ... one per MoE layer (Megatron-DeepSpeed's nargs='+'): one count,
    or a tuple of counts where they differ (expert_counts)."""

    def __call__(self, parser, namespace, values, option_string=None):
        numbers = []
        for value in (values if isinstance(values, list) else [values]):
            numbers.extend(value if isinstance(value, tuple) else [value])
        setattr(namespace, self.dest, expert_counts(numbers))


def experts_per_layer(counts, num_layers: int, expert_interval: int) -> tuple[int, ...]:
    """Each layer's experts (1: a dense layer) under Megatron-DeepSpeed's rule (megatron/model/transformer.py,
    get_num_experts_per_layer): layer l (1-based) is an MoE layer when l % expert_interval == 0 and takes the
    ((l - 1) // expert_interval)-th count; one count serves every MoE layer, else the list has one per MoE layer
    (num_layers // expert_interval of them; Megatron-DeepSpeed asserts it)."""
    counts = list(counts) if isinstance(counts, (tuple, list)) else [counts or 1]
    moe_layers = num_layers // expert_interval
    if len(counts) not in (1, moe_layers):
        raise ConfigError(f"--num-experts gives {len(counts)} counts: it takes one, or one per MoE layer "
                          f"(--num-layers {num_layers} // --expert-interval {expert_interval} = {moe_layers}), as "
                          f"Megatron-DeepSpeed asserts", flags=("--num-experts", "--num-layers", "--expert-interval"))
    if len(counts) == 1:
        counts = counts * moe_layers
    return tuple(counts[(layer - 1) // expert_interval] if layer % expert_interval == 0 else 1
                 for layer in range(1, num_layers + 1))


def moe_freq_value(text: str):
    """--moe-layer-freq's value as Megatron-LM's moe_freq_type keeps it: an int, or the list expression's text
    (read by moe_layer_pattern)."""
    text = str(text).strip()
    if "[" in text:
        return text
    try:
        return int(text)
    except ValueError:
        return text  # refused with the launch's other problems (moe_layer_pattern)


def moe_layer_pattern(freq: str, num_layers: int) -> tuple[bool, ...]:
    """Which layers are MoE layers, from --moe-layer-freq as Megatron-LM reads it (arguments.py moe_freq_type,
    and TransformerBlock's get_transformer_block_with_experimental_attention_variant_spec / the layer specs:
    an int N puts an MoE layer at every layer i with i % N == 0; a list expression such as "([1]*3+[0]*1)*3"
    gives one 0/1 per layer). Megatron evaluates the expression with eval(); here only list literals of
    0 and 1, +, * and parentheses are read."""
    text = str(freq).strip()
    if "[" not in text:
        try:
            every = int(text)
        except ValueError:
            raise ConfigError(f"--moe-layer-freq {text!r} is neither an integer nor a list expression such as "
                              f"'([1]*3+[0]*1)*2'", flags=("--moe-layer-freq",)) from None
        if every < 1:
            raise ConfigError(f"--moe-layer-freq must be at least 1, got {every}", flags=("--moe-layer-freq",))
        return tuple(layer % every == 0 for layer in range(num_layers))
    pattern = layer_flags(text, "--moe-layer-freq", num_layers, "0 (dense) or 1 (MoE)")
    return tuple(bool(value) for value in pattern)


@dataclass(frozen=True)
class MoESettings:
    """One MoE layer's settings; Megatron-Core's TransformerConfig field of the same name (less `moe_`)."""
    num_experts: int
    ffn_hidden_size: int
    router_topk: int = 2
    router_score_function: str = "softmax"
    router_pre_softmax: bool = False
    router_topk_scaling_factor: Optional[float] = None
    router_dtype: Optional[str] = None
    router_num_groups: Optional[int] = None
    router_group_topk: Optional[int] = None
    router_enable_expert_bias: bool = False
    router_bias_update_rate: float = 1e-3
    router_force_load_balancing: bool = False
    router_load_balancing_type: str = "aux_loss"
    aux_loss_coeff: float = 0.0
    z_loss_coeff: Optional[float] = None
    expert_capacity_factor: Optional[float] = None
    pad_expert_input_to_capacity: bool = False
    token_drop_policy: str = "probs"
    shared_expert_intermediate_size: Optional[int] = None
    shared_expert_gate: bool = False
    grouped_gemm: bool = True
    # DeepSpeed-MoE's gating (gpt/moe/deepspeed_gating.py), for a Megatron-DeepSpeed launch
    gating: str = "megatron"
    train_capacity_factor: float = 1.0
    eval_capacity_factor: float = 1.0
    min_capacity: int = 4
    drop_tokens: bool = True
    loss_coeff: float = 0.1
    second_expert_sampling: bool = True
    # --mlp-type residual (PR-MoE, DeepSpeed-MoE's MoE(use_residual=True)): a dense MLP beside the experts, the two
    # outputs mixed per token by softmax(coefficient(x)), a Linear(hidden, 2)
    use_residual: bool = False

    def validate(self) -> None:
        """TransformerConfig.__post_init__'s MoE checks, each as one line naming the flags."""
        experts = self.num_experts
        if self.gating == "deepspeed":
            if not 1 <= self.router_topk <= experts:
                raise ConfigError(f"--topk {self.router_topk} must be between 1 and --num-experts {experts}",
                                  flags=("--topk", "--num-experts"))
            if self.min_capacity < 0 or self.train_capacity_factor <= 0 or self.eval_capacity_factor <= 0 \
                    or self.loss_coeff < 0:
                raise ConfigError("--moe-train-capacity-factor and --moe-eval-capacity-factor must be positive, "
                                  "--moe-min-capacity and --moe-loss-coeff not negative",
                                  flags=("--moe-train-capacity-factor", "--moe-min-capacity"))
            return
        if not 1 <= self.router_topk <= experts:
            raise ConfigError(f"--moe-router-topk {self.router_topk} must be between 1 and --num-experts {experts}",
                              flags=("--moe-router-topk", "--num-experts"))
        if self.router_score_function not in SCORE_FUNCTIONS:
            raise ConfigError(f"--moe-router-score-function {self.router_score_function} is not implemented: "
                              f"use {' or '.join(SCORE_FUNCTIONS)}", flags=("--moe-router-score-function",))
        if self.router_load_balancing_type not in LOAD_BALANCING_TYPES:
            raise ConfigError(f"--moe-router-load-balancing-type {self.router_load_balancing_type} is not "
                              f"implemented: use one of {', '.join(LOAD_BALANCING_TYPES)}",
                              flags=("--moe-router-load-balancing-type",))
        if self.router_dtype is not None and self.router_dtype not in ROUTER_DTYPES:
            raise ConfigError(f"--moe-router-dtype {self.router_dtype} is not one of {', '.join(ROUTER_DTYPES)}",
                              flags=("--moe-router-dtype",))
        if self.token_drop_policy not in DROP_POLICIES:
            raise ConfigError(f"--moe-token-drop-policy {self.token_drop_policy} is not one of "
                              f"{', '.join(DROP_POLICIES)}", flags=("--moe-token-drop-policy",))
        if self.ffn_hidden_size < 1:
            raise ConfigError(f"--moe-ffn-hidden-size must be at least 1, got {self.ffn_hidden_size}",
                              flags=("--moe-ffn-hidden-size",))
        if self.aux_loss_coeff < 0 or (self.z_loss_coeff or 0.0) < 0:
            raise ConfigError("--moe-aux-loss-coeff and --moe-z-loss-coeff must not be negative",
                              flags=("--moe-aux-loss-coeff", "--moe-z-loss-coeff"))
        # Megatron: "Please use --moe-router-pre-softmax when topk is 1" (a softmax over one score has no gradient)
        if (self.router_topk == 1 and self.router_score_function == "softmax" and not self.router_pre_softmax
                and self.router_load_balancing_type != "sinkhorn"):
            raise ConfigError("--moe-router-topk 1 with the softmax score needs --moe-router-pre-softmax: a softmax "
                              "over the one chosen score is 1 and gives the router no gradient (as Megatron-LM "
                              "asserts)", flags=("--moe-router-topk", "--moe-router-pre-softmax"))
        if self.router_load_balancing_type == "sinkhorn" and self.aux_loss_coeff > 0:
            raise ConfigError("--moe-router-load-balancing-type sinkhorn balances without an auxiliary loss: set "
                              "--moe-aux-loss-coeff 0 (as Megatron-LM asserts)",
                              flags=("--moe-router-load-balancing-type", "--moe-aux-loss-coeff"))
        if self.router_group_topk is not None or self.router_num_groups is not None:
            groups, group_topk = self.router_num_groups, self.router_group_topk
            if not groups or not group_topk:
                raise ConfigError("group-limited routing needs both --moe-router-num-groups and "
                                  "--moe-router-group-topk", flags=("--moe-router-num-groups", "--moe-router-group-topk"))
            if experts % groups or not 1 <= group_topk <= groups or self.router_topk % group_topk:
                raise ConfigError(f"--moe-router-num-groups {groups} must divide --num-experts {experts}, "
                                  f"--moe-router-group-topk {group_topk} must be at most the groups and divide "
                                  f"--moe-router-topk {self.router_topk}",
                                  flags=("--moe-router-num-groups", "--moe-router-group-topk"))
            if self.router_topk // group_topk > experts // groups:
                # Megatron-Core's group_limited_topk takes the top topk/group_topk scores of each group: past the
                # group's experts it is torch.topk's "selected index k out of range" (a traceback, there and before)
                raise ConfigError(f"--moe-router-topk {self.router_topk} over --moe-router-group-topk {group_topk} "
                                  f"groups takes {self.router_topk // group_topk} experts of each, more than the "
                                  f"{experts // groups} of a group (--num-experts {experts} / --moe-router-num-groups "
                                  f"{groups})", flags=("--moe-router-topk", "--moe-router-group-topk",
                                                       "--moe-router-num-groups"))
        if self.router_enable_expert_bias and self.router_score_function != "sigmoid":
            raise ConfigError("--moe-router-enable-expert-bias (aux-loss-free balancing) needs "
                              "--moe-router-score-function sigmoid (as Megatron-LM requires)",
                              flags=("--moe-router-enable-expert-bias", "--moe-router-score-function"))
        if self.expert_capacity_factor is not None:
            if self.router_load_balancing_type == "sinkhorn":
                raise ConfigError("--moe-expert-capacity-factor works with aux_loss, seq_aux_loss, global_aux_loss "
                                  "or none load balancing (as Megatron-LM requires), not sinkhorn",
                                  flags=("--moe-expert-capacity-factor", "--moe-router-load-balancing-type"))
        elif self.pad_expert_input_to_capacity:
            raise ConfigError("--moe-pad-expert-input-to-capacity needs --moe-expert-capacity-factor",
                              flags=("--moe-pad-expert-input-to-capacity", "--moe-expert-capacity-factor"))
        if self.shared_expert_intermediate_size is not None and self.shared_expert_intermediate_size < 1:
            raise ConfigError("--moe-shared-expert-intermediate-size must be at least 1",
                              flags=("--moe-shared-expert-intermediate-size",))
        if self.shared_expert_gate and self.shared_expert_intermediate_size is None:
            raise ConfigError("--moe-shared-expert-gate gates the shared expert: give "
                              "--moe-shared-expert-intermediate-size", flags=("--moe-shared-expert-gate",))

    @property
    def dropless(self) -> bool:
        return self.expert_capacity_factor is None

    def aux_loss_coeff_of(self, kind: str) -> float:
        """Megatron's TopKRouter.get_aux_loss_coeff: the coefficient when `kind` is the balancing type."""
        return self.aux_loss_coeff if self.router_load_balancing_type == kind else 0.0
