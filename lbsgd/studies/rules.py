"""The rules the studies' findings share: the claims of one comparison (:func:`lower`,
:func:`within`, :func:`worse_by`, decided by :func:`lbsgd.findings.verdict`), chance, the papers'
sources in words, and the selections of a table. A study module reads them as ``studies.<name>``.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from lbsgd import experiments as ex
from lbsgd import findings as fs
from lbsgd.findings import CHANCE_MARGIN_PCT, Finding, Verdict


def chance_error_pct(num_classes: int) -> float:
    """Top-1 error (%) of guessing: 100·(1 − 1/classes)."""
    return 100.0 * (1.0 - 1.0 / num_classes)


# Classes per dataset key (ImageNet as published; a plugin's dataset is unknown here).
DATASET_CLASSES = {"synthetic": 10, "cifar10": 10, "fashion_mnist": 10, "imagenet": 1000}


def chance_of(df) -> float | None:
    """The chance error (%) of the dataset the runs of ``df`` trained on (``fake``: its
    ``fake_classes``); None when the runs differ in it or it is unknown (no chance check)."""
    if "dataset" not in df.columns:
        return None
    fake = df["fake_classes"] if "fake_classes" in df.columns else [None] * len(df)
    n = {
        int(c) if d == "fake" else DATASET_CLASSES.get(d)
        for d, c in zip(df["dataset"], fake, strict=True)
    }
    return chance_error_pct(n.pop()) if len(n) == 1 and None not in n else None


def lower(a: Sequence[float], b: Sequence[float], **kw: Any) -> Verdict:
    """The claim "a's error is lower than b's" (mean over seeds)."""
    return fs.verdict(b, a, more_than=0.0, **kw)


def within(a: Sequence[float], b: Sequence[float], points: float, **kw: Any) -> Verdict:
    """The claim "a's error is no more than ``points`` above b's" (mean over seeds)."""
    return fs.verdict(a, b, at_most=points, **kw)


def worse_by(a: Sequence[float], b: Sequence[float], points: float, **kw: Any) -> Verdict:
    """The claim "a's error is more than ``points`` above b's" (mean over seeds)."""
    return fs.verdict(a, b, more_than=points, **kw)


def finding(claim: str, verdict: Verdict, evidence: str, *, paper: str = "") -> Finding:
    """A finding whose evidence ends with the reason when the verdict is undecided; ``paper``:
    what the paper reports for the claim, with its source (:class:`lbsgd.findings.Finding`)."""
    return Finding(claim, verdict.replayed, evidence + verdict.text(), paper)


# The papers of the reference table's ``source`` column (``<paper>:<part>``), short as the
# findings' ``paper`` field names them.
PAPERS = {
    "goyal2017": "Goyal",
    "you2017": "You et al.",
    "jia2018": "Jia et al.",
    "mikami2018": "Mikami et al.",
    "horovod-readme": "Horovod README",
    "firecaffe2016": "FireCaffe",
    "nado2021": "Nado et al.",
}
_PART = {"table": "Table ", "fig": "Fig. ", "sec": "§"}


def cite(*sources: str) -> str:
    """The reference table's ``source`` keys in words, one paper's parts together:
    ``cite("goyal2017:table1")`` is "Goyal Table 1", ``cite("you2017:table1b", "you2017:table3")``
    "You et al. Table 1b, Table 3", ``"jia2018:seed-slides-table5"`` "Jia et al. (talk) Table 5"
    (Jia et al.'s tables as shown in their talk)."""
    parts: dict[str, list[str]] = {}
    for source in sources:
        paper, _, part = source.partition(":")
        words = []
        if part.startswith("seed-slides"):
            words.append("(talk)")
            part = part.removeprefix("seed-slides").lstrip("-")
        m = re.fullmatch(r"(table|fig|sec)([\w.]*)", part)
        if m:
            words.append(_PART[m[1]] + m[2] if m[2] else m[1])
        elif part:
            words.append(part)
        parts.setdefault(PAPERS.get(paper, paper), []).append(" ".join(words))
    return "; ".join(
        " ".join([paper, ", ".join(w for w in dict.fromkeys(ws) if w)]).strip()
        for paper, ws in parts.items()
    )


def kilo(batch: float) -> str:
    """A published minibatch as the papers write it: 8192 is "8k", 256 is "256"."""
    b = int(batch)
    return f"{b // 1024}k" if b >= 1024 and b % 1024 == 0 else str(b)


def errors(df, metric: str = "final_top1_error_pct", **where: Any) -> list[float]:
    """The values of ``metric`` of the runs of ``df`` matching ``where`` (key=value), by seed."""
    sel = df
    for k, v in where.items():
        sel = sel[sel[k] == v]
    return [float(v) for v in sel.sort_values("seed")[metric]]


def diverged_as_failed(df):
    """A copy of ``df`` in which a diverged run counts as 100% error (not its last evaluation),
    with a boolean ``diverged`` column."""
    df = df.copy()
    df["diverged"] = df["status"] == "diverged"
    df.loc[df["diverged"], "final_top1_error_pct"] = 100.0
    return df


# -- helpers of the finding rules --------------------------------------------------------------


# The training curves a finding reads: run_dir -> DataFrame, a loader, or None (the run folders).
Metrics = Mapping[str, Any] | Callable[[str], Any] | None


def every(*verdicts: Verdict) -> Verdict:
    """The verdict of a claim that holds when each comparison does: not replayed when one is not,
    replayed when all are, else undecided for the first undecided one's reason."""
    if any(v.replayed is False for v in verdicts):
        return Verdict(False)
    undecided = [v for v in verdicts if v.replayed is None]
    return undecided[0] if undecided else Verdict(True)


def curves(metrics: Metrics) -> Callable[[str], Any]:
    """A run's training records (``metrics.jsonl``, kind train) by run directory: ``metrics`` is
    a mapping run_dir → DataFrame, a loader, or None (read the run directory)."""
    if metrics is None:
        return ex.load_metrics
    if callable(metrics):
        return metrics
    return lambda run_dir: metrics[str(run_dir)]


def at_chance(values: Sequence[float], chance: float | None) -> bool:
    """Every value at chance (as :func:`lbsgd.findings.verdict` judges it)."""
    return chance is not None and all(v >= chance - CHANCE_MARGIN_PCT for v in values)


def note(verdict: Verdict, against: bool, text: str) -> str:
    """The explanation of a claim this scale does not show: after "not replayed at this scale" when
    not replayed, after "at this scale" when undecided with the means against the claim (callers
    pass ``against`` false when every run is at chance: then there is nothing to explain)."""
    if verdict.replayed is False:
        return "; not replayed at this scale: " + text
    if verdict.replayed is None and against:
        return "; at this scale: " + text
    return ""


def mean(values: Sequence[float]) -> float:
    return sum(values) / len(values)
