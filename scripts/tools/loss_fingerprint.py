"""The losses and gradient norms of eleven small runs (RUNS), exactly, to compare two commits: a refactor that must not
change the math gives equal JSON files before and after, not close ones.

    python scripts/tools/loss_fingerprint.py OUT.json [RUN ...]"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
LLAMA = ["--normalization", "RMSNorm", "--swiglu", "--position-embedding-type", "rope", "--disable-bias-linear"]
RUNS = {
    "default": (1, []),
    "zero3_dp2": (2, ["--zero-stage", "3"]),
    "tp2": (2, ["--tensor-model-parallel-size", "2"]),
    "pp2": (2, ["--pipeline-model-parallel-size", "2"]),
    "tp2_sp": (2, ["--tensor-model-parallel-size", "2", "--sequence-parallel"]),
    "zero3_offload": (2, ["--zero-stage", "3", "--offload-param", "--offload-optimizer"]),
    "bf16": (1, ["--bf16"]),
    "llama": (1, LLAMA),
    "llama_bf16": (1, [*LLAMA, "--bf16"]),
    "llama_zero2_bf16": (2, [*LLAMA, "--bf16", "--zero-stage", "2"]),
    "llama_tp2_sp": (2, [*LLAMA, "--tensor-model-parallel-size", "2", "--sequence-parallel"]),
}


def fingerprint(name: str) -> list[list]:
    """[iteration, repr(loss), repr(grad norm)] of each iteration of run `name`."""
    processes, flags = RUNS[name]
    with tempfile.TemporaryDirectory() as workdir:
        command = [sys.executable, str(REPO / "scripts" / "launch.py"), "--standalone", "--nnodes", "1",
                   "--nproc_per_node", str(processes), str(REPO / "pretrain_gpt.py"), "--train-iters", "3",
                   "--log-interval", "1", "--eval-iters", "0", "--metrics-file", "metrics.jsonl", *flags]
        done = subprocess.run(command, cwd=workdir, env=dict(os.environ, OMP_NUM_THREADS="1"), capture_output=True,
                              text=True, timeout=900)
        if done.returncode:
            raise SystemExit(f"loss_fingerprint.py: {name} exited {done.returncode}: {done.stderr.strip()[-500:]}")
        records = [json.loads(line) for line in Path(workdir, "metrics.jsonl").read_text().splitlines()]
    return [[r["iteration"], repr(r["loss"]), repr(r["grad_norm"])] for r in records if "grad_norm" in r]


def main(argv: list[str]) -> int:
    if not argv or argv[0].startswith("-"):
        print(__doc__.strip().splitlines()[-1].strip(), file=sys.stderr)
        return 2
    out, names = Path(argv[0]), argv[1:] or list(RUNS)
    unknown = [name for name in names if name not in RUNS]
    if unknown:
        print(f"loss_fingerprint.py: unknown run {', '.join(unknown)}; the runs: {', '.join(RUNS)}", file=sys.stderr)
        return 2
    result = {}
    for name in names:
        result[name] = fingerprint(name)
        print(name, result[name], flush=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
