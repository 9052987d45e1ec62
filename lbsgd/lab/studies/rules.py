"""The rules the studies' findings share: the claims of one comparison (:func:`lower`,
:func:`within`, :func:`worse_by`, decided by :func:`lbsgd.lab.findings.verdict`), chance, the papers'
sources in words, and the selections of a table. A study module reads them as ``studies.<name>``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from lbsgd.lab import experiments as ex
from lbsgd.lab import findings as fs
from lbsgd.lab.findings import CHANCE_MARGIN_PCT, Finding, Verdict

# Classes per dataset key (ImageNet as published; a plugin's dataset is unknown here).
DATASET_CLASSES = {"synthetic": 10, "cifar10": 10, "fashion_mnist": 10, "imagenet": 1000}


def chance_of(df) -> float | None:
    """The chance error (%), 100·(1 − 1/classes), of the dataset the runs of ``df`` trained on
    (``fake``: its ``fake_classes``); None when the runs differ in it or it is unknown (no chance
    check)."""
    if "dataset" not in df.columns:
        return None
    fake = df["fake_classes"] if "fake_classes" in df.columns else [None] * len(df)
    n = {
        int(c) if d == "fake" else DATASET_CLASSES.get(d)
        for d, c in zip(df["dataset"], fake, strict=True)
    }
    return 100.0 * (1.0 - 1.0 / n.pop()) if len(n) == 1 and None not in n else None


def lower(a: Sequence[float], b: Sequence[float], **kw: Any) -> Verdict:
    """The claim "a's error is lower than b's" (mean over seeds)."""
    return fs.verdict(b, a, more_than=0.0, **kw)


def within(a: Sequence[float], b: Sequence[float], points: float, **kw: Any) -> Verdict:
    """The closeness claim "a's error is within ``points`` of b's", an equivalence test: the
    interval of the difference inside ±``points`` (:func:`lbsgd.lab.findings.verdict`)."""
    return fs.verdict(a, b, within=points, **kw)


def no_worse(a: Sequence[float], b: Sequence[float], points: float, **kw: Any) -> Verdict:
    """The one-sided closeness claim "a reaches b": a's error no more than ``points`` above b's
    (non-inferiority: the interval of the difference wholly below ``points``)."""
    return fs.verdict(a, b, less_than=points, **kw)


def worse_by(a: Sequence[float], b: Sequence[float], points: float, **kw: Any) -> Verdict:
    """The claim "a's error is more than ``points`` above b's" (mean over seeds)."""
    return fs.verdict(a, b, more_than=points, **kw)


def finding(
    claim: str,
    verdict: Verdict,
    evidence: str,
    *,
    paper: str = "",
    budget: fs.Budget | None = None,
) -> Finding:
    """A finding whose evidence ends with the test and, when undecided or invalid, the reason;
    ``budget``: a large-minibatch claim's arms and their optimizer steps (the session adds the
    profile's S_min and the budget's words: :func:`lbsgd.lab.findings.with_s_min`); ``paper``: what
    the paper reports for the claim, with its source (:class:`lbsgd.lab.findings.Finding`)."""
    return Finding(
        claim,
        verdict.replayed,
        evidence + verdict.text(),
        paper,
        verdict.invalid,
        verdict.p_for,
        verdict.p_against,
        budget,
    )


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


# The one rule mapping a profile's k to a paper's minibatch: Goyal's k workers of n = 32 images
# at his reference of 256 per 0.1 lr, so k = 32 is 8k and k = 16 is 4k, in every study.
PAPER_REFERENCE_BATCH = 256
# ImageNet-1k's training images and Goyal's epochs: his run at batch B takes 90 · 1,281,167 / B
# optimizer steps, rounded up (8k: 14,076; 64k: 1,760).
IMAGENET_TRAIN = 1_281_167
GOYAL_EPOCHS = 90


def paper_batch(k: float) -> int:
    """The paper's minibatch that a profile's ``k`` stands for: k · 256 (k = 16 is 4k)."""
    return int(round(k * PAPER_REFERENCE_BATCH))


def k_as_paper_batch(table):
    """``table`` with the column ``k_as_paper_batch`` after ``k``: the paper's minibatch each k
    stands for by :func:`paper_batch` (beside ``paper_batch``, the batch of the paper's row it is
    compared with, which may differ: Goyal's Table 1 has 8k only)."""
    t = table.copy()
    t.insert(t.columns.get_loc("k") + 1, "k_as_paper_batch", [paper_batch(k) for k in t["k"]])
    return t.astype({"k_as_paper_batch": "Int64"})


def goyal_steps(batch: float) -> int:
    """The optimizer steps of Goyal's 90-epoch ImageNet run at minibatch ``batch``."""
    return math.ceil(GOYAL_EPOCHS * IMAGENET_TRAIN / batch)


def steps_of(df, **where: Any) -> int:
    """The optimizer steps (``total_steps``) of the runs of ``df`` matching ``where``: the runs of
    one arm share them."""
    return int(_select(df, where)["total_steps"].iloc[0])


def budget(df, ks: Sequence[float], paper: str | None = None, **where: Any) -> fs.Budget:
    """The budget of a claim comparing runs at the minibatches ``ks`` (each as k; of the runs
    matching ``where``): their optimizer steps, and the paper's run in words (default: Goyal's
    at the largest of ``ks``, mapped by :func:`paper_batch`). The session adds the profile's
    S_min."""
    steps = {f"k={k:g}": steps_of(df, k=k, **where) for k in ks}
    if paper is None:
        b = paper_batch(max(ks))
        paper = f"Goyal's {kilo(b)} run: {goyal_steps(b):,}"
    return fs.Budget(steps, None, paper)


def grid_edge(values: Sequence[float], chosen: float) -> str:
    """Where ``chosen`` sits on a tuning grid's ``values`` (e.g. lrs): "low" or "high" at its
    smallest or largest value, "" inside it. A choice on an edge is not a tuned choice (the best
    may lie beyond the grid): a claim that reads it is invalid (studies 14 and 15)."""
    lo, hi = min(values), max(values)
    if len(set(values)) < 3:
        raise ValueError(f"a grid needs three values to have an inside ({sorted(values)})")
    return "low" if chosen == lo else "high" if chosen == hi else ""


def kilo(batch: float) -> str:
    """A published minibatch as the papers write it: 8192 is "8k", 256 is "256"."""
    b = int(batch)
    return f"{b // 1024}k" if b >= 1024 and b % 1024 == 0 else str(b)


def _select(df, where: Mapping[str, Any]):
    for k, v in where.items():
        df = df[df[k] == v]
    return df


def errors(df, metric: str = "final_top1_error_pct", **where: Any) -> list[float]:
    """The values of ``metric`` of the runs of ``df`` matching ``where`` (key=value), by seed."""
    return [float(v) for v in _select(df, where).sort_values("seed")[metric]]


def wins(df, column: str | list[str], better: Any, worse: Any, **where: Any) -> tuple[int, int]:
    """Of the runs of ``df`` matching ``where``, the seeds where ``column`` = ``better`` has the
    lower error than ``worse``, and the seeds that ran both."""
    piv = _select(df, where).pivot_table(
        index="seed", columns=column, values="final_top1_error_pct"
    )
    if better not in piv or worse not in piv:
        return 0, 0
    a, b = piv[better], piv[worse]
    both = a.notna() & b.notna()
    return int((a[both] < b[both]).sum()), int(both.sum())


# the tables' integer columns: shown as integers (no 1.6e+04) where a merge made them float
INT_COLUMNS = ("batch_size", "paper_batch", "runs", "diverged")


def summary(df, by: Sequence[str]):
    """The error's mean, spread and runs per group ``by`` (:func:`lbsgd.lab.experiments.summarize`)
    with the group's diverged runs (``diverged``)."""
    diverged = df.groupby(by)["diverged"].sum().astype(int).reset_index()
    return ex.summarize(df, by).merge(diverged, on=by)


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
    """The verdict of a claim that holds when each comparison does (intersection–union): invalid
    when one is, replayed when every test replays it, not replayed when one test does not, else
    undecided for the first undecided one's reason. A part without a test counts as undecided:
    it can never replay the whole (its p_for counts as 1)."""
    p_for, p_against, tests, why = 0.0, 1.0, [], ""
    for v in verdicts:
        if v.invalid:
            return v
        why = why or (v.why if v.replayed is None else "")
        if v.p is None:
            p_for = 1.0
            continue
        p_for, p_against = max(p_for, v.p_for), min(p_against, v.p_against)
        tests.append(v.test)
    if not tests:
        return Verdict(None, why) if why else Verdict(True)
    return fs.decide(p_for, p_against, " and ".join(tests), why)


def curves(metrics: Metrics) -> Callable[[str], Any]:
    """A run's training records (``metrics.jsonl``, kind train) by run directory: ``metrics`` is
    a mapping run_dir → DataFrame, a loader, or None (read the run directory)."""
    if metrics is None:
        return ex.load_metrics
    if callable(metrics):
        return metrics
    return lambda run_dir: metrics[str(run_dir)]


def at_chance(values: Sequence[float], chance: float | None) -> bool:
    """Every value at chance (as :func:`lbsgd.lab.findings.verdict` judges it)."""
    return chance is not None and all(v >= chance - CHANCE_MARGIN_PCT for v in values)


def note(verdict: Verdict, against: bool, text: str) -> str:
    """The explanation of a claim this scale does not show: after "not replayed at this scale" when
    not replayed, after "at this scale" when undecided with the means against the claim (callers
    pass ``against`` false when every run is at chance: then there is nothing to explain); nothing
    for an invalid comparison, whose reason is that an arm did not train."""
    if verdict.invalid:
        return ""
    if verdict.replayed is False:
        return "; not replayed at this scale: " + text
    if verdict.replayed is None and against:
        return "; at this scale: " + text
    return ""


def mean(values: Sequence[float]) -> float:
    return sum(values) / len(values)
