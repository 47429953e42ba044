"""The planner under --fp8-format (issue 65 item 3): the dry run applies FP8 on the meta device, so the FP8 linears'
saved tensors (1-byte copies of each input and weight, TransformerEngine's FP8 activations and weight copy for the
backward) are what its saved-tensor meter measures, as a live run's --report-memory does: the two agree exactly on a
CPU run (fp32, measured 652,160 bytes), and the plan keeps less than without FP8 (693,056 bytes)."""

import json

from arguments.parser import parse_config
from planner.dry_run import Cluster, dry_run
from tests.zero.test_zero_training import COMMON

FP8 = ["--fp8-format", "hybrid", "--fp8-recipe", "delayed", "--train-iters", "1", "--report-memory",
       "--global-batch-size", "2", "--micro-batch-size", "2", "--num-attention-heads", "2"]


def test_the_dry_run_keeps_what_a_live_fp8_step_saves_for_the_backward(tmp_path, corpus_cache):
    import pretrain_gpt
    from data.corpus import prepare_default_corpus

    metrics = tmp_path / "m.jsonl"
    assert pretrain_gpt.main([*COMMON, *FP8, "--data-cache-dir", corpus_cache, "--metrics-file", str(metrics)]) == 0
    (memory,) = [json.loads(line)["memory"] for line in open(metrics) if "memory" in json.loads(line)]
    (live,) = memory
    vocab = prepare_default_corpus(corpus_cache, 512).vocab_size
    plan = dry_run(parse_config([*COMMON, *FP8]), Cluster(1, 1, device_type="cpu"), vocab, rank=0)
    assert plan.saved_activation_bytes["device"] == live["saved_activation_device_bytes"] > 0
    plain = [flag for flag in FP8 if flag not in ("--fp8-format", "hybrid", "--fp8-recipe", "delayed")]
    high_precision = dry_run(parse_config([*COMMON, *plain]), Cluster(1, 1, device_type="cpu"), vocab, rank=0)
    assert plan.saved_activation_bytes["device"] < high_precision.saved_activation_bytes["device"]
