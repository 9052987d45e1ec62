"""lbsgd verify: replays of committed runs, bitwise equal or not."""

import json
import shutil
import sys

import pytest
from conftest import TINY, as_args, lbsgd, subprocess_env

from lbsgd import isa
from lbsgd.lab import verify

CAP = "avx2" if {"avx2", "fma"} <= set(isa.cpu_flags() or []) else "native"


@pytest.fixture(scope="module")
def committed(tmp_path_factory):
    """A results folder holding one TINY run, trained by the CLI as a study's runs are."""
    root = tmp_path_factory.mktemp("committed") / "results"
    keys = {**TINY, "out_dir": str(root), "study": "tiny", "cpu_isa": CAP}
    r = lbsgd(["train", *as_args(keys)], env=dict.fromkeys(isa.VARIABLES))  # no cap inherited
    assert r.returncode == 0, r.stderr[-3000:]
    return root


@pytest.fixture
def replay_env(monkeypatch):
    """The replays' processes: this checkout's lbsgd, one thread, no caps set by hand."""
    for k, v in subprocess_env().items():
        monkeypatch.setenv(k, v)
    for k in isa.VARIABLES:
        monkeypatch.delenv(k, raising=False)


@pytest.mark.slow
def test_verify_reports_bitwise_equal_for_a_run_it_replays(committed, replay_env, capsys):
    assert verify.main(str(committed), 1) == 0
    out = capsys.readouterr().out
    assert "level: bitwise equal" in out and "1 replays: 1 bitwise equal" in out
    assert f"same CPU model, same caps (cpu_isa={CAP}" in out
    assert not list(committed.glob("tiny/*/*.log"))  # nothing written into the committed results


@pytest.mark.slow
def test_verify_reports_a_difference_when_a_committed_value_was_altered(
    committed, replay_env, tmp_path, capsys
):
    altered = tmp_path / "results"
    shutil.copytree(committed, altered)
    metrics = next(altered.glob("tiny/*/metrics.jsonl"))
    lines = [json.loads(line) for line in metrics.read_text().splitlines()]
    first_eval = next(rec for rec in lines if rec["kind"] == "eval")
    first_eval["top1_error_pct"] += 1e-9
    metrics.write_text("".join(json.dumps(rec) + "\n" for rec in lines))
    assert verify.main(str(altered), 1) == 1
    out = capsys.readouterr().out
    assert f"differs, first at step {first_eval['step']}: eval top1_error_pct" in out
    assert "no seed spread (one seed in its group)" in out
    assert "level: inconsistent (its group has one seed" in out
    assert "1 replays: 0 bitwise equal, 0 consistent, 1 inconsistent" in out


# -- the choice, the comparison and the spread, on hand-made runs (no training) -------------


def _run(root, study, name, *, seed=0, batch=64, wall=10.0, top1=50.0, eid=None, steps=()):
    run = root / study / name
    run.mkdir(parents=True)
    (run / "config.yaml").write_text(f"seed: {seed}\nbatch_size: {batch}\nstudy: {study}\n")
    summary = {
        "status": "completed",
        "experiment_id": eid or f"{batch}-{seed}",
        "wall_time_s": wall,
        "final": {"top1_error_pct": top1},
        "environment": {"device": "cpu"},
    }
    (run / "summary.json").write_text(json.dumps(summary))
    records = [
        {
            "kind": "train",
            "step": s,
            "lr": 0.1,
            "loss": loss,
            "loss_scale": 1.0,
            "img_per_s": 100.0 + s,
        }
        for s, loss in steps
    ]
    (run / "metrics.jsonl").write_text("".join(json.dumps(rec) + "\n" for rec in records))
    return run


def test_sample_takes_the_cheapest_run_of_each_study_once_cheapest_first(tmp_path):
    _run(tmp_path, "a", "a1", wall=30)
    _run(tmp_path, "a", "a2", wall=20, seed=1)
    _run(tmp_path, "b", "b1", wall=20, seed=1, eid="64-1")  # a copy of a2: counted once
    _run(tmp_path, "b", "b2", wall=25, seed=2)
    _run(tmp_path, "c", "c1", wall=5, seed=3)
    runs = verify.find_runs(tmp_path)
    assert [f"{r.study}/{r.name}" for r in verify.sample(runs, 3)] == ["c/c1", "a/a2", "b/b2"]
    assert [r.name for r in verify.sample(runs, 1)] == ["c1"]


