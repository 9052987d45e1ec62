"""``lbsgd execute`` (lbsgd.execute): a study notebook through papermill with one line on the
terminal for a bad parameter or an interrupt, no traceback there or in the saved notebook beyond
that line, and no warning about the kernel's transport."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import subprocess_env

from lbsgd.execute import parameter

REPO = Path(__file__).resolve().parents[1]
WARMUP = REPO / "notebooks" / "02_warmup.ipynb"
NOISE = ("Traceback", "ZMQError", "Logging error", "without encryption", "Aborted")


def test_parameters_read_as_papermills_and_brackets_as_yaml():
    assert [parameter(v) for v in ("True", "False", "None", "3", "-1", "0.5", "cpu")] == [
        True,
        False,
        None,
        3,
        -1,
        0.5,
        "cpu",
    ]
    assert parameter("[1, 16]") == [1, 16] and parameter("{a: 1}") == {"a": 1}


def _execute(out: Path, *extra: str, log_output: bool = False) -> subprocess.Popen:
    args = ["execute", *(["--log-output"] if log_output else []), str(WARMUP)]
    args += [str(out / "out.ipynb"), "-p", "profile", "smoke", "-p", "wandb", "disabled"]
    args += ["-p", "out_dir", str(out), "-p", "parallel", "1", *extra]
    return subprocess.Popen(
        [sys.executable, "-m", "lbsgd", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=subprocess_env(),
        start_new_session=True,  # its own process group: the test's Ctrl-C goes to all of it
    )


def _errors(notebook: Path) -> list[dict]:
    cells = json.loads(notebook.read_text())["cells"]
    return [o for c in cells for o in c.get("outputs", []) if o["output_type"] == "error"]


def test_a_bad_parameter_is_one_line_on_the_terminal_and_in_the_cell(tmp_path):
    p = _execute(tmp_path, "-p", "epochs", "-1")
    out, _ = p.communicate(timeout=300)
    assert p.returncode == 2, out
    assert out == "lbsgd: error: epochs=-1 must be > 0\n"
    (err,) = _errors(tmp_path / "out.ipynb")
    assert err["ename"] == "ConfigError"
    assert err["traceback"] == ["lbsgd: error: epochs=-1 must be > 0"]
    assert not list((tmp_path / "smoke").glob("*/*/summary.json"))  # no run began


@pytest.mark.slow
def test_ctrl_c_stops_the_sweep_with_its_summary_alone_and_no_traceback(tmp_path):
    p = _execute(tmp_path, log_output=True)
    study = tmp_path / "smoke" / "warmup"
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and not list(study.glob("*.log")):
        time.sleep(0.5)
    assert list(study.glob("*.log")), "no run started"
    time.sleep(2)
    os.killpg(p.pid, signal.SIGINT)  # Ctrl-C at a terminal: the whole foreground group
    out, _ = p.communicate(timeout=300)
    assert p.returncode == 130, out
    assert not [word for word in NOISE if word in out], out
    summary = [line for line in out.splitlines() if line.startswith("lbsgd: sweep of study")]
    assert len(summary) == 1 and "interrupted" in summary[0] and "to resume" in summary[0], out
    assert "[interrupt] asked" in out  # the sweep's line per run, as the cell printed it
    (err,) = _errors(tmp_path / "out.ipynb")
    assert err["ename"] == "RunInterrupted" and len(err["traceback"]) == 1
    saved = (tmp_path / "out.ipynb").read_text()
    assert not [word for word in NOISE if word in saved]
