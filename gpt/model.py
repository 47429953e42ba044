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
residual branch's output projection (attention `dense`, MLP `dense_4h_to_h`) scaled by 1/sqrt(2 * num_layers).
`GPTModel(...)` builds the structure on the meta device (no memory, no draws: milliseconds even at 170B); each
parameter carries its initialisation, a pure function of (seed, name, element index) (parallel/init.py). Memory
comes afterwards, only for what this rank owns: `zero.apply.apply_zero` fills ZeRO's flat buffers directly, and
`build_gpt_model` (tests, tools, one process) materializes the whole TP slice."""

from __future__ import annotations

import functools
import math
from typing import TYPE_CHECKING, Optional

import torch
import torch.nn.functional as F
from torch import nn

from gpt.attention import SelfAttention
from gpt.attention import output_layer_std as _output_layer_std
from gpt.glu import gated_activation
from gpt.kv_cache import LayerCache
from gpt.mla import MLASelfAttention
from gpt.mlp import SwiGLUMLP
from gpt.model_config import ModelConfig
from gpt.moe.balancing import MoELossTracker
from gpt.moe.layer import MoELayer
from gpt.mtp import MTPLossTracker, MultiTokenPredictionLayer, attach_mtp_loss
from gpt.norms import normalization
from gpt.parallel_plan import TensorParallelPlan
from gpt.rotary import RotaryCache
from gpt.stage_layers import StageLayers, whole_model
from gpt.xielu import XIELU
from parallel.context_parallel import positions_on_this_rank
from parallel.cross_entropy import vocab_parallel_cross_entropy
from parallel.fused_linear_cross_entropy import fused_linear_cross_entropy
from parallel.init import InitMethod, materialize, set_init_method
from parallel.layers import entered_region
from parallel.mappings import gather_from_tensor_parallel_region, scatter_to_sequence_parallel_region
from parallel.random import TensorParallelRNG, dropout_stream
from parallel.sharding import also_replicated_over, check_recorded, record_whole
from parallel.state import ParallelState
from zero.gated_parameters import wait_at_region_entry

if TYPE_CHECKING:  # the model reads the masks' tensors; importing it loads no data pipeline (tests/test_layering.py)
    from data.documents import DocumentMasks


# The key of the multi-token prediction layers among a forward's parts (GPTModel.fp8_pass_starts); model chunks are
# keyed by their index on this pipeline rank
MTP_PASS = "mtp"


class MLP(nn.Module):
    """h -> 4h -> GeLU (or squared ReLU, or xIELU with its learned scalars) -> h; the 4h dimension is what
    tensor parallelism splits."""

    def __init__(self, config: ModelConfig, plan: TensorParallelPlan, bias: bool = True):
        super().__init__()
        self.activation = config.mlp.activation
        self.dense_h_to_4h = plan.linear("mlp.dense_h_to_4h", config.hidden_size, config.ffn_size,
                                         init_std=config.init_method_std, bias=bias)
        if config.mlp.activation == "xielu":  # Megatron's MLP.activation_func, a module of its own (gpt/xielu.py)
            self.activation_func = XIELU(plan.state)
        self.dense_4h_to_h = plan.linear("mlp.dense_4h_to_h", config.ffn_size, config.hidden_size,
                                         init_std=_output_layer_std(config), bias=bias)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        if self.activation == "xielu":
            return self.dense_4h_to_h(self.activation_func(self.dense_h_to_4h(hidden)))
        return self.dense_4h_to_h(activation_function(self.activation, self.dense_h_to_4h(hidden)))


def activation_function(name: str, hidden: torch.Tensor) -> torch.Tensor:
    """--activation: GeLU exact or in GPT-2's tanh form, or Megatron-LM's --squared-relu, relu(x)^2
    (megatron/core/activations.py squared_relu: `torch.pow(F.relu(x), 2)`)."""
    if name == "squared_relu":
        return torch.pow(F.relu(hidden), 2)
    return F.gelu(hidden, approximate="tanh" if name == "gelu_tanh" else "none")


class TransformerBlock(nn.Module):
    """Pre-LayerNorm residual block: x + drop(attn(ln(x))), then x + drop(mlp(ln(x))).

    The residual stream is identical on every TP rank, so its dropout uses the shared stream; under
    sequence parallelism each rank holds its own slice of it, and the dropout draws from the rank's
    private stream."""

    def __init__(self, config: ModelConfig, plan: TensorParallelPlan, rng: Optional[TensorParallelRNG],
                 layer_number: int = 0, moe_tracker: Optional[MoELossTracker] = None, kind_of: Optional[int] = None,
                 rotary_cache: Optional[RotaryCache] = None):
        """`kind_of`: the decoder layer whose kind (dense or MoE, its experts) this block takes, where it is not
        `layer_number` itself (an MTP layer's block takes the last decoder layer's, gpt/mtp.py); `rotary_cache`: the
        model's cos and sin, shared by its layers (gpt/rotary.py)."""
        super().__init__()
        kind_of = layer_number if kind_of is None else kind_of
        h, norms, mlp = config.hidden_size, config.norms, config.mlp

        # --recompute-modules layernorm: the input and pre-MLP norms (Megatron-Core's recompute_input_layernorm and
        # recompute_pre_mlp_layernorm, transformer_layer.py) keep only their input and run again in backward
        recomputed_norms = ("input_layernorm", "post_attention_layernorm") \
            if "layernorm" in config.recompute.modules else ()

        def norm(region: str) -> nn.Module:
            return normalization(norms.normalization, h, norms.layernorm_epsilon, plan.norm_state(region),
                                 norms.apply_layernorm_1p, recompute=region in recomputed_norms)

        # --sublayer-norms: the norms on each sublayer's input (GPT-2, Llama), on its output inside the residual
        # branch (OLMo 2: transformers' Olmo2DecoderLayer, residual + norm(attn(x))), or both (Gemma 2/3)
        places = norms.sublayer_norms
        self.input_layernorm = norm("input_layernorm") if places != "output" else None
        # Megatron-LM's --multi-latent-attention: DeepSeek's MLA in the attention's place (gpt/mla.py)
        # the sliding window of this layer's kind (--window-size, --window-attn-skip-freq), or None
        window = config.attention_windows()[kind_of]
        self.attention = MLASelfAttention(config, plan, rng, _output_layer_std(config), rotary_cache=rotary_cache) \
            if config.mla.multi_latent_attention else SelfAttention(
                config, plan, rng, window=window, rotary=config.positions.rotary_layers(config.num_layers)[kind_of],
                rotary_cache=rotary_cache)
        self.post_attention_layernorm = norm("post_attention_layernorm") if places != "output" else None
        self.split_dropout_rng = plan.dropout_rng("hidden_dropout", rng)
        if config.moe_layers()[kind_of]:
            # Megatron-Core's MoE layer in the MLP's place (gpt/moe/layer.py); its experts' MLPs are this block's
            # under expert parallelism its share of the experts and the plan's dispatcher (gpt/parallel_plan.py)
            # (a Megatron-DeepSpeed --num-experts list gives each MoE layer its own count, split over the same group)
            if plan.state.tensor_parallel_size > 1 and not plan.sequence_parallel:
                raise ValueError("an MoE layer under tensor parallelism runs on the sequence-parallel slices "
                                 "(Megatron-Core's MoELayer requires --sequence-parallel with TP)")
            moe = config.moe_of(kind_of)
            dispatcher, local_experts = plan.experts(moe.num_experts)
            self.mlp = MoELayer(h, moe, state=plan.state,
                                activation=functools.partial(activation_function, mlp.activation),
                                swiglu=mlp.gated, glu=gated_activation(mlp),
                                init_std=config.init_method_std,
                                output_init_std=_output_layer_std(config), bias=config.add_bias_linear,
                                layer_number=layer_number, tracker=moe_tracker, dispatcher=dispatcher,
                                local_experts=local_experts, xielu=mlp.activation == "xielu", plan=plan)
        elif mlp.gated:
            # SiLU's gate (--swiglu), quick-GeLU's (--quick-geglu) or --activation's GeLU (--gated-linear-unit:
            # Gemma's GeGLU), with --glu-linear-offset and --activation-func-clamp-value (gpt/glu.py)
            self.mlp = SwiGLUMLP(h, config.ffn_size, plan=plan, init_std=config.init_method_std,
                                 output_init_std=_output_layer_std(config), bias=config.add_bias_linear,
                                 glu=gated_activation(mlp, functools.partial(activation_function, mlp.activation)))
        else:
            self.mlp = MLP(config, plan, bias=config.add_bias_linear)
        self.hidden_dropout = nn.Dropout(config.hidden_dropout)
        # registered after the rest, so that a model without them keeps its parameters' order
        self.attention_output_layernorm = norm("attention_output_layernorm") if places != "input" else None
        self.mlp_output_layernorm = norm("mlp_output_layernorm") if places != "input" else None

    def forward(self, hidden: torch.Tensor, documents: Optional[DocumentMasks] = None,
                cache: Optional[LayerCache] = None) -> torch.Tensor:
        """`cache`: this layer's KV cache, where `hidden` is the tokens after those it holds (gpt/decode.py)."""
        return self.mlp_half(self.attention_half(hidden, documents, cache))

    # The block's two halves, each with its norms, dropout and residual add: Megatron-Core's
    # TransformerLayer._forward_attention and _forward_mlp, the regions --cuda-graph-modules attn and mlp capture
    # (training/cuda_graphs.py).
    def attention_half(self, hidden: torch.Tensor, documents: Optional[DocumentMasks] = None,
                       cache: Optional[LayerCache] = None) -> torch.Tensor:
        branch = self.attention(_normed(self.input_layernorm, hidden), documents, cache)
        return hidden + self._residual_dropout(_normed(self.attention_output_layernorm, branch))

    def mlp_half(self, hidden: torch.Tensor) -> torch.Tensor:
        branch = self.mlp(_normed(self.post_attention_layernorm, hidden))
        return hidden + self._residual_dropout(_normed(self.mlp_output_layernorm, branch))

    def _residual_dropout(self, branch: torch.Tensor) -> torch.Tensor:
        with dropout_stream(self.split_dropout_rng):
            return self.hidden_dropout(branch)


