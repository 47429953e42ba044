"""--sequence-parallel in the model: the same losses and gradients as without it (GPT-2 and Llama-shaped
blocks), the same TP bytes, dropout masks private to each TP rank in the split regions, and the flag's
checks. The reference is Megatron-Core (github:NVIDIA/Megatron-LM):
- tensor_parallel/mappings.py: _ScatterToSequenceParallelRegion (split; backward all-gather),
  _GatherFromSequenceParallelRegion (all-gather; backward with tensor_parallel_output_grad reduce-scatter),
  _ReduceScatterToSequenceParallelRegion (reduce-scatter; backward all-gather), along dim 0 of its [s, b, h]
  tensors; ours are [b, s, h], so dim 1.
- tensor_parallel/layers.py: ColumnParallelLinear with sequence_parallel all-gathers its input
  (LinearWithGradAccumulationAndAsyncCommunication), RowParallelLinear reduce-scatters its output and asserts
  input_is_parallel.
- embeddings/language_model_embedding.py: `reduce_scatter_embeddings` when nothing is added after the lookup, else
  `scatter_to_sequence_parallel_region` after the position embedding, the embedding dropout under
  `get_cuda_rng_tracker().fork()`.
- transformer/transformer_block.py: the layers run under `get_cuda_rng_tracker().fork()` when
  config.sequence_parallel.
- distributed/finalize_model_grads.py (_allreduce_layernorm_grads, the `sequence_parallel` attribute): the norms'
  gradients all-reduced over the TP group."""

import dataclasses

import pytest
import torch

from arguments.config import ModelConfig
from arguments.parser import parse_arguments, parse_config
from base.errors import ConfigError
from base.options import replace_settings
from gpt.model import TransformerBlock, build_gpt_model
from gpt.parallel_plan import TensorParallelPlan
from gpt.shape import model_shape
from parallel.comm import ring_bytes_sent
from parallel.mesh import ParallelDims
from parallel.random import TensorParallelRNG
from parallel.state import ParallelState, destroy, initialize
from tests.distributed import run_distributed
from zero.memory import predict_saved_activation_bytes

SEED, BATCH, SEQ, TP = 3, 2, 16, 2
GPT2 = ModelConfig.of(num_layers=2, hidden_size=32, num_attention_heads=4, seq_length=SEQ,
                   max_position_embeddings=SEQ, vocab_size=96, hidden_dropout=0.0, attention_dropout=0.0)
LLAMA = replace_settings(GPT2, normalization="RMSNorm", swiglu=True, position_embedding_type="rope",
                            num_query_groups=2, untie_embeddings_and_output_weights=True, add_bias_linear=False)
MODELS = {"gpt2": GPT2, "llama": LLAMA}


def _train_once(config, state, tokens, sequence_parallel):
    model = build_gpt_model(config, state, seed=SEED, rng=TensorParallelRNG(SEED, state),
                            plan=TensorParallelPlan(state, sequence_parallel))
    state.comm.stats.snapshot_and_reset()
    loss = model(tokens[:, :-1], tokens[:, 1:]).mean()
    loss.backward()
    # The replicated parameters that meet a slice of the sequence: norms and row-parallel biases.
    summed_bytes = sum(p.numel() * p.element_size() for p in model.parameters() if getattr(p, "sequence_parallel", False))
    return {"loss": loss.item(), "grads": {name: p.grad.numpy().copy() for name, p in model.named_parameters()},
            "tp": state.comm.stats.snapshot()["tp"], "summed_bytes": summed_bytes}


def compare_with_and_without(rank, world_size):
    state = initialize("cpu", TP)
    try:
        tokens = torch.randint(0, GPT2.vocab_size, (BATCH, SEQ + 1), generator=torch.Generator().manual_seed(SEED))
        return {name: {sp: _train_once(config, state, tokens, sp)
                       for sp in (False, True)}
                for name, config in MODELS.items()}
    finally:
        destroy(state)


@pytest.fixture(scope="module")
def with_and_without():
    return run_distributed(compare_with_and_without, TP, timeout=300)


@pytest.mark.parametrize("name", MODELS)
def test_losses_and_gradients_equal_the_run_without_it(with_and_without, name):
    for rank, runs in enumerate(with_and_without):
        plain, split = runs[name][False], runs[name][True]
        assert abs(split["loss"] - plain["loss"]) <= 1e-6 * abs(plain["loss"]), (name, rank)
        # Every gradient, the norms' (summed over the ranks' sequence slices) and the position
        # embedding's (whole through the scatter's all-gather) included.
        for parameter, grad in plain["grads"].items():
            torch.testing.assert_close(torch.from_numpy(split["grads"][parameter]), torch.from_numpy(grad),
                                       rtol=1e-5, atol=1e-7,
                                       msg=f"{name} rank {rank} {parameter}")


