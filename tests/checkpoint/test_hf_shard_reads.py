"""--init-from-hf reads each rank's shard only (checkpoint/hf/source.py).

- Any region of any tensor of a GPT-2 (Conv1D transposes, per-head q/k/v), a Llama (GQA, tied, biases; also with
  --apply-layernorm-1p's gain shift), a Phi-3 (fused qkv_proj and gate_up_proj), a Mixtral and a Qwen2-MoE folder
  (experts, routers, a gated shared expert), and the MoE families of families/ whose files keep an expert a tensor
  (Qwen3-MoE, DeepSeek-V3 with MLA, OLMoE, GLM-4.5; the routers' expert bias served apart, whole) reads the values
  the whole-folder conversion gives, bit for bit, and exactly that region's bytes.
- A tiny random Llama folder loaded at TP 2 x PP 2 on 4 gloo ranks: each rank reads at most its own shard's bytes
  plus 10% (the safetensors headers, which every rank reads, included), the figures the load's start-up line
  states; three iterations from it log the one-rank run's losses and gradient norms to 1e-6 relative (fp32; TP's
  and PP's sums run in another order)."""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

import pytest
import torch

from base.options import replace_settings
from tests.checkpoint.hf_random import fill_random
from tests.distributed import free_port, run_distributed

VOCAB = 320
RUN = ["--train-iters", "3", "--eval-iters", "0", "--micro-batch-size", "2", "--global-batch-size", "4",
       "--log-interval", "1", "--device", "cpu", "--hidden-dropout", "0", "--attention-dropout", "0",
       "--tokenizer-vocab-size", "300", "--lr", "1e-3", "--lr-warmup-iters", "0", "--seed", "5"]
GRID = ["--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "2"]


def llama_folder(path: Path) -> Path:
    """A LlamaForCausalLM with every weight random (gains around 1), saved by transformers."""
    from transformers import LlamaConfig, LlamaForCausalLM

    model = LlamaForCausalLM(LlamaConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=32, rms_norm_eps=1e-6, tie_word_embeddings=True,
        attention_bias=True, mlp_bias=True, bos_token_id=None, eos_token_id=None, pad_token_id=None))
    fill_random(model, seed=3, scale=0.1)
    model.save_pretrained(str(path))
    return path


def load_then_train(rank: int, world_size: int, argv: list[str], ports: list[int]) -> tuple[int, int]:
    """This rank's (bytes read, shard bytes) from --init-from-hf's load as a run builds it, then the run itself."""
    import pretrain_gpt
    from arguments.parser import parse_config
    from checkpoint.hf.source import initialize_from_hf
    from parallel.state import destroy, initialize_grid
    from training.build import build
    from training.run_settings import resolve_run_settings

    os.environ["MASTER_PORT"] = str(ports[0])
    config = parse_config(argv)
    state = initialize_grid("cpu", config.parallel, 10)
    try:
        settings = resolve_run_settings(config, VOCAB, state.tensor_parallel_size, state.data_parallel_size, "cpu")
        built = build(settings, state, dropout_rng=True, torch_compile=False)
        point = initialize_from_hf(built.zero.optimizer, built.model, config.checkpoint.init_from_hf,
                                   settings.config.model, state)
    finally:
        destroy(state)
    os.environ["MASTER_PORT"] = str(ports[1])
    assert pretrain_gpt.main(argv) == 0
    return point.bytes_read, point.shard_bytes


def folder_of(family: str, path: Path) -> Path:
    if family.startswith("llama"):
        return llama_folder(path)
    if family == "gpt2":
        from tests.checkpoint.test_hf_checkpoint import random_hf_folder

        return random_hf_folder(path, seed=2)
    if family in ("mixtral", "qwen2_moe"):
        from tests.checkpoint import test_hf_moe

        return getattr(test_hf_moe, f"{family}_folder")(path)
    if family in MOE_FAMILIES:
        from tests.checkpoint.moe_family_folders import family_folder

        return family_folder(family, path)
    import transformers

    from tests.checkpoint.test_hf_dense_families import COMMON, FAMILIES
    from tests.checkpoint.test_hf_folder_is_the_model import random_weights

    config_class, model_class, extra = FAMILIES[family]
    model = getattr(transformers, model_class)(getattr(transformers, config_class)(**COMMON, **extra))
    random_weights(model, seed=7)
    model.save_pretrained(str(path))
    return path


