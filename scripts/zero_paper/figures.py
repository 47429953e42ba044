"""The paper's Figures 2-8 drawn from our numbers (matplotlib, Agg): one function per figure. Every mark's
legend says "predicted", "measured" or "paper", and the line under each title says it for the whole figure
(`provenance`); throughput counts the recompute; a point that does not fit is an x on the axis."""

from __future__ import annotations

import textwrap
from collections import defaultdict
from pathlib import Path
from typing import Optional, Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from measurements import measured_points, provenance  # noqa: E402
from memory_parts import PARTS, memory_parts  # noqa: E402
from paper_values import PAPER_STATED  # noqa: E402
from planner.paper_tables import PAPER_FIGURE6, format_parameters  # noqa: E402

PREDICTED = dict(marker="o", markerfacecolor="white", linestyle="--")
MEASURED = dict(marker="o", linestyle="none", markersize=8)
PAPER = dict(marker="*", color="black", markersize=14, linestyle="none", zorder=5)
SEARCHED = dict(marker="D", markersize=8, linestyle="none", zorder=4)
NOT_FIT = dict(marker="x", color="red", markersize=9, linestyle="none", clip_on=False, zorder=5)
SERIES_COLORS = {"zero": "tab:blue", "megatron": "tab:orange", "ddp": "tab:orange", "C1": "tab:gray",
                 "C2": "tab:olive", "C3": "tab:cyan", "C4": "tab:blue", "C5": "tab:purple"}
SERIES_NAMES = {"zero": "ZeRO", "megatron": "Megatron alone (baseline)", "ddp": "plain DP (DDP baseline)"}
PROFILE_TITLES = {"dgx2": "DGX-2: 16 x V100 32GB per node (the paper's cluster)", "h100": "H100: 8 x 80GB per node"}
TFLOPS_LABEL = "TFLOP/s per GPU (with recompute)"


def stated(figure: str, words: str):
    (value,) = [v for v in PAPER_STATED if v.figure == figure and words in v.quantity]
    return value


def _by_series(rows):
    grouped = defaultdict(list)
    for row in rows:
        grouped[row.point.series].append(row)
    return grouped


def _throughput_panel(ax, rows, x_of, series_order: Sequence[str]):
    """Predicted lines and measured points per series; points that do not fit as x on the axis."""
    grouped = _by_series(rows)
    for series in series_order:
        items = sorted(grouped.get(series, []), key=x_of)
        color = SERIES_COLORS.get(series)
        name = SERIES_NAMES.get(series, series)
        fitting = [r for r in items if r.plan.fits]
        if fitting:
            ax.plot([x_of(r) for r in fitting], [r.prediction.hardware_tflops_per_gpu for r in fitting], color=color,
                    label=f"{name}: predicted", **PREDICTED)
        measured = [r for r in items if r.measured is not None and r.measured.completed]
        if measured:
            ax.plot([x_of(r) for r in measured], [r.measured.tflops_per_gpu for r in measured], color=color,
                    label=f"{name}: measured", **MEASURED)
        out = [r for r in items if not r.plan.fits]
        if out:
            ax.plot([x_of(r) for r in out], [0] * len(out), label=f"{name}: planner says it does not fit", **NOT_FIT)
    ax.grid(alpha=0.3)


def _panels(count: int, width: float = 7.0):
    fig, axes = plt.subplots(1, count, figsize=(width * count, 5), squeeze=False)
    return fig, axes[0]


def _measured_and_planned_bars(ax, names: Sequence[str], value_of, label_format: str) -> None:
    """Side by side per name: the CPU mini-reproduction's measurement and the planner's figure."""
    for offset, which, color, label in ((-0.2, "measured", "tab:red", "measured on CPU (TP 2 x DP 2, gloo)"),
                                        (0.2, "planned", "tab:blue", "predicted (planner)")):
        values = [value_of(name, which) for name in names]
        bars = ax.bar([x + offset for x in range(len(names))], values, 0.4, color=color, alpha=0.8, label=label)
        ax.bar_label(bars, labels=[label_format.format(v) for v in values], fontsize=7)
    ax.set_xticks(range(len(names)), names)


def _headroom(ax, factor: float = 1.45) -> None:
    """The y axis from 0 to above everything drawn, with room for the legend."""
    tops = [max((float(y) for y in line.get_ydata()), default=0.0) for line in ax.lines]
    for collection in ax.collections:
        tops += [float(segment[:, 1].max()) for segment in collection.get_segments()] \
            if hasattr(collection, "get_segments") else []
    ax.set_ylim(0, max(tops + [1.0]) * factor)


