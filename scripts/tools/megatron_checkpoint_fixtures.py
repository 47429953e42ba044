#!/usr/bin/env python
"""Megatron-LM's own runs and torch_dist checkpoints for tests/fixtures/, written by its own pretrain_gpt.py.

    python scripts/tools/megatron_checkpoint_fixtures.py fixtures --megatron-lm KIT [--only NAME]

Each fixture trains iterations 1-4 saving at 2, then resumes the save for 3-4, through bench/megatron_lm_cpu.py in
the benchmark venv, recording losses, grad norms and logits. `logits` and `continue` rerun parts; the HybridModel
and GPT_019 fixtures take core_v0.19.0's tree (`git archive core_v0.19.0`)."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LAUNCHER = ROOT / "scripts" / "bench" / "megatron_lm_cpu.py"

DATA_DIR, DATA_NAME = "megatron_data", "varied_docs"
DOCUMENTS, SHORTEST, LONGEST, CORPUS_SEED = 200, 8, 60, 78
INDEX_DIR = "megatron_index"  # Megatron-Core's GPTDataset index files of the first fixture's training split
VOCAB = 127  # NullTokenizer's --vocab-size: ids 0-126, its end-of-document 127; 128 rows, no padding at TP 1 or 2
SAVE_ITERATION, TRAIN_ITERATIONS = 2, 4
LOGITS = "megatron_logits.safetensors"  # {"tokens": [4, 16] int64, "logits": [4, 16, 128] fp32}: 33 KB
# The model and run every fixture shares: tiny, fp32, dropout 0, Megatron's NullTokenizer and torch-only path
# (--transformer-impl local and the fusions it lacks off, as Megatron-LM requires there).
COMMON_FLAGS = [
    "--num-layers", "2", "--hidden-size", "16", "--num-attention-heads", "4", "--seq-length", "16",
    "--max-position-embeddings", "16", "--micro-batch-size", "2", "--global-batch-size", "4",
    "--train-iters", str(TRAIN_ITERATIONS), "--lr", "0.001", "--min-lr", "0.0001", "--lr-decay-style", "cosine",
    "--lr-warmup-iters", "1", "--weight-decay", "0.1", "--adam-beta1", "0.9", "--adam-beta2", "0.95",
    "--clip-grad", "1.0", "--init-method-std", "0.02", "--seed", "1234",
    "--data-path", f"tests/fixtures/{DATA_DIR}/{DATA_NAME}", "--split", "100,0,0", "--tokenizer-type",
    "NullTokenizer", "--vocab-size", str(VOCAB), "--make-vocab-size-divisible-by", "32", "--hidden-dropout", "0",
    "--attention-dropout", "0", "--eval-iters", "0", "--eval-interval", "1000", "--ckpt-format", "torch_dist",
    "--transformer-impl", "local", "--no-persist-layer-norm", "--no-gradient-accumulation-fusion",
    "--no-masked-softmax-fusion", "--no-rope-fusion", "--log-interval", "1",
]
GPT2_FLAGS = ["--no-bias-gelu-fusion"]
SWIGLU_GQA_FLAGS = ["--swiglu", "--ffn-hidden-size", "32", "--group-query-attention", "--num-query-groups", "2",
                    "--disable-bias-linear"]
LLAMA_FLAGS = SWIGLU_GQA_FLAGS + ["--normalization", "RMSNorm", "--position-embedding-type", "rope",
                                  "--untie-embeddings-and-output-weights"]
# multi-latent attention at small sizes (DeepSeek-V3's example's flags, its rope): Megatron's defaults otherwise, so
# linear_proj and the MLP keep their biases (MLA's own projections take none); the query through --q-lora-rank's
# down and up projections with both latent norms (--qk-layernorm), or through linear_q_proj
MLA_FLAGS = ["--multi-latent-attention", "--kv-lora-rank", "8", "--qk-head-dim", "4", "--qk-pos-emb-head-dim", "4",
             "--v-head-dim", "4", "--position-embedding-type", "rope"]
TP2, PP2, DISTOPT = (["--tensor-model-parallel-size", "2"], ["--pipeline-model-parallel-size", "2"],
                     ["--use-distributed-optimizer"])

# name: (ranks, the flags beyond COMMON_FLAGS)
FIXTURES = {
    "megatron_tp1": (1, GPT2_FLAGS),
    "megatron_tp2_swiglu_gqa": (2, SWIGLU_GQA_FLAGS + TP2),
    "megatron_llama": (1, LLAMA_FLAGS),
    "megatron_distopt_dp_reshardable": (4, LLAMA_FLAGS + TP2 + DISTOPT),
    "megatron_distopt_fully_reshardable": (2, GPT2_FLAGS + DISTOPT + ["--dist-ckpt-optim-fully-reshardable"]),
    # two pipeline stages, the tied embedding on both (its own bucket in each stage's distributed optimizer)
    "megatron_pp2_distopt_dp_reshardable": (2, GPT2_FLAGS + PP2 + DISTOPT),
    # the same under interleaving (4 layers, 2 chunks a stage): its dp_reshardable buckets are laid out per chunk
    # (a gradient buffer each)
    "megatron_pp2_vp2_distopt_dp_reshardable": (2, GPT2_FLAGS + PP2 + DISTOPT + [
        "--num-layers", "4", "--num-layers-per-virtual-pipeline-stage", "1"]),
    # Mixtral's shape: the Llama-shaped model with 4 experts (SwiGLU, top 2) over 2 expert-parallel ranks
    # (SequentialMLP on the local spec)
    "megatron_moe_ep2": (2, LLAMA_FLAGS + ["--num-experts", "4", "--moe-router-topk", "2", "--moe-ffn-hidden-size",
                                           "32", "--expert-model-parallel-size", "2"]),
    # bf16: Megatron-LM's Float16OptimizerWithFloat16Params, its fp32 copies and nested optimizer state
    "megatron_bf16": (1, GPT2_FLAGS + ["--bf16"]),
    # bf16 under the distributed optimizer on 2 data-parallel ranks, its default dp_reshardable layout: bf16 params
    # with fp32 gradients, so the buckets' dtype key is (bfloat16, float32), their states the fp32 master and moments
    "megatron_bf16_distopt_dp_reshardable": (2, GPT2_FLAGS + ["--bf16"] + DISTOPT),
    # fp16: the same optimizer as bf16 plus its dynamic loss scaler, whose state common.pt keeps (grad_scaler); a
    # window of 3 doubles the scale at iteration 3, so the tracker saved at 2 decides the scale after the resume
    "megatron_fp16": (1, GPT2_FLAGS + ["--fp16", "--initial-loss-scale", "65536", "--loss-scale-window", "3"]),
    # and under the distributed optimizer on 2 data-parallel ranks, dp_reshardable: fp16 gradients (no fp32
    # accumulation by default), buckets keyed (float16, float16), the grad scaler in each TP x PP rank's objects
    "megatron_fp16_distopt_dp_reshardable": (2, GPT2_FLAGS + ["--fp16", "--initial-loss-scale", "65536",
                                                              "--loss-scale-window", "3"] + DISTOPT),
    # and under the distributed optimizer in its default dp_reshardable layout: Megatron-Core's ChainedOptimizer, a
    # dense optimizer over DP 2 and an expert one over expert DP 1, each one's buckets under chained_<i>.
    "megatron_moe_ep2_distopt_dp_reshardable": (2, LLAMA_FLAGS + DISTOPT + [
        "--num-experts", "4", "--moe-router-topk", "2", "--moe-ffn-hidden-size", "32",
        "--expert-model-parallel-size", "2"]),
    # the same at TP 2 x EP 2 (TP 2 x DP 2): the experts' fc1 rows and fc2 columns split over expert TP 2 in the
    # expert optimizer's buckets (dp_group_idx: the rank in Megatron-Core's expert tp-ep-pp group)
    "megatron_moe_tp2_ep2_distopt_dp_reshardable": (4, LLAMA_FLAGS + TP2 + DISTOPT + [
        "--sequence-parallel", "--num-experts", "4", "--moe-router-topk", "2", "--moe-ffn-hidden-size", "32",
        "--expert-model-parallel-size", "2"]),
    # Megatron's default MoE: biases on (--add-bias-linear), so the router and every expert's fc1 and fc2 hold one
    "megatron_moe_ep2_biases": (2, GPT2_FLAGS + ["--num-experts", "4", "--moe-router-topk", "2",
                                                 "--moe-ffn-hidden-size", "32", "--expert-model-parallel-size", "2"]),
    # a shared expert beside the routed ones (DeepSeek's and Qwen2-MoE's shape) on the Mixtral-shaped model: without
    # biases, as Megatron-Core's SharedExpertMLP asserts ("bias is not supported in the shared experts")
    "megatron_moe_ep2_shared": (2, LLAMA_FLAGS + ["--num-experts", "4", "--moe-router-topk", "2",
                                                  "--moe-ffn-hidden-size", "32",
                                                  "--moe-shared-expert-intermediate-size", "32",
                                                  "--expert-model-parallel-size", "2"]),
    # DeepSeek-V3's aux-loss-free balancing on the Mixtral-shaped model: sigmoid scores, each router's expert bias (a
    # persistent buffer, updated after every step from the tokens each expert took) at a rate that moves it visibly
    "megatron_moe_ep2_expert_bias": (2, LLAMA_FLAGS + ["--num-experts", "4", "--moe-router-topk", "2",
                                                       "--moe-ffn-hidden-size", "32",
                                                       "--moe-router-score-function", "sigmoid",
                                                       "--moe-router-enable-expert-bias",
                                                       "--moe-router-bias-update-rate", "0.01",
                                                       "--expert-model-parallel-size", "2"]),
    # DeepSeek's layout of layers: a dense first layer (--moe-layer-freq), then an MoE layer whose shared expert is
    # gated (Qwen2-MoE's sigmoid gate, SharedExpertMLP's gate_weight)
    "megatron_moe_ep2_dense_first_gated_shared": (2, LLAMA_FLAGS + [
        "--num-experts", "4", "--moe-router-topk", "2", "--moe-ffn-hidden-size", "32", "--moe-layer-freq", "[0,1]",
        "--moe-shared-expert-intermediate-size", "32", "--moe-shared-expert-gate", "--expert-model-parallel-size",
        "2"]),
    # MoE under tensor parallelism: the Mixtral-shaped model at TP 2 x EP 2 (TP 2 x DP 2), its experts at the default
    # expert TP (= TP: each expert's fc1 rows and fc2 columns split), with the --sequence-parallel Megatron-Core's
    # MoE layer requires at TP > 1 (the local spec's torch norm takes it: scripts/bench/megatron_lm_cpu.py)
    "megatron_moe_tp2_ep2": (4, LLAMA_FLAGS + TP2 + ["--sequence-parallel", "--num-experts", "4", "--moe-router-topk",
                                                     "2", "--moe-ffn-hidden-size", "32",
                                                     "--expert-model-parallel-size", "2"]),
    # and over two pipeline stages (a layer each): Megatron's default MoE, biases on, at PP 2 x EP 2 (PP 2 x DP 2)
    "megatron_moe_pp2_ep2_biases": (4, GPT2_FLAGS + PP2 + ["--num-experts", "4", "--moe-router-topk", "2",
                                                           "--moe-ffn-hidden-size", "32",
                                                           "--expert-model-parallel-size", "2"]),
    # MLA with a low-rank query and the latent norms: every tensor of Megatron-Core's local-spec MLASelfAttention but
    # linear_q_proj (scripts/bench/megatron_lm_cpu.py lets the local core attention take MLA's head widths)
    "megatron_mla_q_lora": (1, GPT2_FLAGS + MLA_FLAGS + ["--q-lora-rank", "8", "--qk-layernorm"]),
    # and without it: linear_q_proj. Without --qk-layernorm: Megatron-Core 0.16.1 builds no query norm without
    # --q-lora-rank (both specs), where this project's MLA norms the hidden state before linear_q_proj
    "megatron_mla": (1, GPT2_FLAGS + MLA_FLAGS),
    # one multi-token prediction layer (DeepSeek-V3's MTP; its loss scaled by Megatron's default 0.1): GPT-2's block
    # with rope, as Megatron-LM asserts MTP is not built with learned absolute positions
    "megatron_mtp": (1, GPT2_FLAGS + ["--mtp-num-layers", "1", "--position-embedding-type", "rope"]),
    # all of them together, the DeepSeek-V3 example's launch (Megatron-MoE-ModelZoo's DeepSeek-V3) shrunk: RMSNorm
    # (its epsilon), SwiGLU, no biases, untied output; MLA with a low-rank query and the latent norms, its YaRN rope
    # (--rotary-scaling-factor 40, both mscales 1); a dense first layer, then an MoE layer of 4 experts (top 2 of 2
    # groups, 1 group kept, scaled by 2.5) with a shared expert, sigmoid scores and the expert bias, the sequence
    # aux loss at 1e-4, the router in fp32; one MTP layer (its loss scaled by 0.1); EP 2
    "megatron_deepseek_v3": (2, ["--swiglu", "--ffn-hidden-size", "32", "--disable-bias-linear", "--normalization",
                                 "RMSNorm", "--norm-epsilon", "1e-6", "--untie-embeddings-and-output-weights"]
                             + MLA_FLAGS + ["--q-lora-rank", "8", "--qk-layernorm", "--rotary-scaling-factor", "40",
                                            "--mscale", "1.0", "--mscale-all-dim", "1.0",
                                            "--num-experts", "4", "--moe-router-topk", "2",
                                            "--moe-ffn-hidden-size", "32", "--moe-layer-freq", "[0,1]",
                                            "--moe-shared-expert-intermediate-size", "32",
                                            "--moe-router-load-balancing-type", "seq_aux_loss",
                                            "--moe-aux-loss-coeff", "1e-4", "--moe-router-num-groups", "2",
                                            "--moe-router-group-topk", "1", "--moe-router-topk-scaling-factor", "2.5",
                                            "--moe-router-score-function", "sigmoid",
                                            "--moe-router-enable-expert-bias", "--moe-router-bias-update-rate",
                                            "0.01", "--moe-router-dtype", "fp32", "--mtp-num-layers", "1",
                                            "--mtp-loss-scaling-factor", "0.1", "--expert-model-parallel-size", "2"]),
}

# Megatron-Core 0.19's HybridModel (pretrain_hybrid.py at core_v0.19.0): GPT blocks as a layer per symbol, `*`
# attention then `-` MLP; the pattern sets the depth (no --num-layers), and --spec names Megatron-Core's hybrid stack
# (TransformerEngine's; without TE, its local twin: scripts/bench/megatron_lm_cpu.py _patch_hybrid_local_spec)
HYBRID_SCRIPT, HYBRID_TAG = "pretrain_hybrid.py", "core_v0.19.0"
HYBRID_COMMON_FLAGS = [flag for index, flag in enumerate(COMMON_FLAGS)
                       if "--num-layers" not in COMMON_FLAGS[max(index - 1, 0):index + 1]]
HYBRID_SPEC = ["--spec", "megatron.core.models.hybrid.hybrid_layer_specs", "hybrid_stack_spec"]
HYBRID_FIXTURES = {
    # GPT-2's block twice (`*-*-`), dense, fp32, the plain optimizer: the model megatron_tp1 is, as HybridModel
    "megatron_hybrid_dense": (1, GPT2_FLAGS + ["--hybrid-layer-pattern", "*-*-"] + HYBRID_SPEC),
    # a dense block then an MoE block (`*-*E`): Megatron's default MoE, biases on, 4 experts (top 2) over 2
    # expert-parallel ranks, as megatron_moe_ep2_biases (at EP 1 its SequentialMLP with biases fails on CPU)
    "megatron_hybrid_moe": (2, GPT2_FLAGS + ["--hybrid-layer-pattern", "*-*E"] + HYBRID_SPEC + [
        "--num-experts", "4", "--moe-router-topk", "2", "--moe-ffn-hidden-size", "32",
        "--expert-model-parallel-size", "2"]),
    # the dense one under the distributed optimizer at DP 2, its per-parameter fully_reshardable layout
    "megatron_hybrid_distopt_fully_reshardable": (2, GPT2_FLAGS + ["--hybrid-layer-pattern", "*-*-"] + HYBRID_SPEC
                                                  + DISTOPT + ["--dist-ckpt-optim-fully-reshardable"]),
    # and in the distributed optimizer's default dp_reshardable layout (its gradient buckets)
    "megatron_hybrid_distopt_dp_reshardable": (2, GPT2_FLAGS + ["--hybrid-layer-pattern", "*-*-"] + HYBRID_SPEC
                                               + DISTOPT),
    # one MTP depth after the `/` (a dense block, as the last decoder block): Megatron-Core's MTP takes rotary or
    # no positions ("not supported with learned_absolute position embedding type")
    "megatron_hybrid_mtp": (1, GPT2_FLAGS + ["--hybrid-layer-pattern", "*-*-/*-", "--position-embedding-type", "rope"]
                            + HYBRID_SPEC),
    # the dense one in two pipeline segments (`*-|*-`: a block per stage) at PP 2
    "megatron_hybrid_pp2": (2, GPT2_FLAGS + ["--hybrid-layer-pattern", "*-|*-"] + HYBRID_SPEC + PP2),
}

# GPT fixtures by core_v0.19.0's own pretrain_gpt.py (--megatron-lm its tree, as HYBRID_FIXTURES)
GPT_019_FIXTURES = {
    # 0.19's NullTokenizer reads --vocab-size 127 as ids 0-126, 126 ending a document (core_v0.16.1: 127 more), so
    # --eod-mask-loss masks the corpus's 126s; its 128 rows score the corpus's ends (127) as any token
    "megatron_null019_eod_mask": (1, GPT2_FLAGS + ["--eod-mask-loss"]),
    # --null-tokenizer-eod-id 5: the corpus's 5s end documents there, so --eod-mask-loss masks them
    "megatron_null019_eod_id": (1, GPT2_FLAGS + ["--eod-mask-loss", "--null-tokenizer-eod-id", "5"]),
}


def fixture_flags(name: str) -> list[str]:
    if name in HYBRID_FIXTURES:
        return HYBRID_COMMON_FLAGS + HYBRID_FIXTURES[name][1]
    return COMMON_FLAGS + (GPT_019_FIXTURES.get(name) or FIXTURES[name])[1]


def fixture_ranks(name: str) -> int:
    return (HYBRID_FIXTURES.get(name) or GPT_019_FIXTURES.get(name) or FIXTURES[name])[0]


def fixture_script(name: str) -> str:
    return HYBRID_SCRIPT if name in HYBRID_FIXTURES else "pretrain_gpt.py"


def fixture_release(name: str) -> str:
    """The Megatron-LM tag whose tree writes the fixture."""
    return HYBRID_TAG if name in HYBRID_FIXTURES or name in GPT_019_FIXTURES else "core_v0.16.1"


def megatron_tree(kit: Path, scratch: Path) -> Path:
    """Megatron-LM's tree: the folder given, or the tarball extracted under `scratch`."""
    if kit.is_dir():
        return kit
    shutil.unpack_archive(str(kit), str(scratch / "megatron-lm"))
    return scratch / "megatron-lm"


