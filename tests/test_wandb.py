"""W&B that compares runs: what reaches W&B, read back from the offline run files with wandb's own
record definitions (``wandb.proto.wandb_internal_pb2.Record``; wandb 0.2x+ no longer ships a
Python reader of the ``.wandb`` log, so its LevelDB-log framing is unpacked in tests/helpers.py)."""

import json
import os
import shutil
import signal
import sys
import types
import warnings
from pathlib import Path

import pytest
from conftest import tiny_keys
from helpers import OfflineRun, offline_records, offline_runs

from lbsgd import tracking
from lbsgd.config import ConfigError, from_dict
from lbsgd.entry import train
from lbsgd.lab import experiments
from lbsgd.lab.studies import session


def _jsonl(run_dir: Path, kind: str = "train") -> list[dict]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["kind"] == kind]


def _assert_window_means(run: OfflineRun, steps: list[dict]) -> None:
    """Each W&B train point: the mean loss of the steps since the previous point (metrics.jsonl)."""
    points = run.points("train/loss")
    assert len(points) >= 2
    loss = {r["step"]: r["loss"] for r in steps}
    prev = min(loss) - 1
    sizes = []
    for step, logged in points:
        window = [loss[s] for s in range(prev + 1, step + 1)]
        assert window, f"W&B point at step {step} has no steps in metrics.jsonl"
        assert logged == pytest.approx(sum(window) / len(window), rel=1e-12, abs=0)
        sizes.append(len(window))
        prev = step
    assert prev == max(loss)  # every step belongs to a window
    assert max(sizes) > 1  # a window of several steps: the mean is not one step's loss


@pytest.fixture
def offline(monkeypatch, tmp_path):
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "wandb_dir"))
    monkeypatch.delenv("WANDB_MODE", raising=False)


# -- a trained run ---------------------------------------------------------------------------


def test_run_carries_profile_k_tags_display_name_window_mean_loss_and_epoch_axis(tiny, offline):
    cfg = tiny(
        wandb="offline",
        epochs=1.5,
        batch_size=128,
        study="warmup",
        profile="smoke",
        varied=("seed", "warmup", "k"),
    )
    assert train(cfg)["status"] == "completed"
    (run,) = offline_runs(cfg.run_dir())
    assert run.id == (cfg.run_dir() / "wandb_id").read_text().strip()
    assert run.group == "warmup" and run.job_type == "train"
    assert run.name == "k=2 warmup=gradual seed=0"  # k first, seed last
    assert run.config["profile"] == "smoke" and run.config["k"] == 2
    assert run.config["run_name"] == cfg.run_dir().name  # the folder, named as before
    assert run.config["batch_size"] == 128 and run.config["warmup_steps"] == 2  # keys, derived
    assert set(run.tags) == {"smoke", "warmup", "k=2", "warmup=gradual", "seed=0"}
    _assert_window_means(run, _jsonl(cfg.run_dir()))
    assert all("epoch" in row for row in run.history)
    last = max(run.history, key=lambda row: row["_step"])
    assert last["epoch"] == pytest.approx(1.5) and "eval/top1_error_pct" in last
    axis = {m.glob_name: m.step_metric for m in run.metrics if m.glob_name}
    assert axis == {"train/*": "epoch", "eval/*": "epoch"}
    assert any(m.name == "epoch" for m in run.metrics)


def test_runs_of_a_sweep_varying_warmup_have_distinct_display_names(tiny, offline):
    names = []
    for warmup in ("none", "constant", "gradual"):
        cfg = tiny(wandb="offline", epochs=0.25, warmup=warmup, varied=("warmup",))
        train(cfg)
        (run,) = offline_runs(cfg.run_dir())
        assert f"warmup={warmup}" in run.tags
        names.append(run.name)
    assert names == [
        "k=1 warmup=none seed=0",
        "k=1 warmup=constant seed=0",
        "k=1 warmup=gradual seed=0",
    ]
    cfg = tiny(wandb="offline", epochs=0.25, name="alone")  # nothing varies: k and seed still
    train(cfg)
    assert offline_runs(cfg.run_dir())[0].name == "k=1 seed=0"


def test_runs_on_2_and_4_processes_of_one_group_are_named_apart():
    # study 12 logs local SGD on K = 2 and K = 4 processes into one group, from two sweeps whose
    # runs vary only the period: the process count tells them apart; one process goes unsaid
    keys = {"batch_size": 256, "reference_batch": 16, "seed": 1, "local_sgd": 4}
    named = {
        w: tracking.display_name({**keys, "world_size": w, "varied": ["local_sgd"]})
        for w in (1, 2, 4)
    }
    assert named == {
        1: "k=16 local_sgd=4 seed=1",
        2: "k=16 local_sgd=4 world_size=2 seed=1",
        4: "k=16 local_sgd=4 world_size=4 seed=1",
    }
    tags = tracking.run_tags({**keys, "world_size": 4, "profile": "cpu", "study": "local_sgd"})
    assert tags == ["cpu", "local_sgd", "k=16", "world_size=4", "seed=1"]


