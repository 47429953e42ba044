"""The GPT's tensor- and sequence-parallel plan in one table, as torchtitan's apply_tp declares a layer plan."""

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

# Column: output features split; row: input features split, output summed; vocab: vocabulary rows split.
LAYER_STYLES = {
    "word_embeddings": VOCAB,
    "attention.query_key_value": COLUMN,
    "attention.dense": ROW,
    "attention.linear_q_proj": COLUMN,
    "attention.linear_q_up_proj": COLUMN,
    "attention.linear_kv_up_proj": COLUMN,
    "attention.linear_proj": ROW,
    "attention.in_proj": COLUMN,
    "attention.out_proj": ROW,
    "mlp.dense_h_to_4h": COLUMN,
    "mlp.dense_h_to_4h_gate": COLUMN,
    "mlp.dense_h_to_4h_up": COLUMN,
    "mlp.dense_4h_to_h": ROW,
    "output_layer": COLUMN,
    "mtp.eh_proj": COLUMN,
    # shared experts under TP; routed experts split over the expert TP group instead
    "mlp.shared_experts.dense_h_to_4h": COLUMN,
    "mlp.shared_experts.dense_h_to_4h_gate": COLUMN,
    "mlp.shared_experts.dense_h_to_4h_up": COLUMN,
    "mlp.shared_experts.dense_4h_to_h": ROW,
}

# Regions holding 1/TP of the sequence under SP: norm gradients summed over TP, dropout from the private stream.
SEQUENCE_REGIONS = (
    "embedding_dropout",
    "input_layernorm",
    "post_attention_layernorm",
    "attention_output_layernorm",
    "mlp_output_layernorm",
    "hidden_dropout",
    "final_layernorm",
    "mtp_norm",
)


@dataclass(frozen=True)
class TensorParallelPlan:
    """One model's decision: the TP state its layers split over, and whether SEQUENCE_REGIONS split the sequence."""
    state: ParallelState
    sequence_parallel: bool = False
    # expert parallelism: how tokens reach the experts' ranks; unused at EP 1
    token_dispatcher: str = "allgather"

    def experts(self, num_experts: int):
        """An MoE layer's dispatcher and this rank's global expert indices (None and all experts at EP = ETP = 1)."""
        experts = self.state.experts
        if experts.model_size == 1 and experts.tensor_size == 1:
            return None, None
        kind = AllToAllDispatcher if self.token_dispatcher == "alltoall" else AllGatherDispatcher
        dispatcher = kind(experts, num_experts, self.state.comm)
        return dispatcher, list(range(dispatcher.first_local, dispatcher.first_local + dispatcher.num_local))

    def style(self, name: str) -> str:
        """The declared style of `name`; an undeclared name is refused, so no TP layer is built outside the table."""
        try:
            return LAYER_STYLES[name]
        except KeyError:
            raise ValueError(f"{name!r} is not in the tensor-parallel plan (gpt/parallel_plan.py LAYER_STYLES)") \
                from None

    def linear(self, name: str, in_features: int, out_features: int, *, init_std: float, bias: bool) -> nn.Module:
        """The column- or row-parallel linear `name` is declared as."""
        style = self.style(name)
        if style not in (COLUMN, ROW):
            raise ValueError(f"{name!r} is {style}-parallel in the plan, not a linear")
        return STYLE_CLASSES[style](in_features, out_features, state=self.state, init_std=init_std, bias=bias,
                                    sequence_parallel=self.sequence_parallel)

    def output_linear(self, name: str, in_features: int, out_features: int, *, init_std: float,
                      vocab_size: int) -> nn.Module:
        """The untied output layer, column-parallel over the padded vocabulary; gathers nothing itself."""
        if self.style(name) != COLUMN:
            raise ValueError(f"{name!r} must be column-parallel in the plan")
        return ColumnParallelLinear(in_features, out_features, state=self.state, init_std=init_std, bias=False,
                                    real_rows=vocab_size)

    def embedding(self, name: str, vocab_size: int, padded_vocab_size: int, hidden_size: int, *, init_std: float,
                  scatter_in_lookup: bool) -> nn.Module:
        """The vocab-parallel embedding; `scatter_in_lookup`: its TP sum is a reduce-scatter under SP."""
        if self.style(name) != VOCAB:
            raise ValueError(f"{name!r} must be vocab-parallel in the plan")
        return VocabParallelEmbedding(vocab_size, padded_vocab_size, hidden_size, state=self.state,
                                      init_std=init_std,
                                      reduce_scatter_output=self.sequence_parallel and scatter_in_lookup)

    def splits(self, region: str) -> bool:
        if region not in SEQUENCE_REGIONS:
            raise ValueError(f"{region!r} is not a region of the plan (gpt/parallel_plan.py SEQUENCE_REGIONS)")
        return self.sequence_parallel

    def norm_state(self, region: str) -> Optional[ParallelState]:
        return self.state if self.splits(region) else None

    def dropout_rng(self, region: str, rng: Optional[TensorParallelRNG]) -> Optional[TensorParallelRNG]:
        return rng if self.splits(region) else None


def tensor_parallel_plan(state: ParallelState, parallel: Optional[ParallelismConfig] = None) -> TensorParallelPlan:
    """The plan for `state`'s TP group; --sequence-parallel at TP 1 splits nothing."""
    sequence_parallel = parallel is not None and parallel.sequence_parallel and state.tensor_parallel_size > 1
    dispatcher = parallel.token_dispatcher if parallel is not None else "allgather"
    return TensorParallelPlan(state, sequence_parallel, dispatcher)
