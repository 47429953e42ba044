"""Megatron-Bridge's published DGX-H100 pre-training rows (configs/benchmarks/bridge_h100.yaml) as layouts
this project can plan: each row as pretrain_gpt.py flags (`row_flags`: its model, its layout, and the recipe settings
Bridge's table does not print but the release's perf scripts set: recompute, TP overlap, gradient overlap, the MoE
dispatcher and its overlap, the pipeline split), priced as `python -m zero.plan dry-run --hardware h100-sxm
--trainer megatron-lm` prices those flags (`row_layout`: planner/layout_of_config.py), so the table and the dry run
are one model.

Each row is priced with the settings of its own release: the NeMo container 25.09 ran Megatron-Bridge 0.1.0rc3, 25.11
v0.2.0, 26.02 v0.3.0, 26.02.01 v0.3.1, 26.04 v0.4.0, 26.04.01 v0.4.2 and 26.06 v0.5.0 (Bridge's docs/versions1.json
and docs/releases/software-versions.md), the settings those tags' scripts/performance/configs/<model>/
*workload_base_configs.py (25.09: the *.yaml matrices) through utils/overrides.py (25.09, 25.11: utils/helpers.py)
into the library recipes under src/megatron/bridge/recipes/. What each model's rows ran and the refs each value was
read at are in the comments of RECIPES and RELEASE_RECIPES. Which commit of scripts/performance ran a benchmark is
recorded nowhere; the release's own is assumed. Each pipelined row is priced at the split its flags make here
(training/build.py config_stage_layers), its slowest rank's load. Where the table's printed layout is not what its
release's code ran (RELEASE_LAYOUTS, with the evidence), the row is priced at the code's."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import yaml

from arguments.config import PretrainConfig
from arguments.parser import parse_arguments, parse_config
from planner.layout_of_config import MEGATRON_LM, layout_of_config
from planner.layout_perf import Layout, ModelCounts, model_counts
from planner.vocabulary import launch_vocab

REPOSITORY = Path(__file__).resolve().parent.parent
BRIDGE_H100 = REPOSITORY / "configs" / "benchmarks" / "bridge_h100.yaml"
HF_CONFIGS = REPOSITORY / "tests" / "fixtures" / "hf_configs"

# Bridge's model name (its tables') -> pretrain_gpt.py flags: the presets of Meta's published shapes (configs/models)
# and the released config.json files.
MODEL_FLAGS: dict[str, list[str]] = {
    "LLAMA3_8B": ["--config", "llama3-8b"],
    "LLAMA3_70B": ["--config", "llama3-70b"],
    "LLAMA3.1_405B": ["--config", "llama3.1-405b"],
    # Bridge's recipe keeps its multi-token-prediction layer (v0.1.0rc3 recipes/deepseek/deepseek_v3.py:174,
    # mtp_num_layers 1); the released config.json's num_nextn_predict_layers is not read by --init-from-hf
    "DeepSeekV3": ["--init-from-hf", str(HF_CONFIGS / "deepseek-v3"), "--mtp-num-layers", "1"],
    "GPT OSS 120B": ["--init-from-hf", str(HF_CONFIGS / "gpt-oss-120b")],
    "Qwen3_30B_a3B": ["--init-from-hf", str(HF_CONFIGS / "qwen3-30b-a3b")],
    "Qwen3_235B_a22B": ["--init-from-hf", str(HF_CONFIGS / "qwen3-235b-a22b")],
}
# Not buildable here: Nemotron 3 Nano is a hybrid Mamba-Transformer (this project has no Mamba layer).
UNBUILDABLE = {"Nemotron_3_Nano": "a hybrid Mamba model: this project builds no Mamba layer"}


@dataclass(frozen=True)
class RecipeSettings:
    recompute_block_layers: int = 0  # Megatron's block recompute: the first N layers of each chunk recomputed whole
    # Megatron's selective recompute_modules that recompute GEMMs: "mlp" (the dense layers' MLPs only: Megatron-Core's
    # TransformerLayer leaves an MoE layer's out, transformer_layer.py `if not isinstance(self.mlp, MoELayer)`) and
    # "mla_up_proj" (MLA's q and kv up-projections); the elementwise modules (layernorm, moe_act) recompute no GEMM
    recompute_modules: tuple[str, ...] = ()
    tp_comm_overlap: bool = False
    overlap_grad_reduce: bool = True
    # the pipeline split's flags: none is Megatron's even split (the last stage also runs the output layer)
    pipeline_split: tuple[str, ...] = ()
    moe_dispatcher: str = "alltoall"   # alltoall, or the flex dispatcher's deepep / hybridep (planner/layout_ep.py)
    ep_overlap: bool = False           # --overlap-moe-expert-parallel-comm (with --delay-wgrad-compute)


ACCOUNT_FOR_EMBEDDING_AND_LOSS = ("--account-for-embedding-in-pipeline-split", "--account-for-loss-in-pipeline-split")
# Settings a model's rows share, read at each release's scripts/performance configs and library recipes:
#   Llama 3 8B      25.11: recompute full, method block, 5 of 32 layers (v0.2.0 configs/llama3/workload_base_configs.py
#                   and utils/helpers.py set_recompute); 25.09: Megatron-FSDP, no recompute (v0.1.0rc3
#                   llama3_8b_llm_pretrain.yaml), priced as the distributed optimizer.
#   Llama 3 70B     TP overlap with userbuffers; no pipeline layout and account_for_*_in_pipeline_split unset up to
#                   v0.4.2 (recipes/llama/llama3.py: layout None): Megatron's even split of 80 layers over PP 8 x VP 5,
#                   the last chunk also running the output layer. Today's recipe's layout string came after every row.
#   Llama 3.1 405B  TP overlap; account_for_embedding and _loss_in_pipeline_split True: 126 + 2 over PP 8 x VP 8.
#   DeepSeek-V3     25.09: selective recompute of mla_up_proj and mlp (the 3 dense layers' MLPs: Megatron-Core skips
#                   an MoE layer's), overlap_grad_reduce off, the flex dispatcher with DeepEP, the EP overlap with
#                   delayed weight gradients, an MTP layer in its layout "Et|(tt|)*30mL" (v0.1.0rc3 run_script.py,
#                   recipes/deepseek/deepseek_v3.py).
#   GPT-OSS 120B    every release: alltoall, no EP overlap, no CUDA graphs, no pipeline layout, account_for_* False
#                   (the last of PP 4 even stages also runs the 201,088-row output layer); selective recompute of
#                   layernorm and moe_act from 26.02 (elementwise: no GEMM recomputed, so 0 here).
#   Qwen3 30B-A3B   25.09: alltoall, token-dropping, no overlap; 25.11: alltoall with the EP overlap; 26.02: DeepEP
#                   with the EP overlap; 26.02.01 onward: HybridEP at PP 1 x EP 16, no overlap; the even split.
#   Qwen3 235B-A22B alltoall in every release (26.02.01's config names DeepEP, its H100 function forces alltoall);
#                   25.09: TP overlap, no EP overlap, token-dropping; 25.11 onward: the EP overlap, no TP overlap;
#                   account_for_* True: 94 + 2 layers over PP 8 x VP 4.
RECIPES = {
    "LLAMA3_70B": RecipeSettings(tp_comm_overlap=True),
    "LLAMA3.1_405B": RecipeSettings(tp_comm_overlap=True, pipeline_split=ACCOUNT_FOR_EMBEDDING_AND_LOSS),
    "DeepSeekV3": RecipeSettings(recompute_modules=("mla_up_proj", "mlp"), overlap_grad_reduce=False,
                                 moe_dispatcher="deepep", ep_overlap=True,
                                 pipeline_split=("--pipeline-model-parallel-layout", "Et|(tt|)*30mL")),
    "Qwen3_235B_a22B": RecipeSettings(pipeline_split=ACCOUNT_FOR_EMBEDDING_AND_LOSS),
}
# What a release ran differently from its model's RECIPES entry.
RELEASE_RECIPES: dict[tuple[str, str], dict] = {
    # v0.2.0 scripts/performance/configs/llama3/workload_base_configs.py:232 (recompute_num_layers 5) ->
    # utils/helpers.py:174-177 (full, block); v0.1.0rc3's 25.09 matrix sets none
    ("LLAMA3_8B", "25.11"): {"recompute_block_layers": 5},
    # v0.2.0 configs/qwen3/workload_base_configs.py:238 moe_a2a_overlap -> utils/helpers.py:182-186; dispatcher
    # alltoall (the backend None is not applied: training/flex_dispatcher_backend.py:61-64)
    ("Qwen3_30B_a3B", "25.11"): {"ep_overlap": True},
    # v0.3.0 configs/qwen/qwen3_workload_base_configs.py:427-428 (moe_a2a_overlap, deepep)
    ("Qwen3_30B_a3B", "26.02"): {"ep_overlap": True, "moe_dispatcher": "deepep"},
    # v0.3.1 :408-415, v0.4.0 :425-428, v0.4.2 :427-430, v0.5.0 :473-476: hybridep, moe_a2a_overlap False
    ("Qwen3_30B_a3B", "26.02.01"): {"moe_dispatcher": "hybridep"},
    ("Qwen3_30B_a3B", "26.04"): {"moe_dispatcher": "hybridep"},
    ("Qwen3_30B_a3B", "26.04.01"): {"moe_dispatcher": "hybridep"},
    ("Qwen3_30B_a3B", "26.06"): {"moe_dispatcher": "hybridep"},
    # v0.1.0rc3 scripts/performance/run_script.py:107 CommOverlapConfig(tp_comm_overlap=True), TP 2 with SP
    ("Qwen3_235B_a22B", "25.09"): {"tp_comm_overlap": True},
    # v0.2.0 configs/qwen3/workload_base_configs.py:143; v0.3.0 and v0.3.1 configs/qwen/qwen3_workload_base_configs.py
    # :179; v0.4.0 :181; v0.4.2 :183 (moe_a2a_overlap True; alltoall: qwen3_llm_pretrain.py forces it)
    ("Qwen3_235B_a22B", "25.11"): {"ep_overlap": True},
    ("Qwen3_235B_a22B", "26.02"): {"ep_overlap": True},
    ("Qwen3_235B_a22B", "26.02.01"): {"ep_overlap": True},
    ("Qwen3_235B_a22B", "26.04"): {"ep_overlap": True},
    ("Qwen3_235B_a22B", "26.04.01"): {"ep_overlap": True},
}
# Rows whose printed layout is not what the release's code ran: the code's. 26.02.01's Qwen3 30B-A3B row prints
# v0.3.0's PP 2 x VP 12 x EP 8, while v0.3.1's config (PR #2477, cherry-picked before the tag) is PP 1 x EP 16 with
# HybridEP, and its figure (9,058 tokens/s/GPU) is that of the EP 16 rows of 26.04 to 26.06 (8,826-8,960), not of
# 26.02's PP 2 run (5,113). Other mismatches are left as printed, for want of such evidence: 25.11 prints GPT-OSS at
# MBS 4 and Qwen3 30B-A3B at MBS 2 x VP 24 where v0.2.0's configs give MBS 1 (and VP 12).
RELEASE_LAYOUTS: dict[tuple[str, str], dict] = {
    # v0.3.1 scripts/performance/configs/qwen/qwen3_workload_base_configs.py:408-415 (EP 16; PP and VP unset: 1, none)
    ("Qwen3_30B_a3B", "26.02.01"): {"pp": 1, "vp": None, "ep": 16},
}


def recipe_settings(row: "BridgeRow") -> RecipeSettings:
    """The recipe settings row.release ran for row.model."""
    return dataclasses.replace(RECIPES.get(row.model, RecipeSettings()),
                               **RELEASE_RECIPES.get((row.model, row.release), {}))


@dataclass(frozen=True)
class BridgeRow:
    model: str          # Bridge's name without its "(dropless)" / "(tokendrop)" suffix
    release: str
    precision: Optional[str]
    layout: dict
    tokens_per_s_per_gpu: float
    model_tflops_per_gpu: float

    @property
    def label(self) -> str:
        return f"{self.model} {self.release} {self.layout['gpus']} GPUs {self.precision or '(no precision given)'}"


def base_model_name(name: str) -> str:
    return name.split(" (")[0].strip()


def load_rows(path: Path = BRIDGE_H100) -> list[BridgeRow]:
    rows = yaml.safe_load(path.read_text(encoding="utf-8"))["rows"]
    return [BridgeRow(base_model_name(r["model"]), str(r["release"]), r["precision"],
                      {key: r[key] for key in ("gpus", "global_batch_size", "micro_batch_size", "seq_length",
                                               "fsdp", "tp", "pp", "cp", "vp", "ep")},
                      float(r["tokens_per_s_per_gpu"]), float(r["model_tflops_per_gpu"])) for r in rows]


def row_config(row: BridgeRow) -> PretrainConfig:
    seq = str(row.layout["seq_length"])
    return parse_config([*MODEL_FLAGS[row.model], "--seq-length", seq, "--max-position-embeddings", seq])


def row_counts(row: BridgeRow) -> ModelCounts:
    """What the layout model reads off the row's model, its vocabulary the launch's (planner/vocabulary.py)."""
    config = row_config(row)
    return model_counts(config.model, launch_vocab(config.checkpoint, config.data, config.model, config.sources)[0])


def row_precision(row: BridgeRow) -> str:
    """FP8 for FP8 / FP8-CS rows; 25.09's rows print none: FP8, as its footnote's block-scaling figures imply."""
    return "bf16" if row.precision == "BF16" else "fp8"


def code_layout(row: BridgeRow) -> dict:
    """The row's layout as its release's code ran it: the printed one, or RELEASE_LAYOUTS' correction."""
    return {**row.layout, **RELEASE_LAYOUTS.get((row.model, row.release), {})}


