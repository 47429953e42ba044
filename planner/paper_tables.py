"""The ZeRO paper's Tables 1 and 2 from its formulas (zero.memory.paper_model_state_gb), and the numbers it states, to
print beside ours. Table 2 is the largest model whose model states fit 32 GB per GPU on 64 x MP GPUs."""

from __future__ import annotations

from zero.memory import PAPER_GB, paper_model_state_gb

TABLE1_MODELS = (7.5e9, 128e9, 1e12)
TABLE1_DP = (1, 4, 16, 64, 256, 1024)
TABLE2_MP = (1, 2, 4, 8, 16)
TABLE2_GPU_GB = 32
STAGE_NAMES = {0: "baseline", 1: "P_os", 2: "P_os+g", 3: "P_os+g+p"}

# Table 2's right half, measured by the authors (baseline, ZeRO-DP P_os), parameters by MP.
PAPER_TABLE2_MEASURED = {1: (1.3e9, 6.2e9), 2: (2.5e9, 12.5e9), 4: (5e9, 25e9), 8: (10e9, 50e9), 16: (20e9, 100e9)}
# Figure 6: the largest model trained with MP 16 on 400 GPUs under C1-C5 (the text gives no C3 value).
PAPER_FIGURE6 = {"C1": 40e9, "C2": 60e9, "C3": None, "C4": 140e9, "C5": 150e9}


def table1() -> list[dict]:
    """One row per (model, N_d): GB per device for each stage."""
    return [{"psi": psi, "dp": n, **{STAGE_NAMES[stage]: paper_model_state_gb(psi, n, stage) for stage in range(4)}}
            for psi in TABLE1_MODELS for n in TABLE1_DP]


def largest_model(gpu_gb: float, model_parallel: int, data_parallel: int, stage: int) -> float:
    """The largest Psi whose model states per GPU fit `gpu_gb` decimal GB (linear in Psi, solved directly)."""
    per_parameter = paper_model_state_gb(1.0, data_parallel, stage) * PAPER_GB
    return gpu_gb * PAPER_GB * model_parallel / per_parameter


def table2() -> list[dict]:
    """One row per MP degree on 64 x MP GPUs: the largest model per stage, and the paper's measured."""
    rows = []
    for mp in TABLE2_MP:
        row = {"mp": mp, "gpus": 64 * mp}
        row.update({STAGE_NAMES[stage]: largest_model(TABLE2_GPU_GB, mp, 64, stage) for stage in range(4)})
        row["measured baseline"], row["measured P_os"] = PAPER_TABLE2_MEASURED[mp]
        rows.append(row)
    return rows


def format_parameters(count: float) -> str:
    """The paper's style: 7.6B, 121.6B, 0.5T, 2T."""
    if count >= 0.5e12 and abs(count / 1e12 - round(count / 1e12, 1)) < 1e-9:
        return f"{count / 1e12:g}T"
    return f"{count / 1e9:.1f}B".replace(".0B", "B")


def format_table1() -> str:
    lines = ["Table 1: model-state memory per device (GB, K = 12)",
             "| model | N_d | baseline | P_os | P_os+g | P_os+g+p |", "|---|---:|---:|---:|---:|---:|"]
    for row in table1():
        cells = " | ".join(_gb(row[STAGE_NAMES[stage]]) for stage in range(4))
        lines.append(f"| {format_parameters(row['psi'])} | {row['dp']} | {cells} |")
    return "\n".join(lines)


def format_table2() -> str:
    lines = [f"Table 2: the largest model whose model states fit {TABLE2_GPU_GB} GB per GPU, MP x 64 GPUs "
             "(N_d = 64); measured columns are the paper's",
             "| MP | GPUs | baseline | P_os | P_os+g | P_os+g+p | paper measured baseline | paper measured P_os |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for row in table2():
        cells = " | ".join(format_parameters(row[STAGE_NAMES[stage]]) for stage in range(4))
        lines.append(f"| {row['mp']} | {row['gpus']} | {cells} | {format_parameters(row['measured baseline'])} | "
                     f"{format_parameters(row['measured P_os'])} |")
    lines.append("The paper printed its MP = 1 row to 0.1B and multiplied it by MP for the others "
                 "(15.2B = 2 x 7.6B); computed exactly, 2 x 7.64B is 15.3B. The cells agree within "
                 "MP x 0.05B.")
    return "\n".join(lines)


def _gb(value: float) -> str:
    """Three significant figures, as the paper prints (31.4, 16.6, 1.88; 120 and 2,048 whole)."""
    if value >= 100:
        return f"{value:,.0f}"
    return f"{value:.3g}"