def _gpus(rows) -> str:
    return "/".join(str(n) for n in sorted({r.point.world_size for r in rows}))


def _parameters_b(row) -> float:
    return row.plan.parameters_total / 1e9


def plot_fig2(rows_by_profile: dict, path: Path) -> None:
    fig, axes = _panels(len(rows_by_profile))
    for ax, (profile, rows) in zip(axes, rows_by_profile.items()):
        _throughput_panel(ax, rows, _parameters_b, ("zero", "megatron"))
        if profile == "dgx2":
            at_100b, aggregate = stated("fig2", "at 100B"), stated("fig2", "aggregate")
            baseline = stated("fig2", "Megatron")
            ax.plot([100], [at_100b.value], label=f"paper: ZeRO > {at_100b.value:g} TFLOP/s per GPU at 100B", **PAPER)
            ax.plot([40], [baseline.value], label=f"paper: Megatron 40B on two nodes ~{baseline.value:g}",
                    **{**PAPER, "marker": "P", "markersize": 11})
            per_gpu = aggregate.value * 1e3 / 400
            ax.hlines(per_gpu, 8, 100, colors="black", linestyles=":",
                      label=f"paper: ~{aggregate.value:g} PFLOP/s on 400 GPUs over 8B-100B ({per_gpu:.1f} per GPU)")
        ax.set_xscale("log")
        ax.set_xticks([1.5, 8, 17.9, 26.8, 40, 60, 100, 170])
        ax.get_xaxis().set_major_formatter(matplotlib.ticker.FormatStrFormatter("%g"))
        ax.set_xlabel("model size (billions of parameters)")
        ax.set_ylabel(TFLOPS_LABEL)
        ax.set_title(f"{PROFILE_TITLES[profile]}, {_gpus(rows)} GPUs", fontsize=10)
        _headroom(ax)
        ax.legend(fontsize=7, loc="upper right")
    _title(fig, "Figure 2: throughput per GPU by model size, ZeRO (P_os+g, MP in a node) against Megatron alone",
           measured_points("fig2", rows_by_profile))
    _save(fig, path)


def plot_fig3(rows_by_profile: dict, path: Path) -> None:
    fig, axes = _panels(len(rows_by_profile))
    for ax, (profile, rows) in zip(axes, rows_by_profile.items()):
        rows = sorted(rows, key=lambda r: r.point.world_size)
        _throughput_panel(ax, rows, lambda r: r.point.world_size, ("zero",))
        for row in rows:
            ax.annotate(f"micro batch {row.point.micro_batch}", (row.point.world_size, row.prediction.hardware_tflops_per_gpu),
                        textcoords="offset points", xytext=(0, 8), ha="center", fontsize=7)
        fitting = [r for r in rows if r.plan.fits]
        if fitting:
            twin = ax.twinx()
            gpus = [r.point.world_size for r in fitting]
            aggregate = [r.prediction.hardware_tflops_per_gpu * r.point.world_size / 1e3 for r in fitting]
            twin.plot(gpus, aggregate, color="tab:green", label="aggregate PFLOP/s: predicted", **PREDICTED)
            twin.plot(gpus, [aggregate[0] * g / gpus[0] for g in gpus], color="tab:green", linestyle=":",
                      label=f"aggregate if linear from {gpus[0]} GPUs")
            twin.set_ylabel("aggregate PFLOP/s", color="tab:green")
            twin.set_ylim(0, max(aggregate) * 1.3)  # below the paper's note at the top
            twin.legend(fontsize=7, loc="lower right")
        claim = stated("fig3", "superlinear")
        ax.text(0.02, 0.97, f"paper (no number given): {claim.quantity}", transform=ax.transAxes, fontsize=7,
                va="top", bbox=dict(facecolor="white", alpha=0.8, edgecolor="black"))
        ax.set_xticks([r.point.world_size for r in rows])
        ax.set_xlabel("GPUs")
        ax.set_ylabel(TFLOPS_LABEL)
        ax.set_title(f"{PROFILE_TITLES[profile]}: 60B, MP in a node", fontsize=10)
        _headroom(ax)
        ax.legend(fontsize=7, loc="lower left")
    _title(fig, "Figure 3: the 60B model from 64 to 400 GPUs (micro batch per GPU rising with the GPUs, as the "
                "authors' sweeps)", measured_points("fig3", rows_by_profile))
    _save(fig, path)


