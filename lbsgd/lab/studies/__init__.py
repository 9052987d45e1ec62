"""The studies: each paper's ablation as a run list, a table beside the published numbers, and rules
that decide whether this replay shows the paper's claims.

A study module (``lbsgd/lab/studies/<study>.py``) decides; its notebook holds parameters, the sweep
call, tables and figures. A notebook begins ``S = studies.start("warmup", profile=profile, ...)``
and ``S.sweep(warmup.runs(S.profile, S.seeds, ks))`` and ends ``S.findings(...)``; :func:`start`
writes to the repository's ``results/<profile>/<study>/`` whatever the kernel's working directory.
Names come from the study list (here), the shared rules (:mod:`lbsgd.lab.studies.rules`) and the
notebook's session (:mod:`lbsgd.lab.studies.session`).
"""

from __future__ import annotations

from lbsgd.lab.experiments import readable  # notebooks show their tables with it
from lbsgd.lab.findings import Finding, Verdict, contrast, verdict
from lbsgd.lab.stats import seeds_to_decide
from lbsgd.lab.studies.rules import (
    INT_COLUMNS,
    Metrics,
    at_chance,
    budget,
    chance_of,
    cite,
    curves,
    diverged_as_failed,
    errors,
    every,
    finding,
    grid_edge,
    k_as_paper_batch,
    kilo,
    lower,
    mean,
    no_worse,
    note,
    paper_batch,
    summary,
    wins,
    within,
    worse_by,
)
from lbsgd.lab.studies.session import Session, repo_root, results_root, start

__all__ = [
    "STUDIES",
    "Finding",
    "INT_COLUMNS",
    "Metrics",
    "Session",
    "Verdict",
    "at_chance",
    "budget",
    "chance_of",
    "cite",
    "contrast",
    "curves",
    "diverged_as_failed",
    "errors",
    "every",
    "finding",
    "grid_edge",
    "k_as_paper_batch",
    "kilo",
    "lower",
    "mean",
    "no_worse",
    "note",
    "summary",
    "paper_batch",
    "readable",
    "repo_root",
    "results_root",
    "seeds_to_decide",
    "start",
    "verdict",
    "wins",
    "within",
    "worse_by",
]

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
    "optimizers",
    "steps_to_target",
    "plan",
    "optimizers_at_scale",
)
