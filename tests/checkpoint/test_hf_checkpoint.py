"""Hugging Face folders: a training checkpoint converts to one that transformers loads with no code of
ours (same logits, same tokenizer), a GPT-2 folder initializes our model at TP=1 and TP=2, the round
trip HF -> ours -> checkpoint -> HF changes no bit, and bad folders are refused by name without
running anything in them.
"""

import dataclasses
import pickle
import random
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from arguments.config import PretrainConfig
from base.errors import ConfigError
from base.options import replace_settings
from checkpoint.format import iteration_dir_name
from checkpoint.hf.folders import (
    PICKLE_FILE,
    SAFETENSORS_FILE,
    check_hf_config,
    checkpoint_to_hf_state,
    hf_config,
    read_hf_folder,
    write_hf_folder,
)
from checkpoint.hf.source import initialize_from_hf, load_hf_weights
from checkpoint.ours.sharded import save_checkpoint
from data.tokenizer import train_tokenizer
from gpt.model import GPTModel
from parallel.random import TensorParallelRNG
from parallel.state import ParallelState, destroy, initialize
from scripts.tools import convert_to_hf
from tests.distributed import run_distributed
from tests.zero_harness import ZeroHarness

REPO = Path(__file__).resolve().parents[2]
CPU = ParallelState(device=torch.device("cpu"))
TINY = dict(num_layers=2, hidden_size=64, num_attention_heads=4, seq_length=32, max_position_embeddings=32,
            hidden_dropout=0.0, attention_dropout=0.0)
# Not a multiple of 128 (nor of 128 x 2), so the vocabulary is padded at TP=1 and TP=2.
HF_VOCAB = 300
WORDS = ("the model reads every token of the corpus and learns which one comes next while the optimizer "
         "keeps its moments in full precision across many ranks").split()


def pretrain_config(vocab_size: int, zero_stage: int = 0) -> PretrainConfig:
    config = PretrainConfig()
    return dataclasses.replace(config, model=replace_settings(config.model, **TINY, vocab_size=vocab_size),
                               zero=dataclasses.replace(config.zero, stage=zero_stage))


def random_tokens(vocab_size: int, rows: int = 2, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, vocab_size, (rows, TINY["seq_length"]), generator=torch.Generator().manual_seed(seed))


def random_hf_folder(path: Path, seed: int = 0) -> Path:
    """A GPT2LMHeadModel with every weight random (LayerNorms and biases too), saved by transformers."""
    from transformers import GPT2LMHeadModel

    config = pretrain_config(HF_VOCAB)
    torch.manual_seed(seed)
    hf = hf_config(config.model)
    hf.bos_token_id = hf.eos_token_id = None  # GPT2Config's default (50256) is outside this vocabulary
    model = GPT2LMHeadModel(hf)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in model.parameters():
            param.copy_(torch.randn(param.shape, generator=generator) * 0.1)
    model.save_pretrained(str(path))
    return path


def hf_logits(hf_dir: Path, tokens: torch.Tensor) -> torch.Tensor:
    from transformers import GPT2LMHeadModel

    model = GPT2LMHeadModel.from_pretrained(str(hf_dir)).eval()
    with torch.no_grad():
        return model(tokens).logits


@pytest.fixture(scope="module")
def tokenizer():
    rng = random.Random(0)
    texts = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 12))) for _ in range(300)]
    return train_tokenizer(texts, vocab_size=400)


@pytest.fixture(scope="module")
def trained(tmp_path_factory, tokenizer):
    """A tiny model after three optimizer steps on random tokens, and the --save directory it was
    saved to with its tokenizer."""
    config = pretrain_config(tokenizer.vocab_size, zero_stage=1)
    rng = TensorParallelRNG(1, CPU)
    model = GPTModel(config.model, CPU, rng=rng)
    optimizer = ZeroHarness.from_config(model, config, CPU, blocks=model.blocks)
    initial = model.blocks[0].attention.query_key_value.weight.detach().clone()
    tokens = torch.randint(0, tokenizer.vocab_size, (4, TINY["seq_length"] + 1),
                           generator=torch.Generator().manual_seed(1))
    for _ in range(3):
        optimizer.zero_grad()
        optimizer.backward(model(tokens[:, :-1], tokens[:, 1:]).mean())
        optimizer.step()
    assert not torch.equal(model.blocks[0].attention.query_key_value.weight, initial)
    save_dir = tmp_path_factory.mktemp("trained") / "checkpoints"
    save_checkpoint(save_dir, 3, 12, model, optimizer, rng, config, CPU, tokenizer=tokenizer)
    return model.eval(), save_dir


