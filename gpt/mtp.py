"""Megatron-Core's multi-token prediction (--mtp-num-layers, DeepSeek-V3's MTP): layer k embeds the tokens rolled left k
times, joins them with the previous hidden states through enorm, hnorm and eh_proj, runs one block and scores the tokens
k + 1 ahead with the shared output layer; the scaled losses ride on the main hidden states' backward."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import nn

from base.errors import ConfigError
from base.options import option
from gpt.moe.balancing import AuxLossAutoScaler
from parallel.context_parallel import positions_on_this_rank, roll_left_across_chunks
from parallel.mappings import gather_from_tensor_parallel_region, scatter_to_sequence_parallel_region


@dataclass(frozen=True)
class MTPSettings:
    """The MTP section: Megatron-LM's --mtp-* flags."""
    SETTING_PREFIX: ClassVar[str] = "mtp_"

    num_layers: int = option(
        0, help="Megatron-Core's multi-token prediction: N MTP layers after the decoder, layer k predicting the "
                "token k+1 ahead through the shared embedding and output layer; their loss trains the model and is "
                "logged as mtp_k loss; 0 (or Megatron's unset) builds none")
    loss_scaling_factor: float = option(
        0.1, help="with --mtp-num-layers, the MTP losses' weight: each layer's loss is scaled by this / N "
                  "(Megatron-Core's default 0.1)")

    def validate(self, seq_length: int) -> None:
        """Depth k needs a target k + 1 tokens ahead within a sample."""
        if self.num_layers < 0:
            raise ConfigError(f"--mtp-num-layers must be 0 or more, got {self.num_layers}", flags=("--mtp-num-layers",))
        if self.num_layers >= seq_length:
            raise ConfigError(f"--mtp-num-layers {self.num_layers}: MTP depth k predicts the token k + 1 ahead, its "
                              f"labels rolled k places with zeros (Megatron-Core's roll_tensor), so at depth "
                              f"--seq-length {seq_length} or more no position has a target: at most "
                              f"{seq_length - 1}", flags=("--mtp-num-layers", "--seq-length"))


class MTPLossTracker:
    """One iteration's MTP bookkeeping: the losses' backward scale and per-layer logged losses."""

    def __init__(self, num_layers: int) -> None:
        self.backward_scale = 1.0
        self.per_token = False  # --calculate-per-token-loss: the attached losses are sums
        self.num_layers = num_layers
        self._pending: list[tuple[int, torch.Tensor]] = []

    def begin_iteration(self, backward_scale, per_token: bool = False) -> None:
        self.backward_scale = backward_scale
        self.per_token = per_token
        self._pending = []

    def record(self, layer: int, value: torch.Tensor) -> None:
        self._pending.append((layer, value.detach().float()))

    def sums(self, device) -> torch.Tensor:
        totals = torch.zeros(self.num_layers, dtype=torch.float64, device=device)
        for layer, value in self._pending:
            totals[layer] += value.double()
        self._pending = []
        return totals


class MultiTokenPredictionLayer(nn.Module):
    def __init__(self, block: nn.Module, config, plan):
        super().__init__()
        h, norms = config.hidden_size, config.norms
        self.enorm = norms.build(h, plan.norm_state("mtp_norm"))
        self.hnorm = norms.build(h, plan.norm_state("mtp_norm"))
        # Megatron-Core: init_method, no bias, gather_output=False
        self.eh_proj = plan.linear("mtp.eh_proj", 2 * h, h, init_std=config.init_method_std, bias=False)
        self.transformer_layer = block
        self.final_layernorm = norms.build(h, plan.norm_state("mtp_norm"))
        self.state = plan.state
        self.sequence_parallel = plan.sequence_parallel

    def forward(self, hidden: torch.Tensor, embedded: torch.Tensor, documents=None) -> torch.Tensor:
        projected = self.eh_proj(torch.cat((self.enorm(embedded), self.hnorm(hidden)), dim=-1))
        projected = gather_from_tensor_parallel_region(projected, self.state)
        if self.sequence_parallel:
            projected = scatter_to_sequence_parallel_region(projected, self.state)
        out = self.transformer_layer(projected) if documents is None else self.transformer_layer(projected, documents)
        return self.final_layernorm(out)


