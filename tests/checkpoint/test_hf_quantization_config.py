"""A quantization_config in any family's config.json is checked and said (issue 79 item 5).

Before: GPT-OSS's and DeepSeek-V3's readers named theirs in a start-up line, but a Llama or GPT-2 folder quantized by
GPTQ, AWQ or bitsandbytes trained with no word about it, and a quantization_config that is not an object was a
56-line traceback once transformers read it, after the data was prepared.
"""

from __future__ import annotations

import json

import pretrain_gpt
from arguments.parser import parse_arguments
from tests.checkpoint.test_hf_folder_is_the_model import RUN, llama_folder
from tests.reliability_helpers import run_main, snapshot


def _with_quantization(folder, block):
    written = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**written, "quantization_config": block}))


def test_a_llama_folders_quantization_config_is_named_in_one_start_up_line(tmp_path):
    folder = llama_folder(tmp_path / "hf")
    _with_quantization(folder, {"quant_method": "gptq", "bits": 4})
    said = [note for note in parse_arguments(["--init-from-hf", str(folder)]).notes if "quantization_config" in note]
    assert said == [f"> {folder / 'config.json'}: quantization_config quant_method 'gptq' is how the release stores its "
                    f"weights; the run is the unquantized LlamaForCausalLM transformers trains after dequantizing "
                    f"them (it then drops the block), and --init-from-hf reads bf16/fp16/fp32 weights only"]


def test_a_quantization_config_that_is_not_an_object_is_one_line_before_any_work(tmp_path, corpus_cache):
    folder = llama_folder(tmp_path / "hf")
    _with_quantization(folder, "int4")
    work = tmp_path / "run"
    outcome = run_main(pretrain_gpt.main, ["--init-from-hf", folder, *RUN, "--data-cache-dir", corpus_cache,
                                           "--metrics-file", work / "m.jsonl", "--save", work / "ck"])
    outcome.one_error_line("quantization_config is \"int4\" (a string); it must be a JSON object or null")
    assert snapshot(work) == {} and not work.exists()