@pytest.mark.parametrize("name", MODELS)
def test_tp_bytes_equal_the_run_without_it(with_and_without, name):
    """Each all-reduce becomes a reduce-scatter and an all-gather of the same tensor: the same ring bytes.
    What SP adds is counted apart: the all-reduce of the gradients of the parameters that see a slice of
    the sequence, norms and row-parallel biases (Megatron's _allreduce_layernorm_grads over the parameters
    marked `sequence_parallel`)
    and, with learned positions, the all-gather of the embedding gradient through the scatter that
    follows the position embedding (Megatron adds positions before splitting, as here); and, as Megatron's
    LinearWithGradAccumulationAndAsyncCommunication, the all-gather again in backward of each column-parallel
    entry's input (a block's attention and MLP, the output layer), kept as this rank's slice in between."""
    plain, split = with_and_without[0][name][False]["tp"], with_and_without[0][name][True]["tp"]
    assert plain["reduce_scatter"] == plain["all_gather"] == 0
    summed = with_and_without[0][name][True]["summed_bytes"]
    assert summed > 0
    hidden_bytes = BATCH * SEQ * GPT2.hidden_size * 4
    regathered = ring_bytes_sent("all_gather", hidden_bytes, TP) * (2 * GPT2.num_layers + 1)
    added = ring_bytes_sent("all_reduce", summed, TP) + regathered
    if name == "gpt2":
        added += ring_bytes_sent("all_gather", hidden_bytes, TP)
    assert sum(split.values()) == sum(plain.values()) + added
    # Every all-gather into a TP region has its reduce-scatter out of one (and the cross entropy's and the
    # learned-position embedding's all-reduces stay all-reduces).
    assert split["all_gather"] - (added - ring_bytes_sent("all_reduce", summed, TP)) == split["reduce_scatter"]
    assert split["reduce_scatter"] > 0


def _tp_rank_state(tp_rank: int) -> ParallelState:
    # Dropout needs only the rank and the tracker: TP ranks can be played in one process.
    return ParallelState(device=torch.device("cpu"), dims=ParallelDims.of_rank(tp_rank, {"tp": TP}))


def _residual_dropout_mask(tp_rank: int, sequence_parallel: bool) -> torch.Tensor:
    config = dataclasses.replace(GPT2, hidden_dropout=0.5)
    state = _tp_rank_state(tp_rank)
    block = TransformerBlock(config, TensorParallelPlan(state, sequence_parallel), TensorParallelRNG(SEED, state))
    return block._residual_dropout(torch.ones(BATCH, SEQ // TP, GPT2.hidden_size))


def test_dropout_masks_in_split_regions_differ_across_tp_ranks():
    # Split: each rank holds another slice of the sequence, so equal masks would correlate them.
    assert not torch.equal(_residual_dropout_mask(0, True), _residual_dropout_mask(1, True))
    # Not split: the residual stream is the same on every TP rank, and so must its mask be.
    assert torch.equal(_residual_dropout_mask(0, False), _residual_dropout_mask(1, False))


def test_a_sequence_not_divisible_by_tp_is_refused_in_one_line():
    with pytest.raises(ConfigError) as error:
        parse_config(["--sequence-parallel", "--tensor-model-parallel-size", "2", "--seq-length", "33",
                      "--max-position-embeddings", "64"])
    message = str(error.value)
    assert "\n" not in message and "--seq-length 33" in message and "--tensor-model-parallel-size 2" in message


def test_with_tp_1_it_is_accepted_and_said_once():
    notes = parse_arguments(["--sequence-parallel"]).notes
    assert sum("--sequence-parallel" in note for note in notes) == 1
    assert parse_arguments(["--sequence-parallel", "--tensor-model-parallel-size", "2"]).config.parallel.sequence_parallel


@pytest.mark.parametrize("name", MODELS)
def test_the_predicted_activations_per_rank_hold_1_over_tp_of_the_split_regions(name):
    """Korthikanti et al. 2022, section 4.2.2: the norms' inputs (2 bytes per element at 16 bits, two norms; an
    RMSNorm its fp32 rsqrt per token besides: gpt/rms_norm_backward.py), the residual dropout masks (1 byte, two
    branches) and, as Megatron keeps them, the column-parallel linears' inputs (2 bytes each: QKV and fc1, or QKV,
    gate and up, counted apart) are in the split regions, of which each rank now keeps 1/TP."""
    config = MODELS[name]
    plain = model_shape(config, TP).activations
    split = model_shape(config, TP, sequence_parallel=True).activations
    rms = config.norms.normalization == "RMSNorm"
    column_parallel_linears = 3 if rms else 2
    split_regions = 2 * (2 * config.hidden_size + (4 if rms else 0)) + 2 * config.hidden_size + \
        column_parallel_linears * 2 * config.hidden_size
    assert plain.replicated_bytes_per_token - split.replicated_bytes_per_token == split_regions
    assert split.partitioned_bytes_per_token - plain.partitioned_bytes_per_token == split_regions
    per_rank = {terms: predict_saved_activation_bytes(
        config.num_layers, SEQ, BATCH, config.hidden_size, config.num_attention_heads, 2, TP, None, False,
        layer=terms)["per_layer_without_recompute"] for terms in (plain, split)}
    assert per_rank[plain] - per_rank[split] == SEQ * BATCH * split_regions * (TP - 1) // TP
    # With TP 1 the flag splits nothing.
    assert model_shape(config, 1, sequence_parallel=True).activations == \
        model_shape(config, 1).activations
