"""--optimizer muon in checkpoints: its momentum is Adam's exp_avg at the Muon matrices' elements (zero/muon.py), so
it is saved and resumed with the master as Adam's moments are (Megatron-LM's `_eopt_init_state_fn` /
TensorParallelMuon keeps one state, "momentum_buffer", per Muon parameter; the scalar optimizer's Adam keeps its
two); moments resume only into the optimizer that made them."""

import pytest
from safetensors import safe_open

from tests.reliability_helpers import TINY, straight_and_resumed, train

MUON = ["--optimizer", "muon", "--muon-momentum", "0.95", "--muon-nesterov"]


@pytest.mark.parametrize("stage", ["0", "2"])
def test_a_muon_run_saved_and_resumed_continues_exactly(corpus_cache_300, tmp_path, stage):
    """Saved at iteration 2 of 5, resumed: every loss and gradient norm equals the straight run's; the optimizer
    file's exp_avg holds the momentum (not zero at the matrices) and metadata says muon."""
    argv = TINY + MUON + ["--train-iters", "5", "--data-cache-dir", corpus_cache_300, "--zero-stage", stage]
    straight, split, save = straight_and_resumed(argv, tmp_path, exit_interval=2)
    assert len(straight) == 5
    assert [(r["iteration"], r["loss"], r["grad_norm"]) for r in straight] == \
           [(r["iteration"], r["loss"], r["grad_norm"]) for r in split]
    [optimizer_file] = (save / "iter_0000002").glob("optim_*.safetensors")
    with safe_open(str(optimizer_file), "pt") as reader:
        assert set(reader.keys()) == {"master", "exp_avg", "exp_avg_sq"}
        assert reader.get_tensor("exp_avg").abs().sum() > 0


def test_muon_moments_do_not_resume_into_adam(corpus_cache_300, tmp_path):
    """A Muon checkpoint resumed with --optimizer adam (its exp_avg is Muon's momentum at the matrices, its
    exp_avg_sq zero there) is refused in one line naming both and --no-load-optim."""
    save = tmp_path / "ckpt"
    assert train(corpus_cache_300, tmp_path, *MUON, "--save", save).code == 0
    refused = train(corpus_cache_300, tmp_path, "--train-iters", "3", "--override-opt_param-scheduler", "--load", save,
                    "--save", tmp_path / "other")
    line = refused.one_error_line("--optimizer muon's states", "--optimizer adam", "--no-load-optim")
    assert "\n" not in line
