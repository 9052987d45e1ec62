"""Nothing written until it is good: every file the package writes over (a result that may be
committed) is written beside it and moved into place whole, so that an error or a crash while
writing leaves the file there before as it was. Each path starts from a committed file and a
write that fails halfway."""

import json
import shutil
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import pandas as pd
import pytest

from lbsgd import rundir
from lbsgd.lab import experiments as ex
from lbsgd.lab import findings, report

REPO = Path(__file__).resolve().parents[1]
WARMUP = REPO / "results" / "cpu" / "warmup"


class HalfWrite(OSError):
    """The disk filling up, or the process killed, with half the file written."""


def _half_write_text(self, data, *args, **kwargs):
    Path.write_bytes(self, data[: len(data) // 2].encode())
    raise HalfWrite(f"{self}: no space left on device")


def _committed_copy(tmp_path: Path, name: str) -> tuple[Path, bytes]:
    """``name`` of the committed cpu warmup study, copied into ``tmp_path``."""
    path = tmp_path / name
    shutil.copy(WARMUP / name, path)
    return path, path.read_bytes()


def _untouched(path: Path, before: bytes) -> None:
    assert path.read_bytes() == before
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no partial file left


def test_findings_json_is_whole_after_a_write_that_fails_halfway(tmp_path, monkeypatch):
    path, before = _committed_copy(tmp_path, findings.FILE)
    found = [
        findings.Finding(**{**findings.Finding.from_dict(d).__dict__})
        for d in json.loads(before)["findings"]
    ]
    monkeypatch.setattr(Path, "write_text", _half_write_text)
    with pytest.raises(HalfWrite):
        findings.write(tmp_path, "warmup", "cpu", [0, 1, 2], found)
    _untouched(path, before)


def test_summary_json_is_whole_after_a_write_that_fails_halfway(tmp_path, monkeypatch):
    run = next(p for p in WARMUP.iterdir() if (p / "summary.json").is_file())
    (tmp_path / "run").mkdir()
    path = tmp_path / "run" / "summary.json"
    shutil.copy(run / "summary.json", path)
    before = path.read_bytes()
    monkeypatch.setattr(Path, "write_text", _half_write_text)
    with pytest.raises(HalfWrite):
        rundir.write_summary(tmp_path / "run", json.loads(before))
    _untouched(path, before)


def test_report_md_is_whole_after_a_write_that_fails_halfway(tmp_path, monkeypatch):
    profile = tmp_path / "cpu"
    shutil.copytree(
        REPO / "results" / "cpu", profile, ignore=shutil.ignore_patterns("resnet*", "alexnet*")
    )
    before = (profile / "REPORT.md").read_bytes()
    monkeypatch.setattr(Path, "write_text", _half_write_text)
    with pytest.raises(HalfWrite):
        report.write(profile)
    assert (profile / "REPORT.md").read_bytes() == before
    assert not list(profile.glob(".REPORT*"))


class Unprintable:
    def __str__(self):
        raise ValueError("a cell that cannot be written")

    __repr__ = __format__ = lambda self, *a: self.__str__()


def test_a_table_is_whole_after_a_row_that_cannot_be_written(tmp_path):
    """pandas writes a CSV row by row into the open file: a row that fails leaves the rows
    before it as the whole file, were it written in place."""
    (tmp_path / "warmup").mkdir()
    path, before = _committed_copy(tmp_path / "warmup", "table.csv")
    rows = [{"k": k, "v": 1.0} for k in range(5000)] + [{"k": 5000, "v": Unprintable()}]
    with pytest.raises(ValueError, match="cannot be written"):
        ex.save_table(pd.DataFrame(rows), tmp_path, "warmup")
    _untouched(path, before)


def test_a_figure_is_whole_after_a_write_that_fails_halfway(tmp_path, monkeypatch):
    """matplotlib hands the drawn image to PIL, which writes it into the open file: a failure
    there (a full disk) leaves half a PNG, were it written in place."""
    from PIL import Image

    name = next(p.name for p in WARMUP.glob("*.png"))
    (tmp_path / "warmup").mkdir()
    path, before = _committed_copy(tmp_path / "warmup", name)

    def half_save(image, fp, *args, **kwargs):
        Path(fp).write_bytes(before[: len(before) // 2])
        raise HalfWrite(f"{fp}: no space left on device")

    monkeypatch.setattr(Image.Image, "save", half_save)
    fig, ax = plt.subplots()
    ax.plot([1, 2], [1, 2])
    with pytest.raises(HalfWrite):
        ex.save_figure(fig, tmp_path, "warmup", name)
    plt.close(fig)
    _untouched(path, before)
