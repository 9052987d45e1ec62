"""Bad input, everywhere a user types: one line naming the key, before any work, nothing touched.

One table of inputs through the four doors of lbsgd: the command line (``lbsgd train key=value``),
YAML files (``lbsgd train -c file``), a notebook's parameters (``scales.get`` and
``experiments.sweep``, the first calls of every study notebook) and ``experiments.sweep`` called
with its own study name, runs and launch options. Each must be refused with exit code 2 (command
line) or a ConfigError (notebook, sweep), with a one-line message naming the key or file and saying
what would be valid; every file already under the fixture's directory must be left
byte-for-byte and mtime-for-mtime as it was, and no file or folder added.
"""

import gzip
import json
import math
import os
import re
import types
import typing
from pathlib import Path

import pytest
import torch
from conftest import TINY, lbsgd, used_keys

from lbsgd import checkpoint, cli, config, distributed, entry
from lbsgd.config import KEYS, Config, ConfigError
from lbsgd.data.fashion_mnist import ALL_FILES
from lbsgd.entry import train
from lbsgd.lab import experiments, studies
from lbsgd.lab.studies import scales


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    """A results directory holding a completed run, a stopped run with damaged checkpoints and a
    folder that is not a run."""
    root = tmp_path_factory.mktemp("bad_input")
    out = root / "results"
    for name in ("existing", "broken"):
        train(Config(**{**TINY, "epochs": 0.25, "out_dir": str(out), "name": name}))
    broken = out / "runs" / "broken"
    for f in (checkpoint.NAME, checkpoint.PREVIOUS):
        if (broken / f).exists() or f == checkpoint.NAME:
            (broken / f).write_bytes(b"not a checkpoint")
    summary = json.loads((broken / "summary.json").read_text())
    (broken / "summary.json").write_text(json.dumps({**summary, "status": "failed"}))
    (out / "runs" / "notes").mkdir()
    (out / "runs" / "notes" / "todo.txt").write_text("mine\n")
    (out / "runs" / "stray.txt").write_text("a file where a run's folder would be made\n")
    (root / "empty").mkdir()
    (root / "afile").write_text("a file where a folder would be made\n")
    (root / "cifar_without_batches").mkdir()
    _fashion_mnist_dirs(root)
    files = {
        "unknown.yaml": "batch_size: 64\nwarmpu: none\n",
        "list.yaml": "- batch_size: 64\n",
        "syntax.yaml": "batch_size: [64\n",
        "type.yaml": "epochs: ten\n",
        "nan.yaml": "momentum: .nan\n",
        "raising.py": "raise RuntimeError('no GPU driver here')\n",
        "exiting.py": "import sys\n\nsys.exit('usage: python exiting.py DIR')\n",
        "plugin.yaml": f"plugins: [{root}/raising.py]\n",
        "escape.yaml": "study: ../escaped\n",
        "nul_name.yaml": 'name: "run\\0"\n',
        "nul_data.yaml": f'data_dir: "{root}/da\\0ta"\n',
        "ignored.yaml": "schedule: cosine\npoly_power: 3\n",
        "project.yaml": "wandb_project: team/lbsgd\n",
        "mps.yaml": "device: mps\n",
        "cuda.yaml": "device: cuda\n",
        "empty_data.yaml": 'data_dir: ""\n',
        "file_name.yaml": "name: stray.txt\n",
        "fresh.yaml": "name: fresh\n",
        "big_seed.yaml": f"seed: {2**64}\n",
        "huge_data.yaml": "synthetic_train: 100000000000\n",
        "threads.yaml": "threads: 5000\n",
        # read before validation by the CPU cap (lbsgd.cli) and the plugin import (config.load)
        "isa_list.yaml": "cpu_isa: [avx2]\n",
        "plugins_int.yaml": "plugins: 5\n",
        "plugins_nested.yaml": "plugins: [[a.py]]\n",
        "fm_truncated.yaml": f"dataset: fashion_mnist\ndata_dir: {root}/fm_truncated\n",
    }
    for name, text in files.items():
        (root / name).write_text(text)
    (root / "latin1.yaml").write_bytes("name: caf\u00e9\n".encode("latin-1"))
    return root


def _fashion_mnist_dirs(root: Path) -> None:
    """Fashion-MNIST data_dirs that are refused: three of the four files; the training images
    truncated (the right header, 100 of 47,040,000 pixels); a foreign file in their place (an HTML
    page, gzipped). The files after the refused one are empty: it is refused first."""
    names = [f.name for f in ALL_FILES]
    header = (0x803).to_bytes(4, "big") + b"".join(n.to_bytes(4, "big") for n in (60_000, 28, 28))
    firsts = {
        "fm_three": None,
        "fm_truncated": (names[0], header + bytes(100)),
        "fm_foreign": (names[0] + ".gz", gzip.compress(b"<html>Not Found</html>\n")),
    }
    for folder, first in firsts.items():
        (root / folder).mkdir()
        for name in names[1:] if first else names[:3]:
            (root / folder / name).write_bytes(b"")
        if first:
            (root / folder / first[0]).write_bytes(first[1])


