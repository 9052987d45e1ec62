"""Fault injection: exact resume after a kill, worker failure under torchrun, damaged checkpoints.

Every run here is the same 16-step experiment (256 samples, batch 32: 8 steps per epoch, 2 epochs)
with a checkpoint every 3 steps besides the epoch ends (3, 6, 8, 9, 12, 15, 16). A worker killed
with SIGKILL before step 11 leaves the checkpoint of step 9, in the middle of the second epoch, so
a resume continues mid-epoch. The outcome asserted is always the data: the final weights (bitwise
where the layout is the same), the files left on disk, and the status fields. The experiment and
its fault-injecting launcher (tests/fault_worker.py) are in tests/helpers.py.
"""

import json
import os
import pickle
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
import torch
from conftest import as_args, lbsgd, start
from helpers import (
    KILL_AT,
    RESUME_KEYS,
    assert_bitwise,
    final_weights,
    killed_and_resumed,
    resume_args,
    run_fault_worker,
    train_steps,
    write_cifar,
)

from lbsgd import checkpoint
from lbsgd.config import ConfigError
from lbsgd.data import StepSampler
from lbsgd.entry import train


def _status(run_dir: Path) -> dict:
    return json.loads((run_dir / "summary.json").read_text())


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """Uninterrupted runs: one process (fp16, so that the loss scaler matters) and two processes."""
    out = tmp_path_factory.mktemp("reference")
    r = run_fault_worker(resume_args(out, "one", precision="fp16", loss_scale=2.0**24))
    assert r.returncode == 0, r.stderr[-3000:]
    r = run_fault_worker(resume_args(out, "two"), nproc=2)
    assert r.returncode == 0, r.stderr[-3000:]
    return {"one": final_weights(out / "runs" / "one"), "two": final_weights(out / "runs" / "two")}


@pytest.mark.slow
def test_one_process_killed_mid_epoch_resumes_to_bitwise_equal_weights(tmp_path, reference):
    args = resume_args(tmp_path, "one", precision="fp16", loss_scale=2.0**24)
    run_dir = tmp_path / "runs" / "one"
    r = run_fault_worker(args, kill_at=KILL_AT)
    assert r.returncode == -9  # SIGKILL: no handler ran, nothing was cleaned up
    assert _status(run_dir)["status"] == "running"
    saved = checkpoint.load(run_dir)
    assert saved["step"] == 9 and saved["sampler"] == {"step": 9, "epoch": 1, "offset": 32}
    assert saved["precision"]["scaler"]["scale"] < 2.0**24  # overflows lowered the loss scale
    assert checkpoint.read(run_dir / checkpoint.PREVIOUS)["step"] == 8

    r = run_fault_worker(args)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "resuming from" in r.stdout and "at step 9" in r.stdout
    done = _status(run_dir)
    assert done["status"] == "completed"
    # the killed attempt wrote no time: its wall up to the checkpoint's step counts, from there
    assert done["attempts"] == 2 and "over 2 attempts" in r.stdout
    assert done["total_wall_time_s"] == pytest.approx(
        done["wall_time_s"] + saved["summary"]["total_wall_time_s"]
    )
    assert_bitwise(final_weights(run_dir), reference["one"])
    assert train_steps(run_dir) == list(range(1, 17))  # steps 10-11 logged once, not twice


