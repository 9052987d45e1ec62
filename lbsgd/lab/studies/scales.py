"""Scales at which the studies replay: the papers' ratios, each profile's own absolute sizes.

Batch sizes are given as k = batch_size / reference_batch (Goyal's k workers of n images), so a
study reads the same at every scale: k = 32 is Goyal's 8k minibatch at ImageNet scale. The
profiles, and the calibration probes behind each value: docs/studies.md ("Profiles").
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import import_module
from pathlib import Path
from typing import Any

from lbsgd.config import ConfigError, check_values


@dataclass(frozen=True)
class Profile:
    name: str
    base: Mapping[str, Any]  # config keys shared by every run of every study
    seeds: tuple[int, ...]  # seeds of the comparisons that decide a finding
    ks: Mapping[str, tuple[float, ...]]  # per study: the batch sizes as k
    large_k: float  # the "large minibatch" of the ablations (Goyal: k = 32, i.e. 8k)
    studies: tuple[str, ...] | None = None  # the studies it replays (None: every notebook's)
    # S_min: the fewest optimizer steps any batch needs to reach study 11's target loss at this
    # profile, from that study's committed fit (results/<profile>/critical_batch/fit.csv; a test
    # holds the two equal). A large-minibatch verdict from an arm with fewer steps is
    # budget-bound (lbsgd.lab.findings.Budget). None: not measured at this profile.
    s_min: float | None = None
    s_min_target: str = ""  # the target S_min is for, in words (every budget's evidence names it)
    # the same fit's critical batch B_crit = E_min/S_min (samples): study 14 says whether its large
    # batch lies beyond it, where Nado et al. and You et al. compare optimizers
    b_crit: float | None = None
    # the profiles whose replays this one's REPORT.md sets beside its own (their folders next to
    # its own: results/<name>), with each differing verdict's budget
    beside: tuple[str, ...] = ()
    epochs: float | None = None  # every run's length where :func:`get` overrides it (studies' too)

    def alexnet_k(self, ks: list[float] | None = None) -> float:
        """The minibatch (as k) of the AlexNet comparisons: ks["alexnet"], else the largest LARS k."""
        return max(ks or self.ks.get("alexnet") or self.ks["lars"])

    def keys(self, k: float | None = None, **overrides: Any) -> dict[str, Any]:
        """Config keys of one run: the base, batch_size = k · reference_batch, then overrides.
        k and each key are checked alone before batch_size is derived from them."""
        keys = {**self.base, **overrides}
        reference_batch = check_values(keys).get("reference_batch", 256)
        if k is not None:
            if isinstance(k, bool) or not isinstance(k, numbers.Real) or not 0 < k < math.inf:
                raise ConfigError(
                    f"k={k!r} must be a positive number (the minibatch over the reference batch)"
                )
            batch = k * reference_batch
            if batch != int(batch):
                raise ConfigError(
                    f"k={k} gives a fractional batch ({batch}) in profile={self.name}"
                )
            keys["batch_size"] = int(batch)
        return keys


# ResNet-8 of width 8 on the generator's easy 16×16 shapes, 0.0125 per 16, 20,000 images × 4 epochs
# (~30 s a run on one core); its knee lies between k = 16 and 32 (docs/studies.md, profile notes)
_CPU_BASE = {
    "model": "resnet",
    "depth": 8,
    "width": 8,
    "zero_init_residual": False,
    "dataset": "synthetic",
    "synthetic_train": 20_000,
    "synthetic_test": 5_000,
    "synthetic_difficulty": "easy",
    "bn_batch": 16,
    "reference_batch": 16,
    "base_lr": 0.0125,
    "nesterov": False,
    "weight_decay": 5e-4,
    "warmup": "gradual",
    "warmup_epochs": 0.5,
    "schedule": "cosine",
    "epochs": 4,
    "threads": 1,
    "channels_last": True,
    "eval_every": 2,
    # the same digits on Intel and AMD CPUs with AVX2 (lbsgd.isa)
    "cpu_isa": "portable",
}

# Fashion-MNIST at 14×14 (area-averaged: 2.6× the speed of 28×28) on the cpu profile's ResNet-8,
# 15,000 images, 0.05 per 16 (the better baseline of the probes: docs/studies.md, profile notes)
_FASHION_BASE = {
    **_CPU_BASE,
    "dataset": "fashion_mnist",
    "fashion_size": 14,
    "fashion_train": 15_000,
    "base_lr": 0.05,
}
for _k in ("synthetic_train", "synthetic_test", "synthetic_difficulty"):
    del _FASHION_BASE[_k]

# Goyal's recipe on Fashion-MNIST (``fashion-long``): all 60,000 images, 8 epochs, his step
# schedule (÷10 at 30, 60, 80 of 90 epochs) and 5 of 90 warmup epochs scaled to 8 epochs
_LONG_BASE = {
    **_FASHION_BASE,
    "fashion_train": 60_000,
    "epochs": 8,
    "schedule": "step",
    "milestones": [2.667, 5.333, 7.111],
    "warmup_epochs": 0.45,
}

PROFILES: dict[str, Profile] = {
    "smoke": Profile(
        name="smoke",
        base={
            **_CPU_BASE,
            "synthetic_train": 1_000,
            "synthetic_test": 250,
            "epochs": 2,
            "eval_every": 1,
            # each library's fastest kernels: the smoke profile checks that the studies run end to
            # end, no digits; portable's ATen convolutions cost AlexNet 1.6x, ResNet-8 1.3x of CPU
            "cpu_isa": "native",
        },
        seeds=(0,),
        ks={"batch_scaling": (1, 4, 16), "lars": (4, 16), "optimizers": (4, 16)},
        large_k=8,
    ),
    "cpu": Profile(
        name="cpu",
        base=_CPU_BASE,
        seeds=(0, 1, 2),
        # k = 1/2 would need bn_batch 8: with n = 16 the smallest minibatch is k = 1
        ks={
            "batch_scaling": (1, 2, 4, 8, 16, 32, 64, 128, 256),
            "lars": (4, 16, 128),
            "alexnet": (64,),
            "optimizers": (16, 128),
        },
        large_k=16,
        s_min=55.1,
        b_crit=620.7,
        s_min_target="study 11's training loss 0.327",
    ),
    "fashion": Profile(
        name="fashion",
        base=_FASHION_BASE,
        seeds=(0, 1, 2, 3, 4),
        ks={
            "batch_scaling": (1, 2, 4, 8, 16, 32, 64, 128),
            "lars": (4, 16, 128),
            "alexnet": (64,),
            "optimizers": (16, 128),
        },
        large_k=16,
        s_min=61.1,
        b_crit=367.2,
        s_min_target="study 11's training loss 0.684",
        studies=(
            "quickstart",
            "warmup",
            "batch_scaling",
            "lr_scaling_rule",
            "bn_gamma_init",
            "lars",
            "bn_decay",
            "pool5_bn",
            "critical_batch",
            "optimizers",
            "plan",
        ),
    ),
    "fashion-long": Profile(
        name="fashion-long",
        base=_LONG_BASE,
        # eight seeds: 80% power for Goyal's 1.1 points at fashion's paired sd 0.93; the measured
        # 1.24 gave 58%, hence study 2's pre-registered test (lbsgd.lab.studies.warmup.SETTINGS)
        seeds=tuple(range(8)),
        large_k=16,
        ks={"optimizers": (16,)},
        s_min=93.6,  # study 15's fit (results/fashion-long/steps_to_target/table.csv)
        b_crit=363.6,
        s_min_target="study 15's held-out top-1 error 24%",
        studies=("warmup", "optimizers", "steps_to_target", "plan"),
        beside=("fashion", "cpu"),
    ),
    "cifar10": Profile(
        name="cifar10",
        base={
            "model": "resnet",
            "depth": 20,
            "width": 16,
            "dataset": "cifar10",
            "data_dir": "data/cifar10",
            "bn_batch": 32,
            "reference_batch": 128,
            "base_lr": 0.1,
            "weight_decay": 1e-4,
            "warmup": "gradual",
            "warmup_epochs": 5,
            "schedule": "step",
            "milestones": [45, 68],
            "epochs": 90,
            "channels_last": True,
            "workers": 4,
            # BN groups stay at n = 32; the GPU runs the largest micro-batch that fits
            "micro_batch": "auto",
        },
        seeds=(0, 1, 2),
        ks={"batch_scaling": (1, 2, 4, 8, 16, 32, 64, 128), "lars": (8, 32, 128)},
        large_k=32,
    ),
    "imagenet": Profile(
        name="imagenet",
        base={
            "model": "resnet50",
            "dataset": "imagenet",
            "data_dir": "data/imagenet",
            "bn_batch": 32,
            "reference_batch": 256,
            "base_lr": 0.1,
            "weight_decay": 1e-4,
            "nesterov": True,
            "warmup": "gradual",
            "warmup_epochs": 5,
            "schedule": "step",
            "milestones": [30, 60, 80],
            "epochs": 90,
            "zero_init_residual": True,
            "channels_last": True,
            "workers": 8,
            # BN groups stay at n = 32; the GPU runs the largest micro-batch that fits
            "micro_batch": "auto",
        },
        seeds=(0,),
        ks={"batch_scaling": (0.5, 1, 2, 4, 8, 16, 32, 64, 128, 256), "lars": (2, 16, 32, 64)},
        large_k=32,
    ),
}


# studies that need a profile's own settings (the SETTINGS of the study module named, by profile
# name): a profile without them does not replay the study (study 16 reads study 15's ladder)
NEEDS = {s: s for s in ("optimizers", "optimizers_at_scale", "steps_to_target")}
NEEDS["plan"] = "steps_to_target"


def replays(profile: Profile, study: str) -> bool:
    """Whether ``profile`` replays ``study``: it is in the profile's list (None: every study whose
    settings (:data:`NEEDS`) the profile has)."""
    if profile.studies is not None:
        return study in profile.studies
    return (
        study not in NEEDS
        or profile.name in import_module(f"lbsgd.lab.studies.{NEEDS[study]}").SETTINGS
    )


def settings(profile: Profile, table: Mapping[str, Mapping[str, Any]]) -> Mapping[str, Any]:
    """A study's settings at ``profile`` from its ``table`` (profile name → settings; {} where it
    has none), its runs' own length (``keys["epochs"]``) overridden where the profile's is."""
    own = table.get(profile.name, {})
    if profile.epochs is not None and "epochs" in own.get("keys", {}):
        own = {**own, "keys": {**own["keys"], "epochs": profile.epochs}}
    return own


def notebooks(name: str, paths: list[str]) -> list[str]:
    """The notebooks of ``paths`` (``notebooks/NN_<study>.ipynb``) that profile ``name`` replays,
    in their order: ``make reproduce`` runs these."""
    profile = get(name)
    return [p for p in paths if replays(profile, Path(p).stem.split("_", 1)[1])]


def get(name: str, epochs: float | None = None) -> Profile:
    """The profile ``name``; ``epochs`` overrides the length of every run (the ladder's too)."""
    if name not in PROFILES:
        raise ConfigError(f"profile={name!r} is not one of {', '.join(PROFILES)}")
    p = PROFILES[name]
    if epochs is not None:
        if epochs <= 0:
            raise ConfigError(f"epochs={epochs} must be > 0")
        p = dataclasses.replace(p, base={**p.base, "epochs": epochs}, epochs=epochs)
    return p