def _snapshot(root: Path) -> dict[str, tuple[bytes, int] | None]:
    """Every file's bytes and mtime, and every folder (a folder made is a write too)."""
    return {
        str(p.relative_to(root)): (p.read_bytes(), p.stat().st_mtime_ns) if p.is_file() else None
        for p in sorted(root.rglob("*"))
    }


TINY_ARGS = [f"{k}={v}" for k, v in TINY.items()]

# (door, input, words the one line must hold); {root} is the fixture's directory. A door's settings
# after ':' are environment variables (torchrun's), gpus=N: the CUDA devices torch sees, so that a
# missing device is missing on any machine, and readonly=F: the fixture's folder F cannot be written
# in (even by root, who may write anywhere).
CASES = [
    ("cli", ["batchsize=64"], ["batchsize", "did you mean 'batch_size'"]),
    ("cli", ["warmup=linear"], ["warmup", "'none', 'constant' or 'gradual'"]),
    ("cli", ["batch_size=abc"], ["batch_size", "valid integer"]),
    ("cli", ["momentum=1.5"], ["momentum", "[0, 1)"]),
    ("cli", ["checkpoint_every=-3"], ["checkpoint_every", ">= 0"]),
    ("cli", ["seed=-1"], ["seed", ">= 0"]),
    ("cli", ["batch_size"], ["batch_size", "not key=value"]),
    ("cli", ["model=resnet7"], ["model", "resnet"]),
    # -- keys that the setting ignores (lbsgd.config.checks.USED_ONLY_WHEN) ----------------------
    ("cli", ["optimizer=lamb", "lars_eta=5"], ["lars_eta=5", "unless optimizer=lars"]),
    ("cli", ["noise_scale_batch=64"], ["noise_scale_batch=64", "unless noise_scale=true"]),
    ("yaml", "ignored.yaml", ["poly_power=3", "unless schedule=poly"]),
    ("cli", ["dataset=cifar10", "data_dir={root}/nowhere"], ["data_dir", "does not exist"]),
    (
        "cli",
        ["dataset=imagenet", "data_dir={root}/empty"],
        ["data_dir", "no class folders under train/"],
    ),
    (
        "cli",
        ["dataset=cifar10", "data_dir={root}/cifar_without_batches"],
        ["data_dir", "cifar-10-batches-py"],
    ),
    # -- a dataset's files missing or damaged: named, with the two ways to get the real ones -----
    (
        "cli",
        ["dataset=fashion_mnist", "data_dir={root}/nowhere"],
        ["data_dir=", "nowhere' does not exist", "apt-get install dataset-fashion-mnist"],
    ),
    (
        "cli",
        ["dataset=fashion_mnist", "data_dir={root}/fm_three"],
        ["data_dir=", "lacks t10k-labels-idx1-ubyte", "dataset-fashion-mnist", "data fetch"],
    ),
    (
        "cli",
        ["dataset=fashion_mnist", "data_dir={root}/fm_truncated"],
        ["fm_truncated/train-images-idx3-ubyte is truncated", "dataset-fashion-mnist"],
    ),
    (
        "cli",
        ["dataset=fashion_mnist", "data_dir={root}/fm_foreign"],
        ["train-images-idx3-ubyte.gz is not an IDX file", "dataset-fashion-mnist"],
    ),
    (
        "yaml",
        "fm_truncated.yaml",
        ["train-images-idx3-ubyte is truncated", "dataset-fashion-mnist"],
    ),
    (
        "sweep",
        {"runs": [{"dataset": "fashion_mnist", "data_dir": "{root}/fm_foreign"}]},
        ["fm_foreign/train-images-idx3-ubyte.gz is not an IDX file", "dataset-fashion-mnist"],
    ),
    (
        "sweep",
        {"runs": [{"dataset": "fashion_mnist", "data_dir": "{root}/fm_three"}]},
        ["lacks t10k-labels-idx1-ubyte", "dataset-fashion-mnist"],
    ),
    ("cli:WORLD_SIZE=3", [], ["batch_size=64", "world_size * micro_batch"]),
    (
        "cli:WORLD_SIZE=4,LOCAL_WORLD_SIZE=3",
        ["comm_hook=hierarchical", "batch_size=128"],
        ["comm_hook=hierarchical", "LOCAL_WORLD_SIZE=3"],
    ),
    ("cli", ["name=existing"], ["already holds a run", "resume=true"]),
    (
        "cli",
        ["name=existing", "resume=true", "batch_size=128"],
        ["experiment keys differ", "batch_size: 64 -> 128"],
    ),
    ("cli", ["name=notes"], ["notes", "exists and is not empty"]),
    ("cli", ["backend=nccl", "device=cpu"], ["backend=nccl", "device=cpu", "gloo"]),
    (
        "cli",
        ["name=broken", "resume=true", "epochs=0.25"],
        ["broken/checkpoint.pt", "no usable checkpoint"],
    ),
    ("cli", ["base_lr=nan"], ["base_lr=nan", "finite number"]),
    ("cli", ["epochs=inf"], ["epochs=inf", "finite number"]),
    ("cli", ["milestones=30,nan"], ["milestones=[30.0, nan]", "finite number"]),
    ("cli", ["loss_scale=1e39"], ["loss_scale=1e+39", "overflows float32"]),
    (
        "cli",
        ["base_lr=1e38", "batch_size=1024", "reference_batch=256", "bn_batch=16"],
        ["base_lr=1e+38", "linear(batch_size / reference_batch = 4)", "overflows float32"],
    ),
    ("cli", ["plugins={root}/raising.py"], ["raising.py", "RuntimeError: no GPU driver here"]),
    ("cli", ["plugins={root}/exiting.py"], ["exiting.py", "SystemExit: usage: python exiting"]),
    ("yaml", "nan.yaml", ["momentum=nan", "finite number"]),
    ("yaml", "unknown.yaml", ["warmpu", "did you mean 'warmup'"]),
    ("yaml", "list.yaml", ["list.yaml", "flat mapping"]),
    ("yaml", "syntax.yaml", ["syntax.yaml", "not valid YAML"]),
    ("yaml", "type.yaml", ["epochs", "valid number"]),
    ("yaml", "missing.yaml", ["missing.yaml", "cannot be read"]),
    ("notebook", {"profile": "gpu"}, ["profile='gpu'", "smoke"]),
    ("notebook", {"epochs": 0}, ["epochs=0", "> 0"]),
    ("notebook", {"parallel": 0}, ["parallel=0", ">= 1"]),
    ("notebook", {"nproc_per_node": 1.5}, ["nproc_per_node=1.5", "integer"]),
    ("notebook", {"nnodes": 2}, ["rdzv_endpoint", "host:port"]),
    ("notebook", {"nproc_per_node": 3}, ["world_size * micro_batch"]),
    ("notebook", {"wandb": "sometimes"}, ["wandb", "'auto', 'online', 'offline' or 'disabled'"]),
    ("notebook", {"seeds": [-2]}, ["seed", ">= 0"]),
    ("notebook", {"epochs": float("inf")}, ["epochs=inf", "finite number"]),
    ("notebook", {"ks": [0.3]}, ["k=0.3", "fractional batch"]),
    ("notebook", {"name": "existing", "k": 2}, ["experiment keys differ", "batch_size: 64 -> 32"]),
    # -- a path outside out_dir: every value that names a folder under it is one plain name --------
    ("cli", ["study=../escaped"], ["study='../escaped'", "plain folder name"]),
    ("cli", ["name={root}/elsewhere"], ["/elsewhere'", "plain folder name"]),
    ("cli", ["name=" + "n" * 300], ["name='nnnn", "at most 251 bytes"]),
    ("cli", ["name=run "], ["name='run '", "no leading or trailing space"]),
    ("cli", ["profile=.."], ["profile='..'", "plain folder name"]),
    ("cli", ["wandb_project=team/lbsgd"], ["wandb_project='team/lbsgd'", "W&B project name"]),
    ("yaml", "escape.yaml", ["study='../escaped'", "plain folder name"]),
    ("yaml", "nul_name.yaml", ["name='run\\x00'", "plain folder name"]),
    ("yaml", "nul_data.yaml", ["data_dir=", "NUL character"]),
    ("yaml", "project.yaml", ["wandb_project='team/lbsgd'", "W&B project name"]),
    ("notebook", {"out_dir": "{root}/results\0"}, ["out_dir=", "NUL character"]),
    ("notebook", {"profile": "../smoke"}, ["profile='../smoke'", "smoke"]),
    ("sweep", {"study": "../escaped", "runs": []}, ["study='../escaped'", "plain folder name"]),
    ("sweep", {"study": ""}, ["study=''", "plain folder name"]),
    ("sweep", {"runs": [{"name": "a/b"}]}, ["name='a/b'", "plain folder name"]),
    ("sweep", {"profile": "{root}/elsewhere"}, ["/elsewhere'", "plain folder name"]),
    ("sweep", {"runs": [{"wandb_project": "a:b"}]}, ["wandb_project='a:b'", "W&B project name"]),
    # -- a place that cannot hold the run: empty, a file on the way, a folder not writable ---------
    ("cli", ["out_dir="], ["out_dir=''", "is empty"]),
    ("cli", ["out_dir={root}/afile/results"], ["out_dir=", "afile' exists and is not a folder"]),
    ("cli", ["out_dir={root}", "study=afile"], ["study='afile'", "exists and is not a folder"]),
    ("cli", ["name=stray.txt"], ["name='stray.txt'", "exists and is not a folder"]),
    ("cli:readonly=results", ["study=new"], ["out_dir=", "results' cannot be written in"]),
    ("yaml", "empty_data.yaml", ["data_dir=''", "is empty", "or null"]),
    ("yaml", "file_name.yaml", ["name='stray.txt'", "exists and is not a folder"]),
    ("yaml:readonly=results/runs", "fresh.yaml", ["out_dir=", "runs' cannot be written in"]),
    ("notebook", {"out_dir": ""}, ["out_dir=''", "is empty"]),
    ("notebook", {"out_dir": "{root}/afile"}, ["out_dir=", "afile' exists and is not a folder"]),
    ("notebook:readonly=results/runs", {}, ["out_dir=", "runs' cannot be written in"]),
    ("sweep", {"out_dir": "{root}/afile", "runs": []}, ["afile' exists and is not a folder"]),
    ("sweep", {"out_dir": "{root}/results\0", "runs": []}, ["out_dir=", "NUL character"]),
    ("sweep", {"runs": [{"data_dir": " "}]}, ["data_dir=' '", "is empty"]),
    ("sweep:readonly=results", {"study": "new"}, ["out_dir=", "results' cannot be written in"]),
    # -- a missing device: one line naming device, before any process group or tensor ------------
    ("cli", ["device=cuda:1"], ["device='cuda:1'", "'auto', 'cpu' or 'cuda'"]),
    ("cli", ["device=mps"], ["device='mps'", "'auto', 'cpu' or 'cuda'"]),
    ("cli:gpus=0", ["device=cuda"], ["device=cuda", "no CUDA device", "valid here: auto, cpu"]),
    (
        "cli:gpus=1,WORLD_SIZE=2,LOCAL_WORLD_SIZE=2",
        ["device=cuda"],
        ["device=cuda", "2 processes per node but 1 visible GPU", "device=cpu"],
    ),
    ("yaml", "mps.yaml", ["device='mps'", "'auto', 'cpu' or 'cuda'"]),
    ("yaml:gpus=0", "cuda.yaml", ["device=cuda", "no CUDA device"]),
    (
        "notebook:gpus=1",
        {"nproc_per_node": 2, "ks": [4], "device": "auto"},
        ["device=auto", "2 processes per node but 1 visible GPU", "--nproc-per-node <= 1"],
    ),
    ("sweep:gpus=0", {"runs": [{"device": "cuda"}]}, ["device=cuda", "no CUDA device"]),
    (
        "sweep:gpus=2",
        {"runs": [{"device": "cuda"}], "nproc_per_node": 4},
        ["device=cuda", "4 processes per node but 2 visible GPU"],
    ),
    # -- an integer beyond what it feeds, text that is not what its key holds ---------------------
    ("cli", ["seed=99999999999999999999"], ["seed=99999999999999999999", "too large", "seed <="]),
    ("yaml", "big_seed.yaml", [f"seed={2**64}", "too large"]),
    ("notebook", {"seeds": [2**63]}, [f"seed={2**63}", "too large"]),
    ("sweep", {"runs": [{"seed": 2**64}]}, [f"seed={2**64}", "too large"]),
    ("cli", ["milestones=[30,60"], ["milestones=[30,60", "not a list like [30, 60, 80]"]),
    ("yaml", "latin1.yaml", ["latin1.yaml", "not UTF-8 text"]),
    ("sweep", {"runs": {"batch_size": 64}}, ["runs: a dict, not a list of runs"]),
    ("sweep", {"out_dir": 5, "runs": []}, ["out_dir=5 must be a folder path", "got int"]),
    ("notebook", {"out_dir": None}, ["out_dir=None must be a folder path", "got NoneType"]),
    ("sweep", {"runs": ["batch_size=64"]}, ["runs[0]: a str, not a dict of keys"]),
    # -- the earlier classes through the sweep door too ------------------------------------------
    ("sweep", {"runs": [{"momentum": float("nan")}]}, ["momentum=nan", "finite number"]),
    ("sweep", {"runs": [{"plugins": ["{root}/raising.py"]}]}, ["raising.py", "RuntimeError"]),
    ("sweep", {"runs": [{"plugins": ["{root}/exiting.py"]}]}, ["exiting.py", "SystemExit"]),
    ("yaml", "plugin.yaml", ["raising.py", "RuntimeError: no GPU driver here"]),
    # -- a run no machine can hold: refused, not built for hours or ended by a traceback ----------
    ("cli", ["threads=100000"], ["threads=100000", "too large", "1 … 1024"]),
    ("cli", ["depth=60000002"], ["depth=60000002, width=8", "GiB of memory", "smaller model"]),
    ("cli", ["width=100000000"], ["width=100000000", "GiB of memory", "parameters"]),
    ("yaml", "huge_data.yaml", ["synthetic_train=100000000000", "GiB of memory", "in-memory data"]),
    ("yaml", "threads.yaml", ["threads=5000", "1 … 1024"]),
    ("sweep", {"runs": [{"dataset": "fake", "fake_train": 10**9}]}, ["fake_train=1000000000"]),
    ("sweep", {"runs": [{"depth": 60000002}]}, ["depth=60000002", "GiB of memory"]),
    # -- a value refused by its key's own check before anything is derived from it ---------------
    ("cli", ["batch_size=-256"], ["batch_size=-256 must be a positive integer"]),
    ("cli", ["batch_size=-256", "lr_scaling=sqrt"], ["batch_size=-256 must be a positive"]),
    ("cli", ["batch_size=" + "9" * 400], ["batch_size=999", "64-bit integer"]),
    ("cli", ["epochs=1e300"], ["epochs=1e+300 is too large", "epochs <= 2^63"]),
    ("yaml", "isa_list.yaml", ["cpu_isa=['avx2']", "'native', 'portable', 'avx2'"]),
    ("yaml", "plugins_int.yaml", ["plugins=5", "valid tuple"]),
    ("yaml", "plugins_nested.yaml", ["plugins=[['a.py']]", "valid string"]),
    ("notebook", {"ks": [-16]}, ["k=-16 must be a positive number"]),
    ("notebook", {"ks": [float("nan")]}, ["k=nan must be a positive number"]),
    ("sweep", {"runs": [{"reference_batch": -256}]}, ["reference_batch=-256 must be a positive"]),
    ("sweep", {"runs": [{"synthetic_train": 10**400}]}, ["synthetic_train=1000", "64-bit"]),
    ("cli", ["fashion_size=3"], ["fashion_size=3 must be an integer from 4 to 28"]),
    ("sweep", {"runs": [{"fashion_train": 15}]}, ["fashion_train=15 must be a multiple of 10"]),
    ("cli", ["holdout=-1"], ["holdout=-1 must be >= 0"]),
    # -- a held-out split that leaves nothing to train on (lbsgd.data.hold_out) -------------------
    (
        "cli",
        ["holdout=512"],
        ["holdout=512 must be less than the train split's size, synthetic_train=512", "0 to 511"],
    ),
    (
        "sweep",
        {"runs": [{"dataset": "fake", "fake_train": 100, "holdout": 100}]},
        ["holdout=100 must be less than the train split's size, fake_train=100", "0 to 99"],
    ),
]


