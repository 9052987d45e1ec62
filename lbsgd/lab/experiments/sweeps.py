"""A study's sweep: its runs checked before any work, those done settled (skipped, copied), the
others trained ``parallel`` at a time through :mod:`lbsgd.jobs` where its launcher sends them (a
:class:`Launcher` of :data:`LAUNCHERS`), each one's end said in a line (docs/studies.md, "What a
sweep prints")."""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from lbsgd import config, jobs, registry, rundir, tracking
from lbsgd.config import Config
from lbsgd.lab.experiments import commands, slurm
from lbsgd.lab.experiments.commands import (
    SweepJob,
    SweepRun,
    check_launch,
    command_line,
    error_line,
)
from lbsgd.lab.experiments.copies import copy_run, find_identical
from lbsgd.lab.experiments.interrupts import RunInterrupted, interrupted, sigterm_as_interrupt
from lbsgd.lab.experiments.lines import Progress, result_text, shown
from lbsgd.lab.experiments.results import DONE, load_runs


class Launcher(Protocol):
    """Where a sweep's runs go, built whole: ``Launcher(cluster_of(cluster), say, **launch)``
    (nproc_per_node, nnodes, rdzv_endpoint, max_restarts). It checks the runs before anything is
    written, starts one (or attaches to its job: ``run.how``), watches one (a line when its state
    changed), stops one with a checkpoint (SIGTERM) or kills it, closes one that ended (the log
    that says how, and how: '' for its exit code), and on SIGHUP leaves its runs running (their
    RunInterrupted) or not (None). A new scheduler: a class in a file and a row of LAUNCHERS."""

    here: bool  # the runs train on this machine: its devices and memory are theirs to check
    world_size: int  # the processes of each run

    @staticmethod
    def cluster_of(spec: Any, root: Path | None = None) -> Any: ...
    def check(self, cfgs: list[Config]) -> None: ...
    def start(self, run: SweepRun) -> jobs.Process: ...
    def watch(self, job: SweepJob) -> str: ...
    def stop(self, proc: Any) -> None: ...
    def kill(self, proc: Any) -> None: ...
    def close(self, job: SweepJob) -> tuple[Path, str]: ...
    def hang_up(self, study: str, runner: jobs.Runner, progress: Progress) -> Any: ...


class LocalLauncher:
    """``launcher="local"``: each run a process on this machine (the trainer, or torchrun's agent)
    in a session of its own, behind the orphan guard (:func:`lbsgd.lab.experiments.commands.start`)."""

    here = True

    def __init__(self, cluster: None, say, **launch: Any) -> None:
        self.launch, self.world_size = launch, launch["nproc_per_node"] * launch["nnodes"]

    @staticmethod
    def cluster_of(spec: Any, root: Path | None = None) -> None:
        return None  # this machine: no cluster file

    def check(self, cfgs: list[Config]) -> None:
        pass

    def start(self, run: SweepRun) -> subprocess.Popen:
        return commands.start(run, lambda c: command_line(c, **self.launch))

    def watch(self, job: SweepJob) -> str:
        return ""

    def stop(self, proc: subprocess.Popen) -> None:
        proc.send_signal(signal.SIGTERM)  # torchrun's agent passes it on to its workers

    def kill(self, proc: subprocess.Popen) -> None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # its own session: torchrun's workers too
        except OSError:
            proc.kill()

    def close(self, job: SweepJob) -> tuple[Path, str]:
        job.item.handle.close()
        return job.item.log, ""

    def hang_up(self, study: str, runner: jobs.Runner, progress: Progress) -> None:
        return None


LAUNCHERS: dict[str, type[Launcher]] = {"local": LocalLauncher, "slurm": slurm.SlurmLauncher}


class RunFailed(RuntimeError):
    """A run of a sweep ended with an error (not a divergence)."""


