"""Command line: ``lbsgd train key=value …`` (alone or under torchrun), ``lbsgd keys``, ``lbsgd bench``,
``lbsgd data fake {cifar10,imagenet} DIR`` (files to test and benchmark with, no download),
``lbsgd data fetch fashion_mnist [DIR]`` (the real files, through torchvision: needs internet),
``lbsgd plan -c CONFIG --target error=PCT`` (batch, lr, warmup and GPU count, predicted).

Exit codes: 0 completed, 2 bad input (one line on stderr, nothing written), 3 diverged, 1 other errors,
130 a command other than train ended by its first Ctrl-C or SIGTERM (one line on stderr).
A run that started says how it ended in its last line, whatever the exit code (lbsgd.progress).
"""

from __future__ import annotations

import argparse
import os
import sys

from lbsgd import bench, config

EXIT_BAD_INPUT = 2
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as a shell reports a Ctrl-C


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="lbsgd", description="Large-minibatch distributed SGD.")
    sub = p.add_subparsers(dest="command", required=True)
    t = sub.add_parser("train", help="train one run (works the same under torchrun)")
    _config_options(t, "YAML file of key: value (repeatable; later files win, key=value wins last)")
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
    r.add_argument(
        "--side-by-side",
        nargs="+",
        metavar="PROFILE_DIR",
        default=None,
        help="instead: print the claims of these profiles' folders side by side (results/cpu "
        "results/fashion), one markdown table with the paper's numbers; writes nothing",
    )
    for q in (v, r):
        q.add_argument(
            "--skip-damaged",
            action="store_true",
            help="leave out run folders that cannot be read (each named in one line) instead of "
            "stopping at them",
        )
    r.add_argument(
        "--headline",
        nargs="+",
        metavar="PROFILE_DIR",
        default=None,
        help="instead: print one row per profile folder (runs, each outcome's count, a link to "
        "its REPORT.md): README's table; writes nothing",
    )
    r.add_argument(
        "--verdicts",
        action="store_true",
        help="with --side-by-side: the verdicts alone, no evidence and no paper column "
        "(README's table)",
    )
    n = sub.add_parser(
        "reproduce",
        help="the main job (make reproduce): every notebook a profile replays, executed in order, "
        "then its REPORT.md",
    )
    n.add_argument("profile", help="a profile of lbsgd.lab.studies.scales (cpu, fashion, ...)")
    n.add_argument("notebooks", nargs="+", metavar="NOTEBOOK", help="notebooks/NN_<study>.ipynb")
    n.add_argument("--out", default="results", help="results root (OUT)")
    _parameter_option(
        n,
        "a launch parameter, given to each notebook that declares it: "
        "nproc_per_node, nnodes, rdzv_endpoint, parallel, launcher, cluster",
    )
    n.add_argument("--dry-run", action="store_true", help="print the command lines; run nothing")
    e = sub.add_parser(
        "execute",
        help="execute a study notebook through papermill, quietly (make reproduce runs this): "
        "one line on a bad parameter or an interrupt",
    )
    e.add_argument("notebook", metavar="NOTEBOOK", help="notebooks/NN_<study>.ipynb")
    e.add_argument("output", metavar="OUTPUT", help="where the executed copy is saved")
    _parameter_option(
        e, "a notebook parameter, as papermill's -p (a value in [] or {} read as YAML)"
    )
    e.add_argument("--log-output", action="store_true", help="print the cells' output as they run")
    bench.add_parser(sub)
    _data_parser(sub)
    _plan_parser(sub)
    return p


def _parameter_option(p: argparse.ArgumentParser, help: str) -> None:
    """``-p KEY VALUE``, repeatable (lbsgd execute's and lbsgd reproduce's)."""
    p.add_argument(
        "-p",
        "--parameter",
        nargs=2,
        action="append",
        default=[],
        metavar=("KEY", "VALUE"),
        help=help,
    )


def _config_options(p: argparse.ArgumentParser, help: str) -> None:
    """``-c FILE`` (repeatable) and the ``key=value`` overrides (lbsgd train's and lbsgd plan's)."""
    p.add_argument("-c", "--config", action="append", default=[], metavar="FILE", help=help)
    p.add_argument("overrides", nargs="*", metavar="key=value", help="see `lbsgd keys`")


