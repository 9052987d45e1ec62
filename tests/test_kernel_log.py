"""lbsgd.kernel_log: the kernel's log loses the unencrypted-TCP warning and the traceback of a
reply to a closed client, and keeps every other record."""

import errno
import logging

import zmq

from lbsgd import kernel_log


def _record(msg: str, exc: BaseException | None = None, level=logging.ERROR) -> logging.LogRecord:
    exc_info = (type(exc), exc, None) if exc is not None else None
    return logging.LogRecord("IPKernelApp", level, __file__, 1, msg, (), exc_info)


def test_the_two_records_are_dropped_and_every_other_passes():
    f = kernel_log.QuietKernel()
    warning = "Kernel is running over TCP without encryption. All communication (…)"
    assert not f.filter(_record(warning, level=logging.WARNING))
    closed = zmq.ZMQError(errno.ENOTSOCK)
    assert str(closed) == "Socket operation on non-socket"
    assert not f.filter(_record("Exception in message handler:", closed))
    # another socket error, another exception, another warning: kept
    assert f.filter(_record("Exception in message handler:", zmq.ZMQError(errno.EAGAIN)))
    assert f.filter(_record("Exception in message handler:", ValueError("x")))
    assert f.filter(_record("Kernel is running", level=logging.WARNING))
    assert f.filter(_record("Starting the kernel at pid: 1", level=logging.INFO))


def test_install_adds_the_filter_once_and_the_logger_then_drops_the_warning(caplog):
    log = logging.getLogger("test_kernel_log")
    kernel_log.install(log)
    kernel_log.install(log)
    assert sum(isinstance(f, kernel_log.QuietKernel) for f in log.filters) == 1
    with caplog.at_level(logging.INFO, logger="test_kernel_log"):
        log.warning("%s over loopback", kernel_log.UNENCRYPTED_TCP)
        log.info("kept")
    assert [r.getMessage() for r in caplog.records] == ["kept"]