def varied_keys(cfgs: Sequence[Config]) -> tuple[str, ...]:
    """The keys whose values differ across ``cfgs``, sorted, ``k`` standing for ``batch_size``
    (``name`` left out: a run's folder name, not a key it was trained with)."""
    dicts = [c.to_dict() for c in cfgs]
    keys = {
        k
        for k in dicts[0]
        if k not in ("name", "varied") and any(d[k] != dicts[0][k] for d in dicts[1:])
    }
    if "batch_size" in keys:
        keys = (keys - {"batch_size"}) | {"k"}
    return tuple(sorted(keys))


def sweep(
    study: str,
    runs: Sequence[Mapping[str, Any]],
    *,
    out_dir: str | os.PathLike = "results",
    nproc_per_node: int = 1,
    nnodes: int = 1,
    rdzv_endpoint: str | None = None,
    parallel: int = 1,
    wandb: str = "auto",
    max_restarts: int = 0,
    quiet: bool = False,
    profile: str | None = None,
    launcher: str = "local",
    cluster: slurm.Cluster | str | None = None,
):
    """Train every run of ``runs`` (dicts of config keys) into ``out_dir/study``; see the module.

    ``profile`` (the study's scale) is written into every run's config, as is ``varied``.
    ``launcher``: a name of :data:`LAUNCHERS`, ``local`` (processes on this machine) or ``slurm``
    (each run a Slurm job on ``cluster``, a :class:`~lbsgd.lab.experiments.slurm.Cluster` or its
    file's name and overrides: :mod:`lbsgd.lab.experiments.slurm`)."""
    config.check_folder_name("study", study)  # its folder is made even for no runs
    config.check_place(out_dir, study)
    cluster = launcher_of(launcher, cluster)
    launch = {"nnodes": nnodes, "rdzv_endpoint": rdzv_endpoint, "max_restarts": max_restarts}
    check_launch(nproc_per_node=nproc_per_node, parallel=parallel, **launch)
    base = {"study": study, "out_dir": str(out_dir), "wandb": wandb, "resume": True}
    cfgs = _configs(study, base, runs, profile)
    names = [c.run_name() for c in cfgs]
    say = (lambda *a: None) if quiet else (lambda msg: print(msg, flush=True))
    progress = Progress(len(cfgs), say)
    where = LAUNCHERS[launcher](cluster, say, nproc_per_node=nproc_per_node, **launch)
    from lbsgd import entry  # torch: imported once the cheap checks have passed

    for c in cfgs:  # every run's data, process layout and run directory (read only)
        registry.import_plugins(c.plugins)  # a plugin's model or dataset, as the run will see it
        entry.check(c, where.world_size, nproc_per_node, here=where.here)
        # a finished run of other experiment keys (or of another K, under local SGD) is not "done"
        rundir.check_run_dir(c, where.world_size)
    where.check(cfgs)  # then what the launcher needs of them
    study_dir = Path(out_dir) / study
    study_dir.mkdir(parents=True, exist_ok=True)

    with sigterm_as_interrupt() as terminated:
        policy = _Sweep(study, progress, where, Path(out_dir), wandb, terminated, parallel)
        jobs.Runner([SweepRun(c, study_dir / f"{c.run_name()}.log") for c in cfgs], policy).run()
    if policy.failed:
        raise RunFailed(" | ".join(policy.failed))
    return load_runs(study_dir, names=names)


def launcher_of(launcher: str, cluster: Any, root: Path | None = None) -> Any:
    """The cluster a sweep's runs go to, checked: ``launcher`` one of :data:`LAUNCHERS`, whose
    ``cluster_of`` reads ``cluster`` (under ``slurm``, a Cluster or its file's name and overrides:
    a name of ``root/configs/cluster/``, default the working directory's)."""
    if launcher not in LAUNCHERS:
        raise config.ConfigError(f"launcher={launcher!r} must be one of {tuple(LAUNCHERS)}")
    return LAUNCHERS[launcher].cluster_of(cluster, root)


