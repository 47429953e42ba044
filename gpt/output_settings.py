"""The output section of the model settings: embedding scale, untied output layer, logit capping and the loss (z-loss,
fused output and cross entropy), as Megatron-LM's flags."""

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
    # here the output layer and loss fused over token chunks
    cross_entropy_loss_fusion: bool = option(
        False, action="store_true",
        help="compute the output layer and the cross entropy together over chunks of tokens, never holding the "
             "full logits (recomputed in the backward); the same loss and gradients to rounding")
    # llm-jp's Megatron-LM fork: z_loss_strength * logsumexp(logits)^2 per token (PaLM's z-loss)
    z_loss_strength: float = option(
        0.0, consts=[Const(("--use-z-loss",), 1e-4, help="llm-jp's Megatron-LM fork (nii-geniac): --z-loss-strength "
                                                         "1e-4")],
        help="add S x log(Z)^2 to every token's loss, log(Z) the log-sum-exp of its logits (PaLM's z-loss, as "
             "llm-jp's Megatron-LM fork adds it); 0 adds nothing")

    @property
    def tied(self) -> bool:
        """The output layer is the token embedding's weight (Megatron's default)."""
        return not self.untie_embeddings_and_output_weights

    def validate(self) -> None:
        """Value ranges, and what the fused output and cross entropy cannot compute."""
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
