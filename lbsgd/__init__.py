"""lbsgd: large-minibatch distributed SGD, replayable on a laptop CPU and on multi-GPU nodes."""

from lbsgd.config import Config, ConfigError, derive
from lbsgd.config import load as load_config
from lbsgd.data import Splits, register_dataset
from lbsgd.models import register_model
from lbsgd.trainer import train

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