def launch(tree: Path, ranks: int, flags: list[str], scratch: Path, logits: Path | None = None,
           script: str = "pretrain_gpt.py") -> dict:
    """One torchrun launch of Megatron-LM's pretrain_gpt.py (or `script`); its record: {iteration: the line
    training_log got}. With `logits`, its first step's tokens and logits are written there (megatron_lm_cpu.py
    --logits)."""
    record = Path(tempfile.mkstemp(suffix=".jsonl", dir=scratch)[1])
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(ranks),
               str(LAUNCHER), "--megatron-lm", str(tree), "--script", script, "--record", str(record),
               *(["--logits", str(logits)] if logits else []), "--", *flags]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"Megatron-LM failed ({' '.join(flags)}):\n{done.stdout[-3000:]}\n{done.stderr[-6000:]}")
    lines = [json.loads(line) for line in record.read_text().splitlines()]
    return {line["iteration"]: line for line in lines}


def losses(record: dict) -> dict:
    return {str(i): line["losses"]["lm loss"] for i, line in sorted(record.items())}


def grad_norms(record: dict) -> dict:
    return {str(i): line["grad_norm"] for i, line in sorted(record.items())}


def loss_scales(record: dict) -> dict:
    return {str(i): line["loss_scale"] for i, line in sorted(record.items())}


