"""The IPython kernel the studies' notebooks run in: ipykernel's, with its shutdown race closed.

ipykernel (7.4 and earlier) can close IOPub on its main thread while its control thread still
publishes the reply to a ``shutdown_request``, and libzmq then aborts the kernel after the notebook
was saved. :class:`Kernel` makes the main loop wait for the control thread first (at most
:data:`CONTROL_WAIT_S`). :class:`ParentWatch` hangs up the running cell with SIGHUP when the client
has gone, where ipykernel's poller would ``os._exit``, so a sweep stops as on a closed terminal and
prints its summary. ``make setup`` names :class:`Kernel` in the kernel configuration; see
docs/studies.md."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from ipykernel.ipkernel import IPythonKernel
from ipykernel.parentpoller import ParentPollerUnix

from lbsgd import kernel_log

# the longest the main thread waits for the control thread's end of a shutdown request: ipykernel
# ends the kernel's children first (a few seconds at most), and the client kills the kernel
# after its own wait (jupyter_client's shutdown_wait_time, 5 s by default)
CONTROL_WAIT_S = 10.0
# how long a kernel whose client has gone has for its cell to end (a sweep waits for its runs' next
# metric flush) before it ends regardless
PARENT_GRACE_S = 300.0
POLL_S = 1.0  # ipykernel's poller's period


def _end() -> None:
    """The kernel's process ended, as ipykernel ends one whose client has gone (exit status 1),
    its stderr flushed."""
    with contextlib.suppress(Exception):
        sys.__stderr__.flush()
    os._exit(1)


class ParentWatch(threading.Thread):
    """ipykernel's parent poller (its checks, its period: ParentPollerUnix) that calls ``gone``
    instead of ending the process when the client has gone, and ends it :data:`PARENT_GRACE_S`
    later if still there. ``parent_pid`` 0: the parent counts as gone once it is init (pid 1)."""

    def __init__(self, parent_pid: int, gone: Callable[[], None]) -> None:
        super().__init__(daemon=True)
        self.parent_pid, self.gone = parent_pid, gone

    def run(self) -> None:
        if os.getppid() != self.parent_pid:  # as ipykernel's: a parent not the launcher's
            self.parent_pid = 0
        while not self._parent_gone():
            time.sleep(POLL_S)
        self.gone()
        time.sleep(PARENT_GRACE_S)
        os._exit(1)

    def _parent_gone(self) -> bool:
        ppid = os.getppid()
        return ppid != self.parent_pid if self.parent_pid else ppid == 1


class Kernel(IPythonKernel):
    """IPython's kernel, which closes its sockets only after the control thread has answered a
    shutdown request whole, and interrupts its cell when its client has gone (module docstring)."""

    _control_done: threading.Event | None = None

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        app = self.parent  # the IPKernelApp, which starts its poller after making this kernel
        poller = getattr(app, "poller", None)
        if type(poller) is ParentPollerUnix:  # (ipykernel before 6.2x polls for pid 1 alone)
            app.poller = ParentWatch(getattr(poller, "parent_pid", 0), self._client_gone)

    def _client_gone(self) -> None:
        """From the watch's thread: SIGHUP to the running cell (a sweep stops its runs with a
        checkpoint or leaves its Slurm jobs running, and the kernel prints its summary on
        stderr), then the kernel ended once the main thread is free (at once when idle: SIGHUP
        ends it)."""
        os.environ.pop(kernel_log.SUMMARY_PRINTED_BY_CLIENT, None)  # the client can no longer
        os.kill(os.getpid(), signal.SIGHUP)
        self.io_loop.add_callback(_end)

    async def shutdown_request(self, stream: Any, ident: Any, parent: Any) -> None:
        # ahead of the loop stop ipykernel queues from the request's handler
        self._control_done = threading.Event()
        self.io_loop.add_callback(self._control_done.wait, CONTROL_WAIT_S)
        await super().shutdown_request(stream, ident, parent)

    async def process_control(self, *args: Any, **kwargs: Any) -> None:
        try:
            await super().process_control(*args, **kwargs)
        finally:
            if self._control_done is not None:
                self._control_done.set()
