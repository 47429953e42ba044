"""The GPT model: embeddings, pre-norm blocks whose parts the config's sections select, a final norm and vocab-parallel
logits. Every linear comes from the tensor-parallel plan, so one definition serves every TP size."""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional

import torch
from torch import nn

from gpt.attention import build_attention
from gpt.embedding import build_position_embedding, build_word_embedding, embed_tokens
from gpt.gated_delta_net import build_gated_delta_net
from gpt.hybrid_pattern import ATTENTION, GDN, MAMBA, MLA, MOE
from gpt.hybrid_pattern import MLP as DENSE_MLP
from gpt.kv_cache import LayerCache
from gpt.layer_spec import LayerSpec, layer_specs
from gpt.mamba import build_mamba
from gpt.mla import build_mla
from gpt.mlp import build_mlp
from gpt.model_config import ModelConfig
from gpt.moe.balancing import MoELossTracker
from gpt.moe.layer import build_moe_layer
from gpt.mtp import MTPLossTracker, MultiTokenPredictionLayer, attach_mtp_loss
from gpt.output_head import build_output_layer, output_of, output_vocab_start
from gpt.parallel_plan import TensorParallelPlan
from gpt.rotary import RotaryCache
from gpt.stage_layers import StageLayers, whole_model
from parallel.init import materialize
from parallel.random import TensorParallelRNG, dropout_stream
from parallel.sharding import check_recorded
from parallel.state import ParallelState
from zero.gated_parameters import wait_at_region_entry

if TYPE_CHECKING:  # the model reads the masks' tensors without loading the data pipeline
    from data.documents import DocumentMasks


MTP_PASS = "mtp"


MIXERS = {ATTENTION: build_attention, MLA: build_mla, MAMBA: build_mamba, GDN: build_gated_delta_net}
MLPS = {DENSE_MLP: build_mlp, MOE: build_moe_layer}


class TransformerBlock(nn.Module):
    """Pre-norm residual block: x + drop(attn(ln(x))), then x + drop(mlp(ln(x))); a one-part block passes x through its
    missing half."""

    def __init__(self, config: ModelConfig, plan: TensorParallelPlan, rng: Optional[TensorParallelRNG],
                 layer_number: int = 0, moe_tracker: Optional[MoELossTracker] = None,
                 spec: Optional[LayerSpec] = None, rotary_cache: Optional[RotaryCache] = None):
        super().__init__()
        spec = spec or layer_specs(config)[layer_number]
        h, norms = config.hidden_size, config.norms

        # --recompute-modules layernorm: the input and pre-MLP norms run again in backward
        recomputed_norms = ("input_layernorm", "post_attention_layernorm") \
            if "layernorm" in config.recompute.modules else ()

        # --sublayer-norms: on each sublayer's input, its output (OLMo 2), or both (Gemma 2/3)
        def norm(place: str, region: str) -> Optional[nn.Module]:
            return norms.build_sublayer(place, h, plan.norm_state(region), recompute=region in recomputed_norms)

        mixer, mlp = spec.mixer is not None, spec.mlp is not None
        self.input_layernorm = norm("input", "input_layernorm") if mixer else None
        self.attention = MIXERS[spec.mixer](config, plan, rng, spec, rotary_cache) if mixer else None
        self.post_attention_layernorm = norm("input", "post_attention_layernorm") if mlp else None
        self.split_dropout_rng = plan.dropout_rng("hidden_dropout", rng)
        self.mlp = MLPS[spec.mlp](config, plan, spec, layer_number, moe_tracker) if mlp else None
        self.hidden_dropout = nn.Dropout(config.hidden_dropout)
        # registered last, so a model without them keeps its parameters' order
        self.attention_output_layernorm = norm("output", "attention_output_layernorm") if mixer else None
        self.mlp_output_layernorm = norm("output", "mlp_output_layernorm") if mlp else None

    def forward(self, hidden: torch.Tensor, documents: Optional[DocumentMasks] = None,
                cache: Optional[LayerCache] = None) -> torch.Tensor:
        return self.mlp_half(self.attention_half(hidden, documents, cache))

    # The two halves: the regions --cuda-graph-modules attn and mlp capture.
    def attention_half(self, hidden: torch.Tensor, documents: Optional[DocumentMasks] = None,
                       cache: Optional[LayerCache] = None) -> torch.Tensor:
        if self.attention is None:
            return hidden
        branch = self.attention(_normed(self.input_layernorm, hidden), documents, cache)
        return hidden + self._residual_dropout(_normed(self.attention_output_layernorm, branch))

    def mlp_half(self, hidden: torch.Tensor) -> torch.Tensor:
        if self.mlp is None:
            return hidden
        branch = self.mlp(_normed(self.post_attention_layernorm, hidden))
        return hidden + self._residual_dropout(_normed(self.mlp_output_layernorm, branch))

    def _residual_dropout(self, branch: torch.Tensor) -> torch.Tensor:
        with dropout_stream(self.split_dropout_rng):
            return self.hidden_dropout(branch)


