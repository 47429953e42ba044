"""planner/perf_model.py and planner/perf_calibration.py: each term of the predicted iteration against an
independent computation, the fit recovering constants it did not see, and the committed H100
calibration being what --calibrate computes from the committed measurements."""

import dataclasses
import json
import math

import pytest
import yaml

from arguments.parser import parse_config
from parallel.comm import ring_bytes_sent
from planner import perf_calibration, perf_cli, perf_model
from planner.dry_run import Cluster, dry_run
from planner.perf_model import Constants, forward_gemms, load_constants, load_hardware, predict
from training.metrics import flops_per_iteration

SMALL = ["--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4", "--seq-length", "32",
         "--max-position-embeddings", "32"]
VOCAB = 1000
CONSTANTS = Constants(0.5, 10.0, 0.0, "test")


def planned(argv, world_size, gpus_per_node=8, device_type="cuda"):
    config = parse_config([*SMALL, *argv])
    plan = dry_run(config, Cluster(world_size, gpus_per_node, None, device_type), VOCAB)
    return config, plan


def hardware(**changes):
    return dataclasses.replace(load_hardware("h100-sxm"), **changes)


@pytest.mark.parametrize("tp, recompute", [(1, False), (2, True), (4, False)])
def test_the_gemms_are_megatrons_flops_split_over_tp(tp, recompute):
    config = parse_config([*SMALL, "--tensor-model-parallel-size", str(tp), "--micro-batch-size", "3"])
    config = dataclasses.replace(config, model=dataclasses.replace(config.model, vocab_size=VOCAB))
    padded = config.model.padded_vocab_size(tp)
    blocks, logits = forward_gemms(config.model, config.training, padded, tp)
    passes = 4 if recompute else 3
    per_rank = passes * sum(g.flops for g in blocks) + 3 * logits.flops
    expected = flops_per_iteration(config.model, 3, activation_recompute=recompute, padded_vocab_size=padded)
    assert per_rank * tp == pytest.approx(expected, rel=1e-12)


def test_a_gemm_falls_off_the_peak_by_the_hardwares_flop_per_byte_ratio():
    gemm = perf_model.Gemm(64, 64, 64, 1)
    h100 = hardware()
    seconds = perf_model.gemm_seconds([gemm], 2, h100, CONSTANTS)
    expected = gemm.flops / (h100.peak_flops * 0.5) + 3 * 64 * 64 * 2 / h100.hbm_bandwidth
    assert seconds == pytest.approx(expected)
    big = perf_model.Gemm(8192, 8192, 8192, 1)
    achieved = big.flops / perf_model.gemm_seconds([big], 2, h100, CONSTANTS) / h100.peak_flops
    assert 0.45 < achieved < 0.5  # a large GEMM gets close to GEMM_EFFICIENCY, a small one does not
    assert gemm.flops / seconds / h100.peak_flops < 0.1


def test_tp_traffic_runs_at_the_inter_node_link_when_the_group_spans_nodes():
    config, plan = planned(["--tensor-model-parallel-size", "4", "--micro-batch-size", "2",
                            "--global-batch-size", "2"], 4, gpus_per_node=4)
    tp_bytes = sum(plan.comm_bytes["tp"].values())
    assert tp_bytes > 0
    inside = predict(plan, config, VOCAB, 4, hardware(gpus_per_node=4), CONSTANTS)
    across = predict(plan, config, VOCAB, 4, hardware(gpus_per_node=2), CONSTANTS)
    assert not inside.tp_crosses_nodes and across.tp_crosses_nodes
    h100 = hardware()
    call = ring_bytes_sent("all_reduce", 2 * 32 * 64 * 4, 4)  # one fp32 b x s x h activation
    calls = math.ceil(tp_bytes / call)
    assert inside.terms["tp"] == pytest.approx(tp_bytes / h100.intra_node_bandwidth + calls * h100.intra_node_latency_s)
    assert across.terms["tp"] == pytest.approx(tp_bytes / h100.inter_node_bandwidth + calls * h100.inter_node_latency_s)
    assert across.iteration_s > inside.iteration_s


