"""Training state to disk and back.

A checkpoint is one ``torch.save`` dict: model and optimizer state, the number of optimizer steps
done, the config it was made with, and the RNG state. It is written to a temporary file in the run
directory and renamed over ``checkpoint.pt`` (a crash mid-write leaves the previous checkpoint
intact), and loaded with ``weights_only=True`` so that no pickled code runs.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

NAME = "checkpoint.pt"


def save(run_dir: Path, state: dict[str, Any]) -> Path:
    path = Path(run_dir) / NAME
    tmp = path.with_name(f".{NAME}.tmp")
    torch.save(state, tmp)
    os.replace(tmp, path)
    return path


def load(run_dir: Path) -> dict[str, Any] | None:
    path = Path(run_dir) / NAME
    if not path.exists():
        return None
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - any unreadable file gets the same clear message
        raise RuntimeError(
            f"checkpoint {str(path)!r} cannot be loaded ({type(e).__name__}: {e})"
        ) from e
