"""Offload decided once (zero/placement.py): zero/apply.py reads --offload-param and --offload-optimizer into a
`Placement`, and the stage-3 storage, its gatherer and the memory report follow that decision, not the flags.

DeepSpeed likewise decides in one place: DeepSpeedZeroOptimizer_Stage3.__init__ (deepspeed/runtime/zero/stage3.py)
reads offload_param / offload_optimizer once into `offload_param_config` / `offload_optimizer`, and the
parameter partitioner (partition_parameters.py, Init's remote_device) is handed the device.
"""

from __future__ import annotations

import pytest

import zero.apply
from arguments.config import OptimizerConfig
from gpt.model import GPTModel
from gpt.model_config import ModelConfig
from parallel.state import virtual_state
from zero.apply import build_zero
from zero.config import ZeroConfig
from zero.memory import host_resident_tensors
from zero.placement import Placement, placement_of

CONFIG = ModelConfig.of(num_layers=2, hidden_size=32, num_attention_heads=4, seq_length=16, max_position_embeddings=16,
                     vocab_size=96)


def _parts(zero_config: ZeroConfig):
    state = virtual_state(1, 1)
    model = GPTModel(CONFIG, state)
    return build_zero(model, zero_config, OptimizerConfig(), state, seed=3, blocks=model.blocks)


@pytest.mark.parametrize("param, optimizer", ((False, False), (True, False), (True, True), (False, True)))
def test_the_placement_is_the_flags_and_what_holds_the_states_follows_it(param, optimizer):
    zero_config = ZeroConfig(stage=3, offload_param=param, offload_optimizer=optimizer)
    parts = _parts(zero_config)
    assert parts.placement == placement_of(zero_config) == Placement(param, optimizer, zero_config.offload_pin_memory)
    storage = parts.optimizer.parameters
    assert storage.placement is parts.placement and storage.gatherer.shard_on_host is param
    assert (getattr(parts.optimizer, "offload", None) is not None) is optimizer
    assert any(tensor is storage.shard for tensor in host_resident_tensors(parts.optimizer)) is param


def test_the_storage_and_gatherer_read_the_decision_not_the_flag(monkeypatch):
    """With the decision changed in zero/apply.py alone, nothing downstream still follows --offload-param."""
    monkeypatch.setattr(zero.apply, "placement_of", lambda config: Placement())
    parts = _parts(ZeroConfig(stage=3, offload_param=True, offload_optimizer=True))
    storage = parts.optimizer.parameters
    assert not storage.gatherer.shard_on_host and getattr(parts.optimizer, "offload", None) is None
    assert not any(tensor is storage.shard for tensor in host_resident_tensors(parts.optimizer))
