"""The notebook-facing API: launch a study's runs through torchrun, load their results, compare.

:func:`sweep` checks every run before any work, skips the complete, copies identical runs of
another study, trains the rest as ``lbsgd train`` subprocesses (``resume=true``), stops them with
a checkpoint on an interrupt, and returns :func:`load_runs` of the study; what it prints and how
it stops is docs/studies.md ("What a sweep prints"), Slurm is docs/cluster.md. Results are read
from the local files only, no W&B server. By concern: ``sweeps``, ``commands``, ``copies``,
``interrupts``, ``lines``, ``slurm``, ``results``, ``tables``; every name is imported from here
(``from lbsgd.lab import experiments as ex``).
"""

from lbsgd.lab.experiments.commands import ATTEMPT_MARK, check_launch
from lbsgd.lab.experiments.copies import COPY_IGNORE, find_identical
from lbsgd.lab.experiments.interrupts import RunInterrupted
from lbsgd.lab.experiments.lines import result_text, shown
from lbsgd.lab.experiments.results import (
    DONE,
    load_metrics,
    load_runs,
    read_metrics,
    reference,
)
from lbsgd.lab.experiments.slurm import Cluster, cluster_of
from lbsgd.lab.experiments.sweeps import (
    LAUNCHERS,
    Launcher,
    RunFailed,
    launcher_of,
    sweep,
    varied_keys,
)
from lbsgd.lab.experiments.tables import (
    plot_curves,
    readable,
    readable_cell,
    save_figure,
    save_table,
    study_dir,
    summarize,
)

__all__ = [
    "ATTEMPT_MARK",
    "LAUNCHERS",
    "Cluster",
    "Launcher",
    "cluster_of",
    "COPY_IGNORE",
    "DONE",
    "RunFailed",
    "RunInterrupted",
    "check_launch",
    "find_identical",
    "launcher_of",
    "load_metrics",
    "load_runs",
    "read_metrics",
    "plot_curves",
    "readable",
    "readable_cell",
    "reference",
    "result_text",
    "save_figure",
    "save_table",
    "shown",
    "study_dir",
    "summarize",
    "sweep",
    "varied_keys",
]
