#!/usr/bin/env python
"""Activation memory per layer, counted on the CPU (issue 111): the bytes autograd saves for backward in one
micro-batch, this project's training step and Megatron-LM's own pretrain_gpt.py on the same command line
(docs/performance.md, "Activation memory per layer, counted").

    python scripts/benchmark_saved_bytes.py [--megatron-lm KIT] [--layers 2] [--output counts.json]
    python scripts/benchmark_saved_bytes.py --table counts.json      # the markdown tables of docs/performance.md

What is counted (scripts/saved_tensor_counter.py): at the end of iteration 2's second micro-batch's forward, with
every saved tensor alive, the storages of the tensors `torch.autograd.graph.saved_tensors_hooks` saw saved in that
forward, each storage once and whole, parameters left out; each named by the op (below autograd) and module that
made it. The model is benchmark_host_ops.py's: 2L and L layers of hidden 128, 4 heads, sequence 128, micro-batch 1,
the GPT-2 and Llama shapes; per layer is the difference of the two depths over L, exact whatever the embedding and
the loss save. Tensor parallelism runs TP ranks under torchrun over gloo, rank 0 counted. Per s*b*h: the bytes per
layer over sequence x micro-batch x hidden, over s*b*h/t under --sequence-parallel (a rank holds 1/t of the
sequence between blocks). --megatron-lm (the megatron-lm-core_v0.16.1-min.tar.xz kit or its folder; the benchmark
venv's megatron-core) counts Megatron-LM's torch path (--transformer-impl local) under the same rule, through
scripts/megatron_lm_cpu.py --count-saved; a configuration it refuses is recorded with its reason.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Optional

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from scripts.benchmark_host_ops import PRECISIONS, SHAPES, VOCAB, common_flags  # noqa: E402
from scripts.saved_tensor_counter import SavedTensorCounter, per_layer  # noqa: E402
from training.step_observer import NoObserver  # noqa: E402

MEGATRON = "Megatron-LM core_v0.16.1 (torch path)"
OURS = "this project"
# (tensor-parallel size, --sequence-parallel)
LAYOUTS = [(1, False), (2, False), (2, True), (4, True)]
_EXCEPTION = re.compile(r"^[\w.]*(Error|Exception)(:.*)?$")


def flags(shape: str, precision: str, layers: int, tp: int, sp: bool, hidden: Optional[int] = None,
          seq: Optional[int] = None) -> list[str]:
    """The command line both programs run for one configuration."""
    line = [*common_flags(layers), *SHAPES[shape], *PRECISIONS[precision]]
    for flag, value in (("--hidden-size", hidden), ("--seq-length", seq), ("--max-position-embeddings", seq)):
        if value is not None:
            line[line.index(flag) + 1] = str(value)
    if tp > 1:
        line += ["--tensor-model-parallel-size", str(tp)]
    if sp:
        line.append("--sequence-parallel")
    return line


def _value(line: list[str], flag: str) -> int:
    return int(line[line.index(flag) + 1])


class SavingObserver(NoObserver):
    """A live train step's observer that counts what the second micro-batch's forward saves, once `active`."""

    def __init__(self, counter: SavedTensorCounter) -> None:
        self.counter = counter
        self.active = False
        self.micro_batch = -1
        self.result = None

    def micro_batch_start(self, micro_batch: int) -> None:
        self.micro_batch = micro_batch

    @contextlib.contextmanager
    def phase(self, name: str):
        if not (self.active and name == "forward" and self.micro_batch == 1):
            yield
            return
        with self.counter.saving():
            yield
        self.result = self.counter.saved()  # the forward's end: the loss made, nothing released yet


def _batches(sequence: int):
    generator = torch.Generator().manual_seed(0)
    while True:
        yield {"tokens": torch.randint(0, VOCAB, (1, sequence + 1), generator=generator)}


def count_our_saved(argv: list[str]) -> dict:
    """What this rank's iteration 2, second micro-batch, saves in its forward (`argv`: Megatron's flags; one process
    or one torchrun rank)."""
    from arguments.parser import parse_config
    from parallel.state import destroy, initialize_grid
    from training.build import build
    from training.run_settings import resolve_run_settings
    from training.train_step import DataParallelTrainStep

    config = parse_config(argv)
    state = initialize_grid("cpu", config.parallel, 1)
    try:
        settings = resolve_run_settings(config, VOCAB + 1, state.tensor_parallel_size, state.data_parallel_size,
                                        "cpu")
        built = build(settings, state, dropout_rng=True, torch_compile=False)
        counter = SavedTensorCounter()
        counter.name_modules(built.model)
        observer = SavingObserver(counter)
        step = DataParallelTrainStep(built.model, built.zero, _batches(_value(argv, "--seq-length")), settings,
                                     state, built.activations, observer=observer, rng=built.rng)
        step(1, 0, measure_activations=False)
        observer.active = True
        with counter.naming():
            step(2, settings.batch.global_batch_size, measure_activations=False)
        return observer.result.as_json()
    finally:
        destroy(state)


def _worker(out: Path, argv: list[str]) -> None:
    """One torchrun rank of `count_our_saved`; rank 0 writes the count to `out`."""
    torch.set_num_threads(1)
    result = count_our_saved(argv)
    if int(os.environ.get("RANK", "0")) == 0:
        out.write_text(json.dumps(result) + "\n", encoding="utf-8")


def _torchrun(ranks: int, program: list[str], what: str) -> Optional[str]:
    """`program` under torchrun on `ranks` CPU processes; None, or why it failed (its last error lines)."""
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(ranks),
               *program]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
    if done.returncode == 0:
        return None
    lines = [line for line in (done.stdout + done.stderr).splitlines() if line.strip()]
    # a rank's exception line (`module.SomeError: why`), not torchrun's own ChildFailedError after it
    reasons = [line.strip() for line in lines if _EXCEPTION.match(line) and "ChildFailedError" not in line]
    return f"{what}: " + (reasons[0] if reasons else " / ".join(line.strip() for line in lines[-3:]))


def _count(program: str, line: list[str], out: Path, kit_tree: Optional[Path]) -> Optional[str]:
    ranks = _value(line, "--tensor-model-parallel-size") if "--tensor-model-parallel-size" in line else 1
    if program == OURS:
        return _torchrun(ranks, [str(Path(__file__).resolve()), "--worker", str(out), "--", *line], program)
    return _torchrun(ranks, [str(ROOT / "scripts" / "megatron_lm_cpu.py"), "--megatron-lm", str(kit_tree),
                             "--count-saved", str(out), "--", *line, "--data-cache-path", str(out.parent / "cache"),
                             "--no-gradient-accumulation-fusion"], program)


def rows(program: str, layers: int, shapes: list[str], precisions: list[str], layouts: list[tuple[int, bool]],
         scratch: Path, kit_tree: Optional[Path] = None, hidden: Optional[int] = None,
         seq: Optional[int] = None) -> list[dict]:
    """Each configuration's count at 2L and L layers, and per layer (or why the program refused it)."""
    result = []
    for shape in shapes:
        for precision in precisions:
            for tp, sp in layouts:
                row = {"program": program, "shape": shape, "precision": precision, "tp": tp, "sp": sp,
                       "layers": 2 * layers}
                counts = {}
                for depth in (2 * layers, layers):
                    line = flags(shape, precision, depth, tp, sp, hidden, seq)
                    out = scratch / f"{program[:4]}-{shape}-{precision}-{tp}-{sp}-{depth}.json".replace(" ", "_")
                    refused = _count(program, line, out, kit_tree)
                    if refused is not None:
                        row["refused"] = refused
                        break
                    counts[depth] = json.loads(out.read_text())
                if "refused" not in row:
                    line = flags(shape, precision, layers, tp, sp, hidden, seq)
                    tokens = _value(line, "--seq-length") * _value(line, "--micro-batch-size") * \
                        _value(line, "--hidden-size") // (tp if sp else 1)
                    row.update(hidden=_value(line, "--hidden-size"), seq=_value(line, "--seq-length"),
                               per_micro_batch=counts[2 * layers]["total"],
                               per_layer=per_layer(counts[2 * layers], counts[layers], layers),
                               shb=tokens)
                    row["per_shb"] = row["per_layer"]["total"] / tokens
                result.append(row)
                print(json.dumps({k: v for k, v in row.items() if k != "per_layer"} |
                                 {"per_layer": row.get("per_layer", {}).get("total")}), flush=True)
    return result


