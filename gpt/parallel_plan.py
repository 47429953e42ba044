"""The GPT's tensor- and sequence-parallel plan, declared in one table.

Which module is column-, row- or vocab-parallel (`LAYER_STYLES`) and which regions hold a slice of the
sequence under sequence parallelism (`SEQUENCE_REGIONS`) are said here once, as torchtitan's
`models/llama3/parallelize.py` (`apply_tp`) declares a `layer_plan` of ColwiseParallel / RowwiseParallel /
SequenceParallel styles per module name, and as Megatron-Core's `gpt_layer_specs.py` names
ColumnParallelLinear for `linear_qkv` and `linear_fc1`, RowParallelLinear for `linear_proj` and
`linear_fc2`, and its GPTModel a VocabParallelEmbedding and a column-parallel `output_layer`.

`tensor_parallel_plan` decides (training/build.py's `parallelize` calls it once); the model's constructors
(gpt/model.py, gpt/mlp.py) receive the `TensorParallelPlan` and build each layer through it
(`plan.linear(name, ...)`), so no constructor asks the configuration whether the sequence is split. The
layers are still built parallel at construction, on the meta device, before ZeRO materializes them.

Names are module paths: a block's relative to the block (`attention.dense` is `blocks.N.attention.dense`),
the rest relative to the model.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from torch import nn

from gpt.moe.dispatchers import AllGatherDispatcher, AllToAllDispatcher
from parallel.config import ParallelismConfig
from parallel.layers import ColumnParallelLinear, RowParallelLinear, VocabParallelEmbedding
from parallel.random import TensorParallelRNG
from parallel.state import ParallelState

COLUMN, ROW, VOCAB = "column", "row", "vocab"
STYLE_CLASSES = {COLUMN: ColumnParallelLinear, ROW: RowParallelLinear, VOCAB: VocabParallelEmbedding}

# Every tensor-parallel module of the GPT and its style. Column: the output features split over the TP ranks
# (under sequence parallelism the input all-gathers the sequence); row: the input features split, the output
# summed (reduce-scattered along the sequence under sequence parallelism); vocab: the vocabulary's rows split.
LAYER_STYLES = {
    "word_embeddings": VOCAB,
    "attention.query_key_value": COLUMN,
    "attention.dense": ROW,
    # multi-latent attention (gpt/mla.py, Megatron-Core's MLASelfAttention): the heads' projections split; the down
    # projections are replicated, outside the table
    "attention.linear_q_proj": COLUMN,
    "attention.linear_q_up_proj": COLUMN,
    "attention.linear_kv_up_proj": COLUMN,
    "attention.linear_proj": ROW,
    # Gated DeltaNet (gpt/gated_delta_net.py, Megatron-Core's GatedDeltaNet): its in_proj's rows per head split
    "attention.in_proj": COLUMN,
    # out_proj: Mamba-2's (an `M` block's mixer, gpt/mamba.py, Megatron-Core's MambaMixer, whose in_proj's parts
    # split themselves) and Gated DeltaNet's, the heads' output
    "attention.out_proj": ROW,
    "mlp.dense_h_to_4h": COLUMN,           # GPT-2's MLP
    "mlp.dense_h_to_4h_gate": COLUMN,      # SwiGLU's gate and up (gpt/mlp.py)
    "mlp.dense_h_to_4h_up": COLUMN,
    "mlp.dense_4h_to_h": ROW,
    "output_layer": COLUMN,                # untied: the vocabulary's rows, as the embedding's
    "mtp.eh_proj": COLUMN,                 # multi-token prediction's 2h -> h projection (gpt/mtp.py), gathered after
    # an MoE layer's shared experts under TP (gpt/moe/layer.py TensorParallelSharedExperts, Megatron-Core's
    # SharedExpertMLP): the MLP's styles; the routed experts split over the expert TP group instead (experts.py)
    "mlp.shared_experts.dense_h_to_4h": COLUMN,
    "mlp.shared_experts.dense_h_to_4h_gate": COLUMN,
    "mlp.shared_experts.dense_h_to_4h_up": COLUMN,
    "mlp.shared_experts.dense_4h_to_h": ROW,
}

# The regions outside the TP layers, which hold 1/TP of the sequence under sequence parallelism (Megatron-Core's
# GPTModel with config.sequence_parallel): their norms' gradients are summed over the TP group and their dropout
# draws from the rank's private stream. Between them the sequence is whole: after each column layer's all-gather
# and before each row layer's reduce-scatter, and from the output layer's gather to the loss.
SEQUENCE_REGIONS = (
    "embedding_dropout",                  # the embedding's output: reduce-scattered or scattered
    "input_layernorm",                    # each block's (relative to the block)
    "post_attention_layernorm",
    "attention_output_layernorm",         # --sublayer-norms output / input_and_output: on each sublayer's output
    "mlp_output_layernorm",
    "hidden_dropout",                     # each block's residual dropout
    "final_layernorm",                    # the final norm; the output layer gathers the sequence after it
    "mtp_norm",                           # an MTP layer's enorm, hnorm and final_layernorm (gpt/mtp.py)
)


@dataclass(frozen=True)
class TensorParallelPlan:
    """The decision for one model: the TP state its layers split over and whether the regions of
    `SEQUENCE_REGIONS` split the sequence (Megatron's --sequence-parallel with TP > 1)."""
    state: ParallelState
    sequence_parallel: bool = False
    # Expert parallelism (state.experts, the experts' own grid): how tokens reach the experts' ranks
    # (--moe-token-dispatcher-type, gpt/moe/dispatchers.py); unused at expert-parallel size 1.
    token_dispatcher: str = "allgather"

    def experts(self, num_experts: int):
        """An MoE layer's dispatcher and the global indices of this rank's experts: at expert-parallel and expert
        tensor-parallel size 1 None (the layer's LocalDispatcher) and every expert; above it the
        --moe-token-dispatcher-type dispatcher over the expert tensor-and-model group (ETP x EP; with ETP > 1 it
        gathers the ETP peers' rows, each peer running its slice of the experts) and this rank's contiguous share
        (expert e on EP rank e // (E / EP), as Megatron-Core's local_expert_indices), named by global index so
        checkpoints name experts alike at any EP size."""
        experts = self.state.experts
        if experts.model_size == 1 and experts.tensor_size == 1:
            return None, None
        kind = AllToAllDispatcher if self.token_dispatcher == "alltoall" else AllGatherDispatcher
        dispatcher = kind(experts, num_experts, self.state.comm)
        return dispatcher, list(range(dispatcher.first_local, dispatcher.first_local + dispatcher.num_local))

    def style(self, name: str) -> str:
        """The declared style of module `name`; a module the plan does not name is refused, so that no
        tensor-parallel layer is built outside the table."""
        try:
            return LAYER_STYLES[name]
        except KeyError:
            raise ValueError(f"{name!r} is not in the tensor-parallel plan (gpt/parallel_plan.py LAYER_STYLES)") \
                from None

    def linear(self, name: str, in_features: int, out_features: int, *, init_std: float, bias: bool) -> nn.Module:
        """The column- or row-parallel linear `name` is declared as; under sequence parallelism its input
        gathers (column) or its output reduce-scatters (row) the sequence."""
        style = self.style(name)
        if style not in (COLUMN, ROW):
            raise ValueError(f"{name!r} is {style}-parallel in the plan, not a linear")
        return STYLE_CLASSES[style](in_features, out_features, state=self.state, init_std=init_std, bias=bias,
                                    sequence_parallel=self.sequence_parallel)

    def output_linear(self, name: str, in_features: int, out_features: int, *, init_std: float,
                      vocab_size: int) -> nn.Module:
        """The untied output layer: column-parallel over the (padded) vocabulary, no bias; its first `vocab_size`
        rows are real. Its weight is read by the loss directly, after the model gathers the sequence
        (GPTModel.output), so the layer itself gathers nothing."""
        if self.style(name) != COLUMN:
            raise ValueError(f"{name!r} must be column-parallel in the plan")
        return ColumnParallelLinear(in_features, out_features, state=self.state, init_std=init_std, bias=False,
                                    real_rows=vocab_size)

    def embedding(self, name: str, vocab_size: int, padded_vocab_size: int, hidden_size: int, *, init_std: float,
                  scatter_in_lookup: bool) -> nn.Module:
        """The vocab-parallel embedding; `scatter_in_lookup`: under sequence parallelism, whether its sum over
        the TP ranks is a reduce-scatter along the sequence (nothing is added after the lookup) rather than a
        sum followed by a scatter (the model's own, after learned positions)."""
        if self.style(name) != VOCAB:
            raise ValueError(f"{name!r} must be vocab-parallel in the plan")
        return VocabParallelEmbedding(vocab_size, padded_vocab_size, hidden_size, state=self.state,
                                      init_std=init_std,
                                      reduce_scatter_output=self.sequence_parallel and scatter_in_lookup)

    def splits(self, region: str) -> bool:
        """Whether `region` (one of SEQUENCE_REGIONS) holds a slice of the sequence."""
        if region not in SEQUENCE_REGIONS:
            raise ValueError(f"{region!r} is not a region of the plan (gpt/parallel_plan.py SEQUENCE_REGIONS)")
        return self.sequence_parallel

    def norm_state(self, region: str) -> Optional[ParallelState]:
        """What a norm of `region` takes: the state whose TP group sums its gradients when it holds a slice
        of the sequence, else None (gpt/norms.py)."""
        return self.state if self.splits(region) else None

    def dropout_rng(self, region: str, rng: Optional[TensorParallelRNG]) -> Optional[TensorParallelRNG]:
        """The stream a dropout of `region` draws from: the rank's private one where the sequence is split
        (Megatron-Core forks the tracker there), else None (the stream every TP rank shares)."""
        return rng if self.splits(region) else None


def tensor_parallel_plan(state: ParallelState, parallel: Optional[ParallelismConfig] = None) -> TensorParallelPlan:
    """The plan for `state`'s tensor-parallel group under the `parallel` section (None: no sequence
    parallelism). Megatron's --sequence-parallel with TP 1 splits nothing: the plain model."""
    sequence_parallel = parallel is not None and parallel.sequence_parallel and state.tensor_parallel_size > 1
    dispatcher = parallel.token_dispatcher if parallel is not None else "allgather"
    return TensorParallelPlan(state, sequence_parallel, dispatcher)
