"""Data parallelism under torchrun (gloo on CPU) and the command line.

The central guarantee (Goyal §2.3, §3): a run's mathematics does not depend on its layout. For a
ResNet with BN and groups of n = bn_batch = 8 samples, (a) 2 processes × micro-batch 16,
(b) 1 process accumulating 2 micro-batches of 16 and (c) 1 process with micro-batch 32 end with the
same weights and the same BN running statistics. Why:
- The sampler gives every layout the same global batch at every step, cut into the same groups of
  8 consecutive samples (tests/test_sampler.py).
- Every layer is a per-sample function in the forward pass except BN, and ghost BN normalises each
  group of 8 on its own in every layout (tests/test_ghost_bn.py), so every activation and
  per-sample gradient is the same.
- DDP averages the 2 ranks' gradients of the mean micro-batch loss; accumulation adds the gradients
  of loss/2 of 2 micro-batches; one micro-batch of 32 averages them in its loss. These agree up to
  the order of float additions, hence a tolerance (float32: rtol 1e-5, atol 1e-6) rather than
  bitwise equality.
- BN running statistics are updated once per step from the group statistics summed over all
  processes (lbsgd.models.ghost_bn), which does not depend on the layout either.
"""

import os
import re
import subprocess
from pathlib import Path

import pytest
import torch
from conftest import lbsgd, start
from helpers import SIX_STEP_ARGS, initial_weights, write_cifar

from lbsgd import checkpoint


@pytest.mark.slow
@pytest.mark.parametrize("optimizer", ["sgd", "lamb"])
def test_processes_accumulation_and_large_micro_batch_give_the_same_weights(tmp_path, optimizer):
    layouts = {  # name: (processes, extra keys)
        "a_two_processes": (2, ["micro_batch=16"]),
        "b_accumulation": (None, ["micro_batch=16"]),
        "c_one_micro_batch": (None, ["micro_batch=32"]),
    }
    expect = {
        "a_two_processes": "world_size=2 x micro_batch=16 x accum_steps=1 = batch_size=32",
        "b_accumulation": "world_size=1 x micro_batch=16 x accum_steps=2 = batch_size=32",
        "c_one_micro_batch": "world_size=1 x micro_batch=32 x accum_steps=1 = batch_size=32",
    }
    keys = [k if not k.startswith("bn_batch") else "bn_batch=8" for k in SIX_STEP_ARGS]
    if optimizer == "lamb":  # Adam's moments and the trust ratio see the same averaged gradients
        keys += ["optimizer=lamb", "base_lr=0.01", "weight_decay=0.01"]
        del layouts["c_one_micro_batch"]  # the all-reduce against accumulation is the question
    for name, (nproc, extra) in layouts.items():
        args = [*keys, *extra, f"out_dir={tmp_path}", f"name={name}"]
        r = lbsgd(["train", *args], nproc)
        assert r.returncode == 0, r.stderr[-3000:]
        assert expect[name] in r.stdout
        assert "Warning" not in r.stderr, r.stderr[-3000:]  # DDP wrapped as its torch asks
    states = {name: checkpoint.load(tmp_path / "runs" / name) for name in layouts}
    ref = states["b_accumulation"]
    assert ref["step"] == 6
    init = initial_weights()
    moved = 0.0
    for name in [n for n in layouts if n != "b_accumulation"]:
        for key, value in ref["model"].items():  # parameters and BN buffers alike
            torch.testing.assert_close(
                states[name]["model"][key], value, rtol=1e-5, atol=1e-6, msg=f"{name}: {key}"
            )
            if value.is_floating_point():
                moved = max(moved, (value - init[key]).abs().max().item())
    assert moved > 1e-2  # the weights did train: the equality is not that of untouched models


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="threads are read from /proc")
def test_a_two_process_run_frees_its_process_group_before_the_interpreter_exits(tmp_path):
    """Shutdown frees the gloo group of a DDP run: none of its threads is left for the
    interpreter's finalisation, where one that frees the tensors of the run's last collective (the
    final checkpoint's all-gather; rank 1 exits while rank 0 writes) aborts the process
    ("terminate called without an active exception"). The group was held for good by a torch module
    that binds ``group.WORLD`` as a default argument when first imported (by DDP's constructor)."""
    args = [*SIX_STEP_ARGS, f"out_dir={tmp_path}", "name=two"]
    r = lbsgd(["train", *args], 2, program=[str(Path(__file__).parent / "shutdown_worker.py")])
    assert r.returncode == 0, r.stderr[-3000:]
    # each print is one write, its newline another (python -u): two ranks' lines may interleave
    found = re.findall(r"rank (\d): gloo threads (before|after) shutdown: (\d+)", r.stdout)
    counts = {(rank, when): int(n) for rank, when, n in found}
    assert len(found) == len(counts) == 4, r.stdout
    for rank in "01":
        assert counts[rank, "before"] >= 2  # the group's threads, found by their names
        assert counts[rank, "after"] == 0, r.stdout


