"""lbsgd: large-minibatch distributed SGD, replayable on a laptop CPU and on multi-GPU nodes."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from lbsgd.config import Config, ConfigError, derive
from lbsgd.config import load as load_config

if TYPE_CHECKING:
    from lbsgd.data import Splits, register_dataset
    from lbsgd.entry import train
    from lbsgd.models import register_model

__version__ = "0.1.0"

__all__ = [
    "Config",
    "ConfigError",
    "Splits",
    "derive",
    "load_config",
    "register_dataset",
    "register_model",
    "train",
]

# Imported at first use, not with the package: these import torch, and `python -m lbsgd train`
# must set the CPU kernels' instruction-set caps (lbsgd.isa) before torch is imported.
_LAZY = {
    "Splits": "lbsgd.data",
    "register_dataset": "lbsgd.data",
    "register_model": "lbsgd.models",
    "train": "lbsgd.entry",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'lbsgd' has no attribute {name!r}")
