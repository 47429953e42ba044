"""Megatron-Bridge's published DGX-H100 pre-training rows as pretrain_gpt.py flags with the recipe settings each row's
release ran, priced as `dry-run --hardware h100-sxm --trainer megatron-lm` prices them, so the table and the dry run are
one model."""

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

MODEL_FLAGS: dict[str, list[str]] = {
    "LLAMA3_8B": ["--config", "llama3-8b"],
    "LLAMA3_70B": ["--config", "llama3-70b"],
    "LLAMA3.1_405B": ["--config", "llama3.1-405b"],
    # Bridge's recipe keeps its MTP layer; --init-from-hf does not read num_nextn_predict_layers
    "DeepSeekV3": ["--init-from-hf", str(HF_CONFIGS / "deepseek-v3"), "--mtp-num-layers", "1"],
    "GPT OSS 120B": ["--init-from-hf", str(HF_CONFIGS / "gpt-oss-120b")],
    "Qwen3_30B_a3B": ["--init-from-hf", str(HF_CONFIGS / "qwen3-30b-a3b")],
    "Qwen3_235B_a22B": ["--init-from-hf", str(HF_CONFIGS / "qwen3-235b-a22b")],
}
UNBUILDABLE = {"Nemotron_3_Nano": "a hybrid Mamba model: this project builds no Mamba layer"}


@dataclass(frozen=True)
class RecipeSettings:
    recompute_block_layers: int = 0
    # selective recompute modules that recompute GEMMs
    recompute_modules: tuple[str, ...] = ()
    tp_comm_overlap: bool = False
    overlap_grad_reduce: bool = True
    pipeline_split: tuple[str, ...] = ()
    moe_dispatcher: str = "alltoall"
    ep_overlap: bool = False


ACCOUNT_FOR_EMBEDDING_AND_LOSS = ("--account-for-embedding-in-pipeline-split", "--account-for-loss-in-pipeline-split")
# Settings a model's rows share, read at each release's performance configs and recipes (what differs by release is in
# RELEASE_RECIPES).
RECIPES = {
    "LLAMA3_70B": RecipeSettings(tp_comm_overlap=True),
    "LLAMA3.1_405B": RecipeSettings(tp_comm_overlap=True, pipeline_split=ACCOUNT_FOR_EMBEDDING_AND_LOSS),
    "DeepSeekV3": RecipeSettings(recompute_modules=("mla_up_proj", "mlp"), overlap_grad_reduce=False,
                                 moe_dispatcher="deepep", ep_overlap=True,
                                 pipeline_split=("--pipeline-model-parallel-layout", "Et|(tt|)*30mL")),
    "Qwen3_235B_a22B": RecipeSettings(pipeline_split=ACCOUNT_FOR_EMBEDDING_AND_LOSS),
}
RELEASE_RECIPES: dict[tuple[str, str], dict] = {
    ("LLAMA3_8B", "25.11"): {"recompute_block_layers": 5},
    ("Qwen3_30B_a3B", "25.11"): {"ep_overlap": True},
    ("Qwen3_30B_a3B", "26.02"): {"ep_overlap": True, "moe_dispatcher": "deepep"},
    # v0.3.1 through v0.5.0: hybridep, no EP overlap
    ("Qwen3_30B_a3B", "26.02.01"): {"moe_dispatcher": "hybridep"},
    ("Qwen3_30B_a3B", "26.04"): {"moe_dispatcher": "hybridep"},
    ("Qwen3_30B_a3B", "26.04.01"): {"moe_dispatcher": "hybridep"},
    ("Qwen3_30B_a3B", "26.06"): {"moe_dispatcher": "hybridep"},
    ("Qwen3_235B_a22B", "25.09"): {"tp_comm_overlap": True},
    ("Qwen3_235B_a22B", "25.11"): {"ep_overlap": True},
    ("Qwen3_235B_a22B", "26.02"): {"ep_overlap": True},
    ("Qwen3_235B_a22B", "26.02.01"): {"ep_overlap": True},
    ("Qwen3_235B_a22B", "26.04"): {"ep_overlap": True},
    ("Qwen3_235B_a22B", "26.04.01"): {"ep_overlap": True},
}
# Rows whose printed layout is not what the release's code ran: 26.02.01's Qwen3 30B-A3B ran v0.3.1's PP 1 x EP 16.
RELEASE_LAYOUTS: dict[tuple[str, str], dict] = {
    ("Qwen3_30B_a3B", "26.02.01"): {"pp": 1, "vp": None, "ep": 16},
}


def recipe_settings(row: "BridgeRow") -> RecipeSettings:
    return dataclasses.replace(RECIPES.get(row.model, RecipeSettings()),
                               **RELEASE_RECIPES.get((row.model, row.release), {}))


@dataclass(frozen=True)
class BridgeRow:
    model: str
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
    config = row_config(row)
    return model_counts(config.model, launch_vocab(config.checkpoint, config.data, config.model, config.sources)[0])


def row_precision(row: BridgeRow) -> str:
    """FP8 for FP8 / FP8-CS rows, and 25.09's, whose footnote implies it."""
    return "bf16" if row.precision == "BF16" else "fp8"


def code_layout(row: BridgeRow) -> dict:
    """The row's layout as its release's code ran it."""
    return {**row.layout, **RELEASE_LAYOUTS.get((row.model, row.release), {})}


def row_flags(row: BridgeRow, printed: bool = False) -> list[str]:
    """The row as pretrain_gpt.py flags at the layout its code ran (`printed`: the table's)."""
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
    parsed = parse_arguments(row_flags(row, printed))
    config = parsed.config
    return layout_of_config(config.model, config.parallel, config.training, config.zero, config.activations,
                            row.layout["gpus"], counts, MEGATRON_LM, parsed.harvested)


def with_layout(row: BridgeRow, **changes) -> BridgeRow:
    return dataclasses.replace(row, layout={**row.layout, **changes})
