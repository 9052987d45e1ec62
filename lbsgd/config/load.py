"""The Config (the schema's keys, checked when made) and its loading: from YAML files,
``key=value`` overrides and plain mappings, each refusal one line (:func:`load`, :func:`from_dict`,
:func:`parse_overrides`, :func:`read_yaml`, :func:`run_list`); and a run's config.yaml written back
(:func:`dump`)."""

from __future__ import annotations

import os
import typing
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pydantic
import yaml
from pydantic.dataclasses import dataclass

from lbsgd.config.checks import check_config, check_ignored, check_values
from lbsgd.config.derived import DERIVED_KEYS, RECORD_KEYS, Derived
from lbsgd.config.schema import FIELDS, Keys, hints, unknown_key_message
from lbsgd.registry import ConfigError, import_plugins


@dataclass(frozen=True, config=pydantic.ConfigDict(extra="forbid", arbitrary_types_allowed=False))
class Config(Keys):
    """The keys (:class:`~lbsgd.config.schema.Keys`) typed by the schema and checked when made
    (:func:`~lbsgd.config.checks.check_config`): a Config is a valid run's."""

    def __post_init__(self) -> None:
        check_config(self)

    def replace(self, **changes: Any) -> Config:
        return from_dict({**self.to_dict(), **changes})


def _is_tuple(tp: Any) -> bool:
    return typing.get_origin(tp) is tuple


def parse_value(key: str, text: str) -> Any:
    """Turn the text of a command-line ``key=value`` into what the field expects.

    Scalars stay strings and are coerced by the schema (``"8192"`` → 8192, ``"true"`` → True);
    ``null``/``none`` mean None for keys that allow it; lists are ``30,60,80`` or ``[30, 60, 80]``.
    """
    tp = hints()[key]
    if type(None) in typing.get_args(tp) and text.strip().lower() in ("null", "none", "~"):
        return None
    if _is_tuple(tp):
        text = text.strip()
        if text.startswith("["):
            try:
                return yaml.safe_load(text)
            except yaml.YAMLError as e:
                first = str(e).splitlines()[0]
                raise ConfigError(f"{key}={text}: not a list like [30, 60, 80] ({first})") from None
        return [t.strip() for t in text.split(",") if t.strip()]
    return text


def from_dict(values: Mapping[str, Any]) -> Config:
    """Validate a flat mapping of keys into a Config; raises ConfigError with one line."""
    for key in values:
        if key not in FIELDS:
            raise ConfigError(unknown_key_message(str(key)))
    try:
        return Config(**values)
    except pydantic.ValidationError as e:
        raise ConfigError(_one_line(e, values)) from None


def _one_line(e: pydantic.ValidationError, values: Mapping[str, Any]) -> str:
    parts = []
    for err in e.errors():
        msg = err["msg"].removeprefix("Value error, ")
        loc = [p for p in err["loc"] if isinstance(p, str)]
        if loc and loc[0] in FIELDS:
            key = loc[0]
            parts.append(f"{key}={values.get(key)!r}: {msg}")
        else:
            parts.append(msg)
    return "; ".join(dict.fromkeys(parts))


def run_list(runs: Any) -> list[dict[str, Any]]:
    """A sweep's runs as dicts of keys (not yet validated), or one line saying what a run list is:
    a dict alone would iterate as its key names, a string as its characters."""
    example = "(valid: a list of dicts of keys, e.g. [{'batch_size': 256}, {'batch_size': 512}])"
    if isinstance(runs, Mapping | str | bytes) or not isinstance(runs, Iterable):
        raise ConfigError(f"runs: a {type(runs).__name__}, not a list of runs {example}")
    runs = list(runs)
    for i, run in enumerate(runs):
        if not isinstance(run, Mapping):
            raise ConfigError(f"runs[{i}]: a {type(run).__name__}, not a dict of keys {example}")
    return [dict(run) for run in runs]


def parse_overrides(args: Iterable[str]) -> dict[str, Any]:
    """``["batch_size=8192", "warmup=gradual"]`` → a dict of field values (not yet validated)."""
    out: dict[str, Any] = {}
    for arg in args:
        key, sep, text = arg.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ConfigError(f"{arg!r} is not key=value")
        if key not in FIELDS:
            raise ConfigError(unknown_key_message(key))
        out[key] = parse_value(key, text)
    return out


