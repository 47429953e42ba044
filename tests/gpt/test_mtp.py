"""Megatron-Core's multi-token prediction (--mtp-num-layers, --mtp-loss-scaling-factor; gpt/mtp.py) against a
hand-written reference of its formula (github:NVIDIA/Megatron-LM megatron/core/transformer/multi_token_prediction.py:
MultiTokenPredictionLayer._get_embeddings / _concat_embeddings / _proj_and_transformer_layer / _postprocess,
roll_tensor, process_mtp_loss, MTPLossAutoScaler; megatron/core/models/gpt/gpt_model.py _postprocess), and its wiring.
"""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
import torch.nn.functional as F

from arguments.parser import parse_config
from base.errors import ConfigError
from base.options import replace_settings
from gpt.model import build_gpt_model
from parallel.state import ParallelState
from tests.gpt.test_llama_blocks import tiny_config
from tests.reliability_helpers import metrics_records, train

SINGLE = ParallelState(device=torch.device("cpu"))


def _layer_norm(norm, x):
    return F.layer_norm(x, (x.shape[-1],), norm.weight, norm.bias, norm.eps)


def reference_losses(model, tokens, labels, scaling_factor, num_mtp):
    """Megatron's forward written out by hand on `model`'s weights (GPT-2 blocks, learned positions, tied output):
    the LM loss mean plus, per MTP layer k, mtp_loss_scaling_factor / N * sum(mask_k CE_k) / sum(mask_k), and
    each layer's logged value sum(mask_k CE_k) / sum(mask_k)."""
    emb, pos = model.word_embeddings.weight, model.position_embeddings.weight
    vocab = model.config.vocab_size

    def embed(ids, positions):
        return emb[ids] + pos[positions]

    def ce(hidden, target):
        logits = (hidden @ emb.t())[..., :vocab]
        return F.cross_entropy(logits.reshape(-1, vocab), target.reshape(-1), reduction="none").view(target.shape)

    def roll(t):  # roll_tensor(shifts=-1, dims=-1): the last position filled with 0
        out = torch.roll(t, -1, -1)
        out[..., -1] = 0
        return out

    batch, seq = tokens.shape
    positions = torch.arange(seq).expand(batch, -1)
    hidden = embed(tokens, positions)
    for block in model.blocks:
        hidden = block(hidden)
    hidden = _layer_norm(model.final_layernorm, hidden)
    total = ce(hidden, labels).mean()
    mask, ids, mtp_labels, logged = torch.ones(batch, seq), tokens, labels, []
    for layer in model.mtp_layers:
        ids, positions = roll(ids), roll(positions)
        e = _layer_norm(layer.enorm, embed(ids, positions))
        h = _layer_norm(layer.hnorm, hidden)
        x = torch.cat((e, h), -1) @ layer.eh_proj.weight.t()   # [embedding, hidden] -> h, no bias
        hidden = _layer_norm(layer.final_layernorm, layer.transformer_layer(x))
        mtp_labels, mask = roll(mtp_labels), roll(mask)
        value = (ce(hidden, mtp_labels) * mask).sum() / mask.sum()
        logged.append(value.item())
        total = total + scaling_factor / num_mtp * value
    return total, logged


@pytest.mark.parametrize("num_mtp", [1, 2])
def test_mtp_loss_and_gradients_equal_megatrons_formula(num_mtp):
    config = tiny_config(mtp_num_layers=num_mtp, mtp_loss_scaling_factor=0.3)
    model = build_gpt_model(config, SINGLE, seed=3).train()
    assert len(model.mtp_layers) == num_mtp
    data = torch.randint(0, config.vocab_size, (2, config.seq_length + 1), generator=torch.Generator().manual_seed(0))
    tokens, labels = data[:, :-1], data[:, 1:]
    model.mtp_tracker.begin_iteration(1.0)
    ours = model(tokens, labels).mean()
    ours.backward()
    ours_grads = {name: p.grad.clone() for name, p in model.named_parameters()}
    logged = model.mtp_tracker.sums(torch.device("cpu")).tolist()
    model.zero_grad()
    reference, reference_logged = reference_losses(model, tokens, labels, 0.3, num_mtp)
    reference.backward()
    # the LM loss's value is the LM's alone; the MTP losses enter only the gradients
    lm_only = build_gpt_model(tiny_config(), SINGLE, seed=3)
    with torch.no_grad():
        assert ours.item() == pytest.approx(lm_only(tokens, labels).mean().item(), abs=1e-6)
    assert logged == pytest.approx(reference_logged, rel=1e-5)
    for name, p in model.named_parameters():
        assert torch.allclose(ours_grads[name], p.grad, atol=1e-6, rtol=1e-4), name
    assert any(ours_grads[name].abs().sum() > 0 for name in ours_grads if name.startswith("mtp_layers."))