def test_runs_are_replayed_on_their_processes_and_parameter_server_runs_not_at_all(tmp_path):
    """A run of several processes (local SGD, BMUF depend on their number) is replayed under
    torchrun on as many; a parameter-server run (timing-dependent) is no candidate."""
    _run(tmp_path, "a", "one", wall=30)
    for name, extra in (
        ("two", {"environment": {"device": "cpu", "world_size": 2}}),
        ("ps", {"async_ps": {"workers": 2}}),
    ):
        run = _run(tmp_path, "a", name, wall=1, seed=len(name))
        summary = json.loads((run / "summary.json").read_text())
        (run / "summary.json").write_text(json.dumps({**summary, **extra}))
    runs = {r.name: r for r in verify.find_runs(tmp_path)}
    assert sorted(runs) == ["one", "two"] and runs["two"].processes == 2
    one, two = (verify.replay_command(runs[n], tmp_path / "replays") for n in ("one", "two"))
    assert one[:4] == [sys.executable, "-m", "lbsgd", "train"]
    assert two[:3] == [sys.executable, "-m", "torch.distributed.run"]
    assert "--nproc-per-node=2" in two and two[two.index("-m", 3) :][:3] == ["-m", "lbsgd", "train"]


@pytest.mark.slow
def test_verify_replays_a_two_process_local_sgd_run_bitwise(tmp_path, replay_env, capsys):
    """Post-local SGD on 2 gloo processes (2 local steps after the warmup), trained by torchrun as
    a study's runs are, replays bitwise equal on 2 processes."""
    root = tmp_path / "results"
    keys = {**TINY, "out_dir": str(root), "study": "local", "cpu_isa": CAP, "local_sgd": 2}
    r = lbsgd(["train", *as_args(keys)], nproc=2, env=dict.fromkeys(isa.VARIABLES))
    assert r.returncode == 0, r.stderr[-3000:]
    assert verify.main(str(root), 1) == 0
    out = capsys.readouterr().out
    assert "local/" in out and "bitwise equal" in out, out


def test_machine_match_says_what_each_library_was_pinned_to_and_tells_portable_from_avx2():
    portable = {
        "requested": "portable",
        "aten": "AVX2",
        "onednn": None,
        "onednn_convolutions": False,
        "mkl_cbwr": "COMPATIBLE",
    }
    avx2 = {"requested": "avx2", "aten": "AVX2", "onednn": "AVX2", "mkl_cbwr": "AUTO"}
    here = {"cpu_model": "AMD EPYC", "cpu_isa": portable}
    assert verify.machine_match({"cpu_model": "AMD EPYC", "cpu_isa": dict(portable)}, here) == (
        "same CPU model, same caps (cpu_isa=portable: ATen AVX2, oneDNN convolutions off, "
        "MKL COMPATIBLE)"
    )
    # the same ATen capability, yet other caps: oneDNN and MKL differ
    assert verify.machine_match({"cpu_model": "Xeon", "cpu_isa": avx2}, here) == (
        "other CPU model (committed 'Xeon', here 'AMD EPYC'), other caps (committed cpu_isa=avx2: "
        "ATen AVX2, oneDNN convolutions AVX2, MKL AUTO, here cpu_isa=portable: ATen AVX2, "
        "oneDNN convolutions off, MKL COMPATIBLE)"
    )


def test_seed_spread_is_the_std_over_the_seeds_of_the_same_experiment(tmp_path):
    for seed, top1 in enumerate((10.0, 12.0, 14.0)):
        _run(tmp_path, "a", f"s{seed}", seed=seed, top1=top1)
    _run(tmp_path, "a", "other", batch=128, top1=90.0)  # another experiment: not in the group
    runs = verify.find_runs(tmp_path)
    s0 = next(r for r in runs if r.name == "s0")
    assert verify.seed_spread(s0, runs) == (pytest.approx(2.0), 3)
    other = next(r for r in runs if r.name == "other")
    assert verify.seed_spread(other, runs) == (None, 1)