DERIVED_MARKER = "# derived (lbsgd.config.derive)\n"  # :func:`dump`'s line before the derived


def read_yaml(path: str | os.PathLike, derived: bool = False) -> dict[str, Any]:
    """A flat YAML mapping of keys. Derived values and :data:`RECORD_KEYS` in a run's config.yaml
    are accepted and left out, or kept with ``derived=True`` (what the run was: its world_size,
    micro_batch, the run it was copied from, ...). A key that is also a derived value
    (``micro_batch``) is the key's: the text above :data:`DERIVED_MARKER`, or a file without it."""
    p = Path(path)
    data = {k: _as_given(k, v) for k, v in _yaml_mapping(p, derived).items()}
    drop = (*(k for k in DERIVED_KEYS if k not in FIELDS), *RECORD_KEYS)
    return data if derived else {k: v for k, v in data.items() if k not in drop}


def _as_given(key: Any, value: Any) -> Any:
    """A list key written as a string in YAML (``plugins: my_models.py``, ``milestones: 30,60``)
    read as the command line reads ``key=value``; every other value as YAML gave it."""
    if isinstance(value, str) and key in FIELDS and _is_tuple(hints()[key]):
        return parse_value(key, value)
    return value


def _yaml_mapping(p: Path, derived: bool) -> dict[str, Any]:
    """The file's mapping (without derived values: the text above the marker); one line if it
    cannot be read or is not a mapping."""
    try:
        text = p.read_text()
        head, marker, _ = text.partition(DERIVED_MARKER)
        data = yaml.safe_load(text if derived or not marker else head) or {}
    except OSError as e:
        raise ConfigError(f"config file {str(p)!r} cannot be read: {e.strerror}") from None
    except UnicodeDecodeError as e:
        raise ConfigError(
            f"config file {str(p)!r} is not UTF-8 text (byte {e.start}: {e.reason})"
        ) from None
    except yaml.YAMLError as e:
        raise ConfigError(
            f"config file {str(p)!r} is not valid YAML: {str(e).splitlines()[0]}"
        ) from None
    if not isinstance(data, dict):
        raise ConfigError(f"config file {str(p)!r} must hold a flat mapping of key: value")
    return data


def read_values(files: Sequence[str | os.PathLike] = (), overrides: Sequence[str] = ()) -> dict:
    """Each YAML file in order, then ``key=value`` overrides: the keys they set, each checked
    alone (:func:`check_values`) before anything is derived from it, imported or pinned by it."""
    values: dict[str, Any] = {}
    for f in files:
        values.update(read_yaml(f))
    values.update(parse_overrides(overrides))
    return check_values(values)


def load(files: Sequence[str | os.PathLike] = (), overrides: Sequence[str] = ()) -> Config:
    """Defaults, then each YAML file in order, then ``key=value`` overrides; each key checked
    alone first, then the plugins imported, then the rules across keys, then the keys given that
    the setting ignores (:func:`~lbsgd.config.checks.check_ignored`, :func:`given_keys`), unless
    the run is a study's (``profile`` set)."""
    values = read_values(files, overrides)
    import_plugins(values.get("plugins", ()))
    c = from_dict(values)
    if c.profile is None:  # a study's run (the lab's sweep) is built from a whole profile
        check_ignored(c, given_keys(files, overrides))
    return c


def given_keys(files: Sequence[str | os.PathLike] = (), overrides: Sequence[str] = ()) -> set[str]:
    """The keys a user chose: every key=value, and the keys of each YAML file except a whole
    config (every key, as a run's config.yaml holds it: a run given back to ``lbsgd train -c``
    keeps the keys it was made with)."""
    given = set(parse_overrides(overrides))
    for f in files:
        keys = set(read_yaml(f))
        if not keys >= set(FIELDS) - set(DERIVED_KEYS) - set(RECORD_KEYS):
            given |= keys
    return given


def dump(c: Config, d: Derived | None = None) -> str:
    """YAML of every key, then the derived values (flat: ``key: value``, no nesting, the keys' one
    vocabulary)."""
    text = yaml.safe_dump(c.to_dict(), sort_keys=False)
    if d is not None:
        text += DERIVED_MARKER + yaml.safe_dump(d.to_dict(), sort_keys=False)
    return text
