"""lbsgd.jobs, the one subprocess runner, with cheap processes (``python -c``): it calls its
policy's hooks as the module says (at most ``parallel`` at a time, each end with its exit status,
no more started when the policy says so, an interrupt to the policy, which stops the jobs)."""

import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from lbsgd import jobs


def python(code: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.DEVNULL)


class Recorder(jobs.Policy):
    """Starts ``python -c <item>``; records what the runner tells it, and the most jobs it saw
    running at once (``runner``: the runner, once made)."""

    def __init__(self, parallel: int = 1) -> None:
        self.parallel = parallel
        self.events: list[tuple] = []
        self.runner: jobs.Runner | None = None
        self.most = 0

    def start(self, job):
        return python(job.item)

    def started(self, job):
        self.events.append(("started", job.number))
        if self.runner is not None:
            self.most = max(self.most, len(self.runner.running))

    def ended(self, job):
        self.events.append(("ended", job.number, job.proc.returncode))


def test_at_most_parallel_jobs_run_and_each_end_reaches_the_policy_with_its_exit_status():
    codes = [0, 3, 0, 7, 1]
    policy = Recorder(parallel=2)
    items = [f"import time, sys; time.sleep(0.3); sys.exit({c})" for c in codes]
    policy.runner = runner = jobs.Runner(items, policy, poll_s=0.05)
    runner.run()
    assert policy.most == 2
    ends = sorted(e[1:] for e in policy.events if e[0] == "ended")
    assert ends == [(i, c) for i, c in enumerate(codes, 1)]
    assert [e[1] for e in policy.events if e[0] == "started"] == [1, 2, 3, 4, 5]  # in order
    assert runner.pending == [] and runner.running == []
    # two start at once, and each later start follows an end: a slot frees before the next starts
    kinds = [e[0] for e in policy.events]
    assert kinds[:3] == ["started", "started", "ended"]
    for i, kind in enumerate(kinds):
        if kind == "started" and i >= 2:
            assert kinds[:i].count("ended") >= kinds[:i].count("started") - 1


def test_a_policy_that_starts_no_more_ends_the_run_with_jobs_left_pending():
    class StopOnFailure(Recorder):
        def may_start(self):
            return not any(e[0] == "ended" and e[2] != 0 for e in self.events)

    policy = StopOnFailure(parallel=1)
    runner = jobs.Runner(["import sys; sys.exit(2)", "pass", "pass"], policy, poll_s=0.05)
    runner.run()
    assert policy.events == [("started", 1), ("ended", 1, 2)]
    assert [j.number for j in runner.pending] == [2, 3]


def test_settled_jobs_never_start():
    class Settle(Recorder):
        def prepare(self, runner):
            runner.settle(runner.jobs[0])

    policy = Settle()
    runner = jobs.Runner(["raise SystemExit(9)", "pass"], policy, poll_s=0.05)
    runner.run()
    assert policy.events == [("started", 2), ("ended", 2, 0)]
    assert runner.jobs[0].proc is None


def test_watch_stops_the_wait_and_leaves_the_jobs_to_the_caller():
    class Impatient(Recorder):
        def watch(self, runner):
            return True

    runner = jobs.Runner(["import time; time.sleep(30)"], Impatient(), poll_s=0.05)
    runner.run()
    (job,) = runner.running
    assert job.proc.poll() is None
    job.proc.kill()
    job.proc.wait()


@pytest.mark.skipif(threading.current_thread() is not threading.main_thread(), reason="SIGINT")
def test_an_interrupt_goes_to_the_policy_which_stops_the_running_jobs():
    """Ctrl-C while two jobs run and one waits: the policy is asked, it sends SIGTERM to the
    running jobs and waits for them, and its exception is what the run raises."""

    class Stop(Recorder):
        timer = None

        def started(self, job):
            super().started(job)
            if job.number == 2:  # Ctrl-C once both run: it comes while the runner waits
                self.timer = threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGINT))
                self.timer.start()

        def interrupted(self, runner):
            self.stopped = [j.number for j in runner.running]
            self.waiting = [j.number for j in runner.pending]
            for job in runner.running:
                job.proc.send_signal(signal.SIGTERM)
            self.codes = [job.proc.wait(timeout=30) for job in runner.running]
            return RuntimeError("stopped")

    policy = Stop(parallel=2)
    runner = jobs.Runner(["import time; time.sleep(60)"] * 3, policy, poll_s=0.05)
    began = time.monotonic()
    # Ctrl-C raises KeyboardInterrupt, as at a terminal (a pytest-xdist worker ignores SIGINT)
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(RuntimeError, match="stopped"):
            runner.run()
    finally:
        signal.signal(signal.SIGINT, before)
        if policy.timer is not None:
            policy.timer.cancel()
    assert time.monotonic() - began < 30
    assert policy.stopped == [1, 2] and policy.waiting == [3]
    assert policy.codes == [-signal.SIGTERM, -signal.SIGTERM]


def test_by_default_an_interrupt_is_raised_as_it_came():
    class Interrupting(Recorder):
        def started(self, job):
            super().started(job)
            raise KeyboardInterrupt

    runner = jobs.Runner(["import time; time.sleep(60)"], Interrupting(), poll_s=0.05)
    with pytest.raises(KeyboardInterrupt):
        runner.run()
    (job,) = runner.running  # started: the caller's to stop
    job.proc.kill()
    job.proc.wait()


def test_a_job_that_is_no_subprocess_runs_as_one_through_the_process_protocol():
    """A scheduler's job (no pid, its state polled from a queue) is a process to the runner as
    Popen is: it stays running while its poll says None, and its end reaches the policy with the
    exit status its poll gave."""

    class Queued:  # ends with its item as exit status at its third poll
        def __init__(self, code: int) -> None:
            self.code, self.polls, self.returncode = code, 0, None

        def poll(self):
            self.polls += 1
            self.returncode = self.code if self.polls >= 3 else None
            return self.returncode

        def wait(self):
            return self.code

    class Scheduler(Recorder):
        def start(self, job):
            return Queued(job.item)

    policy = Scheduler(parallel=2)
    policy.runner = runner = jobs.Runner([4, 0], policy, poll_s=0.01)
    runner.run()
    assert policy.most == 2 and sorted(e[1:] for e in policy.events if e[0] == "ended") == [
        (1, 4),
        (2, 0),
    ]
    assert [j.proc.polls for j in runner.jobs] == [3, 3]
