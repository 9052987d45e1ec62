"""The sweep as users run it: what it writes into each run's config, copies between the studies of
one profile, the lines it prints and the logs it keeps, interrupts (Ctrl-C, Jupyter's Kernel >
Interrupt, SIGTERM, a killed kernel), the paths it may write to, and the per-profile report."""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
import yaml
from conftest import TINY, as_args, start

from lbsgd import checkpoint, cli, config, rundir, tracking
from lbsgd.config import ConfigError
from lbsgd.lab import experiments as ex

REPO = Path(__file__).resolve().parents[1]
# several epochs of TINY (8 steps each, a flush every 3): time to interrupt it mid-run
LONG = {**TINY, "epochs": 20}


def snapshot(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def wait_for_training(run_dir: Path, proc: subprocess.Popen, timeout: float = 120) -> None:
    """Until the run has logged a training step (it is past start-up and under the stop handlers)."""
    metrics, deadline = run_dir / "metrics.jsonl", time.monotonic() + timeout
    while time.monotonic() < deadline:
        if metrics.exists() and '"kind": "train"' in metrics.read_text():
            return
        assert proc.poll() is None, proc.communicate()[0][-3000:]
        time.sleep(0.05)
    raise AssertionError(f"{run_dir} logged no training step in {timeout} s")


def children(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` (Linux: /proc)."""
    kids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:  # the field after the state: the parent's id
            kids.append(int(stat.parent.name))
    return kids


def summary(run_dir: Path) -> dict:
    return json.loads((run_dir / "summary.json").read_text())


def run_config(run_dir: Path) -> dict:
    return yaml.safe_load((run_dir / "config.yaml").read_text())


# -- profile and varied ------------------------------------------------------------------------


def test_varied_names_the_keys_that_differ_with_k_for_batch_size():
    def cfgs(*runs):
        return [config.from_dict({**TINY, **r}) for r in runs]

    assert ex.varied_keys(cfgs({"seed": 0}, {"seed": 1})) == ("seed",)
    two = cfgs({"batch_size": 64, "seed": 0}, {"batch_size": 128, "seed": 0, "warmup": "none"})
    assert ex.varied_keys(two) == ("k", "warmup")
    assert ex.varied_keys(cfgs({"seed": 0}, {"seed": 0, "name": "other"})) == ()  # names aside
    assert ex.varied_keys(cfgs({})) == ()


def _completed_twin(out: Path, study: str, keys: dict, world_size: int = 1) -> Path:
    """A finished run of ``study`` on ``world_size`` processes (its files, no training): what a
    sweep may copy."""
    cfg = config.from_dict({**keys, "study": study, "out_dir": str(out), "varied": ["seed"]})
    run_dir = cfg.run_dir()
    run_dir.mkdir(parents=True)
    d = config.derive(cfg, world_size, cfg.synthetic_train)
    (run_dir / "config.yaml").write_text(config.dump(cfg, d))
    summary = {"status": "completed", "run": cfg.run_name(), "study": study, "steps": 16}
    summary.update(experiment_id=cfg.experiment_id(), total_steps=16, environment={})
    rundir.write_summary(run_dir, summary)  # summary.json's declared shape
    (run_dir / "metrics.jsonl").write_text('{"kind": "train", "step": 3, "loss": 2.0}\n')
    (run_dir / checkpoint.NAME).write_bytes(b"weights")
    (run_dir / "wandb_id").write_text("twin0001\n")
    return run_dir


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def test_a_local_sgd_run_of_another_process_count_is_neither_done_nor_a_twin(tmp_path):
    """Under local SGD the K processes' models are averaged: K is part of the mathematics (unlike
    a synchronous run's layout), so a finished run of K = 2 is not this launch's run on K = 4."""
    out = tmp_path / "smoke"
    local = {**TINY, "local_sgd": 2}
    done = _completed_twin(out, "local_sgd", local, world_size=2)
    cfg = config.from_dict({**local, "study": "local_sgd", "out_dir": str(out), "resume": True})
    assert rundir.check_run_dir(cfg, 2) == "completed"
    refusal = (
        r"^local_sgd=2: \S+ was trained by 2 processes and this launch has 4; the number of "
        r"processes is part of local_sgd's mathematics: launch 2, or choose another name= or "
        r"out_dir=$"
    )
    with pytest.raises(ConfigError, match=refusal):
        rundir.check_run_dir(cfg, 4)
    # a synchronous run is the same on any layout: done, whatever the launch
    sync = _completed_twin(out, "sync", TINY, world_size=2)
    sync_cfg = config.from_dict({**TINY, "study": "sync", "out_dir": str(out), "resume": True})
    assert rundir.check_run_dir(sync_cfg, 4) == "completed"
    # twins in another study: the same K only (a synchronous twin on any)
    elsewhere = cfg.replace(study="lr")
    assert ex.find_identical(elsewhere, out, 2) == done
    assert ex.find_identical(elsewhere, out, 4) is None
    assert ex.find_identical(sync_cfg.replace(study="lr"), out, 4) == sync
    # the sweep's door: refused before any work, every file as it was
    before = _files(out)
    with pytest.raises(ConfigError, match=refusal):
        ex.sweep("local_sgd", [local], out_dir=out, nproc_per_node=4, profile="smoke", quiet=True)
    assert _files(out) == before
    # on 2 processes the same sweep finds its run done (and starts nothing)
    df = ex.sweep("local_sgd", [local], out_dir=out, nproc_per_node=2, profile="smoke", quiet=True)
    assert list(df["run_dir"]) == [str(done)] and _files(out) == before


def test_a_twin_is_copied_within_its_profile_only_and_named_as_this_studys_run(
    tmp_path, monkeypatch
):
    logged = []
    monkeypatch.setattr(
        tracking, "log_copied_run", lambda run_dir, **kw: logged.append((run_dir, kw))
    )
    keys = {**TINY, "seed": 0}
    other_profile = _completed_twin(tmp_path / "cpu", "warmup", keys)
    twin = _completed_twin(tmp_path / "smoke", "warmup", keys)
    cfg = config.from_dict({**keys, "study": "lr", "out_dir": str(tmp_path / "smoke")})
    assert ex.find_identical(cfg, tmp_path / "smoke") == twin
    assert ex.find_identical(cfg, tmp_path / "cpu") == other_profile
    assert ex.find_identical(cfg, tmp_path / "imagenet") is None  # another profile's is not seen
    # the same experiment measured otherwise (noise_scale: a run key) is no twin: its records lack
    # the measurement this run asks for
    measured = cfg.replace(noise_scale=True)
    assert measured.experiment_id() == cfg.experiment_id()
    assert ex.find_identical(measured, tmp_path / "smoke") is None
    both = _completed_twin(tmp_path / "smoke", "critical_batch", {**keys, "noise_scale": True})
    assert ex.find_identical(measured, tmp_path / "smoke") == both

    df = ex.sweep("lr", [keys], out_dir=tmp_path / "smoke", profile="smoke", quiet=True)
    copy = tmp_path / "smoke" / "lr" / cfg.run_name()
    assert list(df["run_dir"]) == [str(copy)] and list(df["status"]) == ["completed"]
    assert not list((tmp_path / "smoke" / "lr").glob("*.log")), "the copy was trained"
    got = run_config(copy)
    assert (got["study"], got["profile"], got["varied"]) == ("lr", "smoke", [])
    assert got["out_dir"] == str(tmp_path / "smoke") and got["total_steps"] == 16  # derived kept
    assert not (copy / checkpoint.NAME).exists() and not (copy / "wandb_id").exists()
    assert logged == [(copy, {"copied_from": twin, "mode": "auto", "project": "lbsgd"})]
    assert run_config(twin)["study"] == "warmup"  # the twin itself is untouched


def test_a_copied_run_says_the_same_in_its_config_and_summary_study_and_copied_from(
    tmp_path, monkeypatch
):
    monkeypatch.setattr(tracking, "log_copied_run", lambda run_dir, **kw: None)
    out, keys = tmp_path / "smoke", {**TINY, "seed": 0}
    twin = _completed_twin(out, "warmup", keys)
    ex.sweep("lr_scaling_rule", [keys], out_dir=out, profile="smoke", quiet=True)
    copy = out / "lr_scaling_rule" / twin.name
    got, s = run_config(copy), summary(copy)
    origin = f"warmup/{twin.name}"
    assert (got["study"], got["copied_from"]) == ("lr_scaling_rule", origin), got
    assert (s["study"], s["copied_from"]) == ("lr_scaling_rule", origin), s
    # the run's identity is the twin's: its keys, name and experiment id
    cfg = config.from_dict({k: v for k, v in got.items() if k in config.KEYS})
    assert cfg.run_name() == copy.name == s["run"]
    assert cfg.experiment_id() == s["experiment_id"] == summary(twin)["experiment_id"]
    assert "copied_from" not in summary(twin) and "copied_from" not in run_config(twin)
    # config.yaml still reads as a config (lbsgd train -c, lbsgd verify's replays)
    assert config.load([copy / "config.yaml"]).experiment_id() == s["experiment_id"]
    # a copy of the copy names the run it copied
    ex.sweep("bn_decay", [keys], out_dir=out, profile="smoke", quiet=True)
    again = out / "bn_decay" / twin.name
    want = ("bn_decay", f"lr_scaling_rule/{twin.name}")
    assert (run_config(again)["study"], run_config(again)["copied_from"]) == want
    assert (summary(again)["study"], summary(again)["copied_from"]) == want
    # the table says the same, for a copy made before copied_from was recorded too (its
    # summary.json names the study that trained it)
    (row,) = ex.load_runs(copy.parent).to_dict("records")
    assert (row["study"], row["copied_from"]) == ("lr_scaling_rule", origin)
    old = out / "batch_scaling" / twin.name
    shutil.copytree(twin, old)
    (old / "config.yaml").write_text(yaml.safe_dump({**run_config(twin), "study": "batch_scaling"}))
    (row,) = ex.load_runs(old.parent).to_dict("records")
    assert (row["study"], row["copied_from"]) == ("batch_scaling", origin)
    (row,) = ex.load_runs(twin.parent).to_dict("records")
    assert (row["study"], row["copied_from"]) == ("warmup", None)


COMMITTED = REPO / "results" / "cpu" / "lr_scaling_rule"


@pytest.mark.skipif(not COMMITTED.is_dir(), reason="no committed results/cpu/ in this checkout")
def test_committed_copies_read_as_runs_of_the_study_they_serve():
    """The committed copies predate copied_from: their summary.json names the study that trained
    them. The table names the study whose folder holds them, and where they came from."""
    df = ex.load_runs(COMMITTED)
    assert set(df["study"]) == {"lr_scaling_rule"}
    copies = df[df["copied_from"].notna()]
    assert len(copies) > 0
    for _, row in copies.iterrows():
        study, name = row["copied_from"].split("/")
        assert study != "lr_scaling_rule" and name == Path(row["run_dir"]).name


# -- the lines of a sweep -----------------------------------------------------------------------

SWEEP_LINE = re.compile(r"^\[(\d+)/(\d+)\] (\S+): (\w+)", re.MULTILINE)


def numbered(printed: str) -> dict[str, list[tuple[int, str]]]:
    """Each run's lines as (number, first word after the name), in the order printed; every line
    of the form ``[i/N] name: word …``, with one N."""
    lines = SWEEP_LINE.findall(printed)
    assert len({n for _, n, _, _ in lines}) == 1, printed
    runs: dict[str, list[tuple[int, str]]] = {}
    for i, _, name, word in lines:
        runs.setdefault(name, []).append((int(i), word))
    return runs


@pytest.mark.slow
def test_sweep_numbers_each_run_once_and_says_skipped_copied_or_started(
    tmp_path, capsys, monkeypatch
):
    """One number per run, its place in the run list, on each of its lines, and the first line
    says what the sweep does with it (a fresh run first: its end must not take the number of a
    run settled later)."""
    monkeypatch.setattr(tracking, "log_copied_run", lambda run_dir, **kw: None)
    out, keys = tmp_path / "smoke", {**TINY, "epochs": 1}
    runs = [{**keys, "seed": s} for s in (2, 0, 1)]
    fresh, done, copied = (
        config.from_dict({**r, "study": "study", "out_dir": str(out)}).run_name() for r in runs
    )
    _completed_twin(out, "study", runs[1])
    _completed_twin(out, "warmup", runs[2])
    df = ex.sweep("study", runs, out_dir=out, profile="smoke")
    assert list(df["status"]) == ["completed"] * 3
    printed = capsys.readouterr().out
    assert numbered(printed) == {
        fresh: [(1, "started"), (1, "completed")],
        done: [(2, "skipped")],
        copied: [(3, "copied")],
    }, printed
    assert f"[2/3] {done}: skipped (already completed)" in printed
    assert f"[3/3] {copied}: copied from warmup/ (identical run)" in printed
    assert re.search(rf"^\[1/3\] {fresh}: completed in \d+ s.*\(3 of 3 done\)$", printed, re.M)


def test_run_interrupted_shows_its_one_line_in_ipython_without_a_traceback(capsys):
    """What a notebook cell (JupyterLab, papermill) shows when a sweep is interrupted: the error's
    line, not the frames of the sweep's loop it was raised through."""
    from IPython.core.interactiveshell import InteractiveShell

    shell = InteractiveShell.instance()
    message = "sweep of study 'warmup' interrupted: 1 run stopped; run the same sweep again"

    def sweep():
        try:
            raise KeyboardInterrupt
        except KeyboardInterrupt:
            raise ex.RunInterrupted(message, ["run-a"]) from None

    shell.user_ns["sweep"] = sweep
    result = shell.run_cell("sweep()")
    assert isinstance(result.error_in_exec, ex.RunInterrupted)
    assert result.error_in_exec.runs == ("run-a",)
    shown = [ln for ln in capsys.readouterr().out.splitlines() if ln.strip()]
    assert shown == [f"RunInterrupted: {message}"], shown


# -- interrupts --------------------------------------------------------------------------------

SWEEP_SCRIPT = """
import signal, sys
from IPython.core.interactiveshell import InteractiveShell
from lbsgd.lab import experiments as ex
# a Jupyter kernel handles SIGINT itself (Kernel > Interrupt), even when started from a shell that
# ignores it (a background job inherits SIGINT ignored, and Python then installs no handler)
signal.signal(signal.SIGINT, signal.default_int_handler)
runs = [{{**{keys!r}, "seed": 0}}, {{**{keys!r}, "seed": 1}}]
# the sweep as a notebook cell runs it: IPython shows what the cell raises
shell = InteractiveShell.instance()
shell.user_ns.update(ex=ex, runs=runs, out=sys.argv[1])
result = shell.run_cell('ex.sweep("study", runs, out_dir=out, profile="smoke", parallel=1)')
sys.exit(0 if result.success else 1)
"""


def _sweep_process(out: Path) -> subprocess.Popen:
    """A sweep in a process (as in a kernel) in a process group of its own, as Jupyter starts one."""
    code = textwrap.dedent(SWEEP_SCRIPT.format(keys=LONG))
    return start(
        [str(out)],
        program=("-c", code),
        cwd=REPO,
        env={"PYTHONUNBUFFERED": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )


def _names(out: Path) -> list[str]:
    return [
        config.from_dict({**LONG, "seed": s, "study": "study", "out_dir": str(out)}).run_name()
        for s in (0, 1)
    ]


@pytest.mark.slow
def test_an_interrupted_sweep_stops_its_runs_with_a_checkpoint_names_them_and_resumes(
    tmp_path, capsys
):
    out = tmp_path / "smoke"
    first, second = _names(out)
    proc = _sweep_process(out)
    wait_for_training(out / "study" / first, proc)
    if Path("/proc").is_dir():  # the run is in a session of its own: the group's SIGINT misses it
        kids = children(proc.pid)
        assert kids and all(os.getsid(k) not in (os.getsid(proc.pid), os.getsid(0)) for k in kids)
    os.killpg(proc.pid, signal.SIGINT)  # Kernel > Interrupt: the kernel's whole process group
    printed = proc.communicate(timeout=120)[0]
    assert proc.returncode != 0, printed

    run_dir = out / "study" / first
    s = summary(run_dir)
    assert s["status"] == "interrupted", printed
    stopped = s["steps"]
    assert 0 < stopped < s["total_steps"], printed
    assert checkpoint.load(run_dir)["step"] == stopped
    # after the notice, one line per run, then the error the cell ends with: no traceback
    after = printed.split("[interrupt] asked 1 run to stop (SIGTERM)", 1)[1].splitlines()[1:]
    assert after == [
        f"[1/2] {first}: interrupted at step {stopped}, checkpoint kept "
        f"(log: {out / 'study' / f'{first}.log'})",
        f"[2/2] {second}: not started",
        "RunInterrupted: sweep of study 'study' interrupted: 1 run stopped, 1 run not started; run "
        "the same sweep again to resume",
    ], printed
    assert "Traceback" not in printed, printed
    log = out / "study" / f"{first}.log"
    first_attempt = log.read_text()
    assert first_attempt.startswith(f"{ex.ATTEMPT_MARK}1, ")
    assert "asked to stop (SIGTERM)" in first_attempt  # the sweep's
    assert not (out / "study" / second).exists()
    assert issubclass(ex.RunInterrupted, KeyboardInterrupt)

    runs = [{**LONG, "seed": 0}, {**LONG, "seed": 1}]
    df = ex.sweep("study", runs, out_dir=out, profile="smoke", parallel=1)
    assert list(df["status"]) == ["completed", "completed"]
    printed = capsys.readouterr().out
    how = (
        f"resumed from its checkpoint (the last attempt reached step {stopped}, status interrupted)"
    )
    assert f"[1/2] {first}: {how} (log: {log})" in printed, printed
    assert numbered(printed) == {
        first: [(1, "resumed"), (1, "completed")],
        second: [(2, "started"), (2, "completed")],
    }, printed
    # the log: the first attempt as it was, then the second, marked: when, from where
    text = log.read_text()
    assert text.startswith(first_attempt), "the first attempt's lines were lost"
    boundary = text[len(first_attempt) :].splitlines()[0]
    stamp = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC"
    assert re.fullmatch(rf"{re.escape(ex.ATTEMPT_MARK)}2, {stamp}: {re.escape(how)} ====", boundary)
    assert (
        f"resuming from {run_dir / checkpoint.NAME} at step {stopped}" in text[len(first_attempt) :]
    )
    steps = [
        json.loads(x)["step"]
        for x in (run_dir / "metrics.jsonl").read_text().splitlines()
        if json.loads(x)["kind"] == "train"
    ]
    assert steps == sorted(set(steps)) and steps[-1] == s["total_steps"]  # no step twice
    for name in (first, second):  # what the W&B run of each shows
        got = run_config(out / "study" / name)
        assert (got["profile"], got["varied"]) == ("smoke", ["seed"]), got


@pytest.mark.slow
def test_sigterm_to_the_sweep_stops_its_runs_with_a_checkpoint_then_goes_on_to_its_handler(
    tmp_path, capsys
):
    """A scheduler's (or a kernel manager's) SIGTERM to the sweep's process: the run stops with a
    checkpoint (a second SIGTERM does not kill it) and is named in its line, the summary line is
    printed (the process is about to end: nobody shows the error), and then SIGTERM goes on to the
    handler the process had (by default it ends the process)."""
    out = tmp_path / "smoke"
    name = _names(out)[0]
    run_dir = out / "study" / name
    delivered = []  # the run's status when the process's own handler got SIGTERM

    def handler(signum, frame):
        delivered.append(rundir.read_status(run_dir))

    def terminate():
        deadline = time.monotonic() + 120
        metrics = run_dir / "metrics.jsonl"
        while time.monotonic() < deadline:
            if metrics.exists() and '"kind": "train"' in metrics.read_text():
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(0.2)  # again, as a kernel manager does: the run still checkpoints
                os.kill(os.getpid(), signal.SIGTERM)
                return
            time.sleep(0.05)

    before = signal.signal(signal.SIGTERM, handler)
    try:
        thread = threading.Thread(target=terminate, daemon=True)
        thread.start()
        with pytest.raises(ex.RunInterrupted) as err:
            ex.sweep("study", [{**LONG, "seed": 0}], out_dir=out, profile="smoke")
        thread.join()
        assert signal.getsignal(signal.SIGTERM) == handler
    finally:
        signal.signal(signal.SIGTERM, before)
    assert err.value.runs == (name,)
    assert delivered == ["interrupted"]
    s = summary(run_dir)
    assert s["status"] == "interrupted" and 0 < s["steps"] < s["total_steps"], s
    assert checkpoint.load(run_dir)["step"] == s["steps"]
    printed = capsys.readouterr().out
    assert f"[1/1] {name}: interrupted at step {s['steps']}, checkpoint kept" in printed, printed
    assert "RunInterrupted: sweep of study 'study' interrupted: 1 run stopped;" in printed, printed


@pytest.mark.slow
@pytest.mark.skipif(sys.platform != "linux", reason="PR_SET_PDEATHSIG is Linux's")
def test_a_run_whose_sweep_is_killed_stops_with_a_checkpoint_instead_of_training_on(tmp_path):
    out = tmp_path / "smoke"
    run_dir = out / "study" / _names(out)[0]
    proc = _sweep_process(out)
    wait_for_training(run_dir, proc)
    proc.kill()  # a kernel killed (restart, out of memory): no interrupt, no word
    proc.communicate(timeout=60)
    deadline = time.monotonic() + 60
    while summary(run_dir)["status"] == "running" and time.monotonic() < deadline:
        time.sleep(0.1)
    s = summary(run_dir)
    assert s["status"] == "interrupted" and s["steps"] < s["total_steps"], s
    assert checkpoint.load(run_dir)["step"] == s["steps"]


@pytest.mark.slow
def test_lbsgd_train_under_ctrl_c_stops_at_a_flush_with_a_checkpoint(tmp_path):
    args = [*as_args(LONG), f"out_dir={tmp_path}", "name=run"]
    proc = start(
        ["train", *args],
        cwd=REPO,
        env={"PYTHONUNBUFFERED": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    run_dir = tmp_path / "runs" / "run"
    wait_for_training(run_dir, proc)
    proc.send_signal(signal.SIGINT)
    printed = proc.communicate(timeout=120)[0]
    assert proc.returncode == 143, printed  # interrupted, as under SIGTERM
    s = summary(run_dir)
    assert s["status"] == "interrupted", printed
    assert 0 < s["steps"] < s["total_steps"] and s["steps"] % LONG["log_every"] == 0  # at a flush
    assert f"asked to stop (SIGINT): stopped after step {s['steps']}, checkpoint written" in printed
    assert checkpoint.load(run_dir)["step"] == s["steps"]
    assert "Traceback" not in printed, printed


# -- nothing written outside out_dir -------------------------------------------------------------

BAD_FOLDER_NAMES = ["../x", "a/b", "..", ".", "", "a\\b", "-rf", "a\x00b", "tab\there", "/abs"]


@pytest.mark.parametrize("key", ["study", "name", "profile"])
@pytest.mark.parametrize("bad", BAD_FOLDER_NAMES, ids=repr)
def test_every_path_component_key_must_be_a_plain_folder_name(key, bad):
    with pytest.raises(ConfigError) as err:
        config.from_dict({key: bad})
    msg = str(err.value)
    assert "\n" not in msg and msg.startswith(f"{key}={bad!r}") and "plain folder name" in msg


@pytest.mark.parametrize("good", ["warmup", "lr_scaling_rule", "run 1", "v1.2", "é"])
def test_plain_folder_names_are_accepted(good):
    c = config.from_dict({"study": good, "name": good})
    assert c.run_dir() == Path("results/cli") / good / good


def test_a_model_name_that_would_leave_the_study_folder_is_refused():
    with pytest.raises(ConfigError, match="run name '../"):
        config.from_dict({"model": "../x"})


@pytest.mark.parametrize("door", ["override", "yaml"])
def test_lbsgd_train_refuses_a_path_outside_out_dir_before_writing(tmp_path, capsys, door):
    out = tmp_path / "out"
    if door == "yaml":
        (tmp_path / "bad.yaml").write_text(f"study: ../x\nout_dir: {out}\n")
        args = ["train", "-c", str(tmp_path / "bad.yaml")]
    else:
        args = ["train", "study=../x", f"out_dir={out}"]
    before = snapshot(tmp_path)
    assert cli.main(args) == cli.EXIT_BAD_INPUT
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("lbsgd: error: study='../x'"), lines
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize(
    "where", ["study", "profile", "run name"], ids=["study", "profile", "a run's name"]
)
def test_sweep_refuses_a_path_outside_out_dir_before_writing(tmp_path, where):
    out = tmp_path / "results" / "smoke"
    study, profile, run = "ok", "smoke", {**TINY}
    if where == "study":
        study = "../x"
    elif where == "profile":
        profile = "../x"
    else:
        run["name"] = "../x"
    with pytest.raises(ConfigError, match=re.escape("='../x' must be a plain folder name")):
        ex.sweep(study, [run], out_dir=out, profile=profile, quiet=True)
    assert snapshot(tmp_path) == []


# -- the report, per profile -------------------------------------------------------------------


def _study(profile_dir: Path, study: str, title: str, findings: list[dict], seeds=(0, 1)) -> None:
    d = profile_dir / study
    d.mkdir(parents=True)
    (d / "findings.json").write_text(
        json.dumps(
            {
                "study": study,
                "title": title,
                "profile": profile_dir.name,
                "seeds": list(seeds),
                "findings": findings,
            }
        )
    )
    (d / "table.csv").write_text("k,top1_error_pct_mean,paper_top1_error_pct\n1,30.1,23.7\n")
    (d / "curve.png").write_bytes(b"png")


def _results(root: Path) -> None:
    _study(
        root / "cpu",
        "warmup",
        "2. Warmup",
        [
            {
                "claim": "gradual warmup beats none at k=8",
                "replayed": True,
                "evidence": "2.1 vs 5.3",
                "p_for": 0.001,
                "p_against": 1.0,
            },
            {
                "claim": "constant warmup is the worst",
                "replayed": None,
                "evidence": "constant 30.0 vs gradual 29.8; undecided: margin 0.2 inside the seed spread 0.9",
            },
        ],
    )
    _study(
        root / "cpu",
        "quickstart",
        "1. Quickstart",
        [
            {"claim": "a run trains", "replayed": False, "evidence": "error 89% | chance 90%"},
        ],
    )
    _study(
        root / "smoke",
        "warmup",
        "2. Warmup",
        [
            {
                "claim": "gradual warmup beats none at k=8",
                "replayed": None,
                "evidence": "undecided: every run at chance (89-91%, chance 90%)",
            },
        ],
        seeds=(0,),
    )
    (root / "benchmarks").mkdir()  # not a profile: no report
    (root / "benchmarks" / "train_cpu.json").write_text("{}")


def test_report_per_profile_from_a_results_root_and_from_one_profile(tmp_path, capsys):
    _results(tmp_path)
    assert cli.main(["report", "--results", str(tmp_path)]) == 0
    wrote = capsys.readouterr().out.splitlines()
    assert wrote == [f"wrote {tmp_path / p / 'REPORT.md'}" for p in ("cpu", "smoke")]
    assert (
        not (tmp_path / "REPORT.md").exists()
        and not (tmp_path / "benchmarks" / "REPORT.md").exists()
    )

    cpu = (tmp_path / "cpu" / "REPORT.md").read_text()
    smoke = (tmp_path / "smoke" / "REPORT.md").read_text()
    assert "profile `cpu`" in cpu.splitlines()[0] and "profile `smoke`" in smoke.splitlines()[0]
    assert "every run at chance" not in cpu and "margin 0.2" not in smoke  # never mixed
    assert cpu.index("## 1. Quickstart") < cpu.index("## 2. Warmup")  # reading order
    # an undecided finding says why; a decided one shows its evidence; '|' kept inside its cell
    row = next(ln for ln in cpu.splitlines() if "constant warmup is the worst" in ln)
    assert "| undecided | " in row and "margin 0.2 inside the seed spread 0.9" in row
    assert row.count(" | ") == 4
    # a claim decided from a number with no test reads measured, neither yes nor no
    row = next(ln for ln in cpu.splitlines() if "a run trains" in ln)
    assert "| measured | error 89% \\| chance 90% |" in row
    assert "3 claims: 1 replayed, 0 not replayed, 1 undecided, 0 invalid, 1 measured" in cpu
    # links relative to the profile's folder: they work where REPORT.md lies
    for target in re.findall(r"\]\(([^)#]+)\)", cpu):
        assert (tmp_path / "cpu" / target).exists(), target
    assert "(warmup/curve.png)" in cpu and "[`warmup/`](warmup/)" in cpu
    assert "| 30.10 | 23.70 |" in cpu  # the table beside the paper, rounded for reading

    before = (tmp_path / "smoke" / "REPORT.md").stat().st_mtime_ns
    assert cli.main(["report", "--results", str(tmp_path / "cpu")]) == 0  # one profile's folder
    assert capsys.readouterr().out.splitlines() == [f"wrote {tmp_path / 'cpu' / 'REPORT.md'}"]
    assert (tmp_path / "smoke" / "REPORT.md").stat().st_mtime_ns == before


def test_report_of_a_folder_without_findings_is_one_line_and_writes_nothing(tmp_path, capsys):
    (tmp_path / "benchmarks").mkdir()
    before = snapshot(tmp_path)
    assert cli.main(["report", "--results", str(tmp_path)]) == cli.EXIT_BAD_INPUT
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("lbsgd: error:") and str(tmp_path) in lines[0]
    assert snapshot(tmp_path) == before


def test_a_run_written_before_a_key_existed_reads_with_the_keys_default(tmp_path):
    """config.yaml of an older run lacks the keys added since: the table holds their defaults
    (what the run trained with), not NaN, so a study mixing old and new runs can group by them."""
    run_dir = _completed_twin(tmp_path / "cpu", "batch_scaling", {**TINY, "seed": 0})
    keys = yaml.safe_load((run_dir / "config.yaml").read_text())
    del keys["staleness"], keys["noise_scale"]
    (run_dir / "config.yaml").write_text(yaml.safe_dump(keys))
    (row,) = ex.load_runs(run_dir.parent).to_dict("records")
    assert (row["staleness"], row["noise_scale"], row["batch_size"]) == (
        0,
        False,
        TINY["batch_size"],
    )
    assert row["milestones"] == [30.0, 60.0, 80.0]


def test_an_interrupts_summary_counts_runs_that_ended_as_they_were_asked_to_stop(tmp_path):
    """Two runs in flight that both completed before the interrupt's SIGTERM reached them: their
    lines say completed, and so does the summary (it said "2 runs stopped")."""
    from types import SimpleNamespace

    from lbsgd.lab.experiments.interrupts import interrupted
    from lbsgd.lab.experiments.lines import Progress

    jobs, said = [], []
    for seed, status in ((0, "completed"), (1, "completed"), (2, "interrupted")):
        cfg = config.from_dict({**TINY, "seed": seed, "out_dir": str(tmp_path)})
        cfg.run_dir().mkdir(parents=True)
        (cfg.run_dir() / "summary.json").write_text(json.dumps({"status": status, "steps": 7}))
        proc = subprocess.Popen([sys.executable, "-c", "pass"])
        proc.wait()
        log = tmp_path / f"{seed}.log"
        item = SimpleNamespace(cfg=cfg, handle=log.open("a"), log=log)
        jobs.append(SimpleNamespace(item=item, proc=proc, number=seed + 1))
    local = ex.LAUNCHERS["local"](None, said.append, nproc_per_node=1, nnodes=1)
    error = interrupted(
        "study", local, SimpleNamespace(running=jobs, pending=[]), [], Progress(3, said.append)
    )
    assert str(error).startswith(
        "sweep of study 'study' interrupted: 1 run stopped, 2 runs completed; run the same"
    )
    assert [line.split(": ", 1)[1].split(" (log")[0] for line in said[1:]] == [
        "completed at step 7",
        "completed at step 7",
        "interrupted at step 7, no checkpoint",
    ]
    error = interrupted(
        "study", local, SimpleNamespace(running=jobs[:2], pending=[]), [], Progress(2, said.append)
    )
    assert "interrupted: 2 runs completed; run" in str(error) and "stopped" not in str(error)


def test_each_launcher_of_the_registry_is_built_whole_with_every_part_of_the_protocol():
    """A scheduler is one class and one row of LAUNCHERS: each row, built as a sweep builds it,
    has every method and attribute of ex.Launcher (a missing one fails here, not in a sweep's
    interrupt), and counts a run's processes as its nodes hold them."""
    clusters = {"local": None, "slurm": ex.Cluster(tasks_per_node=2)}
    assert set(clusters) == set(ex.LAUNCHERS)
    parts = {p for p in vars(ex.Launcher) if not p.startswith("_")} | {"here", "world_size"}
    built = {}
    for name, cls in ex.LAUNCHERS.items():
        cluster = ex.launcher_of(name, clusters[name])
        built[name] = cls(
            cluster, print, nproc_per_node=2, nnodes=3, rdzv_endpoint="h:1", max_restarts=0
        )
        assert sorted(p for p in parts if not hasattr(built[name], p)) == [], name
    assert {n: (b.here, b.world_size) for n, b in built.items()} == {
        "local": (True, 6),
        "slurm": (False, 12),
    }
