"""Metrics to disk (always) and to Weights & Biases (when enabled); only rank 0 creates a Tracker.

``metrics.jsonl`` in the run directory is the record of truth: one JSON object per logged step and
per evaluation, flushed as it is written. W&B mirrors it and must never block or fail a run: its
import, init and every log call are guarded, and a failure leaves one warning and a run that goes
on without it. What W&B gets (project, group, display names, one point per flush, resuming): the
Weights & Biases section of docs/training.md."""

from __future__ import annotations

import json
import math
import netrc
import os
import secrets
import string
import sys
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from lbsgd.config import ConfigError

# in a run's directory: its W&B run id, written once, kept across resumes; in a study's folder: the
# id of the study's W&B run (lbsgd.lab.studies.session.log_study), kept across the notebook's re-runs
ID_FILE = "wandb_id"


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


def finite(v: Any) -> Any:
    """Strict JSON: non-finite floats (a diverged loss) become the strings "nan" / "inf"."""
    if isinstance(v, dict):
        return {k: finite(x) for k, x in v.items()}
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)
    return v


def new_run_id() -> str:
    """A fresh W&B run id (8 characters of [0-9a-z], as W&B makes them)."""
    alphabet = string.ascii_lowercase + string.digits
    return "".join(secrets.choice(alphabet) for _ in range(8))


def read_id(path: Path) -> str | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return text or None


def batch_ratio(config: Mapping[str, Any]) -> int | float | None:
    """k = batch_size / reference_batch (an int when whole)."""
    try:
        k = config["batch_size"] / config["reference_batch"]
    except (KeyError, TypeError, ZeroDivisionError):
        return None
    return int(k) if float(k).is_integer() else k


def _text(v: Any) -> str:
    if isinstance(v, bool):
        return str(v).lower()
    if v is None:
        return "null"
    if isinstance(v, float):
        return f"{v:g}"
    if isinstance(v, list | tuple):
        return ",".join(_text(x) for x in v)
    return str(v)


