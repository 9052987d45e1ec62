"""The one vocabulary of lbsgd: every knob, its default, its validation and the values derived from it.

Bottom to top (each module imports only those below it: tests/test_config_layers.py): the
optimizers' table (:mod:`~lbsgd.config.optimizers`), the keys (:mod:`~lbsgd.config.schema`), every
derived value (accumulation steps, scaled lr, warmup steps, …: :mod:`~lbsgd.config.derived`,
computed there and nowhere else), the step features' table (:mod:`~lbsgd.config.step_features`),
the checks (:mod:`~lbsgd.config.checks`), then the checked :class:`Config` with its reading and
writing (:mod:`~lbsgd.config.load`). Every name is imported from here: ``from lbsgd import config``."""

from lbsgd.config.checks import (
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
    lr_scale,
    micro_batch,
    micro_batch_candidates,
    warmup_warning,
)
from lbsgd.config.load import (
    Config,
    dump,
    from_dict,
    load,
    parse_overrides,
    read_values,
    read_yaml,
    run_list,
)
from lbsgd.config.schema import (
    FIELDS,
    HASHED_ONLY_OFF_DEFAULT,
    KEYS,
    describe_keys,
    unknown_key_message,
)
from lbsgd.config.step_features import world_size_key
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
    "check_place",
    "check_folder_name",
    "check_folder_path",
    "check_ignored",
    "check_values",
    "key_problem",
    "lr_scale",
    "run_list",
    "dump",
    "from_dict",
    "load",
    "parse_overrides",
    "read_yaml",
    "read_values",
    "describe_keys",
    "unknown_key_message",
]
