"""The sweep's lines: each run named by its one number, a path as shown, a run's result."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lbsgd.lab.experiments.commands import SweepJob


def shown(path: Path) -> str:
    """``path`` as a sweep's line shows it: relative to the working directory when it lies under
    it (``make reproduce`` runs in the repository: results/<profile>/<study>/<run>.log, the same
    on every machine, so an executed notebook holds no machine's absolute path), else absolute."""
    try:
        return str(Path(path).resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


@dataclass
class Progress:
    """The sweep's lines: each names its run by its one number, ``[i/N]``."""

    total: int
    say: Any
    done: int = 0  # runs skipped, copied or ended

    def line(self, job: SweepJob, text: str) -> None:
        self.say(f"[{job.number}/{self.total}] {job.item.cfg.run_name()}: {text}")

    def end(self, job: SweepJob, text: str, tally: bool = True) -> None:
        """The line of a run that needs nothing more (``tally``: with how many of N are done)."""
        self.done += 1
        self.line(job, f"{text} ({self.done} of {self.total} done)" if tally else text)


def result_text(run_dir: Path) -> str:
    """The end of a run's sweep line: its final top-1 error and speed. A run with a held-out split
    shows that split's error only: a tuning trial is chosen by it, and its test error is the
    study's to report (for the chosen settings alone), not the sweep's."""
    s = json.loads((run_dir / "summary.json").read_text())
    final = s.get("final", {})
    val = final.get("val_top1_error_pct")
    err = final.get("top1_error_pct")
    ips = s.get("img_per_s")
    if val is not None:
        out = f", held-out top-1 error {val:.1f}%"
    else:
        out = f", top-1 error {err:.1f}%" if err is not None else ""
    return out + (f", {ips:.0f} img/s" if ips else "")