def name_values(config: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(key, value text) of a run's W&B display name: ``k`` first and ``seed`` last, always (even
    at their defaults: a sweep run again with more seeds or another k names its new runs as the
    first sweep named its own), the other ``varied`` keys between, in the order given, then
    ``world_size`` when the run trained on more than one process (the process count is no key,
    yet one study's group holds local SGD on 2 and on 4 processes)."""
    varied = [k for k in config.get("varied") or () if k not in ("k", "seed")]
    if (config.get("world_size") or 1) > 1:
        varied.append("world_size")
    values = {**config, "k": batch_ratio(config)}
    return [(k, _text(values.get(k))) for k in dict.fromkeys(["k", *varied, "seed"])]


def display_name(config: Mapping[str, Any]) -> str:
    """``k=16 warmup=gradual seed=0``: the rule of :func:`name_values`, for every run."""
    return " ".join(f"{k}={v}" for k, v in name_values(config))


def run_tags(config: Mapping[str, Any]) -> list[str]:
    """profile, study and ``key=value`` of each key of the display name (W&B: at most 64 chars)."""
    tags = [config.get("profile"), config.get("study")]
    tags += [f"{k}={v}" for k, v in name_values(config)]
    return list(dict.fromkeys(str(t)[:64] for t in tags if t))


def wandb_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """Every key and derived value, plus ``k`` (and ``profile``, null when the run has none)."""
    return {**config, "profile": config.get("profile"), "k": batch_ratio(config)}


def _define_epoch_axis(run: Any) -> None:
    """``epoch`` with every point is the x-axis of train/* and eval/* (runs of different batch
    sizes have different steps, the same epochs)."""
    run.define_metric("epoch")
    run.define_metric("train/*", step_metric="epoch")
    run.define_metric("eval/*", step_metric="epoch")


def _point(record: Mapping[str, Any]) -> dict[str, Any]:
    """One JSONL record as a W&B point: ``epoch`` as is, the rest under ``<kind>/``; a field
    without a value at this step (None: e.g. a noise scale whose |G|² estimate is not positive)
    is left out rather than charted."""
    prefix = record.get("kind", "train")
    data = {
        f"{prefix}/{k}": v
        for k, v in record.items()
        if k not in ("kind", "step", "epoch") and v is not None
    }
    if "epoch" in record:
        data["epoch"] = record["epoch"]
    return data


def window_means(records: Sequence[Mapping[str, Any]], log_every: int) -> list[dict[str, Any]]:
    """W&B's train points from the per-step train records of metrics.jsonl: one per flush window,
    its loss the window's mean. A window's steps share the flush's ``img_per_s``; runs of
    consecutive records with one value, at most ``log_every`` long, are taken as its windows."""
    points: list[dict[str, Any]] = []
    window: list[Mapping[str, Any]] = []

    def close() -> None:
        if window:
            losses = [float(r["loss"]) for r in window]
            points.append({**window[-1], "loss": sum(losses) / len(losses)})
            window.clear()

    for r in records:
        if window and (
            r.get("img_per_s") != window[-1].get("img_per_s") or len(window) >= max(1, log_every)
        ):
            close()
        window.append(r)
    close()
    return points


class Tracker:
    # How long an online W&B may take to answer before the run logs offline instead (it never waits
    # longer: a run must not stall on an unreachable server).
    INIT_TIMEOUT_S = 15.0

    def __init__(
        self,
        run_dir: Path,
        config: dict[str, Any],
        *,
        mode: str,
        project: str,
        group: str,
        name: str,
        truncate_after_step: int | None = None,
    ) -> None:
        """``config``: every key and derived value. ``truncate_after_step`` (a resume): the step of
        the checkpoint; later records are dropped, and W&B continues the run's earlier W&B run."""
        self.path = Path(run_dir) / "metrics.jsonl"
        if truncate_after_step is not None:
            self._truncate(truncate_after_step)
        self._file = self.path.open("a")
        self._wandb = None
        self.wandb_id: str | None = None
        self.wandb_mode = resolve_wandb_mode(mode)
        if self.wandb_mode == "disabled":
            return
        # W&B: online failing (no network, bad key) falls back to offline, one warning
        run_dir, resumed_from = Path(run_dir), truncate_after_step
        try:
            import wandb

            id_file = run_dir / ID_FILE
            earlier = read_id(id_file)
            run_id = earlier or new_run_id()
            if earlier is None:
                id_file.write_text(run_id + "\n")
            cfg = {**wandb_config(config), "run_name": name}
            if resumed_from is not None:
                cfg["resumed_from_step"] = resumed_from

            def start(mode: str, fallback: bool = False):
                this_id, resume, notes, c = run_id, None, None, cfg
                if mode == "online":
                    resume = "allow"  # a continuation goes on in the same W&B run
                elif earlier is not None and resumed_from is not None:
                    # W&B cannot resume an offline run: a new one, saying what it continues
                    this_id, c = new_run_id(), {**cfg, "continues": earlier}
                    notes = f"continues W&B run {earlier} from step {resumed_from}"
                elif fallback:  # W&B keeps the failed online attempt's id "in use": a new one
                    this_id = new_run_id()
                    id_file.write_text(this_id + "\n")
                run = wandb.init(
                    project=project,
                    group=group,
                    job_type="train",
                    name=display_name(config),
                    config=c,
                    tags=run_tags(config),
                    notes=notes,
                    id=this_id,
                    resume=resume,
                    dir=str(run_dir),
                    mode=mode,
                    reinit="create_new",
                    settings=wandb.Settings(init_timeout=self.INIT_TIMEOUT_S, silent=True),
                )
                self.wandb_id = this_id
                return run

            try:
                self._wandb = start(self.wandb_mode)
            except Exception as e:
                if self.wandb_mode != "online":
                    raise
                self.wandb_mode = "offline"
                self._wandb = start("offline", fallback=True)
                warnings.warn(
                    f"W&B online failed ({type(e).__name__}: {e}); logging offline instead "
                    f"(wandb sync {run_dir}/wandb/offline-run-* later)",
                    RuntimeWarning,
                    stacklevel=2,
                )
            _define_epoch_axis(self._wandb)
        except Exception as e:  # W&B must never fail a run
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
        """One line of metrics.jsonl, and (``wandb``) the same record as one W&B point."""
        self._file.write(json.dumps(finite(record)) + "\n")
        self._file.flush()
        if wandb:
            self.log_wandb(record)

    def log_wandb(self, record: dict[str, Any]) -> None:
        """One W&B point only (a flush's window mean; the JSONL has each step)."""
        if self._wandb is not None:
            try:
                self._wandb.log(_point(record), step=record["step"])
            except Exception as e:
                self._warn(f"W&B log failed ({type(e).__name__}: {e}); continuing without W&B")

    def summary(self, summary: dict[str, Any]) -> None:
        if self._wandb is not None:
            try:
                for k, v in flatten(summary).items():
                    self._wandb.summary[k] = v
            except Exception as e:
                self._warn(f"W&B summary failed ({type(e).__name__}: {e})")

    def close(self, exit_code: int = 0) -> None:
        self._file.close()
        if self._wandb is not None:
            try:
                self._wandb.finish(exit_code=exit_code)
            except Exception as e:
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


# -- runs and studies logged after the fact (from a notebook's process) ---------------------------


def init_after(mode: str, run_dir: Path, **kwargs: Any) -> Any:
    """A W&B run logged after the fact (:func:`log_copied_run`,
    :func:`lbsgd.lab.studies.session.log_study`): online failing falls back to
    offline (the caller's one warning says so); None when disabled."""
    import wandb

    mode = resolve_wandb_mode(mode)
    if mode == "disabled":
        return None
    settings = wandb.Settings(init_timeout=Tracker.INIT_TIMEOUT_S, silent=True, console="off")
    run_dir.mkdir(parents=True, exist_ok=True)

    def start(m: str) -> Any:
        extra = {"resume": "allow"} if m == "online" else {}
        return wandb.init(
            dir=str(run_dir), mode=m, reinit="create_new", settings=settings, **kwargs, **extra
        )

    if mode != "online":
        return start(mode)
    try:
        return start("online")
    except Exception as e:
        kwargs["id"] = new_run_id()  # W&B keeps the failed online attempt's id "in use"
        run = start("offline")
        warnings.warn(
            f"W&B online failed ({type(e).__name__}: {e}); logged offline instead "
            f"(wandb sync {run_dir}/wandb/offline-run-* later)",
            RuntimeWarning,
            stacklevel=3,
        )
        return run


def read_records(path: str | os.PathLike, quiet: bool = False) -> list[dict[str, Any]]:
    """The records of a ``metrics.jsonl``. A last line cut mid-record (a crash while writing it;
    a resume appends after it) is left out with one warning line; a bad line before it stops
    the read in one line naming the file and line (a ConfigError). ``quiet``: no warning.
    Every reader of a run's records reads them here."""
    path = Path(path)
    lines = [x for x in path.read_text().splitlines() if x.strip()]
    out = []
    for i, line in enumerate(lines, 1):
        try:
            out.append(json.loads(line))
        except ValueError:
            if i < len(lines):
                raise ConfigError(
                    f"{path}: line {i} of {len(lines)} is not a JSON record (damaged)"
                ) from None
            if not quiet:
                print(
                    f"lbsgd: warning: {path} ends in a partial record (line {i}, cut by a crash): "
                    f"read up to its last full record",
                    file=sys.stderr,
                    flush=True,
                )
    return out


def _replay_records(run: Any, run_dir: Path, log_every: int) -> None:
    """A run's metrics.jsonl into W&B as the trainer logs it (a point per flush window, each
    evaluation), then its summary.json."""
    _define_epoch_axis(run)
    records = read_records(run_dir / "metrics.jsonl")
    train = [r for r in records if r.get("kind", "train") == "train"]
    points = window_means(train, log_every)
    evals = [r for r in records if r.get("kind") == "eval"]
    for r in sorted(points + evals, key=lambda r: (r["step"], r.get("kind") == "eval")):
        run.log(_point(r), step=r["step"])
    summary_path = run_dir / "summary.json"
    if summary_path.exists():
        for k, v in flatten(json.loads(summary_path.read_text())).items():
            run.summary[k] = v


def log_copied_run(
    run_dir: str | os.PathLike,
    *,
    copied_from: str | os.PathLike,
    mode: str,
    project: str = "lbsgd",
    varied: Sequence[str] | None = None,
    profile: str | None = None,
) -> str | None:
    """Log a run that a sweep copied from another study (``copied_from``, the twin's folder) into
    this study's W&B group (the study = ``run_dir``'s parent folder): a new W&B run (its id in
    ``run_dir/wandb_id``) replaying metrics.jsonl (a point per flush window, as the trainer logs)
    and the summary; config = the run's, with ``study`` this one, ``copied_from`` (study/run) and
    ``copied_from_wandb_id``. ``varied``/``profile``: this study's, when they differ from the
    copied config's. Returns the W&B id, or None (disabled, or a failure: one RuntimeWarning)."""
    try:
        import yaml

        run_dir, twin = Path(run_dir), Path(copied_from)
        # its config.yaml: ``study`` the folder's, this study's varied and profile where given
        config = yaml.safe_load((run_dir / "config.yaml").read_text()) or {}
        config["study"] = run_dir.parent.name
        if varied is not None:
            config["varied"] = list(varied)
        if profile is not None:
            config["profile"] = profile
        cfg = {
            **wandb_config(config),
            "run_name": run_dir.name,
            "copied_from": f"{twin.parent.name}/{twin.name}",
            "copied_from_wandb_id": read_id(twin / ID_FILE),
        }
        run = init_after(
            mode,
            run_dir,
            project=project,
            group=config["study"],
            job_type="train",
            id=new_run_id(),
            name=display_name(config),
            config=cfg,
            tags=run_tags(config),
            notes=f"copied from {cfg['copied_from']} (identical experiment keys)",
        )
        if run is None:
            return None
        (run_dir / ID_FILE).write_text(run.id + "\n")  # this copy's own W&B run
        try:
            _replay_records(run, run_dir, int(config.get("log_every") or 1))
        finally:
            run.finish()
        return run.id
    except Exception as e:  # W&B never fails the sweep
        warnings.warn(
            f"W&B: copied run {run_dir} not logged ({type(e).__name__}: {e})",
            RuntimeWarning,
            stacklevel=2,
        )
        return None
