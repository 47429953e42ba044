"""--calculate-per-token-loss as Megatron-LM defines it (training/per_token_loss.py; issue 89 item 4): the iteration's
masked loss sum over its token count summed over DP x CP.

- Megatron-LM's own pretrain_gpt.py (core_v0.16.1, scripts/tools/megatron_checkpoint_fixtures.py continue) resumed the
  iteration-2 saves of megatron_tp1 and of megatron_moe_ep2 (at EP 2, with --moe-aux-loss-coeff 0.01 and
  --moe-z-loss-coeff 0.001: the balancing losses' scale) with `--calculate-per-token-loss --eod-mask-loss` and, for
  contrast, without the first (each fixture's megatron_per_token_losses.json; the corpus's documents are 8-60 tokens,
  so each micro-batch masks another count of end-of-document tokens). pretrain_gpt.py resuming the same save with the
  same flags on one rank logs its losses and grad norms within 1e-6 (measured 1.2e-7 and 1.2e-7), and so without
  --calculate-per-token-loss: the logged loss is the masked sum over the token count in either mode
  (training/logged_loss.py, as core_v0.19.0 training.py train_step reduces loss_func's [sum, count] pairs); the
  modes' grad norms differ by 1.2e-3 and 8.8e-5 (dense), 1.3e-4 and 7.2e-6 (MoE).
- The masked sum over the count does not depend on the layout: DP 2, CP 2 and PP 2 give one rank's losses and grad
  norms (fp32, the fuzz's tolerances 1e-5 and 1e-4; measured within 1.1e-7), with a goldfish loss's masks.
"""

from __future__ import annotations

import json
import shutil

import pytest

from scripts.tools.layout_fuzz import COMMON, GRAD_NORM_TOLERANCE, LOSS_TOLERANCE
from tests.checkpoint.test_megatron_checkpoint import FIXTURES, data_workdir, our_flags
from tests.forked_runs import logged_iterations


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["per_token", "per_micro_batch"])
@pytest.mark.parametrize("fixture", ["megatron_tp1", "megatron_moe_ep2"])
def test_a_resumed_megatron_checkpoint_trains_to_megatrons_losses_and_norms(tmp_path, monkeypatch, fixture, mode):
    import pretrain_gpt
    from tests.reliability_helpers import metrics_records, run_main

    megatron = json.loads((FIXTURES / fixture / "megatron_per_token_losses.json").read_text())["runs"]
    monkeypatch.chdir(data_workdir(tmp_path))
    checkpoint = shutil.copytree(FIXTURES / fixture, tmp_path / fixture)
    metrics = tmp_path / "metrics.jsonl"
    outcome = run_main(pretrain_gpt.main, [*our_flags(fixture), *megatron[mode]["extra_flags"], "--load", checkpoint,
                                           "--device", "cpu", "--data-cache-dir", tmp_path / "cache",
                                           "--metrics-file", metrics])
    assert outcome.code == 0, outcome.err[-3000:]
    ours = {r["iteration"]: (r["loss"], r["grad_norm"]) for r in metrics_records(metrics) if "loss" in r}
    theirs = {int(i): (megatron[mode]["losses"][i], megatron[mode]["grad_norms"][i]) for i in megatron[mode]["losses"]}
    assert sorted(ours) == sorted(theirs) == [3, 4]
    for iteration, (loss, norm) in theirs.items():
        assert ours[iteration][1] == pytest.approx(norm, rel=1e-6, abs=0), (iteration, ours, theirs)
        assert ours[iteration][0] == pytest.approx(loss, rel=1e-6, abs=0), (iteration, ours, theirs)
    # the two modes are two gradients: a per-token run equal to the other would not be one
    other = megatron["per_micro_batch" if mode == "per_token" else "per_token"]["grad_norms"]
    assert all(abs(other[i] - megatron[mode]["grad_norms"][i]) > 5e-6 * other[i] for i in other)


MODEL = ["--num-layers", "4", "--hidden-size", "64", "--num-attention-heads", "4", "--seq-length", "64",
         "--max-position-embeddings", "64", "--micro-batch-size", "2", "--global-batch-size", "8",
         "--calculate-per-token-loss", "--goldfish-loss"]


def _records(tmp_path, name: str, layout: list[str], ranks: int) -> list[tuple[float, float]]:
    """The run's (loss, grad norm) an iteration, on forked ranks (tests/forked_runs.py: a fresh launch's interpreters
    spent most of this test's time importing torch)."""
    return [(record["loss"], record["grad_norm"])
            for record in logged_iterations(tmp_path, name, [*COMMON, *MODEL, *layout], ranks)]


@pytest.mark.slow
def test_the_per_token_loss_is_one_ranks_at_dp_cp_and_pp_2(tmp_path):
    one = _records(tmp_path, "one", [], 1)
    assert len(one) == 3
    for name, layout in (("dp2", []), ("cp2", ["--context-parallel-size", "2"]),
                         ("pp2", ["--pipeline-model-parallel-size", "2"])):
        runs = _records(tmp_path, name, layout, 2)
        for (loss, norm), (one_loss, one_norm) in zip(runs, one, strict=True):
            assert abs(loss - one_loss) <= LOSS_TOLERANCE * one_loss, (name, runs, one)
            assert abs(norm - one_norm) <= GRAD_NORM_TOLERANCE * one_norm, (name, runs, one)
