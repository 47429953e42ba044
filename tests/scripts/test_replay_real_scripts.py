"""Acceptance: real clients' launch scripts and DeepSpeed JSON, replayed with their full flag lists.

The flag lists below are copied from the scripts, value for value:

- NVIDIA/Megatron-LM `examples/gpt3/train_gpt3_175b_distributed.sh` (commit 157006d6): the arrays
  GPT_MODEL_ARGS, TRAINING_ARGS, MODEL_PARALLEL_ARGS, DATA_ARGS and EVAL_AND_LOGGING_ARGS that it passes
  to pretrain_gpt.py (DISTRIBUTED_ARGS go to torchrun).
- microsoft/DeepSpeedExamples `Megatron-LM/scripts/ds_pretrain_gpt2.sh` (commit 69785c7c): `gpt_options`,
  with the JSON it names, `Megatron-LM/scripts/ds_config.json` (commit 07d1ce0d), verbatim.
- microsoft/DeepSpeedExamples `Megatron-LM/scripts/ds_zero2_config.json` (commit 26b89cc6), verbatim:
  the typical ZeRO-2 JSON.

Substituted, and only these: sizes, so a CPU trains them in seconds (layers, hidden, heads, sequence,
batch sizes and ramp, iterations, intervals; tensor and pipeline sizes 8 and 16 become 1 on one
process), and paths (data, tokenizer files, checkpoint and TensorBoard directories; DeepSpeed-Megatron's
corpus name `webtext`, and the GPT-2 files its GPT2BPETokenizer downloaded, become local files). Every
flag of each script is still given. Each run trains, and its `--print-config` shows every flag and
JSON key honoured -- as the setting it maps to, with the script's value, or as accepted with no
effect on the math -- and none refused.
"""

import json
import math
import os

import pytest

import pretrain_gpt
from arguments.parser import build_parser
from tests.distributed import run_distributed

MEGATRON_175B = [
    # GPT_MODEL_ARGS
    "--num-layers", "96", "--hidden-size", "12288", "--num-attention-heads", "96", "--seq-length", "2048",
    "--max-position-embeddings", "2048", "--attention-backend", "auto",
    # TRAINING_ARGS
    "--micro-batch-size", "1", "--global-batch-size", "1536", "--rampup-batch-size", "16", "16", "5859375",
    "--train-iters", "500000", "--weight-decay", "0.1", "--adam-beta1", "0.9", "--adam-beta2", "0.95",
    "--init-method-std", "0.006", "--clip-grad", "1.0", "--fp16", "--lr", "6.0e-5", "--lr-decay-style", "cosine",
    "--min-lr", "6.0e-6", "--lr-warmup-fraction", ".001", "--lr-decay-iters", "430000",
    # MODEL_PARALLEL_ARGS
    "--tensor-model-parallel-size", "8", "--pipeline-model-parallel-size", "16",
    # DATA_ARGS
    "--data-path", "$DATA_PATH", "--vocab-file", "$VOCAB_FILE", "--merge-file", "$MERGE_FILE", "--split", "949,50,1",
    # EVAL_AND_LOGGING_ARGS
    "--log-interval", "100", "--save-interval", "10000", "--eval-interval", "1000", "--save", "$CHECKPOINT_PATH",
    "--load", "$CHECKPOINT_PATH", "--eval-iters", "10", "--tensorboard-dir", "$TENSORBOARD_LOGS_PATH",
]

