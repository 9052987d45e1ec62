"""Two records an IPython kernel logs that say nothing to a user of the notebooks, dropped.

- **A reply to a client that has gone.** papermill's command line, interrupted, closes the
  kernel's sockets while the cell still runs; the cell ends with the sweep's one-line summary and
  ipykernel then logs the failed reply as a 17-line ``ZMQError`` traceback ("Socket operation on
  non-socket") on the terminal.
- **"Kernel is running over TCP without encryption."** papermill's and JupyterLab's kernels listen
  on TCP on this machine's loopback, each message signed with the connection file's key;
  ipykernel warns at every start. ``lbsgd execute`` uses IPC sockets and never sees it.

:func:`install` adds the filter to a kernel's logger: ``make setup`` writes
``.venv/etc/ipython/ipython_kernel_config.py``, which every kernel started from ``.venv`` reads
at start (IPython's configuration in ``sys.prefix``), and the studies' notebooks add it again to
the kernel they run in (:func:`lbsgd.studies.session.one_line_errors`), for a kernel started
elsewhere. Every other record passes.
"""

from __future__ import annotations

import errno
import logging

UNENCRYPTED_TCP = "Kernel is running over TCP without encryption"
# Set by ``lbsgd execute`` and by papermill's command line (tools/_lbsgd_papermill.py) for the
# kernels they start: they print an interrupt's summary themselves, so the kernel does not
# (:func:`lbsgd.studies.session.one_line_errors`); a kernel whose client has gone drops it
# (:class:`lbsgd.kernel.Kernel`).
SUMMARY_PRINTED_BY_CLIENT = "LBSGD_EXECUTE"


class QuietKernel(logging.Filter):
    """Drops a failed reply to a closed client and the unencrypted-TCP warning."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        closed = type(exc).__name__ == "ZMQError" and getattr(exc, "errno", None) == errno.ENOTSOCK
        return not closed and not record.getMessage().startswith(UNENCRYPTED_TCP)


def install(log: logging.Logger) -> None:
    """The filter on ``log`` (once)."""
    if not any(isinstance(f, QuietKernel) for f in log.filters):
        log.addFilter(QuietKernel())
