"""What several test modules share beyond conftest.py's launchers: the short distributed run and
its initial weights, the fault-injected kill-and-resume run, CIFAR-10 files in torchvision's format,
the progress and ending lines of ``lbsgd train``, a reader of W&B's offline run files, and a long
command interrupted as at a terminal.

A test module imports these from here, never from another test module (tests/test_layers.py)."""

from __future__ import annotations

import json
import os
import re
import signal
import struct
import subprocess
import time
from pathlib import Path

import numpy as np
import torch
from conftest import as_args, lbsgd, start, tiny_keys, used_keys

from lbsgd import checkpoint, config
from lbsgd.data.fake_files import dump_py2

HERE = Path(__file__).parent

# -- the short distributed run (tests/test_distributed.py) -----------------------------------------

# TINY at 8 steps per epoch (256 images, batch 32), the first 2 warmup, a flush every 2 steps
EIGHT_STEP_EPOCHS = {
    "synthetic_train": 256,
    "synthetic_test": 128,
    "batch_size": 32,
    "reference_batch": 32,
    "base_lr": 0.2,
    "warmup_epochs": 0.25,
    "log_every": 2,
}
# 6 optimizer steps: 0.75 epochs
SIX_STEP_ARGS = as_args(tiny_keys(**EIGHT_STEP_EPOCHS, epochs=0.75))


def splitmix64(seed: int, position: int) -> int:
    """SplitMix64 of (seed, position) in Python integers, reduced modulo 2^64 by hand: the
    reference for lbsgd.seeding's vectorised uint64 version."""
    mask = (1 << 64) - 1
    z = (seed * 0x9E3779B97F4A7C15 + (position + 1) * 0xBF58476D1CE4E5B9) & mask
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & mask
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & mask
    return (z ^ (z >> 31)) >> 1


def initial_weights():
    """The initial state of TINY's ResNet-8 (width 8) at seed 0: what a run's weights moved from."""
    from types import SimpleNamespace

    from lbsgd.models import build

    torch.manual_seed(0)
    cfg = SimpleNamespace(model="resnet", depth=8, width=8, zero_init_residual=True)
    return build(cfg, 10, 16).state_dict()


# -- kill and resume (tests/test_resume.py) --------------------------------------------------------

FAULT_WORKER = str(HERE / "fault_worker.py")

# The 16-step experiment (256 samples, batch 32: 8 steps per epoch, 2 epochs) with a checkpoint
# every 3 steps besides the epoch ends (3, 6, 8, 9, 12, 15, 16).
RESUME_KEYS = tiny_keys(
    synthetic_train=256,
    synthetic_test=128,
    batch_size=32,
    bn_batch=8,
    micro_batch=16,
    reference_batch=32,
    base_lr=0.2,
    eval_every=1,
    log_every=2,
    checkpoint_every=3,
    resume=True,  # what a restartable job passes: a new run starts, a stopped one continues
)
KILL_AT = 11  # killed before step 11: the newest checkpoint is step 9, mid-epoch 2


def resume_args(out: Path, name: str, **extra) -> list[str]:
    """``lbsgd train``'s arguments of the 16-step run ``name`` (RESUME_KEYS and ``extra``)."""
    keys = used_keys({**RESUME_KEYS, "out_dir": str(out), "name": name, **extra})
    return [f"{k}={v}" for k, v in keys.items()]


def run_fault_worker(
    args, nproc=None, kill_at=None, kill_rank=0, restarts=0, timeout=300, worker=FAULT_WORKER
):
    """``lbsgd train *args`` through ``worker`` (tests/fault_worker.py: rank ``kill_rank`` kills
    itself with SIGKILL before step ``kill_at``), alone or under torchrun with ``nproc``."""
    env = {"PYTHONUNBUFFERED": "1", "TORCHELASTIC_RESTART_COUNT": None}
    if kill_at is not None:
        env.update(LBSGD_TEST_KILL_AT_STEP=str(kill_at), LBSGD_TEST_KILL_RANK=str(kill_rank))
    restarts = restarts if nproc else None
    return lbsgd(
        ["train", *args], nproc, program=[worker], max_restarts=restarts, env=env, timeout=timeout
    )


def final_weights(run_dir: Path) -> dict[str, torch.Tensor]:
    """The model of the 16-step run's last checkpoint (asserted to be step 16's)."""
    state = checkpoint.read(run_dir / checkpoint.NAME)
    assert state["step"] == 16
    return state["model"]


def assert_bitwise(got: dict, want: dict) -> None:
    assert got.keys() == want.keys()
    for k in want:  # parameters and BN buffers alike
        assert torch.equal(got[k], want[k]), k


def train_steps(run_dir: Path) -> list[int]:
    """The steps of the run's train records, in the order logged."""
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [r["step"] for r in map(json.loads, lines) if r["kind"] == "train"]


