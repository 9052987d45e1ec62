"""The optimizers in one table: for each, its name (the ``optimizer`` key's value), the class that
implements it in :mod:`lbsgd.optim`, what it is, the keys it reads and whether it adapts the step
per layer (a trust ratio per parameter tensor), as timm's ``OptimInfo`` describes its optimizers.

The table feeds the ``optimizer`` key's allowed values and help (:mod:`lbsgd.config.schema`), the
refusal of a key the chosen optimizer ignores (:data:`lbsgd.config.checks.USED_ONLY_WHEN`),
:func:`lbsgd.optim.build` and ``lbsgd keys``. A new optimizer joins with one row here and its
class in lbsgd.optim (a ``from_config`` classmethod); tests/test_optim.py holds the two together.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class OptimizerInfo:
    name: str  # the value of the optimizer key
    cls: str  # the class's name in lbsgd.optim
    description: str  # what it is, with its source (the optimizer key's help)
    keys: tuple[str, ...]  # the keys it reads besides the lr's and weight_decay
    adapts_per_layer: bool  # a trust ratio per parameter tensor (adapt_bn_bias applies)


TABLE: tuple[OptimizerInfo, ...] = (
    OptimizerInfo(
        "sgd",
        "SGD",
        "lr inside the velocity, Goyal eq. 10",
        ("momentum", "nesterov", "momentum_correction"),
        adapts_per_layer=False,
    ),
    OptimizerInfo(
        "lars",
        "LARS",
        "You et al. 2017, Algorithm 1",
        ("momentum", "nesterov", "momentum_correction", "lars_eta"),
        adapts_per_layer=True,
    ),
    OptimizerInfo(
        "lamb",
        "LAMB",
        "You et al. 2019, Algorithm 2",
        ("adam_beta1", "adam_beta2", "adam_eps"),
        adapts_per_layer=True,
    ),
    OptimizerInfo(
        "adamw",
        "AdamW",
        "Adam, decay w <- w - lr*lambda*w",
        ("adam_beta1", "adam_beta2", "adam_eps"),
        adapts_per_layer=False,
    ),
)

NAMES: tuple[str, ...] = tuple(row.name for row in TABLE)

# The keys that only some optimizers read and that are refused wherever the optimizer ignores
# them, for every Config, not only where given explicitly: the studies build their runs from
# whole profiles, whose momentum, nesterov and lars_eta every arm carries (checks.USED_ONLY_WHEN).
ALWAYS_REFUSED: frozenset[str] = frozenset(
    {"adam_beta1", "adam_beta2", "adam_eps", "adapt_bn_bias"}
)


def info(name: str) -> OptimizerInfo:
    """The row of optimizer ``name`` (a ValueError naming the valid ones otherwise)."""
    for row in TABLE:
        if row.name == name:
            return row
    raise ValueError(f"optimizer={name!r} is not one of: {', '.join(NAMES)}")


def help_text() -> str:
    """The optimizer key's help: ``sgd (…), lars (…), lamb (…) or adamw (…)``."""
    parts = [f"{row.name} ({row.description})" for row in TABLE]
    return ", ".join(parts[:-1]) + " or " + parts[-1]


def readers(key: str) -> tuple[str, ...]:
    """The optimizers that read ``key`` (``adapt_bn_bias``: those that adapt per layer)."""
    if key == "adapt_bn_bias":
        return tuple(row.name for row in TABLE if row.adapts_per_layer)
    return tuple(row.name for row in TABLE if key in row.keys)


def key_groups() -> list[tuple[tuple[str, ...], tuple[str, ...]]]:
    """The optimizer-specific keys grouped by the optimizers that read them, in the table's order:
    ``[(("momentum", "nesterov", "momentum_correction"), ("sgd", "lars")), …]``."""
    keys = [k for row in TABLE for k in row.keys] + ["adapt_bn_bias"]
    groups: dict[tuple[str, ...], list[str]] = {}
    for key in dict.fromkeys(keys):
        groups.setdefault(readers(key), []).append(key)
    return [(tuple(ks), names) for names, ks in groups.items()]
