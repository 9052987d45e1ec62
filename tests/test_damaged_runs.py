"""Damaged runs named: a run folder whose summary.json or config.yaml is missing or unreadable
stops every reader in one line naming it (load_runs, a study's read, lbsgd report: exit 2, its
REPORT.md left as it was) unless the user asks to leave damaged runs out, when each is named in a
warning line; a metrics.jsonl cut mid-record by a crash is read up to its last full record, and
said so."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import subprocess_env

from lbsgd.config import ConfigError
from lbsgd.lab import experiments as ex
from lbsgd.lab.experiments import results

REPO = Path(__file__).resolve().parents[1]
CPU = REPO / "results" / "cpu"


def _damaged_copy(tmp_path: Path) -> tuple[Path, Path, Path]:
    """results/cpu/warmup copied, one run's summary.json deleted and another's cut mid-line."""
    study = tmp_path / "cpu" / "warmup"
    shutil.copytree(CPU / "warmup", study)
    shutil.copy(CPU / "REPORT.md", tmp_path / "cpu" / "REPORT.md")
    a, b = sorted(p.parent for p in study.glob("*/summary.json"))[:2]
    (a / "summary.json").unlink()
    text = (b / "summary.json").read_text()
    (b / "summary.json").write_text(text[: len(text) // 2])
    return study, a, b


def test_load_runs_names_each_damaged_run_in_one_line_or_leaves_it_out_when_asked(
    tmp_path, capsys, monkeypatch
):
    study, a, b = _damaged_copy(tmp_path)
    every = len(list((CPU / "warmup").glob("*/summary.json")))
    with pytest.raises(ConfigError) as e:
        ex.load_runs(study)
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("2 run folder(s) cannot be read: ")
    assert f"{a} (summary.json missing)" in msg and f"{b} (summary.json unreadable" in msg
    monkeypatch.setenv(results.SKIP_DAMAGED, "1")
    assert len(ex.load_runs(study)) == every - 2
    warned = capsys.readouterr().err.splitlines()
    assert (
        warned
        == [
            f"lbsgd: warning: {a} left out (summary.json missing)",
            *[
                w
                for w in warned
                if w.startswith(f"lbsgd: warning: {b} left out (summary.json unreadable")
            ],
        ]
        and len(warned) == 2
    )


def test_lbsgd_report_stops_at_a_damaged_run_and_keeps_its_report(tmp_path):
    study, a, _ = _damaged_copy(tmp_path)
    before = (tmp_path / "cpu" / "REPORT.md").read_bytes()
    for d in CPU.iterdir():  # the profile's other studies, whole
        if d.is_dir() and d.name != "warmup":
            shutil.copytree(d, tmp_path / "cpu" / d.name)
    cmd = [sys.executable, "-m", "lbsgd", "report", "--results", str(tmp_path / "cpu")]
    r = subprocess.run(cmd, capture_output=True, text=True, env=subprocess_env())
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert (
        r.stderr.startswith("lbsgd: error: 2 run folder(s) cannot be read: ") and str(a) in r.stderr
    )
    assert (tmp_path / "cpu" / "REPORT.md").read_bytes() == before
    r = subprocess.run(
        [*cmd, "--skip-damaged"], capture_output=True, text=True, env=subprocess_env()
    )
    assert r.returncode == 0 and r.stderr.count("left out") == 2, r.stderr
    every = len(list((CPU / "warmup").glob("*/summary.json")))
    text = (tmp_path / "cpu" / "REPORT.md").read_text()
    assert f"; {every - 2} runs (" in text.split("folder [`warmup/`]")[0].splitlines()[-1]


def test_a_metrics_file_cut_mid_record_is_read_to_its_last_full_record_and_said_so(
    tmp_path, capsys
):
    run = next(p.parent for p in (CPU / "warmup").glob("*/metrics.jsonl"))
    lines = (run / "metrics.jsonl").read_text().splitlines()
    path = tmp_path / "metrics.jsonl"
    path.write_text("\n".join(lines[:-1]) + "\n" + lines[-1][: len(lines[-1]) // 2])
    assert results.read_metrics(path) == [json.loads(x) for x in lines[:-1]]
    (line,) = capsys.readouterr().err.splitlines()
    assert line == (
        f"lbsgd: warning: {path} ends in a partial record (line {len(lines)}, cut by a crash): "
        "read up to its last full record"
    )
    path.write_text("\n".join([lines[0], lines[1][:10], *lines[2:]]) + "\n")
    with pytest.raises(ConfigError, match=f"{path}: line 2 of {len(lines)} is not a JSON record"):
        results.read_metrics(path)


def test_lbsgd_verify_names_each_damaged_run_and_stops_unless_asked_to_skip(tmp_path):
    """A summary.json deleted and a metrics.jsonl damaged before its last record: one line each
    (the folder and why), exit 1 before any replay; with --skip-damaged the same lines, then on
    (here to the unknown run name it was given: exit 2, its own line)."""
    study, a, b = _damaged_copy(tmp_path)
    shutil.copy(CPU / "warmup" / b.name / "summary.json", b / "summary.json")  # b whole again
    lines = (b / "metrics.jsonl").read_text().splitlines()
    (b / "metrics.jsonl").write_text("\n".join([lines[0], "{", *lines[2:]]) + "\n")
    cmd = [sys.executable, "-m", "lbsgd", "verify", "--results", str(tmp_path / "cpu")]
    r = subprocess.run([*cmd, "--runs", "x"], capture_output=True, text=True, env=subprocess_env())
    err = r.stderr.splitlines()
    assert r.returncode == 1 and len(err) == 3, r.stderr
    assert f"lbsgd verify: damaged: {a} (summary.json missing)" in err
    assert any(e.startswith(f"lbsgd verify: damaged: {b} (metrics.jsonl unreadable") for e in err)
    assert "line 2 of" in r.stderr and "--skip-damaged" in err[-1]
    r = subprocess.run(
        [*cmd, "--runs", "x", "--skip-damaged"],
        capture_output=True,
        text=True,
        env=subprocess_env(),
    )
    assert r.returncode == 2 and r.stderr.count("lbsgd verify: damaged: ") == 2
    assert r.stderr.splitlines()[-1].startswith("lbsgd: error:") and r.stdout == ""


def test_report_and_verify_name_a_metrics_file_cut_mid_record(tmp_path):
    """A committed run whose metrics.jsonl ends mid-record: ``lbsgd report`` and ``lbsgd verify``
    each name the file in one warning line and go on (report: exit 0; verify: to its own line
    about the unknown run it was given, exit 2)."""
    shutil.copytree(CPU / "warmup", tmp_path / "cpu" / "warmup")
    run = next(p.parent for p in (tmp_path / "cpu" / "warmup").glob("*/metrics.jsonl"))
    text = (run / "metrics.jsonl").read_text()
    (run / "metrics.jsonl").write_text(text[: len(text) - 40])
    warning = f"lbsgd: warning: {run / 'metrics.jsonl'} ends in a partial record"
    for cmd, code in [(["report"], 0), (["verify", "--runs", "x"], 2)]:
        argv = [sys.executable, "-m", "lbsgd", *cmd, "--results", str(tmp_path / "cpu")]
        r = subprocess.run(argv, capture_output=True, text=True, env=subprocess_env())
        assert r.returncode == code, r.stderr
        assert r.stderr.count(warning) == 1, r.stderr
