"""Reading a study's results: a run as a flat record (keys, derived values, summary), a study's
runs as a table, a run's metrics, the published numbers, and the statuses that end a run."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from importlib import resources
from pathlib import Path
from typing import Any

from lbsgd import config
from lbsgd.tracking import flatten

DONE = ("completed", "diverged")  # statuses that end a run for good


def run_record(run_dir: str | os.PathLike) -> dict[str, Any]:
    """One run as a flat dict: config keys, derived values, summary (``final_*``, ``best_*``, …).
    A key the run's config.yaml lacks (added to the vocabulary after the run) has its default:
    the value the run trained with. ``study`` is the study the run serves (config.yaml's) and
    ``copied_from`` the ``<study>/<run>`` a sweep copied it from (None for a run trained here; a
    copy made before copied_from was recorded names the study its summary.json says trained it)."""
    import yaml

    run_dir = Path(run_dir)
    written: dict[str, Any] = yaml.safe_load((run_dir / "config.yaml").read_text())
    rec: dict[str, Any] = {**{k: f.default for k, f in config.FIELDS.items()}, **written}
    rec = {k: list(v) if isinstance(v, tuple) else v for k, v in rec.items()}
    summary = json.loads((run_dir / "summary.json").read_text())
    summary.pop("environment", None)
    trained_by = summary.get("study", rec["study"])
    rec.update(flatten(summary, sep="_"))
    rec["study"] = written.get("study", rec["study"])
    if rec.get("copied_from") is None and trained_by != rec["study"]:
        rec["copied_from"] = f"{trained_by}/{run_dir.name}"
    rec.setdefault("copied_from", None)
    rec["k"] = rec["batch_size"] / rec["reference_batch"]
    rec["run_dir"] = str(run_dir)
    return rec


def load_runs(study_dir: str | os.PathLike, names: Iterable[str] | None = None):
    """A pandas DataFrame of the runs in ``study_dir`` (those named, in order, if given)."""
    import pandas as pd

    study_dir = Path(study_dir)
    dirs = (
        [study_dir / n for n in names]
        if names is not None
        else sorted(p.parent for p in study_dir.glob("*/summary.json"))
    )
    return pd.DataFrame([run_record(d) for d in dirs if (d / "config.yaml").exists()])


def load_metrics(run_dir: str | os.PathLike, kind: str = "train"):
    """The ``metrics.jsonl`` records of one kind (train or eval) as a DataFrame."""
    import pandas as pd

    lines = Path(run_dir, "metrics.jsonl").read_text().splitlines()
    return pd.DataFrame([r for r in map(json.loads, lines) if r.get("kind") == kind])


def reference(study: str | None = None):
    """The published numbers (the project's copy of the papers' tables), optionally one study's."""
    import pandas as pd

    with resources.files("lbsgd").joinpath("reference/paper_results.csv").open() as f:
        df = pd.read_csv(f)
    return df if study is None else df[df["study"] == study].reset_index(drop=True)
