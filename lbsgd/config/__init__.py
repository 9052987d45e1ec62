"""The one vocabulary of lbsgd: every knob, its default, its validation and the values derived from it.

- :mod:`~lbsgd.config.schema`: the keys (:class:`Config`: kind, type, default, help) and a run's
  identity (name, experiment hash).
- :mod:`~lbsgd.config.checks`: each key alone, the rules across keys and the place a run is
  written; each refusal one line naming the key and what would be valid.
- :mod:`~lbsgd.config.load`: YAML files, ``key=value`` overrides and mappings into a Config; a
  run's config.yaml written back.
- :mod:`~lbsgd.config.derived`: the values derived from the keys, the number of processes and the
  train split (micro-batch, accumulation steps, total steps, scaled lr, warmup steps, …), computed
  there and nowhere else (:func:`derive`), printed at the start of every run and dumped with the
  config; the layout of processes they need (:func:`check_world`).
- :mod:`~lbsgd.config.step_features`: the step features' table (lbsgd.features).
- :mod:`~lbsgd.config.optimizers`: the optimizers' table (lbsgd.optim).

The plugins the ``plugins`` key names are imported by :func:`lbsgd.registry.import_plugins`, beside
the registries they fill. Every name is imported from here: ``from lbsgd import config``.
"""

from lbsgd.config.checks import (
    KEY_RULES,
    MAX_FOLDER_NAME_BYTES,
    SEED_STRIDE,
    check_folder_name,
    check_folder_path,
    check_ignored,
    check_place,
    check_values,
    key_problem,
)
from lbsgd.config.derived import (
    DERIVED_KEYS,
    RECORD_KEYS,
    Derived,
    accum_steps,
    check_world,
    derive,
    epoch_steps,
    lr_scale,
    micro_batch,
    micro_batch_candidates,
    noise_batch,
    warmup_warning,
    world_size_key,
)
from lbsgd.config.load import (
    dump,
    from_dict,
    load,
    parse_overrides,
    parse_value,
    read_values,
    read_yaml,
    run_list,
)
from lbsgd.config.schema import (
    FIELDS,
    HASHED_ONLY_OFF_DEFAULT,
    KEYS,
    Config,
    describe_keys,
    unknown_key_message,
)
from lbsgd.registry import ConfigError

__all__ = [
    "Config",
    "ConfigError",
    "Derived",
    "DERIVED_KEYS",
    "RECORD_KEYS",
    "KEYS",
    "FIELDS",
    "HASHED_ONLY_OFF_DEFAULT",
    "MAX_FOLDER_NAME_BYTES",
    "SEED_STRIDE",
    "derive",
    "accum_steps",
    "check_world",
    "warmup_warning",
    "world_size_key",
    "micro_batch",
    "micro_batch_candidates",
    "noise_batch",
    "check_place",
    "check_folder_name",
    "check_folder_path",
    "check_ignored",
    "check_values",
    "key_problem",
    "KEY_RULES",
    "lr_scale",
    "epoch_steps",
    "run_list",
    "dump",
    "from_dict",
    "load",
    "parse_overrides",
    "parse_value",
    "read_yaml",
    "read_values",
    "describe_keys",
    "unknown_key_message",
]
