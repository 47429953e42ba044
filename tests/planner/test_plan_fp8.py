"""The planner under --fp8-format (issue 65 item 3): the dry run applies FP8 on the meta device, so the FP8 linears'
saved tensors (1-byte copies of each input and weight, TransformerEngine's FP8 activations and weight copy for the
backward) are what its saved-tensor meter measures, as a live run's --report-memory does: the two agree exactly on a
CPU run (fp32, measured 652,160 bytes), and the plan keeps less than without FP8 (693,056 bytes). Delayed scaling's
amax histories and scales are in its total."""

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
    # delayed scaling's histories (length 1 x 3) and scales (3), fp32, for the 4 linears of each of the 2 blocks
    assert plan.fp8_state_bytes == 2 * 4 * (1 * 3 + 3) * 4
    high_precision = dry_run(parse_config([*COMMON, *plain]), Cluster(1, 1, device_type="cpu"), vocab, rank=0)
    assert plan.saved_activation_bytes["device"] < high_precision.saved_activation_bytes["device"]


def test_fp8_param_gathers_bytes_are_in_the_plan():
    """--fp8-param-gather under ZeRO 1 (2 ranks): each rank's e4m3 shards and the gathered e4m3 weights (1 byte an
    element, held whole between steps at stages 1-2), on top of the histories; MXFP8's two casts and its scales."""
    flags = [*FP8, "--fp8-param-gather", "--use-distributed-optimizer", "--global-batch-size", "4"]
    plan = dry_run(parse_config([*COMMON, *flags]), Cluster(2, 2, device_type="cpu"), 512, rank=0)
    weights = 2 * 12 * 64 * 64  # per block: QKV 3h x h, projection h x h, the MLP's two 4h x h
    histories = 2 * 4 * (1 * 3 + 3) * 4
    # the whole gathered weights and this rank's half, plus each FP8 bucket's alignment padding (under 2 ranks x 64
    # elements a bucket; at most one bucket per weight, 8)
    assert 0 <= plan.fp8_state_bytes - histories - weights - weights // 2 < 8 * 2 * 64 * 3 // 2
    # MXFP8: both casts, rowwise and columnwise, so twice the bytes (no histories), and the E8M0 scales every rank
    # holds whole (fp32 here, one per 32 elements each way: a quarter byte an element); the padding twice
    mxfp8 = [flag if flag != "delayed" else "mxfp8" for flag in flags]
    plan = dry_run(parse_config([*COMMON, *mxfp8]), Cluster(2, 2, device_type="cpu"), 512, rank=0)
    assert 0 <= plan.fp8_state_bytes - 2 * (weights + weights // 2) - weights // 4 < 2 * 8 * 2 * 64 * 3 // 2


def _live_weight_cache_bytes(argv, vocab) -> int:
    """One live iteration (2 micro-batches) on the CPU: the most bytes each FP8 weight's cast held, summed."""
    import torch

    from parallel.state import destroy, initialize
    from training.build import build
    from training.run_settings import resolve_run_settings
    from training.train_step import DataParallelTrainStep

    def batches():
        generator = torch.Generator().manual_seed(0)
        while True:
            yield {"tokens": torch.randint(0, vocab, (1, 33), generator=generator)}

    state = initialize("cpu", 1)
    try:
        settings = resolve_run_settings(parse_config(argv), vocab, 1, 1, "cpu")
        built = build(settings, state, dropout_rng=True, torch_compile=False)
        step = DataParallelTrainStep(built.model, built.zero, batches(), settings, state, built.activations,
                                     rng=built.rng)
        step(1, 0, measure_activations=False)
        return sum(cache.peak_bytes for cache in built.model.fp8_weight_caches)
    finally:
        destroy(state)


def test_the_weights_casts_kept_for_the_iteration_are_the_live_ones():
    """Each FP8 weight's cast, kept from the first micro-batch to the end of the iteration's micro-batches
    (parallel/fp8/weight_cache.py): the dry run's caches (meta tensors) hold what the live ones held, ~2 bytes a
    weight element (e4m3 data and transpose) and the scales, in the passes' working set."""
    argv = [*COMMON, "--fp8-format", "hybrid", "--train-iters", "1", "--global-batch-size", "2",
            "--micro-batch-size", "1", "--num-attention-heads", "2", "--seq-length", "32"]
    weights = 2 * 12 * 64 * 64  # per block: QKV 3h x h, projection h x h, the MLP's two 4h x h
    for recipe, scale_bytes in (("delayed", 2 * 4 * 4), ("blockwise", None)):
        flags = [*argv, "--fp8-recipe", recipe]
        plan = dry_run(parse_config(flags), Cluster(1, 1, device_type="cpu"), 512, rank=0)
        assert plan.fp8_weight_cache_bytes == _live_weight_cache_bytes(flags, 512) > 2 * weights
        if scale_bytes is not None:  # one fp32 dequantizing scale a weight
            assert plan.fp8_weight_cache_bytes == 2 * weights + scale_bytes
    plain = dry_run(parse_config(argv[:argv.index("--fp8-format")] + argv[argv.index("--fp8-format") + 2:]),
                    Cluster(1, 1, device_type="cpu"), 512, rank=0)
    assert plain.fp8_weight_cache_bytes == 0
