"""The `parallel` section of the configuration: how the model is split over the ranks (TP and sequence parallelism, the
pipeline, context parallelism, the experts' EP x ETP grid), each field a flag under Megatron's own name. Data
parallelism is what the world leaves: world / (TP x CP x PP)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

from base.errors import ConfigError
from base.options import option

# Megatron-Core's flex dispatcher backends
FLEX_BACKENDS = ("deepep", "hybridep", "ncclep")


@dataclass(frozen=True)
class ParallelismConfig:
    tensor_model_parallel_size: int = option(1, aliases={"--model-parallel-size": "DeepSpeed-Megatron"})
    # with TP 1 there is nothing to split
    sequence_parallel: bool = option(
        False, action="store_true",
        help="with --tensor-model-parallel-size > 1: norms, dropout and the residual stream hold 1/TP of the "
             "sequence (all-gather before, reduce-scatter after each TP region, in place of the all-reduces); "
             "--seq-length must be divisible by the TP size")
    context_parallel_size: int = option(
        1, help="context parallelism (Megatron's rank order: TP, then CP, then DP, then PP): each rank holds 2 of "
                "the sequence's 2 x CP chunks (r and 2CP-1-r), attention exchanges keys and values (--cp-comm-type), "
                "gradients average over DP x CP")
    # the CP group cut in levels; --cp-comm-type a2a+p2p runs on two
    hierarchical_context_parallel_sizes: Optional[list[int]] = option(
        None, nargs="+", type=int, metavar="SIZE",
        help="the context-parallel group in levels whose sizes multiply to --context-parallel-size: with "
             "--cp-comm-type a2a+p2p, A B = an all-to-all over A adjacent CP ranks, then the ring over B of them")
    pipeline_model_parallel_size: int = option(
        1, help="pipeline stages (Megatron's rank order: TP fastest, then DP, then PP); the layers split evenly, "
                "scheduled 1F1B")
    num_layers_per_virtual_pipeline_stage: Optional[int] = option(
        None, help="layers per model chunk: each stage holds several chunks, scheduled as Megatron's interleaved 1F1B")
    num_virtual_stages_per_pipeline_rank: Optional[int] = option(
        None, help="model chunks per stage (Megatron's other spelling of --num-layers-per-virtual-pipeline-stage)")
    microbatch_group_size_per_virtual_pipeline_stage: Optional[int] = option(
        None, help="interleaved schedule: micro-batches that run through one model chunk before the next chunk "
                   "(Megatron's schedule table; default --pipeline-model-parallel-size); the order, not the math")
    account_for_embedding_in_pipeline_split: bool = option(
        False, help="count the embedding as one layer when the layers split over the stages (the first stage "
                    "builds one transformer layer fewer)")
    account_for_loss_in_pipeline_split: bool = option(
        False, help="count the loss as one layer when the layers split over the stages (the last stage builds "
                    "one transformer layer fewer)")
    # Megatron-Core's layout string: E, t, m, L per virtual stage, `|` between them
    pipeline_model_parallel_layout: Optional[str] = option(
        None, help="Megatron-Core's pipeline layout, e.g. 'Et*3|(tt|)*6tmL': the virtual stages separated by |, "
                   "each its E (embedding), t (transformer layers), m (MTP layers) and L (loss); virtual stage k is "
                   "model chunk k // PP of rank k mod PP. MTP layers only in the last stage's last chunk; every "
                   "stage needs a t")
    decoder_first_pipeline_num_layers: Optional[int] = option(
        None, help="layers of the first pipeline stage (Megatron-LM's uneven split; the rest evenly over the others)")
    decoder_last_pipeline_num_layers: Optional[int] = option(
        None, help="layers of the last pipeline stage (Megatron-LM's uneven split; the rest evenly over the others)")

    # the experts split over EP ranks carved out of the data-parallel ranks
    expert_model_parallel_size: int = option(
        1, aliases={"--moe-expert-parallel-size": "Megatron-DeepSpeed"},
        help="ranks the experts of each MoE layer are split over (each holds --num-experts / EP of them; tokens "
             "travel by --moe-token-dispatcher-type); must divide the data-parallel size and --num-experts")
    expert_tensor_parallel_size: Optional[int] = option(
        None, help="tensor parallelism inside each expert (Megatron's default: --tensor-model-parallel-size): 1 "
                   "(whole experts) or more (each expert's ffn split over that many ranks); the experts' grid "
                   "(this x --expert-model-parallel-size x the expert data-parallel size) folds over the same "
                   "ranks as TP x CP x DP, as Megatron-Core's, so it may differ from the TP size")
    moe_token_dispatcher_type: str = option(
        "allgather", choices=("allgather", "alltoall", "flex"),
        help="how tokens reach their experts' ranks under expert parallelism: allgather (every token to every "
             "expert-parallel rank) or alltoall (each token to its experts' ranks); the same numbers; flex "
             "(Megatron's DeepEP/HybridEP/NCCL-EP kernels over the expert TP x EP group) moves the same tokens as "
             "alltoall and runs alltoall here (said at start-up)")
    moe_flex_dispatcher_backend: str = option(
        "deepep", choices=FLEX_BACKENDS,
        help="with --moe-token-dispatcher-type flex: the GPU kernels Megatron dispatches with (DeepEP, HybridEP, "
             "NCCL-EP); none is used here, the alltoall dispatcher moves the same tokens")
    moe_enable_deepep: bool = option(
        False, action="store_true",
        help="Megatron-LM's deprecated spelling of --moe-flex-dispatcher-backend deepep (needs "
             "--moe-token-dispatcher-type flex)")

    def validate(self) -> None:
        for name, flag in (("tensor_model_parallel_size", "--tensor-model-parallel-size"),
                           ("pipeline_model_parallel_size", "--pipeline-model-parallel-size"),
                           ("context_parallel_size", "--context-parallel-size"),
                           ("expert_model_parallel_size", "--expert-model-parallel-size")):
            if getattr(self, name) < 1:
                raise ConfigError(f"{flag} must be at least 1, got {getattr(self, name)}", flags=(flag,))
        levels, cp = self.hierarchical_context_parallel_sizes, self.context_parallel_size
        if levels and (min(levels) < 1 or math.prod(levels) != cp):
            raise ConfigError(f"--hierarchical-context-parallel-sizes {' '.join(map(str, levels))} must multiply to "
                              f"--context-parallel-size {cp} (sizes of at least 1)",
                              flags=("--hierarchical-context-parallel-sizes", "--context-parallel-size"))
        if self.expert_tensor_parallel_size is not None and self.expert_tensor_parallel_size < 1:
            raise ConfigError(f"--expert-tensor-parallel-size must be at least 1, got {self.expert_tensor_parallel_size}",
                              flags=("--expert-tensor-parallel-size",))
        self.validate_flex()

    def validate_flex(self) -> None:
        """TransformerConfig.__post_init__'s flex dispatcher checks, each one line naming the flags."""
        flex = self.moe_token_dispatcher_type == "flex"
        if self.moe_enable_deepep:
            if not flex:
                raise ConfigError("--moe-enable-deepep needs --moe-token-dispatcher-type flex (DeepEP is one of the "
                                  "flex dispatcher's backends, as Megatron-Core requires)",
                                  flags=("--moe-enable-deepep", "--moe-token-dispatcher-type"))
            if self.moe_flex_dispatcher_backend == "hybridep":
                raise ConfigError("--moe-enable-deepep with --moe-flex-dispatcher-backend hybridep: the flex "
                                  "dispatcher takes one backend (Megatron-Core refuses both); drop one",
                                  flags=("--moe-enable-deepep", "--moe-flex-dispatcher-backend"))
        if self.moe_flex_dispatcher_backend == "ncclep" and not flex:
            raise ConfigError("--moe-flex-dispatcher-backend ncclep needs --moe-token-dispatcher-type flex (as "
                              "Megatron-Core requires)",
                              flags=("--moe-flex-dispatcher-backend", "--moe-token-dispatcher-type"))

    @property
    def flex_backend(self) -> str:
        """The flex dispatcher's backend as Megatron-Core resolves it."""
        return "deepep" if self.moe_enable_deepep else self.moe_flex_dispatcher_backend

    @property
    def dispatcher_name(self) -> str:
        """The dispatcher as the start-up line and the plan name it."""
        if self.moe_token_dispatcher_type == "flex":
            return f"flex ({self.flex_backend}), run as alltoall"
        return self.moe_token_dispatcher_type

    def flex_note(self, experts: bool) -> Optional[str]:
        """The start-up line of a flex launch: what runs in place of the backend's kernels (None otherwise)."""
        if self.moe_token_dispatcher_type != "flex" or not experts:
            return None
        kernels = {"deepep": "DeepEP", "hybridep": "HybridEP", "ncclep": "NCCL-EP"}[self.flex_backend]
        return (f"> --moe-token-dispatcher-type flex ({self.flex_backend} backend): Megatron-Core's flex dispatcher "
                f"moves each token to its experts' ranks over the expert TP x EP group with {kernels}'s GPU "
                f"kernels, which are not used here (none runs on a CPU); the alltoall dispatcher moves the same "
                f"tokens over the same ranks, with the same numbers")

    @property
    def token_dispatcher(self) -> str:
        """The dispatcher that runs: flex moves the same tokens as alltoall."""
        return "alltoall" if self.moe_token_dispatcher_type == "flex" else self.moe_token_dispatcher_type


# the section checkpoint metadata records each setting under (the section it lived in before this one existed)
RECORDED_SECTION = {"sequence_parallel": "model"}
RECORDED_DEFAULT = "training"


def recorded_section(name: str) -> str:
    """The recorded config's section that holds the parallel setting `name`."""
    return RECORDED_SECTION.get(name, RECORDED_DEFAULT)