def test_mtp_backward_scale_multiplies_only_the_mtp_gradient():
    """MTPLossAutoScaler's backward gives the MTP loss the main loss's scale (loss scale / micro-batches)."""
    config = tiny_config(mtp_num_layers=1)
    model = build_gpt_model(config, SINGLE, seed=3).train()
    data = torch.randint(0, config.vocab_size, (2, config.seq_length + 1), generator=torch.Generator().manual_seed(1))
    grads = []
    for scale in (1.0, 4.0):
        model.zero_grad()
        model.mtp_tracker.begin_iteration(scale)
        (model(data[:, :-1], data[:, 1:]).mean() * scale).backward()
        grads.append(model.mtp_layers[0].eh_proj.weight.grad.clone())
    assert torch.allclose(grads[1], 4.0 * grads[0], rtol=1e-5, atol=1e-8)


def test_mtp_flags_parse_and_what_is_not_built_is_refused():
    config = parse_config(["--mtp-num-layers", "2", "--mtp-loss-scaling-factor", "0.5"]).model
    assert (config.mtp.num_layers, config.mtp.loss_scaling_factor) == (2, 0.5)
    assert parse_config([]).model.mtp.num_layers == 0
    with pytest.raises(ConfigError, match="--mtp-num-layers 1 with --pipeline-model-parallel-size 2 and learned "):
        parse_config(["--mtp-num-layers", "1", "--pipeline-model-parallel-size", "2", "--num-layers", "2"])
    assert parse_config(["--mtp-num-layers", "1", "--pipeline-model-parallel-size", "2", "--num-layers", "2",
                         "--position-embedding-type", "rope"]).model.mtp.num_layers == 1
    with pytest.raises(ConfigError, match="--mtp-detach-heads"):
        parse_config(["--mtp-num-layers", "1", "--mtp-detach-heads"])
    from checkpoint.hf.folders import check_convertible

    with pytest.raises(ConfigError, match="--mtp-num-layers 1 is not implemented: transformers' GPT-2 and Llama"):
        check_convertible(tiny_config(mtp_num_layers=1), "the Hugging Face export")
    assert parse_config(["--mtp-num-layers", "1", "--context-parallel-size", "2",
                         "--seq-length", "128"]).parallel.context_parallel_size == 2  # built: gpt/mtp.py


MTP_FLAGS = ["--mtp-num-layers", "1", "--seed", "5", "--hidden-dropout", "0", "--attention-dropout", "0"]


def test_an_mtp_run_logs_mtp_1_loss_and_trains(corpus_cache, tmp_path):
    outcome = train(corpus_cache, tmp_path, "--train-iters", "2", *MTP_FLAGS)
    assert outcome.code == 0, outcome.err[-3000:]
    records = [r for r in metrics_records(tmp_path / "metrics.jsonl") if "loss" in r]
    assert len(records) == 2 and all(math.isfinite(r["mtp_1 loss"]) and r["mtp_1 loss"] > 0 for r in records)
    assert "mtp_1 loss:" in outcome.out


def test_an_mtp_run_saved_and_resumed_continues_exactly(corpus_cache_300, tmp_path):
    """The MTP layers are parameters under their own names (mtp_layers.k.*): a save at iteration 2 resumes to the
    straight run's losses, bitwise."""
    from tests.reliability_helpers import TINY, straight_and_resumed

    argv = TINY + MTP_FLAGS + ["--train-iters", "4", "--data-cache-dir", corpus_cache_300]
    straight, split, _ = straight_and_resumed(argv, tmp_path, exit_interval=2)
    assert len(straight) == 4
    assert [(r["iteration"], r["loss"], r["mtp_1 loss"]) for r in straight] == \
        [(r["iteration"], r["loss"], r["mtp_1 loss"]) for r in split]


