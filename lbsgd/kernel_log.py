"""Two records an IPython kernel logs that say nothing to a user of the notebooks, dropped.

The ``ZMQError`` traceback of a reply to a client that has gone (papermill's command line,
interrupted), and "Kernel is running over TCP without encryption." (papermill's and JupyterLab's
kernels on the loopback, each message signed). :func:`install` adds the filter to a kernel's
logger; ``make setup``'s kernel configuration and the studies' notebooks install it. Every other
record passes."""

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
