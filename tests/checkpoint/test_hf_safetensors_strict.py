"""A Hugging Face folder's safetensors files are checked as the safetensors library checks them before any byte is read
by offset (issue 90 item 1; checkpoint/hf/source.py safetensors_header through checkpoint/integrity.py read_header).

Before, the reads by offset trusted `data_offsets`: a header whose offsets pointed at another tensor's bytes, or before
the data section, trained on the wrong bytes with exit 0 (a first loss of 4.19e30 for negative offsets). The safetensors
library refuses each of these (its rule: the offsets tile the data section from 0, in order, with nothing left over).
The folders here are transformers' own `save_pretrained` output, one file and sharded with an index; each damage is
made by the test on a copy, and each is refused in one line naming the file (and the tensor where one is at fault)."""

from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path

import pytest

from base.errors import ConfigError
from checkpoint.hf.source import safetensors_files, safetensors_header
from tests.checkpoint.test_hf_shard_reads import llama_folder


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> Path:
    return llama_folder(tmp_path_factory.mktemp("llama") / "folder")


@pytest.fixture(scope="module")
def sharded(tmp_path_factory) -> Path:
    """The same kind of model saved in several files with an index (transformers' max_shard_size)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from tests.checkpoint.hf_random import fill_random

    model = LlamaForCausalLM(LlamaConfig(vocab_size=320, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32))
    fill_random(model, seed=4, scale=0.1)
    path = tmp_path_factory.mktemp("sharded") / "folder"
    model.save_pretrained(str(path), max_shard_size="100KB")
    assert (path / "model.safetensors.index.json").is_file()
    return path


def _split(path: Path) -> tuple[dict, bytes]:
    raw = path.read_bytes()
    (length,) = struct.unpack("<Q", raw[:8])
    return json.loads(raw[8:8 + length]), raw[8 + length:]


def _rewritten(source: Path, target: Path, change) -> Path:
    """`source` with its header passed through `change` (data bytes as they were), written to `target`."""
    header, data = _split(source)
    header = change(header)
    encoded = json.dumps(header).encode()
    target.write_bytes(struct.pack("<Q", len(encoded)) + encoded + data)
    return target


def _two_of_a_size(header: dict) -> tuple[str, str]:
    by_size: dict = {}
    for name, entry in header.items():
        if name != "__metadata__":
            begin, end = entry["data_offsets"]
            by_size.setdefault((entry["dtype"], end - begin), []).append(name)
    return next(names[:2] for names in by_size.values() if len(names) >= 2)


def test_transformers_own_files_pass(saved, sharded):
    tensors, _ = safetensors_header(saved / "model.safetensors")
    assert "model.embed_tokens.weight" in tensors
    files = safetensors_files(sharded)
    assert len(files) > 1 and all(safetensors_header(path)[0] for path in files)


def _swap_offsets(header):
    first, second = _two_of_a_size(header)
    header[first]["data_offsets"], header[second]["data_offsets"] = \
        header[second]["data_offsets"], header[first]["data_offsets"]
    return header


def _point_at_another(header):  # both read the same bytes; the other tensor's range left over
    first, second = _two_of_a_size(header)
    header[first]["data_offsets"] = list(header[second]["data_offsets"])
    return header


def _before_the_data(header):
    first, _ = _two_of_a_size(header)
    begin, end = header[first]["data_offsets"]
    header[first]["data_offsets"] = [-(end - begin), 0]
    return header


def _past_the_end(header):
    first, _ = _two_of_a_size(header)
    begin, end = header[first]["data_offsets"]
    header[first]["data_offsets"] = [begin + 4, end + 4]
    return header


@pytest.mark.parametrize("damage, says", [
    (_point_at_another, "overlap or leave gaps"), (_before_the_data, "does not fit its byte range"),
    (_past_the_end, "overlap or leave gaps"), (lambda header: [header], "not a JSON object"),
    (lambda header: None, "not a JSON object"),
    (lambda header: {**header, "x": {"dtype": "F32", "shape": [2], "data_offsets": "0,8"}}, "corrupt header entry 'x'"),
    (lambda header: {**header, "x": {"dtype": "Q4", "shape": [2], "data_offsets": [0, 8]}}, "corrupt header entry 'x'"),
])
def test_a_damaged_header_is_refused_in_one_line(saved, tmp_path, damage, says):
    damaged = _rewritten(saved / "model.safetensors", tmp_path / "model.safetensors", damage)
    with pytest.raises(ConfigError, match=says) as refused:
        safetensors_header(damaged)
    assert str(damaged) in str(refused.value) and "\n" not in str(refused.value)


def test_swapped_offsets_that_still_tile_are_the_one_damage_no_header_check_sees(saved, tmp_path):
    """Two tensors of one dtype and size trading ranges tile the data section exactly, as safetensors' own check
    allows: no reader of the header can tell (the bytes are well formed). Read, they give each other's values."""
    damaged = _rewritten(saved / "model.safetensors", tmp_path / "model.safetensors", _swap_offsets)
    assert safetensors_header(damaged)[0]


