"""Model registry and the built-in networks of the replayed studies.

``cfg.model`` names a builder ``fn(cfg, num_classes, image_size) -> nn.Module``: the CIFAR
``resnet`` (depth 6n+2, the CPU-sized stand-in for Goyal's ResNet-50), torchvision's ``resnet18``
… ``resnet152`` and ``alexnet``, or one of the user's (``@register_model``, :mod:`lbsgd.registry`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

from lbsgd.registry import Registry

ModelBuilder = Callable[[Any, int, int], torch.nn.Module]

MODELS: Registry[ModelBuilder] = Registry("model")
register_model = MODELS.register


def build(cfg: Any, num_classes: int, image_size: int) -> torch.nn.Module:
    """Build ``cfg.model`` for ``num_classes`` outputs on ``image_size``² inputs.

    ``cfg`` is the run's frozen config (any object with ``model``, ``depth``, ``width``,
    ``zero_init_residual`` …). Unknown names raise KeyError with a "did you mean" hint.
    """
    return MODELS.get(cfg.model)(cfg, num_classes, image_size)


class _NoFillsOnMeta(TorchFunctionMode):
    """In-place ops on meta tensors (the initialisers' fills) return their tensor untouched: a
    meta tensor holds no values, and torch would run the fills through its Python references,
    whose first call imports torch._dynamo (about 2.3 s of CPU, at the start of every run that
    sizes its model before building it)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        in_place = name.endswith("_") and not name.endswith("__")
        if in_place and args and isinstance(args[0], torch.Tensor) and args[0].is_meta:
            return args[0]
        return func(*args, **(kwargs or {}))


def parameter_count(cfg: Any, num_classes: int, image_size: int) -> int:
    """Parameters of ``cfg.model`` without allocating them (built on the meta device). A CIFAR
    ResNet's count is linear in its blocks per stage n (depth 6n + 2): two shallow builds give
    it at any depth, without making thousands of modules."""

    def count(c: Any) -> int:
        with torch.device("meta"), _NoFillsOnMeta():
            return sum(p.numel() for p in build(c, num_classes, image_size).parameters())

    if cfg.model != "resnet" or cfg.depth <= 14:
        return count(cfg)
    one, two = count(cfg.replace(depth=8)), count(cfg.replace(depth=14))
    return one + ((cfg.depth - 2) // 6 - 1) * (two - one)


# Imported last so that their @register_model decorators find MODELS defined above.
from lbsgd.models import alexnet, resnet  # noqa: E402, F401

__all__ = ["MODELS", "ModelBuilder", "build", "parameter_count", "register_model"]
