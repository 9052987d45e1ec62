"""``lbsgd bench``: the benchmarks, their command lines and their dispatch.

docs/benchmarks.md lists what each command compares and where it writes. This module imports no
torch (``lbsgd keys`` and the CPU-kernel cap of ``lbsgd train`` come first): each command imports
its module when it runs; those that start several processes do so through
:mod:`lbsgd.bench.torchrun`."""

from __future__ import annotations

import argparse

from lbsgd.config import ConfigError


def add_parser(sub) -> None:
    """The ``bench`` command and its subcommands, on the command line's subparsers ``sub``."""
    b = sub.add_parser("bench", help="benchmarks")
    bsub = b.add_subparsers(dest="bench", required=True)
    bt = bsub.add_parser(
        "train", help="trainer vs a bare PyTorch loop on the same model, data, batch"
    )
    bt.add_argument(
        "--steps",
        type=int,
        help="optimizer steps per measurement, the first 3 timed apart as warm-up "
        "(default 150; 50 with --matrix)",
    )
    bt.add_argument(
        "--repeats",
        type=int,
        help="alternating measurements of each side (default 3; 2 with --matrix)",
    )
    bt.add_argument(
        "--out",
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
        metavar="LIST",
        help="with --matrix (implied): precisions, default fp32,bf16,fp16",
    )
    bt.add_argument(
        "--compile",
        metavar="LIST",
        dest="compiles",
        help="with --matrix (implied): eager/compiled, default false,true",
    )
    bt.add_argument(
        "--layouts",
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
        metavar="LIST",
        help="step breakdown instead: processes per layout, e.g. 1,2,4 (torchrun, gloo)",
    )
    bt.add_argument("--comm-hooks", default="none", metavar="LIST", help="with --nproc: hooks")
    bt.add_argument("--bucket-caps", default="25", metavar="LIST", help="with --nproc: MB list")
    bt.add_argument("--step-worker", action="store_true", help=argparse.SUPPRESS)
    _overrides(bt)
    br = bsub.add_parser("recipes", help="cost of accumulation, ghost BN and each precision")
    br.add_argument("--samples", type=int, default=4096, help="images per timed measurement")
    br.add_argument(
        "--repeats", type=int, default=3, help="alternating measurements of each variant"
    )
    _json_out_and_overrides(br)
    bg = bsub.add_parser(
        "ghost-bn", help="ghost BN's one pass vs a kernel per group vs plain BN, training steps"
    )
    bg.add_argument(
        "--groups", default="2,8,32", help="BN groups a micro-batch, each a row (default 2,8,32)"
    )
    bg.add_argument("--steps", type=int, default=30, help="timed training steps a measurement")
    bg.add_argument("--repeats", type=int, default=3, help="alternating measurements of each")
    _json_out_and_overrides(
        bg, "keys of the measured model (default micro_batch=128, the config's model)"
    )
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
        metavar="LIST",
        help="accum (1 process, B_small = micro_batch), half (1 process, B_small = "
        "batch/2), ddp (--nproc processes, B_small = their share); default all",
    )
    bn.add_argument(
        "--out",
        help="write the result as JSON here (default results/benchmarks/noise_scale_<device>.json)",
    )
    _overrides(bn, "keys over bench train's, and batch_size=128 micro_batch=32")
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
    _json_out_and_overrides(bd, "model, precision, micro-batch, device: as for bench train")
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
    bc = bsub.add_parser(
        "caps", help="training speed of one run under each CPU-kernel cap (cpu_isa), alternating"
    )
    bc.add_argument(
        "--caps", default="avx2,portable", help="caps, the baseline first (default avx2,portable)"
    )
    bc.add_argument("--repeats", type=int, default=3, help="alternating runs under each cap")
    bc.add_argument(
        "-c", "--config", action="append", default=[], metavar="FILE", help="YAML file of keys"
    )
    _json_out_and_overrides(bc, "keys of the measured run, over the files'")


def _overrides(parser: argparse.ArgumentParser, help: str | None = None) -> None:
    """The trailing ``key=value`` config keys every benchmark command takes."""
    parser.add_argument("overrides", nargs="*", metavar="key=value", help=help)


def _json_out_and_overrides(parser: argparse.ArgumentParser, help: str | None = None) -> None:
    """``--out`` (the result also written as JSON, where asked) and the config keys."""
    parser.add_argument("--out", help="also write the result as JSON here")
    _overrides(parser, help)


