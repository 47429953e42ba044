"""scripts/tools/reshard_checkpoint.py keeps every optimizer state the checkpoint holds, in the dtype it holds it:
AdEMAMix's slow momentum (--optimizer ademamix, zero/ademamix.py) and bf16 Adam moments (--exp-avg-dtype /
--exp-avg-sq-dtype bf16, zero/precision_aware.py). Before, the rewrite carried Adam's three fp32 tensors only: an
AdEMAMix checkpoint lost its slow momentum and a bf16 one doubled its moments' bytes against its own config."""

import pytest
import torch
from safetensors import safe_open

import pretrain_gpt
from scripts.tools.reshard_checkpoint import reshard
from tests.reliability_helpers import TINY, metrics_records

CASES = {
    "ademamix": (["--optimizer", "ademamix", "--ademamix-alpha", "8", "--ademamix-beta3", "0.9999"],
                 {"master": torch.float32, "exp_avg": torch.float32, "exp_avg_sq": torch.float32,
                  "exp_avg_slow": torch.float32}),
    "bf16-moments": (["--use-precision-aware-optimizer", "--exp-avg-dtype", "bf16", "--exp-avg-sq-dtype", "bf16",
                      "--zero-stage", "1"],
                     {"master": torch.float32, "exp_avg": torch.bfloat16, "exp_avg_sq": torch.bfloat16}),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_resharded_checkpoint_keeps_every_optimizer_state_in_its_dtype_and_resumes_exactly(
        corpus_cache_300, tmp_path, case):
    """Saved at iteration 2 of 4, rewritten by reshard_checkpoint.py (TP 1 -> TP 1: every state consolidated and
    re-cut), resumed from the rewrite: iterations 3-4 equal the straight run's bitwise, and the rewrite's optimizer
    file holds the same tensors in the same dtypes as the original."""
    extra, dtypes = CASES[case]
    argv = TINY + extra + ["--train-iters", "4", "--data-cache-dir", corpus_cache_300]
    save, rewritten = tmp_path / "ckpt", tmp_path / "rewritten"
    assert pretrain_gpt.main(argv + ["--metrics-file", str(tmp_path / "straight.jsonl")]) == 0
    assert pretrain_gpt.main(argv + ["--save", str(save), "--exit-interval", "2"]) == 0
    reshard(save, rewritten, 1, log=lambda *args, **kwargs: None)
    for directory in (save, rewritten):
        [optimizer_file] = (directory / "iter_0000002").glob("optim_*.safetensors")
        with safe_open(str(optimizer_file), "pt") as reader:
            assert {key: reader.get_tensor(key).dtype for key in reader.keys()} == dtypes, directory.name
    assert pretrain_gpt.main(argv + ["--load", str(rewritten), "--metrics-file", str(tmp_path / "resumed.jsonl")]) == 0

    def records(name):
        return [(r["iteration"], r["loss"], r["grad_norm"]) for r in metrics_records(tmp_path / name)
                if "loss" in r and "split" not in r]
    assert [r for r in records("straight.jsonl") if r[0] > 2] == records("resumed.jsonl")
    assert [r[0] for r in records("resumed.jsonl")] == [3, 4]
