"""Megatron-Core's distributed optimizer on its path without apex or TransformerEngine (torch's AdamW), patched at run
time so that Megatron-LM resumes its own distributed-optimizer saves exactly, as its GPU path (FusedAdam) does; part
of scripts/bench/megatron_lm_cpu.py. Three faults, each met by a CPU run of Megatron-LM's own pretrain_gpt.py:

- torch's AdamW holds states only after a first step, and DistributedOptimizer.state_dict reads the step from them
  (`assert len(steps) == 1`), so a distributed-optimizer load fails before reading anything: the states are first
  made by Megatron-Core's own _init_optimizer_states_with_dummy_values (which it runs itself for fsdp_dtensor
  loads), and the load overwrites them.
- DistributedOptimizer.load_state_dict puts ONE step tensor into every parameter's state, which torch's AdamW
  advances in place once per parameter at every step: the bias correction after a load is wrong (iteration 4 of
  4.860010 against the uninterrupted 4.859449). Each parameter gets its own copy after the load; FusedAdam keeps
  the step per group and never shares one.
- _set_main_param_and_optimizer_states copies states outside torch.no_grad(): with fp32 parameters (no separate
  master) the main params are the model's leaves, which refuse an in-place copy, so the copy runs under no_grad;
  and it copies "step", which a checkpoint does not hold as a state: the per-parameter step keeps the value
  load_state_dict set (else a dp_reshardable load copied back the dummy step: iteration 4 of 4.868995 against the
  uninterrupted 4.869027)."""

from __future__ import annotations

import torch


def patch_torch_adamw_resume() -> None:
    """The three patches of the module docstring (megatron/core/optimizer/distrib_optimizer.py, core_v0.16.1)."""
    from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer

    set_states = DistributedOptimizer._set_main_param_and_optimizer_states

    def set_saved_states(self, model_param, tensors):
        group_index, group_order = self.model_param_group_index_map[model_param]
        main_param = self.optimizer.param_groups[group_index]["params"][group_order]
        with torch.no_grad():
            return set_states(self, model_param, _KeepStep(tensors, self.optimizer.state[main_param]))
    DistributedOptimizer._set_main_param_and_optimizer_states = set_saved_states
    sharded_state_dict = DistributedOptimizer.sharded_state_dict

    def sharded_state_dict_with_states(self, model_sharded_state_dict={}, is_loading=False, **kwargs):
        if is_loading and not self.optimizer.state:
            self._init_optimizer_states_with_dummy_values()
        return sharded_state_dict(self, model_sharded_state_dict, is_loading, **kwargs)
    DistributedOptimizer.sharded_state_dict = sharded_state_dict_with_states
    load_state_dict = DistributedOptimizer.load_state_dict

    def load_state_dict_with_own_steps(self, state_dict):
        load_state_dict(self, state_dict)
        for state in self.optimizer.state.values():
            if "step" in state:
                state["step"] = state["step"].clone()
    DistributedOptimizer.load_state_dict = load_state_dict_with_own_steps


class _KeepStep(dict):
    """A checkpoint's states, where torch AdamW's per-parameter "step" reads the live value, the one load_state_dict
    set from the saved param groups: the step is not a saved state of its own, and a dp_reshardable load's bucket
    states carry the step of the states made before the load (1), which would overwrite the saved one."""

    def __init__(self, saved: dict, live: dict):
        super().__init__({key: value for key, value in saved.items() if key != "step"})
        self.live = live

    def __missing__(self, key):
        if key == "step":
            return self.live["step"]
        raise KeyError(key)