@pytest.mark.slow
def test_two_processes_killed_mid_epoch_resume_bitwise_and_on_one_process(tmp_path, reference):
    run_dir = tmp_path / "runs" / "two"
    r = run_fault_worker(resume_args(tmp_path, "two"), nproc=2, kill_at=KILL_AT, kill_rank=1)
    assert r.returncode != 0
    saved = checkpoint.load(run_dir)
    assert saved["step"] == 9 and saved["world_size"] == 2 and len(saved["ranks"]) == 2
    assert not torch.equal(saved["ranks"][0]["cpu"], saved["ranks"][1]["cpu"])  # per-rank RNG

    # a copy of the stopped run resumes on one process accumulating 2 micro-batches: a hardware
    # change the mapping allows; the layout guarantee (tolerance of float reordering) still holds
    one = tmp_path / "one_proc" / "runs" / "two"
    shutil.copytree(run_dir, one)
    r = run_fault_worker(resume_args(tmp_path / "one_proc", "two"))
    assert r.returncode == 0, r.stderr[-3000:]
    assert "saved by 2 processes, resumed on 1" in r.stdout
    for k, v in reference["two"].items():
        torch.testing.assert_close(final_weights(one)[k], v, rtol=1e-5, atol=1e-6, msg=k)

    r = run_fault_worker(resume_args(tmp_path, "two"), nproc=2)  # the same layout: bitwise
    assert r.returncode == 0, r.stderr[-3000:]
    assert_bitwise(final_weights(run_dir), reference["two"])
    assert train_steps(run_dir) == list(range(1, 17))


@pytest.mark.slow
def test_torchrun_restarts_a_group_after_sigkill_and_finishes_with_the_same_weights(
    tmp_path, reference
):
    run_dir = tmp_path / "runs" / "two"
    r = run_fault_worker(
        resume_args(tmp_path, "two"), nproc=2, kill_at=KILL_AT, kill_rank=1, restarts=1
    )
    # both streams whole on failure: the agent's lines and every attempt's workers' (a restarted
    # worker that dies says why on stderr, the steps it reached are on stdout)
    assert r.returncode == 0, f"{r.stdout}\n--- stderr ---\n{r.stderr}"
    assert "Signals.SIGKILL" in r.stderr or "exitcode: -9" in r.stderr  # torchrun saw the kill
    assert "at step 9" in r.stdout  # the restarted group resumed from the checkpoint
    assert _status(run_dir)["status"] == "completed"
    assert_bitwise(final_weights(run_dir), reference["two"])
    assert train_steps(run_dir) == list(range(1, 17))


@pytest.mark.slow
@pytest.mark.parametrize(
    ("keys", "own"),
    [({"local_sgd": 2}, "optimizer"), ({"comm_hook": "powersgd"}, "powersgd")],
    ids=["local_sgd", "powersgd"],
)
def test_state_each_process_holds_alone_survives_a_kill(tmp_path, keys, own):
    """Past the warmup of 4 steps, post-local SGD steps each process with its own momentum and
    PowerSGD keeps each process's error feedback and low-rank factors: the checkpoint holds every
    process's part, and the resumed group ends bitwise where the uninterrupted one does."""
    saved = killed_and_resumed(tmp_path, "two", nproc=2, **keys)
    parts = [rank[own] for rank in saved["ranks"]]
    if own == "optimizer":  # the two processes' momenta differ after local steps
        a, b = (p["state"][0]["momentum_buffer"] for p in parts)
    else:  # so do their error-feedback memories
        assert parts[0]["iter"] == parts[1]["iter"] > 4
        a, b = parts[0]["error_dict"][0], parts[1]["error_dict"][0]
    assert not torch.equal(a, b)


@pytest.mark.slow
def test_cifar10_run_killed_mid_epoch_resumes_to_bitwise_equal_weights(tmp_path):
    """On CIFAR-10 files the pad-crop-flip of each sample is drawn from its stream position on the
    training device, nothing else: a run killed mid-epoch resumes to the uninterrupted weights."""
    write_cifar(tmp_path / "cifar", per_batch=64, n_test=32)  # 320 images: 10 steps per epoch
    keys = {"dataset": "cifar10", "data_dir": str(tmp_path / "cifar"), "epochs": 1.6}  # 16 steps
    r = run_fault_worker(resume_args(tmp_path / "straight", "c", **keys))
    assert r.returncode == 0, r.stderr[-3000:]
    run_dir = tmp_path / "runs" / "c"
    r = run_fault_worker(resume_args(tmp_path, "c", **keys), kill_at=13)
    assert r.returncode == -9
    assert checkpoint.load(run_dir)["step"] == 12  # mid-epoch 2 (checkpoints every 3 steps)
    r = run_fault_worker(resume_args(tmp_path, "c", **keys))
    assert r.returncode == 0, r.stderr[-3000:]
    assert "at step 12" in r.stdout
    assert_bitwise(final_weights(run_dir), final_weights(tmp_path / "straight" / "runs" / "c"))