DS_PRETRAIN_GPT2 = [
    "--num-layers", "24", "--hidden-size", "1024", "--num-attention-heads", "16", "--batch-size", "8",
    "--seq-length", "1024", "--max-position-embeddings", "1024", "--train-iters", "320000",
    "--save", "checkpoints/gpt2_345m", "--load", "checkpoints/gpt2_345m", "--resume-dataloader",
    "--train-data", "webtext", "--lazy-loader", "--tokenizer-type", "GPT2BPETokenizer", "--cache-dir", "cache",
    "--split", "949,50,1", "--distributed-backend", "nccl", "--lr", "0.00015", "--lr-decay-style", "cosine",
    "--weight-decay", "1e-2", "--clip-grad", "1.0", "--warmup", ".01", "--checkpoint-activations", "--fp16",
    "--local_rank", "0", "--deepspeed", "--deepspeed_config", "${config_json}",
]
DS_CONFIG_JSON = """{
  "train_batch_size": 16,
  "gradient_accumulation_steps": 1,
  "steps_per_print": 1,
  "zero_optimization": true,
  "optimizer": {
    "type": "Adam",
    "params": {
      "lr": 0.00015,
      "max_grad_norm": 1.0
    }
  },

  "fp16": {
    "enabled": true,
    "loss_scale": 0,
    "loss_scale_window": 1000,
    "hysteresis": 2,
    "min_loss_scale": 1
  } 
}
"""
DS_ZERO2_CONFIG_JSON = """{
  "train_batch_size":16,
  "gradient_accumulation_steps": 1,
  "steps_per_print": 1,
  "zero_optimization": {
    "stage":2
  },
  "optimizer": {
    "type": "Adam",
    "params": {
      "lr": 0.00015
    }
  },
  "gradient_clipping": 1.0,
  "fp16": {
    "enabled": true,
    "loss_scale": 0,
    "loss_scale_window": 1000,
    "hysteresis": 2,
    "min_loss_scale": 1
  },
  "activation_checkpointing": {
    "partition_activations":true,
    "contiguous_memory_optimization":false
  },
  "wall_clock_breakdown": false
}
"""
TINY_MODEL = {"--num-layers": ["2"], "--hidden-size": ["32"], "--num-attention-heads": ["2"], "--seq-length": ["16"],
              "--max-position-embeddings": ["16"]}


def split_flags(argv):
    """[(flag, its values)] of a flag list as the scripts write it (one value for --data-path)."""
    options, pairs, i = build_parser()._option_string_actions, [], 0
    while i < len(argv):
        nargs = options[argv[i]].nargs
        count = 0 if nargs == 0 else nargs if isinstance(nargs, int) else 1
        pairs.append((argv[i], argv[i + 1:i + 1 + count]))
        i += 1 + count
    return pairs


def substitute(argv, values):
    """`argv` with the values of the flags in `values` replaced; every flag stays, in its place."""
    result = []
    for flag, given in split_flags(argv):
        result += [flag, *values.get(flag, given)]
    assert [token for token in result if token.startswith("--")] == [t for t in argv if t.startswith("--")]
    return result


def flags(argv):
    return [token for token in argv if token.startswith("--")]


@pytest.fixture(scope="module")
def corpus(embedded_corpus):
    """Data written by our writer in Megatron's .bin/.idx format, and GPT-2-style vocab/merges files."""
    return embedded_corpus[1]


def print_config(argv, capsys):
    assert pretrain_gpt.main(argv + ["--print-config"]) == 0
    return capsys.readouterr().out


def assert_every_flag_honoured(argv, shown):
    """Each flag of `argv` appears in the --print-config text: as the source of a setting whose value is
    the flag's own (numbers compared as numbers), or among the flags that are not settings here, or, where the
    real pair does not read it, named as not used (the 2020 fork's --clip-grad under --deepspeed:
    tests/arguments/test_deepspeed_clipping_generations.py)."""
    options = build_parser()._option_string_actions
    rows = [config_row(line) for line in shown.splitlines() if line.startswith("  ")]
    for flag, given in split_flags(argv):
        action = options[flag]
        mentioning = [row for row in rows if flag in row["name"].split() or flag in row["where"].split()]
        assert mentioning, f"{flag} is not shown"
        assert not any("refused" in row["where"] for row in mentioning), flag
        setting = next((row for row in mentioning if row["name"] == action.dest), None)
        if setting is None:  # a flag that is not a setting here: shown with what it does
            assert any(row["name"].split()[0] == flag for row in mentioning) or action.dest == "zero_config", flag
        elif f"{' '.join([flag, *given])} on the command line not used" in setting["where"]:
            continue
        elif not given:
            assert setting["value"] == "True", flag
        elif len(given) == 1 and _is_number(given[0]):
            assert math.isclose(float(setting["value"]), float(given[0])), (flag, setting, given)
        else:
            assert setting["value"] == " ".join(given), (flag, setting, given)


