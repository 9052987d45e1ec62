"""What produced a result: versions, hardware, the CPU kernels' instruction set, torch's build, the
data trained on and the code's git commit (stored in summary.json)."""

from __future__ import annotations

import hashlib
import os
import platform
import re
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import Dataset, Subset, TensorDataset

from lbsgd import isa
from lbsgd.data.device_images import DeviceImages


def _version(pkg: str) -> str | None:
    try:
        return metadata.version(pkg)
    except metadata.PackageNotFoundError:
        return None


def git_commit(path: Path | None = None) -> str | None:
    """HEAD of the checkout holding lbsgd, with ``-dirty`` when it has uncommitted changes."""
    where = path or Path(__file__).resolve().parent

    def git(*args: str, check: bool = True) -> str:
        out = subprocess.run(
            ["git", *args], cwd=where, capture_output=True, text=True, timeout=10, check=check
        )
        return out.stdout.strip()

    try:
        sha = git("rev-parse", "HEAD")
        return sha + (
            "-dirty" if git("status", "--porcelain", "--untracked-files=no", check=False) else ""
        )
    except (OSError, subprocess.SubprocessError):
        return None


def torch_build() -> dict[str, Any]:
    """torch's build configuration: sha1 of ``torch.__config__.show()`` and its CPU-library lines
    (MKL, oneDNN, OpenMP, LAPACK, BLAS_INFO). The line of the CPU capability in use is left out of
    both: it is this process's cap (``cpu_isa`` records it), not the build."""
    shown = [
        line for line in torch.__config__.show().splitlines() if "CPU capability usage" not in line
    ]
    lines = [
        line.strip().removeprefix("- ")
        for line in shown
        if re.search(r"Math Kernel|MKL-DNN|oneDNN|OpenMP|LAPACK is", line)
    ]
    lines += re.findall(r"\b(?:BLAS_INFO|LAPACK_INFO)=[^,\s]*", "\n".join(shown))
    return {"sha1": hashlib.sha1("\n".join(shown).encode()).hexdigest(), "cpu_libraries": lines}


def _files(train: Dataset) -> tuple[Path, list] | None:
    """(root, [(path, label), …]) of a split read from files (ImageFolder), or of the part of one
    that a ``Subset`` takes (a train split less its held-out images); else None."""
    base, indices = (train.dataset, train.indices) if isinstance(train, Subset) else (train, None)
    samples = getattr(base, "samples", None)
    if not isinstance(samples, list) or not hasattr(base, "root"):
        return None
    return Path(base.root), samples if indices is None else [samples[i] for i in indices]


def dataset_digest(train: Dataset) -> dict[str, Any]:
    """sha1 of a training split: of its tensors when it is held in memory (the generated
    synthetic and fake splits, CIFAR-10's uint8 images: dtype, shape and bytes of each, labels
    included), of its file list (path below the root, label, size in bytes) when it is read from
    files (ImageFolder, or a Subset of one), else None. ``over`` says which; ``samples`` is the
    split's length."""
    h = hashlib.sha1()
    files = _files(train)
    if isinstance(train, TensorDataset | DeviceImages):
        tensors = (
            train.tensors if isinstance(train, TensorDataset) else (train.images, train.labels)
        )
        for t in tensors:
            t = t.detach().to("cpu").contiguous()
            h.update(f"{t.dtype} {tuple(t.shape)};".encode())
            h.update(t.reshape(-1).view(torch.uint8).numpy().data)  # the bytes, no copy
        over = "tensors"
    elif files is not None:
        root, samples = files
        for path, label in samples:
            rel = Path(path).relative_to(root).as_posix()
            h.update(f"{rel}\t{label}\t{os.stat(path).st_size}\n".encode())
        over = "files"
    else:
        return {"sha1": None, "over": type(train).__name__, "samples": len(train)}  # type: ignore[arg-type]
    return {"sha1": h.hexdigest(), "over": over, "samples": len(train)}  # type: ignore[arg-type]


def environment(
    device: torch.device,
    world_size: int,
    *,
    cpu_isa: str | None = None,
    train_split: Dataset | None = None,
) -> dict[str, Any]:
    """What a run ran on. ``cpu_isa``: the cap its config asked for (the record says whether each
    CPU library follows it); ``train_split``: the data it trains on, digested."""
    env: dict[str, Any] = {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "lbsgd": _version("lbsgd"),
        "torch": torch.__version__,
        "torchvision": _version("torchvision"),
        "numpy": _version("numpy"),
        "wandb": _version("wandb"),
        "git_commit": git_commit(),
        "device": str(device),
        "world_size": world_size,
        "threads_per_process": torch.get_num_threads(),
        "cpu": platform.processor() or platform.machine(),
        "cpu_count": len(os.sched_getaffinity(0))
        if hasattr(os, "sched_getaffinity")
        else os.cpu_count(),  # the cores this process may run on
        "cpu_model": isa.cpu_model(),
        "isa_flags": isa.isa_flags(),
        "cpu_isa": isa.in_force(cpu_isa),  # the caps set, and what each CPU library uses
        "torch_build": torch_build(),
    }
    if train_split is not None:
        env["dataset_digest"] = dataset_digest(train_split)
    if device.type == "cuda":
        env["gpu"] = torch.cuda.get_device_name(device)
        env["cuda"] = torch.version.cuda
        env["cudnn"] = torch.backends.cudnn.version()
        env["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
        # TF32 convolutions (cuDNN's default): the layout guarantee holds to TF32's precision
        env["tf32_conv"] = torch.backends.cudnn.allow_tf32
        env["tf32_matmul"] = torch.backends.cuda.matmul.allow_tf32
    return env
