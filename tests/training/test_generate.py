"""`python -m training.generate` (issue 94 item 4): greedy tokens from a checkpoint equal transformers' greedy
`generate` on the same weights, from each format the loader reads:
- this project's checkpoint of a tiny Llama-shaped model with its tokenizer, a text prompt: against
  scripts/tools/convert_to_hf.py's export of it, tokenized by that folder's tokenizer, both stopping at its end token;
- a Hugging Face folder transformers saved (--init-from-hf; Llama's, GPT-2's), a prompt of ids: against the folder
  itself;
- Megatron-LM's own torch_dist save (tests/fixtures/megatron_llama): the loaded model's logits are the ones
  Megatron-LM's forward gave, and its greedy tokens those of the folder convert_to_hf.py exports;
- a save of ours over TP 2 x PP 2: every weight loaded whole is the consolidated fp32 master.
Weights are drawn wide (std 0.2, or transformers' folder at scale 0.1) so that no greedy step is near a tie.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from arguments.config import PretrainConfig
from base.options import replace_settings
from checkpoint.inference_load import inference_checkpoint, load_model_weights, open_source
from checkpoint.ours.sharded import save_checkpoint
from data.tokenizer import train_tokenizer
from gpt.model import GPTModel, build_gpt_model
from parallel.state import ParallelState
from scripts.tools import convert_to_hf
from tests.checkpoint.test_hf_folder_is_the_model import gpt2_folder
from tests.checkpoint.test_hf_llama import random_llama_folder
from tests.checkpoint.test_megatron_checkpoint import FIXTURES
from tests.checkpoint.test_megatron_to_hf import megatron_logits
from tests.zero_harness import ZeroHarness
from training import generate

CPU = ParallelState(device=torch.device("cpu"))
TEXT = "the cat sat on the mat. the dog sat on the log. " * 20
LLAMA = dict(num_layers=2, hidden_size=32, num_attention_heads=4, num_query_groups=2, seq_length=32,
             max_position_embeddings=32, ffn_hidden_size=64, normalization="RMSNorm", swiglu=True,
             position_embedding_type="rope", untie_embeddings_and_output_weights=True, add_bias_linear=False,
             hidden_dropout=0.0, attention_dropout=0.0, init_method_std=0.2)


def generated_ids(capsys, *argv: str) -> list[int]:
    assert generate.main(list(argv)) == 0
    line = [text for text in capsys.readouterr().out.splitlines() if text.startswith("generated ids:")][-1]
    return [int(token) for token in line.split(":")[1].split()]


def transformers_greedy(folder, prompt: list[int], new: int) -> list[int]:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()
    out = model.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=new)
    return out[0, len(prompt):].tolist()


def save_trained(path, tokenizer, steps: int, **data) -> None:
    """A tiny Llama-shaped model of the tokenizer's vocabulary, `steps` steps on TEXT, saved with the tokenizer."""
    config = PretrainConfig()
    config = dataclasses.replace(config, model=replace_settings(config.model, **LLAMA, vocab_size=tokenizer.vocab_size),
                                 data=replace_settings(config.data, **data))
    model = GPTModel(config.model, CPU)
    optimizer = ZeroHarness.from_config(model, config, CPU)
    ids = torch.tensor(tokenizer.encode(TEXT)[:4 * 17]).view(4, 17)
    for _ in range(steps):
        optimizer.zero_grad()
        optimizer.backward(model(ids[:, :-1], ids[:, 1:]).mean())
        optimizer.step()
    save_checkpoint(path, max(steps, 1), 4 * max(steps, 1), model, optimizer, None, config, CPU, tokenizer=tokenizer)


def test_our_checkpoint_generates_transformers_greedy_tokens_from_text(tmp_path, capsys):
    from transformers import AutoTokenizer

    tokenizer = train_tokenizer([TEXT], 300)
    save_trained(tmp_path / "ckpt", tokenizer, 3)  # trained a few steps: what is saved is a run's master weights
    ours = generated_ids(capsys, "--load", str(tmp_path / "ckpt"), "--prompt", "the dog sat",
                         "--num-tokens-to-generate", "12")
    assert convert_to_hf.main([str(tmp_path / "ckpt"), str(tmp_path / "hf")]) == 0
    prompt = AutoTokenizer.from_pretrained(str(tmp_path / "hf"))("the dog sat").input_ids
    assert prompt == tokenizer.tokenize_batch(["the dog sat"])[0]
    assert ours == transformers_greedy(tmp_path / "hf", prompt, 12)
    # the recomputing path and the cache agree on the real checkpoint too
    assert ours == generated_ids(capsys, "--load", str(tmp_path / "ckpt"), "--prompt", "the dog sat",
                                 "--num-tokens-to-generate", "12", "--no-kv-cache")


