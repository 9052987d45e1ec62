"""torchvision's ImageFolder of uint8 CHW items, in a module of its own so that only the file
datasets import torchvision (:func:`lbsgd.data.folders.imagenet` imports it when called)."""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path

from torchvision import datasets
from torchvision.datasets.vision import StandardTransform


class UInt8ImageFolder(datasets.ImageFolder):
    """ImageFolder of uint8 CHW items; ``on_device`` normalises a batch of them where it trains
    (read by :func:`lbsgd.data.batches`, which applies it after the copy to the device).
    ``eval_transform``: what an evaluation applies to these images instead of ``transform``
    (:meth:`for_evaluation`; None: ``transform`` itself)."""

    def __init__(
        self,
        root: Path,
        transform: Callable,
        on_device: Callable,
        eval_transform: Callable | None = None,
    ) -> None:
        super().__init__(str(root), transform=transform)
        self.on_device = on_device
        self.eval_transform = transform if eval_transform is None else eval_transform

    def for_evaluation(self) -> UInt8ImageFolder:
        """The same images (the file list shared, the folder not scanned again) with the
        evaluation transform: a held-out part of the train folder is measured as the val folder
        is (:func:`lbsgd.data.hold_out`)."""
        view = copy.copy(self)
        view.transform = self.eval_transform
        view.transforms = StandardTransform(self.eval_transform, self.target_transform)
        return view
