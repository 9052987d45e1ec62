"""A study's sweep: its runs checked before any work, those done settled (skipped, copied), the
others trained ``parallel`` at a time through :mod:`lbsgd.jobs`, each one's end said in a line
(docs/studies.md, "What a sweep prints")."""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lbsgd import config, jobs, registry, rundir, tracking
from lbsgd.config import Config
from lbsgd.experiments import slurm
from lbsgd.experiments.commands import (
    SweepJob,
    SweepRun,
    check_launch,
    command_line,
    error_line,
    start,
    train_args,
)
from lbsgd.experiments.copies import copy_run, find_identical
from lbsgd.experiments.interrupts import (
    RunInterrupted,
    interrupted,
    sigterm_as_interrupt,
    stop_text,
)
from lbsgd.experiments.lines import Progress, result_text, shown
from lbsgd.experiments.results import DONE, load_runs

LAUNCHERS = ("local", "slurm")


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
    ``launcher``: ``local`` (processes on this machine) or ``slurm`` (each run a Slurm job on
    ``cluster``, a :class:`~lbsgd.experiments.slurm.Cluster` or its file's name and overrides:
    :mod:`lbsgd.experiments.slurm`)."""
    config.check_folder_name("study", study)  # its folder is made even for no runs
    config.check_place(out_dir, study)
    cluster = launcher_of(launcher, cluster)
    agents = nnodes * (cluster.tasks_per_node if cluster else 1)  # torchrun's nodes
    check_launch(
        nproc_per_node=nproc_per_node,
        nnodes=nnodes,
        rdzv_endpoint=rdzv_endpoint,
        parallel=parallel,
        max_restarts=max_restarts,
    )
    base = {
        "study": study,
        "out_dir": str(out_dir),
        "wandb": wandb,
        "resume": True,
        "profile": profile,
    }
    cfgs = _configs(study, base, runs, profile)
    names = [c.run_name() for c in cfgs]
    _check_runs(cfgs, cluster, nproc_per_node * agents, nproc_per_node)
    study_dir = Path(out_dir) / study
    study_dir.mkdir(parents=True, exist_ok=True)
    say = (lambda *a: None) if quiet else (lambda msg: print(msg, flush=True))

    with sigterm_as_interrupt() as terminated:
        policy = (_Sweep if cluster is None else _SlurmSweep)(
            study,
            Progress(len(cfgs), say),
            command=lambda c: command_line(c, nproc_per_node, nnodes, rdzv_endpoint, max_restarts),
            root=Path(out_dir),
            world_size=nproc_per_node * agents,
            wandb=wandb,
            terminated=terminated,
            parallel=parallel,
        )
        if cluster is not None:
            policy.attach(cluster, nnodes, nproc_per_node)
        jobs.Runner([SweepRun(c, study_dir / f"{c.run_name()}.log") for c in cfgs], policy).run()
    if policy.failed:
        raise RunFailed(" | ".join(policy.failed))
    return load_runs(study_dir, names=names)


def _check_runs(cfgs: list[Config], cluster, world_size: int, nproc_per_node: int) -> None:
    """Every run's data directories, process layout and run directory (read only); the cluster's
    partition and the runs' checkpoints under ``launcher=slurm``."""
    from lbsgd import entry  # torch: imported once the cheap checks have passed

    for c in cfgs:
        registry.import_plugins(c.plugins)  # a plugin's model or dataset, as the run will see it
        entry.check(c, world_size, nproc_per_node, here=cluster is None)
        # a finished run of other experiment keys (or of another K, under local SGD) is not "done"
        rundir.check_run_dir(c, world_size)
    if cluster is not None:
        slurm.check(cluster, cfgs)


def launcher_of(
    launcher: str, cluster: slurm.Cluster | str | None, root: Path | None = None
) -> slurm.Cluster | None:
    """The cluster a sweep's runs go to (None: this machine), checked: ``launcher`` one of
    :data:`LAUNCHERS`; under ``slurm``, ``cluster`` a Cluster or its file's name and overrides
    (a name of ``root/configs/cluster/``, default the working directory's)."""
    if launcher not in LAUNCHERS:
        raise config.ConfigError(f"launcher={launcher!r} must be one of {LAUNCHERS}")
    if launcher == "local":
        return None
    return cluster if isinstance(cluster, slurm.Cluster) else slurm.cluster_of(cluster, root)