def test_shape_counts_the_mtp_layers_parameters_and_flops():
    """gpt/shape.py: parameters are every parameter of the built model; FLOPs as Megatron-LM's
    num_floating_point_operations (megatron/training/training.py) counts MTP: each MTP layer a layer of the last
    layer's kind, its eh_proj 2h x h, and one more logits matmul per MTP layer (`* (mtp_num_layers + 1)`)."""
    from tests.gpt.test_moe import tiny_moe
    from training.metrics import active_parameter_count, flops_per_iteration, parameter_count

    vocab = 128
    dense = tiny_config(vocab_size=vocab, pad_vocab_size_to=vocab)
    for config in (dense, dataclasses.replace(tiny_moe(moe_layer_freq="([0]+[1]*1)"), vocab_size=vocab,
                                                    pad_vocab_size_to=vocab)):
        base = build_gpt_model(config, SINGLE, seed=5)
        with_mtp = build_gpt_model(replace_settings(config, mtp_num_layers=2), SINGLE, seed=5)
        mtp_config = replace_settings(config, mtp_num_layers=2)
        assert parameter_count(mtp_config, vocab) == sum(p.numel() for p in with_mtp.parameters())
        extra = parameter_count(mtp_config, vocab) - parameter_count(config, vocab)
        assert active_parameter_count(mtp_config, vocab) - active_parameter_count(config, vocab) == \
            extra - (sum(p.numel() for p in base.blocks[-1].parameters()) - _active(base.blocks[-1], config)) * 2
    h, s = dense.hidden_size, dense.seq_length
    block = 2 * (h * 3 * h + h * h) + 4 * s * h + 2 * 2 * h * 4 * h
    logits = 2 * h * vocab
    mtp_config = replace_settings(dense, mtp_num_layers=2)
    assert flops_per_iteration(mtp_config, 3, padded_vocab_size=vocab) == 3 * 3 * s * (
        (2 + 2) * block + 2 * 2 * 2 * h * h + 3 * logits)


def _active(block, config):
    """One block's parameters a token uses: all of a dense block's; k of an MoE block's experts."""
    mlp = block.mlp
    if not hasattr(mlp, "experts"):
        return sum(p.numel() for p in block.parameters())
    experts = list(mlp.experts.children())
    per_expert = sum(p.numel() for p in experts[0].parameters())
    return sum(p.numel() for p in block.parameters()) - (len(experts) - config.moe.router_topk) * per_expert


def _tp2_against_tp1(rank, world_size, sequence_parallel):
    from gpt.parallel_plan import tensor_parallel_plan
    from parallel.config import ParallelismConfig
    from parallel.state import destroy, initialize
    from tests.gpt.test_llama_blocks import check_gradients_are_tp1_slices, tokens_for

    state = initialize("cpu", tensor_parallel_size=2)
    try:
        differences = {}
        for swiglu in (False, True):
            config = tiny_config(mtp_num_layers=2, add_bias_linear=False, swiglu=swiglu, normalization="RMSNorm" if swiglu else "LayerNorm")
            plan = tensor_parallel_plan(state, ParallelismConfig(tensor_model_parallel_size=2,
                                                                 sequence_parallel=sequence_parallel))
            ours = build_gpt_model(config, state, seed=11, plan=plan).train()
            reference = build_gpt_model(config, SINGLE, seed=11).train()
            tokens = tokens_for(config)
            check_gradients_are_tp1_slices(ours, reference, tokens, state)
            logged = [model.mtp_tracker.sums(torch.device("cpu")) for model in (ours, reference)]
            differences[swiglu] = (logged[0] - logged[1]).abs().max().item()
        return differences
    finally:
        destroy(state)