# the MoE families of families/ whose files keep one tensor per expert (GPT-OSS's fused experts are read whole)
MOE_FAMILIES = ("qwen3_moe", "deepseek_v3", "olmoe", "glm4_moe")


@pytest.mark.parametrize("family", ["gpt2", "llama", "llama-1p", "phi3", "mixtral", "qwen2_moe", *MOE_FAMILIES])
def test_a_region_reads_the_whole_folders_values_and_only_its_bytes(tmp_path, family):
    from arguments.parser import parse_config
    from checkpoint.global_state import MODEL_KEY
    from checkpoint.hf.folders import read_whole_folder
    from checkpoint.hf.source import HFSource, open_hf_source
    from families.common.layout import EXPERT_BIAS
    from parallel.state import ParallelState
    from training.run_settings import resolve_run_settings

    folder = folder_of(family, tmp_path / "hf")
    vocab = json.loads((folder / "config.json").read_text())["vocab_size"]
    config = parse_config(["--init-from-hf", str(folder), "--device", "cpu"])
    model = resolve_run_settings(config, vocab, 1, 1, "cpu").config.model
    model = replace_settings(model, apply_layernorm_1p=family == "llama-1p")
    cpu = ParallelState(device=torch.device("cpu"))
    source, whole = open_hf_source(folder, model, cpu), read_whole_folder(folder, model, cpu)
    assert isinstance(source, HFSource)
    infos = source.tensors(MODEL_KEY)
    biases = {name: tensor.tolist() for name, tensor in whole.items() if name.endswith(EXPERT_BIAS)}
    assert infos.keys() == whole.keys() - biases.keys()
    assert source.expert_biases() == (biases or None)  # DeepSeek-V3's and GLM-4.5's e_score_correction_bias
    draw = random.Random(0)
    for name, info in infos.items():
        assert (info.shape, info.dtype) == (tuple(whole[name].shape), whole[name].dtype), name
        real = [vocab if name in ("word_embeddings.weight", "output_layer.weight") and axis == 0 else size
                for axis, size in enumerate(info.shape)]  # the padding rows are no folder's bytes
        for _ in range(4):
            region = tuple(slice(start, draw.randint(start + 1, size))
                           for size in real for start in [draw.randrange(size)])
            before = source.bytes_read
            values = source.read(MODEL_KEY, name, region)
            assert torch.equal(values, whole[name][region]), (name, region)
            assert source.bytes_read - before == values.numel() * values.element_size(), (name, region)


def logged(path: Path) -> list[float]:
    return [value for record in map(json.loads, path.read_text().splitlines()) if "loss" in record
            for value in (record["loss"], record["grad_norm"])]


@pytest.mark.slow
def test_init_from_hf_at_tp2_pp2_reads_each_ranks_shard_and_trains_as_one_rank(tmp_path, corpus_cache_300):
    folder = str(llama_folder(tmp_path / "llama"))
    common = ["--init-from-hf", folder, *RUN, "--data-cache-dir", corpus_cache_300]
    grid = common + GRID + ["--metrics-file", str(tmp_path / "grid.jsonl")]
    reads = run_distributed(load_then_train, 4, grid, [free_port(), free_port()], timeout=600)
    one = common + ["--metrics-file", str(tmp_path / "one.jsonl")]
    run_distributed(load_then_train, 1, one, [free_port(), free_port()], timeout=300)

    for rank, (bytes_read, shard_bytes) in enumerate(reads):
        assert 0 < shard_bytes < bytes_read <= shard_bytes * 1.1, (rank, bytes_read, shard_bytes)
    reference = logged(tmp_path / "one.jsonl")
    assert len(reference) == 2 * 3
    assert logged(tmp_path / "grid.jsonl") == pytest.approx(reference, rel=1e-6, abs=0)
