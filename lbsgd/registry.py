"""Name -> builder registries for models and datasets (the extension point), the import of the
plugins that fill them (the ``plugins`` key), and the vocabulary's error, :class:`ConfigError`.
A registered builder trains with every recipe, without editing lbsgd (docs/datasets.md)."""

from __future__ import annotations

import difflib
import importlib
import importlib.util
import os
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Generic, TypeVar

F = TypeVar("F", bound=Callable)


class ConfigError(ValueError):
    """A bad key or value. Its message is one line naming the key and what would be valid.

    Defined here, below :mod:`lbsgd.config` (which exports it), because the plugin import raises
    it and the config's loading imports the plugins."""


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


# -- plugins: user modules that register models and datasets ------------------------------------


def import_plugins(plugins: Iterable[str] | str) -> None:
    """Import user modules (``pkg.mod`` or ``path/to/file.py``) so their registrations happen."""
    if isinstance(plugins, str):
        plugins = [p for p in plugins.split(",") if p]
    for spec in plugins:
        if spec not in sys.modules:
            _import_plugin(spec)


def _plugin_module_name(spec: str) -> str:
    return f"lbsgd_plugin_{Path(spec).stem}"


def _import_plugin(spec: str) -> None:
    """Import one plugin; whatever it raises becomes one line naming it (and a file plugin is not
    left half-imported: a retry imports it again and fails the same way)."""
    try:
        if spec.endswith(".py"):
            _import_file(spec)
        else:
            if os.getcwd() not in sys.path and "" not in sys.path:
                sys.path.insert(0, os.getcwd())
            importlib.import_module(spec)
    except ConfigError:
        raise
    # SystemExit too: a script's sys.exit("usage: ...") at import time
    except (Exception, SystemExit) as e:  # the plugin's own code failed importing
        if spec.endswith(".py"):
            sys.modules.pop(_plugin_module_name(spec), None)
        if isinstance(e, ImportError):
            raise ConfigError(f"plugins: cannot import {spec!r}: {e}") from None
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        raise ConfigError(
            f"plugins: importing {spec!r} raised {type(e).__name__}"
            + (f": {first}" if first else "")
        ) from None


def _import_file(spec: str) -> None:
    path = Path(spec)
    if not path.is_file():
        problem = "is not a file" if path.exists() else "does not exist"
        raise ConfigError(f"plugins: file {spec!r} {problem}")
    mod_name = _plugin_module_name(spec)
    if mod_name in sys.modules:
        return
    mspec = importlib.util.spec_from_file_location(mod_name, path)
    module = importlib.util.module_from_spec(mspec)  # type: ignore[arg-type]
    sys.modules[mod_name] = module
    mspec.loader.exec_module(module)  # type: ignore[union-attr]
