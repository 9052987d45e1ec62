"""Metrics to disk (always) and to Weights & Biases (when enabled); only rank 0 creates a Tracker.

``metrics.jsonl`` in the run directory is the record of truth: one JSON object per logged step and
per evaluation, flushed as it is written. W&B mirrors it (project ``wandb_project``, group = the study,
job_type = train, name = the run, config = every key and derived value) and must never block or
fail a run: its import, init and every log call are guarded, and a failure leaves one warning and a
run that goes on without it.
"""

from __future__ import annotations

import json
import math
import netrc
import os
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any


def resolve_wandb_mode(mode: str) -> str:
    """auto: WANDB_MODE if set, online when an API key is configured, else offline."""
    if mode != "auto":
        return mode
    env = os.environ.get("WANDB_MODE")
    if env in ("online", "offline", "disabled"):
        return env
    if os.environ.get("WANDB_API_KEY"):
        return "online"
    try:
        if netrc.netrc().authenticators("api.wandb.ai"):
            return "online"
    except (OSError, netrc.NetrcParseError):
        pass
    return "offline"


def _jsonable(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)  # JSON has no NaN/inf; keep them visible as "nan"/"inf"
    return v


class Tracker:
    def __init__(self, run_dir: Path, config: dict[str, Any], *, mode: str, project: str,
                 group: str, name: str, truncate_after_step: int | None = None) -> None:  # fmt: skip
        self.path = Path(run_dir) / "metrics.jsonl"
        if truncate_after_step is not None:
            self._truncate(truncate_after_step)
        self._file = self.path.open("a")
        self._wandb = None
        self.wandb_mode = resolve_wandb_mode(mode)
        if self.wandb_mode != "disabled":
            self._init_wandb(run_dir, config, project, group, name)

    # How long an online W&B may take to answer before the run logs offline instead (it never waits
    # longer: a run must not stall on an unreachable server).
    INIT_TIMEOUT_S = 15.0

    def _init_wandb(self, run_dir: Path, config: dict, project: str, group: str, name: str) -> None:
        """Start W&B; online failing (no network, bad key) falls back to offline, one warning."""
        try:
            import wandb

            def start(mode: str):
                return wandb.init(
                    project=project, group=group, job_type="train", name=name, config=config,
                    dir=str(run_dir), mode=mode, reinit="create_new",
                    settings=wandb.Settings(init_timeout=self.INIT_TIMEOUT_S, silent=True),
                )  # fmt: skip

            try:
                self._wandb = start(self.wandb_mode)
            except Exception as e:  # noqa: BLE001
                if self.wandb_mode != "online":
                    raise
                self.wandb_mode = "offline"
                self._wandb = start("offline")
                warnings.warn(
                    f"W&B online failed ({type(e).__name__}: {e}); logging offline instead "
                    f"(wandb sync {run_dir}/wandb/offline-run-* later)", RuntimeWarning, stacklevel=2,
                )  # fmt: skip
        except Exception as e:  # noqa: BLE001 - W&B must never fail a run
            self._warn(f"W&B init failed ({type(e).__name__}: {e}); continuing without W&B")

    def _warn(self, msg: str) -> None:
        warnings.warn(msg, RuntimeWarning, stacklevel=3)
        self._wandb = None

    def _truncate(self, last_step: int) -> None:
        """On resume, drop records written after the checkpoint (they will be recomputed)."""
        if not self.path.exists():
            return
        keep = []
        for line in self.path.read_text().splitlines():
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue  # a line cut by a crash
            if rec.get("step", 0) <= last_step:
                keep.append(line)
        tmp = self.path.with_suffix(".jsonl.tmp")
        tmp.write_text("".join(k + "\n" for k in keep))
        os.replace(tmp, self.path)

    def log(self, record: dict[str, Any], wandb: bool = True) -> None:
        """One line of metrics.jsonl, and (``wandb``) one W&B point."""
        self._file.write(json.dumps({k: _jsonable(v) for k, v in record.items()}) + "\n")
        self._file.flush()
        if self._wandb is not None and wandb:
            try:
                prefix = record.get("kind", "train")
                data = {f"{prefix}/{k}": v for k, v in record.items() if k not in ("kind", "step")}
                self._wandb.log(data, step=record["step"])
            except Exception as e:  # noqa: BLE001
                self._warn(f"W&B log failed ({type(e).__name__}: {e}); continuing without W&B")

    def summary(self, summary: dict[str, Any]) -> None:
        if self._wandb is not None:
            try:
                for k, v in flatten(summary).items():
                    self._wandb.summary[k] = v
            except Exception as e:  # noqa: BLE001
                self._warn(f"W&B summary failed ({type(e).__name__}: {e})")

    def close(self, exit_code: int = 0) -> None:
        self._file.close()
        if self._wandb is not None:
            try:
                self._wandb.finish(exit_code=exit_code)
            except Exception as e:  # noqa: BLE001
                self._warn(f"W&B finish failed ({type(e).__name__}: {e})")


def flatten(d: Mapping[str, Any], sep: str = "/", prefix: str = "") -> dict[str, Any]:
    """``{"final": {"loss": 1}}`` → ``{"final/loss": 1}`` (``sep`` joins the keys)."""
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, Mapping):
            out.update(flatten(v, sep, f"{prefix}{k}{sep}"))
        else:
            out[f"{prefix}{k}"] = v
    return out
