"""--cp-comm-type a2a+p2p with --hierarchical-context-parallel-sizes 2 2 (issue 81 item 3's acceptance): fp32 on
gloo, CP 4 = an all-to-all over CP ranks {0,1} and {2,3} and a ring over {0,2} and {1,3} (Megatron-Core's
parallel_state.py create_hierarchical_groups; TransformerEngine's AttnFuncWithCPAndKVP2P with cp_group = [a2a, p2p]),
trains to one rank's losses and gradient norms over 4 iterations, for GPT-2, a Llama-shaped model with 2 key/value
groups (one per all-to-all rank) and --reset-position-ids --reset-attention-mask --eod-mask-loss on short documents;
and GPT-2 at CP 4 beside 2 pipeline stages (Megatron-LM's functional test of a2a+p2p), 8 ranks.

One launch of 4 ranks runs the three in turn; its grid comes from the first configuration's parallel section through
`initialize_grid`, as pretrain_gpt.py builds it. Not bitwise: the ring merges partial softmaxes and the gradients
reach the same sum over the CP ranks in another order, so fp32 rounding differs; relative 1e-6 is the bound of
tests/training/test_context_parallel_training.py for the other comm types (measured here: at most ~2e-7 on a loss).
"""

import pytest

import pretrain_gpt
from arguments.parser import parse_config
from parallel.state import destroy, initialize_grid
from tests.distributed import run_distributed
from tests.training import test_document_masking_training as documents
from tests.training.test_context_parallel_training import LLAMA, _argv, _steps
from tests.zero.test_zero_training import records

ITERS = 4
HIERARCHICAL = ["--context-parallel-size", "4", "--cp-comm-type", "a2a+p2p", "--hierarchical-context-parallel-sizes",
                "2", "2"]


def train_hierarchical_grid(rank, world_size, runs):
    """The grid of the first run's parallel section (every run shares it), the runs one after the other."""
    state = initialize_grid("cpu", parse_config(runs[0]).parallel, timeout_minutes=5)
    try:
        assert state.hierarchical_context_sizes == (2, 2)
        for argv in runs:
            pretrain_gpt.run(parse_config(argv), state)
    finally:
        destroy(state)


@pytest.mark.slow
def test_a2a_p2p_at_cp4_2x2_gives_one_ranks_losses(tmp_path, corpus_cache):
    models = {"gpt2": [], "llama": LLAMA}
    iters = ["--train-iters", str(ITERS)]
    for model, flags in models.items():
        assert pretrain_gpt.main(_argv(tmp_path, corpus_cache, f"{model}-single", *flags, *iters)) == 0
    assert pretrain_gpt.main(documents.argv(tmp_path, "documents-single", *documents.FLAGS)) == 0
    runs = [_argv(tmp_path, corpus_cache, f"{model}-hcp", *flags, *iters, *HIERARCHICAL)
            for model, flags in models.items()]
    runs.append(documents.argv(tmp_path, "documents-hcp", *documents.FLAGS, *HIERARCHICAL))
    run_distributed(train_hierarchical_grid, 4, runs, timeout=600)
    for name in models:
        got, want = _steps(tmp_path, f"{name}-hcp"), _steps(tmp_path, f"{name}-single")
        assert len(got) == len(want) == ITERS, name
        assert [loss for loss, _ in got] == pytest.approx([loss for loss, _ in want], rel=1e-6), name
        assert [norm for _, norm in got] == pytest.approx([norm for _, norm in want], rel=1e-6), name
    got, want = documents.records(tmp_path, "documents-hcp"), documents.records(tmp_path, "documents-single")
    assert len(got) == len(want) == ITERS
    assert [r["loss"] for r in got] == pytest.approx([r["loss"] for r in want], rel=1e-6)
    assert [r["grad_norm"] for r in got] == pytest.approx([r["grad_norm"] for r in want], rel=1e-6)
    # the traffic: the live run's, the planner's dry run of it (the same code on the meta device), and by hand
    live = [r["comm_bytes"]["cp"] for r in records(tmp_path / "gpt2-hcp.jsonl") if "comm_bytes" in r]
    assert len(live) == ITERS and all(record == live[0] for record in live)
    assert live[0] == _planned_bytes(runs[0]) == _counted_bytes(parse_config(runs[0]))


def _planned_bytes(argv):
    from planner.dry_run import Cluster, dry_run

    return dry_run(parse_config(argv), Cluster(4, 4, device_type="cpu"), 512).comm_bytes["cp"]


def _counted_bytes(config):
    """Per layer and micro-batch, in fp32: the all-to-all sends half of each of q, k, v [micro, heads, S/4, d] and of
    the output, and the same of their gradients; the ring (2 ranks, 2 heads, S/2 tokens) sends the K/V message once
    forward and once in backward, and its gradient accumulator twice; the loss's token count is all-reduced over the
    4 CP ranks (2 x 4 B x 3 / 4) once a micro-batch."""
    model, micro = config.model, config.training.micro_batch_size
    steps, dim = config.training.global_batch_size // micro, model.hidden_size // model.num_attention_heads
    qkv = micro * model.num_attention_heads * (model.seq_length // 4) * dim * 4
    all_to_all = 8 * qkv // 2
    message = 2 * micro * (model.num_attention_heads // 2) * (model.seq_length // 2) * dim * 4
    ring = message * 2 + 2 * message
    return {"all_reduce": steps * 6, "reduce_scatter": 0, "all_gather": 0, "broadcast": 0,
            "send": model.num_layers * steps * ring, "recv": model.num_layers * steps * ring,
            "all_to_all": model.num_layers * steps * all_to_all}


@pytest.mark.slow
def test_a2a_p2p_at_cp4_beside_two_pipeline_stages_gives_one_ranks_losses(tmp_path, corpus_cache):
    """Megatron-LM's functional test of a2a+p2p is gpt3_mcore_te_tp1_pp2_cp4_a2a_p2p_nondeterministic: CP 4 = 2 x 2
    beside 2 pipeline stages (8 gloo ranks here, one launch); a stage's sends are its CP rank's chunks."""
    iters = ["--train-iters", str(ITERS)]
    assert pretrain_gpt.main(_argv(tmp_path, corpus_cache, "single", *iters)) == 0
    run_distributed(train_hierarchical_grid, 8, [_argv(tmp_path, corpus_cache, "pp2", *iters, *HIERARCHICAL,
                                                       "--pipeline-model-parallel-size", "2")], timeout=600)
    got, want = _steps(tmp_path, "pp2"), _steps(tmp_path, "single")
    assert len(got) == len(want) == ITERS
    assert [loss for loss, _ in got] == pytest.approx([loss for loss, _ in want], rel=1e-6)
    assert [norm for _, norm in got] == pytest.approx([norm for _, norm in want], rel=1e-6)
