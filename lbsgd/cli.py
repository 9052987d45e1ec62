"""Command line: ``lbsgd train key=value …`` (alone or under torchrun), ``lbsgd keys``, ``lbsgd bench``,
``lbsgd data fake {cifar10,imagenet} DIR`` (files to test and benchmark with, no download).

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
    t.add_argument(
        "-c",
        "--config",
        action="append",
        default=[],
        metavar="FILE",
        help="YAML file of key: value (repeatable; later files win, key=value wins last)",
    )
    t.add_argument("overrides", nargs="*", metavar="key=value", help="see `lbsgd keys`")
    sub.add_parser("keys", help="print every config key: kind, type, default, meaning")
    v = sub.add_parser("verify", help="replay a sample of committed runs: bitwise equal or not")
    v.add_argument(
        "--results",
        default="results/cpu",
        help="a profile's folder of committed runs (relative: to the repository)",
    )
    v.add_argument(
        "--sample",
        type=int,
        default=4,
        help="runs replayed: the cheapest run of each study, cheapest first",
    )
    v.add_argument(
        "--runs",
        nargs="+",
        default=None,
        metavar="NAME",
        help="replay these runs (names, or study/name) instead of a sample",
    )
    v.add_argument(
        "--out", default=None, help="keep the replays here (default: a temporary folder, removed)"
    )
    v.add_argument("--parallel", type=int, default=1, help="replays at a time")
    r = sub.add_parser("report", help="gather a profile's */findings.json into its REPORT.md")
    r.add_argument(
        "--results",
        default="results",
        help="a profile's folder (results/cpu), or a results root: one report per "
        "profile folder in it",
    )
    b = sub.add_parser("bench", help="benchmarks")
    bsub = b.add_subparsers(dest="bench", required=True)
    bt = bsub.add_parser(
        "train", help="trainer vs a bare PyTorch loop on the same model, data, batch"
    )
    bt.add_argument(
        "--steps",
        type=int,
        default=None,
        help="optimizer steps per measurement, the first 3 timed apart as warm-up "
        "(default 150; 50 with --matrix)",
    )
    bt.add_argument(
        "--repeats",
        type=int,
        default=None,
        help="alternating measurements of each side (default 3; 2 with --matrix)",
    )
    bt.add_argument(
        "--out",
        default=None,
        help="write the result as JSON here (default results/benchmarks/"
        "train_<device>.json, device cpu or e.g. cuda_h100)",
    )
    bt.add_argument(
        "--matrix",
        action="store_true",
        help="every precision x compile x layout variant, one line each",
    )
    bt.add_argument(
        "--precisions",
        default=None,
        metavar="LIST",
        help="with --matrix (implied): precisions, default fp32,bf16,fp16",
    )
    bt.add_argument(
        "--compile",
        default=None,
        metavar="LIST",
        dest="compiles",
        help="with --matrix (implied): eager/compiled, default false,true",
    )
    bt.add_argument(
        "--layouts",
        default=None,
        metavar="LIST",
        help="with --matrix (implied): plain (batch = BN group = micro_batch), "
        "ghost_bn (BN groups of bn_batch), accum (batch = --accum x "
        "micro_batch); default all three",
    )
    bt.add_argument(
        "--accum",
        type=int,
        default=4,
        help="with --matrix: micro-batches per step of the accum layout",
    )
    bt.add_argument(
        "--nproc",
        default=None,
        metavar="LIST",
        help="step breakdown instead: processes per layout, e.g. 1,2,4 (torchrun, gloo)",
    )
    bt.add_argument("--comm-hooks", default="none", metavar="LIST", help="with --nproc: hooks")
    bt.add_argument("--bucket-caps", default="25", metavar="LIST", help="with --nproc: MB list")
    bt.add_argument("--step-worker", action="store_true", help=argparse.SUPPRESS)
    bt.add_argument("overrides", nargs="*", metavar="key=value")
    br = bsub.add_parser("recipes", help="cost of accumulation, ghost BN and each precision")
    br.add_argument("--samples", type=int, default=4096, help="images per timed measurement")
    br.add_argument(
        "--repeats", type=int, default=3, help="alternating measurements of each variant"
    )
    br.add_argument("--out", default=None, help="also write the result as JSON here")
    br.add_argument("overrides", nargs="*", metavar="key=value")
    bn = bsub.add_parser(
        "noise", help="cost of noise_scale=true: step time with / without it, per layout"
    )
    bn.add_argument(
        "--steps",
        type=int,
        default=150,
        help="optimizer steps per measurement, the first 3 timed apart as warm-up",
    )
    bn.add_argument(
        "--repeats",
        type=int,
        default=5,
        help="alternating measurements without and with, per layout (median)",
    )
    bn.add_argument(
        "--nproc", type=int, default=2, help="processes of the ddp layout (gloo on a CPU)"
    )
    bn.add_argument(
        "--layouts",
        default=None,
        metavar="LIST",
        help="accum (1 process, B_small = micro_batch), half (1 process, B_small = "
        "batch/2), ddp (--nproc processes, B_small = their share); default all",
    )
    bn.add_argument(
        "--out",
        default=None,
        help="write the result as JSON here (default results/benchmarks/noise_scale_<device>.json)",
    )
    bn.add_argument(
        "overrides",
        nargs="*",
        metavar="key=value",
        help="keys over bench train's, and batch_size=128 micro_batch=32",
    )
    bd = bsub.add_parser(
        "data", help="loader-only img/s of a file dataset vs the model's compute-bound img/s"
    )
    bd.add_argument("--dataset", required=True, help="cifar10 or imagenet")
    bd.add_argument("--data-dir", required=True, help="its folder (lbsgd data fake writes one)")
    bd.add_argument("--workers", type=int, default=0, help="loader worker processes")
    bd.add_argument(
        "--batches",
        type=int,
        default=50,
        help="micro-batches the loader delivers, the first timed apart",
    )
    bd.add_argument(
        "--steps",
        type=int,
        default=30,
        help="optimizer steps of the compute measurement (first 3: warm-up)",
    )
    bd.add_argument("--out", default=None, help="also write the result as JSON here")
    bd.add_argument(
        "overrides",
        nargs="*",
        metavar="key=value",
        help="model, precision, micro-batch, device: as for bench train",
    )
    ba = bsub.add_parser(
        "allreduce", help="all-reduce time and bus bandwidth vs message size, flat and hierarchical"
    )
    ba.add_argument("--nproc", type=int, default=4, help="processes in all (on this machine)")
    ba.add_argument("--nodes", type=int, default=2, help="torchrun agents the processes split into")
    ba.add_argument("--min-bytes", type=int, default=1024, help="smallest message (bytes)")
    ba.add_argument("--max-bytes", type=int, default=256 * 2**20, help="largest message (bytes)")
    ba.add_argument("--iters", type=int, default=10, help="timed all-reduces per size and path")
    ba.add_argument("--out", default="results/benchmarks/allreduce_cpu.json", help="JSON result")
    ba.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    _data_parser(sub)
    return p


def _data_parser(sub) -> None:
    d = sub.add_parser("data", help="dataset files")
    fake = d.add_subparsers(dest="data", required=True).add_parser(
        "fake", help="write fake files in the layout the loaders read (refuses a non-empty DIR)"
    )
    kinds = fake.add_subparsers(dest="kind", required=True)
    c = kinds.add_parser("cifar10", help="DIR/cifar-10-batches-py/ (torchvision's python version)")
    c.add_argument("--train", type=int, default=50_000, help="training images (5 batch files)")
    c.add_argument("--test", type=int, default=10_000, help="test images")
    i = kinds.add_parser("imagenet", help="DIR/{train,val}/<class>/*.JPEG (ImageFolder)")
    i.add_argument("--train", type=int, default=1_000, help="training images, over the classes")
    i.add_argument("--val", type=int, default=200, help="validation images, over the classes")
    i.add_argument("--classes", type=int, default=10, help="class folders")
    i.add_argument("--width", type=int, default=500, help="JPEG width (ImageNet's typical 500)")
    i.add_argument("--height", type=int, default=375, help="JPEG height (typical 375)")
    i.add_argument("--quality", type=int, default=90, help="JPEG quality")
    for k in (c, i):
        k.add_argument("dir", metavar="DIR", help="new or empty directory to write into")
        k.add_argument("--seed", type=int, default=0, help="the images drawn (deterministic)")


def _fake_files(args: argparse.Namespace) -> int:
    from lbsgd.data import fake_files

    try:
        if args.kind == "cifar10":
            where = fake_files.write_cifar10(args.dir, args.train, args.test, args.seed)
        else:
            where = fake_files.write_imagenet(
                args.dir,
                args.train,
                args.val,
                args.classes,
                (args.width, args.height),
                args.quality,
                args.seed,
            )
    except (FileExistsError, ValueError) as e:  # nothing written
        print(f"lbsgd: error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    print(f"wrote {where}")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "keys":
        print(config.describe_keys())
        return 0
    if args.command == "data":
        return _fake_files(args)
    if args.command == "report":
        from lbsgd import report

        try:
            for path in report.write_all(args.results):
                print(f"wrote {path}")
        except FileNotFoundError as e:
            print(f"lbsgd: error: {e}", file=sys.stderr)
            return EXIT_BAD_INPUT
        return 0
    try:
        if args.command == "verify":
            from lbsgd import verify

            return verify.main(args.results, args.sample, args.runs, args.out, args.parallel)
        if args.command == "train":
            _pin_cpu_isa(args.config, args.overrides)
            cfg = config.load(args.config, args.overrides)
            from lbsgd.trainer import STATUS_EXIT_CODE, train

            summary = train(cfg)
            return STATUS_EXIT_CODE.get(summary["status"], 1)
        if args.bench == "allreduce":
            from lbsgd import bench_comm

            if args.worker:  # one process of the torchrun group that bench_allreduce started
                bench_comm.worker(args.out, args.min_bytes, args.max_bytes, args.iters)
            else:
                try:
                    bench_comm.bench_allreduce(
                        args.nproc, args.nodes, args.min_bytes, args.max_bytes, args.iters, args.out
                    )
                except ValueError as e:  # bad sizes or process counts: one line, nothing started
                    print(f"lbsgd: error: {e}", file=sys.stderr)
                    return EXIT_BAD_INPUT
            return 0
        if args.bench == "data":
            from lbsgd import bench_data

            bench_data.bench_data(
                args.dataset,
                args.data_dir,
                args.workers,
                args.batches,
                args.steps,
                args.overrides,
                args.out,
            )
            return 0
        from lbsgd import bench

        if args.bench == "train" and (args.step_worker or args.nproc):
            from lbsgd import bench_comm

            if args.step_worker:
                bench_comm.step_worker(args.overrides, args.steps or 150, args.out)
                return 0
            try:
                bench_comm.bench_breakdown(
                    args.overrides,
                    [int(n) for n in args.nproc.split(",")],
                    args.comm_hooks.split(","),
                    [float(b) for b in args.bucket_caps.split(",")],
                    args.steps or 150,
                    args.out,
                )
            except ValueError as e:
                print(f"lbsgd: error: {e}", file=sys.stderr)
                return EXIT_BAD_INPUT
            return 0
        if args.bench == "train":
            _bench_train(args)
        elif args.bench == "noise":
            for option, value in (("--steps", args.steps), ("--repeats", args.repeats)):
                if value < 1:
                    raise config.ConfigError(f"{option}={value} must be a positive integer")
            out = args.out or bench.default_out(
                args.overrides, "noise_scale", {**bench.DEFAULTS, **bench.NOISE_DEFAULTS}
            )
            layouts = bench.parse_list(
                "--layouts", args.layouts or ",".join(bench.NOISE_LAYOUTS), bench.NOISE_LAYOUTS
            )
            bench.bench_noise(
                args.overrides,
                steps=args.steps,
                repeats=args.repeats,
                nproc=args.nproc,
                layouts=layouts,
                out=out,
            )
        else:
            bench.bench_recipes(
                args.overrides, samples=args.samples, repeats=args.repeats, out=args.out
            )
        return 0
    except config.ConfigError as e:  # includes a checkpoint that cannot be used
        print(f"lbsgd: error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT


def _pin_cpu_isa(files: list[str], overrides: list[str]) -> None:
    """The config's cap of the CPU kernels' instruction set (``cpu_isa``, lbsgd.isa) into the
    environment before anything imports torch (a plugin may): each CPU library reads its cap once,
    at its first use. The trainer then checks that it took effect. Torchrun's workers are
    ``python -m lbsgd train`` too: each pins itself here. Called in a process that has imported
    torch already (``main()`` from Python), it leaves the cap to the trainer's check."""
    from lbsgd import isa

    if "torch" in sys.modules:
        return
    values: dict = {}
    for f in files:
        values.update(config.read_yaml(f))
    values.update(config.parse_overrides(overrides))
    isa.pin(isa.requested(values))


