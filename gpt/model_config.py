"""GPTModel's configuration (nanoGPT's GPTConfig): the trunk (depth, widths, vocabulary, sequence) and the components'
sections, each in its own file. It loads neither the data pipeline nor the flag parser."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

from base.errors import ConfigError
from base.options import Const, option, replace_settings, section, with_settings
from gpt.attention_settings import AttentionSettings
from gpt.fp8_settings import FP8Settings
from gpt.gdn_settings import GatedDeltaNetSettings
from gpt.hybrid_pattern import check_model_follows_pattern, residual_branches
from gpt.longrope import LongRope
from gpt.mamba_settings import MambaSettings
from gpt.mla_settings import MLASettings
from gpt.mlp import MLPSettings
from gpt.moe.settings import MoESettings, largest_expert_count
from gpt.mtp import MTPSettings
from gpt.norms import NormSettings
from gpt.output_settings import OutputSettings
from gpt.positions import PositionSettings
from gpt.recompute_settings import RecomputeSettings
from gpt.section_rules import (
    check_gated_delta_net_layers,
    check_layers_without_rotary,
    check_mlp_with_experts,
    check_multi_latent_attention,
)
from gpt.trunk_rules import check_trunk, check_trunk_tensor_parallel
from parallel.layers import padded_vocab_size


@dataclass(frozen=True)
class ModelConfig:
    num_layers: int = option(4, aliases={"--encoder-num-layers": "Megatron-LM (a GPT's only stack)"})
    # Megatron-LM's HybridModel pattern, read as GPT blocks
    hybrid_layer_pattern: Optional[str] = option(
        None, aliases={"--hybrid-override-pattern": "Megatron-LM (deprecated)"},
        help="Megatron-LM's layer pattern: `*` attention, `+` MLA (--multi-latent-attention's sizes), `M` Mamba, `-` "
             "MLP, `E` MoE (a mixer and the MLP right after it one block), `|` between pipeline segments (segment k: "
             "chunk k // PP of rank k mod PP), `/` then one block per MTP depth, e.g. 'M-*E|*E/*E'; sets the depth")
    hidden_size: int = 128
    num_attention_heads: int = 4
    # transformers' head_dim: heads x width may differ from hidden (Qwen3's 32 x 128, 2560)
    kv_channels: Optional[int] = option(None, help="each attention head's width (default: --hidden-size / "
                                                   "--num-attention-heads)")
    ffn_hidden_size: Optional[int] = option(None, help="default: 4 x hidden size")
    seq_length: int = option(128, aliases={"--encoder-seq-length": "Megatron-LM (a GPT's only sequence)"})
    max_position_embeddings: int = 128
    # 0 without NullTokenizer; the run plan holds the tokenizer's
    vocab_size: int = option(0, group="data",
                             help="with --tokenizer-type NullTokenizer: token ids are 0..N-1 and the end-of-document "
                                  "id is N")
    make_vocab_size_divisible_by: int = option(
        128, help="pad the vocabulary to a multiple of this x tensor-parallel size",
        consts=[Const(("--no-pad-vocab-size", "--disable-pad-vocab-size"), 1,
                      help="Megatron-LM: no padding beyond the TP split (--make-vocab-size-divisible-by 1)")])
    pad_vocab_size_to: Optional[int] = option(
        None, flags=("--pad-vocab-size-to", "--padded-vocab-size"),
        help="the padded vocabulary, exactly (BigScience's --pad-vocab-size-to, Megatron-LM's --padded-vocab-size): "
             "at least the tokenizer's, divisible by the TP size")
    hidden_dropout: float = 0.1
    # The blocks' components, each a section whose settings are flags and YAML keys of their own; defaults are GPT-2's.
    norms: NormSettings = section(NormSettings)
    mlp: MLPSettings = section(MLPSettings)
    positions: PositionSettings = section(PositionSettings)
    attention: AttentionSettings = section(AttentionSettings)
    output: OutputSettings = section(OutputSettings)
    add_bias_linear: bool = option(
        True, consts=[Const(("--disable-bias-linear",), False, help="Megatron-LM: linears without biases (Llama)")],
        help="biases in every linear layer, as in GPT-2")
    # Not the math: the transformers class the export writes where the blocks fit several
    hf_model_type: Optional[str] = option(
        None, help="the transformers family the Hugging Face export writes this model as (config.json's "
                   "model_type: llama, qwen2, qwen3, mistral, gemma2, gemma3_text, olmo2, phi3, ...); default: "
                   "the --init-from-hf folder's, else the first whose blocks are these")
    mla: MLASettings = section(MLASettings)
    init_method_std: float = 0.02
    recompute: RecomputeSettings = section(RecomputeSettings)
    mtp: MTPSettings = section(MTPSettings)
    fp8: FP8Settings = section(FP8Settings)
    experts: MoESettings = section(MoESettings)
    mamba: MambaSettings = section(MambaSettings)
    gdn: GatedDeltaNetSettings = section(GatedDeltaNetSettings)

    @classmethod
    def of(cls, **settings) -> "ModelConfig":
        """A model from its settings by name, sections' included (`mtp_num_layers=1`)."""
        return with_settings(cls, settings)

    @property
    def longrope(self) -> Optional[LongRope]:
        return self.positions.longrope(self.max_position_embeddings)

    @property
    def moe(self) -> Optional[MoESettings]:
        """The MoE settings at the largest expert count, or None for a dense model."""
        largest = largest_expert_count(self.experts.num_experts)
        return None if largest is None else self.experts.for_layer(largest, self.ffn_size)

    def with_layers(self, num_layers: int, **changes) -> "ModelConfig":
        """This model at another layer count, for counting; the per-layer pattern flags are dropped."""
        return replace_settings(self, num_layers=num_layers, window_attn_skip_freq=None, no_rope_freq=None,
                                hybrid_layer_pattern=None, experimental_attention_variant=None, **changes)

    def moe_layers(self) -> tuple[bool, ...]:
        return tuple(count > 1 for count in self.experts_per_layer())

    def experts_per_layer(self) -> tuple[int, ...]:
        return self.experts.counts_per_layer(self.num_layers)

    def moe_of(self, layer: int) -> "MoESettings":
        """Layer `layer`'s MoE settings, with its expert count."""
        return self.experts.for_layer(self.experts_per_layer()[layer], self.ffn_size)

    def attention_windows(self) -> tuple[Optional[int], ...]:
        return self.attention.attention_windows(self.num_layers)

    def has_windows(self) -> bool:
        return self.attention.has_windows(self.num_layers)

    @property
    def ffn_size(self) -> int:
        return self.mlp.ffn_size(self.hidden_size, self.ffn_hidden_size)

    @property
    def output_init_std(self) -> float:
        """The output projections' std: init_method_std / sqrt(residual branches)."""
        return self.init_method_std / math.sqrt(residual_branches(self.hybrid_layer_pattern, self.num_layers))

    @property
    def head_dim(self) -> int:
        """--kv-channels, else hidden // heads."""
        return self.kv_channels if self.kv_channels is not None else self.hidden_size // self.num_attention_heads

    def padded_vocab_size(self, tensor_parallel_size: int = 1) -> int:
        try:
            return padded_vocab_size(self.vocab_size, self.make_vocab_size_divisible_by, tensor_parallel_size,
                                     self.pad_vocab_size_to)
        except ValueError as error:
            raise ConfigError(str(error), flags=("--pad-vocab-size-to", "--tensor-model-parallel-size")) from None

    def validate_tensor_parallel(self, tensor_parallel_size: int) -> None:
        """Each TP rank takes whole heads and equal slices of hidden and 4h."""
        check_trunk_tensor_parallel(self, tensor_parallel_size)
        self.validate_blocks(tensor_parallel_size)
        self.experts.validate_tensor_parallel(tensor_parallel_size)

    def validate_blocks(self, tensor_parallel_size: int = 1) -> None:
        """The blocks' sections' own rules at a TP size."""
        self.norms.validate()
        self.mlp.validate()
        self.positions.validate(self.head_dim, self.num_layers)
        self.attention.validate(self.num_attention_heads, self.num_layers, tensor_parallel_size)
        self.mla.validate()
        self.mamba.validate(self, tensor_parallel_size)
        self.mlp.validate_size(self.ffn_size, tensor_parallel_size)
        check_gated_delta_net_layers(self.gdn, self.mlp, self.hybrid_layer_pattern, self.num_layers, tensor_parallel_size)

    def validate(self) -> None:
        check_trunk(self)
        self.output.validate()
        self.mtp.validate(self.seq_length)
        self.validate_blocks()
        if self.hybrid_layer_pattern is not None:
            check_model_follows_pattern(self)
        self.experts.validate_layers(self.num_layers, self.ffn_size)
        check_layers_without_rotary(self.positions, self.mla, self.mtp)
        check_multi_latent_attention(self.mla, self.attention, self.positions, self.num_layers)
        check_mlp_with_experts(self.mlp, has_experts=self.moe is not None)
