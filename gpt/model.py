"""GPT-2: token + learned position embeddings, pre-LayerNorm blocks, final LayerNorm, tied logits; and
the Llama-shaped variants the config's sections select (gpt/norms.py, mlp.py, positions.py, attention_settings.py): RMSNorm, SwiGLU, rotary or no
positions, grouped-query attention, an untied output layer, linears without biases; and Megatron-LM's
squared ReLU, interleaved rotary and attention output gate.

Every linear and the token embedding come from `parallel.layers`, built through the declared tensor-parallel plan
(gpt/parallel_plan.py), so one model definition serves every TP size. Tensors are [batch, sequence, hidden]. With
a plan that splits the sequence (--sequence-parallel) everything outside the TP regions (embedding dropout, norms,
residual adds, dropout) holds this rank's slice of the sequence: column-parallel linears gather it, row-parallel
ones reduce-scatter it, the output layer gathers it before the vocab-parallel loss, as Megatron-Core's GPTModel
(parallel/mappings.py); dropout there draws from the rank's private stream, as Megatron-Core's TransformerBlock
under `get_cuda_rng_tracker().fork()`.

Initialisation follows GPT-2/Megatron: normal(0, 0.02) weights, zero biases, unit LayerNorm gains, and each
residual branch's output projection (attention `dense`, MLP `dense_4h_to_h`) scaled by 1/sqrt(2 * num_layers) (a
hybrid pattern's by 1/sqrt(its layers, one per symbol), as Megatron-Core: gpt/hybrid_pattern.py residual_branches).
`GPTModel(...)` builds the structure on the meta device (no memory, no draws: milliseconds even at 170B); each
parameter carries its initialisation, a pure function of (seed, name, element index) (parallel/init.py). Memory
comes afterwards, only for what this rank owns: `zero.apply.apply_zero` fills ZeRO's flat buffers directly, and
`build_gpt_model` (tests, tools, one process) materializes the whole TP slice."""

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

if TYPE_CHECKING:  # the model reads the masks' tensors; importing it loads no data pipeline (tests/test_layering.py)
    from data.documents import DocumentMasks


MTP_PASS = "mtp"


# Each part's builder by its symbol (gpt/layer_spec.py): a layer kind is its module, its builder and one entry here
MIXERS = {ATTENTION: build_attention, MLA: build_mla, MAMBA: build_mamba, GDN: build_gated_delta_net}
MLPS = {DENSE_MLP: build_mlp, MOE: build_moe_layer}