def _filled(value, root: Path):
    """``value`` with ``{root}`` in its strings replaced by the fixture's directory."""
    if isinstance(value, str):
        return value.replace("{root}", str(root))
    if isinstance(value, list):
        return [_filled(v, root) for v in value]
    if isinstance(value, dict):
        return {k: _filled(v, root) for k, v in value.items()}
    return value


def _notebook(root: Path, params: dict) -> None:
    """What a study notebook's first cells do with its parameters."""
    params = dict(params)
    p = scales.get(params.pop("profile", "smoke"), epochs=params.pop("epochs", None))
    seeds, ks = params.pop("seeds", [0]), params.pop("ks", [1])
    name, k = params.pop("name", None), params.pop("k", None)
    device = params.pop("device", "cpu")  # auto: the profile's own (no notebook parameter)
    runs = [p.keys(k=kk, seed=s, device=device) for kk in ks for s in seeds]
    if name:  # a run of the study that lands on an existing run directory of another experiment
        runs = [{**TINY, "batch_size": 32 * k // 2, "name": name}]
    launch = {"out_dir": str(root / "results"), "wandb": "disabled", **params}
    experiments.sweep("runs", runs, quiet=True, **launch)


def _sweep(root: Path, given: dict) -> None:
    """``experiments.sweep`` called from a script: a study name, its runs (TINY with the given
    keys, or as given when they are not a list of dicts) and launch options."""
    given = dict(given)
    study, runs = given.pop("study", "runs"), given.pop("runs", [{}])
    if isinstance(runs, list) and all(isinstance(run, dict) for run in runs):
        # the tiny run's keys less those the given setting ignores; the given keys as they are
        runs = [{**used_keys({**TINY, **run}), **run} for run in runs]
    out_dir = given.pop("out_dir", str(root / "results"))
    experiments.sweep(study, runs, out_dir=out_dir, quiet=True, **given)


def _open_door(monkeypatch, door: str, root: Path) -> str:
    """The door's name, after setting its environment: torchrun's variables, gpus=N, the CUDA
    devices torch sees (the device checks ask torch.cuda, whatever the machine has), and
    readonly=F, the folder root/F that os.access says cannot be written in."""
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    name, _, settings = door.partition(":")
    for pair in filter(None, settings.split(",")):
        key, value = pair.split("=")
        if key == "gpus":
            monkeypatch.setattr(torch.cuda, "is_available", lambda n=int(value): n > 0)
            monkeypatch.setattr(torch.cuda, "device_count", lambda n=int(value): n)
        elif key == "readonly":
            monkeypatch.setattr(os, "access", _denying_writes(root / value, os.access))
        else:
            monkeypatch.setenv(key, value)
    return name


def _denying_writes(locked: Path, access):
    """os.access, except that ``locked`` cannot be written in."""
    return lambda path, mode, **kw: (
        not (Path(path) == locked and mode & os.W_OK) and access(path, mode, **kw)
    )


def _exit_2(capsys, argv: list[str]) -> str:
    """``lbsgd <argv>`` in this process: exit code 2 and one line on stderr, returned."""
    code = cli.main(argv)
    message = capsys.readouterr().err.strip()
    assert code == 2, message
    assert message.startswith("lbsgd: error: ") and "\n" not in message, message
    return message


def _refusal(results: Path, capsys, door: str, given) -> str:
    """Put ``given`` through ``door``; assert it is refused (exit 2, or a ConfigError) with one
    line, and return that line."""
    out = f"out_dir={results}/results"
    if door == "cli":
        # the tiny run's keys that the given setting ignores (its synthetic sizes under another
        # dataset) would be refused first
        keys = used_keys({**TINY, **dict(a.split("=", 1) for a in given if "=" in a)})
        tiny = [a for a in TINY_ARGS if a.split("=", 1)[0] in keys]
        return _exit_2(capsys, ["train", *tiny, out, *given])
    if door == "yaml":
        return _exit_2(capsys, ["train", "-c", str(results / given), out])
    with pytest.raises(ConfigError) as err:
        (_notebook if door == "notebook" else _sweep)(results, given)
    message = str(err.value)
    assert "\n" not in message, message
    return message


@pytest.mark.parametrize(
    ("door", "given", "words"), CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)]
)
def test_bad_input_is_one_line_before_any_work_and_touches_nothing(
    results, monkeypatch, capsys, door, given, words
):
    before = _snapshot(results)
    door = _open_door(monkeypatch, door, results)
    message = _refusal(results, capsys, door, _filled(given, results))
    for w in words:
        assert w in message, message
    assert _snapshot(results) == before  # no file or folder written, changed or removed


