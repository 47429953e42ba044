"""Megatron-Core's distributed optimizer on torch's AdamW (no apex, no TransformerEngine), patched at run time so that
Megatron-LM resumes its own distributed-optimizer saves exactly, as its GPU path (FusedAdam) does; part of
megatron_lm_cpu.py."""

from __future__ import annotations

import torch


def patch_torch_adamw_resume() -> None:
    """Three patches of megatron/core/optimizer/distrib_optimizer.py (core_v0.16.1), each for a fault a CPU run of
    Megatron-LM's pretrain_gpt.py meets on a distributed-optimizer resume."""
    from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer

    # It copies states outside no_grad (fp32 main params are the model's leaves, which refuse an in-place copy) and
    # copies "step", which a checkpoint does not hold: the step load_state_dict set is kept (_KeepStep).
    set_states = DistributedOptimizer._set_main_param_and_optimizer_states

    def set_saved_states(self, model_param, tensors):
        group_index, group_order = self.model_param_group_index_map[model_param]
        main_param = self.optimizer.param_groups[group_index]["params"][group_order]
        with torch.no_grad():
            return set_states(self, model_param, _KeepStep(tensors, self.optimizer.state[main_param]))
    DistributedOptimizer._set_main_param_and_optimizer_states = set_saved_states
    # torch's AdamW holds states only after a step, and state_dict reads the step from them: a load makes them first,
    # with Megatron-Core's own dummy values, and overwrites them.
    sharded_state_dict = DistributedOptimizer.sharded_state_dict

    def sharded_state_dict_with_states(self, model_sharded_state_dict={}, is_loading=False, **kwargs):
        if is_loading and not self.optimizer.state:
            self._init_optimizer_states_with_dummy_values()
        return sharded_state_dict(self, model_sharded_state_dict, is_loading, **kwargs)
    DistributedOptimizer.sharded_state_dict = sharded_state_dict_with_states
    # load_state_dict puts one step tensor into every parameter's state, which torch's AdamW advances once per
    # parameter: each gets its own copy (FusedAdam keeps the step per group).
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
