"""What produced a result: versions, hardware and the code's git commit (stored in summary.json)."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

import torch


def _version(pkg: str) -> str | None:
    try:
        return metadata.version(pkg)
    except metadata.PackageNotFoundError:
        return None


def git_commit(path: Path | None = None) -> str | None:
    """HEAD of the checkout holding lbsgd, with ``-dirty`` when it has uncommitted changes."""
    where = path or Path(__file__).resolve().parent
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=where, capture_output=True,
                             text=True, timeout=10, check=True).stdout.strip()  # fmt: skip
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=where,
                               capture_output=True, text=True, timeout=10).stdout.strip()  # fmt: skip
        return sha + ("-dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return None


def environment(device: torch.device, world_size: int) -> dict[str, Any]:
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
    }
    if device.type == "cuda":
        env["gpu"] = torch.cuda.get_device_name(device)
        env["cuda"] = torch.version.cuda
        env["cudnn"] = torch.backends.cudnn.version()
        env["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
        # TF32 convolutions (cuDNN's default): the layout guarantee holds to TF32's precision
        env["tf32_conv"] = torch.backends.cudnn.allow_tf32
        env["tf32_matmul"] = torch.backends.cuda.matmul.allow_tf32
    return env
