"""tools/_lbsgd_papermill.py: papermill's own command line prints a notebook's bad parameter as
its one line, ``lbsgd: error: …``, instead of papermill's traceback; every other error keeps that
traceback, and no other process is touched."""

import importlib.util
import io
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


def test_a_config_error_is_its_line_and_every_other_error_passes_on(monkeypatch):
    from papermill.exceptions import PapermillExecutionError

    hook = _hook_module()
    passed = []
    monkeypatch.setattr(sys, "excepthook", lambda *exc: passed.append(exc))
    hook.install()
    err = io.StringIO()
    monkeypatch.setattr(sys, "stderr", err)
    tb = ["lbsgd: error: epochs=-1 must be > 0"]
    bad = PapermillExecutionError(2, 3, "check()", "ConfigError", "epochs=-1 must be > 0", tb)
    sys.excepthook(type(bad), bad, None)
    assert err.getvalue() == "lbsgd: error: epochs=-1 must be > 0\n" and not passed
    other = PapermillExecutionError(2, 3, "1 / 0", "ZeroDivisionError", "division by zero", [])
    sys.excepthook(type(other), other, None)
    plain = ValueError("not papermill's")
    sys.excepthook(ValueError, plain, None)
    assert [exc[1] for exc in passed] == [other, plain]
    assert err.getvalue() == "lbsgd: error: epochs=-1 must be > 0\n"


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
