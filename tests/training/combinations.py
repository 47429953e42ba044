"""The parallel combinations as one table (issue 82 item 7), in the shape of torchtitan's
tests/integration_tests/features.py: each entry a model, a layout, a rank count and the tolerance it is held to
against the same model on one rank; tests/training/test_combinations.py runs them all one way.
scripts/tools/layout_fuzz.py
draws its random layouts as `Layout`s, so the table and the fuzz name a layout's dimensions, and render them as
Megatron-LM's flags, in one place.

To add a combination: append a `Combination` to TABLE (a new model goes in MODELS); `why` says why its tolerances.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Optional

from tests.reliability_helpers import TINY
from tests.training.test_tensor_parallel_training import COMMON, NO_DROPOUT


@dataclass(frozen=True)
class Layout:
    """One value per dimension; None or False leaves the flag out (the default). Rendered in this order."""
    tp: Optional[int] = None
    sp: bool = False
    cp: Optional[int] = None
    cp_comm: Optional[str] = None              # p2p, all_gather, a2a or a2a+p2p
    hierarchical_cp: Optional[tuple] = None    # a2a+p2p's two levels: all-to-all size, ring size
    pp: Optional[int] = None
    vp_layers: Optional[int] = None            # layers per virtual pipeline stage
    virtual_stages: Optional[int] = None       # or model chunks per stage (--num-virtual-stages-per-pipeline-rank)
    first_stage_layers: Optional[int] = None   # an uneven first stage
    zero: Optional[str] = None                 # "0".."3", or "distributed-optimizer"
    overlap_param_gather: bool = False
    overlap_grad_reduce: bool = False
    offload_optimizer: bool = False
    offload_fraction: Optional[float] = None   # --optimizer-offload-fraction: this share of the optimizer on the host
    recompute: Optional[str] = None            # "full" (uniform, 1 layer a group), "block" or "selective": Megatron's
    checkpoint_activations: bool = False       # ZeRO-R's checkpoints, with P_a and M_D below
    partition_activations: bool = False
    contiguous_checkpointing: bool = False
    ep: Optional[int] = None
    etp: Optional[int] = None

    def flags(self) -> list[str]:
        flags = []
        before_zero = {"tp": "--tensor-model-parallel-size", "sp": "--sequence-parallel",
                       "cp": "--context-parallel-size", "cp_comm": "--cp-comm-type",
                       "pp": "--pipeline-model-parallel-size", "vp_layers": "--num-layers-per-virtual-pipeline-stage",
                       "virtual_stages": "--num-virtual-stages-per-pipeline-rank",
                       "first_stage_layers": "--decoder-first-pipeline-num-layers"}
        for name, flag in before_zero.items():
            value = getattr(self, name)
            flags += [flag] if value is True else [flag, str(value)] if value not in (None, False) else []
            if name == "cp_comm" and self.hierarchical_cp is not None:
                flags += ["--hierarchical-context-parallel-sizes", *map(str, self.hierarchical_cp)]
        if self.zero is not None:
            flags += ["--use-distributed-optimizer"] if self.zero == "distributed-optimizer" else ["--zero-stage",
                                                                                                   self.zero]
        switches = {"overlap_param_gather": "--overlap-param-gather", "overlap_grad_reduce": "--overlap-grad-reduce",
                    "offload_optimizer": "--offload-optimizer"}
        flags += [flag for name, flag in switches.items() if getattr(self, name)]
        if self.offload_fraction is not None:
            flags += ["--optimizer-offload-fraction", str(self.offload_fraction)]
        if self.recompute in ("full", "block"):
            method = "uniform" if self.recompute == "full" else "block"
            flags += ["--recompute-granularity", "full", "--recompute-method", method, "--recompute-num-layers", "1"]
        elif self.recompute is not None:
            flags += ["--recompute-granularity", self.recompute]
        zero_r = {"checkpoint_activations": "--checkpoint-activations", "partition_activations":
                  "--partition-activations", "contiguous_checkpointing": "--contiguous-checkpointing"}
        flags += [flag for name, flag in zero_r.items() if getattr(self, name)]
        for name, flag in {"ep": "--expert-model-parallel-size", "etp": "--expert-tensor-parallel-size"}.items():
            flags += [flag, str(getattr(self, name))] if getattr(self, name) is not None else []
        return flags


DIMENSIONS = tuple(field.name for field in fields(Layout))


@dataclass(frozen=True)
class Model:
    """The flags both runs take, the corpus fixture they read, and what the one-rank run must show first: its
    iteration count, a loss that fell by `learns` (the run trains), every grad norm above `clips` (every step clips)."""
    flags: tuple[str, ...]
    corpus: str = "corpus_cache_300"
    iterations: int = 2
    learns: Optional[float] = None
    clips: Optional[float] = None


SMALL = (*COMMON, *NO_DROPOUT)
MUON_OPTIMIZER = ("--optimizer", "muon", "--muon-fp32-matmul-prec", "high", "--lr", "0.01", "--group-query-attention",
                  "--num-query-groups", "2", "--train-iters", "8")
MUON = (*SMALL, *MUON_OPTIMIZER)
MOE_STAGES = (*TINY, "--num-layers", "4", "--num-experts", "4", "--moe-router-topk", "2",
              "--moe-router-load-balancing-type", "aux_loss", "--moe-aux-loss-coeff", "1e-2", "--moe-z-loss-coeff",
              "1e-3", "--moe-token-dispatcher-type", "alltoall", "--seed", "5", "--train-iters", "3",
              "--global-batch-size", "8")
# Gemma 3's blocks with more (GeGLU, --apply-layernorm-1p, norms on each sublayer's input and output, scaled
# embeddings, per-head q/k norms, --softmax-scale, both soft-cappings, alternating sliding windows with a local rotary
# base, linear rotary interpolation, partial rotary, q/k/v biases, head width 24 at hidden 64 / 4 heads, grouped-query
# attention, an untied output); OLMo 2's (norms on the sublayers' output, q/k norms over the whole projections, whose
# statistics TP sums) with Phi-3's LongRoPE: an original context of 16 under the 32-token sequence (its long factors)
FIVE = ("--train-iters", "5", "--normalization", "RMSNorm", "--disable-bias-linear",
        "--untie-embeddings-and-output-weights", "--norm-epsilon", "1e-6")
GEMMA_AND_MORE = (*FIVE, "--position-embedding-type", "rope", "--gated-linear-unit", "--activation", "gelu_tanh",
                  "--ffn-hidden-size", "96", "--group-query-attention", "--num-query-groups", "2", "--kv-channels",
                  "24", "--add-qkv-bias", "--qk-layernorm", "--apply-layernorm-1p", "--sublayer-norms",
                  "input_and_output", "--scale-embeddings-by-sqrt-hidden", "--softmax-scale", "0.2",
                  "--attn-logit-softcapping", "20", "--final-logit-softcapping", "30", "--window-size", "7,0",
                  "--window-attn-skip-freq", "2", "--local-rotary-base", "500", "--rotary-seq-len-interpolation-factor",
                  "2", "--rotary-percent", "0.5")
OLMO = (*FIVE, "--position-embedding-type", "longrope", "--longrope-short-factor", "1,1.2,1.5,2,3,5,8,13",
        "--longrope-long-factor", "1.1,1.7,2.5,4,6.5,10,16,25", "--longrope-original-max-position-embeddings", "16",
        "--swiglu", "--ffn-hidden-size", "96", "--qk-layernorm", "--qk-layernorm-over-projection", "--sublayer-norms",
        "output")
# 4.2M-element MLP weights (256 x 16384) beside small attention ones, clipped at every step
WIDE = ("--num-layers", "2", "--hidden-size", "256", "--ffn-hidden-size", "16384", "--num-attention-heads", "8",
        "--seq-length", "16", "--max-position-embeddings", "16", "--micro-batch-size", "1", "--global-batch-size", "4",
        "--train-iters", "2", "--eval-iters", "0", "--log-interval", "1", "--tokenizer-vocab-size", "300",
        "--device", "cpu", "--hidden-dropout", "0", "--attention-dropout", "0", "--seed", "1", "--lr", "1e-3",
        "--clip-grad", "0.1")

MODELS = {
    "gpt2": Model(SMALL, "corpus_cache", 20, learns=0.3),
    "gemma": Model((*SMALL, *GEMMA_AND_MORE), "corpus_cache", 5, learns=0.0),
    "olmo": Model((*SMALL, *OLMO), "corpus_cache", 5),
    "muon duplicated": Model((*MUON, "--muon-tp-mode", "duplicated"), "corpus_cache", 8, learns=0.3),
    "muon distributed": Model((*MUON, "--muon-tp-mode", "distributed"), "corpus_cache", 8, learns=0.3),
    "muon moe": Model((*MUON, "--muon-tp-mode", "duplicated", "--num-experts", "2", "--moe-router-topk", "2",
                       "--moe-token-dispatcher-type", "alltoall"), "corpus_cache", 8, learns=0.3),
    "moe dense first layer": Model((*MOE_STAGES, "--moe-layer-freq", "[0,1,1,1]"), iterations=3),
    "moe dense second stage": Model((*MOE_STAGES, "--moe-layer-freq", "[1,1,0,0]"), iterations=3),
    "moe dense first stage": Model((*MOE_STAGES, "--moe-layer-freq", "[0,0,1,1]"), iterations=3),
    "wide": Model(WIDE, clips=0.1),
}



@dataclass(frozen=True)
class Combination:
    """`model` at `layout` on `ranks` ranks logs, at every iteration, each key of `held` within its relative tolerance
    of the model's one-rank run; `why` says why those tolerances."""
    name: str
    model: str
    layout: Layout
    ranks: int
    held: dict
    why: str


