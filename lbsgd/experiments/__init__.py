"""The notebook-facing API: launch sweeps of runs through torchrun, load their results, compare.

A study (one notebook) describes its runs as flat dicts of config keys and hands them to
:func:`sweep`, which

- validates every run's config first, with the launch parameters, the data directories, the
  process layout and the run directories (bad input stops the sweep with one line before anything
  starts, and no file is touched; a finished run of other experiment keys under the same name is
  refused, not skipped),
- writes ``profile`` and ``varied`` (the keys whose values differ across the runs, ``k`` for
  ``batch_size``) into every run's config: W&B's tags and display names,
- skips runs already complete in ``out_dir/study/`` and copies an identical run (same experiment
  keys) completed by another study of ``out_dir`` (the same profile) instead of training it again
  (the copy's config.yaml and summary.json name this study, ``study``, and the run copied,
  ``copied_from: <study>/<run>``; W&B gets it in this study's group),
- starts each remaining run as ``python -m torch.distributed.run … -m lbsgd train key=value …``
  with ``resume=true`` (a stopped run continues from its checkpoint) and ``--max-restarts``
  ``max_restarts`` (torchrun restarts a group that lost a worker; the group resumes)
  (a one-process run as ``python -m lbsgd train key=value …``: the same trainer, without the
  agent's few seconds of start-up)
  (worker code never lives in a notebook), ``parallel`` at a time, with the output of each in
  ``out_dir/study/<run>.log`` (appended: each attempt begins with a line saying when it began and
  whether it resumes from a checkpoint),
- numbers each run once, ``[i/N]`` by its place in ``runs``, and prints it on every line of that
  run: ``skipped``, ``copied``, ``resumed`` (a checkpoint exists) or ``started``, then, for a run
  it trains, one line when it ends (status, cost, error, how many of the N are done),
- records a diverged run and goes on; a run that fails raises :class:`RunFailed` naming the run
  and its log, once the runs in flight have finished,
- on an interrupt (Ctrl-C, Jupyter's Kernel > Interrupt, SIGTERM to the sweep's process: the runs,
  in sessions of their own, do not see it) asks every running run to stop with SIGTERM (torchrun
  passes it on to its workers; each stops at its next metric flush with a checkpoint, status
  ``interrupted``), waits for them, prints one line per run stopped or not started and raises
  :class:`RunInterrupted`, whose one line sums up (IPython, hence Jupyter and papermill, shows that
  line and no traceback); a SIGTERM then goes on to its earlier handler (by default the process
  ends). The same sweep again resumes the runs. A second interrupt (not a SIGTERM) while waiting
  kills them (each keeps its last checkpoint). A run whose sweep dies without a word (a killed kernel) is
  sent SIGTERM by the system (Linux), not orphaned; SIGHUP (the sweep's client gone) stops local
  runs the same way and leaves Slurm's jobs running, unwatched (docs/cluster.md),

and returns :func:`load_runs` of the study: one row per run, every key, derived value and summary
field. Everything here reads the local results only: no W&B server is needed to compare runs.

By concern: :mod:`~lbsgd.experiments.sweeps` (the sweep and its policy),
:mod:`~lbsgd.experiments.commands` (how a run starts: launch parameters, command line, orphan
guard, its log's attempts), :mod:`~lbsgd.experiments.copies` (a twin found and copied),
:mod:`~lbsgd.experiments.interrupts` (stopping a sweep's runs), :mod:`~lbsgd.experiments.lines`
(the sweep's lines), :mod:`~lbsgd.experiments.slurm` (``launcher="slurm"``: each run a Slurm
job), :mod:`~lbsgd.experiments.results` (reading runs back) and
:mod:`~lbsgd.experiments.tables` (tables and figures). Every name is imported from here:
``from lbsgd import experiments as ex``.
"""

from lbsgd.experiments.commands import ATTEMPT_MARK, check_launch
from lbsgd.experiments.copies import COPY_IGNORE, COPY_RUN_KEYS, MEASUREMENT_KEYS, find_identical
from lbsgd.experiments.interrupts import RunInterrupted
from lbsgd.experiments.lines import result_text, shown
from lbsgd.experiments.results import (
    DONE,
    load_metrics,
    load_runs,
    read_metrics,
    reference,
    run_record,
)
from lbsgd.experiments.slurm import Cluster, cluster_of
from lbsgd.experiments.sweeps import LAUNCHERS, RunFailed, launcher_of, sweep, varied_keys
from lbsgd.experiments.tables import (
    POINTS_COLUMN,
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
    "cluster_of",
    "COPY_IGNORE",
    "COPY_RUN_KEYS",
    "DONE",
    "MEASUREMENT_KEYS",
    "POINTS_COLUMN",
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
    "run_record",
    "save_figure",
    "save_table",
    "shown",
    "study_dir",
    "summarize",
    "sweep",
    "varied_keys",
]
