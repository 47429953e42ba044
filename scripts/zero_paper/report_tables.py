"""report.md: the predictions against what the paper states, then every point of the paper's cluster (dgx2).
Every number is computed from the planner and the performance model (or a run); the paper's values come from
planner/paper_tables.py and paper_values.py."""

from __future__ import annotations

import statistics
from typing import Optional

from experiments import PROFILES
from measurements import measured_points, provenance
from mini_analysis import cpu_source, layers_in_c1_budget
from paper_values import PAPER_STATED
from planner.paper_tables import PAPER_FIGURE6, format_parameters
from planner.perf_model import load_constants
from zero.memory import format_bytes

RELATIONS = {">": "over", "~": "about", "<": "under"}
FALLS = 0.01  # a relative drop in memory past this counts as "falls"


def _rows(results, figure, profile="dgx2"):
    return results.get(figure, {}).get(profile, [])


def _near(rows, series, parameters, tolerance=0.1):
    """The row of `series` whose model is closest to `parameters`, if within `tolerance` of it."""
    candidates = [r for r in rows if r.point.series == series
                  and abs(r.plan.parameters_total - parameters) <= tolerance * parameters]
    return min(candidates, key=lambda r: abs(r.plan.parameters_total - parameters)) if candidates else None


def _tflops(row) -> Optional[float]:
    return row.prediction.hardware_tflops_per_gpu if row is not None and row.plan.fits else None


def predicted_for_stated(results, extras) -> list[tuple]:
    """(stated value, our prediction, what we compared) for each value the paper states."""
    out = []
    for value in PAPER_STATED:
        prediction, basis = None, ""
        if value.figure == "fig2" and "at 100B" in value.quantity:
            row = _near(_rows(results, "fig2"), "zero", 100e9)
            prediction, basis = _tflops(row), row and f"point {row.point.point}, micro batch {row.point.micro_batch}"
        elif value.figure == "fig2" and "aggregate" in value.quantity:
            rows = [r for r in _rows(results, "fig2") if r.point.series == "zero" and 7.5e9 <= r.plan.parameters_total <= 102e9
                    and r.plan.fits]
            if rows:
                prediction = statistics.mean(r.prediction.hardware_tflops_per_gpu for r in rows) * rows[0].point.world_size / 1e3
                basis = f"mean of {len(rows)} ZeRO points ({', '.join(r.point.point for r in rows)}) x 400 GPUs"
        elif value.figure == "fig2" and "Megatron" in value.quantity:
            two_nodes = [r for r in _rows(results, "fig2") if r.point.nodes == 2]
            row = _near(two_nodes, "megatron", 40e9)
            prediction = _tflops(row)
            basis = row and (f"point {row.point.point}: {row.point.nodes} nodes, MP {row.point.mp}, "
                             f"micro batch {row.point.micro_batch}")
        elif value.figure == "fig3":
            rows = sorted((r for r in _rows(results, "fig3") if r.plan.fits), key=lambda r: r.point.world_size)
            if len(rows) >= 2:
                prediction = rows[-1].prediction.hardware_tflops_per_gpu / rows[0].prediction.hardware_tflops_per_gpu
                basis = (f"{rows[0].point.world_size} GPUs at micro batch {rows[0].point.micro_batch}: "
                         f"{rows[0].prediction.hardware_tflops_per_gpu:.1f}; {rows[-1].point.world_size} at "
                         f"{rows[-1].point.micro_batch}: {rows[-1].prediction.hardware_tflops_per_gpu:.1f}")
        elif value.figure == "fig4" and "largest model without MP" in value.quantity:
            prediction = extras.get("fig4", {}).get(("dgx2", "zero"))
            basis = "planner search, stage 2, micro batch 1"
        elif value.figure == "fig4" and "plain data" in value.quantity:
            prediction = extras.get("fig4", {}).get(("dgx2", "ddp"))
            basis = "planner search, stage 0, micro batch 1"
        elif value.figure == "fig4" and "throughput per GPU without MP" in value.quantity:
            rows = [r for r in _rows(results, "fig4") if r.point.series == "zero" and r.plan.fits]
            if rows:
                prediction = statistics.mean(r.prediction.hardware_tflops_per_gpu for r in rows)
                basis = f"mean of the {len(rows)} ZeRO points, {format_parameters(min(r.plan.parameters_total for r in rows))}-{format_parameters(max(r.plan.parameters_total for r in rows))}"
        elif value.figure == "fig4" and "DDP throughput" in value.quantity:
            # The paper: "the largest trainable model with DP alone has 1.4B parameters with throughput
            # less than 20 TFlops per GPU" (10.4), so the model is the planner's largest DDP model (the
            # row above), at the micro batch 1 it was searched at; Figure 4's definitions (Table 4's
            # sizes) have no point of that size.
            searched = extras.get("fig4_ddp_searched", {}).get("dgx2")
            if searched is not None:
                parameters, prediction = searched
                basis = f"the searched largest DDP model ({format_parameters(parameters)}), micro batch 1"
        out.append((value, prediction, basis or ""))
    return out