def test_dp_reduction_hides_behind_backward_up_to_the_overlap_and_never_its_last_bucket():
    config, plan = planned(["--zero-stage", "2", "--micro-batch-size", "4", "--global-batch-size", "8",
                            "--reduce-bucket-size", "20000"], 2, gpus_per_node=2)
    h100 = hardware(gpus_per_node=2, peak_flops=1e9)  # a slow GPU: backward outlasts the reduction
    reduce_bytes = plan.comm_bytes["dp"]["reduce_scatter"] + plan.comm_bytes["dp"]["all_reduce"]
    none = predict(plan, config, VOCAB, 2, h100, dataclasses.replace(CONSTANTS, dp_overlap=0.0))
    full = predict(plan, config, VOCAB, 2, h100, dataclasses.replace(CONSTANTS, dp_overlap=1.0))
    calls = math.ceil(reduce_bytes / ring_bytes_sent("reduce_scatter", 20000 * 4, 2))
    reduce_s = reduce_bytes / h100.intra_node_bandwidth + calls * h100.intra_node_latency_s
    assert none.terms["dp_reduce_exposed"] == pytest.approx(reduce_s)
    assert 0 < full.terms["dp_reduce_exposed"] < reduce_s  # the last bucket stays
    assert full.terms["dp_reduce_exposed"] == pytest.approx(reduce_s / calls)  # one micro-batch, one last bucket
    assert full.terms["dp_gather_exposed"] == none.terms["dp_gather_exposed"] > 0  # after the step: not hidden


def test_cpu_checkpointing_moves_every_checkpoint_to_the_host_and_back():
    argv = ["--tensor-model-parallel-size", "2", "--micro-batch-size", "2", "--global-batch-size", "4",
            "--checkpoint-activations", "--partition-activations"]
    config, plan = planned([*argv, "--cpu-checkpointing"], 2, gpus_per_node=2)
    host = plan.checkpoint_bytes["host"]
    assert host > 0
    h100 = hardware(gpus_per_node=2)
    prediction = predict(plan, config, VOCAB, 2, h100, CONSTANTS)
    assert prediction.terms["offload"] == pytest.approx(2 * 2 * host / h100.host_bandwidth)  # 2 micro-batches


def test_throughput_is_the_flops_over_the_iteration():
    config, plan = planned(["--micro-batch-size", "2", "--global-batch-size", "4", "--checkpoint-activations"], 2,
                           gpus_per_node=2)
    prediction = predict(plan, config, VOCAB, 2, hardware(gpus_per_node=2), CONSTANTS)
    assert prediction.iteration_s == pytest.approx(sum(prediction.terms.values()))
    assert prediction.hardware_tflops_per_gpu == pytest.approx(plan.flops_per_gpu / prediction.iteration_s / 1e12)
    vocab_model = dataclasses.replace(config.model, vocab_size=VOCAB)
    model = flops_per_iteration(vocab_model, 4, padded_vocab_size=vocab_model.padded_vocab_size(1))
    assert prediction.model_tflops_per_gpu == pytest.approx(model / 2 / prediction.iteration_s / 1e12)
    assert prediction.model_tflops_per_gpu < prediction.hardware_tflops_per_gpu  # the recompute


def test_every_profile_loads_with_its_calibration():
    for path in sorted(perf_model.HARDWARE_DIR.glob("*.yaml")):
        profile = load_hardware(path.stem)
        constants = load_constants(profile.calibration)
        assert 0 < constants.gemm_efficiency <= 1 and constants.elementwise_passes >= 0
        assert 0 <= constants.dp_overlap <= 1


