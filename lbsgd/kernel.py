"""The IPython kernel the studies' notebooks run in: ipykernel's, with its shutdown race closed.

ipykernel (7.4 and earlier) answers a ``shutdown_request`` on its control thread and, from that
handler, stops the main thread's loop; the control thread then still flushes and publishes
``idle`` on IOPub while the main thread, its loop stopped, closes IOPub's thread and its event
pipes. When the two meet, libzmq aborts the kernel (``Assertion failed: pfd.revents & POLLIN
(src/signaler.cpp)``, ``Fatal Python error: Aborted`` and every thread's stack on the terminal),
after the notebook was saved: rarely, more often on a loaded machine, at the end of any papermill
or ``lbsgd execute`` run and of an interrupted one alike.

:class:`Kernel` queues, ahead of that stop, a wait on the main loop for the control thread to
finish the request (at most :data:`CONTROL_WAIT_S`), so IOPub closes after its last message.
``make setup`` names it in the kernel configuration (tools/ipython_kernel_config.py), so every
kernel started from ``.venv`` is one; nothing else about the kernel changes.
"""

from __future__ import annotations

import threading
from typing import Any

from ipykernel.ipkernel import IPythonKernel

# the longest the main thread waits for the control thread's end of a shutdown request: ipykernel
# ends the kernel's children first (a few seconds at most), and the client kills the kernel
# after its own wait (jupyter_client's shutdown_wait_time, 5 s by default)
CONTROL_WAIT_S = 10.0


class Kernel(IPythonKernel):
    """IPython's kernel, which closes its sockets only after the control thread has answered a
    shutdown request whole (module docstring)."""

    _control_done: threading.Event | None = None

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
