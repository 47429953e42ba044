#!/usr/bin/env python
"""Activation memory per layer, counted on the CPU: the bytes autograd saves for backward in one micro-batch, this
project's training step and Megatron-LM's own pretrain_gpt.py on the same command line (docs/performance.md).

    python scripts/bench/benchmark_saved_bytes.py [--megatron-lm KIT] [--layouts 1 2sp 1cp2] [--output FILE]

Per layer is the difference of two depths."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from scripts.bench.benchmark_host_ops import PRECISIONS, SHAPES, VOCAB, common_flags  # noqa: E402
from scripts.bench.saved_tensor_counter import SavedTensorCounter, per_layer  # noqa: E402
from training.step_observer import NoObserver  # noqa: E402

MEGATRON = "Megatron-LM core_v0.16.1 (torch path)"
OURS = "this project"
_GROUPS = ["--group-query-attention", "--num-query-groups", "2"]
SAVED_SHAPES = {
    **SHAPES,
    # DeepSeek-V3's attention at this width: a low-rank query and key/value with their latent norms, 32-wide heads
    # and a 16-wide positional part of the query and key (MLA has no query groups)
    "mla": [flag for flag in SHAPES["llama"] if flag not in _GROUPS] + [
        "--multi-latent-attention", "--q-lora-rank", "64", "--kv-lora-rank", "32", "--qk-head-dim", "32",
        "--qk-pos-emb-head-dim", "16", "--v-head-dim", "32", "--qk-layernorm"],
    # Mixtral's: 4 SwiGLU experts of the dense MLP's width, top 2, dropless, exchanged by all-to-all (one expert
    # after another: Megatron-Core's grouped GEMM needs TransformerEngine or the grouped_gemm package)
    "moe": [*SHAPES["llama"], "--num-experts", "4", "--moe-router-topk", "2", "--moe-token-dispatcher-type",
            "alltoall"],
}


@dataclass(frozen=True)
class Layout:
    """The parallel sizes of one configuration (module docstring: `2sp`, `1cp2`, `1ep2`)."""
    tp: int = 1
    sp: bool = False
    cp: int = 1
    ep: int = 1

    @classmethod
    def parse(cls, text: str) -> "Layout":
        match = re.fullmatch(r"(\d+)(sp)?(?:cp(\d+))?(?:ep(\d+))?", text)
        if match is None:
            raise argparse.ArgumentTypeError(f"{text!r}: a layout is the TP size, then sp, cp<size>, ep<size>")
        return cls(int(match[1]), bool(match[2]), int(match[3] or 1), int(match[4] or 1))

    @classmethod
    def of(cls, row: dict) -> "Layout":
        return cls(row["tp"], row["sp"], row.get("cp", 1), row.get("ep", 1))

    def ranks(self) -> int:
        """TP x CP ranks, times EP data-parallel ranks for the experts."""
        return self.tp * self.cp * self.ep

    def __str__(self) -> str:
        return f"TP {self.tp}" + " SP" * self.sp + f" CP {self.cp}" * (self.cp > 1) + f" EP {self.ep}" * (self.ep > 1)


LAYOUTS = [Layout(1), Layout(2), Layout(2, True), Layout(4, True)]
_EXCEPTION = re.compile(r"^(?:\[rank\d+\]:\s*)?([\w.]*(?:Error|Exception)(?::.*)?)$")  # torchrun's prefix dropped


def flags(shape: str, precision: str, layers: int, tp: int, sp: bool, hidden: Optional[int] = None,
          seq: Optional[int] = None, cp: int = 1, ep: int = 1) -> list[str]:
    """The command line both programs run for one configuration."""
    line = [*common_flags(layers), *SAVED_SHAPES[shape], *PRECISIONS[precision]]
    for flag, value in (("--hidden-size", hidden), ("--seq-length", seq), ("--max-position-embeddings", seq),
                        ("--global-batch-size", 2 * ep if ep > 1 else None)):  # 2 micro-batches on each EP rank
        if value is not None:
            line[line.index(flag) + 1] = str(value)
    if tp > 1:
        line += ["--tensor-model-parallel-size", str(tp)]
    if sp:
        line.append("--sequence-parallel")
    if cp > 1:
        line += ["--context-parallel-size", str(cp)]
    if ep > 1:
        line += ["--expert-model-parallel-size", str(ep)]
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
    reasons = [match[1].strip() for match in map(_EXCEPTION.match, lines) if match and "ChildFailedError" not in match[1]]
    return f"{what}: " + (reasons[0] if reasons else " / ".join(line.strip() for line in lines[-3:]))


def _count(program: str, line: list[str], ranks: int, out: Path, kit_tree: Optional[Path]) -> Optional[str]:
    if program == OURS:
        return _torchrun(ranks, [str(Path(__file__).resolve()), "--worker", str(out), "--", *line], program)
    return _torchrun(ranks, [str(ROOT / "scripts/bench/megatron_lm_cpu.py"), "--megatron-lm", str(kit_tree),
                             "--count-saved", str(out), "--", *line, "--data-cache-path", str(out.parent / "cache"),
                             "--no-gradient-accumulation-fusion"], program)


def rows(program: str, layers: int, shapes: list[str], precisions: list[str], layouts: list[Layout],
         scratch: Path, kit_tree: Optional[Path] = None, hidden: Optional[int] = None,
         seq: Optional[int] = None) -> list[dict]:
    """Each configuration's count at 2L and L layers, and per layer (or why the program refused it)."""
    result = []
    for shape in shapes:
        for precision in precisions:
            for layout in layouts:
                tp, sp, cp, ep = layout.tp, layout.sp, layout.cp, layout.ep
                row = {"program": program, "shape": shape, "precision": precision, "tp": tp, "sp": sp,
                       "layers": 2 * layers}
                row.update({"cp": cp} if cp > 1 else {}, **({"ep": ep} if ep > 1 else {}))
                counts = {}
                for depth in (2 * layers, layers):
                    line = flags(shape, precision, depth, tp, sp, hidden, seq, cp, ep)
                    out = scratch / f"{program[:4]}-{shape}-{precision}-{tp}-{sp}-{cp}-{ep}-{depth}.json".replace(
                        " ", "_")
                    refused = _count(program, line, layout.ranks(), out, kit_tree)
                    if refused is not None:
                        row["refused"] = refused
                        break
                    counts[depth] = json.loads(out.read_text())
                if "refused" not in row:
                    line = flags(shape, precision, layers, tp, sp, hidden, seq, cp, ep)
                    tokens = _value(line, "--seq-length") * _value(line, "--micro-batch-size") * \
                        _value(line, "--hidden-size") // (tp if sp else 1) // cp
                    row.update(hidden=_value(line, "--hidden-size"), seq=_value(line, "--seq-length"),
                               per_micro_batch=counts[2 * layers]["total"],
                               per_layer=per_layer(counts[2 * layers], counts[layers], layers),
                               shb=tokens)
                    row["per_shb"] = row["per_layer"]["total"] / tokens
                result.append(row)
                print(json.dumps({k: v for k, v in row.items() if k != "per_layer"} |
                                 {"per_layer": row.get("per_layer", {}).get("total")}), flush=True)
    return result


