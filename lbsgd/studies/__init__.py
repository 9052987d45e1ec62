"""The studies: each paper's ablation as a run list, a table beside the published numbers, and rules
that decide whether this replay shows the paper's claims.

A study module (``lbsgd/studies/<study>.py``) holds the decisions; its notebook holds parameters,
the sweep call, tables and figures: notebooks show, the package decides. Every notebook starts
the same way::

    S = studies.start("warmup", profile=profile, seeds=seeds, epochs=epochs, out_dir=out_dir, ...)
    df = S.sweep(warmup.runs(S.profile, S.seeds, ks))

and ends with ``S.findings(warmup.findings(...))``. :func:`start` resolves the results root to the
repository's ``results/`` whatever the kernel's working directory, so JupyterLab (kernel in
``notebooks/``), papermill and ``make reproduce`` write to the same place; each profile has its own
folder, ``results/<profile>/<study>/``, so a smoke run never replaces a cpu result.

A finding is decided by :func:`decide` from the per-seed errors of the arms it compares. It is
``undecided`` (never "replayed") when its evidence cannot decide it: every run at chance, one run
per arm (no seed spread to judge the margin by), or a margin inside the seed spread; the evidence
then says which.
"""

from __future__ import annotations

import math
import os
import re
import statistics
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lbsgd import experiments as ex
from lbsgd.experiments import Finding
from lbsgd.experiments import readable as readable  # notebooks show their tables with it
from lbsgd.studies import scales

# The notebooks in reading order (notebooks/NN_<study>.ipynb); titles start with the number.
STUDIES: tuple[str, ...] = (
    "quickstart",
    "warmup",
    "batch_scaling",
    "lr_scaling_rule",
    "bn_gamma_init",
    "lars",
    "bn_decay",
    "pool5_bn",
    "mixed_precision",
    "scaling",
    "critical_batch",
    "local_sgd",
    "staleness",
)

# A run is "at chance" when its top-1 error is within this many points of 100·(1 − 1/classes):
# at the smoke profile every run ends at 86-91% on 10 classes (chance 90%).
CHANCE_MARGIN_PCT = 5.0


# -- where results go --------------------------------------------------------------------------


def repo_root() -> Path:
    """The checkout holding lbsgd (an editable install), else the working directory."""
    here = Path(__file__).resolve().parents[2]
    return here if (here / "pyproject.toml").is_file() else Path.cwd()


def results_root(out_dir: str | os.PathLike | None = None) -> Path:
    """The results root: ``None`` is the repository's ``results/``; a relative path is taken from
    the repository root (not the kernel's working directory); an absolute path is itself."""
    if out_dir is None:
        return repo_root() / "results"
    ex.config.check_folder_path("out_dir", str(out_dir))  # '' would be the repository itself
    path = Path(out_dir).expanduser()
    return path if path.is_absolute() else repo_root() / path


# -- the decision rules ------------------------------------------------------------------------


@dataclass(frozen=True)
class Verdict:
    """Whether the evidence shows a claim (None: it cannot decide), and why when undecided."""

    replayed: bool | None
    why: str = ""

    def text(self) -> str:
        """``"; undecided: …"`` to append to a finding's evidence (empty when decided)."""
        return f"; undecided: {self.why}" if self.replayed is None else ""


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


def spread(*arms: Sequence[float]) -> float | None:
    """The seed spread of a comparison: the largest sample standard deviation over the seeds of
    one arm (None when no arm has two runs)."""
    sds = [statistics.stdev(a) for a in arms if len(a) >= 2]
    return max(sds) if sds else None


