"""Megatron-Bridge's published DGX-H100 pre-training rows (configs/benchmarks/bridge_h100.yaml) as layouts
this project can plan: each row's model as pretrain_gpt.py flags, its layout, and the recipe settings
Bridge's table does not print but its H100 perf recipes set (recompute, TP overlap, gradient overlap).

The recipe settings are read from Megatron-Bridge's src/megatron/bridge/perf_recipes/*/h100/*.py (the
repository's current recipes; an older release's recipe may have differed, which the table cannot tell):
  llama3.py   llama3_8b_pretrain_8gpu_h100_fp8cs_config: recompute_granularity full, method block,
              recompute_num_layers 5 (of 32); tp_comm_overlap off.
              llama3_70b_pretrain_64gpu_h100_*: tp_comm_overlap with userbuffers, no recompute.
  llama31.py  llama31_405b_pretrain_1024gpu_h100_*: tp_comm_overlap with userbuffers, no recompute.
  gpt_oss.py  gpt_oss_120b_pretrain_64gpu_h100_*: selective recompute of layernorm and moe_act
              (elementwise only: no GEMM recomputed, so 0 here); its base recipe
              (recipes/gpt_oss/h100/gpt_oss.py) sets no pipeline layout and account_for_embedding/loss_in_
              pipeline_split False: Megatron's even split, the last of PP 4 stages also runs the 201,088-row
              output layer (`output_stage_balanced` False).
  Llama 3 70B's recipe gives a pipeline layout ("Et*2|(t*2|)*34,t*3|(t*2|)*3,tL": the loss's chunk one layer),
  DeepSeek-V3's one with the loss on its own ("...mL"); Llama 3.1 405B's 126 layers and Qwen3 235B's 94 do
  not divide by PP x VP without such a layout. Those are priced balanced.
  deepseek_v3.py  deepseek_v3_pretrain_1024gpu_h100_*: recompute_modules mla_up_proj and mlp (the MLP's
              GEMMs run twice: `recompute_mlp` below), overlap_grad_reduce off, a multi-token-prediction
              layer in its pipeline layout ("Et|(tt|)*30mL").
  Qwen3 MoE   no H100 recipe in the repository any more: no recompute, Megatron's defaults. Its last one
              (scripts/performance/configs/qwen3/, at Bridge commit 47f330e4d) ran 30B-A3B at PP 2 x VP 12 with
              no pipeline layout, and recipes/qwen/qwen3_moe.py leaves 30B-A3B's account_for_*_in_pipeline_split
              False (Megatron's even split: `output_stage_balanced` False) while 235B-A22B's are True (94 + 2
              layers over PP 8 x VP 4: balanced).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import yaml

from arguments.config import PretrainConfig
from arguments.parser import parse_config
from planner.layout_perf import Layout, ModelCounts

REPOSITORY = Path(__file__).resolve().parent.parent
BRIDGE_H100 = REPOSITORY / "configs" / "benchmarks" / "bridge_h100.yaml"
HF_CONFIGS = REPOSITORY / "tests" / "fixtures" / "hf_configs"

LLAMA3 = ["--group-query-attention", "--num-query-groups", "8", "--swiglu", "--normalization", "RMSNorm",
          "--position-embedding-type", "rope", "--untie-embeddings-and-output-weights", "--disable-bias-linear",
          "--vocab-size", "128256"]
# Bridge's model name (its tables') -> pretrain_gpt.py flags. Llama 3 70B and 3.1 405B are Meta's published
# shapes (their config.json: 80 x 8192, 64 heads, ffn 28672; 126 x 16384, 128 heads, ffn 53248).
MODEL_FLAGS: dict[str, list[str]] = {
    "LLAMA3_8B": ["--config", "llama3-8b"],
    "LLAMA3_70B": ["--num-layers", "80", "--hidden-size", "8192", "--num-attention-heads", "64",
                   "--ffn-hidden-size", "28672", *LLAMA3],
    "LLAMA3.1_405B": ["--num-layers", "126", "--hidden-size", "16384", "--num-attention-heads", "128",
                      "--ffn-hidden-size", "53248", *LLAMA3],
    "DeepSeekV3": ["--init-from-hf", str(HF_CONFIGS / "deepseek-v3")],
    "GPT OSS 120B": ["--init-from-hf", str(HF_CONFIGS / "gpt-oss-120b")],
    "Qwen3_30B_a3B": ["--init-from-hf", str(HF_CONFIGS / "qwen3-30b-a3b")],
    "Qwen3_235B_a22B": ["--init-from-hf", str(HF_CONFIGS / "qwen3-235b-a22b")],
}
# Not buildable here: Nemotron 3 Nano is a hybrid Mamba-Transformer (this project has no Mamba layer).
UNBUILDABLE = {"Nemotron_3_Nano": "a hybrid Mamba model: this project builds no Mamba layer"}


@dataclass(frozen=True)
class RecipeSettings:
    recompute_blocks: float = 0.0   # fraction of the blocks recomputed whole
    recompute_mlp: bool = False     # the MLPs' GEMMs recomputed
    tp_comm_overlap: bool = False
    overlap_grad_reduce: bool = True
    output_stage_balanced: bool = True


RECIPES = {
    "LLAMA3_8B": RecipeSettings(recompute_blocks=5 / 32),
    "LLAMA3_70B": RecipeSettings(tp_comm_overlap=True),
    "LLAMA3.1_405B": RecipeSettings(tp_comm_overlap=True),
    "DeepSeekV3": RecipeSettings(recompute_mlp=True, overlap_grad_reduce=False),
    "GPT OSS 120B": RecipeSettings(output_stage_balanced=False),
    "Qwen3_30B_a3B": RecipeSettings(output_stage_balanced=False),
}


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


def row_precision(row: BridgeRow) -> str:
    """FP8 for FP8 / FP8-CS rows; 25.09's rows print none: FP8, as its footnote's block-scaling figures imply."""
    return "bf16" if row.precision == "BF16" else "fp8"


def row_layout(row: BridgeRow, counts: ModelCounts) -> Layout:
    recipe = RECIPES.get(row.model, RecipeSettings())
    recompute = recipe.recompute_blocks
    if recipe.recompute_mlp:
        recompute = counts.mlp_flops_per_token / counts.blocks_flops_per_token
    r = row.layout
    return Layout(gpus=r["gpus"], tp=r["tp"], pp=r["pp"], vp=r["vp"] or 1, cp=r["cp"], ep=r["ep"] or 1,
                  micro_batch_size=r["micro_batch_size"], global_batch_size=r["global_batch_size"],
                  precision=row_precision(row), recompute_fraction=recompute,
                  tp_comm_overlap=recipe.tp_comm_overlap, overlap_grad_reduce=recipe.overlap_grad_reduce,
                  output_stage_balanced=recipe.output_stage_balanced)


def with_layout(row: BridgeRow, **changes) -> BridgeRow:
    return dataclasses.replace(row, layout={**row.layout, **changes})
