"""Megatron-Core's multi-token prediction (--mtp-num-layers N, --mtp-loss-scaling-factor; DeepSeek-V3's MTP),
as megatron/core/transformer/multi_token_prediction.py computes it.

MTP layer k (1..N), MultiTokenPredictionLayer: the input tokens rolled left k times (the last position filled
with 0: roll_tensor) go through the model's own embedding (learned positions rolled with them); `enorm` of that
and `hnorm` of the previous hidden states (for k = 1 the decoder's output after its final norm) are concatenated
[embedding, hidden] and projected 2h -> h by `eh_proj` (column-parallel, its output gathered over TP and, under
sequence parallelism, scattered along the sequence again: _concat_embeddings), then one transformer layer of the
decoder's last layer's kind, then the layer's own `final_layernorm`. Its output feeds the next MTP layer and
the shared output layer (the word embedding when tied).

The loss, process_mtp_loss: the labels and the loss mask rolled left k times; per layer
`mtp_loss_scaling_factor / N * sum(mask_k x CE_k) / max(sum(mask_k), 1)`. It is not added to the LM loss's value:
AuxLossAutoScaler (gpt/moe/balancing.py, as Megatron's MTPLossAutoScaler) attaches it to the decoder's hidden states and gives it, in backward, the main loss's backward
scale (schedules.py forward_step_calc_loss: `MTPLossAutoScaler.set_loss_scale(loss_scale / num_microbatches)`).
Logged as MTPLossLoggingHelper.track_mtp_metrics: "mtp_k loss" = sum(mask_k x CE_k) / num_tokens per
micro-batch, averaged over the micro-batches and the data- and context-parallel ranks. Under context parallelism
every roll runs over the whole sequence (parallel/context_parallel.py roll_left_across_chunks: Megatron's roll_tensor
with its cp_group) and each loss is normalised by the count over the CP group, so CP changes none of it.
"""

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
    """The model's MTP section (base/options.py section): Megatron-LM's --mtp-* flags, its dests the settings."""
    SETTING_PREFIX: ClassVar[str] = "mtp_"

    num_layers: int = option(
        0, help="Megatron-Core's multi-token prediction: N MTP layers after the decoder, layer k predicting the "
                "token k+1 ahead through the shared embedding and output layer; their loss trains the model and is "
                "logged as mtp_k loss; 0 (or Megatron's unset) builds none")
    loss_scaling_factor: float = option(
        0.1, help="with --mtp-num-layers, the MTP losses' weight: each layer's loss is scaled by this / N "
                  "(Megatron-Core's default 0.1)")

    def validate(self, seq_length: int) -> None:
        """Depth k needs a target k + 1 tokens ahead within the `seq_length` tokens of a sample."""
        if self.num_layers < 0:
            raise ConfigError(f"--mtp-num-layers must be 0 or more, got {self.num_layers}", flags=("--mtp-num-layers",))
        if self.num_layers >= seq_length:  # before, 100000 of them built for minutes at --seq-length 16
            raise ConfigError(f"--mtp-num-layers {self.num_layers}: MTP depth k predicts the token k + 1 ahead, its "
                              f"labels rolled k places with zeros (Megatron-Core's roll_tensor), so at depth "
                              f"--seq-length {seq_length} or more no position has a target: at most "
                              f"{seq_length - 1}", flags=("--mtp-num-layers", "--seq-length"))


class MTPLossTracker:
    """One iteration's MTP bookkeeping: the backward scale of the attached losses and, per MTP layer, the
    logged losses summed over the micro-batches."""

    def __init__(self, num_layers: int) -> None:
        self.backward_scale = 1.0
        self.per_token = False  # --calculate-per-token-loss: the attached losses are sums (attach_mtp_loss)
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
        # Megatron-Core: init_method (the plain std), bias=False, gather_output=False
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
    """process_mtp_loss: runs the MTP layers on the decoder's final hidden states `hidden` and returns `hidden`
    carrying their scaled losses' gradient (and records the logged values). `model`: the GPTModel (gpt/model.py),
    whose embedding, output layer and MTP layers these are."""
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
        # rolled over the whole sequence: under context parallelism each chunk takes its successor's first token
        tokens, positions = roll_left_across_chunks(tokens, state), roll_left_across_chunks(positions, state)
        previous = layer(previous, model.embed(tokens, documents, positions=positions), documents)
        mtp_labels, loss_mask = roll_left_across_chunks(mtp_labels, state), roll_left_across_chunks(loss_mask, state)
        num_tokens = loss_mask.sum()
        if cp > 1:
            # The count over the whole sequence, and this rank's sum x CP: the mean over CP the gradients take is then
            # the sequence's masked mean, as the main loss's (training/evaluation.py micro_batch_loss), whichever
            # rank holds the rolled targets. Megatron-Core 0.16 divides by each rank's own count (a rank whose
            # targets all rolled away gives NaN); Megatron-LM PR #7498 sums the count over the CP group as here.
            state.comm.all_reduce(num_tokens, state.context_parallel_group, "cp")
        per_token = model.output(previous, mtp_labels).float()
        summed = (per_token * loss_mask).sum()
        tracker.record(k, summed * cp / num_tokens.clamp(min=1))
        # Megatron's MTPLossAutoScaler is its MoEAuxLossAutoScaler again: one autograd function here for both; under
        # --calculate-per-token-loss the sum (gpt_model.py: `mtp_loss_scale * mtp_loss`), scaled as the main loss
        attached = scale * summed if tracker.per_token else scale * summed * cp / num_tokens.clamp(min=1)
        output = AuxLossAutoScaler.apply(output, attached, tracker)
    return output


def begin_mtp_iteration(model: nn.Module, loss_scale, accumulation_steps: int = 1, per_token: bool = False) -> None:
    """The MTP losses' backward scale: the main loss's, the fp16 loss scale over the micro-batches
    (schedules.py: `MTPLossAutoScaler.set_loss_scale(loss_scale / num_microbatches)`); with `per_token`
    (--calculate-per-token-loss) `loss_scale` is the main loss's whole scale already (training/per_token_loss.py)."""
    tracker = getattr(model, "mtp_tracker", None)
    if tracker is not None:
        tracker.begin_iteration(loss_scale if per_token else loss_scale / accumulation_steps, per_token=per_token)


def finish_mtp_iteration(model: nn.Module, state, accumulation_steps: int, num_layers: int) -> dict[str, float]:
    """The iteration's "mtp_k loss" values (MTPLossLoggingHelper.track_mtp_metrics: summed over the micro-batches,
    averaged over the data- and context-parallel group, times 1 / micro-batches), on every rank: with pipeline stages the last
    stage's, summed over the pipeline group (the others hold zeros)."""
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
