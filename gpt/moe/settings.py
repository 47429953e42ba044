"""The MoE section of the model settings: Megatron-LM's --num-experts and --moe-* flags and the rules TransformerConfig
and validate_args apply to them."""

from __future__ import annotations

import argparse
import dataclasses
from argparse import ArgumentTypeError
from dataclasses import dataclass
from typing import ClassVar, Optional, Union

from base.errors import ConfigError
from base.options import SETTING, option, section
from gpt.layer_pattern import freq_value, layer_flags
from gpt.moe.deepspeed_gating import DeepSpeedMoESettings

LOAD_BALANCING_TYPES = ("aux_loss", "seq_aux_loss", "global_aux_loss", "sinkhorn", "none")
SCORE_FUNCTIONS = ("softmax", "sigmoid")
DROP_POLICIES = ("probs", "position")
ROUTER_DTYPES = ("fp32", "fp64")


def num_experts_value(text: str):
    """--num-experts: Megatron-LM's int or Megatron-DeepSpeed's list; 0 or 1 is the dense model (None), differing counts
    a tuple (PR-MoE)."""
    values = str(text).strip().strip("[]()").replace(",", " ").split()
    try:
        numbers = [int(value) for value in values]
    except ValueError:
        raise ArgumentTypeError(f"invalid int value: {text!r}") from None
    if not numbers:
        raise ArgumentTypeError(f"invalid int value: {text!r}")
    return expert_counts(numbers)


def expert_counts(numbers) -> Optional[Union[int, tuple[int, ...]]]:
    """One count for every MoE layer (None: dense), or a tuple where they differ."""
    numbers = [1 if number is None else int(number) for number in numbers]
    if len(set(numbers)) == 1:
        return None if numbers[0] in (0, 1) else numbers[0]
    return tuple(numbers)


def largest_expert_count(value) -> Optional[int]:
    if isinstance(value, (tuple, list)):
        value = max(value)
    return None if not value or value == 1 else int(value)


class OneExpertCount(argparse.Action):
    """--num-experts N, or N N ... one per MoE layer (Megatron-DeepSpeed's nargs='+')."""

    def __call__(self, parser, namespace, values, option_string=None):
        numbers = []
        for value in (values if isinstance(values, list) else [values]):
            numbers.extend(value if isinstance(value, tuple) else [value])
        setattr(namespace, self.dest, expert_counts(numbers))


def experts_per_layer(counts, num_layers: int, expert_interval: int) -> tuple[int, ...]:
    """Each layer's experts (1: dense) under Megatron-DeepSpeed's get_num_experts_per_layer: layer l (1-based) is MoE
    when l % expert_interval == 0."""
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


def moe_layer_pattern(freq: str, num_layers: int) -> tuple[bool, ...]:
    """Which layers are MoE, from --moe-layer-freq as Megatron-LM reads it: an int N puts MoE at every i % N == 0; a
    list expression like "([1]*3+[0]*1)*3" gives one 0/1 per layer. Only list literals, +, * and parentheses are read
    (Megatron uses eval())."""
    text = str(freq).strip()
    if "[" not in text:
        try:
            every = int(text)
        except ValueError:
            raise ConfigError(f"--moe-layer-freq {text!r} is neither an integer nor a list expression such as "
                              f"'([1]*3+[0]*1)*2'", flags=("--moe-layer-freq",)) from None
        if every == 0:  # Megatron-LM's `i % 0` is a ZeroDivisionError
            raise ConfigError("--moe-layer-freq 0 places no layer: give N for an MoE layer every N layers",
                              flags=("--moe-layer-freq",))
        # Python's `%` as Megatron-LM's: a negative -N places the layers N does
        return tuple(layer % every == 0 for layer in range(num_layers))
    pattern = layer_flags(text, "--moe-layer-freq", num_layers, "0 (dense) or 1 (MoE)")
    return tuple(bool(value) for value in pattern)