def _share(layout: Layout) -> str:
    """What per s*b*h divides by: a rank's share of the sequence between blocks."""
    return "s*b*h" + "/t" * layout.sp + "/c" * (layout.cp > 1)


_A_LAYER = {"gpt2": "a GPT-2-shaped", "llama": "a Llama-shaped", "mla": "an MLA", "moe": "an MoE"}


def _key(row: dict) -> tuple:
    return row["shape"], row["precision"], Layout.of(row)


def _detailed(row: dict) -> bool:
    """Whether a row's saved tensors get a table of their own: Llama bf16 at TP 1 and TP 2 SP, and every bf16 row
    beyond the dense shapes' TP layouts (MLA, MoE, CP, EP)."""
    layout = Layout.of(row)
    return row["precision"] == "bf16" and (
        (row["shape"] == "llama" and layout in (Layout(1), Layout(2, True))) or
        row["shape"] not in SHAPES or layout.cp > 1 or layout.ep > 1)


def markdown_table(result: dict) -> str:
    """docs/performance.md's tables from --output files (their rows together): per configuration both programs'
    bytes saved per layer and per s*b*h (s*b*h/t under SP, /c under CP), then each saved tensor of the layers
    `_detailed` picks."""
    lines = ["| shape | precision | layout | this project: bytes a layer | per s*b*h (/t under SP, /c under CP) | "
             "Megatron-LM: bytes a layer | per s*b*h (/t, /c) |", "|---|---|---|---:|---:|---:|---:|"]

    def order(row: dict) -> tuple:
        layout = Layout.of(row)
        return (list(SAVED_SHAPES).index(row["shape"]), list(PRECISIONS).index(row["precision"]), layout.ep,
                layout.cp, layout.tp, layout.sp)

    ours, megatron = sorted(result["ours"], key=order), sorted(result.get("megatron", []), key=order)

    def cells(row: Optional[dict]) -> list[str]:
        if row is None:
            return ["-", "-"]
        if "refused" in row:
            return ["refused", "-"]
        return [f"{row['per_layer']['total']:,.0f}", f"{row['per_shb']:.2f}"]

    def find(among: list[dict], row: dict) -> Optional[dict]:
        return next((other for other in among if _key(other) == _key(row)), None)

    for row in ours:
        lines.append(f"| {row['shape']} | {row['precision']} | {Layout.of(row)} | " +
                     " | ".join(cells(row) + cells(find(megatron, row))) + " |")
    refusals = [row for row in ours + megatron if "refused" in row]
    for row in refusals:
        lines.append(f"\n{row['program']} refused {row['shape']} {row['precision']} {Layout.of(row)}: "
                     f"{row['refused']}")
    for mine in (row for row in ours if _detailed(row) and "per_layer" in row):
        share = _share(Layout.of(mine))
        lines += ["", f"Each saved tensor of {_A_LAYER[mine['shape']]} bf16 layer at {Layout.of(mine)} (made by: "
                      f"module, op; bytes a layer; per {share}):", "",
                  f"| program | made by | saved by | bytes a layer | per {share} |", "|---|---|---|---:|---:|"]
        for row in (mine, find(megatron, mine)):
            if row is None or "per_layer" not in row:
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
    parser.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SAVED_SHAPES))
    parser.add_argument("--precisions", nargs="+", default=["bf16"], choices=list(PRECISIONS))
    parser.add_argument("--layouts", nargs="+", type=Layout.parse, default=LAYOUTS,
                        help="TP sizes, then 'sp' for --sequence-parallel, 'cp2' for CP 2, 'ep2' for EP 2 "
                             "(default: 1 2 2sp 4sp)")
    parser.add_argument("--hidden", type=int, help="--hidden-size instead of 128")
    parser.add_argument("--seq", type=int, help="--seq-length instead of 128")
    parser.add_argument("--output", type=Path, help="write every row as JSON here")
    parser.add_argument("--add", action="store_true",
                        help="keep --output's rows of the configurations not counted now")
    parser.add_argument("--table", type=Path, nargs="+",
                        help="print the markdown tables of --output files (their rows together) and exit")
    parser.add_argument("--worker", type=Path, help=argparse.SUPPRESS)  # one torchrun rank of our count
    parser.add_argument("flags", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.table is not None:
        files = [json.loads(path.read_text(encoding="utf-8")) for path in args.table]
        print(markdown_table({side: [row for file in files for row in file.get(side, [])]
                              for side in ("ours", "megatron")}))
        return 0
    if args.worker is not None:
        _worker(args.worker, [flag for flag in args.flags if flag != "--"])
        return 0
    with tempfile.TemporaryDirectory(prefix="saved-bytes-") as scratch_name:
        scratch = Path(scratch_name)
        result = {"ours": rows(OURS, args.layers, args.shapes, args.precisions, args.layouts, scratch, hidden=args.hidden,
                               seq=args.seq)}
        if args.megatron_lm is not None:
            from scripts.tools.megatron_checkpoint_fixtures import megatron_tree

            tree = megatron_tree(args.megatron_lm.resolve(), scratch)
            result["megatron"] = rows(MEGATRON, args.layers, args.shapes,
                                      [p for p in args.precisions if not p.startswith("fp8")], args.layouts, scratch,
                                      kit_tree=tree, hidden=args.hidden, seq=args.seq)
    if args.output is not None:
        if args.add and args.output.exists():
            kept = json.loads(args.output.read_text(encoding="utf-8"))
            result = {side: [row for row in kept.get(side, []) if (row["program"], *_key(row)) not in
                             {(new["program"], *_key(new)) for new in result.get(side, [])}] + result.get(side, [])
                      for side in ("ours", "megatron")}
        args.output.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