def within(rel: float, keys=("loss", "grad_norm")) -> dict:
    return {key: rel for key in keys}


TP_SUMS = "TP sums a row-parallel layer's partial products, and DP the micro-batches' gradients, in another order"
MUON_NS = TP_SUMS + " (NS in fp32, so bf16 does not round that into the step): measured 9e-8"
STAGES = ("DP 2 sums the micro-batches' gradients in another order, the norm is summed from the stages' and the "
          "parts' squares: measured losses 1.7e-7, grad norms 2.5e-7")
NORMS = ("each rank sums its squares in fp64 (zero/grad_norm.py); the gradients' own fp32 rounding is left (in fp32 "
         "ZeRO 1 at DP 2 logged a norm 3.3e-4 off)")
MUON_LOSS, MOE_LOSSES = within(1e-5, ("loss",)), within(1e-6, ("loss", "grad_norm", "load_balancing_loss", "z_loss"))

TABLE = [
    # tensor and data parallelism (20 iterations), the clipped norm counting TP-sharded parameters across ranks
    Combination("gpt2 TP 2", "gpt2", Layout(tp=2), 2, within(1e-4), TP_SUMS),
    Combination("gpt2 TP 4", "gpt2", Layout(tp=4), 4, within(1e-4), TP_SUMS),
    Combination("gpt2 TP 2 x DP 2", "gpt2", Layout(tp=2), 4, within(1e-4), TP_SUMS),
    # issue 63's block features, from the command line
    Combination("gemma TP 2 + SP x DP 2, ZeRO 3", "gemma", Layout(tp=2, sp=True, zero="3"), 4,
                {"loss": 1e-6, "grad_norm": 1e-5}, TP_SUMS),
    Combination("gemma PP 2 x DP 2, ZeRO 1", "gemma", Layout(pp=2, zero="1"), 4, within(1e-6, ("loss",)), STAGES),
    Combination("olmo TP 2 + SP x DP 2, ZeRO 2", "olmo", Layout(tp=2, sp=True, zero="2"), 4, within(1e-6, ("loss",)),
                TP_SUMS),
    # Muon at TP 2 (issue 81): each TP-cut matrix orthogonalized whole, duplicated or distributed
    Combination("muon duplicated TP 2", "muon duplicated", Layout(tp=2), 2, MUON_LOSS, MUON_NS),
    Combination("muon duplicated TP 2 x DP 2, ZeRO 1", "muon duplicated", Layout(tp=2, zero="1"), 4, MUON_LOSS,
                MUON_NS),
    Combination("muon distributed TP 2", "muon distributed", Layout(tp=2), 2, MUON_LOSS, MUON_NS),
    # an expert cut over expert TP (the TP size), stepped by the dense ZeRO (EP 1) or the experts' own (EP 2)
    Combination("muon moe TP 2 + SP", "muon moe", Layout(tp=2, sp=True), 2, MUON_LOSS, MUON_NS),
    Combination("muon moe TP 2 + SP x EP 2", "muon moe", Layout(tp=2, sp=True, ep=2), 4, MUON_LOSS, MUON_NS),
    # stages and chunks that hold no MoE layer (issue 77 item 1)
    Combination("moe interleaved, dense first layer, ZeRO 0", "moe dense first layer",
                Layout(pp=2, ep=2, vp_layers=1, zero="0"), 4, MOE_LOSSES, STAGES),
    Combination("moe dense second stage, ZeRO 1", "moe dense second stage", Layout(pp=2, ep=2, zero="1"), 4,
                MOE_LOSSES, STAGES),
    Combination("moe dense first stage, TP 2 + SP, expert TP 1", "moe dense first stage",
                Layout(tp=2, sp=True, pp=2, etp=1, zero="1"), 4, MOE_LOSSES, STAGES),
    # the logged grad norm, and the clipping after it, whatever the split (issue 77 item 4)
    *[Combination(f"wide DP 2, ZeRO {stage}", "wide", Layout(zero=stage), 2, within(1e-6), NORMS) for stage in "0123"],
    Combination("wide TP 2 + SP", "wide", Layout(zero="1", tp=2, sp=True), 2, within(1e-6), NORMS),
    Combination("wide PP 2", "wide", Layout(zero="1", pp=2), 2, within(1e-6), NORMS),
]
