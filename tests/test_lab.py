"""``make lab``: JupyterLab serves the study notebooks and runs their code in the project's kernel.

The server is started on 127.0.0.1 with a random token and its own runtime/config/data folders,
driven through its REST API (urllib) and a kernel's websocket channel (websocket-client, a
dependency of jupyter_server), and always shut down.
"""

import contextlib
import json
import os
import secrets
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from datetime import datetime, timezone
from pathlib import Path

import nbformat
import psutil
import pytest
import websocket

from lbsgd import launch

REPO = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((REPO / "notebooks").glob("[0-9]*_*.ipynb"))
START_DEADLINE_S = 60
EXECUTE_DEADLINE_S = 45


class Lab:
    def __init__(self, port: int, token: str) -> None:
        self.base, self.token = f"http://127.0.0.1:{port}", token
        self.ws_base = f"ws://127.0.0.1:{port}"

    def call(self, method: str, path: str, body: dict | None = None, timeout: float = 10):
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.base + path, data=data, method=method)
        req.add_header("Authorization", f"token {self.token}")
        if data is not None:
            req.add_header("Content-Type", "application/json")
        with urllib.request.urlopen(req, timeout=timeout) as r:
            text = r.read().decode()
        return json.loads(text) if text else None

    def execute(self, kernel_id: str, code: str) -> tuple[str, dict]:
        """Runs ``code`` in the kernel; returns its stdout and its execute_reply content."""
        ws = websocket.create_connection(
            f"{self.ws_base}/api/kernels/{kernel_id}/channels?token={self.token}",
            timeout=EXECUTE_DEADLINE_S,
            suppress_origin=True,
        )
        try:
            msg_id = uuid.uuid4().hex
            header = {
                "msg_id": msg_id,
                "msg_type": "execute_request",
                "username": "test",
                "session": uuid.uuid4().hex,
                "version": "5.3",
                "date": datetime.now(timezone.utc).isoformat(),
            }
            content = {
                "code": code,
                "silent": False,
                "store_history": False,
                "user_expressions": {},
                "allow_stdin": False,
                "stop_on_error": True,
            }
            ws.send(
                json.dumps(
                    {
                        "header": header,
                        "parent_header": {},
                        "metadata": {},
                        "content": content,
                        "channel": "shell",
                        "buffers": [],
                    }
                )
            )
            out, reply, idle = [], None, False
            deadline = time.monotonic() + EXECUTE_DEADLINE_S
            while (reply is None or not idle) and time.monotonic() < deadline:
                raw = ws.recv()
                if not isinstance(raw, str):
                    continue  # binary frames carry buffers; none expected here
                msg = json.loads(raw)
                if msg.get("parent_header", {}).get("msg_id") != msg_id:
                    continue
                kind = msg["header"]["msg_type"]
                if kind == "stream":
                    out.append(msg["content"]["text"])
                elif kind == "error":
                    out.append("\n".join(msg["content"]["traceback"]))
                elif kind == "execute_reply":
                    reply = msg["content"]
                elif kind == "status" and msg["content"]["execution_state"] == "idle":
                    idle = True
            assert reply is not None and idle, f"no reply within {EXECUTE_DEADLINE_S} s: {out}"
            return "".join(out), reply
        finally:
            ws.close()


def tree(pid: int) -> list[psutil.Process]:
    """A process and everything under it (psutil refuses to signal a reused pid later)."""
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def listening_addresses(procs: list[psutil.Process]) -> set[tuple[str, int]]:
    found = set()
    for proc in procs:
        try:
            conns = proc.net_connections(kind="inet")
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        found |= {(c.laddr.ip, c.laddr.port) for c in conns if c.status == psutil.CONN_LISTEN}
    return found


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_jupyterlab_serves_the_notebooks_and_runs_one_through_a_kernel(tmp_path):
    port, token = launch.free_port(), secrets.token_hex(16)
    env = {**os.environ}
    for var, sub in [
        ("JUPYTER_RUNTIME_DIR", "runtime"),
        ("JUPYTER_CONFIG_DIR", "config"),
        ("JUPYTER_DATA_DIR", "data"),
        ("IPYTHONDIR", "ipython"),
    ]:
        env[var] = str(tmp_path / sub)
    cmd = [
        sys.executable,
        "-m",
        "jupyter",
        "lab",
        "--no-browser",
        "--ip=127.0.0.1",
        f"--port={port}",
        "--ServerApp.port_retries=0",
        f"--IdentityProvider.token={token}",
        "--notebook-dir=lab",  # make lab's: its working copies of notebooks/
    ]
    subprocess.run(["make", "-s", "lab-copies"], cwd=REPO, check=True)
    if os.geteuid() == 0:  # containers: jupyter refuses root without it
        cmd.append("--allow-root")
    log = tmp_path / "lab.log"
    lab = Lab(port, token)
    kernel_id = None
    started: list[psutil.Process] = []  # the server and the processes under it
    with log.open("w") as handle:
        server = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=handle, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + START_DEADLINE_S
        while True:
            assert server.poll() is None, f"jupyter lab exited:\n{log.read_text()[-3000:]}"
            try:
                status = lab.call("GET", "/api/status", timeout=2)
                break
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                assert time.monotonic() < deadline, (
                    f"no answer in {START_DEADLINE_S} s:\n{log.read_text()[-3000:]}"
                )
                time.sleep(0.5)
        assert "started" in status, status

        listing = lab.call("GET", "/api/contents")
        served = {item["name"] for item in listing["content"]}
        missing = [nb.name for nb in NOTEBOOKS if nb.name not in served]
        assert NOTEBOOKS and not missing, f"not served: {missing} (served: {sorted(served)})"

        kernel = lab.call("POST", "/api/kernels", {"name": "python3"}, timeout=30)
        kernel_id = kernel["id"]
        out, reply = lab.execute(
            kernel_id, "from lbsgd.lab.studies import scales; print(sorted(scales.PROFILES))"
        )
        assert reply["status"] == "ok" and "'smoke'" in out, (reply, out)

        # the first notebook's parameters cell and the setup cell after it, as "run all" would
        cells = [
            c for c in nbformat.read(NOTEBOOKS[0], as_version=4).cells if c.cell_type == "code"
        ]
        i = next(i for i, c in enumerate(cells) if "parameters" in c.metadata.get("tags", []))
        code = "\n".join([cells[i].source, cells[i + 1].source, "print('study', S.dir)"])
        out, reply = lab.execute(kernel_id, code)
        # the kernel runs in lab/; the study still writes to the repository's results/cpu/
        assert reply["status"] == "ok", (reply, out)
        assert f"study {REPO / 'results' / 'cpu' / 'quickstart'}\n" in out, out

        connection = json.loads((tmp_path / "runtime" / f"kernel-{kernel_id}.json").read_text())
        assert connection["ip"] == "127.0.0.1", connection
        started = tree(server.pid)
        addresses = listening_addresses(started)
        assert ("127.0.0.1", port) in addresses, addresses
        assert all(ip == "127.0.0.1" for ip, _ in addresses), (
            f"listening beyond 127.0.0.1: {addresses}"
        )
    finally:
        if kernel_id is not None:
            with contextlib.suppress(urllib.error.URLError, ConnectionError, TimeoutError):
                lab.call("DELETE", f"/api/kernels/{kernel_id}", timeout=15)
        started = started or tree(server.pid)
        server.terminate()
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait(timeout=10)
        for proc in started[1:]:  # a kernel the server left behind
            with contextlib.suppress(psutil.NoSuchProcess):
                proc.kill()
