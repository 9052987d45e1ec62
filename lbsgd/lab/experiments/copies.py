"""A run another study of the same profile already completed, found (:func:`find_identical`)
and copied as this study's run (:func:`copy_run`) instead of trained again."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from lbsgd import config, rundir
from lbsgd.config import Config
from lbsgd.lab.experiments.results import DONE

# what a copy from another study leaves behind: checkpoints, W&B's files and its run id
COPY_IGNORE = shutil.ignore_patterns("checkpoint*.pt", ".checkpoint.pt.tmp", "wandb", "wandb_id")
# Run keys that name this study's copy of a run (the rest of config.yaml is the twin's)
COPY_RUN_KEYS = ("out_dir", "study", "profile", "varied")
# Run keys that change what a run records, not what it trains: a twin must have recorded the same
MEASUREMENT_KEYS = ("noise_scale", "noise_scale_batch", "noise_scale_ema")


def find_identical(cfg: Config, root: Path, world_size: int = 1) -> Path | None:
    """A finished run with the same experiment keys in another study of ``root`` (the runs'
    ``out_dir``: one profile's folder, so a run of another profile is never taken) that recorded
    the same measurements (:data:`MEASUREMENT_KEYS`, as its config.yaml has them) and, when the
    number of processes is part of the mathematics (:func:`lbsgd.config.world_size_key`), ran on
    ``world_size`` processes."""
    others = [p for p in sorted(root.glob(f"*/{cfg.run_name()}")) if p.parent.name != cfg.study]
    for other in others:
        if rundir.read_status(other) in DONE and _is_twin(other, cfg, world_size):
            return other
    return None


def _is_twin(other: Path, cfg: Config, world_size: int) -> bool:
    """Whether the finished run ``other`` has ``cfg``'s experiment id, recorded its measurements
    and, where the number of processes is part of the mathematics, ran on ``world_size``."""
    try:
        theirs = json.loads((other / "summary.json").read_text()).get("experiment_id")
        keys = config.read_yaml(other / "config.yaml", derived=True)
    except (OSError, ValueError, config.ConfigError):
        return False
    want = {k: getattr(cfg, k) for k in MEASUREMENT_KEYS}
    recorded = {k: keys.get(k, config.FIELDS[k].default) for k in MEASUREMENT_KEYS}
    same_k = config.world_size_key(cfg) is None or keys.get("world_size") == world_size
    return theirs == cfg.experiment_id() and recorded == want and same_k


def copy_run(twin: Path, cfg: Config) -> None:
    """``twin`` (a finished run of another study) as ``cfg``'s run: its records, with config.yaml's
    run keys naming this study (the copy's W&B group, tags and display name), and config.yaml and
    summary.json both saying ``study``: this one, ``copied_from``: ``<study>/<run>`` of the twin
    (its experiment keys, name and ``experiment_id`` are the twin's). Written under a temporary
    name first: an interrupted copy leaves no half run behind."""
    import yaml

    run_dir = cfg.run_dir()
    origin = f"{twin.parent.name}/{twin.name}"
    tmp = run_dir.with_name(f".{run_dir.name}.copying")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(twin, tmp, ignore=COPY_IGNORE)
    values = yaml.safe_load((tmp / "config.yaml").read_text()) or {}
    ours = cfg.to_dict()
    values.update({k: ours[k] for k in COPY_RUN_KEYS})
    aside = (*config.DERIVED_KEYS, *config.RECORD_KEYS)
    keys = {k: v for k, v in values.items() if k not in aside}
    derived = {k: v for k, v in values.items() if k in config.DERIVED_KEYS}
    text = yaml.safe_dump(keys, sort_keys=False)
    if derived:
        text += "# derived (lbsgd.config.derive)\n" + yaml.safe_dump(derived, sort_keys=False)
    text += (
        "# copied by a sweep (lbsgd.lab.experiments): the records are this run's of another study\n"
    )
    text += yaml.safe_dump({"copied_from": origin}, sort_keys=False)
    (tmp / "config.yaml").write_text(text)
    summary = rundir.read_summary(tmp)  # a copy of a copy: its copied_from replaced
    rundir.write_summary(tmp, {**summary, "study": cfg.study, "copied_from": origin})
    os.replace(tmp, run_dir)
