"""--moe-router-padding-for-fp8 (--moe-router-padding-for-quantization since core_v0.16): accepted with its meaning.

Megatron-Core pads the routing map so that every expert receives a multiple of 16 tokens (32 for MXFP8):
megatron/core/transformer/moe/moe_utils.py `pad_routing_map` (at d98e8a64; core_v0.13.0 the same) turns each
expert's first (-count mod 16) unrouted tokens into routed ones, and since the router's dense probs are 0 there
(moe_utils.py topk_routing_with_score_function: `torch.zeros_like(logits).scatter(1, top_indices, probs)`), those tokens enter the expert at weight 0;
TEGroupedMLP then skips TE's Fp8Padding (experts.py, moe_utils.skip_routed_expert_padding). The FP8 experts here
always pad each expert's rows to that multiple with zero rows, as Fp8Padding does (parallel/fp8/grouped.py). Here:
Megatron's padding, run through this project's dispatcher in fp32, gives the unpadded routing's outputs bit for bit
and its gradients (the padding rows' zero weight makes their output and their gradients zero); so the flag is a
note (arguments/megatron/flag_classes.toml's router padding row), which names what stays different, FP8 rounding where one
scale spans Megatron's padding tokens. Megatron's own refusals (no FP8; the allgather dispatcher) are errors.
"""

import pytest
import torch

from arguments.megatron.flag_classes import AT_VALUE
from arguments.megatron.flags import NO_EFFECT_LINE
from arguments.parser import parse_arguments
from base.errors import ConfigError
from gpt.moe.dispatcher import LocalDispatcher, choices_of

TOKENS, EXPERTS, TOPK, HIDDEN = 40, 4, 2, 8


def pad_routing_map(routing_map: torch.Tensor, pad_multiple: int) -> torch.Tensor:
    """Megatron-Core's moe_utils.pad_routing_map, line for line."""
    routing_map = routing_map.transpose(0, 1)  # [num_experts, num_tokens]
    num_ones = routing_map.sum(dim=1)
    num_to_pad = (-num_ones) % pad_multiple
    is_zero = routing_map == 0
    zero_ranks = torch.cumsum(is_zero.int(), dim=1)
    mask = zero_ranks <= num_to_pad.unsqueeze(1)
    routing_map[mask] = 1
    return routing_map.transpose(0, 1)


def _routing():
    """A top-2 softmax routing of TOKENS tokens over EXPERTS experts, as the router's dense [T, E] probs and map."""
    generator = torch.Generator().manual_seed(0)
    scores = torch.softmax(torch.randn(TOKENS, EXPERTS, generator=generator), dim=-1)
    probs, top = torch.topk(scores, TOPK, dim=-1)
    dense = torch.zeros(TOKENS, EXPERTS).scatter(1, top, probs)
    return dense, dense > 0


def _moe_forward_backward(probs: torch.Tensor, routing_map: torch.Tensor, width: int):
    """hidden -> dispatch -> one fp32 linear with bias per expert -> combine; the output, the counts and the gradients
    of the hidden states and the experts' weights and biases under a fixed output gradient."""
    generator = torch.Generator().manual_seed(1)
    hidden = torch.randn(TOKENS, HIDDEN, generator=generator).requires_grad_()
    weights = torch.randn(EXPERTS, HIDDEN, HIDDEN, generator=generator).requires_grad_()
    biases = torch.randn(EXPERTS, HIDDEN, generator=generator).requires_grad_()
    grad = torch.randn(TOKENS, HIDDEN, generator=generator)
    dispatcher = LocalDispatcher(EXPERTS)
    rows, counts = dispatcher.dispatch(hidden, *choices_of(probs, routing_map, width))
    outputs = torch.cat([chunk @ weights[e].t() + biases[e] for e, chunk in enumerate(torch.split(rows, counts))])
    output = dispatcher.combine(outputs)
    output.backward(grad)
    return output.detach(), counts, hidden.grad, weights.grad, biases.grad


@pytest.mark.parametrize("multiple", [16, 32])
def test_megatrons_padded_routing_gives_the_unpadded_outputs_and_gradients(multiple):
    probs, routing_map = _routing()
    padded = pad_routing_map(routing_map.clone(), multiple)
    assert (padded.sum(dim=0) % multiple == 0).all() and (padded & ~routing_map).any()
    assert torch.equal(padded & routing_map, routing_map)  # every routed token stays routed
    output, counts, *grads = _moe_forward_backward(probs, routing_map, TOPK)
    padded_output, padded_counts, *padded_grads = _moe_forward_backward(probs, padded, EXPERTS)
    assert all(count % multiple == 0 for count in padded_counts) and padded_counts != counts
    assert torch.equal(padded_output, output)  # each padding row adds its weight 0 x its output: exactly nothing
    for name, got, want in zip(("hidden", "weights", "biases"), padded_grads, grads):
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6, msg=name)  # zero terms summed in another order


MOE = ["--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4", "--seq-length", "32",
       "--max-position-embeddings", "32", "--num-experts", "4", "--moe-router-topk", "2"]


@pytest.mark.parametrize("flag", ["--moe-router-padding-for-fp8", "--moe-router-padding-for-quantization"])
def test_the_flag_is_a_note_with_fp8_and_changes_no_setting(flag):
    argv = [*MOE, "--fp8-format", "hybrid", "--moe-token-dispatcher-type", "alltoall"]
    parsed = parse_arguments([*argv, flag])
    line = next(note for note in parsed.notes if note.startswith(NO_EFFECT_LINE))
    assert flag in line and AT_VALUE[flag].no_effect in line
    assert parsed.config == parse_arguments(argv).config


@pytest.mark.parametrize("flag", ["--moe-router-padding-for-fp8", "--moe-router-padding-for-quantization"])
@pytest.mark.parametrize("argv", [[*MOE, "--moe-token-dispatcher-type", "alltoall"],  # no FP8
                                  [*MOE, "--fp8-format", "e4m3"],  # Megatron's default dispatcher, allgather
                                  ["--fp8-format", "e4m3", "--moe-token-dispatcher-type", "allgather"]],  # dense too
                         ids=["no-fp8", "allgather", "dense-allgather"])
def test_megatrons_refusals_are_errors(flag, argv):
    """TransformerConfig.__post_init__: "fp8 must be specified when moe_router_padding_for_fp8 is True", "allgather
    and alltoall_seq dispatcher does not support moe_router_padding_for_fp8" (core_v0.13.0; "fp8/fp4
    must be specified when moe_router_padding_for_quantization is True" since core_v0.16), with or without experts."""
    with pytest.raises(ConfigError) as error:
        parse_arguments([*argv, flag])
    assert f"{flag}: {AT_VALUE[flag].refused}" in str(error.value) and "\n" not in str(error.value)