def write_corpus(out: Path) -> None:
    """DOCUMENTS documents of SHORTEST-LONGEST tokens (random ids, then the end-of-document id), by Megatron-Core's
    own IndexedDatasetBuilder: samples cross document boundaries at varied places, so a sample order that is not
    Megatron's reads other tokens."""
    import numpy as np
    import torch
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

    folder = out / DATA_DIR
    folder.mkdir(parents=True, exist_ok=True)
    prefix = str(folder / DATA_NAME)
    rng = np.random.default_rng(CORPUS_SEED)
    builder = IndexedDatasetBuilder(prefix + ".bin", dtype=np.uint16)
    for _ in range(DOCUMENTS):
        length = int(rng.integers(SHORTEST, LONGEST + 1))
        builder.add_document(torch.tensor([*rng.integers(0, VOCAB, length - 1).tolist(), VOCAB]), [length])
    builder.finalize(prefix + ".idx")


def write_fixture(tree: Path, name: str, out: Path, scratch: Path, keep_index: bool) -> None:
    ranks, flags, script = fixture_ranks(name), fixture_flags(name), fixture_script(name)
    target = out / name
    if target.exists():
        shutil.rmtree(target)
    folder = str(target.relative_to(ROOT)) if target.is_relative_to(ROOT) else str(target)
    cache = scratch / f"{name}-cache"
    straight = launch(tree, ranks, flags + ["--save", folder, "--save-interval", str(SAVE_ITERATION),
                                            "--data-cache-path", str(cache)], scratch, script=script)
    for later in target.glob("iter_*"):
        if later.name != f"iter_{SAVE_ITERATION:07d}":
            shutil.rmtree(later)
    (target / "latest_checkpointed_iteration.txt").write_text(str(SAVE_ITERATION))
    resumed = resume(tree, name, ranks, flags, target, scratch, cache)
    if keep_index:
        index = out / DATA_DIR / INDEX_DIR
        shutil.rmtree(index, ignore_errors=True)
        index.mkdir()
        for kind in ("document", "sample", "shuffle"):
            source, = cache.glob(f"*-GPTDataset-train-{kind}_index.npy")
            shutil.copyfile(source, index / f"{kind}_index.npy")
    import torch
    record = {"world_size": ranks, "flags": flags, "save_iteration": SAVE_ITERATION,
              "uninterrupted_losses": losses(straight), "uninterrupted_grad_norms": grad_norms(straight),
              "resumed_losses": losses(resumed), "resumed_grad_norms": grad_norms(resumed),
              "uninterrupted_loss_scales": loss_scales(straight), "resumed_loss_scales": loss_scales(resumed),
              "megatron_core": _core_version(tree), "megatron_lm": fixture_release(name), "torch": torch.__version__,
              "written_by": f"scripts/tools/megatron_checkpoint_fixtures.py: Megatron-LM's {script} (iterations 1-4, "
                            f"saving at 2), then a second launch --load-ing the save (iterations 3-4)"}
    (target / "megatron_losses.json").write_text(json.dumps(record, indent=1) + "\n")
    print(f"{name}: uninterrupted {record['uninterrupted_losses']}, resumed {record['resumed_losses']}")