@pytest.fixture(scope="module")
def converted(trained, tmp_path_factory):
    """The trained checkpoint converted in-process, from its --save directory."""
    out = tmp_path_factory.mktemp("converted") / "hf"
    assert convert_to_hf.main([str(trained[1]), str(out)]) == 0
    return out


def test_converted_checkpoint_loads_in_transformers_with_our_logits(trained, converted, tokenizer):
    model, _ = trained
    assert sorted(p.name for p in converted.iterdir()) == sorted(
        ["config.json", "generation_config.json", SAFETENSORS_FILE, "tokenizer.json", "vocab.json", "merges.txt",
         "tokenizer_config.json"])
    assert not list(converted.parent.glob(".*")), "a staging folder was left behind"
    tokens = random_tokens(tokenizer.vocab_size)
    with torch.no_grad():
        ours = model(tokens)
    theirs = hf_logits(converted, tokens)
    assert ours.shape == theirs.shape == (2, TINY["seq_length"], tokenizer.vocab_size)
    assert torch.allclose(ours, theirs, atol=1e-4, rtol=0)


def test_converted_tokenizer_encodes_like_ours(converted, tokenizer):
    from transformers import AutoTokenizer

    theirs = AutoTokenizer.from_pretrained(str(converted))
    sentence = "the optimizer reads every token, then learns which one comes next<|endoftext|>"
    assert theirs.encode(sentence) == tokenizer.encode(sentence)
    assert theirs.decode(tokenizer.encode(sentence)) == sentence
    hf, _ = read_hf_folder(converted)
    assert hf["eos_token_id"] == hf["bos_token_id"] == tokenizer.eod_id



@pytest.mark.parametrize("shape", ["llama3", "gemma"])
def test_the_export_writes_the_saved_tokenizers_own_end_of_document_id(tmp_path, shape):
    """config.json's eos_token_id is the id training ended documents with (Llama 3's <|end_of_text|>, Gemma's <eos>):
    the saved tokenizer's eos_token, as data/tokenizer.py reads it, not the literal <|endoftext|>."""
    from tokenizers import Tokenizer

    from checkpoint.hf.folders import _eod_id
    from tests.data.hf_tokenizer_shapes import SHAPES, build_tokenizer_folder

    folder = build_tokenizer_folder(tmp_path / "tokenizer", shape)
    expected = Tokenizer.from_file(str(folder / "tokenizer.json")).token_to_id(SHAPES[shape].eos)
    assert expected is not None and _eod_id(folder) == expected

