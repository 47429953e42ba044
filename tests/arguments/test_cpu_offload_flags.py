"""Megatron-LM's hybrid CPU optimizer flags (arguments/megatron/cpu_offload_flags.py), refused before as "not
implemented" although the Adam step already ran on the host (--offload-optimizer).

Megatron-LM at d98e8a64: megatron/training/arguments.py (--optimizer-cpu-offload, --optimizer-offload-fraction
default 1.0, --use-torch-optimizer-for-cpu-offload, --overlap-cpu-optimizer-d2h-h2d, --no-pin-cpu-grads,
--no-pin-cpu-params; validate_args' two assertions quoted below), megatron/core/optimizer/__init__.py (the
HybridDeviceOptimizer built with torch's AdamW and no state dtypes; use_torch_optimizer_for_cpu_offload read, then
overwritten), megatron/core/optimizer/optimizer_config.py ("--use-precision-aware-optimizer only supported with adam").
THUDM slime's run scripts (scripts/run-qwen3-30B-A3B.sh and its other MoE scripts) give --optimizer-cpu-offload
--overlap-cpu-optimizer-d2h-h2d --use-precision-aware-optimizer beside the distributed optimizer.
"""

import pytest

from arguments.config import ConfigError
from arguments.parser import parse_arguments, parse_config
from training.run_description import host_placement

AWARE = ["--use-precision-aware-optimizer", "--use-distributed-optimizer"]
SLIME = ["--optimizer", "adam", "--optimizer-cpu-offload", "--overlap-cpu-optimizer-d2h-h2d", *AWARE]


def _offload_sections(config):
    return config.zero, config.activations, config.training


def test_slimes_optimizer_flags_are_the_whole_host_step_said_once():
    parsed = parse_arguments(SLIME)
    zero = parsed.config.zero
    assert (zero.stage, zero.offload_optimizer, zero.optimizer_offload_fraction) == (1, True, 1.0)
    notes = "\n".join(parsed.notes)
    assert ("--optimizer-cpu-offload: Megatron-LM's hybrid CPU optimizer, the whole optimizer partition of each rank "
            "(its fp32 master, Adam moments and AdamW step) in host memory, as --offload-optimizer") in notes
    assert "--overlap-cpu-optimizer-d2h-h2d (the hybrid optimizer's overlapped copies:" in notes
    assert "a CPU run has no copies at all" in notes
    assert host_placement(*_offload_sections(parsed.config)).startswith("offloaded to host memory: optimizer states: fp32 master partition")


def test_a_fraction_splits_the_partition_and_its_knobs_have_no_effect():
    parsed = parse_arguments([*SLIME, "--optimizer-offload-fraction", "0.25", "--use-torch-optimizer-for-cpu-offload",
                              "--no-pin-cpu-grads", "--no-pin-cpu-params", "--zero-stage", "3"])
    assert (parsed.config.zero.stage, parsed.config.zero.optimizer_offload_fraction) == (3, 0.25)
    notes = "\n".join(parsed.notes)
    assert "the first 0.25 of each rank's optimizer partition, whole parameters in order" in notes
    assert "--use-torch-optimizer-for-cpu-offload (the hybrid optimizer's device-side class" in notes
    assert "--no-pin-cpu-grads, --no-pin-cpu-params (page-locking" in notes
    assert host_placement(*_offload_sections(parsed.config)).startswith("offloaded to host memory: optimizer states of the first 0.25 of "
                                                    "the partition")
    none = parse_config([*SLIME, "--optimizer-offload-fraction", "0"])
    assert host_placement(*_offload_sections(none)) == "offload: none (everything on the device)"


def test_state_dtypes_have_no_effect_under_it_as_in_megatron():
    """The hybrid optimizer keeps fp32 masters and torch AdamW's fp32 moments: --exp-avg-dtype bf16 and even the fp16
    and fp8 ones refused without offload (TransformerEngine's scaled storage) are not read under it."""
    parsed = parse_arguments([*SLIME, "--bf16", "--exp-avg-dtype", "bf16", "--exp-avg-sq-dtype", "fp8",
                              "--main-params-dtype", "fp16"])
    optimizer = parsed.config.optimizer
    assert (optimizer.algorithms.exp_avg_dtype, optimizer.algorithms.exp_avg_sq_dtype) == ("fp32", "fp32")
    assert ("--main-params-dtype fp16, --exp-avg-dtype bf16, --exp-avg-sq-dtype fp8 no effect under it, as in "
            "Megatron-LM") in "\n".join(parsed.notes)
    with pytest.raises(ConfigError, match="--exp-avg-sq-dtype fp8: Adam second moments stored in fp8"):
        parse_config([*AWARE, "--exp-avg-sq-dtype", "fp8"])  # without it, still refused


def test_megatrons_assertions_refuse_in_its_words():
    with pytest.raises(ConfigError, match=r"^--optimizer-cpu-offload without --use-precision-aware-optimizer: "
                                          r"Megatron-LM asserts 'The optimizer cpu offload must be used in conjunction "
                                          r"with `--use-precision-aware-optimizer`, as the hybrid device optimizer "
                                          r"reuses the code path of this flag.'"):
        parse_config(["--optimizer-cpu-offload", "--use-distributed-optimizer"])
    with pytest.raises(ConfigError, match="--use-precision-aware-optimizer without the distributed optimizer: "
                                          "Megatron-LM supports it only with distributed optimizer"):
        parse_config(["--optimizer-cpu-offload", "--use-precision-aware-optimizer"])
    with pytest.raises(ConfigError, match="--optimizer-cpu-offload with --optimizer ademamix: Megatron-LM asserts "
                                          "'--use-precision-aware-optimizer only supported with adam'"):
        parse_config([*SLIME, "--optimizer", "ademamix"])
    with pytest.raises(ConfigError, match="--optimizer-cpu-offload with --fp8-param-gather --fp8-recipe tensorwise: "
                                          "Megatron-LM asserts 'When `--fp8-param-gather` is enabled, the optimizer "
                                          "cpu offload must be used in conjunction with `--fp8-recipe delayed`.'"):
        parse_config([*SLIME, "--fp8-format", "e4m3", "--fp8-recipe", "tensorwise", "--fp8-param-gather",
                      "--zero-stage", "3"])
    with pytest.raises(ConfigError, match="--optimizer-offload-fraction must be a fraction from 0 to 1, got 1.5"):
        parse_config([*SLIME, "--optimizer-offload-fraction", "1.5"])


def test_the_fraction_alone_is_read_by_offload_only():
    """Megatron-LM reads --optimizer-offload-fraction only in its hybrid optimizer: alone, no effect (said); with
    --offload-optimizer it is the same split."""
    parsed = parse_arguments(["--use-distributed-optimizer", "--optimizer-offload-fraction", "0.5"])
    assert not parsed.config.zero.offload_optimizer
    assert ("--optimizer-offload-fraction 0.5 without --optimizer-cpu-offload (or --offload-optimizer): accepted, no "
            "effect") in "\n".join(parsed.notes)
    ours = parse_config(["--zero-stage", "2", "--offload-optimizer", "--optimizer-offload-fraction", "0.5"])
    assert host_placement(*_offload_sections(ours)).startswith("offloaded to host memory: optimizer states of the first 0.5")