def config_row(line):
    """{'name', 'value', 'where'} of one --print-config row (`  name   value   # where`)."""
    left, where = line.split("  # ", 1)
    name, _, value = left.strip().partition(" ")
    if name.startswith("--"):  # a flag that is not a setting: its name is the flag and its value
        return {"name": left.strip(), "value": "", "where": where}
    return {"name": name, "value": value.strip(), "where": where}


def _is_number(text):
    try:
        float(text)
        return True
    except ValueError:
        return False


def assert_every_json_key_listed(json_text, shown):
    def keys(block, prefix=""):
        for key, value in block.items():
            if isinstance(value, dict) and key in ("zero_optimization", "fp16", "activation_checkpointing"):
                yield from keys(value, f"{key}.")
            else:
                yield prefix + key, isinstance(value, dict)
    rows = [config_row(line) for line in shown.splitlines() if line.startswith("  ")]
    for key, is_section in keys(json.loads(json_text)):
        # a section's rows are its keys' ("optimizer.type"); a setting of the same name (--optimizer's "optimizer",
        # since AdEMAMix made it one) is not a row of the JSON
        matches = [row for row in rows if (row["name"] == key and not is_section) or row["name"].startswith(key + ".")]
        assert matches, f"{key} is not listed"
        assert all(row["where"].startswith(("honoured", "accepted, no effect on the math")) for row in matches), matches


def train_records(path):
    return [r for r in map(json.loads, path.read_text().splitlines()) if "split" not in r]


# ---- Megatron-LM's examples/gpt3/train_gpt3_175b_distributed.sh -----------------------------------

def megatron_argv(corpus, tmp_path):
    tokenizer = corpus.tokenizer_dir
    return substitute(MEGATRON_175B, {
        **TINY_MODEL, "--micro-batch-size": ["2"], "--global-batch-size": ["8"], "--rampup-batch-size": ["2", "2", "12"],
        "--train-iters": ["6"], "--lr-decay-iters": ["5"], "--tensor-model-parallel-size": ["1"],
        "--pipeline-model-parallel-size": ["1"], "--data-path": [corpus.data_prefix],
        "--vocab-file": [os.path.join(tokenizer, "vocab.json")], "--merge-file": [os.path.join(tokenizer, "merges.txt")],
        "--log-interval": ["1"], "--save-interval": ["3"], "--eval-interval": ["3"], "--save": [str(tmp_path / "ck")],
        "--load": [str(tmp_path / "ck")], "--eval-iters": ["1"], "--tensorboard-dir": [str(tmp_path / "tb")]})


def test_megatron_gpt3_175b_script_trains(corpus, tmp_path, capsys):
    argv = megatron_argv(corpus, tmp_path)
    assert flags(argv) == flags(MEGATRON_175B)
    shown = print_config(argv, capsys)
    assert_every_flag_honoured(argv, shown)
    metrics = tmp_path / "metrics.jsonl"
    assert pretrain_gpt.main(argv + ["--metrics-file", str(metrics)]) == 0
    out = capsys.readouterr().out
    records = train_records(metrics)
    assert [r["global_batch_size"] for r in records] == [2, 2, 4, 6, 8, 8]  # the ramp, 12 samples long
    assert all(math.isfinite(r["loss"]) for r in records) and "loss_scale" in records[-1]  # fp16
    assert "warning: fp16 on a CPU runs 10-15x slower" in out
    assert os.listdir(tmp_path / "tb") and (tmp_path / "ck" / "latest").is_file()


def test_megatron_script_with_its_pipeline_size_is_refused_in_one_line_only_for_its_process_count(corpus, tmp_path,
                                                                                                capsys):
    # 16 stages of the 16-layer script: the split is Megatron's and its --save is checkpoints by stage
    # (tests/checkpoint/test_pipeline_checkpoint.py); what one process cannot do is hold 16 stages
    argv = megatron_argv(corpus, tmp_path)
    argv[argv.index("--pipeline-model-parallel-size") + 1] = "16"
    argv[argv.index("--num-layers") + 1] = "16"
    assert pretrain_gpt.main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--pipeline-model-parallel-size 16 does not divide the 1 launched processes" in err