class TransformerBlock(nn.Module):
    """Pre-LayerNorm residual block: x + drop(attn(ln(x))), then x + drop(mlp(ln(x))). A hybrid pattern's one-part
    block (spec.mixer or spec.mlp None: `M` or `-` alone) has neither that half nor its norms, and passes x through it.

    The residual stream is identical on every TP rank, so its dropout uses the shared stream; under
    sequence parallelism each rank holds its own slice of it, and the dropout draws from the rank's
    private stream."""

    def __init__(self, config: ModelConfig, plan: TensorParallelPlan, rng: Optional[TensorParallelRNG],
                 layer_number: int = 0, moe_tracker: Optional[MoELossTracker] = None,
                 spec: Optional[LayerSpec] = None, rotary_cache: Optional[RotaryCache] = None):
        """`spec`: this block's parts (gpt/layer_spec.py), by default decoder layer `layer_number`'s (an MTP layer's
        block is given the last decoder layer's, gpt/mtp.py); `rotary_cache`: the model's cos and sin, shared by its
        layers (gpt/rotary.py)."""
        super().__init__()
        spec = spec or layer_specs(config)[layer_number]
        h, norms = config.hidden_size, config.norms

        # --recompute-modules layernorm: the input and pre-MLP norms (Megatron-Core's recompute_input_layernorm and
        # recompute_pre_mlp_layernorm, transformer_layer.py) keep only their input and run again in backward
        recomputed_norms = ("input_layernorm", "post_attention_layernorm") \
            if "layernorm" in config.recompute.modules else ()

        # --sublayer-norms: the norms on each sublayer's input (GPT-2, Llama), on its output inside the residual
        # branch (OLMo 2: transformers' Olmo2DecoderLayer, residual + norm(attn(x))), or both (Gemma 2/3)
        def norm(place: str, region: str) -> Optional[nn.Module]:
            return norms.build_sublayer(place, h, plan.norm_state(region), recompute=region in recomputed_norms)

        mixer, mlp = spec.mixer is not None, spec.mlp is not None
        self.input_layernorm = norm("input", "input_layernorm") if mixer else None
        # the spec's mixer: attention at its window and rotary, multi-latent attention (gpt/mla.py) or Mamba-2
        # (gpt/mamba.py)
        self.attention = MIXERS[spec.mixer](config, plan, rng, spec, rotary_cache) if mixer else None
        self.post_attention_layernorm = norm("input", "post_attention_layernorm") if mlp else None
        self.split_dropout_rng = plan.dropout_rng("hidden_dropout", rng)
        # the spec's MLP: dense or gated (gpt/mlp.py), or an MoE layer (gpt/moe/layer.py) with its experts and, under
        # expert parallelism, the plan's dispatcher
        self.mlp = MLPS[spec.mlp](config, plan, spec, layer_number, moe_tracker) if mlp else None
        self.hidden_dropout = nn.Dropout(config.hidden_dropout)
        # registered after the rest, so that a model without them keeps its parameters' order
        self.attention_output_layernorm = norm("output", "attention_output_layernorm") if mixer else None
        self.mlp_output_layernorm = norm("output", "mlp_output_layernorm") if mlp else None

    def forward(self, hidden: torch.Tensor, documents: Optional[DocumentMasks] = None,
                cache: Optional[LayerCache] = None) -> torch.Tensor:
        """`cache`: this layer's KV cache, where `hidden` is the tokens after those it holds (gpt/decode.py)."""
        return self.mlp_half(self.attention_half(hidden, documents, cache))

    # The block's two halves, each with its norms, dropout and residual add: Megatron-Core's
    # TransformerLayer._forward_attention and _forward_mlp, the regions --cuda-graph-modules attn and mlp capture
    # (training/cuda_graphs.py).
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
    """`norm(hidden)`, or `hidden` where --sublayer-norms puts no norm there."""
    return hidden if norm is None else norm(hidden)


