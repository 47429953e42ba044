#!/usr/bin/env python
"""Kernel launches per micro-batch and per layer, counted on the CPU: this project's training step and Megatron-LM's
own pretrain_gpt.py on the same command line, and one FP8 linear per recipe (docs/performance.md).

    python scripts/bench/benchmark_host_ops.py [--megatron-lm KIT] [--output counts.json]

Per layer: a 2L- less an L-layer model, over L."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Optional

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from scripts.bench.op_counter import (  # noqa: E402
    OUTSIDE,
    LaunchCounter,
    LaunchCounts,
    count_calls,
    inductor_kernel_events,
)
from training.step_observer import NoObserver  # noqa: E402

VOCAB = 127  # NullTokenizer's --vocab-size: 127 ids and its end-of-document, 128 rows
HIDDEN, HEADS, SEQUENCE, MICRO_BATCHES = 128, 4, 128, 2


def common_flags(layers: int) -> list[str]:
    """Megatron-LM's command line both programs run (its torch path: the fusions needing apex or TE off)."""
    return ["--num-layers", str(layers), "--hidden-size", str(HIDDEN), "--num-attention-heads", str(HEADS),
            "--seq-length", str(SEQUENCE), "--max-position-embeddings", str(SEQUENCE), "--micro-batch-size", "1",
            "--global-batch-size", str(MICRO_BATCHES), "--train-iters", "2", "--lr", "1e-4", "--min-lr", "1e-5",
            "--lr-decay-style", "cosine", "--lr-warmup-iters", "1", "--weight-decay", "0.1", "--clip-grad", "1.0",
            "--seed", "1234", "--tokenizer-type", "NullTokenizer", "--vocab-size", str(VOCAB),
            "--make-vocab-size-divisible-by", "128", "--hidden-dropout", "0", "--attention-dropout", "0",
            "--transformer-impl", "local", "--no-persist-layer-norm", "--no-masked-softmax-fusion",
            "--no-rope-fusion", "--no-bias-gelu-fusion", "--no-bias-swiglu-fusion", "--log-interval", "1",
            "--eval-iters", "0", "--eval-interval", "1000", "--mock-data"]


SHAPES = {
    "gpt2": [],
    "llama": ["--normalization", "RMSNorm", "--swiglu", "--position-embedding-type", "rope",
              "--untie-embeddings-and-output-weights", "--disable-bias-linear", "--group-query-attention",
              "--num-query-groups", "2"],
}
PRECISIONS = {
    "fp32": [],
    "bf16": ["--bf16"],
    "fp8 delayed": ["--bf16", "--fp8-format", "hybrid", "--fp8-recipe", "delayed"],
    "fp8 tensorwise": ["--bf16", "--fp8-format", "hybrid", "--fp8-recipe", "tensorwise"],
    "fp8 blockwise": ["--bf16", "--fp8-format", "e4m3", "--fp8-recipe", "blockwise"],
}


class CountingObserver(NoObserver):
    """A live train step's observer that tells the counter where the step is: each micro-batch's forward and
    backward, and `outside` between micro-batches (the optimizer step)."""

    def __init__(self, counter: LaunchCounter) -> None:
        self.counter = counter
        self._micro_batch = OUTSIDE

    def micro_batch_start(self, micro_batch: int) -> None:
        self._micro_batch = f"micro_batch {micro_batch}"
        self.counter.enter_window(self._micro_batch)

    def micro_batch_end(self, micro_batch: int) -> None:
        self._micro_batch = OUTSIDE
        self.counter.enter_window(OUTSIDE)

    @contextlib.contextmanager
    def phase(self, name: str):
        self.counter.enter_window(self._micro_batch, name)
        try:
            yield
        finally:
            self.counter.enter_window(self._micro_batch)


def _batches():
    generator = torch.Generator().manual_seed(0)
    while True:
        yield {"tokens": torch.randint(0, VOCAB, (1, SEQUENCE + 1), generator=generator)}