def row_flags(row: BridgeRow, printed: bool = False) -> list[str]:
    """The row as pretrain_gpt.py flags, with its release's recipe settings, at the layout its code ran (`printed`:
    the table's). Megatron-FSDP (Llama 3 8B in 25.09) is given as the distributed optimizer, as it has been priced;
    the flags this trainer accepts with no effect (TP overlap, the EP overlap, the selective recompute modules) are
    what --trainer megatron-lm prices (planner/layout_of_config.py); Megatron's block recompute both trainers run."""
    recipe, r = recipe_settings(row), (row.layout if printed else code_layout(row))
    seq, tp, pp, vp, ep = str(r["seq_length"]), r["tp"], r["pp"], r["vp"] or 1, r["ep"] or 1
    words = [*MODEL_FLAGS[row.model], "--seq-length", seq, "--max-position-embeddings", seq,
             "--tensor-model-parallel-size", str(tp), "--pipeline-model-parallel-size", str(pp)]
    if pp > 1:
        words += [*(["--num-virtual-stages-per-pipeline-rank", str(vp)] if vp > 1 and not
                    recipe.pipeline_split[:1] == ("--pipeline-model-parallel-layout",) else []), *recipe.pipeline_split]
    if r["cp"] > 1:
        words += ["--context-parallel-size", str(r["cp"])]
    if tp > 1:
        words += ["--sequence-parallel", *(["--tp-comm-overlap"] if recipe.tp_comm_overlap else [])]
    if ep > 1:
        words += ["--expert-model-parallel-size", str(ep), *(["--expert-tensor-parallel-size", "1"] if tp > 1 else []),
                  *(["--moe-token-dispatcher-type", "alltoall"] if recipe.moe_dispatcher == "alltoall" else
                    ["--moe-token-dispatcher-type", "flex", "--moe-flex-dispatcher-backend", recipe.moe_dispatcher]),
                  *(["--overlap-moe-expert-parallel-comm", "--delay-wgrad-compute"] if recipe.ep_overlap else [])]
    words += ["--micro-batch-size", str(r["micro_batch_size"]), "--global-batch-size", str(r["global_batch_size"]),
              "--use-distributed-optimizer", "--overlap-param-gather", "--bf16",
              *(["--fp8-format", "hybrid"] if row_precision(row) == "fp8" else []),
              *([] if recipe.overlap_grad_reduce else ["--no-overlap-grad-reduce"])]
    if recipe.recompute_block_layers:
        words += ["--recompute-granularity", "full", "--recompute-method", "block", "--recompute-num-layers",
                  str(recipe.recompute_block_layers)]
    if recipe.recompute_modules:
        words += ["--recompute-granularity", "selective", "--recompute-modules", *recipe.recompute_modules]
    return words


def row_layout(row: BridgeRow, counts: ModelCounts, printed: bool = False) -> Layout:
    """The row's flags (row_flags) read back as Megatron-LM runs them: what `python -m zero.plan dry-run --hardware
    h100-sxm --trainer megatron-lm` prices for them."""
    parsed = parse_arguments(row_flags(row, printed))
    config = parsed.config
    return layout_of_config(config.model, config.parallel, config.training, config.zero, config.activations,
                            row.layout["gpus"], counts, MEGATRON_LM, parsed.harvested)


def with_layout(row: BridgeRow, **changes) -> BridgeRow:
    return dataclasses.replace(row, layout={**row.layout, **changes})