def attach_mtp_loss(model: nn.Module, hidden: torch.Tensor, tokens: torch.Tensor, labels: torch.Tensor,
                    documents=None) -> torch.Tensor:
    """process_mtp_loss: run the MTP layers on the decoder's final hidden states and return them carrying the scaled
    losses' gradient."""
    config, tracker, state = model.config, model.mtp_tracker, model.state
    loss_mask = documents.loss_mask if documents is not None and documents.loss_mask is not None else None
    loss_mask = torch.ones(labels.shape, dtype=torch.float32, device=labels.device) if loss_mask is None \
        else loss_mask.float()
    positions = documents.position_ids if documents is not None and documents.position_ids is not None else \
        positions_on_this_rank(tokens.shape[1], state, tokens.device)
    if positions is None:
        positions = torch.arange(tokens.shape[1], device=tokens.device)
    positions = positions.expand(tokens.shape[0], -1)
    mtp_labels = labels
    scale = config.mtp.loss_scaling_factor / config.mtp.num_layers
    cp = state.context_parallel_size
    previous, output = hidden, hidden
    for k, layer in enumerate(model.mtp_layers):
        # rolled over the whole sequence: under CP each chunk takes its successor's first token
        tokens, positions = roll_left_across_chunks(tokens, state), roll_left_across_chunks(positions, state)
        previous = layer(previous, model.embed(tokens, documents, positions=positions), documents)
        mtp_labels, loss_mask = roll_left_across_chunks(mtp_labels, state), roll_left_across_chunks(loss_mask, state)
        num_tokens = loss_mask.sum()
        if cp > 1:
            # The token count over the whole sequence and this rank's sum x CP, so the CP mean is the sequence's masked
            # mean (as Megatron-LM PR #7498; core 0.16 divides per rank and can give NaN).
            state.comm.all_reduce(num_tokens, state.context_parallel_group, "cp")
        per_token = model.output(previous, mtp_labels).float()
        summed = (per_token * loss_mask).sum()
        tracker.record(k, summed * cp / num_tokens.clamp(min=1))
        # Megatron's MTPLossAutoScaler is its MoEAuxLossAutoScaler: one function here; per-token loss uses the sum
        attached = scale * summed if tracker.per_token else scale * summed * cp / num_tokens.clamp(min=1)
        output = AuxLossAutoScaler.apply(output, attached, tracker)
    return output


def begin_mtp_iteration(model: nn.Module, loss_scale, accumulation_steps: int = 1, per_token: bool = False) -> None:
    """The losses' backward scale: the fp16 loss scale over the micro-batches, as Megatron's schedules set it."""
    tracker = getattr(model, "mtp_tracker", None)
    if tracker is not None:
        tracker.begin_iteration(loss_scale if per_token else loss_scale / accumulation_steps, per_token=per_token)


def finish_mtp_iteration(model: nn.Module, state, accumulation_steps: int, num_layers: int) -> dict[str, float]:
    """The iteration's "mtp_k loss" values, averaged over DP x CP and micro-batches, on every rank (the last stage's,
    summed over the pipeline group)."""
    if not num_layers:
        return {}
    tracker = getattr(model, "mtp_tracker", None)
    totals = tracker.sums(state.device) if tracker is not None else \
        torch.zeros(num_layers, dtype=torch.float64, device=state.device)
    if state.pipeline_parallel_size > 1:
        state.comm.all_reduce(totals, state.pipeline_parallel_group, "pp")
    if state.data_context_parallel_size > 1:  # each CP rank's share x CP: their mean is the sequence's
        state.comm.all_reduce(totals, state.data_context_parallel_group, "dp")
        totals /= state.data_context_parallel_size
    return {f"mtp_{k + 1} loss": value / accumulation_steps for k, value in enumerate(totals.tolist())}