def count_our_step(argv: list[str], compiled: bool = False) -> LaunchCounts:
    """Iteration 2 of this project's train step for `argv` (one process), counted by window."""
    from arguments.parser import parse_config
    from parallel.state import destroy, initialize_grid
    from training.build import build
    from training.run_settings import resolve_run_settings
    from training.train_step import DataParallelTrainStep

    # each model's blocks compiled afresh: dynamo's caches, kept across the models of one process, would reach its
    # recompile limit after 8 models and run the later ones' blocks eagerly
    torch._dynamo.reset()
    config = parse_config(argv)
    state = initialize_grid("cpu", config.parallel, 1)
    try:
        settings = resolve_run_settings(config, VOCAB + 1, 1, 1, "cpu")
        built = build(settings, state, dropout_rng=True, torch_compile=compiled)
        counter = LaunchCounter()
        step = DataParallelTrainStep(built.model, built.zero, _batches(), settings, state, built.activations,
                                     observer=CountingObserver(counter), rng=built.rng)
        with counter.counting():
            step(1, 0, measure_activations=False)
            counter.active = True
            counter.enter_window(OUTSIDE)
            step(2, settings.batch.global_batch_size, measure_activations=False)
            counter.active = False
        return counter.counts
    finally:
        destroy(state)


def summary(counts: LaunchCounts) -> dict:
    """The figures of one counted iteration: each micro-batch's forward and backward, and the rest."""
    figures = {}
    for micro_batch in range(MICRO_BATCHES):
        window = f"micro_batch {micro_batch}"
        figures[f"micro_batch_{micro_batch + 1}"] = {
            "forward": counts.total(window, "forward"), "backward": counts.total(window, "backward"),
            "total": counts.total(window)}
    figures["outside"] = counts.total(OUTSIDE)
    return figures


def per_layer(deep: dict, shallow: dict, layers: int) -> dict:
    """Each figure's difference between the two depths, per layer."""
    if isinstance(deep, dict):
        return {key: per_layer(deep[key], shallow[key], layers) for key in deep}
    return round((deep - shallow) / layers, 2)


def our_rows(layers: int, precisions: list[str], compiled_too: bool) -> list[dict]:
    rows = []
    for shape, shape_flags in SHAPES.items():
        for precision in precisions:
            for compiled in (False, True) if compiled_too else (False,):
                flags = [*shape_flags, *PRECISIONS[precision]]
                extra = ["--fp8-fused-casts", "on"] if precision.startswith("fp8") and _has_option("fp8_fused_casts") \
                    else []
                deep = summary(count_our_step(common_flags(2 * layers) + flags + extra, compiled))
                shallow = summary(count_our_step(common_flags(layers) + flags + extra, compiled))
                rows.append({"program": "this project", "shape": shape, "precision": precision,
                             "mode": "compile" if compiled else "eager", "layers": 2 * layers,
                             "per_micro_batch": deep, "per_layer": per_layer(deep, shallow, layers)})
                print(json.dumps(rows[-1]), flush=True)
    return rows


def _has_option(name: str) -> bool:
    from base.options import setting_names
    from gpt.model_config import ModelConfig

    return name in setting_names(ModelConfig)


def megatron_rows(kit: Path, layers: int, precisions: list[str]) -> list[dict]:
    """Megatron-LM's pretrain_gpt.py at 2L and L layers, counted by scripts/bench/megatron_lm_cpu.py."""
    from scripts.tools.megatron_checkpoint_fixtures import megatron_tree

    rows = []
    with tempfile.TemporaryDirectory(prefix="megatron-launches-") as scratch_name:
        scratch = Path(scratch_name)
        tree = megatron_tree(kit.resolve(), scratch)
        for shape, shape_flags in SHAPES.items():
            for precision in precisions:
                figures = {}
                for depth in (2 * layers, layers):
                    out = scratch / f"{shape}-{precision}-{depth}.json"
                    flags = [*common_flags(depth), *shape_flags, *PRECISIONS[precision],
                             "--data-cache-path", str(scratch / "cache"), "--no-gradient-accumulation-fusion"]
                    _launch_megatron(tree, flags, out)
                    figures[depth] = json.loads(out.read_text())
                rows.append({"program": "Megatron-LM core_v0.16.1 (torch path)", "shape": shape,
                             "precision": precision, "mode": "eager", "layers": 2 * layers,
                             "per_micro_batch": figures[2 * layers],
                             "per_layer": per_layer(figures[2 * layers], figures[layers], layers)})
                print(json.dumps(rows[-1]), flush=True)
    return rows


def _launch_megatron(tree: Path, flags: list[str], out: Path) -> None:
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "1",
               str(ROOT / "scripts/bench/megatron_lm_cpu.py"), "--megatron-lm", str(tree), "--count-launches", str(out),
               "--", *flags]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"Megatron-LM failed ({' '.join(flags)}):\n{done.stdout[-3000:]}\n{done.stderr[-6000:]}")


