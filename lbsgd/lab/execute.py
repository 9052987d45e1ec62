"""``lbsgd execute``: one study notebook through papermill as ``make reproduce`` runs it, quiet:
the kernel on IPC sockets (no TCP warning); Ctrl-C and SIGTERM an interrupt of the running cell
(the sweep stops its runs with a checkpoint and prints its summary, exit 130), or, where no cell
runs (the kernel ignores SIGINT then), the stop before the next cell; SIGHUP and the end
of this process's parent a SIGHUP to the kernel (the client gone: a Slurm sweep leaves its jobs
running); the executed copy written as ``<name>.running.ipynb`` and moved into place whole,
without what differs between executions (:func:`normalise`); a failing cell one line, naming the
copy that holds its traceback (``lbsgd: error: …`` and exit 2 for bad input). ``-p KEY VALUE``
reads as papermill's ``-p``, a value in brackets or braces as YAML (docs/studies.md). Only
papermill's and nbclient's public options: no patch of either, nor of the kernel."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

EXIT_FAILED, EXIT_BAD_INPUT, EXIT_INTERRUPTED = 1, 2, 130
INTERRUPTS = ("KeyboardInterrupt", "RunInterrupted")


def parameter(value: str) -> Any:
    """A ``-p`` value: papermill's rules (True, False, None, int, float, else str), and YAML for
    a value in brackets or braces."""
    if value[:1] in "[{":
        import yaml

        return yaml.safe_load(value)
    words = {"True": True, "False": False, "None": None}
    if value in words:
        return words[value]
    for kind in (int, float):
        try:
            return kind(value)
        except ValueError:
            pass
    return value


def signal_when_the_parent_ends(signum: int) -> None:
    """Linux: the system sends this process ``signum`` when its parent ends (PR_SET_PDEATHSIG;
    0: none)."""
    if sys.platform.startswith("linux"):
        import ctypes

        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(1, signum)  # 1: PR_SET_PDEATHSIG


class _Forward:
    """While installed: SIGINT and SIGTERM to this process become an interrupt of the kernel's
    running cell (SIGINT to the kernel's process group); SIGHUP, and the end of this process's
    parent, a SIGHUP to it (its client gone: a sweep on Slurm leaves its jobs running, a local one
    stops its runs with a checkpoint); remembers that one came.

    papermill has no handler of its own (Ctrl-C shuts its kernel down under the running cell,
    SIGTERM ends it at once): this and :meth:`stop_before_cell` wait for
    https://github.com/nteract/papermill/issues/508 (pass signals down to the kernel)."""

    def __init__(self, km) -> None:
        self.km = km
        self.came: list[int] = []
        self.before: dict[int, Any] = {}

    def __enter__(self) -> _Forward:
        for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            self.before[s] = signal.signal(s, self._handle)
        signal_when_the_parent_ends(signal.SIGHUP)
        return self

    def __exit__(self, *exc: object) -> None:
        signal_when_the_parent_ends(0)
        for s, handler in self.before.items():
            signal.signal(s, handler)

    def _handle(self, signum: int, frame: object) -> None:
        self.came.append(signum)
        provisioner = getattr(self.km, "provisioner", None)
        pgid = getattr(provisioner, "pgid", None)
        if pgid:
            with contextlib.suppress(OSError):  # the kernel has just ended
                os.killpg(pgid, signal.SIGHUP if signum == signal.SIGHUP else signal.SIGINT)

    def stop_before_cell(self, **cell: object) -> None:
        """nbclient's ``on_cell_start``: an interrupt that came while no cell ran (the kernel
        ignores SIGINT between cells and as it starts, so the rest of the notebook would run)
        stops the execution at the next cell's start."""
        if self.came:
            raise KeyboardInterrupt


def execute(
    notebook: str | os.PathLike,
    output: str | os.PathLike,
    parameters: Mapping[str, Any],
    log_output: bool = False,
) -> int:
    """Execute ``notebook`` into ``output`` with ``parameters``; the exit code (0, or
    :data:`EXIT_FAILED`, :data:`EXIT_BAD_INPUT`, :data:`EXIT_INTERRUPTED`) after at most one line
    on stderr. ``log_output``: the cells' output on stdout as they run."""
    import papermill as pm
    from jupyter_client.manager import AsyncKernelManager
    from jupyter_core.utils import run_sync
    from papermill.exceptions import PapermillExecutionError

    log = logging.getLogger("papermill")
    if log_output and not log.handlers:  # papermill logs the cells' output at INFO on its logger
        handler = logging.StreamHandler(sys.stdout)
        handler.setFormatter(logging.Formatter("%(message)s"))
        log.addHandler(handler)
        log.setLevel(logging.INFO)
        log.propagate = False
    problem = _problem(notebook, output, parameters)
    if problem:
        print(f"lbsgd: error: {problem}", file=sys.stderr, flush=True)
        return EXIT_BAD_INPUT
    out = Path(output)
    running = out.with_name(f"{out.stem}.running{out.suffix}")  # moved over ``out`` at the end
    failure = None
    with tempfile.TemporaryDirectory(prefix="lbsgd-kernel-") as folder:
        # the kernel talks over IPC sockets in the folder
        km = AsyncKernelManager(kernel_name="python3", transport="ipc", ip=f"{folder}/kernel")
        with _Forward(km) as forward:
            try:
                pm.execute_notebook(
                    str(notebook),
                    str(running),
                    parameters=dict(parameters),
                    log_output=log_output,
                    progress_bar=False,
                    km=km,
                    # nbclient's: a print cut into messages by timing saved as one output
                    coalesce_streams=True,
                    record_timing=False,  # no message timestamps in the cells
                    on_cell_start=forward.stop_before_cell,
                )
            except PapermillExecutionError as e:
                failure = e
            except BaseException as e:  # while no cell ran (a kernel interrupted as it starts dies)
                if not (forward.came or isinstance(e, KeyboardInterrupt)):
                    raise
                running.unlink(missing_ok=True)
                print("lbsgd: interrupted while no cell ran", file=sys.stderr)
                return EXIT_INTERRUPTED
            finally:
                # the kernel ended once the notebook is saved (papermill leaves a kernel manager
                # it was given running): killed with its process group, not sent a shutdown
                # request, which ipykernel 7.4 can answer by closing IOPub under its control
                # thread's last message, and libzmq then aborts it ("Fatal Python error: Aborted"
                # on the terminal). Waits for ipykernel to close that race
                # (https://github.com/ipython/ipykernel/pull/1518 quieted its ENOTSOCK error, not
                # the race)
                if km.has_kernel:
                    run_sync(km.shutdown_kernel)(now=True)
            interrupted = bool(forward.came)
    if failure is None:
        normalise(running, out)
        running.replace(out)
        return 0
    return _failed(failure, running, out, interrupted)


def _problem(notebook, output, parameters: Mapping[str, Any]) -> str | None:
    """Why the command cannot run, in one line, before a kernel starts: no such notebook, an
    OUTPUT that is the notebook itself or lies in no folder, a parameter the notebook does not
    declare (papermill would only warn, and run the whole study at its defaults)."""
    nb, out = Path(notebook), Path(output)
    if not nb.is_file():
        return f"notebook {notebook} does not exist"
    if out.resolve() == nb.resolve():
        return f"OUTPUT {output} is the notebook itself: name where the executed copy goes"
    if not out.parent.is_dir():
        return f"OUTPUT {output}: no folder {out.parent} to write it in"
    return undeclared(notebook, parameters)


def undeclared(notebook, parameters: Mapping[str, Any]) -> str | None:
    """The first of ``parameters`` that ``notebook`` does not declare, as one line (or None)."""
    import papermill as pm

    log = logging.getLogger("papermill")
    log.disabled, before = True, log.disabled  # its "Input Notebook:" line comes once, at the run
    try:
        declared = pm.inspect_notebook(str(notebook))
    finally:
        log.disabled = before
    unknown = [k for k in parameters if k not in declared]
    if unknown:
        return (
            f"-p {unknown[0]}: not a parameter of {notebook} (its parameters: "
            f"{', '.join(declared)})"
        )
    return None


# what papermill records of one execution (it has no option not to): times and durations; the
# executed copy keeps its parameters, cells and outputs, not these
VOLATILE_NOTEBOOK = ("start_time", "end_time", "duration")
INJECTED_ID = "injected-parameters"


def normalise(path: str | os.PathLike, output: str | os.PathLike | None = None) -> None:
    """The executed notebook at ``path`` without what differs between two executions that print
    the same: papermill's start and end times and durations (of the notebook and of each cell)
    and the random id of papermill's injected parameters cell; so that executing a study over
    complete runs again leaves its committed copy as it was.
    ``output``: the path the notebook is saved as, recorded as papermill's ``output_path`` (it
    ran into a file beside it, moved there after)."""
    import nbformat

    nb = nbformat.read(str(path), as_version=4)
    if output is not None and "papermill" in nb.metadata:
        nb.metadata["papermill"]["output_path"] = str(output)
    for key in VOLATILE_NOTEBOOK:
        nb.metadata.get("papermill", {}).pop(key, None)
    for cell in nb.cells:
        for key in VOLATILE_NOTEBOOK:
            cell.metadata.get("papermill", {}).pop(key, None)
        if "injected-parameters" in cell.metadata.get("tags", []):
            cell.id = INJECTED_ID
    nbformat.write(nb, str(path))


def _failed(e, running: Path, out: Path, interrupted: bool) -> int:
    """The one line of a failed cell and its exit code. The execution's notebook is kept beside
    ``out`` as ``<name>.failed.ipynb`` (``.interrupted.ipynb``); ``out`` itself, a result that
    may be committed, is left as it was."""
    interrupted = e.ename in INTERRUPTS or interrupted
    kept = running.with_name(f"{out.stem}.{'interrupted' if interrupted else 'failed'}{out.suffix}")
    if running.is_file():
        normalise(running, kept)
        running.replace(kept)
    before = f"{out} kept as it was" if out.is_file() else f"{out} not written"
    value = str(e.evalue).strip().splitlines()[0] if str(e.evalue).strip() else e.ename
    if interrupted:
        print(f"lbsgd: {value} (executed notebook: {kept}; {before})", file=sys.stderr, flush=True)
        return EXIT_INTERRUPTED
    if e.ename == "ConfigError":
        print(f"lbsgd: error: {value} ({before}; this execution: {kept})", file=sys.stderr)
        return EXIT_BAD_INPUT
    print(
        f"lbsgd: {e.ename}: {value} (in cell {e.exec_count}; its traceback is in {kept}; {before})",
        file=sys.stderr,
        flush=True,
    )
    return EXIT_FAILED