def _normed(norm: Optional[nn.Module], hidden: torch.Tensor) -> torch.Tensor:
    """`norm(hidden)`, or `hidden` where --sublayer-norms puts no norm there."""
    return hidden if norm is None else norm(hidden)


class GPTModel(nn.Module):
    """Built on the meta device (see the module docstring). `rng` supplies the per-TP-rank dropout
    stream for attention; without it (TP=1 tools, tests) attention dropout draws from torch's default
    generator. The config's sections (its norms, MLP, positions, attention, MLA, MTP) pick the blocks.

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
        padded_vocab = config.padded_vocab_size(state.tensor_parallel_size)
        tied = not config.output.untie_embeddings_and_output_weights
        # Whether the word embedding is also the output layer: then a first and a last pipeline stage each hold
        # a copy whose gradients are summed (an untied first stage's output_layer is None too: not a tie).
        self.tied_output = tied
        # Whether a first and a last pipeline stage each hold a copy of the word embedding whose gradients the
        # embedding group sums: tied, or the last stage's MTP layers embed the rolled tokens (Megatron-Core builds
        # its embedding where `pre_process or mtp_process` and ties the copies: tie_word_embeddings_state_dict)
        self.shares_word_embedding = tied or config.mtp.num_layers > 0
        learned_positions = config.positions.position_embedding_type == "learned_absolute"
        # With nothing to add after the lookup, the lookup's sum over TP ranks is a reduce-scatter along the
        # sequence (Megatron-Core's LanguageModelEmbedding: reduce_scatter_embeddings); learned positions
        # are added to the whole sequence first and then split, as there, so their gradient stays whole.
        self.word_embeddings = plan.embedding(
            "word_embeddings", config.vocab_size, padded_vocab, config.hidden_size, init_std=config.init_method_std,
            scatter_in_lookup=not learned_positions) \
            if stage.first or (stage.last and self.shares_word_embedding) else None
        if self.word_embeddings is not None and not stage.first:
            # the last stage's copy of the first stage's word embedding (their gradients summed): a replica over the
            # pipeline stages, the first stage's the one a checkpoint saves (parallel/sharding.py)
            also_replicated_over(self.word_embeddings.weight, "pp")
        if learned_positions and stage.first:
            # `_weight` skips nn.Embedding's own (pointless, on meta) initialisation.
            self.position_embeddings = nn.Embedding(
                config.max_position_embeddings, config.hidden_size,
                _weight=torch.empty(config.max_position_embeddings, config.hidden_size, device="meta"))
            set_init_method(record_whole(self.position_embeddings.weight), InitMethod.normal(config.init_method_std))
        else:
            self.position_embeddings = None
        self.embedding_dropout = nn.Dropout(config.hidden_dropout)
        # Named by their global layer number ("blocks.5." on any stage), so their weights are drawn as the
        # one-stage model's; iteration follows the stage's chunks in order.
        self.blocks = nn.ModuleList()
        # The MoE layers' balancing-loss scale and logged values (gpt/moe/balancing.py); None for a dense model
        self.moe_tracker = MoELossTracker() if config.moe is not None else None
        # cos and sin made once and read by every layer (gpt/rotary.py): a plain object, no module state
        self.rotary_cache = RotaryCache()
        for layer in stage.layer_ids:
            self.blocks.add_module(str(layer), TransformerBlock(config, plan, rng, layer, self.moe_tracker,
                                                                rotary_cache=self.rotary_cache))
        by_layer = dict(zip(stage.layer_ids, self.blocks))
        self.chunk_blocks = [nn.ModuleList(by_layer[layer] for layer in chunk) for chunk in stage.chunks]
        norms = config.norms
        self.final_layernorm = normalization(norms.normalization, config.hidden_size, norms.layernorm_epsilon,
                                             plan.norm_state("final_layernorm"), norms.apply_layernorm_1p) \
            if stage.last else None
        if config.output.untie_embeddings_and_output_weights and stage.last:
            # Megatron's output_layer: column-parallel over the padded vocabulary, no bias; padding rows
            # start at zero as the embedding's do, so they are the same at every TP size.
            self.output_layer = plan.output_linear("output_layer", config.hidden_size, padded_vocab,
                                                   init_std=config.init_method_std, vocab_size=config.vocab_size)
            set_init_method(self.output_layer.weight, InitMethod.normal(config.init_method_std, rows=config.vocab_size))
        else:
            self.output_layer = None
        # The global vocabulary index of this rank's first output column: the embedding's row split, also on
        # a last pipeline stage whose untied output layer is its only vocabulary shard (no embedding there).
        self.output_vocab_start = state.tensor_parallel_rank * (padded_vocab // state.tensor_parallel_size)
        # Megatron-Core's MTP block (gpt/mtp.py) on the last stage: --mtp-num-layers layers, each with one block of
        # the last decoder layer's kind, numbered after the decoder's (num_layers + k, as get_mtp_layer_offset)
        self.mtp_layers = nn.ModuleList()
        self.mtp_tracker = MTPLossTracker(config.mtp.num_layers) if config.mtp.num_layers and stage.last else None
        if self.mtp_tracker is not None:
            for k in range(config.mtp.num_layers):
                block = TransformerBlock(config, plan, rng, config.num_layers + k, self.moe_tracker,
                                         kind_of=config.num_layers - 1, rotary_cache=self.rotary_cache)
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
        hidden = self.word_embeddings(tokens)
        if self.config.output.scale_embeddings_by_sqrt_hidden:
            # Gemma's normalizer sqrt(hidden), rounded to the embedding's dtype as transformers' ScaledWordEmbedding
            # (`self.embed_scale.to(self.weight.dtype)`); elementwise, so also on a sequence-parallel slice
            hidden = hidden * torch.tensor(math.sqrt(self.config.hidden_size), dtype=hidden.dtype)
        if self.position_embeddings is not None:
            # --reset-position-ids' per-document positions (with context parallelism, this rank's chunks of the
            # whole sample's: data/documents_cp.py); else, with context parallelism, its chunks' global positions
            if positions is None:
                positions = documents.position_ids if documents is not None else None
            if positions is None:
                positions = positions_on_this_rank(tokens.shape[1], self.state, tokens.device)
            if positions is None:
                positions = torch.arange(tokens.shape[1], device=tokens.device)
            hidden = hidden + self.position_embeddings(positions)
            if self.sequence_parallel:
                hidden = scatter_to_sequence_parallel_region(hidden, self.state)
        with dropout_stream(self.split_dropout_rng):
            return self.embedding_dropout(hidden)

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
        """The output layer (and the loss, with labels) on the final norm's output."""
        output_weight = self.word_embeddings.weight if self.output_layer is None else self.output_layer.weight
        with entered_region(final_hidden, self.state, self.sequence_parallel) as hidden:
            if labels is not None and self.config.output.cross_entropy_loss_fusion:
                return fused_linear_cross_entropy(hidden, output_weight, labels,
                                                  self.output_vocab_start, self.config.vocab_size,
                                                  self.state)
            logits = F.linear(hidden, output_weight)
        cap = self.config.output.final_logit_softcapping
        if cap is not None:  # Gemma 2's: each rank's vocabulary slice, elementwise (Gemma2ForCausalLM.forward)
            logits = torch.tanh(logits / cap) * cap
        if labels is None:
            return gather_from_tensor_parallel_region(logits, self.state)[..., : self.config.vocab_size]
        # The softmax runs in fp32 even under bf16 autocast: the loss is the one number we compare.
        return vocab_parallel_cross_entropy(logits, labels, self.output_vocab_start,
                                            self.config.vocab_size, self.state, self.config.output.z_loss_strength)


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

