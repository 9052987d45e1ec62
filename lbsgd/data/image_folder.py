"""torchvision's ImageFolder of uint8 CHW items, in a module of its own so that only the file
datasets import torchvision (:func:`lbsgd.data.folders.imagenet` imports it when called)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from torchvision import datasets


class UInt8ImageFolder(datasets.ImageFolder):
    """ImageFolder of uint8 CHW items; ``on_device`` normalises a batch of them where it trains
    (read by :func:`lbsgd.data.batches`, which applies it after the copy to the device)."""

    def __init__(self, root: Path, transform: Callable, on_device: Callable) -> None:
        super().__init__(str(root), transform=transform)
        self.on_device = on_device
