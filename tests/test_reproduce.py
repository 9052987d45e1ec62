"""The main job (``make reproduce``): its real command lines, read from ``make -n`` and printed by
``lbsgd reproduce --dry-run``, against every notebook of every profile, under both launchers.
(The job itself over the committed cpu results runs in .ci/run after the suite.)"""

import shlex
import subprocess
from pathlib import Path

import papermill
import pytest

from lbsgd import cli
from lbsgd.lab import execute, reproduce
from lbsgd.lab.studies import scales

REPO = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted(str(p.relative_to(REPO)) for p in (REPO / "notebooks").glob("[0-9]*_*.ipynb"))
# what each launch parameter must reach: every notebook that declares it (notebook 10 measures
# communication and launches no training run; 12 and 13 set their own process counts)
MAKE_VARS = {
    "local": [],
    "slurm": [
        "LAUNCHER=slurm",
        "CLUSTER=example partition=debug",
        "NNODES=2",
        "RDZV_ENDPOINT=h:29500",
    ],
}


def recipe(profile: str, make_vars: list[str]) -> list[str]:
    """The ``lbsgd reproduce`` line that ``make reproduce PROFILE=profile <make_vars>`` runs."""
    dry = subprocess.run(
        ["make", "-n", "reproduce", f"PROFILE={profile}", "NPROC=2", *make_vars],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    (line,) = [ln for ln in dry.splitlines() if " reproduce " in ln]
    argv = shlex.split(line)
    assert argv[0].endswith("lbsgd") and argv[1] == "reproduce", line
    return argv[1:]


@pytest.mark.parametrize("launcher", MAKE_VARS)
@pytest.mark.parametrize("profile", scales.PROFILES)
def test_every_command_line_of_the_main_job_is_one_its_notebook_accepts(
    profile, launcher, capsys, monkeypatch
):
    monkeypatch.chdir(REPO)
    assert cli.main([*recipe(profile, MAKE_VARS[launcher]), "--dry-run"]) == 0
    lines = capsys.readouterr().out.splitlines()
    executes = [shlex.split(ln) for ln in lines if ln.startswith("lbsgd execute")]
    ran = [argv[3] for argv in executes]
    assert ran == scales.notebooks(profile, NOTEBOOKS)  # every study the profile replays
    assert lines[-1] == f"lbsgd report --results results/{profile}"
    for argv in executes:
        nb, out = argv[3], argv[4]
        params = {argv[i + 1]: execute.parameter(argv[i + 2]) for i in range(5, len(argv), 3)}
        assert execute.undeclared(nb, params) is None, shlex.join(argv)
        declared = papermill.inspect_notebook(nb)
        assert params["profile"] == profile and params["out_dir"] == "results"
        assert out == f"results/{profile}/{Path(nb).stem.split('_', 1)[1]}/{Path(nb).name}"
        # the launch reaches every notebook that takes it: none trains here by mistake
        wanted = {"nproc_per_node": 2, "parallel": 2}
        if launcher == "slurm":
            wanted |= {"launcher": "slurm", "cluster": "example partition=debug", "nnodes": 2}
        for key, value in wanted.items():
            assert params.get(key) == (value if key in declared else None), (nb, key)


def test_a_notebook_that_trains_takes_the_launcher():
    """Were a training study to lose its ``launcher`` parameter, LAUNCHER=slurm would train it on
    the login node: every notebook but the one that trains nothing takes the launch keys."""
    for nb in NOTEBOOKS:
        declared = set(papermill.inspect_notebook(nb))
        if "10_scaling" in nb:  # measures all-reduce and step times: no sweep of runs
            assert "launcher" not in declared
            continue
        assert {"launcher", "cluster", "parallel", "out_dir", "profile"} <= declared, nb


def test_bad_input_to_the_main_job_is_one_line_before_anything_is_written(
    tmp_path, capsys, monkeypatch
):
    monkeypatch.chdir(REPO)
    out = tmp_path / "out"
    cases = {
        ("cpu", "notebooks/missing.ipynb"): "NOTEBOOKS='notebooks/missing.ipynb': no such",
        ("cpuu", NOTEBOOKS[0]): "profile='cpuu' is not one of smoke, cpu",
        ("cpu", NOTEBOOKS[0], "-p", "nproc", "2"): "-p nproc: not a launch parameter",
        ("cpu", NOTEBOOKS[0], "-p", "launcher", "pbs"): "launcher='pbs' must be one of",
        (
            "cpu",
            NOTEBOOKS[0],
            "-p",
            "launcher",
            "slurm",
        ): "cluster=None: launcher=slurm needs a cluster file",
    }
    for args, start in cases.items():
        code = cli.main(["reproduce", *args, "--out", str(out)])
        err = capsys.readouterr().err
        assert code == cli.EXIT_BAD_INPUT, args
        assert err.startswith(f"lbsgd: error: {start}") and len(err.splitlines()) == 1, err
        assert not out.exists(), args
    for bad, start in (("", "OUT='' is empty"), ("a\0b", "OUT='a\\x00b' holds a NUL")):
        code = cli.main(["reproduce", "cpu", NOTEBOOKS[0], "--out", bad])
        err = capsys.readouterr().err
        assert code == cli.EXIT_BAD_INPUT, bad
        assert err.startswith(f"lbsgd: error: {start}") and len(err.splitlines()) == 1, err


def test_the_steps_are_the_function_the_command_runs():
    """``--dry-run`` and the run itself walk :func:`lbsgd.lab.reproduce.steps`: the same lines."""
    steps = reproduce.steps("fashion", NOTEBOOKS, "results", {"nproc_per_node": 1, "parallel": 2})
    assert [s.notebook for s in steps] == scales.notebooks("fashion", NOTEBOOKS)
    (plan,) = [s for s in steps if "16_plan" in s.notebook]
    assert "nproc_per_node" not in plan.parameters  # its own nproc: the process counts it plans