@pytest.mark.parametrize("sequence_parallel", [False, True])
def test_mtp_at_tp2_equals_tp1(sequence_parallel):
    """The MTP layer under TP as Megatron-Core builds it (MultiTokenPredictionLayer: eh_proj a ColumnParallelLinear
    with gather_output=False, its output gathered over TP and, under sequence parallelism, scattered along the
    sequence; the norms in the split regions): each rank's gradients are its slices of TP 1's, the logged MTP
    losses equal."""
    from tests.distributed import run_distributed

    for per_rank in run_distributed(_tp2_against_tp1, 2, sequence_parallel, timeout=300):
        assert all(difference <= 1e-5 for difference in per_rank.values()), per_rank


@pytest.mark.parametrize("untied,layout", [(False, None), (True, None), (True, "Et|tt|t|mL")])
def test_mtp_on_the_last_of_two_pipeline_stages_logs_the_one_stage_losses(corpus_cache_300, tmp_path, untied, layout):
    """Megatron-Core places the MTP block on the last pipeline stage (mtp_on_this_rank) with its own copy of the word
    embedding, tied to the first stage's (tie_word_embeddings_state_dict; finalize_model_grads sums the copies'
    gradients over the embedding group), also with an untied output layer, and on the last chunk of an interleaved
    --pipeline-model-parallel-layout. Two stages log the one-stage run's LM loss, gradient norm and mtp_1 loss."""
    import json

    import pretrain_gpt
    from tests.distributed import free_port, run_distributed
    from tests.reliability_helpers import TINY
    from tests.training.test_moe_training import launch_rank

    flags = TINY + MTP_FLAGS + ["--num-layers", "2" if layout is None else "4", "--position-embedding-type", "rope",
                                "--train-iters", "3", "--data-cache-dir", corpus_cache_300] + \
        (["--untie-embeddings-and-output-weights"] if untied else [])
    staged_flags = ["--pipeline-model-parallel-size", "2"] + \
        ([] if layout is None else ["--pipeline-model-parallel-layout", layout])  # interleaved: 2 chunks a stage
    if layout is not None:  # the interleaved schedule takes a multiple of PP micro-batches
        flags += ["--global-batch-size", "4"]
    single, staged = tmp_path / "single.jsonl", tmp_path / "pp2.jsonl"
    assert pretrain_gpt.main(flags + ["--metrics-file", str(single)]) == 0
    run_distributed(launch_rank, 2, [flags + staged_flags + ["--metrics-file", str(staged)]], [free_port()], timeout=300)

    def logged(path):
        return [value for r in map(json.loads, path.read_text().splitlines()) if "loss" in r and "split" not in r
                for value in (r["loss"], r["grad_norm"], r["mtp_1 loss"])]

    assert len(logged(single)) == 3 * 3
    assert logged(staged) == pytest.approx(logged(single), rel=1e-6, abs=0)


def test_mtp_under_zero_1_2_3_on_two_data_parallel_ranks_trains_as_zero_0(corpus_cache_300, tmp_path):
    """The MTP layers are ordinary parameters to ZeRO (at stage 3 in the root chunk, gathered for the whole forward):
    ZeRO 1, 2 and 3 over two data-parallel ranks log ZeRO 0's LM and mtp_1 losses (the latter averaged over the
    ranks, as MTPLossLoggingHelper reduces it over the data-parallel group)."""
    import json

    from tests.distributed import free_port, run_distributed
    from tests.reliability_helpers import TINY
    from tests.training.test_moe_training import launch_rank

    common = TINY + MTP_FLAGS + ["--global-batch-size", "4", "--train-iters", "3", "--data-cache-dir",
                                 corpus_cache_300]
    stages = ("0", "1", "2", "3")
    argv = [common + ["--zero-stage", stage, "--metrics-file", str(tmp_path / f"zero{stage}.jsonl")] for stage in stages]
    run_distributed(launch_rank, 2, argv, [free_port() for _ in stages], timeout=600)

    def logged(stage):
        return [value for r in map(json.loads, (tmp_path / f"zero{stage}.jsonl").read_text().splitlines())
                if "loss" in r and "split" not in r for value in (r["loss"], r["mtp_1 loss"])]

    assert len(logged("0")) == 3 * 2
    for stage in stages[1:]:
        assert logged(stage) == pytest.approx(logged("0"), rel=1e-5, abs=0), stage