def _plan_parser(sub) -> None:
    pl = sub.add_parser(
        "plan",
        help="the batch size, lr, warmup and GPU count worth using for a config, with predicted "
        "steps and time to a target (docs/planning.md)",
    )
    _config_options(pl, "YAML file of keys")
    pl.add_argument(
        "--target",
        default=None,
        help="error=PCT (held-out top-1 error; the test split's without holdout) or loss=VALUE "
        "(the training loss's moving average over a tenth of an epoch)",
    )
    pl.add_argument(
        "--gpus",
        default=None,
        help="GPU (or CPU process) counts to plan for (default: 1,2,4,8 for a CUDA run; on a "
        "CPU the powers of two up to this machine's cores)",
    )
    pl.add_argument(
        "--interconnect",
        default="nvlink",
        help="bench:FILE (`lbsgd bench allreduce --out FILE` on your cluster) or a preset: "
        "nvlink, pcie3, ethernet_10g, ethernet_50g, ethernet_100g, infiniband_edr (default nvlink)",
    )
    pl.add_argument(
        "--out",
        default=None,
        help="a new folder for plan.json, plan.png, recommended.yaml and the probe run (default: "
        "out_dir/plans/<the config's run name>, under results/cli: git ignores it)",
    )
    pl.add_argument(
        "--reference",
        default=None,
        metavar="RUN_DIR",
        help="a finished run at the config's batch with noise_scale=true to read instead of "
        "training the probe",
    )
    pl.add_argument(
        "--probe-epochs",
        type=float,
        default=None,
        help="cap the probe run at these epochs (default: the config's); past its end the steps "
        "to the target are extrapolated, and the plan says so",
    )
    pl.add_argument(
        "--timing-samples",
        type=int,
        default=None,
        help="samples (and at least 40 steps) of each short run that times the compute and a "
        "2-process step (default 4096, on a GPU 16384; fewer: a faster, noisier plan)",
    )
    pl.add_argument(
        "--timing-runs",
        type=int,
        default=None,
        help="short runs per timed size, their median taken (default 3; 1: faster, and open to "
        "a slow spell of the machine)",
    )
    pl.add_argument(
        "--lr-rule",
        default=None,
        help="each row's lr: saturating (McCandlish et al.: eps_max/(1 + B_noise/B) through the "
        "probe's lr; SGD's and LARS's default), linear (Goyal et al.), sqrt (the Adam family's "
        "default); every rule capped by the lr range test",
    )
    pl.add_argument(
        "--no-lr-test",
        action="store_true",
        help="skip the lr range test at the largest batch the plan vouches for (120 steps; "
        "without it no row's lr is checked against a measured bound, and the plan says so)",
    )
    pl.add_argument(
        "--check",
        default=None,
        metavar="DIR",
        help="train the recommended config of the plan in DIR on this machine and print its "
        "measured steps to the target and time beside the plan's (alone: no other option)",
    )
    pl.add_argument(
        "--batches",
        default=None,
        metavar="LO:HI",
        help="plan the powers of two in LO..HI (default: the config's batch to an 8-step epoch)",
    )


