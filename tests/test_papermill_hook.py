"""tools/_lbsgd_papermill.py: papermill's own command line prints a notebook's bad parameter as
its one line, ``lbsgd: error: …``, and an interrupted sweep as its summary, instead of papermill's
traceback; every other error keeps that traceback, and no other process is touched. (Its
interrupts, end to end: tests/test_execute.py.)"""

import importlib.util
import io
import os
import signal
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
from conftest import subprocess_env

REPO = Path(__file__).resolve().parents[1]
TOOLS = REPO / "tools"
WARMUP = REPO / "notebooks" / "02_warmup.ipynb"


def _hook_module():
    spec = importlib.util.spec_from_file_location("hook_under_test", TOOLS / "_lbsgd_papermill.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # in pytest's process: not papermill's, so nothing installed
    return module


def test_only_papermills_command_line_is_papermills():
    hook = _hook_module()
    py = "/x/.venv/bin/python"
    assert hook.is_papermill(["/x/.venv/bin/papermill", "a.ipynb"], [py, "/x/.venv/bin/papermill"])
    assert hook.is_papermill(["-m"], [py, "-m", "papermill", "a.ipynb"])
    assert not hook.is_papermill(["-m"], [py, "-m", "lbsgd", "execute"])
    assert not hook.is_papermill(["/x/.venv/bin/jupyter-lab"], [py, "/x/.venv/bin/jupyter-lab"])
    assert not hook.is_papermill([], [py])


def _install_for_this_test(hook, monkeypatch) -> None:
    """``hook.install()`` in pytest's process: it tells the kernels that it prints an interrupt's
    summary, and takes SIGINT and SIGTERM where they had Python's defaults; the variable and the
    handlers are put back (the handlers are tested end to end in tests/test_execute.py)."""
    monkeypatch.delenv(hook.SUMMARY_PRINTED_BY_CLIENT, raising=False)
    before = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM)}
    hook.install()
    try:
        assert os.environ[hook.SUMMARY_PRINTED_BY_CLIENT] == "1"
        defaults = (signal.default_int_handler, signal.SIG_DFL)
        for signum, handler in before.items():
            now = signal.getsignal(signum)
            assert now is (hook.interrupt if handler in defaults else handler), signum
    finally:
        for signum, handler in before.items():
            signal.signal(signum, handler)


def test_a_config_error_and_an_interrupt_are_their_line_and_every_other_error_passes_on(
    monkeypatch,
):
    from papermill.exceptions import PapermillExecutionError

    hook = _hook_module()
    passed = []
    monkeypatch.setattr(sys, "excepthook", lambda *exc: passed.append(exc))
    _install_for_this_test(hook, monkeypatch)
    err = io.StringIO()
    monkeypatch.setattr(sys, "stderr", err)
    tb = ["lbsgd: error: epochs=-1 must be > 0"]
    bad = PapermillExecutionError(2, 3, "check()", "ConfigError", "epochs=-1 must be > 0", tb)
    sys.excepthook(type(bad), bad, None)
    assert err.getvalue() == "lbsgd: error: epochs=-1 must be > 0\n" and not passed
    summary = "sweep of study 'warmup' interrupted: 1 run stopped; run the same sweep again"
    stopped = PapermillExecutionError(4, 5, "sweep()", "RunInterrupted", summary, [])
    sys.excepthook(type(stopped), stopped, None)
    assert err.getvalue().splitlines()[-1] == f"lbsgd: {summary}" and not passed
    other = PapermillExecutionError(2, 3, "1 / 0", "ZeroDivisionError", "division by zero", [])
    sys.excepthook(type(other), other, None)
    plain = ValueError("not papermill's")
    sys.excepthook(ValueError, plain, None)
    assert [exc[1] for exc in passed] == [other, plain]
    assert len(err.getvalue().splitlines()) == 2  # nothing said of the two passed on


def test_the_hook_and_the_kernels_name_the_same_variable():
    """The hook tells papermill's kernels that it prints an interrupt's summary (so they do not)
    through the variable lbsgd's kernels read."""
    from lbsgd import kernel_log

    assert _hook_module().SUMMARY_PRINTED_BY_CLIENT == kernel_log.SUMMARY_PRINTED_BY_CLIENT


INSTALLED = Path(sysconfig.get_paths()["purelib"]) / "lbsgd_papermill.pth"


@pytest.mark.slow
@pytest.mark.skipif(not INSTALLED.exists(), reason="make setup's .venv only (the .pth is there)")
def test_papermills_command_line_prints_a_bad_parameter_as_one_line(tmp_path):
    for name in ("_lbsgd_papermill.py", "lbsgd_papermill.pth"):  # make setup's copies are these
        assert (INSTALLED.parent / name).read_text() == (TOOLS / name).read_text()
    args = [sys.executable, "-m", "papermill", str(WARMUP), str(tmp_path / "out.ipynb")]
    args += ["-p", "profile", "smoke", "-p", "wandb", "disabled", "-p", "epochs", "-1"]
    args += ["-p", "out_dir", str(tmp_path), "--no-progress-bar"]
    p = subprocess.run(args, capture_output=True, text=True, env=subprocess_env(), timeout=300)
    assert p.returncode == 1, p.stderr
    assert "Traceback" not in p.stderr + p.stdout, p.stderr
    assert p.stderr.strip().splitlines()[-1] == "lbsgd: error: epochs=-1 must be > 0", p.stderr
    assert not (tmp_path / "smoke").exists()  # refused before any run


def test_the_summary_reaches_the_terminal_once_and_not_the_cell_where_ipykernel_watches_fd_2(
    monkeypatch,
):
    """ipykernel copies what is written to fd 2 into the cell as well as to the terminal, so the
    sweep's summary showed twice in JupyterLab: it goes to ipykernel's copy of the terminal's fd,
    which no one watches; elsewhere to sys.__stderr__."""
    import inspect

    from ipykernel.iostream import OutStream

    from lbsgd.studies import session

    source = inspect.getsource(OutStream)
    assert "self._original_stdstream_copy = os.dup(fno)" in source and "_should_watch" in source
    r, w = os.pipe()
    cell = []

    class Watched:  # ipykernel's OutStream, as it stands where it watches fd 2
        _original_stdstream_copy, _should_watch = w, True

        def write(self, text):
            cell.append(text)

    monkeypatch.setattr(sys, "stderr", Watched())
    session.to_terminal("lbsgd: sweep of study 'x' interrupted\n")
    os.close(w)
    assert os.read(r, 1000) == b"lbsgd: sweep of study 'x' interrupted\n" and cell == []
    os.close(r)
