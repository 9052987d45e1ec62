"""W&B mirrors every run (offline here: no network in tests) and never fails or blocks one."""

import contextlib
import json
import sys
import time
import types

import pytest

from lbsgd import launch
from lbsgd.entry import train
from lbsgd.tracking import resolve_wandb_mode


def test_offline_wandb_run_holds_identity_config_and_metrics(tiny):
    cfg = tiny(wandb="offline", epochs=1, study="warmup_study", name="wb_run")
    summary = train(cfg)
    assert summary["status"] == "completed"
    runs = list((cfg.run_dir() / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(runs) == 1
    needles = (
        b"warmup_study",
        b"wb_run",
        b"batch_size",
        b"warmup_steps",
        b"train/loss",
        b"train/lr",
        b"eval/top1_error_pct",
    )
    # W&B's service process writes the offline log (protobuf records holding the raw strings) on
    # its own schedule: on a loaded machine it can land after finish() returns. Wait, bounded.
    deadline = time.monotonic() + 60
    while True:
        blob = runs[0].read_bytes()
        missing = [n for n in needles if n not in blob]
        if not missing or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert not missing, missing
    # the JSONL record of truth is complete whatever W&B does
    kinds = [
        json.loads(x)["kind"]
        for x in (cfg.run_dir() / "metrics.jsonl").read_text().split("\n")
        if x
    ]
    assert kinds.count("train") == 8 and kinds.count("eval") == 1


class _BrokenRun:
    def __init__(self):
        self.summary = {}

    def define_metric(self, *a, **k):
        pass

    def log(self, *a, **k):
        raise ConnectionError("W&B server went away")

    def finish(self, *a, **k):
        raise ConnectionError("W&B server went away")


@pytest.mark.parametrize("failure", ["init", "log"])
def test_wandb_failure_leaves_one_warning_and_a_complete_run(tiny, monkeypatch, failure):
    fake = types.ModuleType("wandb")
    fake.Settings = lambda **k: k

    def init(**kwargs):
        if failure == "init":
            raise ConnectionError("cannot reach api.wandb.ai")
        return _BrokenRun()

    fake.init = init
    monkeypatch.setitem(sys.modules, "wandb", fake)
    cfg = tiny(wandb="online", epochs=1, name=f"broken_{failure}")
    with pytest.warns(RuntimeWarning, match="continuing without W&B") as caught:
        summary = train(cfg)
    assert summary["status"] == "completed"
    assert len([w for w in caught if "W&B" in str(w.message)]) == 1  # one warning, then silence
    lines = (cfg.run_dir() / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == 8 + 1  # every step and the evaluation


def test_auto_mode_is_offline_without_a_key_and_online_with_one(monkeypatch, tmp_path):
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("NETRC", str(tmp_path / "no-netrc"))
    monkeypatch.setenv("HOME", str(tmp_path))
    assert resolve_wandb_mode("auto") == "offline"
    monkeypatch.setenv("WANDB_API_KEY", "x" * 40)
    assert resolve_wandb_mode("auto") == "online"
    monkeypatch.setenv("WANDB_MODE", "disabled")
    assert resolve_wandb_mode("auto") == "disabled"
    assert resolve_wandb_mode("offline") == "offline"


class _RejectingServer:
    """A W&B server address that answers every request with 401 (an API key it does not know)."""

    def __enter__(self):
        import http.server
        import threading

        class Handler(http.server.BaseHTTPRequestHandler):
            def _reject(self):
                body = b'{"errors": [{"message": "user is not logged in"}]}'
                self.send_response(401)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = do_PUT = _reject

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()


@contextlib.contextmanager
def _closed_port():
    """A W&B server address nothing listens on."""
    yield f"http://{launch.HOST}:{launch.free_port()}"


@pytest.mark.slow
@pytest.mark.parametrize("server", ["unreachable", "rejects_the_key"])
def test_wandb_server_failing_falls_back_to_offline_quickly_and_keeps_the_key_out(
    tiny, monkeypatch, server
):
    key = "0123456789abcdef0123456789abcdef0123abcd"  # well-formed, unknown to any server
    monkeypatch.setenv("WANDB_API_KEY", key)
    cfg = tiny(wandb="online", epochs=1, name=server)
    with _closed_port() if server == "unreachable" else _RejectingServer() as url:
        monkeypatch.setenv("WANDB_BASE_URL", url)
        t0 = time.monotonic()
        with pytest.warns(RuntimeWarning, match="logging offline instead") as caught:
            summary = train(cfg)
        elapsed = time.monotonic() - t0
    assert summary["status"] == "completed"
    assert len([w for w in caught if "W&B" in str(w.message)]) == 1
    assert elapsed < 4 * 15  # the online attempt gives up after its 15 s init timeout
    (offline,) = list((cfg.run_dir() / "wandb").glob("offline-run-*/run-*.wandb"))
    # the offline run's id is the one kept in the run directory (a resume continues that one)
    assert offline.name == f"run-{(cfg.run_dir() / 'wandb_id').read_text().strip()}.wandb"
    lines = (cfg.run_dir() / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == 8 + 1
    leaked = [p for p in cfg.run_dir().rglob("*") if p.is_file() and key.encode() in p.read_bytes()]
    assert not leaked, leaked  # no file of the run holds the API key