def decide(
    x: Sequence[float],
    y: Sequence[float],
    *,
    more_than: float | None = None,
    at_most: float | None = None,
    chance: float | None = None,
    seed_spread: float | None = None,
    paired: bool = False,
) -> Verdict:
    """The claim ``mean(x) − mean(y) > more_than`` (or ``≤ at_most``), decided from per-seed values
    (top-1 errors in %, one per seed) of two arms.

    ``paired``: ``x[i]`` and ``y[i]`` come from the same seed (the same initialisation and data
    order, as every study's arms do), so the spread that judges the margin is that of the
    per-seed differences ``x[i] − y[i]``: the seed's own luck cancels, as in a paired t-test.

    Undecided when
    - every run of both arms is at ``chance`` (within :data:`CHANCE_MARGIN_PCT`), or
    - there are not two seeds to measure a spread from (two per arm; two pairs when ``paired``)
      and no ``seed_spread`` is given (a spread measured elsewhere in the study, e.g. the
      baseline's), so the margin cannot be judged, or
    - the margin, the distance of ``mean(x) − mean(y)`` from the threshold, is no larger than the
      seed spread (sample standard deviation over seeds: of the differences when ``paired``, else
      the larger of the arms'; ``seed_spread`` when given). The evidence then says what would
      decide it: :func:`seeds_to_decide` for a test of the mean, since this rule's threshold does
      not shrink with seeds.
    """
    if (more_than is None) == (at_most is None):
        raise ValueError("decide: give exactly one of more_than= or at_most=")
    if not x or not y:
        raise ValueError("decide: each arm needs at least one value")
    vals = [*x, *y]
    if any(not math.isfinite(v) for v in vals):
        return Verdict(None, "a run has no finite result")
    if chance is not None and all(v >= chance - CHANCE_MARGIN_PCT for v in vals):
        return Verdict(None, f"every run is at chance ({chance:.0f}% error)")
    diff = statistics.fmean(x) - statistics.fmean(y)
    threshold = more_than if more_than is not None else at_most
    if paired and len(x) != len(y):
        raise ValueError(f"decide: paired arms need one value per seed each ({len(x)} vs {len(y)})")
    if seed_spread is not None:
        s = seed_spread
    elif paired:
        diffs = [a - b for a, b in zip(x, y, strict=True)]
        s = statistics.stdev(diffs) if len(diffs) >= 2 else None
    else:
        s = spread(x, y)
    if s is None:
        return Verdict(None, "one seed per arm: no seed spread to judge the margin by")
    margin = abs(diff - threshold)
    if margin <= s:
        over = "of the per-seed differences" if paired and seed_spread is None else "over seeds"
        return Verdict(
            None,
            f"the margin ({margin:.2f} points) is inside the seed spread "
            f"({s:.2f} points, standard deviation {over}); {_what_would_decide(margin, s)}",
        )
    return Verdict(diff > threshold if more_than is not None else diff <= threshold)


def seeds_to_decide(margin: float, s: float) -> int | None:
    """Seeds a test of two standard errors would need to decide a margin ``margin`` at the seed
    spread ``s``: the smallest n with ``margin > 2·s/√n``, i.e. ``n > 4·(s/margin)²``. None when
    the margin is 0 (no number of seeds separates equal means)."""
    if margin <= 0:
        return None
    return math.floor(4 * (s / margin) ** 2) + 1


def _what_would_decide(margin: float, s: float) -> str:
    """The undecided verdict's last clause: the rule (margin > spread) asks for an effect larger
    than one seed's spread, which more seeds do not make; what would decide the claim is a scale
    where the effect grows (a larger k, more epochs), or, under a test of the mean (two standard
    errors), this many seeds."""
    n = seeds_to_decide(margin, s)
    test = "no number of seeds" if n is None else f"{n} seeds"
    return (
        "the rule asks for an effect larger than the seed spread, which more seeds do not give: "
        f"a scale where the effect grows would decide it (a two-standard-error test of the mean: {test})"
    )


def lower(a: Sequence[float], b: Sequence[float], **kw: Any) -> Verdict:
    """The claim "a's error is lower than b's" (mean over seeds)."""
    return decide(b, a, more_than=0.0, **kw)


def within(a: Sequence[float], b: Sequence[float], points: float, **kw: Any) -> Verdict:
    """The claim "a's error is no more than ``points`` above b's" (mean over seeds)."""
    return decide(a, b, at_most=points, **kw)


def worse_by(a: Sequence[float], b: Sequence[float], points: float, **kw: Any) -> Verdict:
    """The claim "a's error is more than ``points`` above b's" (mean over seeds)."""
    return decide(a, b, more_than=points, **kw)