def test_the_fit_recovers_constants_it_did_not_see(tmp_path):
    """Runs whose 'measured' times are the model's own at known constants: the fit must find them."""
    truth = Constants(0.6, 9.0, 0.5)
    # A slow machine with small buckets, so the reductions are long enough for the overlap to show.
    cpu = dataclasses.replace(load_hardware("h100-sxm"), gpus_per_node=2, peak_flops=2e11, hbm_bandwidth=2e10,
                              intra_node_bandwidth=1e9)
    observations = []
    for index, argv in enumerate([["--hidden-size", "64", "--micro-batch-size", "8", "--global-batch-size", "8"],
                                  ["--hidden-size", "256", "--micro-batch-size", "2", "--global-batch-size", "2"],
                                  ["--hidden-size", "128", "--zero-stage", "2", "--micro-batch-size", "4",
                                   "--global-batch-size", "8", "--reduce-bucket-size", "30000"],
                                  ["--hidden-size", "128", "--zero-stage", "1", "--micro-batch-size", "2",
                                   "--global-batch-size", "8", "--reduce-bucket-size", "30000"]]):
        world = 2 if "--zero-stage" in argv else 1
        observation = perf_calibration.Observation(f"run{index}", parse_config([*SMALL, *argv]), world, 2, VOCAB, 1.0)
        observations.append(observation)
    perf_calibration.plan_observations(observations, cpu)
    for observation in observations:
        observation.measured_s = perf_calibration.predicted_seconds(observation, cpu, truth)
    fitted, error, overlap_fitted = perf_calibration.fit_constants(observations, cpu)
    assert overlap_fitted and error < 1e-3
    assert fitted.gemm_efficiency == pytest.approx(0.6, rel=0.02)
    assert fitted.elementwise_passes == pytest.approx(9.0, rel=0.02)
    assert fitted.dp_overlap == pytest.approx(0.5, abs=0.05)


def test_metrics_runs_are_read_with_their_launch_file(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "launch.json").write_text(json.dumps({"argv": SMALL, "world_size": 1, "gpus_per_node": 1,
                                                 "vocab_size": VOCAB}))
    records = [{"iteration": i, "iter_time_s": t} for i, t in enumerate([9.0, 5.0, 1.0, 2.0, 3.0], start=1)]
    records.insert(3, {"iteration": 3, "split": "valid", "loss": 1.0})
    (run / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in records) + "\n")
    (observation,) = perf_calibration.observations_from(run / "metrics.jsonl")
    assert observation.measured_s == 2.0  # the median after the first two records; evaluations skipped
    (run / "launch.json").unlink()
    from arguments.config import ConfigError

    with pytest.raises(ConfigError, match="launch.json"):
        perf_calibration.observations_from(run / "metrics.jsonl")


@pytest.mark.slow
@pytest.mark.parametrize("calibration", ["h100-anchor", "cpu-2core"])
def test_a_committed_calibration_is_what_calibrate_computes_from_its_runs(calibration):
    """No hand-tuning: the constants are the fit to the measurements their file names (the H100 one,
    which every GPU prediction uses, to docs/h100-benchmark-gpu-*.json)."""
    committed = yaml.safe_load((perf_model.CALIBRATION_DIR / f"{calibration}.yaml").read_text())
    root = perf_model.HARDWARE_DIR.parent.parent
    files = [part for part in committed["command"].split() if part.endswith((".json", ".jsonl"))]
    assert files and all((root / f).is_file() for f in files)
    observations = [o for f in files for o in perf_calibration.observations_from(root / f)]
    hardware = load_hardware(committed["hardware"])
    perf_calibration.plan_observations(observations, hardware)
    fitted, error, overlap_fitted = perf_calibration.fit_constants(observations, hardware)
    assert fitted.gemm_efficiency == pytest.approx(committed["gemm_efficiency"], abs=1e-4)
    assert fitted.elementwise_passes == pytest.approx(committed["elementwise_passes"], abs=0.01)
    assert fitted.dp_overlap == committed["dp_overlap"] and overlap_fitted == committed["dp_overlap_fitted"]
    assert error == pytest.approx(committed["rms_relative_error"], abs=1e-4)


def test_the_command_line_predicts_a_run(capsys):
    assert perf_cli.main(["--hardware", "h100-sxm", *SMALL, "--world-size", "2", "--micro-batch-size", "2",
                            "--global-batch-size", "4", "--json"]) == 0
    record = json.loads(capsys.readouterr().out)
    assert record["iteration_s"] == pytest.approx(sum(record["terms"].values()))


