"""Reading a study's results: a run as a flat record (keys, derived values, summary), a study's
runs as a table, a run's metrics, the published numbers, and the statuses that end a run."""

from __future__ import annotations

import contextlib
import json
import os
import sys
from collections.abc import Iterable
from importlib import resources
from pathlib import Path
from typing import Any

from lbsgd import config
from lbsgd.tracking import flatten
from lbsgd.tracking import read_records as read_metrics

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


# set (to anything but "" or 0) to leave damaged runs out where a study reads its runs, each named
# in one line, instead of stopping at them (``lbsgd report --skip-damaged`` sets it)
SKIP_DAMAGED = "LBSGD_SKIP_DAMAGED"


RUN_FILES = ("config.yaml", "summary.json")  # a run that started writes both before its first step


def damage(run_dir: Path, needs: Iterable[str] = RUN_FILES) -> str | None:
    """Why a run's folder cannot be read (one of the files it ``needs`` missing or unreadable),
    or None."""
    import yaml

    parsers = {"config.yaml": yaml.safe_load, "summary.json": json.loads}
    for name in needs:
        path = run_dir / name
        if not path.is_file():
            return f"{name} missing"
        try:
            if name == "metrics.jsonl":
                read_metrics(path, quiet=True)  # a bad record before its last: one line
            elif not isinstance(parsers[name](path.read_text()), dict):
                return f"{name} holds no mapping"
        except (ValueError, yaml.YAMLError, UnicodeDecodeError, config.ConfigError) as e:
            why = str(e).splitlines()[0].replace(f"{path}: ", "")  # the folder is named
            return f"{name} unreadable ({why[:120]})"
    return None


def damaged(
    root: str | os.PathLike, depth: str = "*", needs: Iterable[str] = RUN_FILES
) -> tuple[list[Path], list[tuple[Path, str]]]:
    """Every run folder ``depth`` below ``root`` (one holding a config.yaml, summary.json or
    metrics.jsonl), sorted, and the damaged ones (:func:`damage`), each with why."""
    files = ("config.yaml", "summary.json", "metrics.jsonl")
    dirs = sorted({p.parent for f in files for p in Path(root).glob(f"{depth}/{f}")})
    return dirs, [(d, why) for d in dirs if (why := damage(d, needs))]


def say_cut(dirs: Iterable[Path]) -> None:
    """Each metrics.jsonl of ``dirs`` that ends in a record cut mid-line, named in a warning line
    (a missing or damaged one is :func:`damage`'s to name)."""
    for d in dirs:
        with contextlib.suppress(OSError, config.ConfigError):
            read_metrics(d / "metrics.jsonl")


def run_dirs(study_dir: str | os.PathLike, needs: Iterable[str] = RUN_FILES) -> list[Path]:
    """Every run folder of ``study_dir`` (:func:`damaged`), sorted. Damaged ones stop the read
    with one line naming each, unless :data:`SKIP_DAMAGED` is set in the environment, which
    leaves them out with one line each on stderr."""
    dirs, bad = damaged(study_dir, needs=needs)
    if bad and os.environ.get(SKIP_DAMAGED, "") in ("", "0"):
        named = "; ".join(f"{d} ({why})" for d, why in bad)
        raise config.ConfigError(
            f"{len(bad)} run folder(s) cannot be read: {named}; re-run them, or leave them out "
            f"(lbsgd report --skip-damaged, or {SKIP_DAMAGED}=1)"
        )
    for d, why in bad:
        print(f"lbsgd: warning: {d} left out ({why})", file=sys.stderr, flush=True)
    left_out = {d for d, _ in bad}
    return [d for d in dirs if d not in left_out]


def load_runs(study_dir: str | os.PathLike, names: Iterable[str] | None = None):
    """A pandas DataFrame of the runs in ``study_dir`` (those named, in order, if given); a
    damaged one stops the read in one line naming it (:func:`run_dirs`)."""
    import pandas as pd

    study_dir = Path(study_dir)
    every = run_dirs(study_dir)
    dirs = every if names is None else [d for d in (study_dir / n for n in names) if d in every]
    return pd.DataFrame([run_record(d) for d in dirs])


def load_metrics(run_dir: str | os.PathLike, kind: str = "train"):
    """The ``metrics.jsonl`` records of one kind (train or eval) as a DataFrame
    (:func:`read_metrics`)."""
    import pandas as pd

    records = read_metrics(Path(run_dir, "metrics.jsonl"))
    return pd.DataFrame([r for r in records if r.get("kind") == kind])


def reference(study: str | None = None):
    """The published numbers (the project's copy of the papers' tables), optionally one study's."""
    import pandas as pd

    with resources.files("lbsgd.lab").joinpath("reference/paper_results.csv").open() as f:
        df = pd.read_csv(f)
    return df if study is None else df[df["study"] == study].reset_index(drop=True)
