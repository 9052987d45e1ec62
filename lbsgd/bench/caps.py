"""``lbsgd bench caps``: what a CPU-kernel cap (``cpu_isa``, lbsgd.isa) costs in training speed.

A cap takes effect only in a process whose kernels have not run yet, so each measurement is a
fresh ``python -m lbsgd train`` of the same keys under one cap, into a temporary folder (no W&B,
no checkpoints); the caps alternate, ``repeats`` times each, so that a machine's drift falls on
every side alike. The figure of a run is its summary's steady img/s (warm-up timed apart); the
result is each cap's best and median and their ratios to the first cap's, printed and written as
JSON with the environment of the invocation.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from lbsgd import config, isa

# keys of every measured run: a throw-away run in a temporary folder
RUN_KEYS = ("wandb=disabled", "checkpoint=false", "checkpoint_every=0", "resume=false")


def parse_caps(text: str) -> list[str]:
    """``"avx2,portable"`` → ["avx2", "portable"]: at least two known caps, each once."""
    caps = [c.strip() for c in text.split(",") if c.strip()]
    unknown = [c for c in caps if c not in isa.CAPS]
    if unknown or len(caps) < 2 or len(set(caps)) != len(caps):
        raise config.ConfigError(
            f"--caps={text}: give two or more distinct caps, the baseline first "
            f"(valid: {', '.join(isa.CAPS)})"
        )
    return caps


def _one(files: list[str], overrides: list[str], cap: str, where: Path) -> dict[str, Any]:
    """One run under ``cap`` in a fresh process: its summary."""
    cmd = [sys.executable, "-m", "lbsgd", "train"]
    for f in files:
        cmd += ["-c", f]
    cmd += [*overrides, *RUN_KEYS, f"cpu_isa={cap}", f"out_dir={where}", "study=bench", "name=r"]
    env = {k: v for k, v in os.environ.items() if k not in isa.VARIABLES}  # no cap inherited
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, stdin=subprocess.DEVNULL)
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(f"cpu_isa={cap}: the run failed (exit code {proc.returncode}): {tail}")
    return json.loads((where / "bench" / "r" / "summary.json").read_text())


def bench_caps(
    files: list[str], overrides: list[str], caps: list[str], repeats: int, out: str | None
) -> dict[str, Any]:
    """Alternate runs of the same keys under each of ``caps``; each cap's img/s and its ratio to
    the first cap's (best of ``repeats`` and of medians)."""
    config.load(files, [*overrides, *RUN_KEYS])  # bad keys: one line, before any run
    speeds: dict[str, list[float]] = {c: [] for c in caps}
    records: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="lbsgd-bench-caps-") as tmp:
        for r in range(repeats):
            for cap in caps:
                where = Path(tmp) / f"{cap}-{r}"
                summary = _one(files, overrides, cap, where)
                speeds[cap].append(float(summary["img_per_s"]))
                records[cap] = summary["environment"]["cpu_isa"]
                print(f"[{r + 1}/{repeats}] cpu_isa={cap}: {speeds[cap][-1]:.1f} img/s", flush=True)
    base = caps[0]
    rows = {
        cap: {
            "img_per_s": v,
            "best": max(v),
            "median": statistics.median(v),
            "ratio_best": max(v) / max(speeds[base]),
            "ratio_of_medians": statistics.median(v) / statistics.median(speeds[base]),
            "cpu_isa_record": records[cap],
        }
        for cap, v in speeds.items()
    }
    for cap in caps[1:]:
        print(
            f"cpu_isa={cap} vs {base}: {rows[cap]['ratio_best']:.3f} of its speed (best of "
            f"{repeats}), {rows[cap]['ratio_of_medians']:.3f} (medians)",
            flush=True,
        )
    import torch

    from lbsgd.environment import environment

    result = {
        "benchmark": "CPU-kernel caps: training speed of the same run under each cap",
        "baseline": base,
        "repeats": repeats,
        "config_files": files,
        "overrides": overrides,
        "caps": rows,
        "environment": {**environment(torch.device("cpu"), 1), "node": platform.node()},
    }
    from lbsgd.bench.train import write

    write(result, out)
    return result