# The classes of bad input the table holds, each known by words its rows expect, and the doors
# each goes through (a notebook's parameters name no plugin).
CLASSES = {
    "a non-finite or overflowing float": (("finite number", "overflows float32"), "all"),
    "a path outside out_dir": (("plain folder name", "NUL character", "W&B project name"), "all"),
    "a place that cannot hold the run": (
        ("is empty", "is not a folder", "cannot be written in"),
        "all",
    ),
    "a missing device": (("device=", "device'"), "all"),
    "an integer beyond what it feeds": (("too large",), "all"),
    "a plugin raising on import": (("raising.py",), ("cli", "yaml", "sweep")),
    # (no notebook parameter names a dataset)
    "a dataset's files missing or damaged": (("dataset-fashion-mnist",), ("cli", "yaml", "sweep")),
    # (no notebook parameter sizes a model or a dataset)
    "a run no machine can hold": (("GiB of memory", "1 … 1024"), ("cli", "yaml", "sweep")),
}
DOORS = ("cli", "yaml", "notebook", "sweep")


@pytest.mark.parametrize("bad", CLASSES)
def test_the_table_puts_each_class_of_bad_input_through_every_door(bad):
    markers, doors = CLASSES[bad]
    rows = [c for c in CASES if any(m in w for w in c[2] for m in markers)]
    assert {c[0].partition(":")[0] for c in rows} == set(DOORS if doors == "all" else doors)


