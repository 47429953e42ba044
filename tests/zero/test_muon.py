"""--optimizer muon: Megatron-LM's Muon (zero/muon.py).

NVIDIA/Megatron-LM (main):
- megatron/core/optimizer/emerging_optimizers.py `TensorParallelMuon.__init__` (scaled_orthogonalize_fn: newton_schulz
  then get_muon_scale_factor(size[0], size[1], scale_mode) * extra_scale_factor), `TensorParallelMuon.orthogonalize`
  (split_qkv: the grad viewed as [groups, sum(split), in], split on dim 1, each block reshaped to 2-D and
  orthogonalized), `_is_muon_excluded` (use_muon False, embedding/output, or not 2-D -> Adam);
- megatron/training/arguments.py: --muon-momentum 0.9, --muon-no-split-qkv (split by default), --muon-nesterov
  off, --muon-scale-mode spectral, --muon-fp32-matmul-prec medium, --muon-coefficient-type quintic,
  --muon-num-ns-steps 5, --muon-tp-mode duplicated, --muon-extra-scale-factor 1.0, --muon-scalar-optimizer adam.
NVIDIA-NeMo/Emerging-Optimizers (which Megatron imports): orthogonalized_optimizer.py `OrthogonalizedOptimizer.step`
(decoupled decay p -= lr wd p; exp_avg.lerp_(grad, 1 - beta); nesterov grad.lerp(exp_avg, beta); p -= lr O),
muon_utils.py `newton_schulz` (normalize, transpose if rows > cols, bf16 under "medium", X = aX + (bA + cAA)X with
the quintic sets), muon.py `get_muon_scale_factor` (spectral: max(out, in) ** 0.5).
"""

from __future__ import annotations

import pytest
import torch

from arguments.config import OptimizerConfig
from parallel.state import destroy, initialize
from tests.distributed import run_distributed
from tests.zero.test_zero_distributed import SEQ, VOCAB, tiny_gpt2
from tests.zero_harness import ZeroHarness
from zero.config import ZeroConfig

QUINTIC = [(4.0848, -6.8946, 2.9270), (3.9505, -6.3029, 2.6377), (3.7418, -5.5913, 2.3037),
           (2.8769, -3.1427, 1.2046), (2.8366, -3.0525, 1.2012)]