@dataclass(frozen=True)
class MoESettings:
    """The MoE section: fields named as Megatron-Core's TransformerConfig fields less `moe_`. ModelConfig.moe_of(layer)
    gives one MoE layer's section."""
    SETTING_PREFIX: ClassVar[str] = "moe_"

    # Without --num-experts (or with 1) every MLP is dense and the rest has no effect
    num_experts: Union[None, int, tuple] = option(
        None, setting="num_experts", type=num_experts_value, nargs="+", action=OneExpertCount, metavar="N",
        help="experts per MoE layer (Megatron-Core's MoE layer: a top-k router, the experts, balancing losses); "
             "default (or 1): a dense MLP; a Megatron-DeepSpeed launch (DeepSpeed-MoE's gating) may give one count "
             "per MoE layer (PR-MoE's pyramid: 32 ... 32 64 64)")
    ffn_hidden_size: Optional[int] = option(None, help="each expert's hidden size (default: "
                                                                        "--ffn-hidden-size)")
    layer_freq: Union[int, str] = option(
        1, type=freq_value, help="N: an MoE layer at every layer i with i mod N == 0, dense between; or a list "
                               "expression with one 0 (dense) or 1 (MoE) per layer, e.g. '([1]*3+[0]*1)*2'")
    router_topk: int = option(2, help="experts per token")
    router_score_function: str = option("softmax",
                                            help="softmax or sigmoid scores (sigmoid: normalised over the top k)")
    router_pre_softmax: bool = option(False, action="store_true",
                                          help="softmax over all experts before the top-k (else over the top k)")
    router_topk_scaling_factor: Optional[float] = option(None,
                                                             help="multiply the top-k weights by this")
    router_dtype: Optional[str] = option(None, choices=("fp32", "fp64"),
                                             help="the router's logits and scores in this precision")
    router_num_groups: Optional[int] = option(None,
                                                  help="group-limited routing: the experts in this many groups")
    router_group_topk: Optional[int] = option(None,
                                                  help="group-limited routing: each token chooses in this many groups")
    # Megatron-Core's deprecated name for it (swiss-ai's fork parses it)
    router_topk_limited_devices: Optional[int] = option(
        None, help="device-limited routing (deprecated in Megatron-Core): --moe-router-group-topk N over "
                   "--moe-router-num-groups equal to the expert-parallel ranks")
    router_enable_expert_bias: bool = option(
        False, action="store_true",
        help="aux-loss-free balancing (DeepSeek-V3): a per-expert bias on the sigmoid scores chooses the experts, "
             "moved by --moe-router-bias-update-rate toward the mean load after each iteration")
    router_bias_update_rate: float = option(1e-3, help="the expert bias's step per iteration")
    router_force_load_balancing: bool = option(
        False, action="store_true",
        help="benchmark routing, as Megatron-Core's: each router's logits are replaced by standard normal draws "
             "(per expert-parallel rank) before the top-k, their gradient passed to the real logits unchanged")
    router_load_balancing_type: str = option(
        "aux_loss",
        help="aux_loss (GShard/Switch), seq_aux_loss (per sequence), global_aux_loss (token counts over the "
             "data-parallel group and the iteration), sinkhorn, or none")
    aux_loss_coeff: float = option(0.0,
                                       help="the balancing loss's coefficient (its gradient only: it is logged "
                                            "beside the LM loss, not added to it)")
    z_loss_coeff: Optional[float] = option(None, help="the router z-loss's coefficient (ST-MoE)")
    expert_capacity_factor: Optional[float] = option(
        None, help="drop the tokens beyond ceil(tokens x k / experts x factor) per expert "
                                "(default: dropless)")
    pad_expert_input_to_capacity: bool = option(False, action="store_true",
                                                    help="with a capacity: every expert takes exactly its capacity")
    token_drop_policy: str = option("probs", choices=("probs", "position"),
                                        help="with a capacity: keep each expert's most probable tokens, or its first")
    shared_expert_intermediate_size: Optional[int] = option(
        None, help="a shared expert of this hidden size that every token passes through")
    shared_expert_gate: bool = option(False, action="store_true",
                                          help="gate the shared expert's output per token by sigmoid(x . w) "
                                               "(Qwen2-MoE)")
    deepspeed: DeepSpeedMoESettings = section(DeepSpeedMoESettings)

    def __post_init__(self) -> None:
        if isinstance(self.num_experts, list):
            object.__setattr__(self, "num_experts", tuple(self.num_experts))

    def for_layer(self, num_experts: int, dense_ffn_size: int) -> "MoESettings":
        """One MoE layer's settings: its expert count and hidden size; a negative capacity factor means none, as
        Megatron-Core's __post_init__."""
        capacity = self.expert_capacity_factor if (self.expert_capacity_factor or 0.0) >= 0 else None
        routing = dict(router_topk=self.deepspeed.topk, router_load_balancing_type="none", aux_loss_coeff=0.0,
                       z_loss_coeff=None) if self.deepspeed.gating == "deepspeed" else {}
        return dataclasses.replace(self, num_experts=num_experts, expert_capacity_factor=capacity,
                                   ffn_hidden_size=self.ffn_hidden_size if self.ffn_hidden_size is not None
                                   else dense_ffn_size, **routing)

    def counts_per_layer(self, num_layers: int) -> tuple[int, ...]:
        """Each layer's number of experts (1: dense)."""
        if largest_expert_count(self.num_experts) is None:
            return (1,) * num_layers
        if self.deepspeed.gating == "deepspeed":
            return experts_per_layer(self.num_experts, num_layers, self.deepspeed.expert_interval)
        return tuple(self.num_experts if is_moe else 1 for is_moe in moe_layer_pattern(self.layer_freq, num_layers))

    def distinct_counts(self, num_layers: int) -> tuple[int, ...]:
        return tuple(sorted({count for count in self.counts_per_layer(num_layers) if count > 1}))

    def validate_layers(self, num_layers: int, dense_ffn_size: int) -> None:
        _check_counts_and_layers(self, num_layers, dense_ffn_size)

    def validate_tensor_parallel(self, tensor_parallel_size: int) -> None:
        """Megatron-DeepSpeed's residual MLP is not split over TP."""
        if largest_expert_count(self.num_experts) is not None and self.deepspeed.use_residual \
                and tensor_parallel_size > 1:
            raise ConfigError(f"--mlp-type residual with --tensor-model-parallel-size {tensor_parallel_size} is not "
                              f"implemented: PR-MoE's dense MLP is not tensor-parallel here; run it at "
                              f"--tensor-model-parallel-size 1", flags=("--mlp-type", "--tensor-model-parallel-size"))

    def validate(self) -> None:
        """TransformerConfig.__post_init__'s MoE checks, each one line naming the flags."""
        _check_layer_settings(self)

    @property
    def per_layer(self) -> bool:
        return isinstance(self.num_experts, tuple)

    @property
    def dropless(self) -> bool:
        return self.expert_capacity_factor is None

    def aux_loss_coeff_of(self, kind: str) -> float:
        """Megatron's get_aux_loss_coeff: the coefficient when `kind` is the balancing type."""
        return self.aux_loss_coeff if self.router_load_balancing_type == kind else 0.0