def fp8_linear_rows(fused_modes: list[Optional[str]]) -> list[dict]:
    """One FP8 linear (x [256, 256] -> 384, bf16, no bias, guard on and off, each --fp8-fused-casts mode of
    `fused_modes`) per recipe: the second micro-batch of an iteration (its weight unchanged since the first), forward
    and backward, a fresh activation each, as tests/parallel/test_fp8_launch_counts.py counts it."""
    from parallel.fp8.guard import LayerGuard
    from parallel.fp8.linear import Fp8LinearState, fp8_linear
    from parallel.fp8.recipes import Fp8Recipe

    rows = []
    tokens, inputs, outputs = 256, 256, 384
    for recipe in ("delayed", "tensorwise", "blockwise", "mxfp8"):
        for guarded in (True, False):
            for fused in fused_modes:
                weight = (torch.randn(outputs, inputs, dtype=torch.bfloat16) * 0.02).requires_grad_()
                # cache_weight: as a model's linears (gpt/fp8.py), the weight cast once an iteration and the second
                # call reusing it (parallel/fp8/weight_cache.py); a bare state casts it in every call (TE's
                # is_first_microbatch=None)
                state = Fp8LinearState(Fp8Recipe(fp8_format="hybrid" if recipe != "blockwise" else "e4m3",
                                                 recipe=recipe), cache_weight=True)
                if guarded:
                    state.guard = LayerGuard("linear")
                if fused is not None:
                    state.fused = fused == "on"

                def call(x, grad):
                    return lambda: fp8_linear(x, weight, None, state).backward(grad)
                # a fresh activation and gradient each micro-batch, made before the count
                calls = [call(torch.randn(tokens, inputs, dtype=torch.bfloat16, requires_grad=True),
                              torch.randn(tokens, outputs, dtype=torch.bfloat16)) for _ in range(2)]
                second, = count_calls(calls)  # the first casts the weight (and compiles); counted: the second
                rows.append({"recipe": recipe, "guard": guarded, "fused": fused, "launches": second.total(),
                             "ops": dict(second.ops())})
                print(json.dumps({k: v for k, v in rows[-1].items() if k != "ops"}), flush=True)
    return rows


def markdown_table(result: dict) -> str:
    """docs/performance.md's table from a --output file: per layer (forward + backward) and per micro-batch at 2L
    layers, each micro-batch the second of its iteration, and what runs once an iteration outside them."""
    lines = ["| program | precision | mode | GPT-2 shape: a layer | a micro-batch | once an iteration | "
             "Llama shape: a layer | a micro-batch | once an iteration |", "|---|---|---|---:|---:|---:|---:|---:|---:|"]
    rows = result["ours"] + result.get("megatron", [])
    keys = list(dict.fromkeys((row["program"], row["precision"], row["mode"]) for row in rows))
    for program, precision, mode in keys:
        cells = []
        for shape in SHAPES:
            row = next((row for row in rows if (row["program"], row["precision"], row["mode"], row["shape"]) ==
                        (program, precision, mode, shape)), None)
            if row is None:
                cells += ["-"] * 3
                continue
            layer = row["per_layer"]["micro_batch_2"]
            cells += [f"{layer['total']:g} ({layer['forward']:g} + {layer['backward']:g})",
                      f"{row['per_micro_batch']['micro_batch_2']['total']:,}", f"{row['per_micro_batch']['outside']:,}"]
        lines.append(f"| {program} | {precision} | {mode} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--megatron-lm", type=Path, help="Megatron-LM's kit (core_v0.16.1 tarball or its folder)")
    parser.add_argument("--layers", type=int, default=6, help="L: the models have 2L and L layers")
    parser.add_argument("--precisions", nargs="+", default=list(PRECISIONS), choices=list(PRECISIONS))
    parser.add_argument("--no-compile", action="store_true", help="eager rows only")
    parser.add_argument("--output", type=Path, help="write every row as JSON here")
    parser.add_argument("--table", type=Path, help="print the markdown table of a --output file and exit")
    args = parser.parse_args(argv)
    if args.table is not None:
        print(markdown_table(json.loads(args.table.read_text(encoding="utf-8"))))
        return 0
    torch.set_num_threads(1)
    with inductor_kernel_events():
        result = {"linear": fp8_linear_rows(["on", "off"]),
                  "ours": our_rows(args.layers, args.precisions, not args.no_compile)}
    if args.megatron_lm is not None:
        result["megatron"] = megatron_rows(args.megatron_lm, args.layers,
                                           [p for p in args.precisions if not p.startswith("fp8")])
    if args.output is not None:
        args.output.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
