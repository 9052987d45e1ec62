"""``lbsgd execute`` (lbsgd.lab.execute): a study notebook through papermill with one line on the
terminal for a bad parameter or an interrupt, no traceback there or in the saved notebook beyond
that line, and no warning about the kernel's transport."""

import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import subprocess_env
from helpers import in_session, interrupt, processes_naming, session_processes

from lbsgd.lab.execute import parameter

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


def _wait_for_a_run(study: Path) -> None:
    """Until the sweep of ``study`` (its folder) has started a run (its log is there), and 2 s
    more: the moment a user interrupts a sweep under way."""
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and not list(study.glob("*.log")):
        time.sleep(0.5)
    assert list(study.glob("*.log")), "no run started"
    time.sleep(2)


def _errors(notebook: Path) -> list[dict]:
    cells = json.loads(notebook.read_text())["cells"]
    return [o for c in cells for o in c.get("outputs", []) if o["output_type"] == "error"]


def test_a_bad_parameter_is_one_line_and_leaves_the_result_it_would_replace_whole(tmp_path):
    """Executing over a committed result with a bad parameter: one line, which says where this
    execution's notebook went; the committed file byte for byte as it was; nothing trained."""
    committed = REPO / "results" / "cpu" / "warmup" / "02_warmup.ipynb"
    shutil.copy(committed, tmp_path / "out.ipynb")
    p = _execute(tmp_path, "-p", "epochs", "-1")
    out, _ = p.communicate(timeout=300)
    assert p.returncode == 2, out
    assert out == (
        f"lbsgd: error: epochs=-1 must be > 0 ({tmp_path / 'out.ipynb'} kept as it was; this "
        f"execution: {tmp_path / 'out.failed.ipynb'})\n"
    )
    assert (tmp_path / "out.ipynb").read_bytes() == committed.read_bytes()
    (err,) = _errors(tmp_path / "out.failed.ipynb")
    assert err["ename"] == "ConfigError"
    assert err["traceback"] == ["lbsgd: error: epochs=-1 must be > 0"]
    assert not list((tmp_path / "smoke").glob("*/*/summary.json"))  # no run began
    assert not list(tmp_path.glob("*.running.ipynb"))


NB = str(REPO / "notebooks" / "02_warmup.ipynb")


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (["{tmp}/nope.ipynb", "out.ipynb"], "notebook {tmp}/nope.ipynb does not exist"),
        ([NB, NB], f"OUTPUT {NB} is the notebook itself: name where the executed copy goes"),
        (
            [NB, "{tmp}/no/out.ipynb"],
            "OUTPUT {tmp}/no/out.ipynb: no folder {tmp}/no to write it in",
        ),
        # papermill only warns of a parameter the notebook lacks, and runs it at its defaults
        ([NB, "{tmp}/out.ipynb", "-p", "profil", "smoke"], "-p profil: not a parameter of " + NB),
    ],
)
def test_bad_input_is_one_line_before_a_kernel_starts(tmp_path, args, line):
    args = [a.format(tmp=tmp_path) for a in args]
    r = subprocess.run(
        [sys.executable, "-m", "lbsgd", "execute", *args],
        capture_output=True,
        text=True,
        env=subprocess_env(),
    )
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert r.stderr.startswith(f"lbsgd: error: {line.format(tmp=tmp_path)}"), r.stderr
    assert list(tmp_path.iterdir()) == [] and r.stdout == ""


