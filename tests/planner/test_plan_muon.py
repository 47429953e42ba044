"""The planner counts --optimizer muon's states as the live optimizer holds them (zero/muon.py): Muon's momentum
is kept in Adam's exp_avg at the Muon matrices' elements and exp_avg_sq stays whole beside it, so 8 bytes per
partition element beside the fp32 master, Adam's two (Megatron-LM's TensorParallelMuon keeps only a momentum
per Muon parameter, 4 bytes: ours keeps the unused second moment, which this plan says)."""

import json

from arguments.config import OptimizerConfig
from parallel.state import destroy, initialize
from planner import plan as planner_cli
from tests.zero.test_zero_distributed import tiny_gpt2
from tests.zero_harness import ZeroHarness
from zero.config import ZeroConfig
from zero.memory import measure_tensor_bytes, predict_model_state_bytes

SMALL = ["--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4", "--seq-length", "32",
         "--max-position-embeddings", "32", "--micro-batch-size", "2", "--global-batch-size", "8"]


def test_the_dry_run_plans_muon(capsys):
    assert planner_cli.main(["dry-run", "--world-size", "2", "--json", *SMALL, "--zero-stage", "1",
                             "--optimizer", "muon"]) == 0
    states = json.loads(capsys.readouterr().out)["model_state_bytes"]
    assert states["optimizer_states"] == 2 * states["master_weights"] > 0


def test_the_prediction_is_what_the_live_muon_optimizer_holds():
    state = initialize("cpu", 1)
    try:
        model = tiny_gpt2()
        zero = ZeroHarness(model, OptimizerConfig(optimizer="muon"), ZeroConfig(stage=1), state,
                           muon_excluded_params=[model.transformer.wte.weight, model.transformer.wpe.weight])
        assert zero.sharded.optimizer_name == "muon" and zero.sharded._muon
        measured = measure_tensor_bytes(zero.sharded.model_state_tensors())
        predicted = predict_model_state_bytes(zero.sharded.num_parameters, 1, 1, "fp32", optimizer="muon")
        assert predicted["optimizer_states"] == 8 * zero.sharded.num_parameters
        assert measured["optimizer_states"] == 8 * (zero.sharded.num_parameters + zero.sharded.padding)
    finally:
        destroy(state)


def test_the_dry_run_counts_muons_tp_collectives_per_mode(capsys):
    """The dry run steps Muon on the meta device (ShardedAdamW.step_collectives_only), so its collectives over TP
    are the plan's: duplicated all-gathers each TP-cut matrix whole in fp32 (emerging_optimizers' newton_schulz_tp:
    all_gather, then NS), blockwise gathers nothing, distributed all-reduces the squared norm (fp32) and each
    step's A = X X^T (bf16 under --muon-fp32-matmul-prec medium) of the kept dimension, 64 x 64 here."""
    def tp_bytes(mode):
        assert planner_cli.main(["dry-run", "--world-size", "2", "--json", *SMALL, "--optimizer", "muon",
                                 "--tensor-model-parallel-size", "2", "--muon-tp-mode", mode]) == 0
        return json.loads(capsys.readouterr().out)["comm_bytes"]["tp"]

    blockwise, duplicated, distributed = (tp_bytes(mode) for mode in ("blockwise", "duplicated", "distributed"))
    hidden = 64
    # per block: QKV (3h x h, its query, key and value blocks gathered apart), dense (h x h), the MLP's two 4h x h
    whole = 2 * (3 * hidden * hidden + hidden * hidden + 2 * 4 * hidden * hidden)
    assert blockwise["all_gather"] == 0
    assert duplicated["all_gather"] == whole * 4 // 2  # ring all-gather: (N - 1) / N of the output
    ns_calls = 2 * (3 + 1 + 2)  # per block: the three QKV blocks, dense, the MLP's two
    assert distributed["all_reduce"] - blockwise["all_reduce"] == ns_calls * (4 + 5 * hidden * hidden * 2)
    assert duplicated["all_reduce"] == blockwise["all_reduce"]
