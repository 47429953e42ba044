"""Expert-parallel checkpoints (issue 51 item 6): each rank saves only its own experts, and what a rank writes
is counted by recording every tensor it hands to the writer (checkpoint/writer.py, through format.py's save_tensors).

Megatron-Core saves experts by global index from the ranks that hold them (megatron/core/transformer/moe/experts.py,
SequentialMLP / TEGroupedMLP sharded_state_dict: each local expert's tensors re-keyed to its global index, with a
replica id over the expert data-parallel group so one replica writes), and Megatron-LM's per-rank file names carry
the expert rank (megatron/training/checkpointing.py get_checkpoint_name, `expert_rank`). Here each expert-parallel
rank's experts go to a model file of their own, written by the first rank of its expert data-parallel group, and
the optimizer files name and hold each element once."""

from __future__ import annotations

import json
import re

import pytest
import torch

from tests.checkpoint.hf_random import fill_random
from tests.distributed import free_port, run_distributed
from tests.reliability_helpers import TINY
from tests.training.test_expert_parallel_training import MOE
from tests.training.test_moe_training import launch_rank

EXPERT = re.compile(r"\.mlp\.experts\.(\d+)\.")
HF_EXPERT = re.compile(r"\.experts\.(\d+)\.")  # a Mixtral's block_sparse_moe.experts.<e>., a Qwen2-MoE's mlp.experts.<e>.


def record_writes(rank, world_size, argv_by_launch, ports):
    """launch_rank, with every tensor this rank passes to the checkpoint writer recorded: {file: {tensor: numel}}."""
    import checkpoint.writer

    writes: dict[str, dict[str, int]] = {}
    real = checkpoint.writer.save_tensors

    def recording(path, tensors, metadata=None):
        writes[path.name] = {name: tensor.numel() for name, tensor in tensors.items()}
        if metadata and "fragments" in metadata:
            writes[path.name]["fragments"] = sum(numel for *_, numel in metadata["fragments"])
        return real(path, tensors, metadata)

    checkpoint.writer.save_tensors = recording
    try:
        launch_rank(rank, world_size, argv_by_launch, ports)
    finally:
        checkpoint.writer.save_tensors = real
    return writes


@pytest.mark.slow
@pytest.mark.parametrize("world_size, stage", [(2, "0"), (2, "3"), (4, "0"), (4, "3")])
def test_each_expert_parallel_rank_writes_only_its_own_experts_and_each_element_once(
        corpus_cache_300, tmp_path, world_size, stage):
    """At EP 2 (EP rank e holds experts 2e and 2e+1 of each MoE layer; on 4 ranks each EP rank's experts are held
    by an expert data-parallel group of 2), the tensors a rank hands to the writer hold no other EP rank's expert:
    the dense model file has no expert, EP rank e's expert file only its own, and each file is written by one
    rank. Over the checkpoint every parameter is in exactly one model file, and the optimizer files name each
    parameter element once and write it once (at stage 0 the dense part, replicated on every rank, and each EP
    rank's experts, replicated over its expert data-parallel group, by the group's first rank only). The
    checkpoint verifies, resumes at EP 1 (training on) and zero_to_fp32 consolidates every expert from it."""
    from safetensors.torch import load_file

    from checkpoint.format import read_metadata, resolve_checkpoint
    from scripts.tools import zero_to_fp32

    common = TINY + MOE + ["--train-iters", "2", "--data-cache-dir", corpus_cache_300, "--global-batch-size", "8",
                           "--zero-stage", stage, "--moe-token-dispatcher-type", "alltoall"]
    argv = [common + ["--expert-model-parallel-size", "2", "--save", str(tmp_path / "ckpt"), "--exit-interval", "1"],
            common + ["--load", str(tmp_path / "ckpt"), "--metrics-file", str(tmp_path / "ep1.jsonl")]]
    writes = run_distributed(record_writes, world_size, argv, [free_port() for _ in argv], timeout=600)

    metadata = read_metadata(resolve_checkpoint(tmp_path / "ckpt"))
    table = metadata["parameters"]
    experts = {name for name in table if EXPERT.search(name)}
    assert len(experts) == 2 * 4 * 4  # 2 layers x 4 experts x (2 weights + 2 biases)
    in_model_files = []
    for rank, files in enumerate(writes):
        assert len([file for file in files if "_ep" in file]) <= 1, rank
        for file, tensors in files.items():
            if file.startswith("model_"):
                held = {int(EXPERT.search(name).group(1)) for name in tensors if EXPERT.search(name)}
                ep = int(file.split("_ep")[1][:3]) if "_ep" in file else None
                assert held == (set() if ep is None else {2 * ep, 2 * ep + 1}), (rank, file, sorted(held))
                in_model_files += list(tensors)
    assert sorted(in_model_files) == sorted(table)  # every parameter once over the model files
    dense = [tensors for files in writes for file, tensors in files.items() if file == "model_tp00.safetensors"]
    assert len(dense) == 1 and not experts & set(dense[0])

    elements = sum(torch.Size(entry["shape"]).numel() for entry in table.values())
    dense_elements = sum(torch.Size(entry["shape"]).numel() for name, entry in table.items() if name not in experts)
    optimizer = [tensors for files in writes for file, tensors in files.items() if file.startswith("optim_")]
    assert sum(tensors["fragments"] for tensors in optimizer) == elements  # named once ...
    # ... and written once: beyond the named elements only the partitions' alignment padding, never a second copy
    # of the dense part (at stage 0 both ranks hold it whole)
    assert 0 <= sum(tensors["master"] for tensors in optimizer) - elements < dense_elements // 10
    assert {entry[1] for entry in metadata["expert_model_files"]} == {0, 1}

    # the EP-1 resume from it trained on (2 more iterations)
    assert len([r for r in map(json.loads, (tmp_path / "ep1.jsonl").read_text().splitlines()) if "loss" in r]) == 1
    assert zero_to_fp32.main([str(tmp_path / "ckpt"), str(tmp_path / "fp32.safetensors")]) == 0
    assert set(load_file(str(tmp_path / "fp32.safetensors"))) >= experts


