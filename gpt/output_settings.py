"""The token embedding's and the output layer's section of the model's settings (base/options.py section()): the
embedding's scale, whether the output layer has a weight of its own, how its logits are capped, and the loss it
feeds (PaLM's z-loss, the fused output layer and cross entropy), Megatron-LM's flags named as their dests.
gpt/model.py's GPTModel reads them where it embeds the tokens and computes the logits and the loss
(parallel/fused_linear_cross_entropy.py, parallel/cross_entropy.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Optional

from base.errors import ConfigError
from base.options import Const, option


@dataclass(frozen=True)
class OutputSettings:
    SETTING_PREFIX: ClassVar[str] = ""

    scale_embeddings_by_sqrt_hidden: bool = option(
        False, feature=True, action="store_true",
        help="the token embeddings multiplied by sqrt(--hidden-size), rounded to their dtype (Gemma)")
    untie_embeddings_and_output_weights: bool = option(
        False, action="store_true", help="an output layer of its own instead of the token embedding's (Llama)")
    final_logit_softcapping: Optional[float] = option(
        None, feature="final_logit_softcapping",
        help="the output logits become c x tanh(logit / c) before the loss (Gemma 2)")
    # Megatron-LM's --cross-entropy-loss-fusion (there: a fused cross-entropy kernel); here the output
    # layer and the loss fused over token chunks (parallel/fused_linear_cross_entropy.py).
    cross_entropy_loss_fusion: bool = option(
        False, action="store_true",
        help="compute the output layer and the cross entropy together over chunks of tokens, never holding the "
             "full logits (recomputed in the backward); the same loss and gradients to rounding")
    # llm-jp's Megatron-LM fork (branch v4: --z-loss-strength; branch nii-geniac: --use-z-loss, a fixed 1e-4):
    # megatron/core/tensor_parallel/cross_entropy.py, _VocabParallelCrossEntropy.forward adds
    # z_loss_strength * log(Z)^2 per token, log(Z) the log-sum-exp of the logits (PaLM's z-loss).
    z_loss_strength: float = option(
        0.0, consts=[Const(("--use-z-loss",), 1e-4, help="llm-jp's Megatron-LM fork (nii-geniac): --z-loss-strength "
                                                         "1e-4")],
        help="add S x log(Z)^2 to every token's loss, log(Z) the log-sum-exp of its logits (PaLM's z-loss, as "
             "llm-jp's Megatron-LM fork adds it); 0 adds nothing")

    @property
    def tied(self) -> bool:
        """The output layer is the token embedding's weight (GPT-2's tying, Megatron's default)."""
        return not self.untie_embeddings_and_output_weights

    def validate(self) -> None:
        """The values' ranges; then what the fused output layer and cross entropy cannot compute: it computes the
        loss of plain logits."""
        if self.z_loss_strength < 0:
            raise ConfigError(f"--z-loss-strength must be 0 or more, got {self.z_loss_strength}",
                              flags=("--z-loss-strength",))
        if self.final_logit_softcapping is not None and not 0 < self.final_logit_softcapping < float("inf"):
            raise ConfigError(f"--final-logit-softcapping must be a positive number, got "
                              f"{self.final_logit_softcapping}", flags=("--final-logit-softcapping",))
        if self.z_loss_strength > 0 and self.cross_entropy_loss_fusion:
            raise ConfigError("--z-loss-strength with --cross-entropy-loss-fusion: the z-loss is not implemented in "
                              "the fused output layer; drop --cross-entropy-loss-fusion",
                              flags=("--z-loss-strength", "--cross-entropy-loss-fusion"))
        if self.final_logit_softcapping is not None and self.cross_entropy_loss_fusion:
            raise ConfigError("--final-logit-softcapping with --cross-entropy-loss-fusion is not implemented: the "
                              "fused output layer computes the loss of uncapped logits; drop "
                              "--cross-entropy-loss-fusion",
                              flags=("--final-logit-softcapping", "--cross-entropy-loss-fusion"))