class GPTModel(nn.Module):
    """Built on the meta device (see the module docstring), each layer's parts from its LayerSpec. `rng`: the per-TP
    rank dropout streams; without it (TP=1 tools, tests) dropout draws from torch's default generator.

    `plan` (gpt/parallel_plan.py) is how the layers split over `state`'s tensor-parallel group and whether the
    sequence is split; by default, no sequence parallelism (training/build.py's `parallelize` passes the run's).

    `stage` (gpt/stage_layers.py) builds one pipeline stage: its layers under their global names, the
    embedding on the first stage, the final norm and output layer on the last (which also holds the tied
    word embedding, whose gradient the embedding group sums); `chunk_forward` runs one of its model chunks.
    """

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
        # Whether the word embedding is also the output layer (an untied first stage's output_layer is None too), and
        # whether a first and a last pipeline stage each hold a copy whose gradients the embedding group sums: tied,
        # or the last stage's MTP layers embed the rolled tokens (Megatron-Core builds its embedding where
        # `pre_process or mtp_process` and ties the copies: tie_word_embeddings_state_dict)
        self.tied_output = not config.output.untie_embeddings_and_output_weights
        self.shares_word_embedding = self.tied_output or config.mtp.num_layers > 0
        self.word_embeddings = build_word_embedding(config, plan, stage, self.shares_word_embedding)
        self.position_embeddings = build_position_embedding(config, stage)
        self.embedding_dropout = nn.Dropout(config.hidden_dropout)
        # Named by their global layer number ("blocks.5." on any stage), so their weights are drawn as the
        # one-stage model's; iteration follows the stage's chunks in order.
        self.blocks = nn.ModuleList()
        # The MoE layers' balancing-loss scale and logged values (gpt/moe/balancing.py); None for a dense model
        self.moe_tracker = MoELossTracker() if config.moe is not None else None
        # cos and sin made once and read by every layer (gpt/rotary.py): a plain object, no module state
        self.rotary_cache = RotaryCache()
        specs = layer_specs(config)  # each layer's parts, from the GPT flags or the hybrid pattern
        for layer in stage.layer_ids:
            self.blocks.add_module(str(layer), TransformerBlock(config, plan, rng, layer, self.moe_tracker,
                                                                spec=specs[layer], rotary_cache=self.rotary_cache))
        by_layer = dict(zip(stage.layer_ids, self.blocks))
        self.chunk_blocks = [nn.ModuleList(by_layer[layer] for layer in chunk) for chunk in stage.chunks]
        self.final_layernorm = config.norms.build(config.hidden_size, plan.norm_state("final_layernorm")) \
            if stage.last else None
        self.output_layer = build_output_layer(config, plan, stage)
        self.output_vocab_start = output_vocab_start(config, state)
        # Megatron-Core's MTP block (gpt/mtp.py) on the last stage: --mtp-num-layers layers, each with one block of
        # the last decoder layer's kind, numbered after the decoder's (num_layers + k, as get_mtp_layer_offset)
        self.mtp_layers = nn.ModuleList()
        self.mtp_tracker = MTPLossTracker(config.mtp.num_layers) if config.mtp.num_layers and stage.last else None
        if self.mtp_tracker is not None:
            for k in range(config.mtp.num_layers):
                block = TransformerBlock(config, plan, rng, config.num_layers + k, self.moe_tracker,
                                         spec=specs[-1], rotary_cache=self.rotary_cache)
                self.mtp_layers.append(MultiTokenPredictionLayer(block, config, plan))
        # How the blocks run: in a plain loop, or under activation checkpointing once
        # zero.activations.apply_activation_checkpointing has replaced it.
        self.run_blocks = run_in_order
        # FP8 delayed scaling's once-a-pass amax reduction and scale update (parallel/fp8/delayed_updates.py, set by
        # gpt/fp8.py's delayed_scaling_passes), keyed by model chunk and MTP_PASS; None without delayed scaling
        self.fp8_passes = None
        # Every parameter must say where it lives (parallel/sharding.py): read as whole by default, GPT-OSS's split
        # attention sinks once loaded whole into a TP half.
        check_recorded(self)

    def embed(self, tokens: torch.Tensor, documents: Optional[DocumentMasks] = None,
              positions: Optional[torch.Tensor] = None) -> torch.Tensor:
        """The first block's input, [batch, seq, hidden] (under sequence parallelism, this rank's slice of the
        sequence: [batch, seq / TP, hidden]). Learned positions are 0..seq-1, or `documents.position_ids`
        [batch, seq] where given (--reset-position-ids), or `positions` (an MTP layer's, rolled: gpt/mtp.py)."""
        return embed_tokens(self, tokens, documents, positions)

    def hidden_states(self, tokens: torch.Tensor, documents: Optional[DocumentMasks] = None,
                      fp8_parts: tuple = (0,)) -> torch.Tensor:
        """The final norm's output, [batch, seq, hidden] (a slice of the sequence under sequence parallelism).
        `fp8_parts`: the parts of the model this forward runs (its one chunk, and MTP_PASS where the MTP layers
        run after it), for delayed scaling's once-a-pass update."""
        hidden = self.fp8_pass_starts(self.embed(tokens, documents), fp8_parts)
        hidden = self.run_blocks(self.blocks, hidden) if documents is None else \
            self.run_blocks(self.blocks, hidden, documents)
        return self.final_layernorm(hidden)

    def fp8_pass_starts(self, hidden: torch.Tensor, parts: tuple) -> torch.Tensor:
        """`hidden` enters the FP8 layers of `parts` (model chunks, MTP_PASS): under delayed scaling their
        output-gradient scales move once the backward through them is complete."""
        return hidden if self.fp8_passes is None else self.fp8_passes.mark_backward(hidden, parts)

    def fp8_pass_ends(self, parts: tuple) -> None:
        """The forward through the FP8 layers of `parts` is complete: under delayed scaling their input and weight
        scales move (once a pass, as TransformerEngine's autocast exit)."""
        if self.fp8_passes is not None:
            self.fp8_passes.forward_done(parts)

    def chunk_forward(self, chunk: int, inputs: torch.Tensor, labels: torch.Tensor | None = None,
                      documents: Optional[DocumentMasks] = None, tokens: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Model chunk `chunk` of this pipeline stage: from tokens on the model's first chunk, else from
        the previous chunk's hidden states; to the per-token loss (or logits) on its last chunk, else to
        hidden states [batch, seq, hidden]. `documents`: the micro-batch's positions (read by the learned position
        embedding) and attention mask (every chunk's attention), where the document-masking flags are set.
        `tokens`: the micro-batch's tokens, which the last chunk's MTP layers embed (gpt/mtp.py)."""
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
                # the MTP layers on the last stage (Megatron-Core's default placement) read the micro-batch's tokens
                if tokens is None:
                    raise ValueError("the last stage's MTP layers need the micro-batch's tokens")
                final_hidden = attach_mtp_loss(self, final_hidden, tokens, labels, documents)
            self.fp8_pass_ends(parts)
            return self.output(final_hidden, labels)
        self.fp8_pass_ends(parts)
        return hidden

    def forward(self, tokens: torch.Tensor, labels: torch.Tensor | None = None,
                documents: Optional[DocumentMasks] = None) -> torch.Tensor:
        """Logits [batch, seq, vocab] without labels; per-token cross-entropy [batch, seq] with them.

        The output layer (tied to the token embedding, or untied and split the same way) gives
        vocab-parallel logits: each TP rank scores its slice of the vocabulary and the loss is computed
        without gathering them. Padding rows of the vocabulary never take part in the softmax, so
        padding changes nothing. `documents` (data/documents.py): per-document positions and attention
        (--reset-position-ids, --reset-attention-mask); the loss mask is the caller's (masked_token_mean).
        """
        mtp = self.mtp_tracker is not None and labels is not None and self.training
        parts = (0, MTP_PASS) if mtp else (0,)
        final_hidden = self.hidden_states(tokens, documents, parts)
        if mtp:
            # the MTP losses ride on the hidden states' backward (gpt/mtp.py); the returned loss is the LM's alone
            final_hidden = attach_mtp_loss(self, final_hidden, tokens, labels, documents)
        self.fp8_pass_ends(parts)
        return self.output(final_hidden, labels)

    def output(self, final_hidden: torch.Tensor, labels: torch.Tensor | None) -> torch.Tensor:
        """The output layer (and the loss, with labels) on the final norm's output (gpt/output_head.py)."""
        return output_of(self, final_hidden, labels)


def compile_blocks(model: GPTModel, options: Optional[dict] = None) -> None:
    """torch.compile each transformer block in place (nn.Module.compile: names, parameters and hooks
    stay as they are). Call it after parallelism is applied. What must stay eager is marked so where
    it is defined: the communicator's collectives (byte accounting) and ZeRO stage 3's gather hooks
    (Python bookkeeping that would otherwise be traced and recompiled every step). With
    --overlap-param-gather a block waits for its parameters' gathers as it is entered
    (zero/gated_parameters.py), so the compiled forward never sees a gather in flight. `options`: inductor's
    (gpt/fp8.py compile_options), None for its defaults."""
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
    """A GPTModel with this TP rank's whole slice materialized on `state.device` (tests, tools and
    single-process use; training materializes through ZeRO, which holds only what each rank owns)."""
    return materialize(GPTModel(config, state, rng, plan=plan), seed, device=state.device, dtype=dtype)
