"""The step time `lbsgd plan` predicts at one process beside the one a run measures, per batch
(docs/planning.md; tools/gpu-check.sh plan runs it on a GPU, where the target is 15%).

    python tools/plan_step_time.py OUT [--batches 64,128,256] [key=value ...]

The plan's compute model is timed on this device (two micro-batch sizes, lbsgd.plan.timer), the
step predicted at each batch (lbsgd.plan.model.step_time: one process, no all-reduce), then each
batch trained for ``--epochs`` with the planned micro-batch and its steady step time read from
summary.json (batch / img_per_s). Writes OUT/plan_step_time_<device>.json and prints each ratio.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from lbsgd import config, costmodel
from lbsgd.entry import train
from lbsgd.plan import model, timer


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out")
    p.add_argument("--batches", default="64,128,256")
    p.add_argument("--epochs", type=float, default=4.0, help="length of each timed run")
    p.add_argument("--tolerance", type=float, default=0.15)
    p.add_argument(
        "--timing-samples",
        type=int,
        default=None,
        help="samples of each compute timing run (default: lbsgd plan's, timer.timed_samples)",
    )
    p.add_argument(
        "--timing-runs", type=int, default=None, help="timing runs per size (default: lbsgd plan's)"
    )
    p.add_argument("overrides", nargs="*", metavar="key=value")
    args = p.parse_intermixed_args(argv)
    cfg = config.load([], [*args.overrides, "wandb=disabled", "checkpoint=false", "eval_every=0"])
    compute, info = timer.time_compute(cfg, samples=args.timing_samples, runs=args.timing_runs)
    link = costmodel.Link(0.0, 1e12)  # one process: no all-reduce
    rows = []
    for b in (int(v) for v in args.batches.split(",")):
        micro = model.micro_batch(b, compute.max_micro, cfg.bn_batch)
        predicted, _, _ = model.step_time(compute, b, micro, 1, info["grad_bytes"], link)
        run = cfg.replace(
            batch_size=b,
            micro_batch=micro,
            epochs=args.epochs,
            out_dir=str(Path(args.out) / "runs"),
        )
        summary = train(run)
        measured = b / summary["img_per_s"]
        rows.append(
            {
                "batch_size": b,
                "micro_batch": micro,
                "predicted_s": predicted,
                "measured_s": measured,
                "ratio": predicted / measured,
            }
        )
        print(
            f"batch {b}: predicted {1e3 * predicted:.2f} ms, measured {1e3 * measured:.2f} ms "
            f"(x{predicted / measured:.3f})",
            flush=True,
        )
    worst = max(abs(r["ratio"] - 1) for r in rows)
    doc = {
        "benchmark": "plan_step_time",
        "overrides": args.overrides,
        "epochs": args.epochs,
        "timing_samples": args.timing_samples or timer.timed_samples(cfg),
        "timing_runs": args.timing_runs or timer.TIMING_RUNS,
        "compute": info,
        "rows": rows,
        "worst_error": worst,
        "tolerance": args.tolerance,
        "within_tolerance": worst <= args.tolerance,
    }
    slug = info["device"].replace(":", "")
    if info["device"].startswith("cuda"):
        import torch

        from lbsgd.bench.train import device_slug

        slug = device_slug(torch.device("cuda"))
    out = Path(args.out) / f"plan_step_time_{slug}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=2) + "\n")
    print(f"worst {100 * worst:.1f}% (target {100 * args.tolerance:.0f}%): wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