def _check_counts_and_layers(moe: MoESettings, num_layers: int, dense_ffn_size: int) -> None:
    """No negative count, per-layer counts only under DeepSpeed-MoE's gating, then each count's layer settings."""
    counts = moe.num_experts if moe.per_layer else (moe.num_experts or 0,)
    if min(counts) < 0:
        raise ConfigError(f"--num-experts must be at least 1 (0: no experts, as in Megatron-LM), got {min(counts)}",
                          flags=("--num-experts",))
    if largest_expert_count(moe.num_experts) is None:
        return
    if moe.per_layer and moe.deepspeed.gating != "deepspeed":
        raise ConfigError(f"--num-experts {' '.join(map(str, counts))}: a count per MoE layer is "
                          f"Megatron-DeepSpeed's (DeepSpeed-MoE's gating, a --deepspeed launch or --moe-gating "
                          f"deepspeed); Megatron-Core's router takes one count, and --moe-layer-freq chooses "
                          f"the MoE layers", flags=("--num-experts", "--moe-gating"))
    _check_gating(moe)
    for count in moe.distinct_counts(num_layers):
        moe.for_layer(count, dense_ffn_size).validate()


def _check_layer_settings(moe: MoESettings) -> None:
    """In order: DeepSpeed-MoE's layer, top-k, choices, expert width, loss coefficients, balancing, groups and
    capacity."""
    moe.deepspeed.validate_layer(moe.num_experts)
    if moe.deepspeed.gating == "deepspeed":
        return
    if not 1 <= moe.router_topk <= moe.num_experts:
        why = (": no token would reach an expert (Megatron-LM's load-balancing loss divides by it)"
               if moe.router_topk < 1 else "")
        raise ConfigError(f"--moe-router-topk {moe.router_topk} must be between 1 and --num-experts "
                          f"{moe.num_experts}{why}", flags=("--moe-router-topk", "--num-experts"))
    _check_choices(moe)
    if moe.ffn_hidden_size < 1:
        raise ConfigError(f"--moe-ffn-hidden-size must be at least 1, got {moe.ffn_hidden_size}: experts 0 wide "
                          f"output only their bias, no expert computes (Megatron-LM builds them without a check)",
                          flags=("--moe-ffn-hidden-size",))
    if moe.aux_loss_coeff < 0 or (moe.z_loss_coeff or 0.0) < 0:
        raise ConfigError("--moe-aux-loss-coeff and --moe-z-loss-coeff must not be negative",
                          flags=("--moe-aux-loss-coeff", "--moe-z-loss-coeff"))
    _check_balancing(moe)
    _check_groups(moe)
    _check_capacity(moe)


