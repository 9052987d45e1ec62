"""The asynchronous parameter server (async_ps=true, lbsgd.parameter_server) under torchrun (gloo).

The runs train on 256 easy synthetic images, one worker's batch of 32 (two BN groups of 16), 8
updates per epoch: ResNet-8 where the result is compared with synchronous SGD, a one-hidden-layer
MLP with BN (a plugin; it learns within a few epochs, where ResNet-8 is still on its initial
plateau) where the loss must fall. The slowed worker (tests/ps_worker.py: ``LBSGD_TEST_PS_SLOW_RANK``
and ``LBSGD_TEST_PS_SLOW_S``) sleeps before each gradient, holding weights that the other worker's
updates make stale, so that staleness > 0 is certain rather than left to the scheduler.
"""

import json
import math
from collections import Counter
from pathlib import Path

import pytest
import torch
from conftest import lbsgd, used_keys
from helpers import PROGRESS, RESUME_KEYS, assert_ends_with_its_summary, initial_weights

from lbsgd import checkpoint, entry, parameter_server, rundir
from lbsgd.config import ConfigError, derive, from_dict, micro_batch_candidates

HERE = Path(__file__).parent
WORKER = str(HERE / "ps_worker.py")

# RESUME_KEYS, tests/test_resume.py's 16-step run, without what the parameter server refuses
# (resume, step checkpoints) or does per update (evaluation every epoch), with BN groups of 16: one
# micro-batch of 32 per task
KEYS = {
    k: v
    for k, v in RESUME_KEYS.items()
    if k not in ("resume", "checkpoint_every", "eval_every", "micro_batch", "epochs")
}
KEYS |= {"bn_batch": 16, "warmup_epochs": 0.25}


def _args(out: Path, name: str, **extra) -> list[str]:
    keys = used_keys({**KEYS, "out_dir": str(out), "name": name, **extra})
    return [f"{k}={v}" for k, v in keys.items()]


def _records(run_dir: Path, kind: str) -> list[dict]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["kind"] == kind]