def test_a_sentencepiece_tokenizer_saved_with_the_run_reads_the_prompt(tmp_path, capsys):
    """A run with --tokenizer-type Llama2Tokenizer saved its tokenizer.model: the prompt is Megatron's tokenize of it
    (the start token first), and the printed text is the prompt's."""
    from data.sentencepiece_tokenizer import load_sentencepiece_tokenizer
    from tests.conftest import train_sentencepiece_model

    train_sentencepiece_model(tmp_path / "sp.model", [TEXT], vocab_size=40, byte_fallback=False,
                              hard_vocab_limit=False)
    tokenizer = load_sentencepiece_tokenizer("Llama2Tokenizer", str(tmp_path / "sp.model"))
    save_trained(tmp_path / "ckpt", tokenizer, 0, tokenizer_type="Llama2Tokenizer",
                 tokenizer_file=str(tmp_path / "sp.model"))
    prompt = tokenizer.tokenize_batch(["the dog sat"])[0]
    assert prompt[0] == 1  # Llama 2's bos
    most = LLAMA["max_position_embeddings"] - len(prompt)  # the prompt and its new tokens fill the positions
    from_text = generated_ids(capsys, "--load", str(tmp_path / "ckpt"), "--prompt", "the dog sat", "--ignore-eos",
                              "--num-tokens-to-generate", str(most))
    assert len(from_text) == most
    assert from_text == generated_ids(capsys, "--load", str(tmp_path / "ckpt"), "--prompt-ids", *map(str, prompt),
                                      "--ignore-eos", "--num-tokens-to-generate", str(most))


@pytest.mark.parametrize("family", ["llama", "gpt2"])  # rotary; learned positions, read at the cache's offsets
def test_a_hugging_face_folder_generates_its_own_greedy_tokens(tmp_path, capsys, family):
    folder = random_llama_folder(tmp_path / "hf", "gqa2-head-dim-24") if family == "llama" else \
        gpt2_folder(tmp_path / "hf")
    prompt = [5, 17, 200, 3]
    ours = generated_ids(capsys, "--init-from-hf", str(folder), "--prompt-ids", *map(str, prompt),
                         "--max-new-tokens", "10")
    assert len(ours) == 10  # no tokenizer: no end token to stop at
    assert ours == transformers_greedy(folder, prompt, 10)


def test_megatron_lms_torch_dist_save_gives_its_logits_and_the_exports_greedy_tokens(tmp_path, capsys):
    checkpoint = inference_checkpoint(FIXTURES / "megatron_llama")
    model = build_gpt_model(checkpoint.model, CPU, seed=0).eval()
    with open_source(checkpoint, CPU) as source:
        load_model_weights(source, model, CPU)
    tokens, expected = megatron_logits("megatron_llama")
    with torch.no_grad():
        logits = model(tokens)
    assert float((logits - expected).abs().max()) <= 1e-5 * float(expected.abs().max())

    prompt = tokens[0, :6].tolist()
    ours = generated_ids(capsys, "--load", str(FIXTURES / "megatron_llama"), "--prompt-ids", *map(str, prompt),
                         "--out-seq-length", "8")
    assert convert_to_hf.main([str(FIXTURES / "megatron_llama"), str(tmp_path / "hf")]) == 0
    assert ours == transformers_greedy(tmp_path / "hf", prompt, 8)


def test_a_save_over_tp2_and_pp2_loads_whole_on_one_process():
    """Every weight of the one-rank model is the consolidated fp32 master (zero_to_fp32.py's) of a TP 2 x PP 2 save."""
    from checkpoint.ours.source import consolidate

    checkpoint = inference_checkpoint(FIXTURES / "checkpoint_54c4492_tp2_pp2")
    model = build_gpt_model(checkpoint.model, CPU, seed=0)
    with open_source(checkpoint, CPU) as source:
        load_model_weights(source, model, CPU)
    master = consolidate(checkpoint.path)["master"]
    params = dict(model.named_parameters())
    assert set(params) == set(master)
    vocab = checkpoint.model.vocab_size  # the padding rows differ: TP 2 pads to another multiple
    for name, tensor in master.items():
        rows = vocab if name in ("word_embeddings.weight", "output_layer.weight") else tensor.shape[0]
        assert torch.equal(params[name][:rows], tensor[:rows]), name