def test_seed_spread_takes_the_experiments_seeds_from_every_study_each_once(tmp_path):
    for seed, top1 in enumerate((10.0, 12.0, 14.0)):
        _run(tmp_path, "a", f"s{seed}", seed=seed, top1=top1)
    _run(tmp_path, "b", "s0", seed=0, top1=10.0)  # a copy of a/s0 (the same experiment id)
    _run(tmp_path, "b", "s3", seed=3, top1=16.0, eid="64-3")
    runs = verify.find_runs(tmp_path)
    b0 = next(r for r in runs if r.study == "b" and r.name == "s0")
    assert verify.seed_spread(b0, runs) == (pytest.approx(2.5819889), 4)  # 10, 12, 14, 16


def test_compare_ignores_throughput_and_names_the_first_step_that_differs(tmp_path):
    ref = _run(tmp_path, "a", "ref", steps=[(1, 2.5), (2, 2.25)])
    same = _run(tmp_path, "b", "same", steps=[(1, 2.5), (2, 2.25)])
    (same / "metrics.jsonl").write_text(
        (same / "metrics.jsonl").read_text().replace('"img_per_s": 101.0', '"img_per_s": 7.0')
    )
    assert verify.compare(ref, same) is None
    off = _run(tmp_path, "c", "off", steps=[(1, 2.5), (2, 2.2500000000000004)])
    assert verify.compare(ref, off) == "step 2: train loss 2.25 vs 2.2500000000000004"
    short = _run(tmp_path, "d", "short", steps=[(1, 2.5)])
    assert verify.compare(ref, short) == "train step 2 is only in the reference"
    final = _run(tmp_path, "e", "final", steps=[(1, 2.5), (2, 2.25)], top1=50.5)
    assert verify.compare(ref, final) == "final top1_error_pct 50.0 vs 50.5"


def test_verify_refuses_to_replay_into_the_committed_results(tmp_path, capsys):
    _run(tmp_path, "a", "a1")
    assert verify.main(str(tmp_path), 1, out=str(tmp_path / "a" / "replays")) == 2
    assert "inside the committed results" in capsys.readouterr().err
    assert verify.main(str(tmp_path), 1, names=["nope"]) == 2
    assert verify.main(str(tmp_path / "empty"), 1) == 2


# -- the three levels ------------------------------------------------------------------------------


def test_a_replay_is_bitwise_equal_consistent_or_inconsistent_by_its_difference_and_findings():
    assert verify.level(False, None, None, None) == ("bitwise equal", "")
    assert verify.level(True, -0.5, 1.0, [])[0] == "consistent"  # 0.5 <= 2 x 1.0
    assert verify.level(True, 2.0, 1.0, [])[0] == "consistent"  # at the bound
    level, why = verify.level(True, -2.01, 1.0, [])
    assert level == "inconsistent" and "-2.01 points, more than 2 seed spreads (2.00" in why
    level, why = verify.level(True, 0.1, None, [])
    assert level == "inconsistent" and "one seed" in why
    level, why = verify.level(True, 0.1, 1.0, ["gradual warmup beats no warmup"])
    assert level == "inconsistent" and "gradual warmup beats no warmup" in why
    level, why = verify.level(True, 0.1, 1.0, None)
    assert level == "inconsistent" and "could not be recomputed" in why
    assert verify.level(True, None, 1.0, [])[0] == "inconsistent"


def test_changed_verdicts_names_each_claim_whose_verdict_differs_or_is_missing():
    def doc(**verdicts):
        return {"findings": [{"claim": c, "replayed": v} for c, v in verdicts.items()]}

    committed = doc(a=True, b=None, c=False)
    assert verify.changed_verdicts(committed, doc(a=True, b=None, c=False)) == []
    assert verify.changed_verdicts(committed, doc(a=True, b=False, c=False)) == ["b"]
    assert verify.changed_verdicts(committed, doc(a=None, b=None)) == ["a", "c"]
    assert verify.changed_verdicts(committed, doc(a=True, b=None, c=False, d=True)) == ["d"]