def _core_version(tree: Path) -> str:
    """The Megatron-Core version the launch ran: the tree's own megatron.core (core_v0.19.0's tree holds it), else
    the installed wheel's."""
    info = tree / "megatron" / "core" / "package_info.py"
    if info.is_file():
        fields = {}
        for line in info.read_text().splitlines():
            key, _, value = line.partition("=")
            if key.strip() in ("MAJOR", "MINOR", "PATCH"):
                fields[key.strip()] = value.strip()
        return ".".join(fields[k] for k in ("MAJOR", "MINOR", "PATCH"))
    import megatron.core
    return megatron.core.__version__


def resume(tree: Path, name: str, ranks: int, flags: list[str], target: Path, scratch: Path, cache: Path) -> dict:
    """Megatron-LM --load-ing a copy of the fixture's save and training iterations 3-4; its forward of iteration 3
    goes to the fixture's LOGITS."""
    copy = scratch / f"{name}-resume"
    shutil.rmtree(copy, ignore_errors=True)
    shutil.copytree(target, copy)
    return launch(tree, ranks, flags + ["--load", str(copy), "--data-cache-path", str(cache)], scratch,
                  logits=target / LOGITS, script=fixture_script(name))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    fixtures, logits = sub.add_parser("fixtures"), sub.add_parser("logits")
    for command in (fixtures, logits):
        command.add_argument("--only", choices=sorted({**FIXTURES, **HYBRID_FIXTURES, **GPT_019_FIXTURES}))
        command.add_argument("--hybrid", action="store_true",
                             help="every HybridModel fixture (HYBRID_FIXTURES): --megatron-lm is core_v0.19.0's tree")
        command.add_argument("--out", type=Path, default=ROOT / "tests" / "fixtures")
    continue_ = sub.add_parser("continue")
    continue_.add_argument("--load", required=True, type=Path)
    continue_.add_argument("--nproc", type=int, default=1)
    continue_.add_argument("--script", default="pretrain_gpt.py", choices=("pretrain_gpt.py", HYBRID_SCRIPT),
                           help="pretrain_hybrid.py: core_v0.19.0's HybridModel (--megatron-lm its tree)")
    for command in (fixtures, logits, continue_):
        command.add_argument("--megatron-lm", required=True, type=Path,
                             help="megatron-lm-core_v0.16.1-min.tar.xz, or the folder it was extracted to")
    continue_.add_argument("flags", nargs=argparse.REMAINDER)
    ns = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="megatron-lm-runs-") as scratch_name:
        scratch = Path(scratch_name)
        tree = megatron_tree(ns.megatron_lm.resolve(), scratch)
        if ns.command == "fixtures":
            write_corpus(ns.out)
            names = [ns.only] if ns.only else list(HYBRID_FIXTURES if ns.hybrid else FIXTURES)
            for name in names:
                write_fixture(tree, name, ns.out, scratch, keep_index=name == next(iter(FIXTURES)))
            return 0
        if ns.command == "logits":
            for name in [ns.only] if ns.only else list(HYBRID_FIXTURES if ns.hybrid else FIXTURES):
                ranks = fixture_ranks(name)
                saved = json.loads((ns.out / name / "megatron_losses.json").read_text())
                if saved["flags"] != fixture_flags(name):
                    sys.exit(f"{name} was written with other flags than FIXTURES': write it again (fixtures --only)")
                resumed = losses(resume(tree, name, ranks, saved["flags"], ns.out / name, scratch,
                                        scratch / f"{name}-cache"))
                # the launch must be the one the fixture recorded, or its logits are of another run
                if resumed != saved["resumed_losses"]:
                    sys.exit(f"{name}: resumed losses {resumed}, the fixture recorded {saved['resumed_losses']}")
                print(f"{name}: {ns.out / name / LOGITS}, resumed losses {resumed} as recorded")
            return 0
        copy = scratch / "load"
        shutil.copytree(ns.load, copy)
        flags = [flag for flag in ns.flags if flag != "--"]
        record = launch(tree, ns.nproc, flags + ["--load", str(copy), "--data-cache-path", str(scratch / "cache")],
                        scratch, script=ns.script)
        print(json.dumps({"losses": losses(record), "grad_norms": grad_norms(record),
                          "loss_scales": loss_scales(record)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