def test_fp8_gemms_run_at_the_fp8_peak_with_one_byte_operands():
    """--fp8-format: the blocks' linears that run in FP8 (gpt/fp8.py: all blocks but --first-last-layers-bf16's,
    shapes keeping CUDA's rules) at the profile's FP8 peak, 1-byte operands; attention products and the logits at
    the 16-bit peak. No GPU measurement of an FP8 step exists here to hold the prediction against (docs/fp8.md)."""
    h100 = hardware()
    gemm = perf_model.Gemm(64, 64, 64, 1, fp8=True)
    expected = gemm.flops / (h100.fp8_peak_flops * 0.5) + (2 * 64 * 64 * 1 + 64 * 64 * 2) / h100.hbm_bandwidth
    assert perf_model.gemm_seconds([gemm], 2, h100, CONSTANTS) == pytest.approx(expected)
    assert perf_model.gemm_peak_flops(hardware(fp8_peak_flops=None), True) == 2 * h100.peak_flops
    config = parse_config([*SMALL, "--num-layers", "4", "--fp8-format", "hybrid", "--fp8-recipe", "tensorwise",
                           "--first-last-layers-bf16", "--micro-batch-size", "1"])
    config = dataclasses.replace(config, model=dataclasses.replace(config.model, vocab_size=VOCAB))
    blocks, logits = forward_gemms(config.model, config.training, config.model.padded_vocab_size(1), 1)
    assert {g.count for g in blocks if g.fp8} == {2} and not logits.fp8  # 4 blocks, the first and last kept
    fp8_shapes = {(g.k, g.n) for g in blocks if g.fp8}
    kept = [g for g in blocks if not g.fp8 and (g.k, g.n) in fp8_shapes]  # the same linears in blocks 0 and 3
    assert sum(g.flops for g in blocks if g.fp8) == sum(g.flops for g in kept)
    plain = parse_config([*SMALL, "--num-layers", "4", "--micro-batch-size", "1"])
    plain = dataclasses.replace(plain, model=dataclasses.replace(plain.model, vocab_size=VOCAB))
    bf16_blocks, _ = forward_gemms(plain.model, plain.training, plain.model.padded_vocab_size(1), 1)
    assert sum(g.flops for g in blocks) == sum(g.flops for g in bf16_blocks) and not any(g.fp8 for g in bf16_blocks)
    assert perf_model.gemm_seconds(blocks, 2, h100, CONSTANTS) < perf_model.gemm_seconds(bf16_blocks, 2, h100,
                                                                                          CONSTANTS)


@pytest.mark.parametrize("tp", [1, 2])
def test_a_mixed_patterns_gemms_are_each_blocks_own_mixers(tp):
    """`*-+-*-+-`: the attention blocks' GEMMs and the MLA blocks', each by its own mixer (gpt/shape.py's probe is
    MLA): half of 4 attention blocks' and half of 4 MLA blocks', and at TP 1 Megatron's FLOPs of the mixed model
    (at TP 2 MLA's down projections run whole on each rank); every block as the probe's would be the MLA model's."""
    from gpt.layer_spec import mixer_symbols

    mla = ["--multi-latent-attention", "--kv-lora-rank", "16", "--qk-head-dim", "8", "--qk-pos-emb-head-dim", "4",
           "--v-head-dim", "8"]
    small = [*SMALL[2:], "--position-embedding-type", "rope", "--tensor-model-parallel-size", str(tp),
             "--micro-batch-size", "3"]

    def gemm_flops(flags, mixers=False):
        config = parse_config([*small, *flags])
        config = dataclasses.replace(config, model=dataclasses.replace(config.model, vocab_size=VOCAB))
        padded = config.model.padded_vocab_size(tp)
        blocks, logits = forward_gemms(config.model, config.training, padded, tp, mixer_symbols(config.model) if mixers else None)
        return sum(g.flops for g in blocks), logits.flops, config, padded

    attention, _, _, _ = gemm_flops(["--num-layers", "4"])
    all_mla, _, _, _ = gemm_flops(["--num-layers", "4", *mla])
    mixed, logits, config, padded = gemm_flops(["--hybrid-layer-pattern", "*-+-*-+-", *mla], mixers=True)
    assert mixed == (attention + all_mla) / 2 and attention != all_mla
    assert gemm_flops(["--hybrid-layer-pattern", "*-+-*-+-", *mla])[0] == all_mla  # no mixers: all the probe's
    if tp == 1:
        assert 3 * (mixed + logits) == pytest.approx(flops_per_iteration(config.model, 3, padded_vocab_size=padded),
                                                     rel=1e-12)