@pytest.mark.slow
def test_ctrl_c_stops_the_sweep_with_its_summary_alone_and_no_traceback(tmp_path):
    p = _execute(tmp_path, log_output=True)
    study = tmp_path / "smoke" / "warmup"
    _wait_for_a_run(study)
    os.killpg(p.pid, signal.SIGINT)  # Ctrl-C at a terminal: the whole foreground group
    out, _ = p.communicate(timeout=300)
    assert p.returncode == 130, out
    assert not [word for word in NOISE if word in out], out
    summary = [line for line in out.splitlines() if line.startswith("lbsgd: sweep of study")]
    assert len(summary) == 1 and "interrupted" in summary[0] and "to resume" in summary[0], out
    assert "[interrupt] asked" in out  # the sweep's line per run, as the cell printed it
    (err,) = _errors(tmp_path / "out.interrupted.ipynb")
    assert err["ename"] == "RunInterrupted" and len(err["traceback"]) == 1
    saved = (tmp_path / "out.interrupted.ipynb").read_text()
    assert not [word for word in NOISE if word in saved]
    assert not (tmp_path / "out.ipynb").exists()  # an interrupted execution replaces nothing


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_the_end_of_its_parent_stops_the_sweep_as_a_sigterm_does(tmp_path):
    """make sent SIGTERM alone ends its recipe's shell, not lbsgd execute under it: lbsgd execute,
    its parent gone, stops the sweep as on SIGTERM (the runs stop with a checkpoint), prints the
    summary where its output goes and ends."""
    args = [sys.executable, "-m", "lbsgd", "execute", "--log-output", str(WARMUP)]
    args += [str(tmp_path / "out.ipynb"), "-p", "profile", "smoke", "-p", "wandb", "disabled"]
    args += ["-p", "out_dir", str(tmp_path), "-p", "parallel", "1"]
    # "; true": a command after it, so that the shell waits for lbsgd execute rather than
    # becoming it (a shell may exec its last command)
    script = f"exec >{tmp_path / 'terminal.txt'} 2>&1; {shlex.join(args)}; true"
    shell = subprocess.Popen(["sh", "-c", script], env=subprocess_env(), start_new_session=True)
    _wait_for_a_run(tmp_path / "smoke" / "warmup")
    shell.send_signal(signal.SIGTERM)  # as make, sent SIGTERM, sends its recipe's shell
    shell.wait(timeout=30)
    deadline = time.monotonic() + 240
    while processes_naming(tmp_path) and time.monotonic() < deadline:
        time.sleep(0.5)
    out = (tmp_path / "terminal.txt").read_text()
    assert not processes_naming(tmp_path), out  # lbsgd execute, its kernel and the runs: gone
    assert not [word for word in NOISE if word in out], out
    summary = [line for line in out.splitlines() if line.startswith("lbsgd: sweep of study")]
    assert len(summary) == 1 and "runs not started" in summary[0], out


@pytest.mark.slow
def test_an_interrupt_from_a_jupyter_client_leaves_the_sweeps_summary_and_one_line(tmp_path):
    """JupyterLab's Kernel > Interrupt (jupyter_client's interrupt_kernel: SIGINT to the kernel)
    during notebook 02's sweep cell: the cell's output holds one line per run, its error is the
    sweep's one-line summary, and the kernel's own stderr (JupyterLab's server terminal) holds no
    traceback (ipykernel's warning that its TCP sockets are not encrypted may be there)."""
    from jupyter_client.manager import KernelManager

    cells = [c for c in json.loads(WARMUP.read_text())["cells"] if c["cell_type"] == "code"]
    setup, sweep = "".join(cells[1]["source"]), "".join(cells[2]["source"])
    params = "profile, ks, seeds, epochs = 'smoke', None, None, None\n"
    params += "nproc_per_node, nnodes, rdzv_endpoint, parallel = 1, 1, None, 1\n"
    params += f"wandb, out_dir = 'disabled', {str(tmp_path / 'results')!r}\n"
    params += "launcher, cluster = 'local', None\n"
    km = KernelManager(kernel_name="python3")
    log = tmp_path / "kernel.txt"
    with log.open("w") as f:
        km.start_kernel(stdout=f, stderr=f, env=subprocess_env())
    kc = km.client()
    kc.start_channels()
    try:
        kc.wait_for_ready(timeout=120)
        for code in (params, setup):
            assert kc.execute_interactive(code, timeout=300)["content"]["status"] == "ok"
        msg_id = kc.execute(sweep)
        study = tmp_path / "results" / "smoke" / "warmup"
        _wait_for_a_run(study)
        km.interrupt_kernel()
        streams, errors = [], []
        while True:
            msg = kc.get_iopub_msg(timeout=300)
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            kind, content = msg["msg_type"], msg["content"]
            if kind == "stream":
                streams.append(content["text"])
            elif kind == "error":
                errors.append(content)
            elif kind == "status" and content["execution_state"] == "idle":
                break
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)
    out = "".join(streams)
    for i in range(1, 5):  # each run's line: stopped, or not started
        assert any(line.startswith(f"[{i}/4] ") for line in out.splitlines()[1:]), out
    (err,) = errors  # the cell's error: the sweep's summary, one line
    assert err["traceback"] == [f"RunInterrupted: {err['evalue']}"], err
    assert err["evalue"].startswith("sweep of study 'warmup' interrupted"), err
    assert err["evalue"].endswith("run the same sweep again to resume"), err
    kernel_err = log.read_text()
    assert not [w for w in NOISE if w in kernel_err and w != "without encryption"], kernel_err


