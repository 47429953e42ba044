"""The fault-tolerance and flight-recorder settings held against the launch before any work: the active world and fault
injector's ranks within the world launched, and the flight recorder's ring within this machine's memory (its slots are
allocated at the start)."""

from __future__ import annotations

from base.errors import ConfigError

# one filled record of the ring and its slot, measured with tracemalloc
RING_ENTRY_BYTES = 296


def check_launch_bounds(training, world_size: int, host_memory: int) -> None:
    """One-line ConfigError for a resiliency setting this launch cannot hold."""
    active = training.faults.inprocess_active_world_size
    if training.faults.inprocess_restart and active is not None and active > world_size:
        raise ConfigError(f"--inprocess-active-world-size {active} is more than the {world_size} launched "
                          f"process{'es' if world_size > 1 else ''}: launch at least {active} (the ones beyond it "
                          f"wait as spares) or lower it", flags=("--inprocess-active-world-size",))
    training.fault_injector.check_world(active or world_size if training.faults.inprocess_restart else world_size)
    ring_bytes = training.faults.flight_recorder_trace_buffer_size * RING_ENTRY_BYTES
    if ring_bytes > host_memory:
        raise ConfigError(f"--flight-recorder-trace-buffer-size "
                          f"{training.faults.flight_recorder_trace_buffer_size}: a ring "
                          f"of that many collectives needs about {ring_bytes / 2**30:.3g} GiB per rank "
                          f"({RING_ENTRY_BYTES} bytes a record), more than this machine's "
                          f"{host_memory / 2**30:.3g} GiB; Megatron's default keeps 2000",
                          flags=("--flight-recorder-trace-buffer-size",))