# ---- --init-from-hf into expert parallelism --------------------------------------------------------------------

def record_reads(rank, world_size, argv_by_launch, ports):
    """launch_rank, with the expert tensors this rank reads from the Hugging Face folder recorded, per launch (the
    folder is read by offset: checkpoint/hf/source.py)."""
    import checkpoint.hf.source

    reads: list[set[str]] = []
    real = checkpoint.hf.source.read_rows

    def recording(stored, *where):
        if ".experts." in stored.name:
            reads[-1].add(stored.name)
        return real(stored, *where)

    checkpoint.hf.source.read_rows = recording
    try:
        for argv, port in zip(argv_by_launch, ports):
            reads.append(set())
            launch_rank(rank, world_size, [argv], [port])
    finally:
        checkpoint.hf.source.read_rows = real
    return reads


def moe_folder(path, family: str):
    """A tiny Mixtral or Qwen2-MoE (shared expert with its gate) saved by transformers, random weights; its
    vocabulary and positions as tests/checkpoint/test_hf_folder_is_the_model.py's folders (no tokenizer)."""
    from transformers import MixtralConfig, MixtralForCausalLM, Qwen2MoeConfig, Qwen2MoeForCausalLM

    from tests.checkpoint.test_hf_folder_is_the_model import POSITIONS, VOCAB

    common = dict(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=POSITIONS, rms_norm_eps=1e-6,
                  num_experts_per_tok=2, bos_token_id=None, eos_token_id=None, pad_token_id=None)
    if family == "mixtral":
        model = MixtralForCausalLM(MixtralConfig(**common, intermediate_size=48, num_local_experts=4))
    else:
        model = Qwen2MoeForCausalLM(Qwen2MoeConfig(**common, intermediate_size=80, moe_intermediate_size=48,
                                                   shared_expert_intermediate_size=40, num_experts=4))
    fill_random(model, seed=7, scale=0.2)
    model.save_pretrained(str(path))
    return path