@pytest.mark.parametrize("load,argv,named", [
    ("megatron_llama", ["--prompt", "hi"], "holds no tokenizer"),
    ("megatron_llama", ["--tokenizer-type", "NullTokenizer", "--prompt", "hi"], "holds no tokenizer"),  # ids only
    ("megatron_llama", ["--prompt-ids", "1", "--top_k", "5", "--top_p", "0.5"], "Cannot have top-p and top-k both"),
    ("megatron_llama", ["--prompt-ids", "100000"], "prompt id 100000 is outside the model's vocabulary"),
    ("deepspeed_checkpoints/hf_llama_zero2", ["--prompt-ids", "1"], "DeepSpeed's checkpoint (global_step2), which "
                                                                     "generation does not read; pretrain_gpt.py"),
])
def test_bad_requests_are_one_line(load, argv, named, capsys):
    assert generate.main(["--load", str(FIXTURES / load), *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert named in err and len(err.splitlines()) == 1


def test_several_prompts_each_make_the_tokens_they_make_alone(tmp_path, capsys):
    """Prompts of three lengths in batches of 2 (--max-batch-size): each prompt's greedy tokens and its stop are the
    ones it makes alone, with the cache and without; --prompts and --prompt-file give the same prompts in order."""
    tokenizer = train_tokenizer([TEXT], 300)
    save_trained(tmp_path / "ckpt", tokenizer, 3)
    texts = ["the dog sat", "the cat sat on the", "mat"]
    load = ["--load", str(tmp_path / "ckpt"), "--num-tokens-to-generate", "10"]
    alone = [generated_ids(capsys, *load, "--prompt", text) for text in texts]
    assert len({len(ids) for ids in tokenizer.tokenize_batch(texts)}) == 3, "three prompt lengths"
    (tmp_path / "prompts.txt").write_text("\n".join(texts) + "\n\n")
    for flags in (["--prompt", texts[0], "--prompt", texts[1], "--prompt", texts[2], "--max-batch-size", "2"],
                  ["--prompts", *texts], ["--prompt-file", str(tmp_path / "prompts.txt"), "--no-kv-cache"]):
        assert generate.main([*load, *flags]) == 0
        out = capsys.readouterr().out.splitlines()
        lines = [line for line in out if line.startswith("generated ids:")]
        assert [[int(token) for token in line.split(":")[1].split()] for line in lines] == alone, flags
    # a stop token one row makes early: that row ends with it, the others go on, each as `generate` makes it alone
    from gpt.generation import generate as generate_one
    from gpt.generation import generate_prompts
    from gpt.sampling import Sampling

    checkpoint = inference_checkpoint(tmp_path / "ckpt")
    model = build_gpt_model(checkpoint.model, CPU, seed=0).eval()
    with open_source(checkpoint, CPU) as source:
        load_model_weights(source, model, CPU)
    prompts, greedy = tokenizer.tokenize_batch(texts), Sampling(1.0, 1, 0.0)
    stop = alone[0][1]
    batched = generate_prompts(model, prompts, 10, greedy, stop_id=stop, max_batch_size=3)
    assert len(batched[0]) == 2 and batched[0][-1] == stop
    assert batched == [generate_one(model, torch.tensor([ids]), 10, greedy, stop_id=stop)[0].tolist()
                       for ids in prompts]
    # one prompt sampled: the same draws as `generate` (the sampled commands' tokens are what they were before batching)
    sampled = Sampling(0.8, 0, 0.9)
    assert generate_prompts(model, prompts[:1], 10, sampled, torch.Generator().manual_seed(7)) == [
        generate_one(model, torch.tensor(prompts[:1]), 10, sampled, torch.Generator().manual_seed(7))[0].tolist()]


@pytest.mark.slow
@pytest.mark.parametrize("saved", ["ours", "megatron"])
def test_torchrun_at_the_saved_tensor_parallel_size_gives_the_one_process_tokens(tmp_path, capsys, saved):
    """A save at TP 2 generated from under torchrun on 2 gloo processes, two prompts of two lengths batched: each
    prompt's greedy tokens are the one-process run's of it alone. Ours (TP 2 x PP 2, two text prompts): those are also
    transformers' on the folder convert_to_hf.py exports, tokenized by that folder's tokenizer. Megatron-LM's TP 2
    save (two prompts of ids) is no shape the export writes; its one-process tokens are held to transformers' by
    test_megatron_lms_torch_dist_save_gives_its_logits_and_the_exports_greedy_tokens's fixture of the same saver."""
    import json
    import os
    import subprocess
    import sys

    from checkpoint.torch_dist.common import load_common
    from tests.readme import ROOT

    if saved == "ours":
        folder = FIXTURES / "checkpoint_54c4492_tp2_pp2"
        assert json.loads((folder / "iter_0000002" / "metadata.json").read_text())["tensor_parallel_size"] == 2
        prompts = [["--prompt", "the cat"], ["--prompt", "a dog sat"]]
    else:
        folder = FIXTURES / "megatron_tp2_swiglu_gqa"
        assert load_common(folder / "iter_0000002")["args"].tensor_model_parallel_size == 2
        prompts = [["--prompt-ids", "5", "17", "100", "42"], ["--prompt-ids", "3", "9"]]
    flags = ["--load", str(folder), "--num-tokens-to-generate", "8"]
    launched = subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", "-m",
         "training.generate", *flags, *prompts[0], *prompts[1]],
        cwd=ROOT, env={**os.environ, "WANDB_MODE": "disabled"}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True)
    alone = [generated_ids(capsys, *flags, *prompt) for prompt in prompts]
    if saved == "ours":
        from transformers import AutoTokenizer

        assert convert_to_hf.main([str(folder), str(tmp_path / "hf")]) == 0
        hf_tokenizer = AutoTokenizer.from_pretrained(str(tmp_path / "hf"))
        ids = [hf_tokenizer(prompt[1]).input_ids for prompt in prompts]
        assert len(set(map(len, ids))) == 2
        assert alone == [transformers_greedy(tmp_path / "hf", prompt, 8) for prompt in ids]
    out, err = launched.communicate(timeout=300)
    assert launched.returncode == 0, err[-3000:]
    assert "tensor-parallel over 2 processes" in out
    lines = [line for line in out.splitlines() if line.startswith("generated ids:")]
    assert [[int(token) for token in line.split(":")[1].split()] for line in lines] == alone