def _bench_train(args: argparse.Namespace) -> None:
    """``lbsgd bench train``: one configuration, or the matrix when --matrix or a list is given."""
    from lbsgd import bench

    for option, value in (("--steps", args.steps), ("--repeats", args.repeats)):
        if value is not None and value < 1:
            raise config.ConfigError(f"{option}={value} must be a positive integer")
    lists = (args.precisions, args.compiles, args.layouts)
    if not (args.matrix or any(v is not None for v in lists)):
        out = args.out or bench.default_out(args.overrides)
        bench.bench_train(
            args.overrides, steps=args.steps or 150, repeats=args.repeats or 3, out=out
        )
        return
    precisions = bench.parse_list(
        "--precisions", args.precisions or ",".join(bench.PRECISIONS), bench.PRECISIONS
    )
    compiles = [
        c == "true"
        for c in bench.parse_list("--compile", args.compiles or "false,true", ("false", "true"))
    ]
    layouts = bench.parse_list("--layouts", args.layouts or ",".join(bench.LAYOUTS), bench.LAYOUTS)
    out = args.out or bench.default_out(args.overrides)
    bench.bench_matrix(
        args.overrides,
        precisions,
        compiles,
        layouts,
        args.accum,
        steps=args.steps or 50,
        repeats=args.repeats or 2,
        out=out,
    )


if __name__ == "__main__":
    sys.exit(main())