def plot_fig4(rows_by_profile: dict, max_sizes: dict, searched: dict, path: Path) -> None:
    """max_sizes: {(profile, series): parameters} from the planner's search without MP; searched:
    {(profile, series): (parameters, predicted TFLOP/s)} of those models at micro batch 1, drawn
    beside the points as the table beside them lists them."""
    fig, axes = _panels(len(rows_by_profile) + 1, 6.5)
    for ax, (profile, rows) in zip(axes, rows_by_profile.items()):
        _throughput_panel(ax, rows, _parameters_b, ("zero", "ddp"))
        for series in ("zero", "ddp"):
            if (profile, series) in searched:
                parameters, tflops = searched[(profile, series)]
                ax.plot([parameters / 1e9], [tflops], color=SERIES_COLORS[series],
                        label=f"{SERIES_NAMES[series]}: predicted at its largest, micro batch 1 (planner search)",
                        **SEARCHED)
        if profile == "dgx2":
            zero, ddp = stated("fig4", "throughput per GPU without MP"), stated("fig4", "DDP throughput")
            ax.hlines(zero.value, 1.16, 13, colors="black", linestyles=":", label=f"paper: ZeRO > {zero.value:g} up to 13B")
            ax.plot([1.4], [ddp.value], label=f"paper: DDP < {ddp.value:g} at its largest, 1.4B",
                    **{**PAPER, "marker": "v", "markersize": 10})
        ax.set_xlabel("model size (billions of parameters)")
        ax.set_ylabel(TFLOPS_LABEL)
        ax.set_title(f"{PROFILE_TITLES[profile]}, {_gpus(rows)} GPUs, no MP", fontsize=10)
        _headroom(ax, 2.0)  # a legend of seven lines above the points
        ax.legend(fontsize=7, loc="upper right")
    ax = axes[-1]
    profiles = list(rows_by_profile)
    width = 0.35
    for offset, series in ((-width / 2, "ddp"), (width / 2, "zero")):
        values = [max_sizes.get((p, series), 0) / 1e9 for p in profiles]
        bars = ax.bar([i + offset for i in range(len(profiles))], values, width, color=SERIES_COLORS[series],
                      label=f"{SERIES_NAMES[series]}: predicted largest (planner)", alpha=0.8)
        ax.bar_label(bars, labels=[f"{v:.1f}B" for v in values], fontsize=8)
    if "dgx2" in profiles:
        i = profiles.index("dgx2")
        ax.plot([i - width / 2], [stated("fig4", "plain data").value / 1e9], label="paper: DDP 1.4B", **PAPER)
        ax.plot([i + width / 2], [stated("fig4", "largest model without MP").value / 1e9], label="paper: ZeRO 13B",
                **{**PAPER, "marker": "P", "markersize": 11})
    ax.set_xticks(range(len(profiles)), [p for p in profiles])
    ax.set_ylabel("largest model without MP (billions)")
    ax.set_title("largest model without MP, same GPUs (micro batch 1)", fontsize=10)
    ax.legend(fontsize=7, loc="upper left")
    _title(fig, "Figure 4: ZeRO data parallelism without model parallelism, against plain data parallelism",
           measured_points("fig4", rows_by_profile))
    _save(fig, path)