def killed_and_resumed(tmp_path: Path, name: str, nproc=None, **keys) -> dict:
    """Run ``name`` (RESUME_KEYS and ``keys``) uninterrupted into ``tmp_path/straight``, and again
    into ``tmp_path`` killed (SIGKILL, the last rank) before step KILL_AT, then resumed: the resume
    starts at the checkpoint of step 9 and ends bitwise where the uninterrupted run does. Returns
    the checkpoint the killed run left, for what it must hold."""
    r = run_fault_worker(resume_args(tmp_path / "straight", name, **keys), nproc=nproc)
    assert r.returncode == 0, r.stderr[-3000:]
    r = run_fault_worker(
        resume_args(tmp_path, name, **keys),
        nproc=nproc,
        kill_at=KILL_AT,
        kill_rank=(nproc or 1) - 1,
    )
    assert r.returncode != 0
    saved = checkpoint.load(tmp_path / "runs" / name)
    assert saved["step"] == 9
    r = run_fault_worker(resume_args(tmp_path, name, **keys), nproc=nproc)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "at step 9" in r.stdout
    assert_bitwise(
        final_weights(tmp_path / "runs" / name),
        final_weights(tmp_path / "straight" / "runs" / name),
    )
    return saved


# -- CIFAR-10 files (tests/test_folders.py) --------------------------------------------------------

CIFAR_NAMES = ["airplane", "automobile", "bird", "cat", "deer"]
CIFAR_NAMES += ["dog", "frog", "horse", "ship", "truck"]


def normalise(chw_uint8: np.ndarray, mean, std) -> np.ndarray:
    """Hand normalisation: pixels / 255, minus mean, over std, per channel."""
    x = chw_uint8.astype(np.float64) / 255.0
    return (x - np.array(mean)[:, None, None]) / np.array(std)[:, None, None]


def write_cifar(root: Path, per_batch: int = 3, n_test: int = 4) -> dict[str, tuple]:
    """Write torchvision's CIFAR-10 python format: Python 2 pickled dicts with keys b"data" (uint8
    rows of 3072: 1024 R, then G, then B, each row-major 32x32), b"labels" and, in batches.meta,
    b"label_names". Returns what was written per file."""
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    written = {}
    names = [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]
    for k, name in enumerate(names):
        n = n_test if name == "test_batch" else per_batch
        data = rng.integers(0, 256, size=(n, 3072), dtype=np.uint8)
        labels = [int((k * 7 + j * 3) % 10) for j in range(n)]
        dump_py2({b"batch_label": name.encode(), b"data": data, b"labels": labels}, folder / name)
        written[name] = (data, labels)
    meta = {b"label_names": [c.encode() for c in CIFAR_NAMES], b"num_vis": 3072}
    dump_py2(meta, folder / "batches.meta")
    return written


# -- the lines lbsgd train prints (tests/test_cli_output.py) ---------------------------------------

PROGRESS = re.compile(
    r"^lbsgd: step (\d+)/(\d+) epoch (\d+\.\d\d) loss (\S+) lr (\S+) img/s (\d+) "
    r"elapsed (\d+:\d\d:\d\d) eta (\d+:\d\d:\d\d|\?)(?: top-1 error (\d+\.\d\d)%)?$",
    re.M,
)
ENDING = re.compile(
    r"^lbsgd: (\w+): final top-1 error (n/a|\d+\.\d\d%), best (n/a|\d+\.\d\d% \(step \d+\)), "
    r"(\d+)/(\d+) steps, wall time (\d+):(\d\d):(\d\d\.\d), summary (\S+)$",
    re.M,
)


def _percent(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}%"


def assert_ends_with_its_summary(out: str, run_dir: Path, status: str) -> dict:
    """The output holds exactly one ending line, with ``status`` and the numbers of the run's
    summary.json (its top-1 errors to 2 decimals, its wall time to 0.1 s); the summary."""
    summary = json.loads((run_dir / "summary.json").read_text())
    endings = ENDING.findall(out)
    assert len(endings) == 1, out[-3000:]
    said, final, best, steps, total, h, m, s, where = endings[0]
    assert said == status == summary["status"]
    assert final == _percent(summary.get("final", {}).get("top1_error_pct"))
    b = summary.get("best")
    assert best == ("n/a" if b is None else f"{_percent(b['top1_error_pct'])} (step {b['step']})")
    assert (int(steps), int(total)) == (summary["steps"], summary["total_steps"])
    assert abs(int(h) * 3600 + int(m) * 60 + float(s) - summary["wall_time_s"]) <= 0.051
    assert Path(where) == run_dir / "summary.json"
    return summary


# -- reading W&B's offline run files (tests/test_wandb.py) ----------------------------------------

_BLOCK = 32768  # LevelDB log blocks; each record chunk has a 7-byte header (crc, length, type)
_FULL, _LAST = 1, 4