@pytest.mark.parametrize("out_dir", ["", " ", "results\0"])
def test_a_study_notebook_refuses_an_out_dir_that_is_no_folder_path(out_dir):
    """studies.start, a notebook's first call, takes a relative out_dir from the repository root:
    '' would put the study's folders in the repository itself."""
    with pytest.raises(ConfigError) as err:
        studies.start("warmup", title="Warmup", profile="smoke", out_dir=out_dir)
    message = str(err.value)
    assert message.startswith(f"out_dir={out_dir!r}") and "\n" not in message, message


def test_the_table_covers_every_door_and_at_least_twenty_inputs():
    assert {c[0].partition(":")[0] for c in CASES} == set(DOORS) and len(CASES) >= 20


# -- process layouts this machine cannot run --------------------------------------------------
# CUDA_VISIBLE_DEVICES="" hides every GPU from the processes started here: a CPU-only machine,
# whatever machine runs the tests.
NO_GPU = {"CUDA_VISIBLE_DEVICES": ""}


@pytest.mark.slow
def test_device_cuda_without_cuda_exits_2_with_one_line_naming_device(results):
    before = _snapshot(results)
    r = lbsgd(
        ["train", *TINY_ARGS, f"out_dir={results}/results", "device=cuda", "name=cuda"], env=NO_GPU
    )
    message = r.stderr.strip()
    assert r.returncode == 2, r.stderr[-2000:]
    assert message.startswith("lbsgd: error: device=cuda") and "\n" not in message, message
    assert "no CUDA device" in message and "valid here: auto, cpu" in message
    assert _snapshot(results) == before
    assert not (results / "results" / "runs" / "cuda").exists()


