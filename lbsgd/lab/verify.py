"""``lbsgd verify``: replay a sample of committed runs and say, for each, whether it gives the same
digits here.

A replay is the committed run's config.yaml pointed at a temporary folder (no W&B, no
checkpoints; a CPU run on the CPU, on as many processes as it recorded) and gets one of three
levels (:func:`level`): bitwise equal, consistent (final top-1 within :data:`SPREADS` seed spreads
and no finding of its study changes verdict) or inconsistent. The levels, the sample (``--sample
N``: the cheapest run of each study) and the exit status are docs/portability.md ("make verify").
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lbsgd import config, isa, jobs, launch, tracking
from lbsgd.lab.execute import signal_when_the_parent_ends

EXIT_BAD_INPUT = 2
# a replay is consistent when its final top-1 error is within this many seed spreads (standard
# deviations over the seeds of its group) of the committed run's: the difference of two draws has
# √2 spreads, so 2 spreads hold it about 84% of the time
SPREADS = 2.0
LEVELS = ("bitwise equal", "consistent", "inconsistent")
# what the findings' recomputation copies of a profile's folder: records only
RECORDS_ONLY = shutil.ignore_patterns(
    "checkpoint*.pt", ".checkpoint.pt.tmp", "wandb", "wandb_id", "*.ipynb", "*.png", "*.log"
)
# metrics.jsonl values that a replay must reproduce (img_per_s and the like are the machine's)
COMPARED = {
    "train": ("lr", "loss", "loss_scale"),
    # the held-out split's only with holdout > 0 (None on both sides of a run without one)
    "eval": (
        "top1_error_pct",
        "top5_error_pct",
        "test_loss",
        "val_top1_error_pct",
        "val_top5_error_pct",
        "val_loss",
    ),
}


@dataclass(frozen=True)
class Run:
    """A committed run: its folder, study, config keys (raw) and summary."""

    dir: Path
    study: str
    keys: dict[str, Any]
    summary: dict[str, Any]

    @property
    def name(self) -> str:
        return self.dir.name

    @property
    def cost(self) -> float:
        return float(self.summary.get("wall_time_s") or math.inf)

    @property
    def processes(self) -> int:
        """The processes the run was trained by (its replay's too)."""
        return int(self.summary.get("environment", {}).get("world_size", 1))

    @property
    def top1(self) -> float | None:
        v = self.summary.get("final", {}).get("top1_error_pct")
        return v if isinstance(v, float | int) else None


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def find_runs(root: Path) -> list[Run]:
    """The completed CPU runs under ``root`` (a profile's folder: ``study/run/``), sorted."""
    runs = []
    for summary_path in sorted(root.glob("*/*/summary.json")):
        run_dir = summary_path.parent
        summary = _read_json(summary_path)
        if not isinstance(summary, dict) or summary.get("status") != "completed":
            continue
        if not (run_dir / "metrics.jsonl").is_file() or not (run_dir / "config.yaml").is_file():
            continue
        env = summary.get("environment", {})
        if env.get("device", "cpu") != "cpu":
            continue  # GPU runs are bitwise only under deterministic kernels, on the same GPU
        if "async_ps" in summary:
            continue  # a parameter server's arrival order does not repeat
        try:
            keys = config.read_yaml(run_dir / "config.yaml")
        except config.ConfigError:
            continue
        runs.append(Run(run_dir, run_dir.parent.name, keys, summary))
    return runs


def sample(runs: list[Run], n: int) -> list[Run]:
    """The cheapest run of each study (an experiment shared by studies counted once), cheapest
    first, at most ``n``."""
    picked: list[Run] = []
    seen: set[str] = set()
    for study in sorted({r.study for r in runs}):
        mine = sorted((r for r in runs if r.study == study), key=lambda r: (r.cost, r.name))
        for r in mine:
            eid = r.summary.get("experiment_id", r.name)
            if eid not in seen:
                seen.add(eid)
                picked.append(r)
                break
    return sorted(picked, key=lambda r: (r.cost, r.study, r.name))[:n]


def _experiment(keys: dict[str, Any], drop: tuple[str, ...] = ()) -> dict[str, Any]:
    return {
        k: v
        for k, v in keys.items()
        if k in config.FIELDS
        and config.FIELDS[k].metadata["kind"] == "experiment"
        and k not in drop
    }


def seed_spread(run: Run, runs: list[Run]) -> tuple[float | None, int]:
    """Standard deviation (points) of final top-1 error over the seeds of ``run``'s experiment
    (its experiment keys but the seed), in any study of the profile: a study that holds one seed
    of an experiment another study ran with three is judged by the three. Each experiment counts
    once (a run copied between studies is one draw); the number of seeds (None when fewer than
    two)."""
    mine = _experiment(run.keys, ("seed",))
    by_id = {
        r.summary.get("experiment_id", f"{r.study}/{r.name}"): r.top1
        for r in runs
        if _experiment(r.keys, ("seed",)) == mine and r.top1 is not None
    }
    errors = list(by_id.values())
    return (statistics.stdev(errors) if len(errors) > 1 else None), len(errors)


def _metrics(path: Path) -> dict[tuple[str, int], dict[str, Any]]:
    return {
        (rec["kind"], int(rec["step"])): {k: rec.get(k) for k in COMPARED[rec["kind"]]}
        for rec in tracking.read_records(path)
        if rec.get("kind") in COMPARED
    }


def _record_difference(key: tuple[str, int], a: dict | None, b: dict | None) -> str | None:
    """Where the records of ``key`` (kind, step) differ, reference ``a`` and replay ``b``."""
    if a is None or b is None:
        return f"{key[0]} step {key[1]} is only in the {'replay' if a is None else 'reference'}"
    for k in a:
        if a[k] != b[k]:
            return f"step {key[1]}: {key[0]} {k} {a[k]!r} vs {b[k]!r}"
    return None


def compare(reference: Path, replay: Path) -> str | None:
    """None when ``replay`` reproduces ``reference`` bitwise (metrics.jsonl's compared values at
    every step, and the summary's final metrics); else where they first differ."""
    ref, new = _metrics(reference / "metrics.jsonl"), _metrics(replay / "metrics.jsonl")
    for key in sorted(set(ref) | set(new), key=lambda k: (k[1], k[0])):
        if (difference := _record_difference(key, ref.get(key), new.get(key))) is not None:
            return difference
    fa = (_read_json(reference / "summary.json") or {}).get("final", {})
    fb = (_read_json(replay / "summary.json") or {}).get("final", {})
    for k in sorted(set(fa) | set(fb)):
        if fa.get(k) != fb.get(k):
            return f"final {k} {fa.get(k)!r} vs {fb.get(k)!r}"
    return None


def machine_match(committed: dict[str, Any], here: dict[str, Any]) -> str:
    """Whether the replay ran on the committed run's CPU model and under its caps, in words."""
    model = committed.get("cpu_model")
    parts = [
        "CPU model not recorded"
        if model is None
        else "same CPU model"
        if model == here.get("cpu_model")
        else f"other CPU model (committed {model!r}, here {here.get('cpu_model')!r})"
    ]
    ours, theirs = here.get("cpu_isa") or {}, committed.get("cpu_isa")
    fields = ("requested", "aten", "onednn", "onednn_convolutions", "mkl_cbwr")
    if theirs is None:
        parts.append("caps not recorded")
    elif all(theirs.get(k) == ours.get(k) for k in fields):
        parts.append(f"same caps ({_caps(ours)})")
    else:
        parts.append(f"other caps (committed {_caps(theirs)}, here {_caps(ours)})")
    return ", ".join(parts)


def _caps(record: dict[str, Any]) -> str:
    """What the caps pinned, as each library reported it (``lbsgd.isa``'s record)."""
    onednn = record.get("onednn") or "unpinned"
    if record.get("onednn_convolutions") is False:
        onednn = "off"
    return (
        f"cpu_isa={record.get('requested')}: ATen {record.get('aten')}, oneDNN convolutions "
        f"{onednn}, MKL {record.get('mkl_cbwr') or 'AUTO'}"
    )


def replay_command(run: Run, out: Path) -> list[str]:
    """The command line of ``run``'s replay into ``out``."""
    python = [sys.executable] if run.processes == 1 else launch.torchrun(run.processes)
    return [
        *(*python, "-m", "lbsgd", "train", "-c", str(run.dir / "config.yaml")),
        *(f"out_dir={out}", f"study={run.study}", f"name={run.name}", "resume=false"),
        *("wandb=disabled", "checkpoint=false", "checkpoint_every=0", "device=cpu"),
    ]


def _pct(value: float | None) -> str:
    return f"{value:.2f}%" if value is not None else "n/a"


def level(
    differs: bool, delta: float | None, spread: float | None, changed: list[str] | None
) -> tuple[str, str]:
    """A replay's level (:data:`LEVELS`) and why. ``delta``: its final top-1 error minus the
    committed one's (points); ``spread``: the seed spread of the committed run's group (None: one
    seed); ``changed``: the claims of its study whose verdict changes with the replay standing in
    (None: not recomputed)."""
    if not differs:
        return "bitwise equal", ""
    if delta is None:
        return "inconsistent", "no final top-1 error to compare"
    if spread is None:
        return "inconsistent", "its group has one seed: no seed spread to judge the difference by"
    if abs(delta) > SPREADS * spread:
        return "inconsistent", (
            f"final top-1 error moved {delta:+.2f} points, more than {SPREADS:g} seed spreads "
            f"({SPREADS * spread:.2f} points)"
        )
    if changed is None:
        return "inconsistent", "its study's findings could not be recomputed"
    if changed:
        return "inconsistent", f"with the replay standing in, findings change verdict: {changed}"
    return "consistent", (
        f"final top-1 error {delta:+.2f} points, within {SPREADS:g} seed spreads "
        f"({SPREADS * spread:.2f}), and no finding of its study changes verdict"
    )


def changed_verdicts(committed: dict[str, Any], recomputed: dict[str, Any]) -> list[str]:
    """The claims whose verdict (outcome, :data:`lbsgd.lab.findings.OUTCOMES`) differs between
    two findings.json (a claim in one only: changed)."""

    def verdicts(findings: Any) -> dict[str, Any]:
        found = findings.get("findings", []) if isinstance(findings, dict) else []
        return {f.get("claim"): f.get("outcome", f.get("replayed")) for f in found}

    a, b = verdicts(committed), verdicts(recomputed)
    return sorted(str(c) for c in set(a) | set(b) if a.get(c, "absent") != b.get(c, "absent"))


def recompute_findings(root: Path, run: Run, replay: Path, scratch: Path) -> list[str] | None:
    """The claims of ``run``'s study whose verdict changes when ``replay`` stands in for ``run``:
    its notebook executed (papermill, W&B off) over a copy of the profile folder ``root`` (records
    only) in ``scratch``. None when it cannot be recomputed (no
    notebooks/NN_<study>.ipynb in the repository, no findings, a failure)."""
    from lbsgd.lab.studies import repo_root

    found = sorted((repo_root() / "notebooks").glob(f"[0-9][0-9]_{run.study}.ipynb"))
    notebook = found[0] if found else None
    committed = _read_json(run.dir.parent / "findings.json")
    if notebook is None or committed is None:
        return None
    copy = scratch / root.name
    shutil.copytree(root, copy, ignore=RECORDS_ONLY)
    if (root.parent / "benchmarks").is_dir():  # what notebooks 10 and 12 read beside the runs
        shutil.copytree(root.parent / "benchmarks", scratch / "benchmarks")
    target = copy / run.study / run.name
    shutil.rmtree(target)
    shutil.copytree(replay, target, ignore=RECORDS_ONLY)
    (copy / run.study / "findings.json").unlink()
    cmd = [
        *(sys.executable, "-m", "papermill", "--no-progress-bar", str(notebook)),
        str(copy / run.study / notebook.name),
        *("-p", "profile", root.name, "-p", "out_dir", str(scratch)),
        *("-p", "wandb", "disabled", "-p", "parallel", "1"),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, stdin=subprocess.DEVNULL)
    recomputed = _read_json(copy / run.study / "findings.json")
    if proc.returncode != 0 or recomputed is None:
        return None
    return changed_verdicts(committed, recomputed)


def _print_difference(
    run: Run, difference: str, top1: float | None, delta: float | None, spread, seeds: int
) -> None:
    """The lines of a replay that differs: where first, and its final error beside the seeds'."""
    beside = (
        f"seed spread of its group {spread:.2f} points ({seeds} seeds)"
        if spread is not None
        else "no seed spread (one seed in its group)"
    )
    shown = f"{delta:+.2f} points" if delta is not None else "n/a"
    print(f"  differs, first at {difference}")
    print(f"  final top-1 error {_pct(run.top1)} committed vs {_pct(top1)} here: {shown}; {beside}")


def _report(run: Run, runs: list[Run], replay: Path, code: int, log: Path, root: Path) -> str:
    """Print the lines of one replay; its level (:data:`LEVELS`)."""
    if code != 0:  # the replay did not complete: its log's last line
        tail = log.read_text(errors="replace").strip().splitlines()[-1:] if log.exists() else []
        print(f"  replay failed (exit code {code}): {tail[0] if tail else 'no output'}")
        print("  level: inconsistent (the replay did not complete)")
        return "inconsistent"
    difference = compare(run.dir, replay)
    new = _read_json(replay / "summary.json") or {}
    top1 = new.get("final", {}).get("top1_error_pct")
    spread, seeds = seed_spread(run, runs)
    delta = top1 - run.top1 if top1 is not None and run.top1 is not None else None
    changed = None
    if difference is None:
        print(f"  bitwise equal (final top-1 error {_pct(top1)})")
    else:
        _print_difference(run, difference, top1, delta, spread, seeds)
        if delta is not None and spread is not None and abs(delta) <= SPREADS * spread:
            with tempfile.TemporaryDirectory(prefix="lbsgd-verify-findings-") as scratch:
                changed = recompute_findings(root, run, replay, Path(scratch))
    print(
        f"  machine: {machine_match(run.summary.get('environment', {}), new.get('environment', {}))}"
    )
    name, why = level(difference is not None, delta, spread, changed)
    print(f"  level: {name}{f' ({why})' if why else ''}")
    return name


def main(
    results: str,
    n: int = 4,
    names: list[str] | None = None,
    out: str | None = None,
    parallel: int = 1,
    skip_damaged: bool = False,
) -> int:
    """Replay and report; 0 when every replay is bitwise equal or consistent, 1 otherwise (a
    damaged run folder included, unless ``skip_damaged``), 2 on bad input."""
    from lbsgd.lab.studies import results_root

    root = results_root(results)
    if n < 1 or parallel < 1:
        return _bad(f"--sample={n} and --parallel={parallel} must be positive integers")
    if not _damaged_named(root, skip_damaged):
        return 1
    runs = find_runs(root)
    if not runs:
        return _bad(f"no completed CPU runs under {root} (expected {root}/<study>/<run>/)")
    chosen, problem = _choose(runs, names, n, root)
    if problem := problem or _out_problem(out, root):
        return _bad(problem)
    where = Path(out).resolve() if out else Path(tempfile.mkdtemp(prefix="lbsgd-verify-"))
    print(
        f"lbsgd verify: {len(chosen)} of {len(runs)} runs under {root}, replayed in {where}\n"
        f"this machine: {_machine()}",
        flush=True,
    )
    try:
        replays = _Replays(len(chosen), runs, where, root, parallel)  # each reported as it ends
        jobs.Runner(chosen, replays).run()
        levels = replays.levels
        counts = ", ".join(f"{levels.count(x)} {x}" for x in LEVELS)
        print(f"lbsgd verify: {len(levels)} replays: {counts}")
        return 0 if "inconsistent" not in levels else 1
    finally:
        if not out:
            shutil.rmtree(where, ignore_errors=True)


def _damaged_named(root: Path, skip: bool) -> bool:
    """Each run folder under ``root`` that cannot be read (:func:`lbsgd.lab.experiments.damage`:
    its config.yaml, summary.json or metrics.jsonl missing or unreadable) named in one line;
    whether to go on (none, or ``skip``)."""
    from lbsgd.lab.experiments import results

    dirs, bad = results.damaged(root, "*/*", ("config.yaml", "summary.json", "metrics.jsonl"))
    results.say_cut(dirs)
    for d, why in bad:
        print(f"lbsgd verify: damaged: {d} ({why})", file=sys.stderr, flush=True)
    if bad and not skip:
        print(
            f"lbsgd verify: {len(bad)} run folder(s) cannot be read (named above): re-run them, "
            "or leave them out with --skip-damaged",
            file=sys.stderr,
        )
    return not bad or skip


def _machine() -> str:
    """This machine's CPU model and its widest vector extensions, in words."""
    flags = [f for f in ("avx2", "avx512f", "amx_tile") if f in (isa.cpu_flags() or [])]
    return f"{isa.cpu_model()} ({', '.join(flags) or 'no AVX2'})"


def _choose(
    runs: list[Run], names: list[str] | None, n: int, root: Path
) -> tuple[list[Run], str | None]:
    """The runs named (``names``: a run's name or ``study/name``), else a sample of ``n``; with
    what is wrong with the names, if anything."""
    if not names:
        return sample(runs, n), None
    chosen = [r for r in runs if r.name in names or f"{r.study}/{r.name}" in names]
    unknown = [x for x in names if not any(x in (r.name, f"{r.study}/{r.name}") for r in chosen)]
    if unknown:
        return chosen, f"--runs: no completed CPU run named {', '.join(unknown)} under {root}"
    return chosen, None


def _out_problem(out: str | None, root: Path) -> str | None:
    """What is wrong with ``--out`` (None: a temporary folder): inside the committed results, or
    not empty."""
    if not out:
        return None
    where = Path(out).resolve()
    if where == root.resolve() or root.resolve() in where.parents:
        return f"--out={out} is inside the committed results {root}: choose another"
    if where.exists() and any(where.iterdir()):
        return f"--out={out} is not empty"
    return None


@dataclass
class _Replays(jobs.Policy[Run]):
    """The replays' policy for their runner (:mod:`lbsgd.jobs`): each replay's output in its log
    (``where/<study>/<run>.log``), and its lines and level once it ends."""

    total: int
    runs: list[Run]
    where: Path
    root: Path
    parallel: int = 1
    levels: list[str] = field(default_factory=list)

    def log(self, run: Run) -> Path:
        return self.where / run.study / f"{run.name}.log"

    def start(self, job: jobs.Job[Run]) -> subprocess.Popen:
        log = self.log(job.item)
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "w") as f:
            return subprocess.Popen(
                replay_command(job.item, self.where),
                stdout=f,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
                start_new_session=True,  # its processes (torchrun's workers) ended as one
                # SIGKILL when lbsgd verify ends, even where an interrupt came as it was started
                preexec_fn=lambda: signal_when_the_parent_ends(signal.SIGKILL),
            )

    def interrupted(self, runner: jobs.Runner[Run]) -> None:
        """A replay cut short proves nothing: each running one is ended, not waited for."""
        for job in runner.running:
            with contextlib.suppress(OSError):
                os.killpg(job.proc.pid, signal.SIGKILL)
            job.proc.wait()

    def ended(self, job: jobs.Job[Run]) -> None:
        run = job.item
        print(f"[{job.number}/{self.total}] {run.study}/{run.name} ({job.seconds:.0f} s)")
        replay = self.where / run.study / run.name
        self.levels.append(
            _report(run, self.runs, replay, job.proc.returncode, self.log(run), self.root)
        )
        sys.stdout.flush()


def _bad(message: str) -> int:
    print(f"lbsgd: error: {message}", file=sys.stderr)
    return EXIT_BAD_INPUT


def fingerprint(run_dir: Path) -> dict[str, Any]:
    """The digits of a finished run, to compare across machines: every logged train loss (repr,
    so no digit is lost) and a sha256 over its final weights (checkpoint.pt's model, in key
    order)."""
    import hashlib

    import torch

    losses = [
        repr(rec["loss"])
        for rec in tracking.read_records(run_dir / "metrics.jsonl")
        if rec.get("kind") == "train"
    ]
    state = torch.load(run_dir / "checkpoint.pt", map_location="cpu", weights_only=False)["model"]
    h = hashlib.sha256()
    for name in sorted(state):
        h.update(name.encode())
        h.update(state[name].detach().contiguous().cpu().numpy().tobytes())
    return {"losses": losses, "weights_sha256": h.hexdigest()}