def test_cli_converts_one_iteration_directory_to_bf16(trained, tmp_path):
    iteration_dir = trained[1] / iteration_dir_name(3)
    out = tmp_path / "hf-bf16"
    result = subprocess.run([sys.executable, "scripts/tools/convert_to_hf.py", str(iteration_dir), str(out),
                             "--dtype", "bf16"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "reading" in result.stdout and "done" in result.stdout
    _, expected = checkpoint_to_hf_state(iteration_dir)
    hf, written = read_hf_folder(out)
    assert hf["dtype" if "dtype" in hf else "torch_dtype"] == "bfloat16"
    assert written.keys() == expected.keys() - {"lm_head.weight"}
    for name, tensor in written.items():
        assert tensor.dtype == torch.bfloat16 and torch.equal(tensor, expected[name].to(torch.bfloat16)), name


def test_cli_errors_are_one_line_with_exit_code_2(trained, tmp_path, capsys):
    assert convert_to_hf.main([str(tmp_path / "nothing"), str(tmp_path / "out")]) == 2
    error = capsys.readouterr().err
    assert error.startswith("convert_to_hf.py: error: ") and "no checkpoint here" in error
    assert error.count("\n") == 1 and not (tmp_path / "out").exists()

    occupied = tmp_path / "occupied"
    occupied.mkdir()
    (occupied / "keep.txt").write_text("mine")
    assert convert_to_hf.main([str(trained[1]), str(occupied)]) == 2
    assert "--overwrite" in capsys.readouterr().err and (occupied / "keep.txt").read_text() == "mine"
    # --overwrite replaces an earlier export, never a user's other files (issue 27).
    assert convert_to_hf.main([str(trained[1]), str(occupied), "--overwrite"]) == 2
    assert "keep.txt" in capsys.readouterr().err and (occupied / "keep.txt").read_text() == "mine"

    assert convert_to_hf.main([str(trained[1]), str(trained[1]), "--overwrite"]) == 2
    assert "holds the checkpoint" in capsys.readouterr().err and (trained[1] / "latest").is_file()


def test_failed_write_leaves_no_folder_and_keeps_the_old_one(tmp_path):
    _, hf_state = read_hf_folder(random_hf_folder(tmp_path / "source"))
    model_config = pretrain_config(HF_VOCAB).model
    not_a_tokenizer = tmp_path / "empty"
    not_a_tokenizer.mkdir()
    with pytest.raises(ConfigError, match="tokenizer.json: missing"):
        write_hf_folder(tmp_path / "out", hf_state, model_config, not_a_tokenizer)
    assert not (tmp_path / "out").exists() and not list(tmp_path.glob(".out*"))

    write_hf_folder(tmp_path / "out", hf_state, model_config)
    with pytest.raises(ConfigError):
        write_hf_folder(tmp_path / "out", hf_state, model_config, not_a_tokenizer, overwrite=True)
    _, kept = read_hf_folder(tmp_path / "out")
    assert kept.keys() == hf_state.keys() and not list(tmp_path.glob(".out*"))


def test_round_trip_hf_to_ours_to_hf_is_lossless(tmp_path):
    source = random_hf_folder(tmp_path / "source")
    config = pretrain_config(HF_VOCAB)
    model = GPTModel(config.model, CPU)
    optimizer = ZeroHarness.from_config(model, config, CPU, blocks=model.blocks)
    initialize_from_hf(optimizer, model, source, config.model, CPU)
    save_checkpoint(tmp_path / "ckpt", 0, 0, model, optimizer, None, config, CPU)
    assert convert_to_hf.main([str(tmp_path / "ckpt"), str(tmp_path / "back")]) == 0

    _, before = read_hf_folder(source)
    _, after = read_hf_folder(tmp_path / "back")
    assert before.keys() == after.keys()
    for name in before:
        assert torch.equal(before[name], after[name]), name


def logits_at_tensor_parallel(rank, world_size, hf_dir, tokens):
    # Tensors cross the process boundary as lists: torch would share their storage with the parent
    # through a handle that dies with the child.
    state = initialize("cpu", world_size)
    try:
        config = pretrain_config(HF_VOCAB)
        model = GPTModel(config.model, state).eval()
        initialize_from_hf(ZeroHarness.from_config(model, config, state, blocks=model.blocks), model, hf_dir,
                           config.model, state)
        with torch.no_grad():
            return model(torch.tensor(tokens)).tolist()
    finally:
        destroy(state)


@pytest.mark.slow
def test_initialize_from_hf_at_tensor_parallel_2(tmp_path):
    source = random_hf_folder(tmp_path / "source", seed=3)
    tokens = random_tokens(HF_VOCAB, seed=4)
    expected = hf_logits(source, tokens)
    for logits in run_distributed(logits_at_tensor_parallel, 2, str(source), tokens.tolist(), timeout=240):
        assert torch.allclose(torch.tensor(logits), expected, atol=1e-4, rtol=0)


def test_mismatched_config_lists_every_flag_to_pass(tmp_path):
    source = random_hf_folder(tmp_path / "source")
    other = replace_settings(pretrain_config(HF_VOCAB).model, num_layers=3, hidden_size=128, num_attention_heads=8,
                                vocab_size=500, max_position_embeddings=64, seq_length=64, activation="gelu",
                                layernorm_epsilon=1e-6)
    with pytest.raises(ConfigError) as caught:
        load_hf_weights(source, other, CPU)
    message = str(caught.value)
    assert str(source / "config.json") in message and "\n" not in message
    for expected in ["--num-layers 2 (config.json n_layer", "--hidden-size 64 (config.json n_embd",
                     "--num-attention-heads 4 (config.json n_head", "--ffn-hidden-size 256 (config.json n_inner",
                     "--max-position-embeddings 32 (config.json n_positions",
                     "--seq-length at most 32 (config.json n_positions", "--activation gelu_tanh",
                     "--layernorm-epsilon 1e-05", "--tokenizer-file", "vocab_size is 300"]:
        assert expected in message, expected

    # A shorter --seq-length than the folder's n_positions is fine; a longer one is not.
    ours = pretrain_config(HF_VOCAB).model
    hf = hf_config(ours).to_dict()
    check_hf_config(hf, dataclasses.replace(ours, seq_length=16))


class WritesAMarkerWhenUnpickled:
    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return open, (str(self.marker), "w")


@pytest.mark.parametrize("writer", ["torch.save", "pickle.dump"])
def test_pickle_with_a_payload_is_refused_and_never_run(tmp_path, writer):
    marker = tmp_path / "payload-ran"
    payload = {"transformer.wte.weight": WritesAMarkerWhenUnpickled(marker)}
    proof = tmp_path / "proof"
    pickle.loads(pickle.dumps(WritesAMarkerWhenUnpickled(proof)))  # an ordinary unpickler runs it
    assert proof.exists()

    folder = tmp_path / "hf"
    folder.mkdir()
    hf_config(pretrain_config(HF_VOCAB).model).to_json_file(str(folder / "config.json"))
    if writer == "torch.save":
        torch.save(payload, folder / PICKLE_FILE)
    else:
        with open(folder / PICKLE_FILE, "wb") as f:
            pickle.dump(payload, f, protocol=2)  # what torch.save writes; protocol 4 only adds a warning
    with pytest.raises(ConfigError, match="pytorch_model.bin: refused"):
        read_hf_folder(folder)
    assert not marker.exists()


def test_a_refused_protocol_4_pickle_is_one_line_with_its_reason(tmp_path, recwarn):
    """Issue 33 #16: a protocol-4 pickle printed torch's two-line warning, then a reason "()" (the
    unpickler put its reason on the lines after "WeightsUnpickler error:")."""
    marker = tmp_path / "payload-ran"
    folder = tmp_path / "hf"
    folder.mkdir()
    hf_config(pretrain_config(HF_VOCAB).model).to_json_file(str(folder / "config.json"))
    with open(folder / PICKLE_FILE, "wb") as f:
        pickle.dump({"transformer.wte.weight": WritesAMarkerWhenUnpickled(marker)}, f, protocol=4)
    with pytest.raises(ConfigError) as error:
        read_hf_folder(folder)
    message = str(error.value)
    assert "()" not in message and "\n" not in message and "refused" in message, message
    assert message.split("(", 1)[1].split(")")[0].strip(), message  # a reason, not an empty one
    assert not [w for w in recwarn if "pickle protocol" in str(w.message)]
    assert not marker.exists()


def test_weights_only_pickle_is_read(tmp_path):
    source = random_hf_folder(tmp_path / "source")
    _, tensors = read_hf_folder(source)
    (source / SAFETENSORS_FILE).unlink()
    torch.save(tensors, source / PICKLE_FILE)
    _, from_pickle = read_hf_folder(source)
    assert from_pickle.keys() == tensors.keys()
    assert all(torch.equal(from_pickle[name], tensors[name]) for name in tensors)


@pytest.mark.parametrize("damage", ["no folder", "no config", "corrupt safetensors", "no weights"])
def test_unreadable_folder_errors_name_the_file(tmp_path, damage):
    source = random_hf_folder(tmp_path / "source")
    named = {"no folder": tmp_path / "elsewhere", "no config": source / "config.json",
             "corrupt safetensors": source / SAFETENSORS_FILE, "no weights": source}[damage]
    if damage == "no config":
        named.unlink()
    elif damage == "corrupt safetensors":
        named.write_bytes(named.read_bytes()[:100])
    elif damage == "no weights":
        (source / SAFETENSORS_FILE).unlink()
    with pytest.raises(ConfigError) as caught:
        read_hf_folder(tmp_path / "elsewhere" if damage == "no folder" else source)
    assert str(named) in str(caught.value)


def test_gpt2model_files_without_the_transformer_prefix_are_read(tmp_path):
    """openai-community/gpt2's own files are a GPT2Model's: `h.0.attn...`, not `transformer.h.0...`."""
    from safetensors.torch import save_file

    source = random_hf_folder(tmp_path / "source")
    _, tensors = read_hf_folder(source)
    save_file({name.removeprefix("transformer."): tensor for name, tensor in tensors.items()},
              str(source / SAFETENSORS_FILE), metadata={"format": "pt"})
    _, unprefixed = read_hf_folder(source)
    assert unprefixed.keys() == tensors.keys()
    assert all(torch.equal(unprefixed[name], tensors[name]) for name in tensors)


def test_a_hf_folder_trains_on_the_embedded_corpus_with_its_own_tokenizer(converted, tmp_path):
    """Before: without --data-path, --tokenizer-file was ignored (a tokenizer was trained on the
    corpus), and the vocabulary-mismatch error then recommended passing that same flag."""
    import pretrain_gpt

    flags = [f"--{name.replace('_', '-')}={value}" for name, value in TINY.items()]
    metrics = tmp_path / "m.jsonl"
    # GPT-2's tanh GeLU: a flag launch without a preset takes Megatron's exact GeLU, which the folder's
    # config.json (gelu_new) would refuse
    code = pretrain_gpt.main(flags + ["--activation", "gelu_tanh", "--init-from-hf", str(converted), "--tokenizer-file",
                                      str(converted / "tokenizer.json"), "--train-iters", "1", "--eval-iters", "0",
                                      "--micro-batch-size", "2", "--global-batch-size", "2", "--device", "cpu",
                                      "--data-cache-dir", str(tmp_path / "cache"), "--metrics-file", str(metrics)])
    assert code == 0 and metrics.read_text().count("\n") == 1


def test_overwrite_replaces_only_an_earlier_export_and_names_foreign_files(trained, tmp_path, capsys):
    """Issue 27: `--overwrite` was `rm -rf OUT_DIR`: a thesis.tex and sub/deep/data.csv beside an
    earlier export were deleted without being named."""
    out = tmp_path / "hf"
    assert convert_to_hf.main([str(trained[1]), str(out)]) == 0
    exported = sorted(path.name for path in out.iterdir())
    (out / "thesis.tex").write_text("years of work")
    (out / "sub" / "deep").mkdir(parents=True)
    (out / "sub" / "deep" / "data.csv").write_text("1,2,3")
    before = {path: path.stat().st_mtime_ns for path in out.rglob("*")}

    assert convert_to_hf.main([str(trained[1]), str(out), "--overwrite"]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and "sub/" in error and "thesis.tex" in error, error
    assert {path: path.stat().st_mtime_ns for path in out.rglob("*")} == before  # nothing touched

    (out / "thesis.tex").unlink()
    shutil.rmtree(out / "sub")
    (out / SAFETENSORS_FILE).write_bytes(b"an earlier export's weights")
    assert convert_to_hf.main([str(trained[1]), str(out), "--overwrite"]) == 0
    assert sorted(path.name for path in out.iterdir()) == exported
    _, written = read_hf_folder(out)
    assert written, "the earlier export was replaced by the new one"
    assert not list(tmp_path.glob(".hf*")), "a staging or retired folder was left behind"


def test_overwrite_never_deletes_a_sibling_that_looks_like_a_retired_copy(trained, tmp_path):
    (tmp_path / "hf.old-1").mkdir()  # a user's own folder, named like the checkpoint code's retired copies
    (tmp_path / "hf.old-1" / "notes.txt").write_text("mine")
    out = tmp_path / "hf"
    assert convert_to_hf.main([str(trained[1]), str(out)]) == 0
    assert convert_to_hf.main([str(trained[1]), str(out), "--overwrite"]) == 0
    assert (tmp_path / "hf.old-1" / "notes.txt").read_text() == "mine"


def test_a_link_to_nothing_as_out_dir_is_refused_before_reading_the_checkpoint(trained, tmp_path, monkeypatch,
                                                                               capsys):
    """Issue 110's probe: OUT_DIR a symbolic link to a missing path passed the checks (it does not exist), and the
    export ended, after reading and writing everything, in "[Errno 20] Not a directory" renaming onto the link."""
    read = []
    monkeypatch.setattr("checkpoint.convert_to_hf.checkpoint_to_hf_state",
                        lambda *args, **kwargs: read.append(1) or checkpoint_to_hf_state(*args, **kwargs))
    (tmp_path / "hf").symlink_to(tmp_path / "gone")
    assert convert_to_hf.main([str(trained[1]), str(tmp_path / "hf")]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and f"OUT_DIR {tmp_path / 'hf'} is a symbolic link to nothing (to " \
        f"{tmp_path / 'gone'})" in error and not read
    assert sorted(path.name for path in tmp_path.iterdir()) == ["hf"]  # nothing staged beside it


def test_dot_as_out_dir_is_checked_before_reading_the_checkpoint(trained, tmp_path, monkeypatch, capsys):
    """Issue 27: `.` as OUT_DIR crashed after reading the whole checkpoint ("PosixPath('.') has an
    empty name"). Occupied, it is refused up front; empty, the export lands in it."""
    work = tmp_path / "work"
    work.mkdir()
    (work / "notes.md").write_text("mine")
    monkeypatch.chdir(work)
    read = []
    monkeypatch.setattr("checkpoint.convert_to_hf.checkpoint_to_hf_state",
                        lambda *args, **kwargs: read.append(1) or checkpoint_to_hf_state(*args, **kwargs))
    assert convert_to_hf.main([str(trained[1]), ".", "--overwrite"]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and "notes.md" in error and "Traceback" not in error and not read

    empty = tmp_path / "empty"
    empty.mkdir()
    monkeypatch.chdir(empty)
    assert convert_to_hf.main([str(trained[1]), "."]) == 0
    assert (empty / SAFETENSORS_FILE).is_file() and (empty / "config.json").is_file()