@pytest.mark.slow
def test_nccl_under_torchrun_without_gpus_stops_every_worker_before_any_work(results):
    """device=auto resolves to the CPU here, where NCCL cannot run: each worker refuses in one line
    and exits 2 before joining a process group. torchrun stops the other workers once one has
    failed; a monitor interval longer than a worker's start lets every worker reach its own exit."""
    before = _snapshot(results)
    args = [*TINY_ARGS, f"out_dir={results}/results", "device=auto", "backend=nccl", "name=nccl"]
    r = lbsgd(["train", *args], nproc=2, env={**NO_GPU, "PET_MONITOR_INTERVAL": "20"})
    assert r.returncode != 0
    refusal = "lbsgd: error: backend=nccl needs CUDA devices and torch sees none (valid here: "
    worker_lines = [line for line in r.stderr.splitlines() if line.startswith("lbsgd: error:")]
    assert len(worker_lines) == 2, r.stderr[-3000:]  # one line from each worker, nothing else
    assert all(line.startswith(refusal) for line in worker_lines), worker_lines
    # torchrun's report: both local ranks failed with the command line's bad-input code
    assert sorted(re.findall(r"local_rank: (\d)\)\s+exitcode\s*: 2\b", r.stderr)) == ["0", "1"], (
        r.stderr[-3000:]
    )
    assert "lbsgd: run" not in r.stdout  # no run was announced, no step taken
    assert _snapshot(results) == before
    assert not (results / "results" / "runs" / "nccl").exists()