def test_seed_0_and_seed_1_runs_of_one_group_are_named_by_one_rule(tiny, offline, tmp_path):
    # the sweep run once with seed 0 (nothing varies), then again with seeds 0 and 1 (seed 0 is
    # done and skipped, seed 1 varies): both runs carry k and seed, named alike
    out = tmp_path / "results"
    run = tiny_keys(epochs=0.25, checkpoint=False, wandb="offline")
    for seeds in ([0], [0, 1]):
        experiments.sweep(
            "names", [{**run, "seed": s} for s in seeds], out_dir=out, wandb="offline", quiet=True
        )
    names = {}
    for folder in sorted((out / "names").glob("*/summary.json")):
        (logged,) = offline_runs(folder.parent)
        names[logged.config["seed"]] = (logged.name, folder.parent.name)
    assert [n for n, _ in names.values()] == ["k=1 seed=0", "k=1 seed=1"]
    # the folders keep the names the config gives them (committed runs are not renamed)
    for seed, (_, folder) in names.items():
        assert folder == from_dict({**run, "seed": seed}).run_name()


def _stop_after(monkeypatch, step: int) -> None:
    """The run asks itself to stop (SIGUSR1, as a scheduler would) once ``step`` is logged."""
    log = tracking.Tracker.log

    def log_then_signal(self, record, **kw):
        log(self, record, **kw)
        if record.get("kind") == "train" and record["step"] == step:
            os.kill(os.getpid(), signal.SIGUSR1)

    monkeypatch.setattr(tracking.Tracker, "log", log_then_signal)


def test_offline_resume_is_a_new_run_of_the_same_group_and_name_saying_what_it_continues(
    tiny, offline, monkeypatch
):
    cfg = tiny(wandb="offline", study="warmup", varied=("warmup",), profile="smoke")
    with monkeypatch.context() as m:
        _stop_after(m, 4)
        assert train(cfg)["status"] == "interrupted"
    first_id = (cfg.run_dir() / "wandb_id").read_text()
    steps_done = max(r["step"] for r in _jsonl(cfg.run_dir()))
    assert 4 <= steps_done < 16
    assert train(cfg.replace(resume=True))["status"] == "completed"
    assert (cfg.run_dir() / "wandb_id").read_text() == first_id  # kept across the resume
    first, second = offline_runs(cfg.run_dir())
    assert first.id == first_id.strip() and second.id != first.id
    assert (second.group, second.name) == (first.group, first.name)
    assert (first.group, first.name) == ("warmup", "k=1 warmup=gradual seed=0")
    assert second.config["continues"] == first.id and "continues" not in first.config
    assert second.config["resumed_from_step"] == steps_done
    assert first.id in second.notes
    assert min(s for s, _ in second.points("train/loss")) > steps_done
    _assert_window_means(second, [r for r in _jsonl(cfg.run_dir()) if r["step"] > steps_done])


class _FakeRun:
    def __init__(self):
        self.summary = {}

    def define_metric(self, *a, **k):
        pass

    def log(self, *a, **k):
        pass

    def finish(self, *a, **k):
        pass


def test_online_resume_continues_the_same_wandb_run(tiny, monkeypatch):
    calls = []
    fake = types.ModuleType("wandb")
    fake.Settings = lambda **k: k
    fake.init = lambda **k: calls.append(k) or _FakeRun()
    monkeypatch.setitem(sys.modules, "wandb", fake)
    cfg = tiny(wandb="online")
    with monkeypatch.context() as m:
        _stop_after(m, 4)
        assert train(cfg)["status"] == "interrupted"
    assert train(cfg.replace(resume=True))["status"] == "completed"
    first, second = calls
    stored = (cfg.run_dir() / "wandb_id").read_text().strip()
    assert first["id"] == second["id"] == stored
    assert first["resume"] == second["resume"] == "allow"
    assert second["name"] == first["name"] and second["group"] == first["group"]
    assert second["config"]["resumed_from_step"] > 0 and "continues" not in second["config"]


# -- runs and studies logged from a notebook ---------------------------------------------------


