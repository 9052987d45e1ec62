"""Command line: ``lbsgd train key=value …`` (alone or under torchrun), ``lbsgd keys``, ``lbsgd bench``.

Exit codes: 0 completed, 2 bad input (one line on stderr, nothing written), 3 diverged, 1 other errors.
"""

from __future__ import annotations

import argparse
import sys

from lbsgd import config

EXIT_BAD_INPUT = 2


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="lbsgd", description="Large-minibatch distributed SGD.")
    sub = p.add_subparsers(dest="command", required=True)
    t = sub.add_parser("train", help="train one run (works the same under torchrun)")
    t.add_argument("-c", "--config", action="append", default=[], metavar="FILE",
                   help="YAML file of key: value (repeatable; later files win, key=value wins last)")  # fmt: skip
    t.add_argument("overrides", nargs="*", metavar="key=value", help="see `lbsgd keys`")
    sub.add_parser("keys", help="print every config key: kind, type, default, meaning")
    r = sub.add_parser("report", help="gather results/*/findings.json into results/REPORT.md")
    r.add_argument("--results", default="results", help="the results root")
    b = sub.add_parser("bench", help="benchmarks")
    bsub = b.add_subparsers(dest="bench", required=True)
    bt = bsub.add_parser(
        "train", help="trainer vs a bare PyTorch loop on the same model, data, batch"
    )
    bt.add_argument("--steps", type=int, default=150, help="timed optimizer steps per measurement")
    bt.add_argument("--repeats", type=int, default=3, help="alternating measurements of each side")
    bt.add_argument("--out", default=None, help="also write the result as JSON here")
    bt.add_argument("overrides", nargs="*", metavar="key=value")
    br = bsub.add_parser("recipes", help="cost of accumulation, ghost BN and each precision")
    br.add_argument("--samples", type=int, default=4096, help="images per timed measurement")
    br.add_argument(
        "--repeats", type=int, default=3, help="alternating measurements of each variant"
    )
    br.add_argument("--out", default=None, help="also write the result as JSON here")
    br.add_argument("overrides", nargs="*", metavar="key=value")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "keys":
        print(config.describe_keys())
        return 0
    if args.command == "report":
        from lbsgd import report

        try:
            print(f"wrote {report.write(args.results)}")
        except FileNotFoundError as e:
            print(f"lbsgd: error: {e}", file=sys.stderr)
            return EXIT_BAD_INPUT
        return 0
    try:
        if args.command == "train":
            cfg = config.load(args.config, args.overrides)
            from lbsgd.trainer import STATUS_EXIT_CODE, train

            summary = train(cfg)
            return STATUS_EXIT_CODE.get(summary["status"], 1)
        from lbsgd import bench

        if args.bench == "train":
            bench.bench_train(args.overrides, steps=args.steps, repeats=args.repeats, out=args.out)
        else:
            bench.bench_recipes(
                args.overrides, samples=args.samples, repeats=args.repeats, out=args.out
            )
        return 0
    except config.ConfigError as e:
        print(f"lbsgd: error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT


if __name__ == "__main__":
    sys.exit(main())
