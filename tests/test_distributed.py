"""Data parallelism under torchrun (gloo on CPU) and the command line.

Why two processes × micro-batch m equal one process × batch 2m (accumulating 2 micro-batches of m):
- The sampler gives both layouts the same micro-batches at every step (tests/test_sampler.py).
- Every layer is a per-sample function of its input in the forward pass except BatchNorm, whose
  training-mode statistics come from the micro-batch. With micro_batch = bn_batch = m, BN normalises
  the same groups of m samples in both layouts, so every activation and gradient is identical.
- DDP sums the two ranks' gradients of the mean micro-batch loss and divides by 2; one process adds
  the gradients of loss/2 of its two micro-batches. Equal up to the order of float additions, hence
  the tolerance below (float32, a few ulps amplified over the steps) rather than bitwise equality.
- BN running statistics are not part of this guarantee: under DDP they follow rank 0's micro-batches
  (DDP broadcasts rank 0's buffers each forward), with accumulation they see every micro-batch in turn.
  They do not influence training-mode forward passes, so the weights are unaffected.
"""

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from lbsgd import checkpoint

pytestmark = pytest.mark.slow

COMMON = [
    "model=resnet",
    "depth=8",
    "width=8",
    "synthetic_train=256",
    "synthetic_test=128",
    "synthetic_difficulty=easy",
    "batch_size=32",
    "bn_batch=16",
    "reference_batch=32",
    "base_lr=0.2",
    "warmup_epochs=0.25",
    "schedule=cosine",
    "epochs=0.75",
    "threads=1",
    "wandb=disabled",
    "log_every=2",
]  # fmt: skip  (6 optimizer steps: 256 / 32 = 8 per epoch)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def lbsgd(args, nproc=None, cwd=None, timeout=240):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    if nproc:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes=1",
               f"--nproc-per-node={nproc}", "--rdzv-backend=c10d",
               f"--rdzv-endpoint=127.0.0.1:{free_port()}", "-m", "lbsgd", "train", *args]  # fmt: skip
    else:
        cmd = [sys.executable, "-m", "lbsgd", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, cwd=cwd)


def test_two_gloo_processes_equal_one_process_accumulating_two_micro_batches(tmp_path):
    out = f"out_dir={tmp_path}"
    two = lbsgd([*COMMON, out, "name=two"], nproc=2)
    assert two.returncode == 0, two.stderr[-3000:]
    assert "world_size=2 x micro_batch=16 x accum_steps=1 = batch_size=32" in two.stdout
    one = lbsgd(["train", *COMMON, out, "name=one"])
    assert one.returncode == 0, one.stderr[-3000:]
    assert "world_size=1 x micro_batch=16 x accum_steps=2 = batch_size=32" in one.stdout

    a = checkpoint.load(tmp_path / "runs" / "two")
    b = checkpoint.load(tmp_path / "runs" / "one")
    assert a["step"] == b["step"] == 6
    init = _initial_weights()
    moved = 0.0
    for name, p in a["model"].items():
        if "running" in name or "num_batches" in name:
            continue  # BN running statistics: see the module docstring
        torch.testing.assert_close(p, b["model"][name], rtol=1e-5, atol=1e-6, msg=name)
        moved = max(moved, (p - init[name]).abs().max().item())
    assert moved > 1e-2  # the weights did train: the equality is not that of two untouched models


def _initial_weights():
    from types import SimpleNamespace

    from lbsgd.models import build

    torch.manual_seed(0)
    cfg = SimpleNamespace(model="resnet", depth=8, width=8, zero_init_residual=True)
    return build(cfg, 10, 16).state_dict()


def test_cli_bad_input_exits_2_with_one_line_and_writes_nothing(tmp_path):
    r = lbsgd(["train", "batchsize=64", f"out_dir={tmp_path}"])
    assert r.returncode == 2
    assert r.stderr.strip() == (
        "lbsgd: error: unknown key 'batchsize' (did you mean 'batch_size'?); "
        "`lbsgd keys` lists the vocabulary"
    )
    assert list(tmp_path.iterdir()) == []


def test_cli_trains_a_user_plugin_model_by_name(tmp_path):
    plugin = tmp_path / "my_models.py"
    plugin.write_text(
        "import torch\n"
        "from lbsgd import register_model\n\n"
        "@register_model('tiny_linear')\n"
        "def tiny_linear(cfg, num_classes, image_size):\n"
        "    return torch.nn.Sequential(torch.nn.Flatten(),\n"
        "                               torch.nn.Linear(3 * image_size**2, num_classes))\n"
    )
    r = lbsgd(["train", *COMMON, f"plugins={plugin}", "model=tiny_linear", f"out_dir={tmp_path}",
               "name=plug"], cwd=tmp_path)  # fmt: skip
    assert r.returncode == 0, r.stderr[-2000:]
    state = checkpoint.load(tmp_path / "runs" / "plug")["model"]
    assert set(state) == {"1.weight", "1.bias"}  # the user's network, not a built-in one


def test_cli_unknown_model_names_the_registered_ones(tmp_path):
    r = lbsgd(["train", "model=resnt", f"out_dir={tmp_path}"])
    assert r.returncode == 2
    assert "model='resnt' is not registered (did you mean 'resnet'?)" in r.stderr
    assert Path(tmp_path).exists() and list(tmp_path.iterdir()) == []


def test_progress_bar_shows_on_a_terminal_and_stays_quiet_otherwise(tmp_path):
    import fcntl
    import pty
    import struct
    import termios

    args = [*COMMON, f"out_dir={tmp_path}"]
    quiet = lbsgd(["train", *args, "name=pipe"])
    assert quiet.returncode == 0 and "step/s" not in quiet.stderr and "6/6" not in quiet.stderr
    leader, follower = pty.openpty()
    fcntl.ioctl(
        follower, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0)
    )  # a 100-col terminal
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "lbsgd", "train", *args, "name=tty"],
                            stdout=subprocess.DEVNULL, stderr=follower, env=env)  # fmt: skip
    os.close(follower)
    chunks = []
    while True:
        try:
            chunk = os.read(leader, 4096)
        except OSError:  # the child closed the terminal
            break
        if not chunk:
            break
        chunks.append(chunk)
    assert proc.wait(timeout=120) == 0
    os.close(leader)
    shown = b"".join(chunks).decode(errors="replace")
    assert "6/6" in shown and "step" in shown, shown[-500:]
