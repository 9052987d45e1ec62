"""``lbsgd reproduce``: the main job (``make reproduce``). Every notebook a profile replays,
executed in order through :func:`lbsgd.lab.execute.execute`, each given the sweep's parameters that
it declares and no other, then the profile's REPORT.md. :func:`steps` is the one place the
command lines are made: ``--dry-run`` prints them and the tests check them against every notebook
of every profile."""

from __future__ import annotations

import shlex
import signal
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lbsgd.config import ConfigError

# what make reproduce may pass: the scale, where results go, how runs are launched; a notebook
# gets those it declares (notebook 10 trains nothing and launches nothing; 12 and 13 set their own
# process counts)
SWEEP = ("nproc_per_node", "nnodes", "rdzv_endpoint", "parallel", "launcher", "cluster")


@dataclass(frozen=True)
class Step:
    """One notebook of the main job: where its executed copy goes and with which parameters."""

    notebook: str
    output: Path
    parameters: dict[str, Any]

    def argv(self) -> list[str]:
        from lbsgd.lab.experiments.commands import value_text

        params = [a for k, v in self.parameters.items() for a in ("-p", k, value_text(v))]
        return ["lbsgd", "execute", "--log-output", self.notebook, str(self.output), *params]


def steps(
    profile: str,
    notebooks: list[str],
    out: str = "results",
    launch: dict[str, Any] | None = None,
) -> list[Step]:
    """The main job's notebooks at ``profile`` (those of ``notebooks`` it replays, in order),
    each with the parameters of ``launch`` (keys of :data:`SWEEP`) that it declares; every input
    checked first, in one line (a missing notebook, an unknown profile, launcher or key)."""
    import papermill as pm

    from lbsgd.lab.studies import scales

    launch = _checked(notebooks, out, launch or {})
    wanted = {"profile": profile, **launch, "out_dir": out}
    found = []
    for nb in scales.notebooks(profile, notebooks):
        declared = pm.inspect_notebook(nb)
        study = Path(nb).stem.split("_", 1)[1]
        output = Path(out) / profile / study / Path(nb).name
        found.append(Step(nb, output, {k: v for k, v in wanted.items() if k in declared}))
    return found


def _checked(notebooks: list[str], out: str, launch: dict[str, Any]) -> dict[str, Any]:
    """``launch`` without its unset keys, once every input is checked (one line each)."""
    from lbsgd import config

    missing = [nb for nb in notebooks if not Path(nb).is_file()]
    if missing or not notebooks:
        raise ConfigError(
            f"NOTEBOOKS={' '.join(missing or notebooks)!r}: no such notebook (the studies are "
            "notebooks/NN_<study>.ipynb)"
        )
    problem = config.key_problem("out_dir", out)  # OUT is the notebooks' out_dir
    if problem:
        raise ConfigError(f"OUT{problem.removeprefix('out_dir')}")
    launch = {k: v for k, v in launch.items() if v is not None}
    unknown = sorted(set(launch) - set(SWEEP))
    if unknown:
        raise ConfigError(f"-p {unknown[0]}: not a launch parameter (one of {', '.join(SWEEP)})")
    from lbsgd.lab import experiments as ex

    ex.launcher_of(launch.get("launcher", "local"), launch.get("cluster"))  # checked now
    return launch


def main(profile: str, notebooks: list[str], out: str, launch: dict[str, Any], dry: bool) -> int:
    """Execute the steps (or print their command lines, ``dry``); stop at the first that fails,
    with its exit code (its one line is lbsgd execute's); then write the profile's REPORT.md."""
    from lbsgd.lab import execute, report

    todo = steps(profile, notebooks, out, launch)
    if dry:
        for step in todo:
            print(shlex.join(step.argv()))
        print(shlex.join(["lbsgd", "report", "--results", str(Path(out) / profile)]))
        return 0
    # between two notebooks SIGTERM is a Ctrl-C (during one, lbsgd.lab.execute forwards both)
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        for step in todo:
            print(f"== {Path(step.notebook).stem} (profile={profile})", flush=True)
            step.output.parent.mkdir(parents=True, exist_ok=True)
            code = execute.execute(step.notebook, step.output, step.parameters, log_output=True)
            if code:
                return code
    except KeyboardInterrupt:
        print("lbsgd: reproduce interrupted between two notebooks", file=sys.stderr)
        return execute.EXIT_INTERRUPTED
    for path in report.write_all(Path(out) / profile):
        print(f"wrote {path}")
    return 0