def _configs(
    study: str, base: dict[str, Any], runs: Sequence[Mapping[str, Any]], profile: str | None
) -> list[Config]:
    """Each run's Config (``base`` and ``profile`` under its keys) with ``varied``, before any work:
    a user's own runs (no ``profile``) refused where a key is ignored, two runs of one experiment
    refused."""
    runs = config.run_list(runs)
    cfgs = [config.from_dict({**base, "profile": profile, **r}) for r in runs]
    # a user's own runs: no key that their setting ignores (a study's are whole profiles)
    if profile is None:
        for c, r in zip(cfgs, runs, strict=True):
            config.check_ignored(c, r)
    if cfgs:
        varied = varied_keys(cfgs)
        cfgs = [c.replace(varied=varied) for c in cfgs]
    names = [c.run_name() for c in cfgs]
    if len(set(names)) != len(names):
        dup = sorted({n for n in names if names.count(n) > 1})
        raise config.ConfigError(f"runs of study {study!r} repeat the same experiment: {dup}")
    return cfgs


@dataclass
class _Sweep(jobs.Policy[SweepRun]):
    """The sweep's policy for its runner (:mod:`lbsgd.jobs`): runs settled first (skipped, copied),
    the others started by the launcher ``parallel`` at a time until one fails, each one's end said
    in a line; on an interrupt every run in flight stopped and named (or left running: hang_up)."""

    study: str
    progress: Progress
    launcher: Launcher
    root: Path  # the runs' out_dir: where a twin is looked for
    wandb: str
    terminated: list[int]  # the SIGTERMs and SIGHUPs the sweep caught (sigterm_as_interrupt)
    parallel: int = 1
    failed: list[str] = field(default_factory=list)

    def prepare(self, runner: jobs.Runner[SweepRun]) -> None:
        """Settle the runs already done here (skipped) and those another study of ``root``
        completed (copied), one line each."""
        end, size = self.progress.end, self.launcher.world_size
        for job in runner.pending:
            c, run_dir = job.item.cfg, job.item.cfg.run_dir()
            status = rundir.read_status(run_dir)
            if status in DONE:
                runner.settle(job)
                end(job, f"skipped (already {status})", tally=False)
                continue
            twin = None if run_dir.exists() else find_identical(c, self.root, size)
            if twin is not None:
                copy_run(twin, c)
                runner.settle(job)
                end(job, f"copied from {twin.parent.name}/ (identical run)", tally=False)
                # W&B: the copy in this study's group too (never fails the sweep)
                mode, project = self.wandb, c.wandb_project
                tracking.log_copied_run(run_dir, copied_from=twin, mode=mode, project=project)

    def start(self, job: SweepJob) -> jobs.Process:
        return self.launcher.start(job.item)

    def started(self, job: SweepJob) -> None:
        self.progress.line(job, f"{job.item.how} (log: {shown(job.item.log)})")

    def may_start(self) -> bool:
        return not self.failed

    def watch(self, runner: jobs.Runner[SweepRun]) -> bool:
        for job in runner.running:
            if text := self.launcher.watch(job):
                self.progress.line(job, text)
        return False

    def ended(self, job: SweepJob) -> None:
        """The line of a run that ended; a failure added to ``failed``, with its log's error line."""
        run, progress = job.item, self.progress
        log, how = self.launcher.close(job)
        status = rundir.read_status(run.cfg.run_dir())
        # torchrun reports any failed worker as exit code 1, so the run's own record decides:
        # a diverged run (trainer exit code 3) is a result, not a failure
        if status in DONE:
            progress.end(job, f"{status} in {job.seconds:.0f} s{result_text(run.cfg.run_dir())}")
            return
        self.failed.append(
            f"run {run.cfg.run_name()} failed ({how or f'exit code {job.proc.returncode}'}); "
            f"log: {shown(log)}; error: {error_line(log)}"
        )
        progress.end(
            job, f"FAILED ({how}), see {shown(log)}" if how else f"FAILED, see {shown(log)}"
        )

    def interrupted(self, runner: jobs.Runner[SweepRun]) -> RunInterrupted:
        if signal.SIGHUP in self.terminated and (
            detached := self.launcher.hang_up(self.study, runner, self.progress)
        ):
            return detached
        error = interrupted(self.study, self.launcher, runner, self.failed, self.progress)
        if signal.SIGTERM in self.terminated:  # the process ends before anyone shows the error
            self.progress.say(f"{type(error).__name__}: {error}")
        return error