def _configs(
    study: str, base: dict[str, Any], runs: Sequence[Mapping[str, Any]], profile: str | None
) -> list[Config]:
    """Each run's Config (``base`` under its keys) with ``varied``, before any work: a user's own
    runs (no ``profile``) refused where a key is ignored, and two runs of one experiment refused."""
    runs = config.run_list(runs)
    cfgs = [config.from_dict({**base, **r}) for r in runs]
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
    the others started ``parallel`` at a time until one fails, each one's end said in a line (a
    failure added to ``failed``), and on an interrupt every run in flight stopped and named."""

    study: str
    progress: Progress
    command: Any  # a run's config -> its command line
    root: Path  # the runs' out_dir: where a twin is looked for
    world_size: int
    wandb: str
    terminated: list[int]  # the SIGTERMs and SIGHUPs the sweep caught (sigterm_as_interrupt)
    parallel: int = 1
    failed: list[str] = field(default_factory=list)

    def prepare(self, runner: jobs.Runner[SweepRun]) -> None:
        _settle(runner, self.progress, self.root, self.world_size, self.wandb)

    def start(self, job: SweepJob) -> subprocess.Popen:
        return start(job.item, self.command)

    def started(self, job: SweepJob) -> None:
        self.progress.line(job, f"{job.item.how} (log: {shown(job.item.log)})")

    def may_start(self) -> bool:
        return not self.failed

    def ended(self, job: SweepJob) -> None:
        _ended(job, self.failed, self.progress)

    def interrupted(self, runner: jobs.Runner[SweepRun]) -> RunInterrupted:
        error = interrupted(self.study, runner.running, runner.pending, self.failed, self.progress)
        if signal.SIGTERM in self.terminated:  # the process ends before anyone shows the error
            self.progress.say(f"{type(error).__name__}: {error}")
        return error


def _settle(
    runner: jobs.Runner[SweepRun], progress: Progress, root: Path, world_size: int, wandb: str
) -> None:
    """Settle the runs already done here (skipped) and those another study of ``root`` completed
    (copied), one line each."""
    for job in runner.pending:
        c, run_dir = job.item.cfg, job.item.cfg.run_dir()
        status = rundir.read_status(run_dir)
        if status in DONE:
            runner.settle(job)
            progress.end(job, f"skipped (already {status})", tally=False)
            continue
        twin = None if run_dir.exists() else find_identical(c, root, world_size)
        if twin is not None:
            copy_run(twin, c)
            runner.settle(job)
            progress.end(job, f"copied from {twin.parent.name}/ (identical run)", tally=False)
            # W&B: the copy in this study's group too (never fails the sweep)
            tracking.log_copied_run(run_dir, copied_from=twin, mode=wandb, project=c.wandb_project)


@dataclass
class _SlurmSweep(_Sweep):
    """The sweep's policy under ``launcher=slurm``: each run started is a job submitted (or, when
    one recorded for it is still queued or running, attached to), one line as its queue state
    changes (pending and Slurm's reason, running on its node, requeued at the step it reached),
    its end as Slurm gives it; SIGHUP (its client gone) leaves the jobs running, unwatched."""

    cluster: slurm.Cluster | None = None
    nnodes: int = 1
    nproc: int = 1
    queue: slurm.Queue | None = None

    def attach(self, cluster: slurm.Cluster, nnodes: int, nproc: int) -> None:
        self.cluster, self.nnodes, self.nproc = cluster, nnodes, nproc
        self.queue = slurm.Queue(cluster.poll_s, self.progress.say)

    def start(self, job: SweepJob) -> slurm.SlurmProc:
        run = job.item
        job_id = slurm.recorded(run.cfg, self.queue)
        run.how = f"attached to Slurm job {job_id}" if job_id else "queued as Slurm job"
        if job_id is None:
            args = train_args(run.cfg)
            job_id = slurm.submit(run.cfg, args, run.log, self.cluster, self.nnodes, self.nproc)
            run.how += f" {job_id}"
        proc = slurm.SlurmProc(job_id, self.queue)
        if run.how.startswith("queued"):
            proc.last = ("PENDING", "", "None")  # said by the line that names the job
        return proc

    def watch(self, runner: jobs.Runner[SweepRun]) -> bool:
        for job in runner.running:
            p = job.proc
            now = state, node, reason = self.queue.state(p.job_id)
            if state in ("", "COMPLETING", *slurm.ENDED) or now == p.last:
                continue
            if p.last[0] == "RUNNING" and state != "SUSPENDED":  # an attempt ended, job stays
                text = f"requeued, {stop_text(job.item.cfg.run_dir())[0]}"
            elif state == "RUNNING":
                text = f"running on {node}"
            else:
                text = state.lower() + (f" ({reason})" if reason not in ("", "None") else "")
            p.last = now
            self.progress.line(job, f"{text} (Slurm job {p.job_id})")
        return False

    def ended(self, job: SweepJob) -> None:
        p, run = job.proc, job.item
        how = f"Slurm job {p.job_id} {p.ended or 'left the queue'}"
        _ended(job, self.failed, self.progress, slurm.node_log(run.cfg, run.log, p.job_id), how)

    def interrupted(self, runner: jobs.Runner[SweepRun]) -> RunInterrupted:
        if signal.SIGHUP not in self.terminated:
            return super().interrupted(runner)
        for job in runner.running:
            self.progress.line(job, f"left running as Slurm job {job.proc.job_id}")
        for job in runner.pending:
            self.progress.line(job, "not started")
        return RunInterrupted(
            f"sweep of study {self.study!r} detached (SIGHUP): {len(runner.running)} Slurm jobs "
            f"left running, {len(runner.pending)} runs not started; run the same sweep again to "
            "attach to them and go on",
            [j.item.cfg.run_name() for j in (*runner.running, *runner.pending)],
        )


def _ended(
    job: SweepJob, failed: list[str], progress: Progress, log: Path | None = None, how: str = ""
) -> None:
    """The line of a run that ended; a failure is added to ``failed``, with the error line of
    ``log`` (default: the run's) and ``how`` it ended (default: its exit code)."""
    run = job.item
    log = log or run.log
    if run.handle is not None:  # a Slurm job's log is written on its allocation
        run.handle.close()
    rc, secs = job.proc.returncode, job.seconds
    status = rundir.read_status(run.cfg.run_dir())
    # torchrun reports any failed worker as exit code 1, so the run's own record decides:
    # a diverged run (trainer exit code 3) is a result, not a failure
    if status in DONE:
        progress.end(job, f"{status} in {secs:.0f} s{result_text(run.cfg.run_dir())}")
        return
    failed.append(
        f"run {run.cfg.run_name()} failed ({how or f'exit code {rc}'}); log: {shown(log)}; "
        f"error: {error_line(log)}"
    )
    progress.end(job, f"FAILED ({how}), see {shown(log)}" if how else f"FAILED, see {shown(log)}")
