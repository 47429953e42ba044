"""The fault-tolerance and flight-recorder settings held against the launch before any work: the world the launcher
started and this machine's memory (arguments/bounds.py check_machine_bounds calls it, before the process group).

Each setting's own range (finite, positive, at most a year of waiting) is checked with the flags (arguments/config.py,
rendezvous/fault_injector.py); what only the launch can tell is here:

- `--inprocess-active-world-size` at most the processes launched: the first N train, the rest wait as spares
  (resilience/inprocess_restart.py); before, more than launched was a traceback from the first incarnation;
- the fault injector's ranks within the world that trains (the active world under --inprocess-restart), in
  Megatron-Core's words (rendezvous/fault_injector.py check_world), before any work rather than at the start of training;
- `--flight-recorder-trace-buffer-size` within this machine's memory: the ring holds that many records, each about
  RING_ENTRY_BYTES once filled (measured: 288 bytes a record, 8 a slot), and its slots are allocated at the start, so
  10**12 asked for terabytes before anything else ran.
"""

from __future__ import annotations

from base.errors import ConfigError

# one record of rendezvous/collective_log.py's ring, filled (its list, numbers, call site) and its slot: measured with
# tracemalloc over 100000 records
RING_ENTRY_BYTES = 296


def check_launch_bounds(training, world_size: int, host_memory: int) -> None:
    """Raise ConfigError, in one line naming the flag, for a resiliency setting this launch cannot hold (module
    docstring)."""
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