def _check_choices(moe: MoESettings) -> None:
    """The router's named choices, refused here rather than by argparse."""
    if moe.router_score_function not in SCORE_FUNCTIONS:
        raise ConfigError(f"--moe-router-score-function {moe.router_score_function} is not implemented: "
                          f"use {' or '.join(SCORE_FUNCTIONS)}", flags=("--moe-router-score-function",))
    if moe.router_load_balancing_type not in LOAD_BALANCING_TYPES:
        raise ConfigError(f"--moe-router-load-balancing-type {moe.router_load_balancing_type} is not "
                          f"implemented: use one of {', '.join(LOAD_BALANCING_TYPES)}",
                          flags=("--moe-router-load-balancing-type",))
    if moe.router_dtype is not None and moe.router_dtype not in ROUTER_DTYPES:
        raise ConfigError(f"--moe-router-dtype {moe.router_dtype} is not one of {', '.join(ROUTER_DTYPES)}",
                          flags=("--moe-router-dtype",))
    if moe.token_drop_policy not in DROP_POLICIES:
        raise ConfigError(f"--moe-token-drop-policy {moe.token_drop_policy} is not one of "
                          f"{', '.join(DROP_POLICIES)}", flags=("--moe-token-drop-policy",))


def _check_balancing(moe: MoESettings) -> None:
    """Megatron-LM's asserts on the scores and balancing together."""
    # a softmax over one score has no gradient
    if (moe.router_topk == 1 and moe.router_score_function == "softmax" and not moe.router_pre_softmax
            and moe.router_load_balancing_type != "sinkhorn"):
        raise ConfigError("--moe-router-topk 1 with the softmax score needs --moe-router-pre-softmax: a softmax "
                          "over the one chosen score is 1 and gives the router no gradient (as Megatron-LM "
                          "asserts)", flags=("--moe-router-topk", "--moe-router-pre-softmax"))
    if moe.router_load_balancing_type == "sinkhorn" and moe.aux_loss_coeff > 0:
        raise ConfigError("--moe-router-load-balancing-type sinkhorn balances without an auxiliary loss: set "
                          "--moe-aux-loss-coeff 0 (as Megatron-LM asserts)",
                          flags=("--moe-router-load-balancing-type", "--moe-aux-loss-coeff"))
    if moe.router_enable_expert_bias and moe.router_score_function != "sigmoid":
        raise ConfigError("--moe-router-enable-expert-bias (aux-loss-free balancing) needs "
                          "--moe-router-score-function sigmoid (as Megatron-LM requires)",
                          flags=("--moe-router-enable-expert-bias", "--moe-router-score-function"))


def _check_groups(moe: MoESettings) -> None:
    """Group-limited routing: group top-k with a group count dividing experts and top-k; a group count alone changes
    nothing, as in Megatron-Core."""
    if not moe.router_group_topk:
        return
    experts, groups, group_topk = moe.num_experts, moe.router_num_groups, moe.router_group_topk
    if not groups:
        raise ConfigError("--moe-router-group-topk (group-limited routing) needs --moe-router-num-groups (as "
                          "Megatron-Core requires)", flags=("--moe-router-group-topk", "--moe-router-num-groups"))
    if experts % groups or not 1 <= group_topk <= groups or moe.router_topk % group_topk:
        raise ConfigError(f"--moe-router-num-groups {groups} must divide --num-experts {experts}, "
                          f"--moe-router-group-topk {group_topk} must be at most the groups and divide "
                          f"--moe-router-topk {moe.router_topk}",
                          flags=("--moe-router-num-groups", "--moe-router-group-topk"))
    if moe.router_topk // group_topk > experts // groups:
        # past the group's experts Megatron's group_limited_topk fails in torch.topk
        raise ConfigError(f"--moe-router-topk {moe.router_topk} over --moe-router-group-topk {group_topk} "
                          f"groups takes {moe.router_topk // group_topk} experts of each, more than the "
                          f"{experts // groups} of a group (--num-experts {experts} / --moe-router-num-groups "
                          f"{groups})", flags=("--moe-router-topk", "--moe-router-group-topk",
                                               "--moe-router-num-groups"))


