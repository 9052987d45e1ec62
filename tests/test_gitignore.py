"""What runs, notebooks and JupyterLab write beside the results stays out of git (checkpoints,
W&B's local files, smoke-scale results, JupyterLab's own files), and the results do not."""

import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.skipif(
    shutil.which("git") is None or not (REPO / ".git").exists(), reason="not a git checkout"
)


def ignored(path: str) -> bool:
    return (
        subprocess.run(["git", "check-ignore", "-q", "--no-index", path], cwd=REPO).returncode == 0
    )


@pytest.mark.parametrize(
    "path",
    [
        "results/cpu/warmup/run-s0-1234abcd/checkpoint.pt",
        "results/cpu/warmup/run-s0-1234abcd/checkpoint.prev.pt",
        "results/cpu/warmup/run-s0-1234abcd/.checkpoint.pt.tmp",
        "results/cpu/warmup/run-s0-1234abcd/wandb/offline-run-1/run-1.wandb",
        "results/cpu/warmup/run-s0-1234abcd/wandb_id",
        "results/cpu/warmup/wandb/study_id",
        "results/cpu/warmup/wandb_id",
        "results/smoke/warmup/02_warmup.ipynb",
        "results/cli/quickstart/resnet8-synthetic-b256-gradual-s0-1234abcd/summary.json",
        "results/cli/runs/resnet20-synthetic-b256-gradual-s0-1234abcd/config.yaml",
        # lbsgd train run from a subfolder (a JupyterLab terminal in notebooks/)
        "notebooks/results/cli/runs/resnet20-synthetic-b256-gradual-s0-1234abcd/summary.json",
        "notebooks/.ipynb_checkpoints/02_warmup-checkpoint.ipynb",
        # lbsgd execute's copies of a failed, an interrupted and a running execution
        "results/cpu/warmup/02_warmup.failed.ipynb",
        "results/cpu/warmup/02_warmup.interrupted.ipynb",
        "results/fashion/warmup/02_warmup.running.ipynb",
        # dataset=fashion_mnist's data_dir when Debian's is absent (lbsgd data fetch fashion_mnist)
        "data/fashion_mnist/FashionMNIST/raw/train-images-idx3-ubyte.gz",
    ],
)
def test_what_is_not_a_result_is_ignored(path):
    assert ignored(path)


@pytest.mark.parametrize(
    "path",
    [
        "results/cpu/warmup/run-s0-1234abcd/summary.json",
        "results/cpu/warmup/run-s0-1234abcd/metrics.jsonl",
        "results/cpu/warmup/run-s0-1234abcd.log",
        "results/cpu/warmup/02_warmup.ipynb",
        "results/cpu/warmup/table.csv",
        "results/cpu/REPORT.md",
        "lbsgd/data/fashion_mnist.py",  # the package's data/ is code
    ],
)
def test_results_are_not_ignored(path):
    assert not ignored(path)


def test_make_lab_works_on_ignored_copies_and_keeps_an_edited_one(tmp_path):
    """make lab-copies (what make lab runs first): every notebook copied into lab/, which git
    ignores; a copy already there (a user's edits) kept; notebooks/ untouched."""
    repo = Path(__file__).resolve().parents[1]
    for name in ("Makefile", ".gitignore"):
        shutil.copy2(repo / name, tmp_path / name)
    shutil.copytree(repo / "notebooks", tmp_path / "notebooks")
    run = {"cwd": tmp_path, "check": True, "capture_output": True, "text": True}
    subprocess.run(["git", "init", "-q"], **run)
    subprocess.run(["git", "add", "-A"], **run)
    who = ["-c", "user.name=lbsgd", "-c", "user.email=lbsgd@localhost"]
    subprocess.run(["git", *who, "commit", "-qm", "notebooks"], **run)
    (tmp_path / "lab").mkdir()
    edited = tmp_path / "lab" / "02_warmup.ipynb"
    edited.write_text("{}")  # a copy the user changed
    subprocess.run(["make", "-s", "lab-copies"], **run)
    committed = sorted(p.name for p in (tmp_path / "notebooks").glob("*.ipynb"))
    assert sorted(p.name for p in (tmp_path / "lab").glob("*.ipynb")) == committed
    assert edited.read_text() == "{}"
    assert (tmp_path / "lab" / "01_quickstart.ipynb").read_bytes() == (
        repo / "notebooks" / "01_quickstart.ipynb"
    ).read_bytes()
    status = subprocess.run(["git", "status", "--porcelain", "--ignored=no"], **run).stdout
    assert status.strip() == "", status  # lab/ ignored; nothing else changed


def test_a_run_folder_shows_in_git_once_its_run_has_ended(tmp_path):
    """An interrupted (or running, or failed) run folder is no untracked clutter in git status;
    the same folder once completed (or diverged: a result too) is."""
    from lbsgd import rundir

    run = {"cwd": tmp_path, "check": True, "capture_output": True, "text": True}
    subprocess.run(["git", "init", "-q"], **run)
    folder = tmp_path / "results" / "cpu" / "warmup" / "run-s0-1234abcd"
    folder.mkdir(parents=True)
    (folder / "metrics.jsonl").write_text("{}\n")
    summary = {"run": "run-s0-1234abcd", "study": "warmup", "experiment_id": "1234abcd"}
    summary |= {"steps": 5, "total_steps": 10, "environment": {}}
    status = ["git", "status", "--porcelain", "--untracked-files=all"]
    for state, shown in [("interrupted", False), ("completed", True), ("failed", False)]:
        rundir.write_summary(folder, {**summary, "status": state})
        assert bool(subprocess.run(status, **run).stdout.strip()) is shown, state
    rundir.write_summary(folder, {**summary, "status": "diverged"})
    assert "results/cpu/warmup/run-s0-1234abcd/summary.json" in subprocess.run(status, **run).stdout
