"""What ``lbsgd train`` prints where no terminal shows tqdm's bar (nohup, SLURM, a sweep's log):
a plain progress line at every epoch's end and every :data:`lbsgd.progress.PLAIN_EVERY_S` seconds
of flushes, and one last line saying how the run ended, whatever the ending, with the numbers of
its summary.json; under torchrun, from rank 0 alone."""

import json
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import as_args, start, tiny_keys, used_keys
from helpers import (
    EIGHT_STEP_EPOCHS,
    PROGRESS,
    assert_ends_with_its_summary,
    catches_sigterm,
    in_session,
    interrupt,
    processes_naming,
    session_processes,
)

from lbsgd.progress import PLAIN_EVERY_S, Flushed, Progress, ending_line

# TINY at 8 steps per epoch (256 images, batch 32), 2 epochs, a flush every 2 steps
KEYS = tiny_keys(**EIGHT_STEP_EPOCHS, epochs=2)


def _run(out: Path, name: str, nproc: int | None = None, **extra) -> subprocess.Popen:
    """``lbsgd train`` with stdout and stderr into one pipe (no terminal), in the order written."""
    keys = used_keys({**KEYS, "out_dir": str(out), "name": name, **extra})
    return start(
        ["train", *as_args(keys)],
        nproc,
        env={"PYTHONUNBUFFERED": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _finish(proc: subprocess.Popen, timeout: float = 300) -> str:
    return proc.communicate(timeout=timeout)[0]


# -- the pieces, without a run ---------------------------------------------------------------------


class FakeClock:
    def __init__(self, t: float) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def test_plain_lines_come_at_epoch_ends_and_every_30_s_at_a_flush_only(capsys):
    """Without a terminal: a line at an epoch's end, else at the first flush PLAIN_EVERY_S after
    the previous line; never for a step that was not flushed (its values would need a device
    read). ETA from the pace since the loop began: 6 steps in 30 s, 10 to go -> 50 s."""
    clock = FakeClock(10.0)  # the loop begins 10 s after the run (t_start=0)
    p = Progress(16, 0, lambda step: step / 8, show=True, t_start=0.0, terminal=False, clock=clock)
    clock.t = 20.0
    p.flushed(Flushed(2, 2.5, 0.1, 300.0))
    assert p.report(2, epoch_end=False) is None  # 10 s after the loop began: not due
    clock.t = 30.0
    p.flushed(Flushed(4, 2.25, 0.1, 320.0))
    assert p.report(4, epoch_end=False) is None  # 20 s
    clock.t = 10.0 + PLAIN_EVERY_S
    assert p.report(5, epoch_end=False) is None  # due, but step 5 was not flushed
    p.flushed(Flushed(6, 2.0, 0.1, 310.0))
    clock.t = 10.0 + PLAIN_EVERY_S
    line = p.report(6, epoch_end=False)
    assert line == (
        "lbsgd: step 6/16 epoch 0.75 loss 2.0000 lr 0.1 img/s 310 elapsed 0:00:40 eta 0:00:50"
    )
    p.flushed(Flushed(8, 1.5, 0.05, 330.0))
    clock.t = 42.0
    end = p.report(8, epoch_end=True, top1_error=61.25)  # 2 s later, but an epoch's end
    assert end is not None and end.startswith("lbsgd: step 8/16 epoch 1.00 loss 1.5000 lr 0.05 ")
    assert end.endswith(" elapsed 0:00:42 eta 0:00:32 top-1 error 61.25%")
    assert capsys.readouterr().out.splitlines() == [line, end]


def test_a_run_of_more_than_a_day_is_one_warning_line_at_its_first_flush_naming_epochs(capsys):
    """epochs=1e9 at 8 steps an epoch: 8e9 steps; 10 steps in 1 s put the rest at 9.3e3 days.
    One line on stderr, at the first flush only; a run of a day or less says nothing."""
    clock = FakeClock(0.0)
    long = Progress(
        8 * 10**9, 0, lambda s: s / 8, show=True, t_start=0.0, terminal=False, clock=clock
    )
    clock.t = 1.0
    long.flushed(Flushed(10, 2.3, 0.1, 300.0))
    long.flushed(Flushed(20, 2.2, 0.1, 300.0))
    err = capsys.readouterr().err.splitlines()
    assert err == [
        "lbsgd: warning: at 0.1 s a step, the 7,999,999,990 steps left (epochs=1e+09) take about "
        "9,259.3 days; stop it (Ctrl-C) and lower epochs if that is not meant"
    ]
    clock.t = 0.0
    day = Progress(864_010, 0, lambda s: s / 8, show=True, t_start=0.0, terminal=False, clock=clock)
    clock.t = 1.0
    day.flushed(Flushed(10, 2.3, 0.1, 300.0))  # 864,000 steps left at 0.1 s: one day exactly
    off = Progress(
        8 * 10**9, 0, lambda s: s / 8, show=False, t_start=0.0, terminal=False, clock=clock
    )
    off.flushed(Flushed(10, 2.3, 0.1, 300.0))  # not rank 0
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("show, terminal", [(True, True), (False, False)])
def test_no_plain_lines_on_a_terminal_or_off_rank_0(capsys, show, terminal):
    p = Progress(16, 0, lambda s: s / 8, show=show, t_start=0.0, terminal=terminal)
    p.flushed(Flushed(8, 1.5, 0.05, 330.0))
    assert p.report(8, epoch_end=True) is None
    p.close()
    assert capsys.readouterr().out == ""


def test_ending_line_of_a_run_without_evaluation_says_n_a():
    summary = {"status": "failed", "steps": 3, "total_steps": 16, "wall_time_s": 3725.26}
    assert ending_line(summary, Path("out/runs/r")) == (
        "lbsgd: failed: final top-1 error n/a, best n/a, 3/16 steps, wall time 1:02:05.3, "
        f"summary {Path('out/runs/r/summary.json')}"
    )


def test_ending_line_of_a_resumed_run_gives_the_total_over_its_attempts_beside_the_last():
    summary = {
        "status": "completed",
        "steps": 16,
        "total_steps": 16,
        "wall_time_s": 38.04,
        "total_wall_time_s": 82.46,
        "attempts": 2,
    }
    assert ending_line(summary, Path("out/runs/r")) == (
        "lbsgd: completed: final top-1 error n/a, best n/a, 16/16 steps, wall time 0:00:38.0 "
        "(this attempt; 0:01:22.5 over 2 attempts), "
        f"summary {Path('out/runs/r/summary.json')}"
    )
    # one attempt: the line as before
    assert "attempt" not in ending_line({**summary, "attempts": 1}, Path("r"))


def test_ending_line_of_a_run_that_wrote_no_summary_names_its_run_folder():
    summary = {"status": "interrupted", "steps": 0, "total_steps": "?", "wall_time_s": 1.04}
    assert ending_line(summary, Path("out/runs/r"), written=False) == (
        "lbsgd: interrupted: final top-1 error n/a, best n/a, 0/? steps, wall time 0:00:01.0, "
        f"no summary in {Path('out/runs/r')}"
    )


# -- lbsgd train, its output redirected -------------------------------------------------------------


@pytest.mark.slow
def test_a_completed_run_prints_progress_at_each_epoch_and_ends_with_its_summary(tmp_path):
    proc = _run(tmp_path, "done")
    out = _finish(proc)
    assert proc.returncode == 0, out[-3000:]
    run_dir = tmp_path / "runs" / "done"
    summary = assert_ends_with_its_summary(out, run_dir, "completed")
    assert out.rstrip().splitlines()[-1].startswith("lbsgd: completed: ")  # the last line
    lines = {int(m[0]): m for m in PROGRESS.findall(out)}
    assert len(lines) == len(PROGRESS.findall(out))  # a step's line once
    assert {8, 16} <= set(lines)  # each epoch's end (others: only 30 s after the previous line)
    for step, (_, total, epoch, loss, lr, img_s, _, _, _) in lines.items():
        assert total == "16" and float(epoch) == step / 8
        assert float(loss) > 0 and float(lr) > 0 and int(img_s) > 0
    assert lines[8][8] and lines[16][8] == f"{summary['final']['top1_error_pct']:.2f}"
    metrics = [json.loads(r) for r in (run_dir / "metrics.jsonl").read_text().splitlines()]
    train = {r["step"]: r for r in metrics if r["kind"] == "train"}
    assert lines[16][3] == f"{train[16]['loss']:.4f}"  # the flushed loss, as metrics.jsonl has it
    assert "it/s" not in out and "step/s" not in out  # no tqdm bar without a terminal


@pytest.mark.slow
def test_a_diverged_run_ends_with_status_diverged_and_exit_code_3(tmp_path):
    proc = _run(tmp_path, "boom", base_lr=1e8, warmup="none")
    out = _finish(proc)
    assert proc.returncode == 3, out[-3000:]
    summary = assert_ends_with_its_summary(out, tmp_path / "runs" / "boom", "diverged")
    assert summary["steps"] < summary["total_steps"]


@pytest.mark.slow
def test_an_interrupted_run_ends_with_status_interrupted_and_exit_code_143(tmp_path):
    """Ctrl-C once the first epoch is evaluated: the run stops at its next flush and says so."""
    run_dir = tmp_path / "runs" / "stopped"
    proc = _run(tmp_path, "stopped", epochs=200)  # far longer than the test waits
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        metrics = run_dir / "metrics.jsonl"
        if metrics.exists() and '"kind": "eval"' in metrics.read_text():
            break
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    out = _finish(proc)
    assert proc.returncode == 143, out[-3000:]
    summary = assert_ends_with_its_summary(out, run_dir, "interrupted")
    assert "top1_error_pct" in summary["final"]  # an evaluated run: its error is on the line


REPO = Path(__file__).resolve().parents[1]
# each long command but train (lbsgd plan's stages: tests/test_plan.py): its arguments, the
# signal, and the line read before it is sent (None: as soon as it turns SIGTERM into an
# interrupt). verify's replay and bench's runs are in flight then; execute's kernel not started
LONG_COMMANDS = {
    "report": (["report", "--results", "{tmp}/cpu"], signal.SIGINT, None),
    "verify": (
        ["verify", "--results", str(REPO / "results/cpu"), "--sample", "1", "--out", "{tmp}/v"],
        signal.SIGTERM,
        "replayed in",
    ),
    "bench": (
        ["bench", "train", "--steps", "400", "--out", "{tmp}/b.json", "batch_size=16"],
        signal.SIGTERM,
        None,
    ),
    "execute": (
        [str(REPO / "notebooks/02_warmup.ipynb"), "{tmp}/out.ipynb", "-p", "profile", "smoke"]
        + ["-p", "out_dir", "{tmp}/runs", "-p", "wandb", "disabled"],
        signal.SIGINT,
        None,
    ),
}


@pytest.mark.slow
@pytest.mark.parametrize("command", LONG_COMMANDS)
def test_the_first_ctrl_c_or_sigterm_ends_a_long_command_in_one_line_and_exit_status_130(
    tmp_path, command
):
    """A real Ctrl-C (SIGINT to the process group) or SIGTERM (to the command alone) once the
    command is at work: it ends at once with one line saying so, exit status 130, no traceback,
    nothing of its session left running, nothing written where its result would go."""
    args, signum, until = LONG_COMMANDS[command]
    if command == "report":  # a committed profile's runs and findings (its REPORT.md left out)
        shutil.copytree(
            REPO / "results/cpu", tmp_path / "cpu", ignore=shutil.ignore_patterns("REPORT.md")
        )
    args = [a.format(tmp=tmp_path) for a in args]
    proc = in_session(["execute", *args] if command == "execute" else args)
    printed = ""
    while until and until not in printed:
        printed += proc.stdout.readline() or pytest.fail(printed)
    deadline = time.monotonic() + 60
    while not catches_sigterm(proc.pid):
        assert time.monotonic() < deadline and proc.poll() is None, proc.communicate()[0]
        time.sleep(0.01)
    printed += interrupt(proc, signum)
    assert proc.returncode == 130, printed
    why = "SIGINT" if signum == signal.SIGINT else "signal SIGTERM"
    assert printed.endswith(f"lbsgd {command}: interrupted ({why})\n"), printed
    assert "Traceback" not in printed and session_processes(proc.pid) == [], printed
    assert processes_naming(tmp_path) == [], printed  # verify's replays: sessions of their own
    written = {"report": "cpu/REPORT.md", "bench": "b.json", "execute": "out.ipynb"}
    assert command not in written or not (tmp_path / written[command]).exists()


LOST_IN_A_CALLBACK = """
import signal, time, weakref
from lbsgd.lab.experiments.interrupts import Terminated, HungUp, sigterm_as_interrupt

# as a command started from a terminal has them (a test runner's worker may ignore SIGINT, nohup
# SIGHUP, and a child inherits that)
signal.signal(signal.SIGINT, signal.default_int_handler)
signal.signal(signal.SIGHUP, signal.SIG_DFL)

class Held:
    pass

def callback(_):
    raise {raised}("as a signal's handler does")

held = Held()
try:
    with sigterm_as_interrupt(pass_on=False):
        ref = weakref.ref(held, callback)
        del held  # the callback runs here: its exception is "ignored" by Python
        time.sleep(20)
        print("went on")
except KeyboardInterrupt as e:
    print(type(e).__name__)
"""


@pytest.mark.parametrize("raised", ["KeyboardInterrupt", "Terminated", "HungUp"])
def test_an_interrupt_python_loses_in_a_callback_is_sent_again_and_ends_the_command(raised):
    """A signal's exception raised while a weakref callback or a finalizer runs (an import
    lock's, a logging lock's: CI met both) is printed as "Exception ignored" and lost by Python;
    inside ``sigterm_as_interrupt`` (every long command, every sweep) the same signal comes again
    and the command ends on its first interrupt, with no such trace."""
    script = LOST_IN_A_CALLBACK.format(raised=raised)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.stdout == f"{raised}\n", done.stdout + done.stderr
    assert "Exception ignored" not in done.stderr, done.stderr


FAILING_MODEL = """import torch
from lbsgd import register_model

class Failing(torch.nn.Module):
    def __init__(self, image_size, num_classes):
        super().__init__()
        self.fc = torch.nn.Linear(3 * image_size**2, num_classes)
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        if self.calls > 4:  # the 3rd step (2 micro-batches a step)
            raise RuntimeError("the model broke at its 5th forward pass")
        return self.fc(x.flatten(1))

@register_model("failing")
def failing(cfg, num_classes, image_size):
    return Failing(image_size, num_classes)
"""


def _run_failing(tmp_path: Path, name: str, plugin_source: str, **keys) -> str:
    """``lbsgd train`` with ``plugin_source`` imported as a plugin; its output, once it has
    exited 1 (a failed run)."""
    plugin = tmp_path / f"{name}_plugin.py"
    plugin.write_text(plugin_source)
    proc = _run(tmp_path, name, plugins=plugin, **keys)
    out = _finish(proc)
    assert proc.returncode == 1, out[-3000:]
    return out


@pytest.mark.slow
def test_a_failed_run_says_so_before_its_error_and_exits_1(tmp_path):
    out = _run_failing(tmp_path, "broken", FAILING_MODEL, model="failing")
    summary = assert_ends_with_its_summary(out, tmp_path / "runs" / "broken", "failed")
    assert summary["steps"] == 2
    assert out.index("lbsgd: failed: ") < out.index("RuntimeError: the model broke")


FAILING_DATASET = """from lbsgd.data import register_dataset

@register_dataset("unreadable")
def unreadable(cfg):
    raise OSError("the data could not be read")
"""


@pytest.mark.slow
def test_a_run_failing_before_its_first_step_ends_with_a_line_saying_nothing_was_written(tmp_path):
    out = _run_failing(tmp_path, "unread", FAILING_DATASET, dataset="unreadable")
    run_dir = tmp_path / "runs" / "unread"
    endings = re.findall(
        r"^lbsgd: failed: final top-1 error n/a, best n/a, 0/\? steps, wall time "
        r"0:00:\d\d\.\d, no summary in (\S+)$",
        out,
        re.M,
    )
    assert [Path(e) for e in endings] == [run_dir], out[-3000:]
    assert out.index("lbsgd: failed: ") < out.index("OSError: the data could not be read")
    assert not run_dir.exists()


@pytest.mark.slow
def test_under_torchrun_rank_0_alone_prints_progress_and_the_ending(tmp_path):
    proc = _run(tmp_path, "two", nproc=2)
    out = _finish(proc)
    assert proc.returncode == 0, out[-3000:]
    assert_ends_with_its_summary(out, tmp_path / "runs" / "two", "completed")  # one ending line
    steps = [int(m[0]) for m in PROGRESS.findall(out)]
    assert {8, 16} <= set(steps) and len(steps) == len(set(steps)), out[-3000:]