def _format_value(value: float, unit: str) -> str:
    return format_parameters(value) if unit == "parameters" else f"{value:.2f}" if unit.startswith("ratio") else f"{value:.1f}"


def comparison_section(results, extras) -> list[str]:
    lines = ["## The model's predictions against the paper's stated values", "",
             "On the paper's cluster (dgx2), untuned: datasheet hardware and the H100 calibration's constants.", "",
             "| figure | the paper states | paper | predicted | predicted / paper | what was compared |",
             "|---|---|---:|---:|---:|---|"]
    for value, prediction, basis in predicted_for_stated(results, extras):
        if prediction is None:
            continue
        ratio = prediction / value.value if value.value else float("nan")
        lines.append(f"| {value.figure} | {value.quantity} ({value.source}) | {RELATIONS[value.relation]} "
                     f"{_format_value(value.value, value.unit)} {'' if value.unit == 'parameters' else value.unit} | "
                     f"{_format_value(prediction, value.unit)} | {ratio:.2f} | {basis} |")
    for name, size in PAPER_FIGURE6.items():
        predicted = extras.get("fig6", {}).get(("dgx2", name))
        if predicted is not None:
            paper = format_parameters(size) if size else "not given"
            ratio = f"{predicted / size:.2f}" if size else "-"
            lines.append(f"| fig6 | largest model under {name}, MP 16, 400 GPUs (section 10.5) | {paper} | "
                         f"{format_parameters(predicted)} | {ratio} | planner search at micro batch 8 |")
    lines += ["", *claims_section(results)]
    return lines


def claims_section(results) -> list[str]:
    """The observations Figures 7 and 8 make without numbers, checked against the predictions."""
    lines = ["| figure | the paper observes | predicted | holds |", "|---|---|---|---|"]
    fig7, fig8 = _rows(results, "fig7"), _rows(results, "fig8")

    def total(rows, series, size):
        row = _near(rows, series, size)
        return row.plan.total_bytes if row is not None else None

    for size in (40e9, 100e9):
        c1, c2, c4, c5 = (total(fig7, c, size) for c in ("C1", "C2", "C4", "C5"))
        if None in (c1, c2, c4, c5):
            continue
        label = format_parameters(size)
        lines.append(f"| fig7 | memory falls from C1 to C2 ({label}) | {format_bytes(c1)} -> {format_bytes(c2)} | "
                     f"{'yes' if c2 < c1 else 'no'} |")
        drop = (c4 - c5) / c4
        expected = size > 50e9  # the paper: no drop at 40B, a drop at 100B
        falls = drop > FALLS  # any drop past rounding: the paper gives no size for it
        lines.append(f"| fig7 | from C4 to C5 memory {'falls' if expected else 'does not fall'} ({label}) | "
                     f"{format_bytes(c4)} -> {format_bytes(c5)} ({drop:.1%} less) | "
                     f"{'yes' if falls == expected else 'no: the planner moves every checkpoint off the GPU'} |")
    c4, c5 = _near(fig8, "C4", 60e9), _near(fig8, "C5", 60e9)
    if c4 and c5 and c4.plan.fits and c5.plan.fits:
        faster = c5.prediction.hardware_tflops_per_gpu < c4.prediction.hardware_tflops_per_gpu
        lines.append(f"| fig8 | C5 is slower than C4 at 60B | C4 {c4.prediction.hardware_tflops_per_gpu:.1f}, "
                     f"C5 {c5.prediction.hardware_tflops_per_gpu:.1f} TFLOP/s | {'yes' if faster else 'no'} |")
    big = [r for r in fig8 if r.plan.parameters_total > 160e9]
    if big:
        fitting = sorted(r.point.series for r in big if r.plan.fits)
        spare = ", ".join(f"{r.point.series} {format_bytes(r.plan.headroom_bytes)} to spare" for r in big if r.plan.fits)
        lines.append(f"| fig8 | 170B runs only with C5 | fits: {', '.join(fitting) or 'none'} ({spare}) | "
                     f"{'yes' if fitting == ['C5'] else 'no'} |")
    return lines


