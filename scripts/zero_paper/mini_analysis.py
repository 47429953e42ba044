"""What the CPU mini-reproduction (mini_reproduction.py's JSON) says about Figures 6 and 7.

Device memory, measured and planned alike, is --report-memory's: model states, constant buffers and the bytes saved
for backward on the device. A configuration's bytes are a line in the layers, so the layers it fits in what C1 needs
at the deeper depth (Figure 6) follow from its line, measured and planned."""

from __future__ import annotations

from dataclasses import dataclass


def cpu_source(mini: dict) -> str:
    """Where the mini-reproduction's numbers come from, for a caption: its command and date."""
    return f"`{mini['command']}`, {mini.get('date', 'date not recorded')}"


def device_bytes(rank: dict) -> int:
    return rank["model_state_bytes"] + rank["buffer_bytes"] + rank["saved_activation_device_bytes"]


@dataclass
class ConfigurationMemory:
    configuration: str
    layers: tuple[int, int]
    measured: tuple[int, int]   # the largest rank's device bytes at each depth
    planned: tuple[int, int]
    host_measured: int          # P_a+cpu's checkpoints in host memory, at the deeper depth
    host_planned: int

    def per_layer(self, which: str) -> float:
        low, high = getattr(self, which)
        return (high - low) / (self.layers[1] - self.layers[0])

    def layers_within(self, budget: float, which: str) -> float:
        low = getattr(self, which)[0]
        return self.layers[0] + (budget - low) / self.per_layer(which)


def memory_by_configuration(summary: dict) -> dict[str, ConfigurationMemory]:
    runs: dict[str, dict[int, dict]] = {}
    for run in summary["runs"]:
        runs.setdefault(run["configuration"], {})[run["layers"]] = run
    result = {}
    for name, by_layers in runs.items():
        depths = tuple(sorted(by_layers))
        if len(depths) != 2:
            raise ValueError(f"{name}: the mini-reproduction needs two depths, has {depths}")
        deep = by_layers[depths[1]]
        result[name] = ConfigurationMemory(
            name, depths,
            tuple(max(device_bytes(rank) for rank in by_layers[d]["measured"]) for d in depths),
            tuple(max(device_bytes(rank) for rank in by_layers[d]["planned"]) for d in depths),
            max(rank["saved_activation_host_bytes"] for rank in deep["measured"]),
            max(rank["saved_activation_host_bytes"] for rank in deep["planned"]))
    return result


def layers_in_c1_budget(memory: dict[str, ConfigurationMemory]) -> dict[str, dict[str, float]]:
    """Per configuration, the layers that fit in what C1 holds at the deeper depth (measured, planned)."""
    reference = memory["C1"]
    return {name: {which: item.layers_within(getattr(reference, which)[1], which) for which in ("measured", "planned")}
            for name, item in memory.items()}
