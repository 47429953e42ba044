"""--optimizer muon's flags (NVIDIA/Megatron-LM main, megatron/training/arguments.py `_add_training_args` /
the emerging-optimizer group: --muon-momentum 0.9, --muon-no-split-qkv (store_false, dest muon_split_qkv),
--muon-nesterov, --muon-scale-mode spectral, --muon-fp32-matmul-prec medium, --muon-coefficient-type quintic,
--muon-num-ns-steps 5, --muon-tp-mode duplicated (choices blockwise, duplicated, distributed; core_v0.16.1's default
was blockwise), --muon-extra-scale-factor 1.0, --muon-scalar-optimizer adam), read into OptimizerConfig and handed to
TensorParallelMuon (megatron/core/optimizer/emerging_optimizers.py, `_muon_config_to_kwargs`). The step:
tests/zero/test_muon.py; under TP: tests/zero/test_muon_tensor_parallel.py."""

import pytest

from arguments.parser import parse_arguments
from base.errors import ConfigError


def test_muon_and_its_knobs_are_settings_with_megatrons_defaults():
    defaults = parse_arguments(["--optimizer", "muon"]).config.optimizer
    knobs = defaults.algorithms
    assert (defaults.optimizer, knobs.muon_momentum, knobs.muon_split_qkv, knobs.muon_nesterov,
            knobs.muon_scale_mode, knobs.muon_fp32_matmul_prec, knobs.muon_coefficient_type,
            knobs.muon_num_ns_steps, knobs.muon_tp_mode, knobs.muon_extra_scale_factor,
            knobs.muon_scalar_optimizer) == ("muon", 0.9, True, False, "spectral", "medium", "quintic", 5,
                                                "duplicated", 1.0, "adam")
    set_ = parse_arguments(["--optimizer", "muon", "--muon-momentum", "0.95", "--muon-no-split-qkv", "--muon-nesterov",
                            "--muon-scale-mode", "shape_scaling", "--muon-fp32-matmul-prec", "high",
                            "--muon-coefficient-type", "polar_express", "--muon-num-ns-steps", "9",
                            "--muon-extra-scale-factor", "0.2"]).config.optimizer.algorithms
    assert (set_.muon_momentum, set_.muon_split_qkv, set_.muon_nesterov, set_.muon_scale_mode,
            set_.muon_fp32_matmul_prec, set_.muon_coefficient_type, set_.muon_num_ns_steps,
            set_.muon_extra_scale_factor) == (0.95, False, True, "shape_scaling", "high", "polar_express", 9, 0.2)


@pytest.mark.parametrize("mode", ["blockwise", "duplicated", "distributed"])
def test_every_tp_mode_is_accepted_at_tp_2(mode):
    """megatron/training/arguments.py --muon-tp-mode choices=['blockwise', 'duplicated', 'distributed']."""
    config = parse_arguments(["--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "2",
                              "--optimizer", "muon", "--tensor-model-parallel-size", "2",
                              "--muon-tp-mode", mode]).config
    assert config.optimizer.algorithms.muon_tp_mode == mode and config.parallel.tensor_model_parallel_size == 2


@pytest.mark.parametrize("argv, words", [
    (["--zero-stage", "1", "--offload-optimizer"], ("--optimizer muon", "--offload-optimizer")),
    (["--muon-num-ns-steps", "4"], ("--muon-num-ns-steps 4", "quintic", "multiple of 5")),
    (["--muon-scalar-optimizer", "lion"], ("--muon-scalar-optimizer lion is not implemented",)),
    (["--muon-tp-mode", "rowwise"], ("--muon-tp-mode", "rowwise")),
])
def test_what_muon_does_not_build_here_is_refused_in_one_line(argv, words):
    """The offloaded host step and Lion are not built;
    emerging_optimizers' newton_schulz refuses a step count its coefficient sets do not fit; a TP mode Megatron
    does not have is refused by its choices."""
    with pytest.raises(ConfigError) as error:
        parse_arguments(["--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "2",
                         "--optimizer", "muon", *argv])
    message = str(error.value)
    assert "\n" not in message
    for word in words:
        assert word in message, (word, message)
