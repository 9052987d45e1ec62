"""Communication hooks and local SGD (lbsgd.comm) under torchrun with gloo on CPU.

Two nodes are two torchrun agents on this machine (static rendezvous, node ranks 0 and 1), each
with 2 processes, so LOCAL_WORLD_SIZE = 2 and the world is 4: the layout the hierarchical
all-reduce is built for.
"""

import json
import subprocess
from pathlib import Path

import pytest
import torch
from conftest import as_args, lbsgd, subprocess_env, tiny_subset
from helpers import SIX_STEP_ARGS

from lbsgd import checkpoint, cli, config, launch
from lbsgd.config import ConfigError

HERE = Path(__file__).parent

# SIX_STEP_ARGS, test_distributed's tiny run (6 optimizer steps, the first 2 of them warmup,
# device=cpu), with BN groups of 8
COMMON = [k if not k.startswith("bn_batch=") else "bn_batch=8" for k in SIX_STEP_ARGS]


def torchrun(target: list[str], nodes: int, per_node: int, cwd: Path, timeout: int = 240):
    """Run ``target`` on ``nodes`` torchrun agents of ``per_node`` processes; every agent's result."""
    env = subprocess_env()
    endpoint = f"{launch.HOST}:{launch.free_port()}"
    agents = [
        subprocess.Popen(
            [*launch.torchrun(per_node, nnodes=nodes, endpoint=endpoint, node_rank=i), *target],
            cwd=cwd,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for i in range(nodes)
    ]
    outs = [a.communicate(timeout=timeout)[0] for a in agents]
    for a, out in zip(agents, outs, strict=True):
        assert a.returncode == 0, out[-3000:]
    return outs


@pytest.mark.slow
def test_every_hook_averages_gradients_like_the_flat_all_reduce(tmp_path):
    torchrun([str(HERE / "comm_worker.py"), str(tmp_path)], nodes=2, per_node=2, cwd=tmp_path)
    got = {p.stem: json.loads(p.read_text()) for p in tmp_path.glob("*.json")}
    assert {g["world"] for g in got.values()} == {4}
    assert {g["local_world"] for g in got.values()} == {2}
    tolerance = {  # relative difference of every gradient tensor to the exact mean
        "none": 1e-6,
        "hierarchical": 1e-6,  # the same sum, added in another order
        "parameter_server": 1e-6,
        "fp16": 2e-3,  # the bucket rounded to fp16 (11-bit significand) before and after the sum
        "bf16": 1.6e-2,  # bf16 has an 8-bit significand
        "powersgd": 1e-4,  # exact for a rank-1 gradient with rank-1 factors
    }
    assert set(got) == set(tolerance)
    for hook, tol in tolerance.items():
        assert got[hook]["rel_diff"] < tol, (hook, got[hook])
    assert got["fp16"]["rel_diff"] > 0 and got["bf16"]["rel_diff"] > got["fp16"]["rel_diff"]


def train(tmp_path: Path, name: str, nodes: int, per_node: int, *keys: str) -> dict:
    target = ["-m", "lbsgd", "train", *COMMON, f"name={name}", f"out_dir={tmp_path}", *keys]
    torchrun(target, nodes=nodes, per_node=per_node, cwd=tmp_path)
    return checkpoint.load(tmp_path / "runs" / name)["model"]


def max_diff(a: dict, b: dict) -> float:
    return max((a[k].double() - b[k].double()).abs().max().item() for k in a)


@pytest.mark.slow
def test_hierarchical_training_ends_with_the_weights_of_the_flat_all_reduce(tmp_path):
    flat = train(tmp_path, "flat", 1, 4, "micro_batch=8")
    hier = train(tmp_path, "hier", 2, 2, "micro_batch=8", "comm_hook=hierarchical")
    ps = train(tmp_path, "ps", 1, 4, "micro_batch=8", "comm_hook=parameter_server")
    for k in flat:
        torch.testing.assert_close(hier[k], flat[k], rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(ps[k], flat[k], rtol=1e-5, atol=1e-6)
    cfg = (tmp_path / "runs" / "hier" / "config.yaml").read_text()
    assert "comm_hook: hierarchical" in cfg


@pytest.mark.slow
def test_local_sgd_averaging_every_step_is_the_all_reduce_and_longer_periods_are_not(tmp_path):
    # SGD with momentum and weight decay is linear in the gradient, so averaging the parameters
    # after every step gives what averaging the gradients gives; every 3 steps it does not.
    ddp = train(tmp_path, "ddp", 1, 2, "micro_batch=16")
    every = train(tmp_path, "every", 1, 2, "micro_batch=16", "local_sgd=1")
    period3 = train(tmp_path, "period3", 1, 2, "micro_batch=16", "local_sgd=3")
    assert max_diff(every, ddp) < 1e-5
    assert max_diff(period3, ddp) > 1e-3


def test_comm_keys_refuse_impossible_settings_in_one_line():
    c = config.from_dict({"comm_hook": "hierarchical", "batch_size": 48, "bn_batch": 8})
    with pytest.raises(ConfigError, match="LOCAL_WORLD_SIZE=4") as e:
        config.check_world(c, 6, 4)
    assert "\n" not in str(e.value)
    config.check_world(c, 6, 3)  # 2 nodes of 3: micro-batch 8, 6 processes
    assert config.accum_steps(c, 6) == 1
    with pytest.raises(ConfigError, match="local_sgd=4 .*comm_hook=none"):
        config.from_dict({"local_sgd": 4, "comm_hook": "fp16"})
    with pytest.raises(ConfigError, match="comm_hook"):
        config.from_dict({"comm_hook": "ring"})
    with pytest.raises(ConfigError, match="powersgd_rank=0"):
        config.from_dict({"powersgd_rank": 0})


@pytest.mark.slow
def test_bench_allreduce_measures_every_size_and_path_and_fits_alpha_beta(tmp_path):
    out = tmp_path / "ar.json"
    r = lbsgd(
        [
            "bench",
            "allreduce",
            "--nproc=2",
            "--nodes=2",
            "--min-bytes=1024",
            "--max-bytes=1048576",
            "--iters=3",
            f"--out={out}",
        ],
        cwd=tmp_path,
    )
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    res = json.loads(out.read_text())
    assert (res["world_size"], res["nodes"], res["processes_per_node"]) == (2, 2, 1)
    assert [(row["path"], row["bytes"]) for row in res["rows"]] == [
        (p, n)
        for n in (1024, 4096, 16384, 65536, 262144, 1048576)
        for p in ("flat", "hierarchical")
    ]
    for row in res["rows"]:  # NCCL-tests' bus bandwidth: bytes/s x 2(p-1)/p, p = 2
        assert row["bus_bandwidth_Bps"] == pytest.approx(row["bytes"] / row["seconds"])
    assert set(res["fits"]) == {"flat_ring", "hierarchical_effective"}
    for fit in res["fits"].values():  # a fit, or (timings too noisy at these sizes) why not
        assert (
            (fit["alpha_s"] >= 0 and fit["bandwidth_Bps"] > 0)
            if fit["alpha_s"] is not None
            else "no positive bandwidth" in fit["error"]
        )


@pytest.mark.slow
def test_bench_train_breakdown_times_each_phase_per_layout(tmp_path):
    out = tmp_path / "steps.json"
    keys = tiny_subset(["synthetic_difficulty"], synthetic_train=256, synthetic_test=64, width=4)
    r = lbsgd(
        [
            "bench",
            "train",
            "--nproc=1,2",
            "--comm-hooks=none,fp16",
            "--bucket-caps=1",
            "--steps=3",
            f"--out={out}",
            *as_args(keys),
        ],
        cwd=tmp_path,
    )
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    rows = json.loads(out.read_text())["rows"]
    assert [(row["nproc"], row["comm_hook"]) for row in rows] == [
        (1, "none"),
        (2, "none"),
        (2, "fp16"),
    ]
    for row in rows:
        assert row["step"] == pytest.approx(
            sum(row[k] for k in ("data", "forward", "backward", "optimizer"))
        )
        assert row["img_per_s"] == pytest.approx(row["batch_size"] / row["step"])
        assert row["micro_batch"] * row["nproc"] == row["batch_size"]  # weak scaling
    assert {row["micro_batch"] for row in rows} == {32}
    assert rows[0]["grad_bytes"] == rows[1]["grad_bytes"] > 0


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["allreduce", "--nproc=3", "--nodes=2"], "--nproc=3"),
        (["train", "--nproc=1,0"], "--nproc=0"),
        (["train", "--nproc=2", "--comm-hooks=ring"], "'ring'"),
    ],
)
def test_bench_commands_refuse_bad_layouts_in_one_line(tmp_path, monkeypatch, capsys, args, named):
    monkeypatch.chdir(tmp_path)  # where the benchmarks would write their default output
    code = cli.main(["bench", *args])
    err = capsys.readouterr().err
    assert code == cli.EXIT_BAD_INPUT and named in err and err.count("\n") == 1
    assert not list(tmp_path.iterdir())


# A worker that never exits beside one that has exited 0 (a deadlock at teardown, as gloo's under
# torch 2.11 was): rank 0 records its pid, as run_worker does, then sleeps.
_HANGING_WORKER = (
    "import os, sys, time; from pathlib import Path; from lbsgd.bench.torchrun import run_worker\n"
    "if os.environ['RANK'] == '0':\n"
    "    Path(os.environ['LBSGD_WORKER_STATUS_DIR'], 'rank0.pid').write_text(str(os.getpid()))\n"
    "    time.sleep(600)\n"
    "else:\n"
    "    run_worker(['keys'])\n"
)


@pytest.mark.slow
def test_a_worker_that_hangs_after_another_exited_is_stopped_and_named_in_one_line(monkeypatch):
    from lbsgd.bench import torchrun as supervised

    monkeypatch.setattr(supervised, "WORKER", _HANGING_WORKER)
    with pytest.raises(SystemExit) as e:
        supervised.torchrun(1, 2, [], what="hang", grace_s=3)
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("hang")
    assert "rank 0 still running 3 s after a worker exited (killed)" in msg
    assert "rank 1 exited with 0" in msg