def run(args: argparse.Namespace) -> None:
    """Run the ``lbsgd bench`` subcommand ``args`` asks for. Bad input (options, keys, process
    layouts) is a one-line ConfigError, raised before anything starts."""
    if args.bench == "train" and (args.nproc or args.step_worker):
        _breakdown(args)
        return
    commands = {
        "train": _train,
        "recipes": _recipes,
        "ghost-bn": _ghost,
        "noise": _noise,
        "data": _data,
        "allreduce": _allreduce,
        "caps": _caps,
    }
    commands[args.bench](args)


def _positive(**options: int | None) -> None:
    for option, value in options.items():
        if value is not None and value < 1:
            raise ConfigError(f"--{option}={value} must be a positive integer")


def _train(args: argparse.Namespace) -> None:
    """``lbsgd bench train``: one configuration, or the matrix when --matrix or a list is given
    (each list the option's, else all)."""
    from lbsgd.bench import train

    _positive(steps=args.steps, repeats=args.repeats)
    lists = (args.precisions, args.compiles, args.layouts)
    matrix = args.matrix or any(v is not None for v in lists)
    if matrix:
        precisions = train.parse_list("--precisions", args.precisions, train.PRECISIONS)
        compiles = train.parse_list("--compile", args.compiles, ("false", "true"))
        layouts = train.parse_list("--layouts", args.layouts, train.LAYOUTS)
    out = args.out or train.default_out(args.overrides)
    if not matrix:
        train.bench_train(
            args.overrides, steps=args.steps or 150, repeats=args.repeats or 3, out=out
        )
        return
    train.bench_matrix(
        args.overrides,
        precisions,
        [c == "true" for c in compiles],
        layouts,
        args.accum,
        steps=args.steps or 50,
        repeats=args.repeats or 2,
        out=out,
    )


def _breakdown(args: argparse.Namespace) -> None:
    """``lbsgd bench train --nproc LIST``: the step breakdown, each layout under torchrun (and
    ``--step-worker``: one of its processes)."""
    from lbsgd.bench import comm

    if args.step_worker:
        comm.step_worker(args.overrides, args.steps or 150, args.out)
        return
    try:
        comm.bench_breakdown(
            args.overrides,
            [int(n) for n in args.nproc.split(",")],
            args.comm_hooks.split(","),
            [float(b) for b in args.bucket_caps.split(",")],
            args.steps or 150,
            args.out,
        )
    except ValueError as e:  # not numbers: one line, nothing started
        raise ConfigError(str(e)) from None


def _recipes(args: argparse.Namespace) -> None:
    from lbsgd.bench import train

    train.bench_recipes(args.overrides, samples=args.samples, repeats=args.repeats, out=args.out)


def _ghost(args: argparse.Namespace) -> None:
    from lbsgd.bench import ghost

    try:
        groups = [int(g) for g in args.groups.split(",")]
    except ValueError:
        raise ConfigError(f"--groups={args.groups}: expected counts like 2,8,32") from None
    ghost.bench_ghost(args.overrides, groups, args.steps, args.repeats, args.out)


def _noise(args: argparse.Namespace) -> None:
    from lbsgd.bench import noise, train

    _positive(steps=args.steps, repeats=args.repeats)
    out = args.out or train.default_out(
        args.overrides, "noise_scale", {**train.DEFAULTS, **noise.NOISE_DEFAULTS}
    )
    layouts = train.parse_list("--layouts", args.layouts, noise.NOISE_LAYOUTS)
    noise.bench_noise(args.overrides, args.steps, args.repeats, args.nproc, layouts, out)


def _data(args: argparse.Namespace) -> None:
    from lbsgd.bench import data

    data.bench_data(
        args.dataset,
        args.data_dir,
        args.workers,
        args.batches,
        args.steps,
        args.overrides,
        args.out,
    )


def _allreduce(args: argparse.Namespace) -> None:
    from lbsgd.bench import comm

    if args.worker:  # one process of the torchrun group that bench_allreduce started
        comm.worker(args.out, args.min_bytes, args.max_bytes, args.iters)
        return
    comm.bench_allreduce(
        args.nproc, args.nodes, args.min_bytes, args.max_bytes, args.iters, args.out
    )


def _caps(args: argparse.Namespace) -> None:
    from lbsgd.bench import caps

    _positive(repeats=args.repeats)
    caps.bench_caps(args.config, args.overrides, caps.parse_caps(args.caps), args.repeats, args.out)
