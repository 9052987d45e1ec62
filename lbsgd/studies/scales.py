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
from dataclasses import dataclass, field
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
    lars: Mapping[str, Any] = field(default_factory=dict)  # keys of the LARS runs (You et al.)
    alexnet: Mapping[str, Any] = field(default_factory=dict)  # keys of the AlexNet runs
    alexnet_lars: Mapping[str, Any] = field(default_factory=dict)  # LARS keys of AlexNet runs
    studies: tuple[str, ...] | None = None  # the studies it replays (None: every notebook's)
    # notebook 3's sweep measures the gradient noise scale too, so study 11 copies its runs rather
    # than training the sweep again (the probe changes no digit of a run)
    noise_in_batch_scaling: bool = False
    # study 14 (lbsgd.studies.optimizers): "holdout", the training images held out for tuning;
    # "anchors", each optimizer's lr per reference batch, the centre of its tuning grid (scaled
    # to k by the linear rule for nesterov and lars, the square-root rule for lamb and adamw);
    # "centres", calibrated centres per k that replace the anchors; "grid", the grid's own axes
    # (lr_factors, warmups, the tuning seeds); "keys", config keys of every run of the study
    tuning: Mapping[str, Any] = field(default_factory=dict)
    # S_min: the fewest optimizer steps any batch needs to reach study 11's target loss at this
    # profile, from that study's committed fit (results/<profile>/critical_batch/fit.csv; a test
    # holds the two equal). A large-minibatch verdict from an arm with fewer steps is
    # budget-bound (lbsgd.findings.Budget). None: not measured at this profile.
    s_min: float | None = None
    s_min_target: str = ""  # the target S_min is for, in words (every budget's evidence names it)
    # the same fit's critical batch B_crit = E_min/S_min (samples): study 14 says whether its large
    # batch lies beyond it, where Nado et al. and You et al. compare optimizers
    b_crit: float | None = None
    # study 15 (lbsgd.studies.steps_to_target): "ks", the batch sizes as k; "target", the held-out
    # top-1 error (%) every one of them reaches; "stop_at_error", where its runs end (default the
    # target); "holdout", the images held out to read it on; "seeds", the tuning seed (each
    # trial's), then the seeds that measure each k at its chosen lr
    ladder: Mapping[str, Any] = field(default_factory=dict)
    # study 16's rows at the plan's own lr (lbsgd.studies.plan_lr, pre-registered there):
    # "networks", name -> keys over the ladder's; "probe_seed", the probe's seed; "seeds", the
    # fresh seeds every planned batch up to 4 B_crit trains on
    plan_check: Mapping[str, Any] = field(default_factory=dict)
    # study 2's pre-registered warmup test (lbsgd.studies.warmup.preregistered_runs, docs/verdicts.md):
    # "k", the large minibatch where the linear rule's lr sits at the stability edge; "seeds",
    # fresh seeds, never used by a calibration, their number fixed before the runs from "sd", the
    # measured per-pair sd of none − gradual; "ladder_ks", "ladder_seeds": the descriptive ladder
    # beyond it (no verdict)
    warmup_test: Mapping[str, Any] = field(default_factory=dict)
    # the profiles whose replays this one's REPORT.md sets beside its own (their folders next to
    # its own: results/<name>), with each differing verdict's budget
    beside: tuple[str, ...] = ()

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