def plot_fig6(max_sizes: dict, measured_max: dict, in_c1_budget: Optional[dict], setting: str, path: Path,
              cpu_source: Optional[str] = None) -> None:
    """max_sizes: {(profile, C): parameters} (planner search); measured_max: {(profile, C): parameters}
    of the largest run that completed; in_c1_budget: the mini-reproduction's layers per configuration;
    setting: the grid and batch, in words; cpu_source: the mini-reproduction's command and date."""
    profiles = sorted({p for p, _ in max_sizes}, key=lambda p: list(PROFILE_TITLES).index(p))
    names = ["C1", "C2", "C3", "C4", "C5"]
    fig, axes = _panels(1 + (in_c1_budget is not None))
    ax = axes[0]
    width = 0.8 / len(profiles)
    for index, profile in enumerate(profiles):
        xs = [i + (index - (len(profiles) - 1) / 2) * width for i in range(len(names))]
        values = [max_sizes.get((profile, c), 0) / 1e9 for c in names]
        bars = ax.bar(xs, values, width, label=f"{profile}: predicted largest (planner search)", alpha=0.8,
                      color="tab:blue" if profile == "dgx2" else "tab:green")
        ax.bar_label(bars, labels=[f"{v:.0f}B" for v in values], fontsize=7)
        runs = [(x, measured_max[(profile, c)] / 1e9) for x, c in zip(xs, names) if (profile, c) in measured_max]
        if runs:
            ax.plot(*zip(*runs), color="black", label=f"{profile}: measured (largest run that completed)", **MEASURED)
        if profile == "dgx2":
            paper = [(x, PAPER_FIGURE6[c] / 1e9) for x, c in zip(xs, names) if PAPER_FIGURE6.get(c)]
            ax.plot(*zip(*paper), label="paper, Figure 6 (no C3 value)", **PAPER)
    ax.set_xticks(range(len(names)), ["C1\nP_os", "C2\nP_os+P_a", "C3\nP_os+g", "C4\nP_os+g+P_a", "C5\nP_os+g+P_a+cpu"],
                  fontsize=8)
    ax.set_ylabel("largest model (billions of parameters)")
    ax.set_title(setting, fontsize=10)
    ax.legend(fontsize=7, loc="upper left")
    if in_c1_budget is not None:
        ax = axes[1]
        _measured_and_planned_bars(ax, [c for c in names if c in in_c1_budget],
                                   lambda name, which: in_c1_budget[name][which], "{:.1f}")
        ax.set_ylabel("layers that fit in C1's memory at the deeper depth")
        ax.set_title("mini-reproduction: bytes per layer measured on a CPU (TP 2 x DP 2, gloo)", fontsize=10)
        ax.legend(fontsize=7, loc="upper left")
    _title(fig, "Figure 6: the largest model each ZeRO configuration trains", len(measured_max),
           cpu_source if in_c1_budget is not None else None)
    _save(fig, path)


def plot_fig7(rows_by_profile: dict, memory: Optional[dict], path: Path, cpu_source: Optional[str] = None) -> None:
    """memory: mini_analysis.memory_by_configuration of the CPU mini-reproduction, or None;
    cpu_source: its command and date."""
    fig, axes = _panels(len(rows_by_profile) + (memory is not None), 6.5)
    for ax, (profile, rows) in zip(axes, rows_by_profile.items()):
        rows = sorted(rows, key=lambda r: (r.plan.parameters_total, r.point.series))
        xs = range(len(rows))
        bottom = [0.0] * len(rows)
        # Each stack adds up to the plan's peak, the table's figure (memory_parts.py)
        for (name, color), part in zip(PARTS, zip(*(memory_parts(r.plan) for r in rows))):
            heights = [value / 2**30 for value in part]
            ax.bar(xs, heights, 0.7, bottom=bottom, color=color, label=f"predicted: {name}")
            bottom = [b + h for b, h in zip(bottom, heights)]
        measured = [(x, r.measured.memory_bytes / 2**30) for x, r in zip(xs, rows)
                    if r.measured is not None and r.measured.memory_bytes]
        if measured:
            ax.plot(*zip(*measured), color="black", label="measured: max allocated", **MEASURED)
        budget = rows[0].point.hardware.gpu_memory_bytes / 2**30
        ax.axhline(budget, color="red", linestyle=":", label=f"GPU memory ({budget:.1f} GiB)")
        ax.set_ylim(0, max(bottom + [budget]) * 1.4)  # the budget line clear of the legend
        ax.set_xticks(list(xs), [f"{r.point.series}\n{format_parameters(r.plan.parameters_total)}" for r in rows],
                      fontsize=7)
        ax.set_ylabel("per-GPU memory (GiB)")
        ax.set_title(f"{PROFILE_TITLES[profile]}, {_gpus(rows)} GPUs, micro batch {rows[0].point.micro_batch}",
                     fontsize=10)
        ax.legend(fontsize=7, loc="upper right")
        ax.text(0.02, 0.97, "paper (no numbers): falls C1 -> C2; C4 -> C5 falls\nfor 100B but not for 40B",
                transform=ax.transAxes, fontsize=7, va="top", bbox=dict(facecolor="white", alpha=0.8))
    if memory is not None:
        ax = axes[-1]
        names = sorted(memory)
        _measured_and_planned_bars(ax, names, lambda name, which: getattr(memory[name], which)[1] / 2**20, "{:.1f}")
        depth = memory[names[0]].layers[1]
        ax.set_ylabel("per-rank device memory (MiB)")
        ax.set_title(f"mini-reproduction measured on a CPU, TP 2 x DP 2, {depth} layers:\nmodel states + buffers + "
                     "saved for backward", fontsize=10)
        ax.legend(fontsize=7, loc="upper right")
    _title(fig, "Figure 7: per-GPU memory of C1-C5 for a 40B and a 100B model", measured_points("fig7", rows_by_profile),
           cpu_source if memory is not None else None)
    _save(fig, path)


