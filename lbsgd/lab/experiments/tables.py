"""A study's tables and figures: seeds summarised, tables saved at full precision and shown
rounded, figures saved in the study's folder, training curves."""

from __future__ import annotations

import math
import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from lbsgd import config, rundir
from lbsgd.lab.experiments.results import load_metrics


def summarize(df, by: Sequence[str], metric: str = "final_top1_error_pct"):
    """Mean, standard deviation and count of ``metric`` over the runs (seeds) of each group."""
    g = df.groupby(list(by), dropna=False)[metric]
    out = g.agg(["mean", "std", "count"]).reset_index()
    return out.rename(columns={"mean": f"{metric}_mean", "std": f"{metric}_std", "count": "runs"})


def study_dir(out_dir: str | os.PathLike, study: str) -> Path:
    config.check_folder_name("study", study)
    path = Path(out_dir) / study
    path.mkdir(parents=True, exist_ok=True)
    return path


def save_table(
    table, out_dir: str | os.PathLike, study: str, name: str = "table.csv", digits: int | None = 6
) -> Path:
    """``table`` as ``<study>/<name>``, every number to ``digits`` significant digits (what the
    report and later readers read: :func:`readable` rounds only what is shown; None: every digit,
    for a file another study computes from)."""
    config.check_folder_name("name", name)  # a file of the study's folder, nowhere else
    path = study_dir(out_dir, study) / name
    with rundir.replacing(path) as tmp:
        table.to_csv(tmp, index=False, float_format=digits and f"%.{digits}g")
    return path


# Columns in percentage points (errors, accuracies, efficiencies, their spreads and gaps): shown to
# 2 decimals; every other number to 4 significant digits.
POINTS_COLUMN = re.compile(r"_pct(_mean|_std)?$|_pts$|^paper_std$")


def readable_cell(column: str, value: Any) -> str:
    """One cell of a table as it is shown (a notebook's table, REPORT.md): a number of a
    :data:`POINTS_COLUMN` to 2 decimals, any other fraction to 4 significant digits (no exponent
    from 1 up), a whole number as it is, a missing one empty, text as it is. ``value``: a number
    or a CSV cell's text."""
    text = "" if value is None else str(value).strip()
    if text in ("True", "False", "<NA>"):  # numpy's booleans are numbers to float()
        return "" if text == "<NA>" else text
    try:
        x = float(text)
    except ValueError:
        return text
    if not math.isfinite(x):
        return "" if math.isnan(x) else text
    if POINTS_COLUMN.search(column):
        return f"{x:.2f}"
    if text.lstrip("+-").isdigit() or (x.is_integer() and abs(x) < 1e15):
        return str(int(x))
    return f"{x:.0f}" if abs(x) >= 1000 else f"{x:.4g}"  # no exponent from 1000 up


def readable(table):
    """A copy of ``table`` (a DataFrame) for reading: every cell as :func:`readable_cell` shows
    it. The table itself, and the CSV that :func:`save_table` writes, keep full precision."""
    return table.apply(lambda col: col.map(lambda v: readable_cell(str(col.name), v)))


def save_figure(fig, out_dir: str | os.PathLike, study: str, name: str) -> Path:
    config.check_folder_name("name", name)  # a file of the study's folder, nowhere else
    path = study_dir(out_dir, study) / name
    with rundir.replacing(path) as tmp:
        fig.savefig(tmp, dpi=120, bbox_inches="tight")
    return path


def plot_curves(
    df, label: str, metric: str = "loss", kind: str = "train", ax=None, smooth: int = 1
):
    """Training (or eval) curves of the runs in ``df``, against epochs, one line per row."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(6, 4))
    for _, row in df.iterrows():
        m = load_metrics(row["run_dir"], kind)
        if m.empty:
            continue
        y = m[metric].astype(float)
        if smooth > 1:
            y = y.rolling(smooth, min_periods=1).mean()
        ax.plot(m["epoch"], y, label=str(row[label]))
    ax.set_xlabel("epoch")
    ax.set_ylabel(metric if kind == "train" else f"test {metric}")
    ax.legend(fontsize=8)
    return ax