def finding(claim: str, verdict: Verdict, evidence: str, *, paper: str = "") -> Finding:
    """A finding whose evidence ends with the reason when the verdict is undecided; ``paper``:
    what the paper reports for the claim, with its source (:class:`lbsgd.experiments.Finding`)."""
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
    """Every value at chance (as :func:`decide` judges it)."""
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


# -- a study session ---------------------------------------------------------------------------


@dataclass
class Session:
    """One study at one profile: where it writes, how it launches, what it has saved."""

    study: str
    title: str
    profile: scales.Profile
    seeds: list[int]
    root: Path  # results root
    launch: Mapping[str, Any]  # sweep's launch parameters (processes, parallel runs, W&B mode)
    table_path: Path | None = None
    figure_paths: list[Path] = field(default_factory=list)

    @property
    def out(self) -> Path:
        """The profile's folder: the runs' ``out_dir``."""
        return self.root / self.profile.name

    @property
    def dir(self) -> Path:
        """The study's folder: ``<root>/<profile>/<study>/``."""
        return self.out / self.study

    def sweep(self, runs: Sequence[Mapping[str, Any]]):
        """Train the runs (see :func:`lbsgd.experiments.sweep`) into this study's folder."""
        return ex.sweep(
            self.study, runs, out_dir=self.out, profile=self.profile.name, **self.launch
        )

    def save_table(self, table, name: str = "table.csv"):
        """Write ``table`` (ours beside the paper) to the study's folder; returns it as it is
        (:func:`readable` shows it rounded)."""
        path = ex.save_table(table, self.out, self.study, name)
        if name == "table.csv":
            self.table_path = path
        return table

    def save_figure(self, fig, name: str) -> None:
        """Save ``fig`` to the study's folder; the notebook still displays it (inline backend)."""
        path = ex.save_figure(fig, self.out, self.study, name)
        if path not in self.figure_paths:
            self.figure_paths.append(path)

    def findings(self, findings: Iterable[Finding], seeds: Sequence[int] | None = None) -> None:
        """Write ``findings.json``, print each verdict, and log the study (table, figures,
        findings) to W&B as one run of the study's group."""
        findings = list(findings)
        used = list(self.seeds if seeds is None else seeds)
        ex.write_findings(self.out, self.study, self.profile.name, used, findings, title=self.title)
        from lbsgd import tracking

        log_study = getattr(tracking, "log_study", None)
        if log_study is not None and self.launch.get("wandb", "auto") != "disabled":
            log_study(
                self.dir,
                study=self.study,
                profile=self.profile.name,
                mode=self.launch.get("wandb", "auto"),
                table=self.table_path,
                figures=tuple(self.figure_paths),
                findings=[f.to_dict() for f in findings],
            )


def start(
    study: str,
    *,
    title: str,
    profile: str = "cpu",
    seeds: Sequence[int] | None = None,
    epochs: float | None = None,
    out_dir: str | os.PathLike | None = None,
    nproc_per_node: int = 1,
    nnodes: int = 1,
    rdzv_endpoint: str | None = None,
    parallel: int = 1,
    wandb: str = "auto",
) -> Session:
    """A study's session from its notebook's parameters; bad values fail here, one line each."""
    if study not in STUDIES:
        raise ex.config.ConfigError(f"study={study!r} is not one of {', '.join(STUDIES)}")
    if wandb not in ("auto", "online", "offline", "disabled"):
        raise ex.config.ConfigError(
            f"wandb={wandb!r} must be one of auto, online, offline, disabled"
        )
    ex.check_launch(
        nproc_per_node=nproc_per_node, nnodes=nnodes, rdzv_endpoint=rdzv_endpoint, parallel=parallel
    )
    p = scales.get(profile, epochs=epochs)
    chosen = list(seeds) if seeds is not None else list(p.seeds)
    if not chosen or any(isinstance(s, bool) or not isinstance(s, int) or s < 0 for s in chosen):
        raise ex.config.ConfigError(f"seeds={seeds!r} must be a non-empty list of integers >= 0")
    launch = {
        "nproc_per_node": nproc_per_node,
        "nnodes": nnodes,
        "rdzv_endpoint": rdzv_endpoint,
        "parallel": parallel,
        "wandb": wandb,
    }
    return Session(study, title, p, chosen, results_root(out_dir), launch)
