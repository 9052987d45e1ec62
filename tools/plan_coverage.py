"""How often runs at a plan's own lr took steps inside the plan's steps range (docs/planning.md).

    python tools/plan_coverage.py                     # study 16's committed runs (fashion-long)
    python tools/plan_coverage.py --probe DIR [--range-test DIR] --runs DIR [--target 25]

Each network's plan is made again from its probe run (and its lr range test, which caps the lr)
as ``lbsgd plan`` makes it; each run's steps to the held-out error target (the first crossing of
its evaluations) are set beside its batch's row: the interval of B_crit's and the probe's steps
alone (``steps_corners``, the interval before the lr's was added) and ``steps_range``. A run that
never reached the target is inside only where the interval reaches past the steps it ran.
"""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import dataclass
from pathlib import Path

from lbsgd import costmodel
from lbsgd import plan as planner
from lbsgd.plan import lr_range, measure, model

STUDY = Path(__file__).resolve().parents[1] / "results" / "fashion-long" / "plan"
NETWORKS = ("alexnet_bn", "resnet8")  # study 16's second part at fashion-long
PROBE_SEED, SEEDS, TARGET = 2, (8, 9, 10), 24.0


@dataclass(frozen=True)
class Case:
    batch: int
    seed: int
    predicted: float
    old: tuple[float, float]
    new: tuple[float, float]
    steps: float  # inf: never reached
    ran: int  # the steps the run trained

    def inside(self, pair: tuple[float, float]) -> bool:
        if math.isinf(self.steps):
            return pair[1] >= self.ran
        return pair[0] <= self.steps <= pair[1]


def cases(probe: Path, test: Path | None, runs: list[Path], target: float) -> list[Case]:
    """Each run of ``runs`` beside its batch's row of the plan from ``probe`` (capped by the range
    test ``test``); runs at a batch the plan has no row for are left out."""
    goal = measure.Target("error", target)
    p = measure.read_probe(probe, goal, "pointed at")
    cfg, _ = measure.read_run(probe)
    compute = model.Compute(0.0, 1e-3, 0.5, 1 << 20)  # steps and lr alone: no time is read
    rt = lr_range.read(test) if test is not None else None
    x = planner.inputs_for(cfg, p, compute, costmodel.LINKS["nvlink"], 1.0, test=rt)
    out = []
    for run in runs:
        c, records = measure.read_run(run)
        row = model.row(x, c.batch_size, 1)
        if row is None:
            continue
        s = measure.first_crossing(measure.curve(c, records, goal), target)
        ran = int(max(r["step"] for r in records if "step" in r))
        old = model.steps_corners(x, c.batch_size)
        new = model.steps_range(x, c.batch_size)
        out.append(
            Case(c.batch_size, c.seed, row.steps, old, new, math.inf if s is None else s, ran)
        )
    return sorted(out, key=lambda k: (k.batch, k.seed))


def study_16(folder: Path = STUDY) -> dict[str, list[Case]]:
    """Study 16's second part: each network's probe (seed 2, batch 64), its range test, and its
    runs on the fresh seeds, from the committed folder."""
    out = {}
    for net in NETWORKS:
        dirs = [d for d in sorted(folder.glob(f"{net}-*")) if (d / "config.yaml").is_file()]
        seeds = {d: measure.read_run(d)[0] for d in dirs}
        mine = [d for d, c in seeds.items() if c.seed == PROBE_SEED]
        probe = next(d for d in mine if seeds[d].noise_scale)
        test = next((d for d in mine if not seeds[d].noise_scale), None)
        runs = [d for d, c in seeds.items() if c.seed in SEEDS]
        out[net] = cases(probe, test, runs, TARGET)
    return out


def _pair(p: tuple[float, float]) -> str:
    return f"{p[0]:.0f}-{p[1]:.0f}"


def report(name: str, found: list[Case]) -> str:
    lines = [f"{name}: batch seed predicted measured | old range in? | new range in?"]
    for k in found:
        got = f"{k.steps:.0f}" if math.isfinite(k.steps) else f">{k.ran}"
        lines.append(
            f"  {k.batch:>5} {k.seed:>4} {k.predicted:>8.0f} {got:>8} | {_pair(k.old):>9} "
            f"{'yes' if k.inside(k.old) else 'no':>3} | {_pair(k.new):>9} "
            f"{'yes' if k.inside(k.new) else 'no':>3}"
        )
    old, new = (sum(k.inside(getattr(k, w)) for k in found) for w in ("old", "new"))
    above = [k for k in found if k.batch > min(c.batch for c in found)]
    a_old, a_new = (sum(k.inside(getattr(k, w)) for k in above) for w in ("old", "new"))
    lines.append(
        f"  inside: old {old}/{len(found)}, new {new}/{len(found)}; above the probe's batch: "
        f"old {a_old}/{len(above)}, new {a_new}/{len(above)}"
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    a = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    a.add_argument("--probe", type=Path)
    a.add_argument("--range-test", type=Path)
    a.add_argument("--runs", type=Path, nargs="*", default=[])
    a.add_argument("--target", type=float, default=TARGET)
    args = a.parse_args(argv)
    if args.probe is None:
        found = study_16()
    else:
        runs = [p.parent for d in args.runs for p in sorted(d.glob("**/summary.json"))]
        found = {args.probe.name: cases(args.probe, args.range_test, runs, args.target)}
    print("\n".join(report(n, f) for n, f in found.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