def plot_fig8(rows_by_profile: dict, largest_by_profile: dict, path: Path) -> None:
    """Bars: each point at the largest micro batch the planner fits (largest_by_profile, report.py's
    fig8_largest_batch, as the paper ran Figure 8); diamonds: the same point at the definitions' fixed
    micro batch (rows_by_profile), so the gain a configuration's freed memory buys is the gap."""
    fig, axes = _panels(len(rows_by_profile))
    for ax, (profile, rows) in zip(axes, rows_by_profile.items()):
        order = sorted(range(len(rows)), key=lambda i: (rows[i].plan.parameters_total, rows[i].point.series))
        fixed = [rows[i] for i in order]
        largest = [largest_by_profile[profile][i] for i in order]
        xs = list(range(len(fixed)))
        heights = [r.prediction.hardware_tflops_per_gpu if r.plan.fits else 0.0 for r in largest]
        bars = ax.bar(xs, heights, 0.7, color=[SERIES_COLORS[r.point.series] for r in largest], alpha=0.8,
                      label="predicted at the largest micro batch that fits (under each bar)")
        ax.bar_label(bars, labels=[f"{h:.1f}\nmb {r.point.micro_batch}" if r.plan.fits else ""
                                   for h, r in zip(heights, largest)], fontsize=7)
        at_fixed = [(x, r.prediction.hardware_tflops_per_gpu) for x, r in zip(xs, fixed) if r.plan.fits]
        if at_fixed:
            batches = "/".join(sorted({str(r.point.micro_batch) for r in fixed}))
            ax.plot(*zip(*at_fixed), color="black", label=f"predicted at the fixed micro batch {batches}",
                    **{**SEARCHED, "markersize": 6})
        out = [x for x, r in zip(xs, largest) if not r.plan.fits]
        if out:
            ax.plot(out, [0] * len(out), label="planner: does not fit at micro batch 1", **NOT_FIT)
        measured = [(x, r.measured.tflops_per_gpu) for x, r in zip(xs, fixed)
                    if r.measured is not None and r.measured.completed]
        if measured:
            ax.plot(*zip(*measured), color="black", label="measured (fixed micro batch)", **MEASURED)
        ax.set_xticks(xs, [f"{r.point.series}\n{format_parameters(r.plan.parameters_total)}" for r in fixed], fontsize=7)
        ax.set_ylabel(TFLOPS_LABEL)
        ax.set_ylim(0, max(heights + [y for _, y in at_fixed] + [1]) * 1.45)  # room for the legend
        ax.set_title(f"{PROFILE_TITLES[profile]}, {_gpus(rows)} GPUs", fontsize=10)
        ax.legend(fontsize=7, loc="upper left")
        ax.text(0.98, 0.97, "paper (no numbers): a larger batch\nfits as memory falls; C5 slower\nthan C4 at 60B; "
                "170B runs only with C5", transform=ax.transAxes, fontsize=7, va="top", ha="right",
                bbox=dict(facecolor="white", alpha=0.8))
    _title(fig, "Figure 8: throughput per GPU of C1-C5 at the largest micro batch each fits",
           measured_points("fig8", rows_by_profile))
    _save(fig, path)


def _title(fig, title: str, measured: int, cpu_source: Optional[str] = None) -> None:
    _wrap_to(fig.suptitle(f"{title}\n{provenance(measured, cpu_source)}"), fig.bbox.width * 0.98)


def _wrap_to(text, width: float) -> None:
    """Re-wraps `text` at spaces until it is no wider than `width` pixels: Agg cuts off what passes the
    figure's edge, and a provenance line is wider than a two-panel figure (issue 94)."""
    renderer = text.figure.canvas.get_renderer()
    lines = text.get_text().split("\n")
    columns = max(len(line) for line in lines)
    while text.get_window_extent(renderer).width > width and columns > 20:
        columns = int(columns * 0.9)
        text.set_text("\n".join(textwrap.fill(line, columns) for line in lines))


def _save(fig, path: Path) -> None:
    fig.tight_layout()
    for ax in fig.axes:  # a panel's title no wider than its panel, then the layout again for the new lines
        _wrap_to(ax.title, ax.bbox.width)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