@pytest.mark.slow
def test_one_worker_is_synchronous_sgd_on_one_process(tmp_path):
    """1 server + 1 worker: every gradient is computed on the server's current weights (staleness
    0) from the batch of the same step, so the run is synchronous SGD: the weights and BN running
    statistics of a one-process run with the default Nesterov momentum and weight decay, bitwise
    (the gradient travels as float32, exactly). Both hold 64 of the 256 images out (holdout): the
    server evaluates them as the synchronous run does, through the same evaluation."""
    keys = {"epochs": 1, "holdout": 64}  # 192 images to train on: 6 steps
    ps = lbsgd(["train", *_args(tmp_path, "ps", async_ps="true", **keys)], nproc=2)
    assert ps.returncode == 0, ps.stderr[-3000:]
    one = lbsgd(["train", *_args(tmp_path, "one", **keys)])
    assert one.returncode == 0, one.stderr[-3000:]
    summary = json.loads((tmp_path / "runs" / "ps" / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["steps"] == 6
    rundir.check_summary(summary)  # the declared shape, which the synchronous loop fills too
    sync = json.loads((tmp_path / "runs" / "one" / "summary.json").read_text())
    for key in ("test_loss", "val_loss", "val_top1_error_pct"):
        assert summary["final"][key] == pytest.approx(sync["final"][key], rel=1e-5), key
    assert [r.keys() for r in _records(tmp_path / "runs" / "ps", "eval")] == [
        r.keys() for r in _records(tmp_path / "runs" / "one", "eval")
    ]
    assert summary["async_ps"]["staleness"]["histogram"] == {"0": 6}
    assert [r["task"] for r in _records(tmp_path / "runs" / "ps", "train")] == list(range(6))
    got = checkpoint.load(tmp_path / "runs" / "ps")["model"]
    want = checkpoint.load(tmp_path / "runs" / "one")["model"]
    assert set(got) == set(want)
    for key, value in want.items():  # parameters and BN buffers, bitwise: the same operations
        assert torch.equal(got[key], value), key  # in the same order, on the same CPU
    init = initial_weights()
    moved = max((v - init[k]).abs().max().item() for k, v in got.items() if v.is_floating_point())
    assert moved > 1e-2  # it trained: the equality is not that of untouched models


def _torchrun(args: list[str], nproc: int, env: dict[str, str], timeout: int = 300):
    return lbsgd(["train", *args], nproc, program=[WORKER], env=env, timeout=timeout)


PLUGIN = """import torch
from lbsgd import register_model

@register_model("tiny_mlp")
def tiny_mlp(cfg, num_classes, image_size):
    return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * image_size**2, 64),
                               torch.nn.BatchNorm1d(64), torch.nn.ReLU(),
                               torch.nn.Linear(64, num_classes))
"""


@pytest.fixture(scope="module")
def slowed_run(tmp_path_factory):
    """3 processes (server + 2 workers), worker 2 slowed by 0.2 s per gradient; the MLP with plain
    SGD (momentum 0, no weight decay) so that the last update can be checked by hand; 6 epochs."""
    out = tmp_path_factory.mktemp("ps")
    (out / "tiny_mlp.py").write_text(PLUGIN)
    last = out / "last_update.pt"
    env = {
        "LBSGD_TEST_PS_SLOW_RANK": "2",
        "LBSGD_TEST_PS_SLOW_S": "0.2",
        "LBSGD_TEST_PS_LAST_UPDATE": str(last),
    }
    args = _args(
        out,
        "slowed",
        epochs=6,
        async_ps="true",
        momentum=0,
        nesterov="false",
        weight_decay=0,
        plugins=out / "tiny_mlp.py",
        model="tiny_mlp",
    )
    r = _torchrun(args, nproc=3, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    return out / "runs" / "slowed", last, r.stdout


@pytest.mark.slow
def test_three_processes_apply_exactly_total_steps_updates_once_each(slowed_run):
    run_dir, _, stdout = slowed_run
    assert "async_ps: server rank 0, 2 worker(s)" in stdout
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed"
    assert summary["steps"] == summary["total_steps"] == 48
    train = _records(run_dir, "train")
    assert [r["step"] for r in train] == list(range(1, 49))
    assert sorted(r["task"] for r in train) == list(range(48))  # every batch once: 6 epochs
    assert summary["async_ps"]["discarded_gradients"] == 0
    per_worker = Counter(r["worker"] for r in train)
    assert set(per_worker) == {1, 2}  # the slowed worker's gradients are applied too
    assert summary["async_ps"]["updates_per_worker"] == {str(w): c for w, c in per_worker.items()}
    assert checkpoint.load(run_dir)["step"] == 48
    assert [r["step"] for r in _records(run_dir, "eval")] == [8, 16, 24, 32, 40, 48]  # epoch ends


@pytest.mark.slow
def test_the_server_alone_prints_progress_at_epoch_ends_and_the_ending_line(slowed_run):
    """Without a terminal: a plain line at each epoch's end and one ending line with summary.json's
    numbers, from the server (rank 0), not from its workers."""
    run_dir, _, stdout = slowed_run
    assert_ends_with_its_summary(stdout, run_dir, "completed")
    steps = [int(m[0]) for m in PROGRESS.findall(stdout)]
    assert {8, 16, 24, 32, 40, 48} <= set(steps) and len(steps) == len(set(steps)), stdout


@pytest.mark.slow
def test_slowed_worker_gradients_are_stale_and_summary_holds_their_distribution(slowed_run):
    run_dir, _, _ = slowed_run
    train = _records(run_dir, "train")
    tau = [r["staleness"] for r in train]
    assert min(tau) >= 0
    assert max(r["staleness"] for r in train if r["worker"] == 2) > 0
    measured = json.loads((run_dir / "summary.json").read_text())["async_ps"]["staleness"]
    assert measured["histogram"] == {str(t): c for t, c in sorted(Counter(tau).items())}
    assert measured["mean"] == pytest.approx(sum(tau) / len(tau))
    assert measured["max"] == max(tau)


@pytest.mark.slow
def test_asynchronous_training_lowers_the_loss(slowed_run):
    run_dir, _, _ = slowed_run
    losses = [r["loss"] for r in _records(run_dir, "train")]
    first, last = sum(losses[:8]) / 8, sum(losses[-8:]) / 8
    assert last < 0.85 * first, (first, last)  # measured: 2.37 -> 1.78 (synchronous: 1.75)


@pytest.mark.slow
def test_final_checkpoint_holds_the_weights_of_the_last_update(slowed_run):
    """Plain SGD: the last update is W_T = W_{T-1} − η_{T-1} g with the gradient g it received;
    the checkpoint holds W_T (bitwise) and its BN running statistics."""
    run_dir, last_path, _ = slowed_run
    last = torch.load(last_path, weights_only=True)
    model = checkpoint.load(run_dir)["model"]
    for key, value in last["after"].items():
        assert torch.equal(model[key], value), key
    params = last["params"]  # in the order of the message's gradients
    grads = last["payload"][1 + last["n_sums"] :].split([last["before"][k].numel() for k in params])
    moved = 0.0
    for key, g in zip(params, grads, strict=True):
        want = last["before"][key] - last["lr"] * g.view_as(last["before"][key])
        torch.testing.assert_close(last["after"][key], want, rtol=1e-6, atol=1e-7, msg=key)
        moved = max(moved, (last["after"][key] - last["before"][key]).abs().max().item())
    assert moved > 0  # the last gradient did change the weights


@pytest.mark.slow
def test_diverged_run_stops_every_worker_and_records_the_status(tmp_path):
    """A non-finite loss: the server applies nothing more, answers each worker's next gradient
    with STOP (discarding it), and the run ends, recorded as diverged, without a checkpoint."""
    r = lbsgd(
        ["train", *_args(tmp_path, "boom", epochs=2, async_ps="true", base_lr=1e8, warmup="none")],
        nproc=3,
    )
    assert r.returncode != 0
    assert "run diverged (non-finite loss)" in r.stdout
    summary = json.loads((tmp_path / "runs" / "boom" / "summary.json").read_text())
    assert summary["status"] == "diverged" and summary["steps"] < summary["total_steps"]
    applied = _records(tmp_path / "runs" / "boom", "train")
    assert len(applied) == summary["steps"] and all(math.isfinite(r["loss"]) for r in applied)
    assert summary["async_ps"]["discarded_gradients"] >= 1  # the non-finite one at least
    assert checkpoint.candidates(tmp_path / "runs" / "boom") == []


def test_staleness_summary_is_the_histogram_mean_and_max():
    assert parameter_server.staleness_summary([0, 2, 0, 1, 2, 2]) == {
        "histogram": {"0": 2, "1": 1, "2": 3},
        "mean": 7 / 6,
        "max": 2,
    }
    assert parameter_server.staleness_summary([]) == {"histogram": {}, "mean": None, "max": None}


def test_one_update_is_one_workers_whole_batch_whatever_the_process_count():
    cfg = from_dict({**KEYS, "async_ps": True})
    d = derive(cfg, world_size=3, num_train=256)  # 2 workers: not 32 / 3
    assert (d.world_size, d.micro_batch, d.accum_steps, d.total_steps) == (3, 16, 2, 720)
    assert micro_batch_candidates(cfg, 3) == [32, 16]


@pytest.mark.parametrize(
    "key, value, names",
    [
        ("local_sgd", 2, "local_sgd=2"),
        ("comm_hook", "fp16", "comm_hook=fp16"),
        ("noise_scale", True, "noise_scale=true"),
        ("staleness", 1, "staleness=1"),
        ("precision", "fp16", "precision=fp16"),
        ("resume", True, "cannot resume"),
        ("checkpoint_every", 3, "checkpoint_every=3"),
    ],
)
def test_bad_input_with_async_ps_is_refused_in_one_line(key, value, names):
    with pytest.raises(ConfigError) as e:
        from_dict({**KEYS, "async_ps": True, key: value})
    assert "\n" not in str(e.value) and names in str(e.value) and "async_ps" in str(e.value)
    from_dict({**KEYS, key: value})  # without async_ps the value itself is fine


def test_one_process_is_refused_before_any_work(tiny, monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    cfg = tiny(async_ps=True)
    with pytest.raises(ConfigError, match=r"^async_ps=true needs torchrun with at least 2 "):
        entry.train(cfg)
    assert not Path(cfg.out_dir).exists()
