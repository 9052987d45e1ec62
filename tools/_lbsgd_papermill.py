"""papermill's own command line, quiet as ``lbsgd execute`` is: a notebook's bad parameter or key
as its one line, and Ctrl-C or SIGTERM as an interrupt of the kernel's running cell.

- **A bad parameter.** papermill lets a failed cell's PapermillExecutionError leave as a Python
  traceback through click (about 25 lines) ending in the cell's error. For a bad parameter or key
  that error is already one line, ``lbsgd: error: …`` (lbsgd.studies.session.one_line_errors):
  this prints that line alone, exit status 1 (papermill's for a failed notebook). Every other
  error keeps papermill's traceback.
- **Ctrl-C and SIGTERM.** papermill has no handler of its own: Ctrl-C raised KeyboardInterrupt in
  it, its kernel was shut down under the running cell and click said ``Aborted!``; SIGTERM ended
  it at once. Here either one, once a kernel runs, is passed to the kernel as an interrupt (SIGINT
  to its process group, as jupyter_client's ``interrupt_kernel`` sends): the sweep stops its runs
  with a checkpoint, the cell ends with the sweep's one-line summary as its error, papermill saves
  the notebook, and this prints that line and ends with status 1. A second Ctrl-C is a second interrupt (the sweep then kills its runs).
  Before a kernel runs, the signal acts as it did.

``make setup`` copies this file and tools/lbsgd_papermill.pth (``import _lbsgd_papermill``) into
.venv's site-packages, so that every interpreter started from .venv imports it at start; it acts
only in papermill's command line (``papermill …`` or ``python -m papermill …``) and imports
nothing else there until a signal comes.
"""

import contextlib
import os
import signal
import sys

# a failed cell's error names these for an interrupt: the sweep's (lbsgd.experiments) and Python's
INTERRUPTS = ("RunInterrupted", "KeyboardInterrupt")
# lbsgd.kernel_log.SUMMARY_PRINTED_BY_CLIENT (this file imports nothing of lbsgd)
SUMMARY_PRINTED_BY_CLIENT = "LBSGD_EXECUTE"


def is_papermill(argv, orig_argv):
    """Whether this process is papermill's command line."""
    script = os.path.basename(argv[0]) if argv else ""
    return script == "papermill" or orig_argv[1:3] == ["-m", "papermill"]


def one_line(etype, value):
    """The one line papermill's command line says of an error that leaves it: a bad parameter's,
    or an interrupt's (the sweep's summary); None for any other (papermill's traceback)."""
    ename = getattr(value, "ename", "")
    if etype.__name__ != "PapermillExecutionError" or ename not in ("ConfigError", *INTERRUPTS):
        return None
    lines = str(value.evalue).strip().splitlines()
    first = lines[0] if lines else ename
    return f"lbsgd: error: {first}" if ename == "ConfigError" else f"lbsgd: {first}"


def kernels():
    """The process ids of this process's IPython kernels (its children running ipykernel)."""
    import psutil  # IPython's dependency

    found = []
    for child in psutil.Process().children():
        with contextlib.suppress(psutil.Error):
            if any("ipykernel" in part for part in child.cmdline()):
                found.append(child.pid)
    return found


def interrupt(signum, frame):
    """SIGINT or SIGTERM: an interrupt of each kernel's running cell; with no kernel yet, the
    signal's own effect (KeyboardInterrupt, or the end of the process)."""
    pids = kernels()
    for pid in pids:
        with contextlib.suppress(OSError):  # the kernel has just ended
            os.killpg(os.getpgid(pid), signal.SIGINT)
    if pids:
        return
    if signum == signal.SIGINT:
        raise KeyboardInterrupt
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


def install():
    """sys.excepthook says a bad parameter or an interrupt in one line, every other error passed
    on; SIGINT and SIGTERM interrupt the kernel, where Python's defaults are in place."""
    before = sys.excepthook

    def hook(etype, value, tb):
        line = one_line(etype, value)
        if line is None:
            before(etype, value, tb)
        else:
            print(line, file=sys.stderr, flush=True)

    sys.excepthook = hook
    # the kernels leave an interrupt's summary to this process (lbsgd.kernel_log)
    os.environ[SUMMARY_PRINTED_BY_CLIENT] = "1"
    defaults = {signal.SIGINT: signal.default_int_handler, signal.SIGTERM: signal.SIG_DFL}
    for signum, default in defaults.items():
        if signal.getsignal(signum) is default:  # not ignored (nohup, a test worker)
            signal.signal(signum, interrupt)


if is_papermill(getattr(sys, "argv", []), getattr(sys, "orig_argv", [])):
    install()
