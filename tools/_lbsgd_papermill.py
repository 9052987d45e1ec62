"""papermill's own command line, a notebook's bad parameter or key as its one line.

papermill's command line lets a failed cell's PapermillExecutionError leave as a Python traceback
through click (about 25 lines) ending in the cell's error. For a bad parameter or key that error
is already one line, ``lbsgd: error: …`` (lbsgd.studies.session.one_line_errors), as
``lbsgd execute`` prints it: in papermill's process this prints that line alone, exit status 1
(papermill's for a failed notebook). Every other error keeps papermill's traceback.

``make setup`` copies this file and tools/lbsgd_papermill.pth (``import _lbsgd_papermill``) into
.venv's site-packages, so that every interpreter started from .venv imports it at start; it acts
only in papermill's command line (``papermill …`` or ``python -m papermill …``) and imports
nothing else.
"""

import os
import sys


def is_papermill(argv, orig_argv):
    """Whether this process is papermill's command line."""
    script = os.path.basename(argv[0]) if argv else ""
    return script == "papermill" or orig_argv[1:3] == ["-m", "papermill"]


def one_line(etype, value):
    """The line for an error that leaves papermill's command line, else None (its traceback)."""
    if etype.__name__ != "PapermillExecutionError" or getattr(value, "ename", "") != "ConfigError":
        return None
    lines = str(value.evalue).strip().splitlines()
    return f"lbsgd: error: {lines[0] if lines else value.ename}"


def install():
    """sys.excepthook prints a bad parameter's one line and passes every other error on."""
    before = sys.excepthook

    def hook(etype, value, tb):
        line = one_line(etype, value)
        if line is None:
            before(etype, value, tb)
        else:
            print(line, file=sys.stderr, flush=True)

    sys.excepthook = hook


if is_papermill(getattr(sys, "argv", []), getattr(sys, "orig_argv", [])):
    install()
