import os

import pytest

from lbsgd.config import Config

# A few seconds per run on one CPU thread: ResNet-8 (width 8) on 512 easy synthetic images.
TINY = {
    "model": "resnet",
    "depth": 8,
    "width": 8,
    "synthetic_train": 512,
    "synthetic_test": 256,
    "synthetic_difficulty": "easy",
    "batch_size": 64,
    "bn_batch": 16,
    "base_lr": 0.05,
    "reference_batch": 64,
    "warmup_epochs": 0.5,
    "schedule": "cosine",
    "epochs": 2,
    "threads": 1,
    "wandb": "disabled",
    "log_every": 3,
}


@pytest.fixture(autouse=True, scope="session")
def _shared_cache(tmp_path_factory):
    """One synthetic-data cache for the session (the generator is tested on its own)."""
    os.environ.setdefault("LBSGD_CACHE", str(tmp_path_factory.mktemp("cache")))
    os.environ["WANDB_SILENT"] = "true"


@pytest.fixture
def tiny(tmp_path):
    def make(**kw) -> Config:
        return Config(**{**TINY, "out_dir": str(tmp_path / "results"), **kw})

    return make
