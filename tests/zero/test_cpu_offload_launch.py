"""Megatron-LM's hybrid CPU optimizer through a launch (issue 81 item 1): --optimizer-cpu-offload with the distributed
and precision-aware optimizers, as THUDM slime's run scripts give it, trains on 2 gloo ranks with the losses and
gradient norms of the same launch without it, bit for bit (fp32, 3 iterations of 2 accumulated micro-batches), at
Megatron-LM's default fraction 1.0 (the whole host step, zero/offload.py) and at 0.5 (the split,
zero/hybrid_offload.py); and a checkpoint of the split run resumes without offload to the same losses (the states
are saved whole, wherever they lived).
"""

import os

from tests.distributed import free_port, run_distributed
from tests.reliability_helpers import TINY, metrics_records


def _with(flags: list[str], **values: str) -> list[str]:
    out = list(flags)
    for name, value in values.items():
        out[out.index("--" + name.replace("_", "-")) + 1] = value
    return out


# 2 ranks x micro-batch 2 x 2 accumulation steps; weight decay and a clip that scales every step
COMMON = _with(TINY, global_batch_size="8", train_iters="3") + [
    "--weight-decay", "0.1", "--clip-grad", "0.05", "--lr", "3e-3",
    "--use-distributed-optimizer", "--use-precision-aware-optimizer"]
CPU_OFFLOAD = ["--optimizer-cpu-offload", "--overlap-cpu-optimizer-d2h-h2d"]


def launch_rank(rank, world_size, argvs, ports):
    import pretrain_gpt

    for argv, port in zip(argvs, ports):
        os.environ["MASTER_PORT"] = str(port)
        assert pretrain_gpt.main(argv) == 0, argv


def logged(path):
    return [(r["iteration"], r["loss"], r["grad_norm"]) for r in metrics_records(path) if "loss" in r and "split" not in r]


def test_slimes_cpu_offload_flags_train_as_the_launch_without_them(corpus_cache_300, tmp_path):
    common = COMMON + ["--data-cache-dir", corpus_cache_300]
    save = tmp_path / "split-then-plain"
    # (metrics file, launch): the split run saves at iteration 2 and the launch without offload resumes from it,
    # both writing to one metrics file
    runs = [("plain", common),
            ("whole", common + CPU_OFFLOAD + ["--optimizer-offload-fraction", "1.0"]),
            ("half", common + CPU_OFFLOAD + ["--optimizer-offload-fraction", "0.5"]),
            ("resumed", common + CPU_OFFLOAD + ["--optimizer-offload-fraction", "0.5", "--save", save,
                                                "--exit-interval", "2"]),
            ("resumed", common + ["--save", save, "--load", save])]
    argvs = [[str(a) for a in argv] + ["--metrics-file", str(tmp_path / f"{name}.jsonl")] for name, argv in runs]
    run_distributed(launch_rank, 2, argvs, [free_port() for _ in argvs], timeout=600)
    plain = logged(tmp_path / "plain.jsonl")
    assert [iteration for iteration, _, _ in plain] == [1, 2, 3]
    for name in ("whole", "half", "resumed"):
        assert logged(tmp_path / f"{name}.jsonl") == plain, name