@pytest.mark.slow
def test_dropout_masks_do_not_depend_on_the_layout(tmp_path):
    """AlexNet-BN's dropout draws from a generator seeded by the global micro-batch: 2 processes ×
    micro-batch 16 and 1 process accumulating 2 × 16 drop the same units and end with the same
    weights (without that seeding, each process's own generator gives other masks)."""
    keys = [k for k in SIX_STEP_ARGS if not k.startswith(("model=", "bn_batch=", "base_lr="))]
    keys += ["model=alexnet_bn", "bn_batch=8", "micro_batch=16", "base_lr=0.02"]
    for name, nproc in (("two", 2), ("one", None)):
        args = [*keys, f"out_dir={tmp_path}", f"name={name}"]
        r = lbsgd(["train", *args], nproc)
        assert r.returncode == 0, r.stderr[-3000:]
    two = checkpoint.load(tmp_path / "runs" / "two")["model"]
    one = checkpoint.load(tmp_path / "runs" / "one")["model"]
    for key, value in one.items():
        torch.testing.assert_close(two[key], value, rtol=1e-5, atol=1e-6, msg=key)


def test_cli_bad_input_exits_2_with_one_line_and_writes_nothing(tmp_path):
    r = lbsgd(["train", "batchsize=64", f"out_dir={tmp_path}"])
    assert r.returncode == 2
    assert r.stderr.strip() == (
        "lbsgd: error: unknown key 'batchsize' (did you mean 'batch_size'?); "
        "`lbsgd keys` lists the vocabulary"
    )
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
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
    r = lbsgd(
        [
            "train",
            *SIX_STEP_ARGS,
            f"plugins={plugin}",
            "model=tiny_linear",
            f"out_dir={tmp_path}",
            "name=plug",
        ],
        cwd=tmp_path,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    state = checkpoint.load(tmp_path / "runs" / "plug")["model"]
    assert set(state) == {"1.weight", "1.bias"}  # the user's network, not a built-in one


@pytest.mark.slow
def test_cli_unknown_model_names_the_registered_ones(tmp_path):
    r = lbsgd(["train", "model=resnt", f"out_dir={tmp_path}"])
    assert r.returncode == 2
    assert "model='resnt' is not registered (did you mean 'resnet'?)" in r.stderr
    assert Path(tmp_path).exists() and list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_progress_bar_shows_on_a_terminal_and_stays_quiet_otherwise(tmp_path):
    import fcntl
    import pty
    import struct
    import termios

    args = [*SIX_STEP_ARGS, f"out_dir={tmp_path}"]
    quiet = lbsgd(["train", *args, "name=pipe"])
    assert quiet.returncode == 0 and "step/s" not in quiet.stderr and "6/6" not in quiet.stderr
    leader, follower = pty.openpty()
    fcntl.ioctl(
        follower, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0)
    )  # a 100-col terminal
    proc = start(["train", *args, "name=tty"], stdout=subprocess.DEVNULL, stderr=follower)
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


@pytest.mark.slow
def test_cli_diverged_run_exits_3_with_status_recorded(tmp_path):
    r = lbsgd(
        ["train", *[a for a in SIX_STEP_ARGS if not a.startswith("warmup_epochs=")], "base_lr=1e8"]
        + ["warmup=none", f"out_dir={tmp_path}", "name=boom"]
    )
    assert r.returncode == 3, r.stderr[-2000:]
    assert "diverged" in r.stdout
    summary = (tmp_path / "runs" / "boom" / "summary.json").read_text()
    assert '"status": "diverged"' in summary


@pytest.mark.slow
def test_cifar10_augmentation_does_not_depend_on_the_layout(tmp_path):
    """On CIFAR-10 files (5 x 64 training images of 32x32), each sample's pad-crop-flip is drawn
    from its position in the run's stream, on the training device: 2 processes x micro-batch 16,
    1 process accumulating 2 x 16 and 1 process with micro-batch 32 train on the same augmented
    images (same final weights; a draw per micro-batch from a reseeded generator would not)."""
    write_cifar(tmp_path / "cifar", per_batch=64, n_test=32)
    keys = [k for k in SIX_STEP_ARGS if not k.startswith(("synthetic_", "bn_batch=", "epochs="))]
    keys += ["dataset=cifar10", f"data_dir={tmp_path / 'cifar'}", "bn_batch=8"]
    keys += ["epochs=0.6"]  # 6 steps of 32 out of 320 images
    layouts = {"two": (2, 16), "accumulate": (None, 16), "whole": (None, 32)}
    for name, (nproc, micro) in layouts.items():
        args = [*keys, f"micro_batch={micro}", f"out_dir={tmp_path}", f"name={name}"]
        r = lbsgd(["train", *args], nproc)
        assert r.returncode == 0, r.stderr[-3000:]
    ref = checkpoint.load(tmp_path / "runs" / "accumulate")
    assert ref["step"] == 6
    for name in ("two", "whole"):
        state = checkpoint.load(tmp_path / "runs" / name)["model"]
        for key, value in ref["model"].items():
            torch.testing.assert_close(
                state[key], value, rtol=1e-5, atol=1e-6, msg=f"{name}: {key}"
            )
