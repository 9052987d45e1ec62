"""README's first commands leave a checkout as git found it: what they write goes where results go,
into folders git ignores, and `git status` stays empty.

The commands are read from README.md itself (so README and this test cannot drift): every
``.venv/bin/lbsgd train`` line of its code blocks and of docs/training.md's, and README's headless
papermill example. They run in a fresh repository holding this checkout's files (tracked, and
untracked ones git does not ignore: what a clone of it would hold once committed), with only
smoke-size overrides appended.
"""

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import TINY, as_args, subprocess_env

REPO = Path(__file__).resolve().parents[1]
README = (REPO / "README.md").read_text()
TRAINING = (REPO / "docs" / "training.md").read_text()  # the training page README links to

pytestmark = pytest.mark.skipif(
    shutil.which("git") is None or not (REPO / ".git").exists(), reason="not a git checkout"
)

# The scale of the test appended to README's training commands: TINY's seconds-long run, on any
# CPU (README's quickstart caps the kernels to AVX2), no W&B server.
SMALL_RUN = [*as_args(TINY), "epochs=0.5", "cpu_isa=native"]
# ... and to its notebook example (already at the smoke profile)
SMALL_NOTEBOOK = ["-p", "wandb", "disabled"]
# git as a fresh machine has it: no user-wide or system-wide ignore rules that could hide a file
GIT_ENV = {"GIT_CONFIG_GLOBAL": os.devnull, "GIT_CONFIG_NOSYSTEM": "1"}


def train_commands() -> list[list[str]]:
    """README's and docs/training.md's ``.venv/bin/lbsgd train …`` lines, as argument lists
    (comments dropped)."""
    lines = re.findall(r"^\.venv/bin/lbsgd train .*$", README + TRAINING, re.MULTILINE)
    return [shlex.split(line, comments=True) for line in lines]


def headless_commands() -> list[list[str]]:
    """README's headless notebook example, one argument list per command of its ``&&`` chain."""
    (example,) = re.findall(r"Headless: `([^`]+)`", README)
    return [shlex.split(part) for part in " ".join(example.split()).split("&&")]


def runnable(argv: list[str]) -> list[str]:
    """``.venv/bin/X …`` as ``python -m X …`` with this interpreter (the fresh copy has no .venv)."""
    program = argv[0].removeprefix(".venv/bin/")
    return [sys.executable, "-m", program, *argv[1:]] if program != argv[0] else argv


def git(cwd: Path, *args: str) -> str:
    env = {**os.environ, **GIT_ENV}
    return subprocess.run(
        ["git", *args], cwd=cwd, env=env, check=True, capture_output=True, text=True
    ).stdout


def fresh_copy(dest: Path) -> Path:
    """A new repository holding this checkout's files, committed: as a clone of it would be."""
    files = git(REPO, "ls-files", "-z", "--cached", "--others", "--exclude-standard").split("\0")
    for name in filter(None, files):
        if (REPO / name).is_file():  # a tracked file deleted in the working tree stays deleted
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, dest / name)
    git(dest, "init", "-q")
    git(dest, "add", "-A")
    git(dest, "-c", "user.name=lbsgd", "-c", "user.email=lbsgd@localhost", "commit", "-qm", "copy")
    return dest


def test_readme_holds_the_commands_this_test_runs():
    assert [c[:4] for c in train_commands()] == [
        [".venv/bin/lbsgd", "train", "-c", "configs/quickstart.yaml"],
        [".venv/bin/lbsgd", "train", "batch_size=8192", "warmup=gradual"],
    ]
    assert [c[:2] for c in headless_commands()] == [
        ["mkdir", "-p"],
        [".venv/bin/lbsgd", "execute"],
    ]


@pytest.mark.slow
def test_readmes_training_and_notebook_commands_leave_git_status_empty(tmp_path):
    clone = fresh_copy(tmp_path / "lbsgd")
    assert git(clone, "status", "--porcelain") == ""
    # the copy's own lbsgd, whatever the environment's path holds; CPU semantics on any machine
    env = subprocess_env(CUDA_VISIBLE_DEVICES="")
    env["PYTHONPATH"] = os.pathsep.join([str(clone), env.get("PYTHONPATH", "")])
    commands = [[*c, *SMALL_RUN] for c in train_commands()]
    commands += [c + SMALL_NOTEBOOK if "execute" in c else c for c in headless_commands()]
    for argv in commands:
        r = subprocess.run(
            runnable(argv), cwd=clone, env=env, capture_output=True, text=True, timeout=600
        )
        assert r.returncode == 0, f"{shlex.join(argv)}:\n{r.stdout[-2000:]}\n{r.stderr[-3000:]}"

    # the main job over a committed study (every run complete: skipped), as make reproduce
    # executes it, re-writes its executed notebook, table, findings and figure as committed
    study = ["notebooks/01_quickstart.ipynb", "results/cpu/quickstart/01_quickstart.ipynb"]
    params = ["-p", "profile", "cpu", "-p", "nproc_per_node", "1", "-p", "parallel", "2"]
    main_job = [".venv/bin/lbsgd", "execute", "--log-output", *study, *params, "-p", "out_dir"]
    r = subprocess.run(
        runnable([*main_job, "results"]), cwd=clone, env=env, capture_output=True, text=True
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert "skipped" in r.stdout, r.stdout[-2000:]

    assert git(clone, "status", "--porcelain", "--untracked-files=all") == ""
    # ... because each wrote where its results go (not nowhere): the command line's runs in
    # results/cli/<study>/, the executed notebook beside its study's results
    summaries = sorted(p.parent.parent.name for p in clone.glob("results/cli/*/*/summary.json"))
    assert summaries == ["quickstart", "runs"], summaries
    assert (clone / "results" / "smoke" / "warmup" / "02_warmup.ipynb").is_file()
    assert list((clone / "results" / "smoke" / "warmup").glob("*/summary.json"))