def _layout(row: dict) -> str:
    return f"TP {row['tp']}" + (" SP" if row["sp"] else "")


def markdown_table(result: dict) -> str:
    """docs/performance.md's tables from an --output file: per configuration both programs' bytes saved per layer
    and per s*b*h (s*b*h/t under SP), then each saved tensor of the Llama bf16 TP 1 and TP 2 SP layers."""
    lines = ["| shape | precision | layout | this project: bytes a layer | per s*b*h (/t under SP) | "
             "Megatron-LM: bytes a layer | per s*b*h (/t under SP) |", "|---|---|---|---:|---:|---:|---:|"]

    def order(row: dict) -> tuple:
        return list(SHAPES).index(row["shape"]), list(PRECISIONS).index(row["precision"]), row["tp"], row["sp"]

    ours, megatron = sorted(result["ours"], key=order), sorted(result.get("megatron", []), key=order)

    def cells(row: Optional[dict]) -> list[str]:
        if row is None:
            return ["-", "-"]
        if "refused" in row:
            return ["refused", "-"]
        return [f"{row['per_layer']['total']:,.0f}", f"{row['per_shb']:.2f}"]

    def find(among: list[dict], row: dict) -> Optional[dict]:
        return next((other for other in among if (other["shape"], other["precision"], other["tp"], other["sp"]) ==
                     (row["shape"], row["precision"], row["tp"], row["sp"])), None)

    for row in ours:
        lines.append(f"| {row['shape']} | {row['precision']} | {_layout(row)} | " +
                     " | ".join(cells(row) + cells(find(megatron, row))) + " |")
    refusals = [row for row in ours + megatron if "refused" in row]
    for row in refusals:
        lines.append(f"\n{row['program']} refused {row['shape']} {row['precision']} {_layout(row)}: {row['refused']}")
    for tp, sp in ((1, False), (2, True)):
        lines += ["", f"Each saved tensor of a Llama-shaped bf16 layer at {_layout({'tp': tp, 'sp': sp})} "
                      f"(made by: module, op; bytes a layer; per s*b*h{'/t' if sp else ''}):", "",
                  f"| program | made by | saved by | bytes a layer | per s*b*h{'/t' if sp else ''} |",
                  "|---|---|---|---:|---:|"]
        for among in (ours, megatron):
            row = next((row for row in among if (row["shape"], row["precision"], row["tp"], row["sp"]) ==
                        ("llama", "bf16", tp, sp) and "per_layer" in row), None)
            if row is None:
                continue
            layer = row["per_layer"]
            for name, size in sorted(layer["by_name"].items(), key=lambda item: -item[1]):
                savers = ", ".join(layer["saved_by"].get(name, []))
                lines.append(f"| {row['program']} | `{name}` | {savers} | {size:,.0f} | {size / row['shb']:.2f} |")
            lines.append(f"| {row['program']} | all | | {layer['total']:,.0f} | {row['per_shb']:.2f} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--megatron-lm", type=Path, help="Megatron-LM's kit (core_v0.16.1 tarball or its folder)")
    parser.add_argument("--layers", type=int, default=2, help="L: the models have 2L and L layers")
    parser.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    parser.add_argument("--precisions", nargs="+", default=["bf16"], choices=list(PRECISIONS))
    parser.add_argument("--layouts", nargs="+", default=[f"{tp}{'sp' if sp else ''}" for tp, sp in LAYOUTS],
                        help="tensor-parallel sizes, 'sp' appended for --sequence-parallel (default: 1 2 2sp 4sp)")
    parser.add_argument("--hidden", type=int, help="--hidden-size instead of 128")
    parser.add_argument("--seq", type=int, help="--seq-length instead of 128")
    parser.add_argument("--output", type=Path, help="write every row as JSON here")
    parser.add_argument("--table", type=Path, help="print the markdown tables of a --output file and exit")
    parser.add_argument("--worker", type=Path, help=argparse.SUPPRESS)  # one torchrun rank of our count
    parser.add_argument("flags", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.table is not None:
        print(markdown_table(json.loads(args.table.read_text(encoding="utf-8"))))
        return 0
    if args.worker is not None:
        _worker(args.worker, [flag for flag in args.flags if flag != "--"])
        return 0
    layouts = [(int(layout.removesuffix("sp")), layout.endswith("sp")) for layout in args.layouts]
    with tempfile.TemporaryDirectory(prefix="saved-bytes-") as scratch_name:
        scratch = Path(scratch_name)
        result = {"ours": rows(OURS, args.layers, args.shapes, args.precisions, layouts, scratch, hidden=args.hidden,
                               seq=args.seq)}
        if args.megatron_lm is not None:
            from scripts.megatron_checkpoint_fixtures import megatron_tree

            tree = megatron_tree(args.megatron_lm.resolve(), scratch)
            result["megatron"] = rows(MEGATRON, args.layers, args.shapes,
                                      [p for p in args.precisions if not p.startswith("fp8")], layouts, scratch,
                                      kit_tree=tree, hidden=args.hidden, seq=args.seq)
    if args.output is not None:
        args.output.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