def test_copied_run_is_logged_to_the_second_studys_group_with_its_own_id(tiny, offline, tmp_path):
    cfg = tiny(wandb="offline", study="warmup", varied=("warmup",), profile="smoke")
    train(cfg)
    twin = cfg.run_dir()
    copy = twin.parent.parent / "batch_scaling" / twin.name
    shutil.copytree(twin, copy, ignore=experiments.COPY_IGNORE)  # as the sweep copies
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = tracking.log_copied_run(copy, copied_from=twin, mode="offline", varied=("k",))
    assert not [w for w in caught if issubclass(w.category, RuntimeWarning)]
    (run,) = offline_runs(copy)
    assert got == run.id == (copy / "wandb_id").read_text().strip()
    assert run.id != (twin / "wandb_id").read_text().strip()  # a new W&B run for this study
    assert run.group == "batch_scaling" and run.name == "k=1 seed=0"
    assert run.config["study"] == "batch_scaling" and run.config["profile"] == "smoke"
    assert run.config["copied_from"] == f"warmup/{twin.name}"
    assert run.config["copied_from_wandb_id"] == offline_runs(twin)[0].id
    assert {"batch_scaling", "k=1", "smoke"} <= set(run.tags)
    _assert_window_means(run, _jsonl(copy))  # the same points the trainer logged
    original = offline_runs(twin)[0]
    assert run.points("train/loss") == original.points("train/loss")
    assert run.points("eval/top1_error_pct") == original.points("eval/top1_error_pct")


def test_log_study_writes_the_table_figures_and_findings(offline, tmp_path):
    pd = pytest.importorskip("pandas")
    plt = pytest.importorskip("matplotlib.pyplot")
    study_dir = tmp_path / "results" / "smoke" / "warmup"
    study_dir.mkdir(parents=True)
    table = pd.DataFrame(
        {
            "warmup": ["none", "gradual"],
            "ours_top1_error_pct": [31.5, 28.25],
            "paper_top1_error_pct": [float("nan"), 23.74],
        }
    )
    table.to_csv(study_dir / "table.csv", index=False)
    fig, ax = plt.subplots()
    ax.plot([0, 1], [1, 0])
    fig.savefig(study_dir / "curves.png")
    plt.close(fig)
    findings = [
        {
            "claim": "gradual warmup helps",
            "replayed": True,
            "evidence": "28.2 < 31.5",
            "p_for": 0.01,
        },
        {"claim": "constant warmup hurts", "replayed": None, "evidence": "one seed"},
        {
            "claim": "the model predicts",
            "replayed": False,
            "evidence": "0.6 (the claim: 0.75-1.25)",
        },
    ]
    got = session.log_study(
        study_dir,
        study="warmup",
        profile="smoke",
        mode="offline",
        table=study_dir / "table.csv",
        figures=[study_dir / "curves.png"],
        findings=findings,
    )
    (run,) = offline_runs(study_dir)
    assert got == run.id
    assert (run.job_type, run.group, run.name) == ("study", "warmup", "warmup (smoke)")
    assert run.config["profile"] == "smoke"
    (row,) = [r for r in run.history if "table" in r]
    files = run.dir / "files"
    logged = json.loads((files / row["table"]["path"]).read_text())
    assert logged["columns"] == list(table.columns) and len(logged["data"]) == 2
    assert logged["data"][1][1:] == [28.25, 23.74]
    image = row["figures/curves"]
    assert (files / image["path"]).read_bytes()[:4] == b"\x89PNG"
    verdicts = json.loads((files / row["findings"]["path"]).read_text())
    assert verdicts["columns"] == ["claim", "verdict", "evidence"]
    # a dict without "outcome" reads as a Finding would: with no test, a decided one is measured
    assert [r[1] for r in verdicts["data"]] == ["replayed", "undecided", "measured"]
    # a DataFrame is logged as well as a CSV path
    assert (
        session.log_study(study_dir, study="warmup", profile="smoke", mode="offline", table=table)
        is not None
    )