@pytest.fixture(scope="module")
def rotary_checkpoint(tmp_path_factory):
    """A tiny Llama-shaped (rotary) model of 32 positions, saved untrained with its tokenizer."""
    path = tmp_path_factory.mktemp("generate") / "ckpt"
    save_trained(path, train_tokenizer([TEXT], 300), 0)
    return path


def _sparse_file(path, size: int):
    with open(path, "wb") as file:
        file.truncate(size)  # no bytes written: the size alone is what is refused
    return path


@pytest.mark.parametrize("argv,named", [
    (["--tokenizer-type", "Bogus", "--prompt", "x"], "invalid choice: 'Bogus' (choose from 'GPT2BPETokenizer', "
                                                     "'HuggingFaceTokenizer'"),
    (["--tokenizer-type", "HuggingFaceTokenizer", "--prompt", "x"], "HuggingFaceTokenizer needs --tokenizer-model"),
    (["--vocab-file", "v.json", "--prompt", "x"], "--vocab-file and --merge-file go together"),
    (["--prompt-file", "/dev/zero"], "--prompt-file /dev/zero: cannot read it (a character device)"),
    (["--prompt-file", "{huge}"], "more than the 64 MiB such a file can be"),
    (["--prompt-file", "{latin1}"], "not UTF-8 text (invalid continuation byte at byte 2)"),
    # Megatron-LM's check (megatron/inference/text_generation/generation.py,
    # generate_tokens_probs_and_return_on_first_stage): `if max_sequence_length > args.max_position_embeddings: raise
    # ValueError("Length of prompt + tokens_to_generate longer than allowed")`, whatever the position embedding
    (["--prompt-ids", "1", "2", "--num-tokens-to-generate", str(10**12)],
     f"--num-tokens-to-generate {10**12} after a prompt of 2 tokens makes {10**12 + 2} positions, more than the "
     f"model's 32 (--max-position-embeddings"),
    (["--prompt-ids", "1", "2", "--num-tokens-to-generate", "31"], "generate at most 30"),
    # and its next: `if max_sequence_length * batch_size > args.max_tokens_to_oom: raise ValueError("Too many tokens.
    # ...")`, --max-tokens-to-oom's default 12000 (megatron/training/arguments.py _add_inference_args)
    (["--prompt-ids", "1", "--prompt-ids", "2", "3", "--num-tokens-to-generate", "20", "--max-tokens-to-oom", "43"],
     "2 prompts in a batch, each run to 22 positions, make 44 tokens, more than --max-tokens-to-oom 43"),
    (["--prompt-ids", "1", "--max-tokens-to-oom", "0"], "--max-tokens-to-oom 0: give at least 1"),
    (["--prompt-ids", "1", "--num-tokens-to-generate", "0"], "--num-tokens-to-generate 0: give at least 1"),
    (["--prompt-ids", "1", "--temperature", "nan", "--top_k", "0"], "--temperature nan: give 0 (greedy) up to 100"),
    (["--prompt-ids", "1", "--temperature", "inf", "--top_k", "0"], "--temperature inf: give 0"),
    (["--prompt-ids", "1", "--device", "cuda"], "--device cuda: CUDA is not available on this machine"),
    (["--prompt-ids", "1", "--device", "tpu9"], "--device 'tpu9' is not a device this program trains on"),
    (["--prompt-ids", "1", "--seed", "-1"], "--seed must be in [0, 2**32), got -1"),
    (["--prompt-ids", "1", "--seed", str(2**64)], f"--seed must be in [0, 2**32), got {2**64}"),
])
def test_every_bad_input_is_one_line_before_the_model_is_built(rotary_checkpoint, tmp_path, capsys, monkeypatch,
                                                                argv, named):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # --device cuda on a machine without one
    files = {"{huge}": _sparse_file(tmp_path / "huge.txt", 64 * 2**20 + 1),
             "{latin1}": tmp_path / "latin1.txt"}
    files["{latin1}"].write_bytes(b"th\xe9 cat\n")  # Latin-1, not UTF-8
    argv = [str(files.get(arg, arg)) for arg in argv]
    assert generate.main(["--load", str(rotary_checkpoint), *argv]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""  # refused before the model was built (it prints a line once built)
    assert len(captured.err.strip().splitlines()) == 1 and named in captured.err, captured.err


def test_a_tiny_temperature_samples_its_greedy_limit(rotary_checkpoint, capsys):
    """1e-45 divides the logits past float32's range; less their largest first, the draw is the argmax, not NaN."""
    load = ["--load", str(rotary_checkpoint), "--prompt", "the dog sat", "--num-tokens-to-generate", "8", "--ignore-eos"]
    greedy = generated_ids(capsys, *load)
    assert generated_ids(capsys, *load, "--temperature", "1e-45", "--top_k", "0") == greedy
    assert generated_ids(capsys, *load, "--temperature", "1e-45", "--top_k", "0", "--top_p", "0.5") == greedy


def test_what_the_machines_memory_cannot_hold_is_refused(rotary_checkpoint, capsys, monkeypatch):
    """A batch whose ids (int64) and KV cache alone pass the machine's memory (--max-tokens-to-oom raised past it), and
    a model whose weights do, are one line each before anything is allocated."""
    per_token = 8 + LLAMA["num_layers"] * 2 * LLAMA["num_query_groups"] * (32 // 4) * 4  # id; keys and values, fp32
    blocks = LLAMA["num_layers"] * (4 * 32 * 32 + 2 * LLAMA["ffn_hidden_size"] * 32)  # arguments/bounds.py's count
    vocab = inference_checkpoint(rotary_checkpoint).model.vocab_size  # the trained tokenizer's (it stops early)
    weights = 4 * (blocks + vocab * 32)  # and the word embedding's rows; fp32
    argv = ["--load", str(rotary_checkpoint), "--prompt-ids", "1", "2", "--num-tokens-to-generate", "20"]
    assert 22 * 8 < 5000 < 22 * per_token < weights
    monkeypatch.setattr(generate, "rank_memory_bytes", lambda: 5000)
    assert generate.main(argv) == 2
    assert f"22 tokens in a batch need at least {22 * per_token / 2**30:.3g} GiB for their ids and KV cache" in \
        capsys.readouterr().err
    assert generate.main([*argv, "--no-kv-cache"]) == 2  # the ids alone fit; the weights do not
    assert f"its model has at least {weights // 4:.3g} parameters, {weights / 2**30:.3g} GiB in fp32" in \
        capsys.readouterr().err
    monkeypatch.setattr(generate, "rank_memory_bytes", lambda: weights - 1)
    assert generate.main(argv) == 2 and "GiB in fp32" in capsys.readouterr().err
    monkeypatch.setattr(generate, "rank_memory_bytes", lambda: weights)
    assert generate.main(argv) == 0