def offline_records(path: Path) -> list:
    """Every Record of a ``run-<id>.wandb`` file, in order."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = path.read_bytes()
    ident, magic, version = struct.unpack("<4sHB", data[:7])
    assert (ident, magic, version) == (b":W&B", 0xBEE1, 0), "not a W&B transaction log"
    pos, buf, out = 7, b"", []
    while pos + 7 <= len(data):
        left = _BLOCK - pos % _BLOCK
        if left < 7:  # a block's trailer
            pos += left
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if length == 0 and kind == 0:  # zero padding to the block's end
            pos += left
            continue
        if pos + 7 + length > len(data):  # a record W&B's service is still writing: read later
            break
        buf += data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (_FULL, _LAST):
            record = pb.Record()
            record.ParseFromString(buf)
            out.append(record)
            buf = b""
    return out


def _value(item):
    """A history/config item's value (older records: value_json; newer: typed fields)."""
    if item.value_json:
        return json.loads(item.value_json)
    which = item.WhichOneof("value") if "value" in item.DESCRIPTOR.oneofs_by_name else None
    return getattr(item, which) if which else None


def _nested(items) -> dict:
    """History items as a dict; a logged dict (a table's or image's reference) comes back as
    items of nested keys, put together again here."""
    row: dict = {}
    for i in items:
        *outer, last = list(i.nested_key) or [i.key]
        d = row
        for k in outer:
            d = d.setdefault(k, {})
        d[last] = _value(i)
    return row


class OfflineRun:
    """One offline W&B run: its run record, config, history rows, metric declarations, files."""

    def __init__(self, wandb_file: Path):
        self.dir = wandb_file.parent
        deadline = time.monotonic() + 60
        while True:  # W&B's service process writes the log on its own schedule: wait, bounded
            records = offline_records(wandb_file)
            if any(r.WhichOneof("record_type") == "exit" for r in records):
                break
            assert time.monotonic() < deadline, f"{wandb_file} has no exit record"
            time.sleep(0.5)
        of = {}
        for r in records:
            of.setdefault(r.WhichOneof("record_type"), []).append(r)
        run = of["run"][0].run
        self.id, self.name, self.group = run.run_id, run.display_name, run.run_group
        self.job_type, self.tags, self.notes = run.job_type, list(run.tags), run.notes
        self.started = run.start_time.ToNanoseconds()
        self.config = {i.key: _value(i) for i in run.config.update}
        for c in of.get("config", []):
            self.config.update({i.key: _value(i) for i in c.config.update})
        self.history = [_nested(h.history.item) for h in of.get("history", [])]
        self.metrics = [m.metric for m in of.get("metric", [])]

    def points(self, key: str) -> list[tuple[int, float]]:
        return [(row["_step"], row[key]) for row in self.history if key in row]


def offline_runs(folder: Path) -> list[OfflineRun]:
    """The offline W&B runs under ``folder``/wandb, oldest first."""
    runs = [OfflineRun(f) for f in folder.glob("wandb/offline-run-*/run-*.wandb")]
    return sorted(runs, key=lambda r: r.started)


# -- a study's runs and findings (tests/test_study_*.py) -------------------------------------------


def run_name(keys: dict) -> str:
    """The run name of a study's run ``keys`` (the sweep's name for it)."""
    return config.from_dict({**keys, "study": "x"}).run_name()


def valid_layout(keys: dict, world_size: int):
    """The run's config and its layout on ``world_size`` processes (raises ConfigError if not)."""
    cfg = config.from_dict({**keys, "study": "x"})
    return config.derive(cfg, world_size, keys["synthetic_train"])


def verdicts(findings) -> list:
    """Each finding's verdict: True (replayed), False (not replayed) or None (undecided)."""
    return [f.replayed for f in findings]


# -- a long command interrupted (tests/test_cli_output.py, tests/test_plan.py) --------------------


def in_session(args: list[str]) -> subprocess.Popen:
    """``lbsgd *args`` in a session of its own with Ctrl-C's default disposition, as at a
    terminal (a test worker may ignore SIGINT, and it would inherit that); stdout and stderr
    together, as text."""
    return start(
        args,
        env={"PYTHONUNBUFFERED": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )


def catches_sigterm(pid: int) -> bool:
    """Whether process ``pid`` has a SIGTERM handler (Linux /proc: SigCgt), i.e. has got past its
    start to where a command turns SIGTERM into an interrupt."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    caught = int(re.search(r"SigCgt:\s*([0-9a-f]+)", status).group(1), 16)
    return bool(caught >> (signal.SIGTERM - 1) & 1)


def interrupt(proc: subprocess.Popen, signum: int) -> str:
    """SIGINT to ``proc``'s process group (Ctrl-C at a terminal), another signal to it alone (a
    scheduler, ``kill``); the rest of its output once it has ended."""
    if signum == signal.SIGINT:
        os.killpg(proc.pid, signum)
    else:
        proc.send_signal(signum)
    return proc.communicate(timeout=120)[0]


def processes_naming(path: Path) -> list[str]:
    """The command lines of this machine's processes that name ``path`` (Linux /proc)."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            line = cmdline.read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:  # it has just ended
            continue
        found += [line] if str(path) in line else []
    return found


def session_processes(sid: int) -> list[str]:
    """The command lines of session ``sid``'s processes (Linux /proc): what a command started in
    :func:`in_session` left behind."""
    left = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if int(fields[3]) == sid and fields[0] != "Z":
                left.append((stat.parent / "cmdline").read_bytes().replace(b"\0", b" ").decode())
        except (OSError, IndexError):  # it has just ended
            continue
    return left