def test_check_layout_refuses_nccl_beyond_one_process_per_gpu_and_lets_gloo_share(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(ConfigError) as err:
        distributed.check_layout("auto", "nccl", 2)
    message = str(err.value)
    assert "2 processes per node but 1 visible GPU(s)" in message and "\n" not in message
    assert "backend=gloo" in message  # what would be valid
    with pytest.raises(ConfigError, match="1 visible GPU"):
        distributed.check_layout("cuda", "auto", 2)  # auto means NCCL on CUDA
    # gloo: the two processes share the one GPU (process i on GPU i % 1)
    distributed.check_layout("auto", "gloo", 2)
    assert distributed.resolve("auto", "gloo") == ("cuda", "gloo")
    distributed.check_layout("auto", "nccl", 1)  # one process per GPU is NCCL's layout

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    with pytest.raises(ConfigError, match=r"^device=cuda but torch sees no CUDA device"):
        distributed.check_layout("cuda", "auto", 1)
    with pytest.raises(ConfigError, match=r"^backend=nccl needs CUDA devices"):
        distributed.check_layout("auto", "nccl", 1)
    assert distributed.resolve("auto", "auto") == ("cpu", "gloo")


def test_check_memory_refuses_a_run_beyond_the_machines_memory_to_the_byte(monkeypatch):
    """The need is 12 bytes per parameter (fp32 weights, gradients, momentum) plus the generated
    data's float32 bytes, once per process of the node, against the physical memory."""
    cfg = Config(**TINY)  # ResNet-8 of width 8 on 512 + 256 synthetic 16x16 images
    params = (
        19_954  # tests/test_models.py's formula of He et al.'s CIFAR ResNet at depth 8, width 8
    )
    need = 2 * (12 * params + (512 + 256) * 3 * 16 * 16 * 4)  # two processes
    pages = {"SC_PAGE_SIZE": 1, "SC_PHYS_PAGES": need}
    monkeypatch.setattr(os, "sysconf", lambda name: pages[name])
    entry.check_memory(cfg, 2)  # exactly enough
    pages["SC_PHYS_PAGES"] = need - 1
    with pytest.raises(ConfigError) as err:
        entry.check_memory(cfg, 2)
    message = str(err.value)
    assert message.startswith("synthetic_train=512, synthetic_test=256: the run needs at least")
    assert f"{params:,} parameters" in message and "on each of 2 process(es)" in message


@pytest.mark.parametrize("name", ["../table.csv", "sub/fig.png", "", ".."])
def test_a_studys_table_or_figure_is_a_file_of_its_folder_only(tmp_path, name):
    """Session.save_table/save_figure (a notebook's cells, which users edit) name one file of the
    study's folder: a path elsewhere is one line naming the key, and nothing is written."""
    import pandas as pd

    table = pd.DataFrame({"batch_size": [256], "top1_error_pct": [23.6]})
    with pytest.raises(ConfigError) as err:
        experiments.save_table(table, tmp_path, "warmup", name)
    with pytest.raises(ConfigError):
        experiments.save_figure(None, tmp_path, "warmup", name)
    assert str(err.value).startswith(f"name={name!r}") and "\n" not in str(err.value)
    assert list(tmp_path.rglob("*")) == []
    assert experiments.save_table(table, tmp_path, "warmup") == tmp_path / "warmup" / "table.csv"


# -- every key's own bad values, before anything is derived from them ---------------------------
# The probes come from the config's own schema (every key, its type), not from a list of keys: a
# key added later is probed too. Each probe goes in on top of configurations that switch on every
# derivation (the lr rules, the noise scale's small batch, local SGD's blocks, micro_batch=auto,
# the parameter server), through the order lbsgd itself follows: each key alone
# (config.check_values: the command line's and YAML's first step, before a plugin is imported or
# the CPU cap pinned), the Config and its rules across keys, then the registries, the data, the
# layout and the derived values (entry.check, config.derive).
HINTS = typing.get_type_hints(Config)
BASES = {
    "defaults": {},
    "tiny": TINY,
    "sqrt rule": {**TINY, "lr_scaling": "sqrt", "warmup_lr": 0.01},
    "noise scale": {**TINY, "noise_scale": True, "noise_scale_batch": 32},
    "bmuf": {**TINY, "local_sgd": 2, "block_momentum": 0.5},
    "micro_batch=auto": {**TINY, "micro_batch": "auto", "schedule": "step", "milestones": [1]},
    "parameter server": {**TINY, "async_ps": True},
}


def _members(key: str) -> tuple:
    """The types a key's value may have: int, float, bool, str, Literal[...], tuple[...], None."""
    tp = HINTS[key]
    union = typing.get_origin(tp) in (typing.Union, types.UnionType)
    return typing.get_args(tp) if union else (tp,)


def refused_values(key: str) -> list:
    """Values no config can hold for ``key``, whatever the other keys: a mapping (no key holds
    one), text that is none of its choices, a negative number (every numeric key counts, sizes
    or rates something), a fraction or an integer beyond 64 bits where it is an integer, a
    non-finite float."""
    members = _members(key)
    numeric = {int, float} & set(members)
    values: list = [{"a": 1}]
    if numeric or bool in members or any(typing.get_origin(m) is typing.Literal for m in members):
        values += ["bogus"]
    if bool in members:
        values += [2]
    if numeric:
        values += [-1, -256, "-256", -(10**400)]
    if int in members:
        values += [1.5, 2**64, 10**400]
    if float in members:
        values += [math.nan, math.inf, -math.inf]
    for m in members:
        if typing.get_origin(m) is tuple:  # a list of its element type
            values += [[-1.0], [math.nan]] if float in typing.get_args(m) else [[5], [["a"]]]
    return values


def edge_values(key: str) -> list:
    """Values valid for some configs and not others: each is accepted, or refused in one line
    that names the key, never a traceback of a derivation."""
    members = _members(key)
    values: list = [0] if {int, float} & set(members) else []
    if int in members:
        values += [1, 2**62, 2**63 - 1]
    if float in members:
        values += [1e-300, 1e300, 0.5]
    if str in members:
        values += ["", "x", "a/b", "-x"]
    return values


def _one_line_naming(err: ConfigError, key: str) -> str:
    message = str(err)
    assert "\n" not in message, message
    assert re.search(rf"(?<!\w){key}(?!\w)", message), message
    return message


def _through_the_derivations(cfg: Config) -> None:
    """What a launch does with a valid Config before any work: registries, data, layout,
    memory, then the derived values; a refusal is a ConfigError of one line."""
    world = 2 if cfg.async_ps else 1
    try:
        entry.check(cfg, world, world)
        config.derive(cfg, world, 512)
    except ConfigError as e:
        assert "\n" not in str(e), str(e)


def test_the_bases_of_the_probes_are_valid_and_every_key_is_probed():
    for keys in BASES.values():
        cfg = config.from_dict(keys)
        entry.check(cfg, 2 if cfg.async_ps else 1, 2 if cfg.async_ps else 1)
    assert all(refused_values(k) for k in KEYS)  # a key of a type the probes miss fails here


@pytest.mark.parametrize("key", KEYS)
def test_every_bad_value_of_every_key_is_named_by_its_key_before_anything_derives_from_it(key):
    for value in refused_values(key):
        with pytest.raises(ConfigError) as err:  # alone: before plugins, the CPU cap, the Config
            config.check_values({key: value})
        assert str(err.value).startswith(f"{key}="), (value, str(err.value))
        for base, keys in BASES.items():
            with pytest.raises(ConfigError) as err:
                config.from_dict({**keys, key: value})
            message = str(err.value)
            assert message.startswith(f"{key}=") and "\n" not in message, (base, value, message)


@pytest.mark.parametrize("key", KEYS)
def test_every_edge_value_of_every_key_is_accepted_or_refused_naming_it(key):
    for value in edge_values(key):
        for keys in BASES.values():
            try:
                cfg = config.from_dict({**keys, key: value})
            except ConfigError as e:
                _one_line_naming(e, key)
                continue
            _through_the_derivations(cfg)


@pytest.mark.parametrize(
    ("args", "files", "line"),
    [
        (["batch_size=-256"], {}, "batch_size=-256 must be a positive integer"),
        (["batch_size=-256", "lr_scaling=sqrt"], {}, "batch_size=-256 must be a positive integer"),
        # read by the CPU cap before torch loads, and by the plugin import, before the Config
        (["-c", "isa.yaml"], {"isa.yaml": "cpu_isa: [avx2]\n"}, "cpu_isa=['avx2']: Input should"),
        (["-c", "p.yaml"], {"p.yaml": "plugins: [[a.py]]\n"}, "plugins=[['a.py']]: Input should"),
    ],
    ids=["negative", "negative under sqrt", "cpu_isa list", "plugins nested list"],
)
def test_the_command_line_names_a_bad_value_by_its_key_in_one_line_and_writes_nothing(
    tmp_path, args, files, line
):
    """``lbsgd train`` as a user starts it (a process that has not loaded torch: the CPU cap is
    pinned from the raw keys), in a folder where it would write results/cli/."""
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    r = lbsgd(["train", *args], cwd=tmp_path)
    assert r.returncode == 2, r.stderr[-2000:]
    assert r.stderr.startswith(f"lbsgd: error: {line}") and r.stderr.count("\n") == 1, r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(files)  # nothing written


def test_an_out_dir_in_a_folder_that_refuses_new_folders_is_one_line_before_any_work(capsys):
    # /proc refuses mkdir even to root, whom os.access lets write anywhere: the check asks the
    # file system itself
    message = _exit_2(capsys, ["train", *TINY_ARGS, "out_dir=/proc/lbsgd-nowhere"])
    assert message.startswith("lbsgd: error: out_dir='/proc/lbsgd-nowhere': '/proc' cannot be")
    assert not os.path.lexists("/proc/lbsgd-nowhere")