TABLE_PROFILE = "dgx2"  # the paper's cluster: the tables of points list it alone; the figures draw every profile


def points_section(figure: str, by_profile, heading: str = "") -> list[str]:
    """A table of `by_profile`'s points (the paper's cluster's alone when it is there) under `### figure:
    heading` (by default what in it is measured); the measured columns only when a point is measured."""
    if TABLE_PROFILE in by_profile:
        by_profile = {TABLE_PROFILE: by_profile[TABLE_PROFILE]}
    measured = measured_points(figure, by_profile)
    any_run = any(row.measured is not None for rows in by_profile.values() for row in rows)
    heading = heading or ('predicted (no measured run)' if not measured else f'predicted, {measured} measured')
    lines = [f"### {figure}: {heading}", "",
             "| profile | point | parameters | grid | micro / global batch | stage, ZeRO-R | "
             "predicted per-GPU memory | predicted to fit | predicted s/iteration | predicted TFLOP/s (model FLOPs) |"
             + (" measured TFLOP/s | measured memory |" if any_run else ""),
             "|---|---|---:|---|---:|---|---:|---|---:|---:|" + ("---:|---:|" if any_run else "")]
    for profile, rows in by_profile.items():
        for row in rows:
            p, plan, prediction, measured = row.point, row.plan, row.prediction, row.measured
            zero_r = ", ".join(name for name, on in (("P_a", p.pa), ("P_a+cpu", p.pa_cpu), ("M_D", p.md)) if on)
            done = measured is not None and measured.completed
            lines.append(
                f"| {profile} | {p.point} | {format_parameters(plan.parameters_total)} | {p.nodes} x {p.gpus_per_node}, "
                f"MP {p.mp} | {p.micro_batch} / {p.global_batch} | {p.zero_stage}{', ' + zero_r if zero_r else ''} | "
                f"{format_bytes(plan.total_bytes)} | {'yes' if plan.fits else '**no**'} | {prediction.iteration_s:.2f} | "
                f"{prediction.hardware_tflops_per_gpu:.1f} ({prediction.model_tflops_per_gpu:.1f}) |" + (
                    f" {f'{measured.tflops_per_gpu:.1f}' if done else '-'} | "
                    f"{format_bytes(measured.memory_bytes) if done and measured.memory_bytes else '-'} |"
                    if any_run else ""))
    return lines + [""]


def max_size_section(extras) -> list[str]:
    lines = []
    if "fig4" in extras:
        lines += ["### Largest model without MP (Figure 4): predicted, planner search at micro batch 1", "",
                  "| profile | system | predicted largest | predicted TFLOP/s at micro batch 1 | paper |",
                  "|---|---|---:|---:|---:|"]
        for (profile, series), size in sorted(extras["fig4"].items()):
            paper = {"zero": "13B", "ddp": "1.4B"}[series] if profile == "dgx2" else "-"
            searched = extras.get("fig4_searched", {}).get((profile, series))
            lines.append(f"| {profile} | {'ZeRO stage 2' if series == 'zero' else 'plain DP'} | {format_parameters(size)} | "
                         f"{f'{searched[1]:.1f}' if searched else '-'} | {paper} |")
        lines.append("")
    if "fig6" in extras:
        lines += ["### Largest model per configuration (Figure 6): predicted, planner search at micro batch 8", "",
                  "| profile | configuration | predicted largest | measured largest (runs) | paper |", "|---|---|---:|---:|---:|"]
        for (profile, name), size in sorted(extras["fig6"].items()):
            measured = extras.get("fig6_measured", {}).get((profile, name))
            paper = PAPER_FIGURE6.get(name) if profile == "dgx2" else None
            lines.append(f"| {profile} | {name} | {format_parameters(size)} | "
                         f"{format_parameters(measured) if measured else '-'} | {format_parameters(paper) if paper else '-'} |")
        lines.append("")
    return lines


