"""Small definitions of the ZeRO paper's figures for the report's and compare.py's tests: the same
columns as scripts/zero_paper/experiments/figN.dat, but 1.16B-shaped points on one DGX-2 node, so
every dry run and max-size search takes a second or two."""
from __future__ import annotations

from pathlib import Path

SMALL_DEFINITIONS = {
    "fig2": ["dgx2 zero-1.16b zero 1 16 2 24 1920 16 2 16 2 1 0 1 5e8 2e8 5",
             "dgx2 megatron-1.16b megatron 1 16 2 24 1920 16 2 16 0 0 0 0 5e8 2e8 5"],
    "fig3": ["dgx2 zero-8gpus zero 1 8 2 24 1920 16 2 8 2 1 1 1 5e8 2e8 5",
             "dgx2 zero-16gpus zero 1 16 2 24 1920 16 4 32 2 1 1 1 5e8 2e8 5"],
    "fig4": ["dgx2 zero-1.16b zero 1 16 1 24 1920 16 2 32 2 0 0 1 5e8 2e8 5",
             "dgx2 ddp-1.16b ddp 1 16 1 24 1920 16 2 32 0 0 0 0 5e8 2e8 5"],
}
for _figure in ("fig6", "fig7", "fig8"):
    SMALL_DEFINITIONS[_figure] = [
        f"dgx2 {name.lower()}-1.16b {name} 1 16 2 24 1920 16 2 16 {stage} {pa} {cpu} 1 5e8 2e8 5"
        for name, (stage, pa, cpu) in {"C1": (1, 0, 0), "C2": (1, 1, 0), "C3": (2, 0, 0),
                                       "C4": (2, 1, 0), "C5": (2, 1, 1)}.items()]


def write_small_definitions(folder: Path, columns) -> Path:
    """Writes figN.dat for every figure of SMALL_DEFINITIONS into `folder` (made if absent), headed
    by `columns` (experiments.COLUMNS)."""
    folder.mkdir(parents=True, exist_ok=True)
    for figure, rows in SMALL_DEFINITIONS.items():
        (folder / f"{figure}.dat").write_text("\n".join([" ".join(columns), *rows]) + "\n")
    return folder