def reference_newton_schulz(x, steps=5, bf16=True):
    """emerging_optimizers muon_utils.newton_schulz (quintic), its statements written out."""
    transpose = x.size(-2) > x.size(-1)
    if transpose:
        x = x.mT
    X = torch.nn.functional.normalize(x, p=2, dim=(-2, -1), eps=1e-7)
    if bf16:
        X = X.to(torch.bfloat16)
    for i in range(steps):
        a, b, c = (QUINTIC * (steps // 5))[i]
        A = X @ X.mT
        B = torch.addmm(A, A, A, alpha=c, beta=b)
        X = torch.addmm(X, B, X, alpha=1.0, beta=a)
    X = X.to(torch.float32)
    return X.mT if transpose else X


def reference_muon(weight, grads, lr, wd, beta, nesterov, split=None, bf16=True):
    """OrthogonalizedOptimizer.step over `grads` with TensorParallelMuon's scaled orthogonalization."""
    p, exp_avg = weight.clone(), torch.zeros_like(weight)
    for grad in grads:
        p.add_(p, alpha=-(wd * lr))
        exp_avg.lerp_(grad, 1 - beta)
        update = grad.lerp(exp_avg, beta) if nesterov else exp_avg
        if split is None:
            orth = reference_newton_schulz(update, bf16=bf16) * max(update.shape) ** 0.5
        else:
            rows, cols = update.shape
            groups = rows // sum(split)
            blocks = torch.split(update.view(groups, sum(split), cols), split, dim=1)
            done = []
            for block in blocks:
                g = block.reshape(-1, cols)
                done.append((reference_newton_schulz(g, bf16=bf16) * max(g.shape) ** 0.5).view(groups, -1, cols))
            orth = torch.cat(done, dim=1).view(rows, cols)
        p.add_(orth, alpha=-lr)
    return p, exp_avg


@pytest.mark.parametrize("nesterov,split,bf16", [(False, None, True), (True, None, True), (False, [4, 2, 2], True),
                                                  (True, None, False)])
def test_our_muon_step_is_megatrons_formula_over_four_steps(nesterov, split, bf16):
    """Four steps of a 24 x 16 matrix (rows > columns: the transposed orientation), weight decay 0.1: ours equals
    the formula above bit for bit; with the QKV split (3 groups of 4 query, 2 key, 2 value rows) block by block;
    with --muon-fp32-matmul-prec high in fp32."""
    from zero.flat_buffer import FlatLayout
    from zero.muon import muon_matrices, muon_step

    generator = torch.Generator().manual_seed(0)
    weight = torch.randn(24, 16, generator=generator)
    grads = [torch.randn(24, 16, generator=generator) for _ in range(4)]
    config = OptimizerConfig.of(optimizer="muon", muon_nesterov=nesterov, muon_momentum=0.9,
                             muon_fp32_matmul_prec="medium" if bf16 else "high")
    param = torch.nn.Parameter(weight.clone())
    if split is not None:
        param.qkv_split_shapes = split
    [matrix] = muon_matrices(FlatLayout([[param]], 1, 0), [param])
    master, momentum = weight.clone().view(-1), torch.zeros(weight.numel())
    for grad in grads:
        muon_step([matrix], master, momentum, grad.reshape(-1), 0.02, 0.1, config.algorithms, lambda t: None)
    expected, expected_momentum = reference_muon(weight, grads, 0.02, 0.1, 0.9, nesterov, split, bf16)
    assert torch.equal(master.view(24, 16), expected)
    assert torch.equal(momentum.view(24, 16), expected_momentum)
    assert not torch.equal(expected, weight)


def test_newton_schulz_makes_the_singular_values_near_one():
    """The point of the iteration: the quintic's five steps take a matrix's singular values into about [0.7, 1.2]
    (emerging_optimizers' docstring: US'V^T with S' noisy around 1)."""
    from zero.muon import newton_schulz

    x = torch.randn(32, 16, generator=torch.Generator().manual_seed(1)) * torch.linspace(0.2, 2, 16)
    singular = torch.linalg.svdvals(newton_schulz(x, 5, "quintic", bf16=False))
    assert singular.min() > 0.6 and singular.max() < 1.25


GRIDS = (0, 1, 2, 3)
# fp32 Newton-Schulz (--muon-fp32-matmul-prec high): the stages' gradients differ in the last bits (reduce-scatter
# and all-reduce sum in other orders), and bf16 rounding would turn a last-bit difference into a bf16 step's.
MUON = dict(optimizer="muon", lr=0.02, weight_decay=0.1, muon_fp32_matmul_prec="high")


def muon_params_of(model):
    return [model.transformer.wte.weight, model.transformer.wpe.weight]


def train_every_grid(rank, world_size):
    """Per stage: the losses of four Muon steps of a tiny GPT-2 on two data-parallel ranks."""
    state = initialize("cpu", 1)
    try:
        outcomes = {}
        tokens = torch.randint(0, VOCAB, (2 * world_size, SEQ), generator=torch.Generator().manual_seed(3))
        mine = tokens.chunk(world_size)[rank]
        for stage in GRIDS:
            model = tiny_gpt2()
            zero = ZeroHarness(model, OptimizerConfig.of(**MUON), ZeroConfig(stage=stage, reduce_bucket_size=3000), state,
                               muon_excluded_params=muon_params_of(model))
            losses = []
            for _ in range(4):
                zero.zero_grad()
                loss = model(input_ids=mine, labels=mine).loss
                losses.append(loss.item())
                zero.backward(loss)
                zero.step()
            shard = zero.sharded.sharded_state_dict(model)
            outcomes[stage] = (losses, shard.optimizer, len(zero.sharded._muon), zero.sharded.adam_step)
        return outcomes
    finally:
        destroy(state)


def test_muon_under_zero_1_2_3_trains_as_zero_0_on_two_ranks():
    """ZeRO 1-3 cut Muon's matrices over the ranks; each matrix's momentum-updated gradient is gathered for
    Newton-Schulz and each rank keeps its own elements: on two data-parallel ranks every stage's losses equal
    ZeRO 0's (every attention and MLP weight of the two blocks takes Muon: 8 matrices)."""
    for outcomes in run_distributed(train_every_grid, 2, timeout=300):
        reference, name, matrices, steps = outcomes[0]
        assert name == "muon" and matrices == 8 and steps == 4
        assert reference[-1] < reference[0]
        for stage, (losses, _, _, stage_steps) in outcomes.items():
            assert stage_steps == 4, stage
            assert losses == pytest.approx(reference, rel=1e-6, abs=0), stage


def test_muon_is_not_adamw_and_takes_only_the_hidden_matrices():
    """The same run with --optimizer adam takes other steps; Muon leaves the embeddings, biases and norms to Adam
    (their elements are in AdamW's pieces, the matrices' are not)."""
    def run(optimizer):
        model = tiny_gpt2()
        state = initialize("cpu", 1)
        try:
            zero = ZeroHarness(model, OptimizerConfig.of(**{**MUON, "optimizer": optimizer}), ZeroConfig(stage=0), state,
                               muon_excluded_params=muon_params_of(model))
            tokens = torch.randint(0, VOCAB, (2, SEQ), generator=torch.Generator().manual_seed(3))
            out = []
            for _ in range(3):
                zero.zero_grad()
                loss = model(input_ids=tokens, labels=tokens).loss
                out.append(loss.item())
                zero.backward(loss)
                zero.step()
            adam = sum(piece.end - piece.start for piece in zero.sharded._pieces)
            return out, adam, zero.sharded.num_parameters
        finally:
            destroy(state)

    muon, muon_adam, total = run("muon")
    adam, adam_adam, _ = run("adam")
    assert muon != adam and muon[-1] < muon[0]
    hidden = 2 * (32 * 96 + 32 * 32 + 32 * 128 + 128 * 32)  # c_attn, c_proj, c_fc, mlp.c_proj of 2 blocks
    assert adam_adam >= total and muon_adam == adam_adam - hidden


@pytest.mark.parametrize("groups,gate", [(None, False), (2, False), (2, True)])
def test_our_fused_qkv_carries_megatrons_split_shapes(groups, gate):
    """megatron/core/optimizer/emerging_optimizers.py `_get_qkv_split_shapes`: [heads / groups * kv_channels,
    kv_channels, kv_channels], the query size twice with attention_output_gate; tagged on linear_qkv.weight (our
    query_key_value.weight, laid out [group][query heads, gate heads, k, v] as Megatron's) and stepped block by block
    when --muon-split-qkv (the default)."""
    from gpt.model import GPTModel
    from gpt.model_config import ModelConfig
    from parallel.state import ParallelState

    config = ModelConfig.of(num_layers=1, hidden_size=64, num_attention_heads=4, seq_length=16,
                         max_position_embeddings=16, vocab_size=128, num_query_groups=groups,
                         attention_output_gate=gate)
    model = GPTModel(config, ParallelState(device=torch.device("meta")))
    weight = next(p for name, p in model.named_parameters() if name.endswith("query_key_value.weight"))
    head_dim = 16
    query = 4 // (groups or 4) * head_dim
    split = [query, query, head_dim, head_dim] if gate else [query, head_dim, head_dim]
    assert weight.qkv_split_shapes == split
    assert weight.shape[0] % sum(split) == 0 and weight.shape[0] // sum(split) == (groups or 4)
