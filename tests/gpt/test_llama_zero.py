"""A Llama-shaped model (RMSNorm, SwiGLU, rotary, 2 KV groups, untied output layer, no biases) under
ZeRO stages 0-3 in one process, stage 3 also under activation checkpointing: ZeRO materializes it from
the meta device (the untied output layer is a parameter like any other) and its fp32 losses agree
across stages, as GPT-2's do (tests/zero). The blocks are chosen by the config's settings (the flags'
fields), as a launch chooses them; tests/gpt/test_llama_launch.py runs one through pretrain_gpt."""

import pytest
import torch

from arguments.config import OptimizerConfig
from gpt.model import GPTModel
from gpt.model_config import ModelConfig
from parallel.random import TensorParallelRNG
from parallel.state import ParallelState
from tests.zero_harness import ZeroHarness
from zero.activations import apply_activation_checkpointing
from zero.config import ActivationCheckpointConfig, ZeroConfig

STATE = ParallelState(device=torch.device("cpu"))
OPTIMIZER = OptimizerConfig(lr=1e-2, weight_decay=0.1, clip_grad=1.0, adam_beta1=0.9, adam_beta2=0.95, adam_eps=1e-8)
CONFIG = ModelConfig.of(num_layers=2, hidden_size=32, num_attention_heads=4, seq_length=16, max_position_embeddings=16,
                     vocab_size=200, hidden_dropout=0.0, attention_dropout=0.0, normalization="RMSNorm", swiglu=True,
                     position_embedding_type="rope", num_query_groups=2, untie_embeddings_and_output_weights=True,
                     add_bias_linear=False)


def losses_at_stage(stage: int, steps: int = 3, checkpointing: ActivationCheckpointConfig | None = None
                    ) -> list[float]:
    torch.manual_seed(0)
    rng = TensorParallelRNG(5, STATE)
    model = GPTModel(CONFIG, STATE, rng=rng)
    if checkpointing is not None:
        apply_activation_checkpointing(model, checkpointing, STATE, rng)
    zero = ZeroHarness(model, OPTIMIZER, ZeroConfig(stage=stage, reduce_bucket_size=2000, allgather_bucket_size=2000),
                       STATE, stage3_units=model.blocks if stage == 3 else None, seed=5)
    # One batch again and again: its loss must fall, so the steps are seen to act.
    tokens = torch.randint(0, CONFIG.vocab_size, (4, CONFIG.seq_length + 1), generator=torch.Generator().manual_seed(1))
    losses = []
    for _ in range(steps):
        zero.zero_grad()
        loss = model(tokens[:, :-1], tokens[:, 1:]).mean()
        zero.backward(loss)
        zero.step()
        losses.append(loss.item())
    assert all(p.device.type == "cpu" for p in model.parameters() if p.numel())
    return losses


def test_llama_shaped_model_trains_equally_at_zero_stages_0_to_3():
    reference = losses_at_stage(0)
    assert reference[-1] < reference[0]  # it learns
    for stage in (1, 2, 3):
        assert losses_at_stage(stage) == pytest.approx(reference, rel=0, abs=1e-6), stage
    # and with activation checkpointing (recomputed blocks rebuild the rotary angles), partitioned (P_a)
    checkpointing = ActivationCheckpointConfig(checkpoint_activations=True, partition_activations=True)
    assert losses_at_stage(3, checkpointing=checkpointing) == pytest.approx(reference, rel=0, abs=1e-6)