def test_a_log_still_being_written_reads_as_its_complete_records(offline, tmp_path):
    # W&B's service appends to run-<id>.wandb on its own schedule: a reader that meets a record
    # cut short (the file read mid-write) returns the records before it, never a parse error
    study_dir = tmp_path / "results" / "smoke" / "warmup"
    study_dir.mkdir(parents=True)
    session.log_study(study_dir, study="warmup", profile="smoke", mode="offline")
    (run,) = offline_runs(study_dir)
    (log,) = study_dir.glob("wandb/offline-run-*/run-*.wandb")
    data = log.read_bytes()
    full = [r.SerializeToString() for r in offline_records(log)]
    assert len(full) > 3
    cut = tmp_path / "cut.wandb"
    for end in range(7, len(data), max(1, len(data) // 97)):
        cut.write_bytes(data[:end])
        got = [r.SerializeToString() for r in offline_records(cut)]
        assert got == full[: len(got)], end


def test_log_study_and_log_copied_run_never_raise_and_warn_once(offline, tmp_path, monkeypatch):
    with pytest.warns(RuntimeWarning, match="copied run .* not logged") as caught:
        got = tracking.log_copied_run(
            tmp_path / "s" / "missing", copied_from=tmp_path / "t", mode="offline"
        )
    assert got is None and len(caught) == 1
    fake = types.ModuleType("wandb")
    fake.Settings = lambda **k: k

    def init(**k):
        raise ConnectionError("cannot reach api.wandb.ai")

    fake.init = init
    monkeypatch.setitem(sys.modules, "wandb", fake)
    with pytest.warns(RuntimeWarning, match="study warmup not logged") as caught:
        got = session.log_study(
            tmp_path,
            study="warmup",
            profile="smoke",
            mode="offline",
            figures=[tmp_path / "nothing.png"],
        )
    assert got is None and len(caught) == 1
    assert session.log_study(tmp_path, study="warmup", profile="smoke", mode="disabled") is None


def test_profile_and_varied_are_validated(tiny):
    assert tiny(profile="cpu", varied=("k", "warmup")).varied == ("k", "warmup")
    with pytest.raises(ConfigError, match="profile='../x'"):
        from_dict({"profile": "../x"})
    with pytest.raises(ConfigError, match="varied: 'wramup' is not a config key"):
        from_dict({"varied": ["wramup"]})
    cfg = tiny()
    assert cfg.replace(profile="cpu", varied=["seed"]).experiment_id() == cfg.experiment_id()


def test_a_study_session_logs_its_table_figures_and_findings_to_its_group(offline, tmp_path):
    pd = pytest.importorskip("pandas")
    plt = pytest.importorskip("matplotlib.pyplot")
    from lbsgd.lab import studies

    s = studies.start(
        "warmup", title="2. Warmup", profile="smoke", out_dir=tmp_path, wandb="offline"
    )
    s.save_table(pd.DataFrame({"warmup": ["none", "gradual"], "err": [31.5, 28.25]}))
    fig, ax = plt.subplots()
    ax.plot([0, 1], [1, 0])
    s.save_figure(fig, "curves.png")
    plt.close(fig)
    s.findings([studies.Finding("gradual warmup helps", None, "one seed")])
    (run,) = offline_runs(s.dir)
    assert (run.job_type, run.group, run.name) == ("study", "warmup", "warmup (smoke)")
    (row,) = [r for r in run.history if "table" in r]
    assert "figures/curves" in row and "findings" in row


def test_a_notebook_run_again_logs_to_the_same_study_run_offline(offline, tmp_path):
    pd = pytest.importorskip("pandas")
    from lbsgd.lab import studies

    errors = []
    for err in (31.5, 30.25):  # the notebook, run twice: two sessions of one study
        s = studies.start(
            "warmup", title="2. Warmup", profile="smoke", out_dir=tmp_path, wandb="offline"
        )
        s.save_table(pd.DataFrame({"warmup": ["gradual"], "err": [err]}))
        s.findings([studies.Finding("gradual warmup helps", None, "one seed")])
        errors.append(err)
    first, second = offline_runs(s.dir)  # two offline folders of W&B's, oldest first
    kept = (s.dir / "wandb_id").read_text().strip()
    assert first.id == second.id == kept  # `wandb sync` puts both into that one W&B run
    assert (first.group, first.name) == (second.group, second.name) == ("warmup", "warmup (smoke)")
    for run, err in zip((first, second), errors, strict=True):
        (row,) = [r for r in run.history if "table" in r]
        logged = json.loads((run.dir / "files" / row["table"]["path"]).read_text())
        assert logged["data"] == [["gradual", err]]  # each re-run logs its own table


def test_a_notebook_run_again_resumes_its_study_run_online(tmp_path, monkeypatch):
    calls = []
    fake = types.ModuleType("wandb")
    fake.Settings = lambda **k: k

    def init(**k):
        calls.append(k)
        run = _FakeRun()
        run.id = k["id"]
        return run

    fake.init = init
    monkeypatch.setitem(sys.modules, "wandb", fake)
    for _ in range(2):
        got = session.log_study(tmp_path, study="warmup", profile="smoke", mode="online")
    assert calls[0]["id"] == calls[1]["id"] == got == (tmp_path / "wandb_id").read_text().strip()
    assert calls[0]["resume"] == calls[1]["resume"] == "allow"
    # a study whose id was kept where earlier versions kept it (online) keeps its W&B run
    legacy = tmp_path / "older"
    (legacy / "wandb").mkdir(parents=True)
    (legacy / "wandb" / "study_id").write_text("older123\n")
    assert session.log_study(legacy, study="warmup", profile="smoke", mode="online") == "older123"
    assert (legacy / "wandb_id").read_text().strip() == "older123"