def _popen(args, nproc=None):
    return start(
        ["train", *args],
        nproc,
        env={"PYTHONUNBUFFERED": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


@pytest.mark.slow
@pytest.mark.parametrize("nproc", [None, 2], ids=["one_process", "torchrun_two_processes"])
def test_sigterm_stops_at_an_agreed_step_with_a_checkpoint_and_resume_is_bitwise(tmp_path, nproc):
    """A scheduler's pre-emption: SIGTERM to the process (to torchrun's agent, which passes it on
    to its workers). The run stops at the next metric flush, on the same step in every process,
    writes a checkpoint there (here mid-epoch: only epoch checkpoints otherwise) and says so."""
    keys = {"epochs": 10, "checkpoint_every": 0}  # 80 steps, flushes every 2
    straight = _popen(resume_args(tmp_path / "straight", "run", **keys), nproc)
    assert straight.wait(timeout=300) == 0, straight.stdout.read()[-3000:]
    run_dir = tmp_path / "runs" / "run"
    proc = _popen(resume_args(tmp_path, "run", **keys), nproc)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:  # wait until training is under way, then pre-empt it
        metrics = run_dir / "metrics.jsonl"
        if metrics.exists() and '"kind": "eval"' in metrics.read_text():  # past epoch 1
            break
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    out = proc.communicate(timeout=120)[0]
    assert proc.returncode != 0
    if nproc is None:
        assert proc.returncode == 143
    summary = _status(run_dir)
    assert summary["status"] == "interrupted", out[-3000:]
    stopped = summary["steps"]
    assert 8 < stopped < 80 and stopped % 2 == 0  # at a flush
    assert f"stopped after step {stopped}, checkpoint written" in out
    assert checkpoint.load(run_dir)["step"] == stopped
    if stopped % 8:  # mid-epoch: the stop wrote its own checkpoint
        assert checkpoint.read(run_dir / checkpoint.PREVIOUS)["step"] == stopped // 8 * 8

    resumed = _popen(resume_args(tmp_path, "run", **keys), nproc)
    out = resumed.communicate(timeout=300)[0]
    assert resumed.returncode == 0, out[-3000:]
    assert f"at step {stopped}" in out
    final = checkpoint.read(run_dir / checkpoint.NAME)
    want = checkpoint.read(tmp_path / "straight" / "runs" / "run" / checkpoint.NAME)
    assert final["step"] == want["step"] == 80
    assert_bitwise(final["model"], want["model"])


# -- damaged and unsafe checkpoints ---------------------------------------------------------------


def _state(step: int) -> dict:
    return {"model": {"w": torch.full((64,), float(step))}, "step": step}


def test_save_keeps_the_previous_checkpoint_until_the_new_one_is_complete(tmp_path, monkeypatch):
    checkpoint.save(tmp_path, _state(1))
    checkpoint.save(tmp_path, _state(2))
    assert checkpoint.load(tmp_path)["step"] == 2
    assert checkpoint.read(tmp_path / checkpoint.PREVIOUS)["step"] == 1

    def crash_mid_write(obj, f):
        f.write(b"PK\x03\x04partial")
        raise OSError("disk full")

    monkeypatch.setattr(torch, "save", crash_mid_write)
    with pytest.raises(OSError, match="disk full"):
        checkpoint.save(tmp_path, _state(3))
    assert checkpoint.load(tmp_path)["step"] == 2  # the crash cost nothing already written
    assert checkpoint.read(tmp_path / checkpoint.PREVIOUS)["step"] == 1


@pytest.mark.parametrize("damage", ["truncate", "flip_a_byte", "empty", "not_a_checkpoint"])
def test_damaged_checkpoint_is_named_and_the_previous_one_is_used(tmp_path, damage, capsys):
    checkpoint.save(tmp_path, _state(1))
    checkpoint.save(tmp_path, _state(2))
    path = tmp_path / checkpoint.NAME
    raw = path.read_bytes()
    if damage == "truncate":
        path.write_bytes(raw[: len(raw) // 2])
    elif damage == "flip_a_byte":  # inside the tensor data: only the digest can tell
        i = raw.index(torch.full((64,), 2.0).numpy().tobytes())
        path.write_bytes(raw[:i] + bytes([raw[i] ^ 0x40]) + raw[i + 1 :])
    elif damage == "empty":
        path.write_bytes(b"")
    else:
        torch.save({"weights": torch.zeros(3)}, path)
    state = checkpoint.load(tmp_path)
    (line,) = capsys.readouterr().err.splitlines()  # one lbsgd line, no Python warning
    assert line.startswith(f"lbsgd: warning: checkpoint '{path}'"), line
    assert line.endswith(f"falling back to '{tmp_path / checkpoint.PREVIOUS}' (step 1)"), line
    assert state["step"] == 1
    assert torch.equal(state["model"]["w"], torch.full((64,), 1.0))

    (tmp_path / checkpoint.PREVIOUS).write_bytes(b"garbage")
    with pytest.raises(checkpoint.CheckpointError, match="no usable checkpoint") as err:
        checkpoint.load(tmp_path)
    assert str(path) in str(err.value) and checkpoint.PREVIOUS in str(err.value)
    assert "\n" not in str(err.value)


class _Payload:
    def __reduce__(self):
        return (Path.touch, (Path(os.environ["LBSGD_TEST_PWNED"]),))


def test_checkpoints_load_without_unpickling_code(tmp_path, monkeypatch):
    marker = tmp_path / "pwned"
    monkeypatch.setenv("LBSGD_TEST_PWNED", str(marker))
    path = tmp_path / checkpoint.NAME
    with open(path, "wb") as f:
        torch.save({"model": {}, "step": 1, "payload": _Payload()}, f, pickle_module=pickle)
    with pytest.raises(checkpoint.CheckpointError, match=f"checkpoint '{path}' cannot be loaded"):
        checkpoint.load(tmp_path)
    assert not marker.exists()  # weights_only=True: the payload's code never ran


# 8 steps (256 samples, batch 32), checkpoints at steps 3, 6 and 8
EIGHT_STEPS_CHECKPOINT_EVERY_3 = {
    "synthetic_train": 256,
    "batch_size": 32,
    "bn_batch": 8,
    "epochs": 1,
    "checkpoint_every": 3,
}


def resumed_from_step_6(tiny, name: str, **keys) -> tuple[dict, dict]:
    """(resumed, uninterrupted) checkpoints of the 8-step run ``keys``: the resumed one trained
    to the end, then left as a crash leaves a run (newest checkpoint, step 8's, cut short, step 6
    intact, status failed) and resumed, which falls back to step 6."""
    keys = {**EIGHT_STEPS_CHECKPOINT_EVERY_3, **keys}
    reference = tiny(name=f"{name}_straight", **keys)
    assert train(reference)["status"] == "completed"
    cfg = tiny(name=f"{name}_damaged", **keys)
    train(cfg)
    run_dir = cfg.run_dir()
    path = run_dir / checkpoint.NAME
    path.write_bytes(path.read_bytes()[:1000])
    summary = json.loads((run_dir / "summary.json").read_text())
    (run_dir / "summary.json").write_text(json.dumps({**summary, "status": "failed"}))
    assert train(cfg.replace(resume=True))["status"] == "completed"
    return checkpoint.load(run_dir), checkpoint.load(reference.run_dir())


def test_resume_falls_back_past_a_truncated_newest_checkpoint(tiny):
    got, want = resumed_from_step_6(tiny, "sgd")
    assert_bitwise(got["model"], want["model"])


@pytest.mark.parametrize("optimizer", ["lamb", "adamw"])
def test_adam_family_resumes_mid_run_to_bitwise_equal_weights(tiny, optimizer):
    """The moments and the step count of the bias correction travel in the checkpoint: a run
    resumed from step 6 of 8 ends with the weights and moments of the uninterrupted run."""
    got, want = resumed_from_step_6(
        tiny, optimizer, optimizer=optimizer, base_lr=0.01, weight_decay=0.01
    )
    assert_bitwise(got["model"], want["model"])
    moments = got["optimizer"]["state"]
    assert moments and all(set(s) == {"exp_avg", "exp_avg_sq"} for s in moments.values())
    for key, state in want["optimizer"]["state"].items():
        assert_bitwise(moments[key], state)
    assert [g["step"] for g in got["optimizer"]["param_groups"]] == [8, 8]


def test_resume_is_refused_when_the_train_split_changed(tiny):
    """A file dataset's folder that gained or lost images: the checkpoint's sampler position does
    not exist in the new stream, so the resume is refused with one line before any work."""
    cfg = tiny(name="grown", epochs=0.5)
    train(cfg)
    state = checkpoint.load(cfg.run_dir())

    def sampler(num_samples: int) -> StepSampler:
        return StepSampler(
            num_samples=num_samples,
            batch_size=cfg.batch_size,
            micro_batch=16,
            rank=0,
            world_size=1,
            seed=cfg.seed,
            total_steps=100,
        )

    with pytest.raises(ConfigError, match="train split of 512 samples, this run's has 520"):
        checkpoint.check_compatible(cfg, state, sampler(state["num_train"] + 8))
    # the unchanged split is accepted
    checkpoint.check_compatible(cfg, state, sampler(state["num_train"]))


@pytest.mark.slow
def test_a_local_sgd_run_continues_only_on_the_number_of_processes_it_was_trained_by(tmp_path):
    """Local SGD averages K models: K = 2 is another experiment than the K = 1 the run was trained
    by, so resume=true on 2 processes is refused in one line before any work (every file as it
    was), where a synchronous run, the same on any layout, is found complete."""
    local = {**RESUME_KEYS, "local_sgd": 2, "out_dir": str(tmp_path), "name": "k1", "epochs": 1}
    assert lbsgd(["train", *as_args(local)]).returncode == 0
    run_dir = tmp_path / "runs" / "k1"
    before = {p.name: p.read_bytes() for p in run_dir.iterdir()}
    r = lbsgd(["train", *as_args(local)], nproc=2)
    refusal = (
        f"lbsgd: error: local_sgd=2: {run_dir} was trained by 1 processes and this launch has 2; "
        "the number of processes is part of local_sgd's mathematics: launch 1, or choose another "
        "name= or out_dir="
    )
    errors = [line for line in r.stderr.splitlines() if line.startswith("lbsgd: error:")]
    assert r.returncode != 0 and errors and set(errors) == {refusal}, r.stderr[-3000:]
    assert "lbsgd: run" not in r.stdout  # no run announced, no step taken
    assert {p.name: p.read_bytes() for p in run_dir.iterdir()} == before
    sync = {**local, "local_sgd": 0, "name": "sync"}
    assert lbsgd(["train", *as_args(sync)]).returncode == 0
    r = lbsgd(["train", *as_args(sync)], nproc=2)
    assert r.returncode == 0 and "already complete; nothing to do" in r.stdout, r.stderr[-3000:]