@pytest.mark.slow
def test_each_execution_logs_its_notebooks_once_also_two_in_one_process(tmp_path):
    """papermill's header lines, once per notebook, also for the second notebook that
    ``lbsgd reproduce`` executes in the same process; "Output Notebook" names the file the
    execution runs into (moved over OUTPUT at its end); a print that reached the client in two
    messages is one output in the saved notebook, as in an unloaded run."""
    import nbformat

    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {
        "name": "python3",
        "display_name": "Python 3",
        "language": "python",
    }
    nb.cells = [nbformat.v4.new_code_cell("x = 1", metadata={"tags": ["parameters"]})]
    nb.cells.append(nbformat.v4.new_code_cell("print('x is', x)"))
    # a line sent in two messages (as a loaded machine may): saved as one output all the same
    nb.cells.append(nbformat.v4.new_code_cell("print('cut', end='', flush=True); print(' whole')"))
    nbformat.write(nb, tmp_path / "in.ipynb")
    code = (
        "import sys; from lbsgd.lab import execute\n"
        "for name in ('a', 'b'):\n"
        f"    assert execute.execute('{tmp_path}/in.ipynb', f'{tmp_path}/{{name}}.ipynb', "
        "{'x': 2}, log_output=True) == 0\n"
    )
    r = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=subprocess_env()
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.count(f"Input Notebook:  {tmp_path}/in.ipynb\n") == 2, r.stdout
    for name in ("a", "b"):
        assert r.stdout.count(f"Output Notebook: {tmp_path}/{name}.running.ipynb\n") == 1
        cells = json.loads((tmp_path / f"{name}.ipynb").read_text())["cells"]
        assert ["".join(o["text"]) for o in cells[-1]["outputs"]] == ["cut whole\n"], cells[-1]
    assert r.stdout.count("x is 2\n") == 2


# a cell that, like an idle kernel between two cells, ignores SIGINT, then a cell that must not run
DEAF_CELL = """import pathlib, signal, time
signal.signal(signal.SIGINT, signal.SIG_IGN)
pathlib.Path({deaf!r}).write_text("")
time.sleep(3)"""


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_an_interrupt_the_kernel_does_not_see_stops_the_notebook_before_its_next_cell(
    tmp_path, signum
):
    """Ctrl-C or SIGTERM while the kernel ignores SIGINT (between two cells, as it starts; here a
    cell that ignores it): the execution stops at the next cell's start, one line, exit 130; the
    rest of the notebook does not run (it ran to its end, exit 0, before)."""
    import nbformat

    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_code_cell(DEAF_CELL.format(deaf=str(tmp_path / "deaf"))),
        nbformat.v4.new_code_cell(f"open({str(tmp_path / 'ran')!r}, 'w').close()"),
    ]
    nb.metadata["kernelspec"] = {
        "name": "python3",
        "display_name": "Python 3",
        "language": "python",
    }
    nbformat.write(nb, tmp_path / "nb.ipynb")
    proc = in_session(["execute", str(tmp_path / "nb.ipynb"), str(tmp_path / "out.ipynb")])
    deadline = time.monotonic() + 120
    while not (tmp_path / "deaf").exists():
        assert time.monotonic() < deadline and proc.poll() is None, proc.communicate()[0]
        time.sleep(0.05)
    printed = interrupt(proc, signum)
    assert proc.returncode == 130 and not (tmp_path / "ran").exists(), printed
    assert printed.count("\n") == 1 and "interrupted" in printed and "Traceback" not in printed
    assert not (tmp_path / "out.ipynb").exists() and session_processes(proc.pid) == []
