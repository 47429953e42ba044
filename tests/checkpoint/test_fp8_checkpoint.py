"""Delayed FP8 scaling's amax histories and scales in the checkpoint (issue 65 item 3; checkpoint/fp8_state.py).

TransformerEngine saves each module's FP8 metadata (amax_history, scale) as the module's `_extra_state` with the
model (transformer_engine/pytorch/module/base.py, get_extra_state / set_extra_state), so a Megatron resume
continues the histories. A save at iteration 2 of a delayed run (history 4, 'max': the rows, not only the last
amax, set the next scales) resumed to 4 gives the straight run's losses bit for bit; resumed without them (the
histories fresh, scale 1) it would not (checked below by dropping them from the metadata).
"""

import json

import pytest

from checkpoint.fp8_state import restore_fp8_histories

TINY = ["--device", "cpu", "--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "2",
        "--seq-length", "32", "--max-position-embeddings", "32", "--micro-batch-size", "1", "--global-batch-size", "2",
        "--train-iters", "4", "--lr", "3e-3", "--log-interval", "1", "--eval-iters", "0", "--attention-dropout", "0",
        "--hidden-dropout", "0", "--fp8-format", "hybrid", "--fp8-recipe", "delayed", "--fp8-amax-history-len", "4",
        "--fp8-amax-compute-algo", "max"]


def _losses(records):
    return [(r["iteration"], r["loss"]) for r in records if "loss" in r]


@pytest.mark.slow
def test_a_delayed_fp8_run_saved_at_2_resumes_to_the_straight_runs_losses(tmp_path, corpus_cache, capsys):
    import pretrain_gpt
    from checkpoint.format import iteration_dir_name, read_metadata
    from tests.reliability_helpers import metrics_records, straight_and_resumed

    argv = TINY + ["--data-cache-dir", corpus_cache]
    straight, split, save = straight_and_resumed(argv, tmp_path, exit_interval=2)
    assert len(_losses(straight)) == 4
    assert _losses(split) == _losses(straight)
    second = save / iteration_dir_name(2)
    metadata = read_metadata(second)
    saved = metadata["fp8_amax_history"]
    assert len(saved) == 8 and all(len(entry["amax_history"]) == 4 for entry in saved.values())  # 2 blocks x 4

    # The same resume with the histories dropped from the saved metadata: the scales restart at 1 and the losses
    # part from the straight run's, so the equality above is the histories' doing.
    del metadata["fp8_amax_history"]
    (second / "metadata.json").write_text(json.dumps(metadata))
    fresh = tmp_path / "fresh.jsonl"
    capsys.readouterr()
    assert pretrain_gpt.main(argv + ["--metrics-file", str(fresh), "--load", str(second)]) == 0
    assert "holds no FP8 amax history for 8 delayed-scaling linears of this run" in capsys.readouterr().out
    resumed = _losses(metrics_records(fresh))
    assert [iteration for iteration, _ in resumed] == [3, 4] and resumed != _losses(straight)[2:]


def test_the_metadata_schema_takes_the_histories_and_refuses_a_bad_one():
    from checkpoint.schema import OPTIONAL

    good = {"blocks.0.mlp.dense_h_to_4h": {"amax_history": [[0, 1065353216, -1]], "scale": [1065353216] * 3}}
    meaning, check = OPTIONAL["fp8_amax_history"]
    assert check(good)
    assert not check({"x": {"amax_history": [[0, 1]], "scale": [0, 0, 0]}})  # a row of 2, not 3 roles
    assert not check({"x": {"amax_history": [[0.5, 0, 0]], "scale": [0, 0, 0]}})  # bits are integers
    assert not check({"x": {"amax_history": [[2 ** 31, 0, 0]], "scale": [0, 0, 0]}})  # beyond int32
    assert "linear name" in meaning


def test_a_history_of_another_length_is_cut_or_padded_as_te_does_and_a_missing_one_named():
    """TE's adjust_amax_history_length (module/base.py): the first rows kept, or zero rows appended."""
    import torch
    from torch import nn

    from parallel.fp8.linear import Fp8LinearState
    from parallel.fp8.recipes import Fp8Recipe

    model = nn.Module()
    model.linear = nn.Linear(2, 2)
    model.linear.fp8_state = Fp8LinearState(Fp8Recipe(recipe="delayed", amax_history_len=2))
    delayed = model.linear.fp8_state.delayed
    assert restore_fp8_histories(model, {}) == ["linear"]
    one_row = torch.tensor([[2.0, 3.0, 4.0]])
    scale = torch.tensor([0.5, 8.0, 1.0])
    assert restore_fp8_histories(model, {"linear": {"amax_history": one_row.view(torch.int32).tolist(),
                                                    "scale": scale.view(torch.int32).tolist()}}) == []
    assert torch.equal(delayed.amax_history, torch.tensor([[2.0, 3.0, 4.0], [0.0, 0.0, 0.0]]))
    assert torch.equal(delayed.scale, scale)
    three_rows = torch.tensor([[float("inf"), float("nan"), 0.0], [1.0, 2.0, 3.0], [5.0, 6.0, 7.0]])
    restore_fp8_histories(model, {"linear": {"amax_history": three_rows.view(torch.int32).tolist(),
                                             "scale": scale.view(torch.int32).tolist()}})
    # the first two rows, bit for bit, inf and NaN included (JSON numbers would carry neither)
    assert torch.equal(delayed.amax_history.view(torch.int32), three_rows[:2].view(torch.int32))


@pytest.mark.slow
def test_a_megatron_torch_dist_save_says_it_leaves_the_histories_out(tmp_path, corpus_cache, capsys):
    """Megatron-LM's layout keeps them in TE's pickled _extra_state, which checkpoint/torch_dist/writer.py does not
    write: the launch trains (Megatron-LM's fp8_no_model_parallel functional test gives this pair) and says so."""
    import pretrain_gpt

    argv = TINY + ["--data-cache-dir", corpus_cache, "--train-iters", "1", "--save", str(tmp_path / "ckpt"),
                   "--ckpt-format", "torch_dist", "--metrics-file", str(tmp_path / "m.jsonl")]
    assert pretrain_gpt.main(argv) == 0
    out = capsys.readouterr().out
    assert "without delayed FP8 scaling's amax histories (TransformerEngine's _extra_state)" in out
