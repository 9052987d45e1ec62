"""What the tests share: the tiny run (:data:`TINY`), the environment of the processes they start,
and the one way they start lbsgd (:func:`lbsgd`, :func:`start`: alone or under torchrun)."""

import os
import site
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest

from lbsgd import launch
from lbsgd.config import Config

# A few seconds per run on one CPU thread: ResNet-8 (width 8) on 512 easy synthetic images.
# device=cpu: the tests hold CPU semantics (gloo, bitwise-repeatable kernels) on any machine; the
# CUDA tests (tests/test_cuda.py) override it.
TINY = {
    "model": "resnet",
    "depth": 8,
    "width": 8,
    "synthetic_train": 512,
    "synthetic_test": 256,
    "synthetic_difficulty": "easy",
    "batch_size": 64,
    "bn_batch": 16,
    "base_lr": 0.05,
    "reference_batch": 64,
    "warmup_epochs": 0.5,
    "schedule": "cosine",
    "epochs": 2,
    "threads": 1,
    "device": "cpu",
    "wandb": "disabled",
    "log_every": 3,
}


# The tiny config's learning run (tests/test_precision.py, test_cuda.py): 4,000
# easy images, 3 epochs at batch 32 (375 steps), gamma=1 (at this scale gamma=0 lengthens the
# initial plateau beyond 3 epochs). Chance is 90% top-1 error; measured ~53% in fp32 on the CPU.
LEARNING = {
    "synthetic_train": 4000,
    "synthetic_test": 1000,
    "batch_size": 32,
    "reference_batch": 32,
    "base_lr": 0.1,
    "epochs": 3,
    "warmup_epochs": 0.3,
    "zero_init_residual": False,
}


def tiny_keys(**overrides) -> dict:
    """:data:`TINY` with ``overrides`` (a test that needs other values says which)."""
    return {**TINY, **overrides}


def used_keys(keys: Mapping) -> dict:
    """``keys`` less those that their own setting ignores (lbsgd.config.checks.USED_ONLY_WHEN:
    the synthetic sizes once the dataset is another, warmup_epochs under warmup=none), which
    ``lbsgd train`` refuses: for a test that changes the setting of the tiny run."""
    from lbsgd.config.checks import without_ignored

    return without_ignored(keys)


def tiny_subset(names: Sequence[str], **overrides) -> dict:
    """Only the keys ``names`` of :data:`TINY`, then ``overrides``: for a benchmark command, whose
    own defaults (``lbsgd.bench.train.DEFAULTS``) supply the other keys."""
    return {**{k: TINY[k] for k in names}, **overrides}


def as_args(keys: Mapping) -> list[str]:
    """``key=value`` arguments of ``lbsgd train``, in the order of ``keys``."""
    return [f"{k}={v}" for k, v in keys.items()]


def subprocess_env(**extra: str | None) -> dict[str, str]:
    """The environment of the processes a test starts (``python -m lbsgd``, torchrun and its
    workers, a worker script): one intra-op thread each, Python's fault handler on, and the lbsgd
    this session imported first on the import path, so that they run the code under test whether
    it is installed into the interpreter or only in this checkout, from any working directory. The
    caller's PYTHONPATH is kept (a cluster image may hold torch there). ``extra``: variables set,
    or (None) removed."""
    root = str(Path(launch.__file__).resolve().parent.parent)
    kept = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    site_dirs = {
        str(Path(p).resolve()) for p in [*site.getsitepackages(), site.getusersitepackages()]
    }
    path = kept if root in site_dirs else [root, *(p for p in kept if p != root)]
    # a process killed by a fatal signal (SIGABRT, SIGSEGV) prints every thread's Python stack
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONFAULTHANDLER": "1", **extra}
    if path:
        env["PYTHONPATH"] = os.pathsep.join(path)
    return {k: v for k, v in env.items() if v is not None}


LBSGD = ("-m", "lbsgd")


def command(
    args: Sequence[str],
    nproc: int | None = None,
    *,
    program: Sequence[str] = LBSGD,
    max_restarts: int | None = None,
) -> list[str]:
    """``python -m lbsgd *args`` (``program``: a worker script instead), or the same under torchrun
    with ``nproc`` processes (one agent, c10d rendezvous on a free port)."""
    if not nproc:
        return [sys.executable, *program, *args]
    return [*launch.torchrun(nproc, max_restarts=max_restarts), *program, *args]


def lbsgd(
    args: Sequence[str],
    nproc: int | None = None,
    *,
    program: Sequence[str] = LBSGD,
    max_restarts: int | None = None,
    env: Mapping[str, str | None] | None = None,
    cwd: Path | str | None = None,
    timeout: float = 240,
) -> subprocess.CompletedProcess:
    """Run :func:`command` to its end with :func:`subprocess_env` (``env``: variables added, or
    removed when None); its output captured as text."""
    return subprocess.run(
        command(args, nproc, program=program, max_restarts=max_restarts),
        capture_output=True,
        text=True,
        timeout=timeout,
        env=subprocess_env(**(env or {})),
        cwd=cwd,
    )


def start(
    args: Sequence[str],
    nproc: int | None = None,
    *,
    program: Sequence[str] = LBSGD,
    env: Mapping[str, str | None] | None = None,
    **popen,
) -> subprocess.Popen:
    """:func:`lbsgd` without waiting: for a test that signals the run or reads it as it goes."""
    return subprocess.Popen(
        command(args, nproc, program=program), env=subprocess_env(**(env or {})), **popen
    )


def pytest_collection_modifyitems(config, items):
    """Tests marked ``cuda`` need a CUDA device: skipped, saying so, where torch sees none."""
    marked = [item for item in items if item.get_closest_marker("cuda")]
    if not marked:
        return
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device: torch.cuda.is_available() is False")
    for item in marked:
        item.add_marker(skip)


@pytest.fixture(autouse=True, scope="session")
def _shared_cache(tmp_path_factory):
    """One synthetic-data cache for the session (the generator is tested on its own), shared by
    pytest-xdist's workers: their temporary folders sit in one per-session folder, and a cache
    file is written to a temporary name and renamed, so a worker reads a whole file or none."""
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # pytest-of-USER/pytest-N/, above the worker's popen-gwK/
    os.environ.setdefault("LBSGD_CACHE", str(root / "synthetic-cache"))
    os.environ["WANDB_SILENT"] = "true"


def real_fashion_mnist(ci: bool) -> Path:
    """The folder of the real Fashion-MNIST files (dataset=fashion_mnist's default data_dir), checked
    whole. Where they are missing or damaged: the test is skipped with one line saying how to get
    them, except under CI (``ci``: CI=true), where it fails: CI installs them (.ci/run), and a
    real-data test must never be skipped silently there."""
    from lbsgd.data import fashion_mnist

    try:
        fashion_mnist.check(None)
    except (FileNotFoundError, ValueError) as e:
        if ci:
            pytest.fail(f"CI=true and the real Fashion-MNIST files cannot be read: {e}")
        pytest.skip(f"real Fashion-MNIST files needed: {e}")
    return fashion_mnist.default_dir()


@pytest.fixture(scope="session")
def fashion_mnist_dir() -> Path:
    """:func:`real_fashion_mnist` for this session's environment."""
    return real_fashion_mnist(os.environ.get("CI") == "true")


@pytest.fixture
def tiny(tmp_path):
    def make(**kw) -> Config:
        return Config(**{**TINY, "out_dir": str(tmp_path / "results"), **kw})

    return make