def _check_capacity(moe: MoESettings) -> None:
    if moe.expert_capacity_factor is not None:
        if moe.router_load_balancing_type == "sinkhorn":
            raise ConfigError("--moe-expert-capacity-factor works with aux_loss, seq_aux_loss, global_aux_loss "
                              "or none load balancing (as Megatron-LM requires), not sinkhorn",
                              flags=("--moe-expert-capacity-factor", "--moe-router-load-balancing-type"))
    elif moe.pad_expert_input_to_capacity:
        raise ConfigError("--moe-pad-expert-input-to-capacity needs --moe-expert-capacity-factor",
                          flags=("--moe-pad-expert-input-to-capacity", "--moe-expert-capacity-factor"))
    if moe.shared_expert_intermediate_size is not None and moe.shared_expert_intermediate_size < 1:
        raise ConfigError(f"--moe-shared-expert-intermediate-size must be at least 1, got "
                          f"{moe.shared_expert_intermediate_size}, as Megatron-LM's TransformerConfig raises "
                          f"(leave the flag out for no shared expert)",
                          flags=("--moe-shared-expert-intermediate-size",))
    if moe.shared_expert_gate and moe.shared_expert_intermediate_size is None:
        raise ConfigError("--moe-shared-expert-gate gates the shared expert: give "
                          "--moe-shared-expert-intermediate-size", flags=("--moe-shared-expert-gate",))


def _check_gating(moe: MoESettings) -> None:
    """A launch giving the other gating's flags (DeepSpeed-MoE vs Megatron-Core's router) is told they do nothing, in
    one line."""
    moe.deepspeed.validate()
    deepspeed = moe.deepspeed.gating == "deepspeed"
    defaults = MoESettings()
    if deepspeed:
        other = [_flag(moe, name) for name in ROUTER_SETTINGS if getattr(moe, name) != getattr(defaults, name)]
    else:
        other = [_flag(moe.deepspeed, f.name) for f in dataclasses.fields(DeepSpeedMoESettings)
                 if f.name != "gating" and getattr(moe.deepspeed, f.name) != getattr(defaults.deepspeed, f.name)]
    if other:
        raise ConfigError(
            f"{', '.join(other)} " + (
                "set Megatron-Core's router, but this Megatron-DeepSpeed launch gates by DeepSpeed-MoE "
                "(--topk, --moe-train-capacity-factor, --moe-loss-coeff, ...): drop them, or pass --moe-gating "
                "megatron" if deepspeed else
                "set DeepSpeed-MoE's gating, which a Megatron-DeepSpeed launch (--deepspeed) or --moe-gating "
                "deepspeed takes; this launch uses Megatron-Core's router (--moe-router-topk, ...)"),
            flags=tuple(other))


# Megatron-Core's router's settings, which DeepSpeed-MoE gating ignores
ROUTER_SETTINGS = ("router_topk", "router_score_function", "router_pre_softmax", "router_topk_scaling_factor",
                   "router_dtype", "router_num_groups", "router_group_topk", "router_enable_expert_bias",
                   "router_bias_update_rate", "router_force_load_balancing", "router_load_balancing_type",
                   "aux_loss_coeff", "z_loss_coeff", "expert_capacity_factor", "pad_expert_input_to_capacity",
                   "token_drop_policy", "shared_expert_intermediate_size")


def _flag(settings, name: str) -> str:
    field = next(f for f in dataclasses.fields(settings) if f.name == name)
    return "--" + field.metadata.get(SETTING, MoESettings.SETTING_PREFIX + name).replace("_", "-")
