"""An SDPA call given a `scale` is planned as the kernel the run takes (planner/attention_kernel.py).

--softmax-scale, attention sinks (gpt/attention_sinks.py passes its scale always) and multi-latent attention call
SDPA with `scale=`. A CPU run without dropout takes the flash kernel for them as for any call (the scale changes no
kernel), keeping q, k, v, the output and a log-sum-exp; the dry run's stand-in took only calls without a scale, so
these were planned on the meta device's math path with its [b, heads, s, s] weights: at sequence 64 and 2 layers,
10-17% over the measured saved bytes (--softmax-scale 892,544 planned, 763,520 measured; sinks 948,128 and 864,928).
Now the plan equals --report-memory's measure, byte for byte. MLA with values narrower than its queries is held to
its measure in tests/gpt/test_mla.py (CPU: the math path; the CUDA plan: padded values)."""

from __future__ import annotations

import pytest

import pretrain_gpt
from arguments.parser import parse_config
from planner.dry_run import Cluster, dry_run
from tests.reliability_helpers import TINY, metrics_records

SHORT = ["--num-layers", "2", "--seq-length", "64", "--max-position-embeddings", "64", "--train-iters", "1",
         "--report-memory"]


@pytest.mark.parametrize("flags", [["--softmax-scale", "0.3"], ["--softmax-type", "learnable"]],
                         ids=["softmax-scale", "sinks"])
def test_a_scaled_attention_call_is_planned_as_the_flash_kernel_the_run_takes(flags, corpus_cache_300, tmp_path):
    from data.corpus import prepare_default_corpus

    metrics = tmp_path / "metrics.jsonl"
    argv = TINY + SHORT + ["--data-cache-dir", corpus_cache_300, "--metrics-file", str(metrics), *flags]
    assert pretrain_gpt.main(argv) == 0
    ((record,),) = [r["memory"] for r in metrics_records(metrics) if "memory" in r]
    measured = record["saved_activation_device_bytes"] + record["saved_activation_host_bytes"]
    vocab = prepare_default_corpus(corpus_cache_300, 300).vocab_size
    plan = dry_run(parse_config(argv), Cluster(1, 1, device_type="cpu"), vocab)
    assert plan.saved_activation_bytes["device"] + plan.saved_activation_bytes["host"] == measured
