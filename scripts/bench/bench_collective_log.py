"""What the flight recorder's ring (rendezvous/collective_log.py) costs per collective: the Communicator's own work
per call with the ring off and on, over a transport that does nothing.

    python scripts/bench/bench_collective_log.py [CALLS]"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402

from parallel.state import virtual_state  # noqa: E402
from rendezvous.collective_log import CollectiveLog  # noqa: E402


def per_call_us(calls: int, ring: bool) -> float:
    state = virtual_state(4, tensor_parallel_size=2)
    state.comm.log = CollectiveLog(2000) if ring else None
    tensor = torch.zeros(1024, device="meta")
    best = float("inf")
    for _ in range(5):
        started = time.perf_counter()
        for _ in range(calls):
            state.comm.all_reduce(tensor, state.tensor_parallel_group, "tp")
        best = min(best, (time.perf_counter() - started) / calls * 1e6)
    return best


def main() -> None:
    calls = int(sys.argv[1]) if len(sys.argv) > 1 else 20000
    off, on = per_call_us(calls, ring=False), per_call_us(calls, ring=True)
    print(f"per collective, best of 5 x {calls}: ring off {off:.2f} us, on {on:.2f} us: the ring adds {on - off:.2f} us")


if __name__ == "__main__":
    main()