@pytest.mark.parametrize("length", [10 ** 12, 2 ** 63, 2 ** 64 - 1])
def test_a_header_length_past_the_file_or_the_cap_is_refused(saved, tmp_path, length):
    raw = (saved / "model.safetensors").read_bytes()
    damaged = tmp_path / "model.safetensors"
    damaged.write_bytes(struct.pack("<Q", length) + raw[8:])
    with pytest.raises(ConfigError, match=f"its header claims {length} bytes"):
        safetensors_header(damaged)


def test_the_index_maps_names_to_files_in_the_folder(sharded, tmp_path):
    index = json.loads((sharded / "model.safetensors.index.json").read_text())
    for name, value, says in (("number", 5, "maps 'model.norm.weight' to 5, which is not a file name"),
                              ("elsewhere", "../model.safetensors", "which is not a file name in the folder"),
                              ("missing", "model-00009-of-00009.safetensors", "which is not in the folder")):
        folder = tmp_path / name
        shutil.copytree(sharded, folder)
        changed = {**index, "weight_map": {**index["weight_map"], "model.norm.weight": value}}
        (folder / "model.safetensors.index.json").write_text(json.dumps(changed))
        with pytest.raises(ConfigError, match=says):
            safetensors_files(folder)


def test_a_run_from_a_damaged_folder_stops_in_one_line(saved, tmp_path, capsys):
    """The launch itself: --init-from-hf of a folder whose file points one tensor at another's bytes, exit 2 and one
    line, before any training."""
    import pretrain_gpt

    folder = tmp_path / "folder"
    shutil.copytree(saved, folder)
    _rewritten(saved / "model.safetensors", folder / "model.safetensors", _point_at_another)
    code = pretrain_gpt.main(["--init-from-hf", str(folder), "--device", "cpu", "--train-iters", "1",
                              "--eval-iters", "0", "--micro-batch-size", "1", "--global-batch-size", "1",
                              "--tokenizer-type", "NullTokenizer", "--mock-data", "--seq-length", "16",
                              "--metrics-file", str(tmp_path / "metrics.jsonl")])
    err = capsys.readouterr().err
    assert code == 2 and "overlap or leave gaps" in err and "Traceback" not in err, err[-2000:]


def _launch(folder: Path, capsys) -> tuple[int, str]:
    import pretrain_gpt

    code = pretrain_gpt.main(["--init-from-hf", str(folder), "--device", "cpu", "--train-iters", "1",
                              "--eval-iters", "0", "--micro-batch-size", "1", "--global-batch-size", "1",
                              "--tokenizer-type", "NullTokenizer", "--mock-data", "--seq-length", "16",
                              "--metrics-file", str(folder.parent / "metrics.jsonl")])
    return code, capsys.readouterr().err


def test_a_config_dtype_that_is_no_torch_dtype_is_one_line(saved, tmp_path, capsys):
    """transformers reads config.json's dtype with getattr(torch, value): "float8" was an AttributeError traceback."""
    folder = tmp_path / "folder"
    shutil.copytree(saved, folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "dtype": "float8"}))
    code, err = _launch(folder, capsys)
    assert code == 2 and "its dtype 'float8' is not a torch dtype" in err and "Traceback" not in err, err[-2000:]


def test_an_fp8_weight_in_a_folder_that_declares_no_quantization_is_one_line(saved, tmp_path, capsys):
    """One projection stored as F8_E4M3 (safetensors' own writer) in a folder with no quantization_config: its values
    cannot be scaled; before, the fused q/k/v of FP8 and fp32 pieces was a dtype-promotion traceback."""
    import torch
    from safetensors.torch import load_file, save_file

    folder = tmp_path / "folder"
    shutil.copytree(saved, folder)
    tensors = load_file(folder / "model.safetensors")
    name = "model.layers.0.self_attn.q_proj.weight"
    tensors[name] = tensors[name].to(torch.float8_e4m3fn)
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    code, err = _launch(folder, capsys)
    assert code == 2 and f"{name} is stored in FP8 (1 tensor)" in err and "Traceback" not in err, err[-2000:]