def mini_section(memory, mini) -> list[str]:
    if memory is None:
        return []
    budget = layers_in_c1_budget(memory)
    lines = [f"## CPU mini-reproduction of Figures 6-7 (measured on a CPU, {mini.get('date', 'date not recorded')})", "",
             f"`{mini['command']}`: TP {mini['tensor_parallel_size']} x DP {mini['data_parallel_size']} gloo processes, "
             f"hidden {mini['hidden_size']}, sequence {mini['seq_length']}, micro batch {mini['micro_batch_size']}, "
             f"{mini['precision']}. Memory: the largest rank's model states + constant buffers + bytes saved for "
             "backward on the device (--report-memory), as the planner sums them.", "",
             "| configuration | layers | measured | planned | measured / planned | host (P_a+cpu), measured | "
             "layers in C1's memory: measured | planned |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for name, item in sorted(memory.items()):
        for index, layers in enumerate(item.layers):
            extra = (f"{format_bytes(item.host_measured)} | {budget[name]['measured']:.1f} | {budget[name]['planned']:.1f}"
                     if index == 1 else "| |")
            lines.append(f"| {name} | {layers} | {format_bytes(item.measured[index])} | {format_bytes(item.planned[index])} | "
                         f"{item.measured[index] / item.planned[index]:.4f} | {extra} |")
    return lines + [""]


def constants_section() -> list[str]:
    lines = ["## Hardware profiles and constants", ""]
    for profile, name in PROFILES.items():
        from planner.perf_model import load_hardware

        hardware = load_hardware(name)
        constants = load_constants(hardware.calibration)
        lines.append(f"- {profile} (configs/hardware/{name}.yaml): peak {hardware.peak_flops / 1e12:g} TFLOP/s, "
                     f"HBM {hardware.hbm_bandwidth / 1e9:g} GB/s, intra-node {hardware.intra_node_bandwidth / 1e9:g} GB/s "
                     f"and inter-node {hardware.inter_node_bandwidth / 1e9:g} GB/s per GPU; constants from "
                     f"{constants.source}: GEMM efficiency {constants.gemm_efficiency:.3f}, elementwise passes "
                     f"{constants.elementwise_passes:.1f}, DP overlap {constants.dp_overlap:.2f}")
    return lines + [""]


def format_compared(value, unit: str) -> str:
    """A value of compare.py's rows: parameters as the paper writes them, bytes in decimal GB."""
    if value is None:
        return "-"
    if unit == "parameters":
        return format_parameters(value)
    if unit == "bytes":
        return f"{value / 1e9:.1f} GB"
    return f"{value:.1f}"


def condition_value(condition: dict) -> str:
    """A condition's value with its unit, bytes in MiB."""
    if condition["unit"] == "bytes":
        return f"{condition['value'] / 2**20:,.0f} MiB"
    if condition["unit"] == "procedure":
        return str(condition["value"])
    return f"{condition['value']:g} {condition['unit']}"


def side_by_side_section(compared: dict) -> list[str]:
    """compare.py's rows of several profiles (their results by name) in one table: the paper's value,
    each profile's prediction and ratio, and the last profile's verdict (the reasons: its JSON's notes and
    docs/zero-paper-2019-conditions.md)."""
    if not compared:
        return []
    names = list(compared)
    last = names[-1]
    lines = ["## The paper's stated values under each profile", "",
             "Written by scripts/zero_paper/compare.py for each profile. " + " ".join(
                 f"{name}: {result['description']}." for name, result in compared.items()), ""]
    for name, result in compared.items():
        if result["fitted"]:
            fitted = result["fitted"]
            lines.append(f"{name} fits one parameter, on one figure: {fitted['name']} = {fitted['value']:g}, on "
                         f"{fitted['fitted_on']}; every other figure is a prediction.")
    conditions = compared[last]["conditions"]
    if conditions:
        lines += ["", f"The conditions of {last}, with their sources in docs/zero-paper-2019-conditions.md: "
                  + "; ".join(f"`{c['name']}` = {condition_value(c)}" for c in conditions) + "."]
    header = " | ".join(f"{name}, predicted | ratio" for name in names)
    lines += ["", f"| figure | the paper states | paper | {header} | {last} within 10% |",
              "|---|---|---:|" + "---:|---:|" * len(names) + "---|"]
    keyed = {name: {(r["figure"], r["claim"]): r for r in result["rows"]} for name, result in compared.items()}
    for row in compared[last]["rows"]:
        if "ratio" not in row:
            continue
        key = (row["figure"], row["claim"])
        cells = []
        for name in names:
            other = keyed[name].get(key)
            cells.append(f"{format_compared(other['predicted'], other['unit'])} | "
                         f"{'-' if other['ratio'] is None else format(other['ratio'], '.2f')}" if other else "- | -")
        unit = "" if row["unit"] in ("parameters", "bytes") else f" {row['unit']}"
        verdict = "yes" if row["within_10_percent"] else "**no**"
        lines.append(f"| {row['figure']} | {row['claim']} | {RELATIONS[row['relation']]} "
                     f"{format_compared(row['paper'], row['unit'])}{unit} | {' | '.join(cells)} | {verdict} |")
    header = " | ".join(f"{name}, predicted: holds" for name in names)
    lines += ["", f"| figure | the paper observes | {header} | {last}: predicted |", "|---|---|" + "---|" * (len(names) + 1)]
    for row in compared[last]["rows"]:
        if "holds" not in row:
            continue
        key = (row["figure"], row["claim"])
        cells = ["yes" if keyed[n].get(key, {}).get("holds") else "no" for n in names]
        lines.append(f"| {row['figure']} | {row['claim']} | {' | '.join(cells)} | {row['predicted']} |")
    lines.append("")
    for name, result in compared.items():
        summary = result["summary"]
        lines.append(f"- {name}: {summary['within_10_percent']} of {summary['numeric_rows']} numbers within 10%, "
                     f"{summary['holding']} of {summary['qualitative_rows']} observations hold")
    return lines + [""]


FIGURE_TITLES = {"fig2": "Figure 2: throughput per GPU by model size, ZeRO against Megatron alone",
                 "fig3": "Figure 3: the 60B model from 64 to 400 GPUs",
                 "fig4": "Figure 4: ZeRO without model parallelism, against plain data parallelism",
                 "fig6": "Figure 6: the largest model each ZeRO configuration trains",
                 "fig7": "Figure 7: per-GPU memory of C1-C5 for a 40B and a 100B model",
                 "fig8": "Figure 8: throughput per GPU of C1-C5 at the largest micro batch each fits"}


def figures_section(results, extras, memory, mini=None) -> list[str]:
    """Each figure drawn (report.py writes FIGURE.png beside report.md) under a caption that says what
    in it is predicted and what measured (measurements.provenance, the line under its title too)."""
    lines = ["## The figures", ""]
    for figure in results:
        measured = measured_points(figure, results[figure], extras.get("fig6_measured"))
        cpu = cpu_source(mini) if figure in ("fig6", "fig7") and memory is not None and mini else None
        caption = f"{FIGURE_TITLES.get(figure, figure)}. {provenance(measured, cpu)}."
        lines += [f"![{figure}, {'predicted' if not measured else 'predicted and measured'}]({figure}.png)", "",
                  f"*{caption}*", ""]
    return lines


def report(results, extras, memory, mini, runs, argv, compared=None) -> str:
    nothing_measured = not runs
    title = "predicted and stated (no measured run)" if nothing_measured else "predicted, measured and stated"
    lines = [f"# The ZeRO paper's Figures 2-8: {title}", ""]
    if nothing_measured:
        lines += ["**Every figure and every number below is a prediction, not a measurement**, except the paper's "
                  "values and the CPU mini-reproduction: `scripts/zero_paper/run.py` launches the runs and `--runs` "
                  "puts them beside the predictions.", ""]
    lines += [f"Written by `python scripts/zero_paper/report.py {' '.join(argv)}` from {len(runs)} measured runs. "
              "Predicted: the planner's dry run and the performance model; TFLOP/s per GPU count the recompute "
              "(model FLOPs in brackets); memory is the planner's peak, before the CUDA context, NCCL's buffers and "
              "fragmentation.", ""]
    lines += figures_section(results, extras, memory, mini)
    # The side-by-side table holds the dgx2 comparison too; alone it is the comparison.
    lines += (side_by_side_section(compared) if compared else comparison_section(results, extras) + [""])
    lines += constants_section()
    lines += ["## Every point", ""]
    if any(TABLE_PROFILE in by_profile and len(by_profile) > 1 for by_profile in results.values()):
        lines += [f"The tables list the paper's cluster ({TABLE_PROFILE}); the figures draw every profile.", ""]
    for figure, by_profile in results.items():
        lines += points_section(figure, by_profile)
        if figure == "fig8" and "fig8_largest_batch" in extras:  # what Figure 8's bars draw
            lines += points_section(figure, extras["fig8_largest_batch"],
                                    "predicted at the largest micro batch that fits (the figure's bars)")
    lines += max_size_section(extras) + mini_section(memory, mini)
    return "\n".join(lines) + "\n"
