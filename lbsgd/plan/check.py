"""``lbsgd plan --check DIR``: train a plan's recommended config on this machine, as its ``run it``
line would, and set the steps to the target and the time it measured beside the plan's
predictions (``DIR/check.json``; the run in ``DIR/check/``). Everything is checked before the run
starts: a folder holding a plan and its config, a recommendation, the processes it needs here.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from lbsgd import entry, rundir
from lbsgd.config import Config, ConfigError, load
from lbsgd.plan import measure, timer


def _run_keys(folder: Path) -> list[str]:
    """The check's run in ``folder/check``; an interrupted check goes on from its checkpoint."""
    return [f"out_dir={folder}", "study=check", "resume=true"]


def request(text: str) -> tuple[Path, dict[str, Any], Config]:
    """(the plan folder, its plan.json, the run to train) or one line naming ``--check``."""
    folder = Path(text)
    doc_file, rec = folder / "plan.json", folder / "recommended.yaml"
    if not doc_file.is_file():
        raise ConfigError(
            f"--check={text}: not a plan folder (needs the plan.json that `lbsgd plan --out DIR` "
            "writes)"
        )
    doc = json.loads(doc_file.read_text())
    best = doc.get("recommended") or {}
    if "gpus" not in best or not rec.is_file():
        raise ConfigError(
            f"--check={text}: the plan recommends nothing to train (its last line says why), so "
            "there is no recommended.yaml to check"
        )
    if (folder / "check.json").exists():
        raise ConfigError(f"--check={text}: checked already (check.json); plan again to re-check")
    cfg = load([rec], _run_keys(folder))
    here = timer.devices_here(cfg)
    if best["gpus"] > here:
        raise ConfigError(
            f"--check={text}: the plan recommends {best['gpus']} GPUs (processes on a CPU) and "
            f"this machine has {here}: run `{best.get('command', '')}` where it has them"
        )
    entry.check(cfg, best["gpus"], best["gpus"])  # model, data and layout, before the run
    return folder, doc, cfg


def run(folder: Path, doc: dict[str, Any], cfg: Config) -> dict[str, Any]:
    """Train the recommended config (torchrun for several processes), read its steps to the
    target and its steady step, write ``check.json``; the comparison."""
    best = doc["recommended"]
    if best["gpus"] == 1:
        entry.train(cfg)
    else:
        from lbsgd.bench.torchrun import torchrun

        args = ["train", "-c", str(folder / "recommended.yaml"), *_run_keys(folder)]
        torchrun(1, best["gpus"], args)
    run_dir = cfg.run_dir()
    if rundir.read_status(run_dir) == rundir.Status.INTERRUPTED:  # asked to stop: no check
        raise KeyboardInterrupt(f"the run stopped at a checkpoint in {run_dir}")
    out = comparison(best, run_dir, measured(run_dir, measure.Target.parse(doc["target"])))
    with rundir.replacing(folder / "check.json") as tmp:
        tmp.write_text(json.dumps(out, indent=2) + "\n")
    return out


def comparison(best: dict[str, Any], run_dir: Path, got: dict[str, Any]) -> dict[str, Any]:
    """check.json: the recommended row's predictions (its steps' interval the figure's band,
    :func:`lbsgd.plan.show.steps_band`) beside what its run measured (:func:`measured`)."""
    from lbsgd.plan.show import steps_band

    predicted = {k: best[k] for k in ("steps", "step_s", "wall_s")}
    return {
        "run_dir": str(run_dir),
        "batch": best["batch"],
        "gpus": best["gpus"],
        "predicted": {**predicted, "steps_range": steps_band(best)},
        "measured": got,
    }


def measured(run_dir: Path, target: measure.Target) -> dict[str, Any]:
    """A finished run's steps to ``target`` (the first crossing, interpolated in log step; None
    where it never got there), its steady step (batch over the trainer's img/s), the training
    time to the target (the two multiplied: what the plan's wall time predicts) and the run's
    own wall time (evaluations and start-up included)."""
    cfg, records = measure.read_run(run_dir)
    summary = json.loads((run_dir / "summary.json").read_text())
    steps = measure.first_crossing(measure.curve(cfg, records, target), target.value)
    step_s = cfg.batch_size / summary["img_per_s"]
    return {
        "steps": steps,
        "step_s": step_s,
        "wall_s": steps * step_s if steps is not None else None,
        "run_wall_s": summary["wall_time_s"],
        "steps_trained": summary["steps"],
    }


def render(out: dict[str, Any], target: str) -> str:
    p, m = out["predicted"], out["measured"]
    lines = [
        f"checked: batch {out['batch']} on {out['gpus']} GPU(s) (processes on a CPU), trained in "
        f"{out['run_dir']}",
        f"steps to {target}: predicted {p['steps']:.0f}{_band(p.get('steps_range'))}, measured "
        + (
            f"{m['steps']:.0f} ({_ratio(m['steps'], p['steps'])}{_band(p.get('steps_range'), m['steps'])})"
            if m["steps"] is not None
            else f"not reached in {m['steps_trained']} steps"
        ),
        f"step: predicted {p['step_s'] * 1e3:.2f} ms, measured {m['step_s'] * 1e3:.2f} ms "
        f"({_ratio(m['step_s'], p['step_s'])})",
        f"training to the target: predicted {p['wall_s']:.1f} s, measured "
        + (
            f"{m['wall_s']:.1f} s ({_ratio(m['wall_s'], p['wall_s'])}; its steps x its step)"
            if m["wall_s"] is not None
            else "-"
        )
        + f"; the run's wall time {m['run_wall_s']:.1f} s (evaluations and start-up included)",
    ]
    return "\n".join(lines)


def _ratio(measured: float, predicted: float) -> str:
    r = measured / predicted
    return f"x{r:.2f} of the prediction" if math.isfinite(r) else "-"


def _band(pair, steps: float | None = None) -> str:
    """`` (range lo-hi)``, or with ``steps`` whether they fell inside it; empty without one."""
    if not pair:
        return ""
    if steps is None:
        return f" (range {pair[0]:.0f}-{pair[1]:.0f})"
    return f"; {'inside' if pair[0] <= steps <= pair[1] else 'outside'} the range"