def _normed(norm: Optional[nn.Module], hidden: torch.Tensor) -> torch.Tensor:
    return hidden if norm is None else norm(hidden)


class GPTModel(nn.Module):
    """Built on the meta device from its LayerSpecs. `rng`: per-TP-rank dropout streams; `plan`: how layers split over
    TP; `stage`: one pipeline stage, layers under their global names."""

    def __init__(self, config: ModelConfig, state: ParallelState, rng: Optional[TensorParallelRNG] = None,
                 stage: Optional[StageLayers] = None, plan: Optional[TensorParallelPlan] = None):
        super().__init__()
        if config.vocab_size < 1:
            raise ValueError("ModelConfig.vocab_size is unset: fill it in from the tokenizer first")
        config.validate_blocks(state.tensor_parallel_size)
        self.config = config
        self.state = state
        self.stage = stage = stage or whole_model(config.num_layers)
        self.plan = plan = plan or TensorParallelPlan(state)
        if plan.state is not state:
            raise ValueError("the tensor-parallel plan is for another ParallelState than the model's")
        self.sequence_parallel = plan.sequence_parallel
        self.split_dropout_rng = plan.dropout_rng("embedding_dropout", rng)
        # whether first and last stages each hold a word-embedding copy whose gradients the embedding group sums (tied,
        # or MTP), as Megatron-Core
        self.tied_output = not config.output.untie_embeddings_and_output_weights
        self.shares_word_embedding = self.tied_output or config.mtp.num_layers > 0
        self.word_embeddings = build_word_embedding(config, plan, stage, self.shares_word_embedding)
        self.position_embeddings = build_position_embedding(config, stage)
        self.embedding_dropout = nn.Dropout(config.hidden_dropout)
        self.blocks = nn.ModuleList()
        self.moe_tracker = MoELossTracker() if config.moe is not None else None
        self.rotary_cache = RotaryCache()
        specs = layer_specs(config)
        for layer in stage.layer_ids:
            self.blocks.add_module(str(layer), TransformerBlock(config, plan, rng, layer, self.moe_tracker,
                                                                spec=specs[layer], rotary_cache=self.rotary_cache))
        by_layer = dict(zip(stage.layer_ids, self.blocks))
        self.chunk_blocks = [nn.ModuleList(by_layer[layer] for layer in chunk) for chunk in stage.chunks]
        self.final_layernorm = config.norms.build(config.hidden_size, plan.norm_state("final_layernorm")) \
            if stage.last else None
        self.output_layer = build_output_layer(config, plan, stage)
        self.output_vocab_start = output_vocab_start(config, state)
        # Megatron-Core's MTP block on the last stage, numbered after the decoder's layers
        self.mtp_layers = nn.ModuleList()
        self.mtp_tracker = MTPLossTracker(config.mtp.num_layers) if config.mtp.num_layers and stage.last else None
        if self.mtp_tracker is not None:
            for k in range(config.mtp.num_layers):
                block = TransformerBlock(config, plan, rng, config.num_layers + k, self.moe_tracker,
                                         spec=specs[-1], rotary_cache=self.rotary_cache)
                self.mtp_layers.append(MultiTokenPredictionLayer(block, config, plan))
        self.run_blocks = run_in_order
        # FP8 delayed scaling's once-a-pass update, by model chunk; None without it
        self.fp8_passes = None
        check_recorded(self)

    def embed(self, tokens: torch.Tensor, documents: Optional[DocumentMasks] = None,
              positions: Optional[torch.Tensor] = None) -> torch.Tensor:
        """The first block's input, [batch, seq, hidden] (a sequence slice under SP)."""
        return embed_tokens(self, tokens, documents, positions)

    def hidden_states(self, tokens: torch.Tensor, documents: Optional[DocumentMasks] = None,
                      fp8_parts: tuple = (0,)) -> torch.Tensor:
        hidden = self.fp8_pass_starts(self.embed(tokens, documents), fp8_parts)
        hidden = self.run_blocks(self.blocks, hidden) if documents is None else \
            self.run_blocks(self.blocks, hidden, documents)
        return self.final_layernorm(hidden)

    def fp8_pass_starts(self, hidden: torch.Tensor, parts: tuple) -> torch.Tensor:
        return hidden if self.fp8_passes is None else self.fp8_passes.mark_backward(hidden, parts)

    def fp8_pass_ends(self, parts: tuple) -> None:
        if self.fp8_passes is not None:
            self.fp8_passes.forward_done(parts)

    def chunk_forward(self, chunk: int, inputs: torch.Tensor, labels: torch.Tensor | None = None,
                      documents: Optional[DocumentMasks] = None, tokens: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Model chunk `chunk` of this stage: from tokens or the previous chunk's hidden states, to per-token loss (or
        logits) or hidden states."""
        hidden = self.embed(inputs, documents) if self.stage.first and chunk == 0 else inputs
        ends_model = self.stage.last and chunk == len(self.stage.chunks) - 1
        mtp = ends_model and self.mtp_tracker is not None and labels is not None and self.training
        parts = (chunk, MTP_PASS) if mtp else (chunk,)
        hidden = self.fp8_pass_starts(hidden, parts)
        hidden = self.run_blocks(self.chunk_blocks[chunk], hidden) if documents is None else \
            self.run_blocks(self.chunk_blocks[chunk], hidden, documents)
        if ends_model:
            final_hidden = self.final_layernorm(hidden)
            if mtp:
                if tokens is None:
                    raise ValueError("the last stage's MTP layers need the micro-batch's tokens")
                final_hidden = attach_mtp_loss(self, final_hidden, tokens, labels, documents)
            self.fp8_pass_ends(parts)
            return self.output(final_hidden, labels)
        self.fp8_pass_ends(parts)
        return hidden

    def forward(self, tokens: torch.Tensor, labels: torch.Tensor | None = None,
                documents: Optional[DocumentMasks] = None) -> torch.Tensor:
        """Logits [batch, seq, vocab] without labels; per-token cross-entropy with them, over vocab-parallel logits
        never gathered."""
        mtp = self.mtp_tracker is not None and labels is not None and self.training
        parts = (0, MTP_PASS) if mtp else (0,)
        final_hidden = self.hidden_states(tokens, documents, parts)
        if mtp:
            # the MTP losses ride on the hidden states' backward; the returned loss is the LM's alone
            final_hidden = attach_mtp_loss(self, final_hidden, tokens, labels, documents)
        self.fp8_pass_ends(parts)
        return self.output(final_hidden, labels)

    def output(self, final_hidden: torch.Tensor, labels: torch.Tensor | None) -> torch.Tensor:
        return output_of(self, final_hidden, labels)


def compile_blocks(model: GPTModel, options: Optional[dict] = None) -> None:
    """torch.compile each block in place, after parallelism; what must stay eager is marked where defined."""
    for block in model.blocks:
        wait_at_region_entry(block)
        block.compile(options=options)


def run_in_order(blocks: nn.ModuleList, hidden: torch.Tensor, documents: Optional[DocumentMasks] = None
                 ) -> torch.Tensor:
    for block in blocks:
        hidden = block(hidden) if documents is None else block(hidden, documents)
    return hidden


def build_gpt_model(config: ModelConfig, state: ParallelState, seed: int, rng: Optional[TensorParallelRNG] = None,
                    dtype: torch.dtype = torch.float32, plan: Optional[TensorParallelPlan] = None) -> GPTModel:
    """A GPTModel with this TP rank's slice materialized (tests and tools)."""
    return materialize(GPTModel(config, state, rng, plan=plan), seed, device=state.device, dtype=dtype)