# ---- DeepSpeedExamples' Megatron-LM/scripts/ds_pretrain_gpt2.sh with its ds_config.json --------------

def deepspeed_argv(corpus, tmp_path):
    config_json = tmp_path / "ds_config.json"
    config_json.write_text(DS_CONFIG_JSON)
    tokenizer = corpus.tokenizer_dir
    argv = substitute(DS_PRETRAIN_GPT2, {
        **TINY_MODEL, "--train-iters": ["4"], "--save": [str(tmp_path / "ck")], "--load": [str(tmp_path / "ck")],
        "--train-data": [corpus.data_prefix], "--cache-dir": [str(tmp_path / "cache")],
        "--deepspeed_config": [str(config_json)]})
    # GPT2BPETokenizer downloaded GPT-2's files there; here they are local files.
    return argv + ["--vocab-file", os.path.join(tokenizer, "vocab.json"),
                   "--merge-file", os.path.join(tokenizer, "merges.txt")]


def test_deepspeed_megatron_script_shows_every_flag_and_key_honoured(corpus, tmp_path, capsys):
    argv = deepspeed_argv(corpus, tmp_path)
    assert flags(argv)[:len(flags(DS_PRETRAIN_GPT2))] == flags(DS_PRETRAIN_GPT2)
    shown = print_config(argv, capsys)
    assert_every_flag_honoured(argv, shown)
    assert_every_json_key_listed(DS_CONFIG_JSON, shown)


def main_on_rank(rank, world_size, argv):
    return pretrain_gpt.main(argv)


@pytest.mark.slow
def test_deepspeed_megatron_script_trains_on_two_ranks(corpus, tmp_path):
    """--batch-size 8 x gradient_accumulation_steps 1 x 2 ranks = the JSON's train_batch_size 16, as the
    script's numbers mean; ZeRO stage 1 ("zero_optimization": true), fp16, checkpointed activations."""
    metrics = tmp_path / "metrics.jsonl"
    argv = deepspeed_argv(corpus, tmp_path) + ["--metrics-file", str(metrics)]
    assert run_distributed(main_on_rank, 2, argv, timeout=300) == [0, 0]
    records = train_records(metrics)
    assert [r["iteration"] for r in records] == [4]  # --log-interval's default; steps_per_print 1 does not set it
    assert all(r["consumed_samples"] == 16 * r["iteration"] and math.isfinite(r["loss"]) for r in records)
    assert (tmp_path / "ck" / "latest").is_file()


# ---- DeepSpeedExamples' Megatron-LM/scripts/ds_zero2_config.json -------------------------------------

def test_typical_zero2_json_trains_and_every_key_is_honoured(tmp_path, capsys, corpus):
    ds = tmp_path / "ds_zero2_config.json"
    ds.write_text(DS_ZERO2_CONFIG_JSON)
    argv = substitute(["--num-layers", "24", "--hidden-size", "1024", "--num-attention-heads", "16",
                       "--seq-length", "1024", "--max-position-embeddings", "1024"], TINY_MODEL)
    argv += ["--deepspeed_config", str(ds), "--train-iters", "3", "--eval-iters", "0", "--device", "cpu",
             "--tokenizer-file", os.path.join(corpus.tokenizer_dir, "tokenizer.json"), "--data-path", corpus.data_prefix]
    shown = print_config(argv, capsys)
    assert_every_json_key_listed(DS_ZERO2_CONFIG_JSON, shown)
    metrics = tmp_path / "metrics.jsonl"
    assert pretrain_gpt.main(argv + ["--metrics-file", str(metrics)]) == 0
    out = capsys.readouterr().out
    assert "accepted with no effect on the math: " in out and "wall_clock_breakdown (" in out
    # steps_per_print is DeepSpeed's own progress line, independent of --log-interval (issue 22)
    assert "steps_per_print (1: the cadence of DeepSpeed's own progress line" in out
    assert "ZeRO stage 2, fp16" in out and "global batch 16 = micro batch 16 x 1 accumulation steps" in out
    records = train_records(metrics)
    # --log-interval's default (10): the JSON's steps_per_print 1 no longer sets it, so the last iteration logs
    assert [r["iteration"] for r in records] == [3] and all(math.isfinite(r["loss"]) for r in records)