# study 14's grid centres per reference batch: Nesterov and LARS at the profile's lrs, LAMB and
# AdamW by the square-root rule from the best probes at k = 128 (docs/studies.md, profile notes)
_CPU_ANCHORS = {"nesterov": 0.0125, "lars": 0.125, "lamb": 0.014, "adamw": 0.0035}
# at k = 16 a first pass chose the grid's top (×3) for these three: their grids centre there
_CPU_CENTRES = {16: {"nesterov": 0.6, "lars": 6.0, "adamw": 0.042}}

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
        lars={"base_lr": 0.25, "schedule": "poly", "lars_eta": 0.001, "warmup_epochs": 0.5},
        alexnet={"synthetic_difficulty": "easy"},
        tuning={"holdout": 200, "anchors": _CPU_ANCHORS},
        ladder={
            "ks": (1, 4, 16),
            "target": 85.0,
            "holdout": 200,
            "seeds": (0, 1),
            "keys": {"epochs": 4, "base_lr": 0.1},
        },
        plan_check={"networks": {"resnet8": {}}, "probe_seed": 0, "seeds": (2, 3)},
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
        # LARS at k = 128, where it first beats SGD; 0.5 per 16 and up diverge (profile notes)
        lars={"base_lr": 0.125, "schedule": "poly", "lars_eta": 0.001},
        alexnet={},
        alexnet_lars={"base_lr": 0.25},
        tuning={"holdout": 4_000, "anchors": _CPU_ANCHORS, "centres": _CPU_CENTRES},
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
        # one sweep for studies 3 and 11: 23 runs (12.7 minutes) fewer in the replay
        noise_in_batch_scaling=True,
        lars={"base_lr": 0.125, "schedule": "poly", "lars_eta": 0.001},
        # AlexNet on 10,000 images (25 of the replay's 104 runs, each 2.3× a ResNet run's time) and
        # its SGD at the probe's 0.025 per 16; LARS at k = 64: 0.25 per 16
        alexnet={"fashion_train": 10_000, "base_lr": 0.025},
        alexnet_lars={"base_lr": 0.25},
        # Nesterov's anchor at the probe's 0.025 per 16, at k = 16 the profile's 0.05 (0.8); LARS,
        # LAMB and AdamW as on cpu (not probed on Fashion-MNIST)
        tuning={
            "holdout": 3_000,
            "anchors": {**_CPU_ANCHORS, "nesterov": 0.025},
            "centres": {16: {**_CPU_CENTRES[16], "nesterov": 0.8}},
        },
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
        # 1.24 gave 58%, hence warmup_test below
        seeds=tuple(range(8)),
        large_k=16,
        # study 15's ladder: a constant lr after the warmup, at most 4 epochs; seed 0 chooses each
        # k's lr, seeds 2-7 measure; the target 24% is where the spread of steps is least (its
        # history: docs/studies.md, profile notes)
        ladder={
            "ks": (1, 4, 8, 16, 32, 64),
            "target": 24.0,
            "stop_at_error": 22.0,
            "holdout": 5_000,
            "seeds": (0, 2, 3, 4, 5, 6, 7),
            "lr_factors": (0.03125, 0.0625, 0.125, 0.25, 0.5, 1.0, 2.0),
            "keys": {"epochs": 4, "milestones": []},
        },
        # study 2's pre-registered warmup test (docs/verdicts.md): k = 32, twenty fresh seed pairs
        # sized at the measured sd 1.24; the ladder beyond it is measured, not tested
        warmup_test={
            "k": 32,
            "seeds": tuple(range(4000, 4020)),
            "sd": 1.24,
            "ladder_ks": (64, 128),
            "ladder_seeds": (4000, 4001),
        },
        ks={"optimizers": (16,)},
        lars={"schedule": "poly", "poly_power": 2.0, "lars_eta": 0.001},
        # study 14 at k = 16 (below B_crit) on 30,000 images: 422 steps, centres at the best probes,
        # Nado et al.'s quasi-random search over lr, warmup and weight decay (docs/studies.md)
        tuning={
            "holdout": 3_000,
            "anchors": {"nesterov": 0.1, "lars": 1.125, "lamb": 0.014, "adamw": 0.0105},
            "centres": {16: {"nesterov": 1.6, "lars": 18.0, "lamb": 0.056, "adamw": 0.042}},
            "search": {"points": 10, "seeds": (1000, 1001, 1002)},
            "keys": {"fashion_train": 30_000, "epochs": 4},
        },
        # study 16's second part (lbsgd.studies.plan_lr): ResNet-8 and AlexNet-BN (0.025 per 16
        # from its probes), planned from the ladder's probe of seed 2, checked on fresh seeds
        plan_check={
            "networks": {
                "resnet8": {},
                "alexnet_bn": {"model": "alexnet_bn", "base_lr": 0.025},
            },
            "probe_seed": 2,
            "seeds": (8, 9, 10),
        },
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
        lars={"base_lr": 0.5, "schedule": "poly", "lars_eta": 0.001},  # not calibrated yet
        alexnet={},
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
        # You et al. 2017 Table 3 (AlexNet-BN, 8K: lr 14, 5 warmup epochs, poly(2), 100 epochs)
        lars={
            "base_lr": 0.44,
            "schedule": "poly",
            "lars_eta": 0.001,
            "momentum": 0.9,
            "weight_decay": 5e-4,
            "epochs": 100,
            "nesterov": False,
        },
        alexnet={"model": "alexnet_bn", "weight_decay": 5e-4, "epochs": 100},
    ),
}


# studies that need a profile's own settings: a profile without them does not replay the study
NEEDS = {"optimizers": "tuning", "steps_to_target": "ladder", "plan": "ladder"}


def replays(profile: Profile, study: str) -> bool:
    """Whether ``profile`` replays ``study``: it is in the profile's list (None: every study whose
    settings (:data:`NEEDS`) the profile has)."""
    if profile.studies is not None:
        return study in profile.studies
    if study == "optimizers_at_scale":  # its settings live with the study
        from lbsgd.studies import optimizers_at_scale

        return profile.name in optimizers_at_scale.AT_SCALE
    return study not in NEEDS or bool(getattr(profile, NEEDS[study]))


def notebooks(name: str, paths: list[str]) -> list[str]:
    """The notebooks of ``paths`` (``notebooks/NN_<study>.ipynb``) that profile ``name`` replays,
    in their order: ``make reproduce`` runs these."""
    profile = get(name)
    return [p for p in paths if replays(profile, _study_of(p))]


def _study_of(path: str) -> str:
    return Path(path).stem.split("_", 1)[1]


def get(name: str, epochs: float | None = None) -> Profile:
    """The profile ``name``; ``epochs`` overrides the length of every run (the ladder's too)."""
    if name not in PROFILES:
        raise ConfigError(f"profile={name!r} is not one of {', '.join(PROFILES)}")
    p = PROFILES[name]
    if epochs is not None:
        if epochs <= 0:
            raise ConfigError(f"epochs={epochs} must be > 0")
        p = dataclasses.replace(p, base={**p.base, "epochs": epochs})
        for own in ("ladder", "tuning"):  # study 15's and study 14's own lengths, overridden too
            settings = getattr(p, own)
            if "epochs" in settings.get("keys", {}):
                keys = {**settings["keys"], "epochs": epochs}
                p = dataclasses.replace(p, **{own: {**settings, "keys": keys}})
    return p
