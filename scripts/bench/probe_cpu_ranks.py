#!/usr/bin/env python
"""This machine's numbers for configs/hardware/cpu-2core-4proc.yaml: N gloo ranks measure at once, so each sees its
share of the cores (GEMM rate, copy bandwidth, all-reduce bandwidth and latency), printed as the file's YAML keys.

    nice -n 10 python scripts/bench/probe_cpu_ranks.py --ranks 4"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT))

from base.errors import OneLineArgumentParser  # noqa: E402

PROBE = '''
import statistics, sys, time, torch, torch.distributed as dist
torch.set_num_threads(1)
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
m, k, n = (int(x) for x in sys.argv[1].split("x"))

def timed(action, repeats=7):
    times = []
    for _ in range(repeats):
        dist.barrier(); started = time.perf_counter(); action(); times.append(time.perf_counter() - started)
    return statistics.median(times)

a, b = torch.randn(m, k), torch.randn(k, n)
gemm = timed(lambda: [torch.mm(a, b) for _ in range(10)]) / 10
source = torch.ones(2**24); target = torch.empty_like(source)
copy = timed(lambda: target.copy_(source))
big, small = torch.ones(2**21), torch.ones(1)
dist.all_reduce(big)
reduce = timed(lambda: dist.all_reduce(big))
latency = timed(lambda: [dist.all_reduce(small) for _ in range(50)]) / 50
mine = torch.tensor([2 * m * k * n / gemm / 1e12, 2 * source.numel() * 4 / copy / 1e9,
                     2 * (world - 1) / world * big.numel() * 4 / reduce / 1e9, latency * 1e6])
every = [torch.zeros(4) for _ in range(world)]
dist.all_gather(every, mine)
if rank == 0:
    medians = [statistics.median(float(t[i]) for t in every) for i in range(4)]
    print(f"peak_tflops: {medians[0]:.4f}      # fp32 GEMM {m}x{k}x{n}, one thread, {world} ranks at once")
    print(f"hbm_bandwidth_gbs: {medians[1]:.2f}   # copy read + write, one thread, {world} ranks at once")
    print(f"intra_node_bandwidth_gbs: {medians[2]:.3f}   # gloo all-reduce of 8 MiB over {world} ranks, sent per rank")
    print(f"intra_node_latency_us: {medians[3]:.0f}   # one-element gloo all-reduce over {world} ranks")
dist.destroy_process_group()
'''


def main(argv=None) -> int:
    parser = OneLineArgumentParser(prog="scripts/bench/probe_cpu_ranks.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--gemm", default="1024x256x768", help="MxKxN of the timed fp32 GEMM")
    args = parser.parse_args(argv)
    script = Path(tempfile.mkdtemp()) / "probe.py"
    script.write_text(PROBE, encoding="utf-8")
    return subprocess.run([sys.executable, str(REPO_ROOT / "scripts" / "launch.py"), "--standalone",
                           "--nproc_per_node", str(args.ranks), str(script), args.gemm],
                          env={**os.environ, "OMP_NUM_THREADS": "1"}).returncode


if __name__ == "__main__":
    sys.exit(main())
