"""--overlap-param-gather: the parameter all-gather after the step runs while the next forward does, and
changes nothing else: the same losses as without it, the same bytes."""

import pytest

from arguments.config import ConfigError
from arguments.parser import parse_config
from tests.zero.test_zero_training import BATCH, Runs, assert_close, losses_of


@pytest.mark.slow
def test_overlapped_parameter_gather_trains_like_one_process(tmp_path, corpus_cache, single_process_reference):
    reference = single_process_reference
    runs = Runs(tmp_path, corpus_cache)
    for stage in ("1", "2"):
        for overlap in ("--overlap-param-gather", "--no-overlap-param-gather"):
            runs.add(f"stage{stage}{overlap}", *BATCH, "--micro-batch-size", "2", "--zero-stage", stage, overlap,
                     "--eval-iters", "2", "--eval-interval", "5")
    results = runs.launch(2)
    for name, metrics in results.items():
        assert_close(losses_of(metrics), reference, 1e-5, name)
    for stage in ("1", "2"):
        on, off = results[f"stage{stage}--overlap-param-gather"], results[f"stage{stage}--no-overlap-param-gather"]
        # Every read waits for its gather (zero/gated_parameters.py): training and evaluation read the same
        # values as without the overlap, to the bit.
        assert losses_of(on) == losses_of(off)
        assert [r["loss"] for r in on if r.get("split")] == [r["loss"] for r in off if r.get("split")]
        assert [r["comm_bytes"] for r in on if "comm_bytes" in r] == [r["comm_bytes"] for r in off if "comm_bytes" in r]


def test_overlap_param_gather_at_stage_0_is_refused():
    with pytest.raises(ConfigError, match="--overlap-param-gather applies to ZeRO stages 1-3, not --zero-stage 0"):
        parse_config(["--zero-stage", "0", "--overlap-param-gather"])


@pytest.mark.parametrize("argv", [["--zero-stage", "3", "--overlap-param-gather"],
                                  ["--use-megatron-fsdp", "--overlap-grad-reduce", "--overlap-param-gather"],
                                  ["--use-megatron-fsdp", "--data-parallel-sharding-strategy", "optim_grads_params",
                                   "--overlap-param-gather"]])
def test_overlap_param_gather_at_stage_3_is_accepted_as_megatron_fsdp_does(argv):
    """Megatron-LM's validate_args (megatron/training/arguments.py) takes --overlap-param-gather "with distributed
    optimizer, megatron fsdp, or dist_muon", and MegatronFSDP.__init__ (megatron/core/distributed/fsdp/src/
    megatron_fsdp/megatron_fsdp.py) turns ddp_config.overlap_param_gather on itself for optim_grads_params: fully
    sharded parameters are always gathered ahead. Stage 3 here gathers ahead with --stage3-prefetch-bucket-size,
    so the flag is taken and changes nothing (the DeepSeek proxy FSDP functional tests pass it)."""
    config = parse_config(argv)
    assert config.zero.stage == 3 and config.zero.overlap_param_gather
