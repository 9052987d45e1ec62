"""A real Slurm cluster on localhost (tests/slurm_cluster.py) for the tests of a Slurm launcher: a
job runs this venv's Python as two tasks and leaves the queue when done, scancel ends a running job
and its processes, a requeued job runs again, and no daemon outlives the module. Skipped where
Slurm is missing or we are not root; under CI=true (which installs it: .ci/run) that fails."""

import os
import sys

import pytest
from slurm_cluster import LocalSlurm, alive, available, wait_until


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    reason = available()
    if reason and os.environ.get("CI") == "true":
        pytest.fail(f"CI=true and no local Slurm cluster: {reason}")
    if reason:
        pytest.skip(reason)
    with LocalSlurm(tmp_path_factory.mktemp("slurm")) as cluster:
        yield cluster
    assert [n for n, pid in cluster.pids.items() if alive(pid)] == []


def _submit(slurm, *args: str) -> str:
    return slurm.run("sbatch", "--parsable", *args).stdout.strip().split(";")[0]


def _state(slurm, job: str) -> str:
    """The job's state in squeue ("" once it has left)."""
    return slurm.run("squeue", "-h", "-j", job, "-o", "%T", check=False).stdout.strip()


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_job_runs_this_python_as_two_tasks_writes_its_output_and_leaves_the_queue(
    slurm, tmp_path
):
    out = tmp_path / "out.txt"
    code = "import os, sys; print('task', os.environ['SLURM_PROCID'], sys.prefix)"
    job = _submit(slurm, "-n", "2", "-o", str(out), "--wrap", f'srun {sys.executable} -c "{code}"')
    assert wait_until(lambda: _state(slurm, job) == "", 30)
    assert sorted(out.read_text().splitlines()) == [f"task {i} {sys.prefix}" for i in (0, 1)]


@pytest.mark.timeout(120)
def test_scancel_ends_a_running_job_and_its_processes(slurm, tmp_path):
    pidfile = tmp_path / "sleep.pid"
    job = _submit(slurm, "-o", "/dev/null", "--wrap", f"sleep 300 & echo $! > {pidfile}; wait")
    assert wait_until(lambda: pidfile.exists() and pidfile.read_text().strip(), 30)
    assert _state(slurm, job) == "RUNNING"
    slurm.run("scancel", job)
    assert wait_until(lambda: _state(slurm, job) == "", 10)
    assert not alive(int(pidfile.read_text()))


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_requeued_running_job_runs_again(slurm, tmp_path):
    out = tmp_path / "out.txt"
    starts = lambda: out.read_text().count("start") if out.exists() else 0  # noqa: E731
    job = _submit(slurm, "--open-mode=append", "-o", str(out), "--wrap", "echo start; sleep 300")
    assert wait_until(lambda: starts() == 1, 30)
    slurm.run("scontrol", "requeue", job)
    assert wait_until(lambda: starts() == 2, 60)
    assert _state(slurm, job) == "RUNNING"
    slurm.run("scancel", job)
