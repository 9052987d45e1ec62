"""Name -> builder registries for models and datasets (the extension point).

A user registers a builder under a new name and trains it with every recipe, without editing lbsgd::

    from lbsgd.models import register_model

    @register_model("mlp")
    def mlp(cfg, num_classes, image_size):
        return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.LazyLinear(num_classes))
"""

from __future__ import annotations

import difflib
from collections.abc import Callable
from typing import Generic, TypeVar

F = TypeVar("F", bound=Callable)


class Registry(Generic[F]):
    """A mapping from a config value (``model=…``, ``dataset=…``) to the function that builds it."""

    def __init__(self, key: str) -> None:
        self.key = key  # the config key whose values this registry holds
        self._builders: dict[str, F] = {}

    def register(self, name: str) -> Callable[[F], F]:
        """Decorator: ``@registry.register("name")``. Registering a taken name is an error."""

        def add(fn: F) -> F:
            old = self._builders.get(name)
            if old is not None and old is not fn:
                qual = f"{old.__module__}.{old.__qualname__}"
                raise ValueError(f"{self.key}={name!r} is already registered (by {qual})")
            self._builders[name] = fn
            return fn

        return add

    def names(self) -> list[str]:
        return sorted(self._builders)

    def __contains__(self, name: object) -> bool:
        return name in self._builders

    def unknown_message(self, name: str) -> str:
        """One line naming the key, the bad value and what would be valid."""
        close = difflib.get_close_matches(name, self.names(), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        return f"{self.key}={name!r} is not registered{hint}; known: {', '.join(self.names())}"

    def get(self, name: str) -> F:
        if name not in self._builders:
            raise KeyError(self.unknown_message(name))
        return self._builders[name]