@pytest.mark.slow
@pytest.mark.parametrize("family", ["mixtral", "qwen2_moe"])
def test_init_from_hf_at_expert_parallel_2_reads_each_ranks_own_experts_and_trains_as_at_1(tmp_path, family):
    """--init-from-hf of a Mixtral / Qwen2-MoE folder at --expert-model-parallel-size 2: each rank reads only the
    experts it holds from the folder (expert 2r and 2r+1 of each layer on rank r; at EP 1 the two ZeRO 1
    partitions read all four between them), and the losses are the EP-1 load's: iteration 1's (the folder's
    weights, before any update) and the next two, to 1e-6 relative as EP 2 trains like EP 1
    (tests/training/test_expert_parallel_training.py)."""
    from tests.checkpoint.test_hf_folder_is_the_model import RUN

    folder = moe_folder(tmp_path / "hf", family)
    common = ["--init-from-hf", str(folder), *RUN, "--train-iters", "3", "--global-batch-size", "4",
              "--zero-stage", "1", "--data-cache-dir", str(tmp_path / "cache")]
    launches = {"ep1": [], "ep2": ["--expert-model-parallel-size", "2", "--moe-token-dispatcher-type", "alltoall"]}
    argv = [common + extra + ["--metrics-file", str(tmp_path / f"{name}.jsonl")] for name, extra in launches.items()]
    reads = run_distributed(record_reads, 2, argv, [free_port() for _ in argv], timeout=600)

    def experts(names):
        return {int(HF_EXPERT.search(name).group(1)) for name in names}
    assert set().union(*(experts(ep1) for ep1, _ in reads)) == {0, 1, 2, 3}
    for rank, (_, ep2) in enumerate(reads):
        assert experts(ep2) == {2 * rank, 2 * rank + 1}, rank
    losses = {name: [r["loss"] for r in map(json.loads, (tmp_path / f"{name}.jsonl").read_text().splitlines())
                     if "loss" in r and "split" not in r] for name in launches}
    assert len(losses["ep1"]) == 3
    assert losses["ep2"] == pytest.approx(losses["ep1"], rel=1e-6, abs=0)


@pytest.mark.slow
def test_saved_at_pipeline_2_by_expert_parallel_2_with_the_expert_bias_resumes_exactly_and_at_one_stage(
        corpus_cache_300, tmp_path):
    """4 ranks, 2 stages x EP 2 with aux-loss-free balancing: each stage's expert files hold only that stage's
    layer's experts of one EP rank, listed with the stage's files; each stage's routers' bias is saved (by the
    stage's first rank) and restored: resumed at the same grid the losses are the straight run's bitwise, and the
    checkpoint also loads at one stage and EP 1 (4 data-parallel ranks), which trains on."""
    from checkpoint.format import read_metadata, resolve_checkpoint

    common = TINY + MOE + ["--train-iters", "4", "--data-cache-dir", corpus_cache_300, "--global-batch-size", "8",
                           "--zero-stage", "1", "--moe-router-score-function", "sigmoid",
                           "--moe-router-enable-expert-bias", "--moe-router-bias-update-rate", "0.05"]
    grid = ["--pipeline-model-parallel-size", "2", "--expert-model-parallel-size", "2",
            "--moe-token-dispatcher-type", "alltoall"]
    save = ["--save", str(tmp_path / "ckpt")]
    argv = [common + grid + ["--metrics-file", str(tmp_path / "full.jsonl")],
            common + grid + save + ["--exit-interval", "2", "--metrics-file", str(tmp_path / "split.jsonl")],
            common + grid + ["--load", str(tmp_path / "ckpt"), "--metrics-file", str(tmp_path / "split.jsonl")],
            common + ["--load", str(tmp_path / "ckpt"), "--metrics-file", str(tmp_path / "one_stage.jsonl")]]
    writes = run_distributed(record_writes, 4, argv, [free_port() for _ in argv], timeout=900)

    def losses(name):
        return [(r["iteration"], r["loss"], r["grad_norm"])
                for r in map(json.loads, (tmp_path / f"{name}.jsonl").read_text().splitlines())
                if "loss" in r and "split" not in r]
    assert len(losses("full")) == 4 and losses("split") == losses("full")
    assert [iteration for iteration, *_ in losses("one_stage")] == [3, 4]

    metadata = read_metadata(resolve_checkpoint(tmp_path / "ckpt"))
    assert sorted(metadata["expert_bias"]) == ["blocks.0.mlp.router.expert_bias", "blocks.1.mlp.router.expert_bias"]
    files = {file: held for _, _, file, held in metadata["expert_model_files"]}
    assert sorted(files) == [f"model_pp{pp:03d}_tp00_ep{ep:03d}.safetensors" for pp in (0, 1) for ep in (0, 1)]
    for stage, entry in enumerate(metadata["pipeline_stages"]):
        for file in (f for f in entry["files"] if f in files):
            assert {name.split(".")[1] for name in files[file]} == {str(stage)}  # blocks.<stage>.
    for files_of_rank in writes:
        for file, tensors in files_of_rank.items():
            if "_ep" in file:
                ep = int(file.split("_ep")[1][:3])
                assert {int(EXPERT.search(name).group(1)) for name in tensors} == {2 * ep, 2 * ep + 1}