def _data_parser(sub) -> None:
    d = sub.add_parser("data", help="dataset files")
    actions = d.add_subparsers(dest="data", required=True)
    fake = actions.add_parser(
        "fake", help="write fake files in the layout the loaders read (refuses a non-empty DIR)"
    )
    fetch = actions.add_parser(
        "fetch", help="download a real dataset through torchvision (needs internet)"
    )
    fetch.add_argument("name", choices=["fashion_mnist"], help="the dataset")
    fetch.add_argument(
        "dir",
        metavar="DIR",
        nargs="?",
        default=None,
        help="its data_dir (default: data/fashion_mnist, where dataset=fashion_mnist looks when "
        "Debian's /usr/share/datasets/fashion-mnist is absent); nothing is downloaded when DIR "
        "holds the files already",
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
        error(e)
        return EXIT_BAD_INPUT
    print(f"wrote {where}")
    return 0


def _fetch(args: argparse.Namespace) -> int:
    from lbsgd.data import fashion_mnist

    try:
        where = fashion_mnist.fetch(args.dir)
    except FileExistsError as e:  # nothing written
        error(e)
        return EXIT_BAD_INPUT
    except RuntimeError as e:  # no network, or files that are not Fashion-MNIST's
        error(e)
        return 1
    print(f"Fashion-MNIST's four files are in {where}: dataset=fashion_mnist data_dir={where}")
    return 0


def _report(args: argparse.Namespace) -> int:
    from lbsgd.lab import report
    from lbsgd.lab.experiments import results

    if args.skip_damaged:
        os.environ[results.SKIP_DAMAGED] = "1"
    try:
        if args.side_by_side is not None:
            print(report.side_by_side(args.side_by_side, args.verdicts), end="")
            return 0
        if args.headline is not None:
            print(report.headline(args.headline), end="")
            return 0
        for path in report.write_all(args.results):
            print(f"wrote {path}")
    except (FileNotFoundError, config.ConfigError) as e:  # a damaged run: one line naming it
        error(e)
        return EXIT_BAD_INPUT
    return 0


def error(message: object) -> None:
    """``lbsgd: error: <message>`` on stderr in one write: the lines of torchrun's workers, which
    share the stream, never interleave."""
    sys.stderr.write(f"lbsgd: error: {message}\n")
    sys.stderr.flush()


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.command == "keys":
        print(config.describe_keys())
        return 0
    if args.command == "data":
        return _fake_files(args) if args.data == "fake" else _fetch(args)
    if args.command == "report":
        return _until_interrupted("report", lambda: _report(args))
    if args.command == "execute":
        from lbsgd.lab import execute

        parameters = {k: execute.parameter(v) for k, v in args.parameter}
        return _until_interrupted(  # an interrupt before its kernel runs a cell
            "execute",
            lambda: execute.execute(args.notebook, args.output, parameters, args.log_output),
        )
    try:
        return _checked(args)
    except config.ConfigError as e:  # includes a checkpoint that cannot be used
        error(e)
        return EXIT_BAD_INPUT


def _checked(args: argparse.Namespace) -> int:
    """The commands whose bad input is a ConfigError (one line, exit code EXIT_BAD_INPUT)."""
    if args.command == "reproduce":
        from lbsgd.lab import execute, reproduce

        launch = {k: execute.parameter(v) for k, v in args.parameter}
        return reproduce.main(args.profile, args.notebooks, args.out, launch, args.dry_run)
    if args.command == "verify":
        from lbsgd.lab import verify

        return _until_interrupted(
            "verify",
            lambda: verify.main(
                args.results, args.sample, args.runs, args.out, args.parallel, args.skip_damaged
            ),
        )
    if args.command == "plan":
        return _plan(args)
    if args.command == "train":
        _pin_cpu_isa(args.config, args.overrides)
        cfg = config.load(args.config, args.overrides)
        from lbsgd.entry import train
        from lbsgd.rundir import STATUS_EXIT_CODE

        summary = train(cfg)
        return STATUS_EXIT_CODE.get(summary["status"], 1)
    return _until_interrupted("bench", lambda: bench.run(args) or 0)


def _until_interrupted(what: str, run, left: str = "") -> int:
    """``run()``'s exit status; the first Ctrl-C or SIGTERM ends it at once (the runs it started
    stopped by their runner, lbsgd.jobs) in one line, exit status 130."""
    from lbsgd.lab.experiments.interrupts import sigterm_as_interrupt

    try:
        with sigterm_as_interrupt(pass_on=False):
            return run()
    except KeyboardInterrupt as e:
        why = str(e) or "SIGINT"
        print(f"lbsgd {what}: interrupted ({why}){left}", file=sys.stderr, flush=True)
        return EXIT_INTERRUPTED


def _plan(args: argparse.Namespace) -> int:
    """The plan, or its check; the first Ctrl-C or SIGTERM ends either at once, nothing written
    from a cut stage."""
    _pin_cpu_isa(args.config, args.overrides)
    if args.check is not None:
        return _until_interrupted("plan", lambda: _plan_check(args), ": no check.json written")
    left = ": no plan written; the same command again goes on from its runs' checkpoints"
    return _until_interrupted("plan", lambda: _plan_written(args), left)


def _plan_written(args: argparse.Namespace) -> int:
    from lbsgd import plan

    r = plan.request(args)  # every option checked: one line before anything runs
    doc = plan.plan(r)
    print(plan.render(doc))
    print(f"wrote {r.out / 'plan.json'}, {r.out / 'plan.png'}")
    return 0


def _plan_check(args: argparse.Namespace) -> int:
    from lbsgd.plan import check

    given = [
        f"--{k}" for k in ("target", "reference", "out", "batches") if getattr(args, k) is not None
    ]
    if args.config or args.overrides or given:
        extra = ", ".join([*(["-c"] if args.config else []), *args.overrides, *given])
        raise config.ConfigError(
            f"--check={args.check}: takes no other option ({extra}): the plan's recommended.yaml "
            "is the run"
        )
    folder, doc, cfg = check.request(args.check)
    print(check.render(check.run(folder, doc, cfg), doc["target"]))
    print(f"wrote {folder / 'check.json'}")
    return 0


def _pin_cpu_isa(files: list[str], overrides: list[str]) -> None:
    """The config's cap of the CPU kernels' instruction set (``cpu_isa``, lbsgd.isa) into the
    environment before anything imports torch (a plugin may): each CPU library reads its cap once,
    at its first use. The trainer then checks that it took effect. Torchrun's workers are
    ``python -m lbsgd train`` too: each pins itself here. Called in a process that has imported
    torch already (``main()`` from Python), it leaves the cap to the trainer's check."""
    from lbsgd import isa

    if "torch" in sys.modules:
        return
    isa.pin(isa.requested(config.read_values(files, overrides)))  # each key checked alone first


if __name__ == "__main__":
    sys.exit(main())
