"""What a recurrent mixer half (`M` Mamba-2, `G` Gated DeltaNet) saves for backward, measured once per model on the meta
device: their plain-torch scans keep chunk-wide fp32 tensors no attention-shaped formula holds."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from gpt.hybrid_pattern import GDN, MAMBA
from gpt.layer_spec import LayerSpec, mixer_symbols
from gpt.model import TransformerBlock
from gpt.model_config import ModelConfig
from gpt.parallel_plan import tensor_parallel_plan
from gpt.rotary import RotaryCache
from parallel.config import ParallelismConfig
from parallel.state import virtual_state
from zero.activations import SavedTensorMeter

RECURRENT = (MAMBA, GDN)
# whole chunks of both scans (M's 128, G's 64): one and two sequences of each length
PROBE_TOKENS = (256, 512)


@dataclass(frozen=True)
class RecurrentSavedBytes:
    """Saved bytes of the model's M and G mixer halves (bf16, summed over layers): per token, per position, per sequence
    and once a forward (weight copies autograd keeps)."""
    per_token: float = 0.0
    per_position: float = 0.0
    per_sequence: float = 0.0
    per_forward: float = 0.0

    def token_bytes(self, micro_batch_size: int, positions: float) -> float:
        """Per token of a forward of `micro_batch_size` sequences of `positions` tokens."""
        return (self.per_token + self.per_position / micro_batch_size + self.per_sequence / positions
                + self.per_forward / (micro_batch_size * positions))


def recurrent_saved_bytes(config: ModelConfig) -> RecurrentSavedBytes:
    """Four meta forwards of one mixer-only block of each kind, at TP 1, solved for the four terms."""
    symbols = mixer_symbols(config)
    total = [0.0] * 4
    short, long = PROBE_TOKENS
    for symbol in RECURRENT:
        if symbol in symbols:
            m11, m12, m21, m22 = [_mixer_half_bytes(config, symbol, batch, tokens)
                                  for batch in (1, 2) for tokens in PROBE_TOKENS]
            token = (m22 - m21 - (m12 - m11)) / (long - short)
            position = (m12 - m11) / (long - short) - token
            sequence = m21 - m11 - token * short
            terms = (token, position, sequence, m11 - (token + position) * short - sequence)
            total = [sum_ + symbols.count(symbol) * term for sum_, term in zip(total, terms)]
    return RecurrentSavedBytes(*total)


def _mixer_half_bytes(config: ModelConfig, symbol: str, batch: int, tokens: int) -> int:
    """One mixer-only block of `symbol` (its norm, mixer and residual add) run forward on meta under the meter."""
    state = virtual_state(1, 1)
    block = TransformerBlock(config, tensor_parallel_plan(state, ParallelismConfig()), None,
                             spec=LayerSpec(symbol, None), rotary_cache=RotaryCache()).to(torch.bfloat16)
    hidden = torch.empty(batch, tokens, config.hidden_size, device="meta", dtype=torch.bfloat16, requires_grad=True)
    meter = SavedTensorMeter(torch.device("meta"))
    with meter.hooks():
        block(hidden)
    return meter.peak["device"]
