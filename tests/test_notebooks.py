"""The study notebooks end to end at smoke scale, and the sweep API they are built on.

The notebooks run through papermill exactly as ``make reproduce`` runs them (other profile), all
into one module-scoped results root, in file order, so that a run already trained by an earlier
study is copied rather than trained again.
"""

import ast
import io
import json
import re
import shutil
import tokenize
from pathlib import Path

import nbformat
import pandas as pd
import papermill
import pytest
from click.testing import CliRunner
from conftest import lbsgd, used_keys
from papermill.cli import papermill as papermill_cli

from lbsgd import config
from lbsgd.config import ConfigError
from lbsgd.lab import experiments as ex
from lbsgd.lab import report, verify
from lbsgd.lab.studies import scales

REPO = Path(__file__).resolve().parents[1]
ALL_NOTEBOOKS = sorted((REPO / "notebooks").glob("*.ipynb"))
NOTEBOOKS = sorted((REPO / "notebooks").glob("[0-9]*_*.ipynb"))
# studies whose table has no paper_* column (critical_batch: McCandlish et al. publish B_crit of
# other tasks, not of this model and data; its table holds our measurements and fit)
# plan: no paper publishes prediction errors of a planner (Pollux, AdaScale: job-time gains)
NO_PUBLISHED_NUMBERS = {"quickstart", "critical_batch", "plan"}
MEASURED = {"scaling"}  # notebooks that train nothing: they measure communication and model it
SMOKE = {"profile": "smoke", "parallel": 2, "wandb": "disabled"}
# The three longest sweeps on the smallest grid that keeps every arm of their tables and findings
# (make reproduce runs the notebooks' defaults): the step breakdown on 1 and 2 processes, local SGD
# and BMUF at one period, simulated staleness at tau = 0 and 2; the optimizers at one k with a
# one-point grid, runs of one epoch
NARROWED = {
    "10_scaling": {"nproc": [1, 2]},
    "12_local_sgd": {"periods": [4]},
    "13_staleness": {"taus": [0, 2]},
    "14_optimizers": {"ks": [16], "lr_factors": [1], "warmups": [0.25], "epochs": 1},
    "15_steps_to_target": {"ks": [1, 4], "epochs": 2},
    "16_plan": {"ks": [4], "seeds": [0], "timing_epochs": 0.25, "nproc": [1]},
}
# what ex.sweep prints per run: "[i/n] NAME: …" (skipped, copied, started or resumed, then the end)
SWEEP_LINE = re.compile(r"^\[\d+/\d+\] ([^\s:]+)", re.MULTILINE)


def study_of(nb: Path) -> str:
    return nb.stem.split("_", 1)[1]


def parameters_cell(nb: Path):
    cells = [
        c
        for c in nbformat.read(nb, as_version=4).cells
        if "parameters" in c.metadata.get("tags", [])
    ]
    assert len(cells) == 1, f"{nb.name}: {len(cells)} cells tagged 'parameters' (want 1)"
    return cells[0]


def stdout_of(executed: Path) -> str:
    nb = nbformat.read(executed, as_version=4)
    return "".join(
        o.get("text", "")
        for c in nb.cells
        if c.cell_type == "code"
        for o in c.get("outputs", [])
        if o.get("output_type") == "stream" and o.get("name") == "stdout"
    )


# -- the committed notebooks -----------------------------------------------------------------


@pytest.mark.parametrize("nb", ALL_NOTEBOOKS, ids=lambda p: p.name)
def test_committed_notebooks_carry_no_outputs_and_no_execution_counts(nb):
    cells = nbformat.read(nb, as_version=4).cells
    dirty = [
        i
        for i, c in enumerate(cells)
        if c.cell_type == "code" and (c.outputs or c.execution_count is not None)
    ]
    assert not dirty, f"{nb.name}: code cells {dirty} carry outputs or an execution count"


EXECUTED = sorted((REPO / "results").glob("*/*/[0-9][0-9]_*.ipynb"))


def _code(path: Path) -> list[str]:
    """A notebook's code cells, its parameters aside (the template's tagged cell, the cell
    papermill injects)."""
    cells = nbformat.read(path, as_version=4).cells
    skip = {"parameters", "injected-parameters"}
    return [
        c.source
        for c in cells
        if c.cell_type == "code" and not skip & set(c.metadata.get("tags", []))
    ]


@pytest.mark.parametrize("executed", EXECUTED, ids=lambda p: "/".join(p.parts[-3:-1]))
def test_every_committed_executed_notebook_runs_its_templates_code(executed):
    """A committed executed notebook is its template run: were the template changed after, make
    reproduce over the committed runs would rewrite it (git dirty) and the committed outputs would
    show code that no longer exists. Re-execute it over its runs (every run skipped)."""
    template = REPO / "notebooks" / executed.name
    assert _code(executed) == _code(template), (
        f"{executed.relative_to(REPO)} is stale: its code differs from {template.name}'s "
        f"(re-execute it: lbsgd execute {template.relative_to(REPO)} "
        f"{executed.relative_to(REPO)} -p profile {executed.parts[-3]} ...)"
    )


def test_the_stale_notebook_check_sees_a_changed_template(tmp_path):
    """The property above fails on a template whose code moved on."""
    (one,) = [p for p in EXECUTED if p.parts[-3] == "cpu" and p.name.startswith("02_")]
    nb = nbformat.read(REPO / "notebooks" / one.name, as_version=4)
    code = next(
        c
        for c in nb.cells
        if c.cell_type == "code" and "parameters" not in c.metadata.get("tags", [])
    )
    code.source += "\nprint('moved on')"
    nbformat.write(nb, tmp_path / one.name)
    assert _code(tmp_path / one.name) != _code(one)
    assert _code(REPO / "notebooks" / one.name) == _code(one)


# -- every notebook at smoke scale ------------------------------------------------------------


# A token in the environment of every smoke run, as a user's W&B key or any secret would be: no
# file the notebooks write (executed notebooks, logs, configs, summaries, metrics) may hold it.
SECRET = "lbsgd-test-secret-0f1e2d3c4b5a69788796a5b4c3d2e1f0"


@pytest.fixture(scope="module")
def smoke_out(tmp_path_factory):
    """One results root for all notebooks of the module (identical runs are copied, not retrained).

    A notebook's parameters hold no device (its runs take the profile's keys, device=auto), so the
    kernels and the runs they start are shown no GPU: the smoke profile is CPU semantics (gloo,
    one process per run) on any machine."""
    with pytest.MonkeyPatch.context() as mp:
        for var, value in (
            ("WANDB_API_KEY", SECRET),
            ("LBSGD_TEST_TOKEN", SECRET),
            ("CUDA_VISIBLE_DEVICES", ""),
        ):
            mp.setenv(var, value)
        yield tmp_path_factory.mktemp("smoke_results")


@pytest.fixture(scope="module")
def execute(smoke_out):
    """Executes a notebook at smoke scale once per module; returns the executed copy's path."""
    outcome: dict[Path, Path | BaseException] = {}

    def run(nb: Path) -> Path:
        if nb not in outcome:
            out_nb = smoke_out / "smoke" / study_of(nb) / nb.name  # beside its results
            out_nb.parent.mkdir(parents=True, exist_ok=True)
            try:
                papermill.execute_notebook(
                    str(nb),
                    str(out_nb),
                    parameters={**SMOKE, **NARROWED.get(nb.stem, {}), "out_dir": str(smoke_out)},
                    kernel_name="python3",
                    cwd=str(REPO),
                    progress_bar=False,
                )
                outcome[nb] = out_nb
            except BaseException as e:
                outcome[nb] = e
        if isinstance(outcome[nb], BaseException):
            raise outcome[nb]
        return outcome[nb]

    return run


@pytest.mark.slow
@pytest.mark.parametrize("nb", NOTEBOOKS, ids=lambda p: p.name)
def test_every_notebook_runs_at_smoke_scale_and_writes_what_it_promises(nb, execute, smoke_out):
    executed = execute(nb)
    study = study_of(nb)
    sdir = smoke_out / "smoke" / study  # <root>/<profile>/<study>/

    table = pd.read_csv(sdir / "table.csv")
    assert len(table) > 0, f"{study}/table.csv has no rows"
    if study not in NO_PUBLISHED_NUMBERS:
        assert any(c.startswith("paper_") for c in table.columns), (
            f"{study}/table.csv has no paper_* column beside ours: {list(table.columns)}"
        )
    assert list(sdir.glob("*.png")), f"no figure in {study}/"
    shown = [
        o
        for c in nbformat.read(executed, as_version=4).cells
        if c.cell_type == "code"
        for o in c.get("outputs", [])
        if "image/png" in o.get("data", {})
    ]
    assert shown, f"{nb.name}: no figure displayed in the executed notebook (inline backend)"

    findings = json.loads((sdir / "findings.json").read_text())
    assert findings["study"] == study and findings["profile"] == "smoke"
    assert isinstance(findings["findings"], list) and findings["findings"], findings
    for f in findings["findings"]:
        assert isinstance(f["claim"], str) and f["claim"], f
        assert any(f["replayed"] is v for v in (True, False, None)), f
        assert isinstance(f["evidence"], str) and f["evidence"], f
        assert isinstance(f["paper"], str) and f["paper"], f  # what the paper reports

    if study in MEASURED:  # its measurements instead of runs
        for f in ("allreduce_cpu.json", "steps_cpu.json"):
            assert (smoke_out / "benchmarks" / f).is_file(), f"benchmarks/{f} missing"
        assert not [p for p in sdir.iterdir() if p.is_dir()], f"{study}/ holds run folders"
        return
    # one complete run directory per run the notebook's sweeps printed, and nothing else
    run_dirs = {p.name: p for p in sdir.iterdir() if p.is_dir()}
    printed = set(SWEEP_LINE.findall(stdout_of(executed)))
    assert printed, f"{nb.name} printed no sweep lines"
    assert set(run_dirs) == printed, f"run folders {sorted(run_dirs)} vs runs {sorted(printed)}"
    for name, d in run_dirs.items():
        for f in ("config.yaml", "metrics.jsonl", "summary.json"):
            assert (d / f).is_file(), f"{study}/{name}/{f} missing"
        assert (d / "metrics.jsonl").stat().st_size > 0, f"{study}/{name}/metrics.jsonl is empty"
        status = json.loads((d / "summary.json").read_text())["status"]
        assert status in ("completed", "diverged"), f"{study}/{name}: status {status}"
    for log in sdir.glob("*.log"):  # every run started here has its folder
        assert log.stem in run_dirs, f"{log.name} has no run folder"


@pytest.mark.slow
def test_verify_recomputes_a_studys_findings_with_a_replay_standing_in(
    execute, smoke_out, tmp_path
):
    """lbsgd verify's consistency check: the study's notebook executed again over a copy of the
    profile folder, the replay in place of its run. With a replay equal to its run, every verdict
    is recomputed as committed but the one altered in the committed findings, which is named."""
    nb = next(n for n in NOTEBOOKS if study_of(n) == "warmup")
    execute(nb)
    root = smoke_out / "smoke"
    run = next(r for r in verify.find_runs(root) if r.study == "warmup")
    altered = tmp_path / "altered"
    shutil.copytree(root, altered / "smoke")
    findings = json.loads((altered / "smoke" / "warmup" / "findings.json").read_text())
    first = findings["findings"][0]
    first["replayed"] = {True: False, False: True, None: True}[first["replayed"]]
    first["outcome"] = {True: "replayed", False: "not replayed"}[first["replayed"]]
    (altered / "smoke" / "warmup" / "findings.json").write_text(json.dumps(findings))
    moved = next(r for r in verify.find_runs(altered / "smoke") if r.name == run.name)
    changed = verify.recompute_findings(altered / "smoke", moved, run.dir, tmp_path / "b")
    assert changed == [first["claim"]]  # the others recomputed as committed
    assert json.loads((altered / "smoke" / "warmup" / "findings.json").read_text()) == findings


@pytest.mark.slow
def test_no_result_file_holds_a_secret_of_the_environment(execute, smoke_out):
    for nb in NOTEBOOKS:
        execute(nb)
    files = [p for p in smoke_out.rglob("*") if p.is_file()]
    assert len(files) > 100  # the notebooks, their runs' configs, summaries, metrics and logs
    leaked = [str(p.relative_to(smoke_out)) for p in files if SECRET.encode() in p.read_bytes()]
    assert not leaked, leaked


@pytest.mark.slow
def test_report_gathers_every_study(execute, smoke_out, tmp_path):
    for nb in NOTEBOOKS:  # already executed by the test above when the module runs in order
        execute(nb)
    # the notebooks write into smoke_out/smoke/ (one folder per profile); so does its report
    assert report.write_all(smoke_out) == [smoke_out / "smoke" / "REPORT.md"]
    text = (smoke_out / "smoke" / "REPORT.md").read_text()
    for nb in NOTEBOOKS:
        findings = smoke_out / "smoke" / study_of(nb) / "findings.json"
        title = json.loads(findings.read_text())["title"]
        assert f"## {title}\n" in text, f"REPORT.md has no section for {title!r}"

    empty = tmp_path / "empty"
    empty.mkdir()
    cli = lbsgd(["report", "--results", str(empty)], cwd=REPO, timeout=120)
    assert cli.returncode == 2, (cli.returncode, cli.stdout, cli.stderr)
    lines = cli.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("lbsgd: error:") and str(empty) in lines[0], (
        cli.stderr
    )
    assert not list(empty.iterdir()), "a failed report wrote something"


# -- papermill --help-notebook -----------------------------------------------------------------

HELP_DEF = re.compile(r"^  (?P<name>\w+): (?P<type>.+?) \(default (?P<default>.*)\)$")


def parse_help_listing(text: str) -> dict[str, dict[str, str]]:
    """papermill's listing: ``f"{definition:<34}{help}"`` when the definition (``  name: type
    (default value)``) is at most 30 characters, else the definition, then the help on the next
    line indented by 34 spaces."""
    out: dict[str, dict[str, str]] = {}
    lines = text.split("\n")
    for i, line in enumerate(lines):
        short = line[:34].rstrip()
        m = HELP_DEF.match(short)
        if m and len(short) <= 30:
            out[m["name"]] = {"type": m["type"], "help": line[34:].strip()}
            continue
        m = HELP_DEF.match(line.rstrip())
        if m and len(line.rstrip()) > 30:
            nxt = lines[i + 1] if i + 1 < len(lines) else ""
            helptext = nxt.strip() if nxt.startswith(" " * 34) else ""
            out[m["name"]] = {"type": m["type"], "help": helptext}
    return out


def declared_parameters(nb: Path) -> dict[str, dict[str, str | None]]:
    """name → annotation and end-of-line comment of every assignment of the parameters cell."""
    src = parameters_cell(nb).source
    comments = {
        t.start[0]: t.string.lstrip("#").strip()
        for t in tokenize.generate_tokens(io.StringIO(src + "\n").readline)
        if t.type == tokenize.COMMENT
    }
    out: dict[str, dict[str, str | None]] = {}
    for node in ast.parse(src).body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names, ann = [node.target.id], ast.unparse(node.annotation)
        elif isinstance(node, ast.Assign):
            names = [t.id for t in node.targets if isinstance(t, ast.Name)]
            ann = None
        else:
            continue
        for name in names:
            out[name] = {"type": ann, "help": comments.get(node.end_lineno)}
    return out


@pytest.mark.parametrize("nb", NOTEBOOKS, ids=lambda p: p.name)
def test_help_notebook_documents_every_parameter_with_type_and_help(nb):
    declared = declared_parameters(nb)
    assert declared, f"{nb.name}: no parameter assigned in the parameters cell"
    for name, d in declared.items():
        assert d["type"] and d["help"], (
            f"{nb.name}: parameter {name} lacks a type annotation or a comment"
        )
    # papermill's command line, run in this process by click's test runner (a subprocess per
    # notebook would spend its time importing papermill)
    proc = CliRunner().invoke(papermill_cli, ["--help-notebook", str(nb)])
    assert proc.exit_code == 0, proc.output
    listed = parse_help_listing(proc.output)
    missing = sorted(set(declared) - set(listed))
    assert not missing, (
        f"{nb.name}: papermill --help-notebook does not list {missing} (papermill skips a parameter "
        f"line holding more than one '=', e.g. in its comment)\n{proc.output}"
    )
    for name, d in declared.items():
        assert listed[name] == d, f"{nb.name}: {name} listed as {listed[name]}, declared as {d}"


# -- the sweep API -----------------------------------------------------------------------------


def tiny_keys(k=1, **overrides):
    # less the keys their setting ignores (the synthetic sizes under cifar10), which a user's sweep
    # refuses
    keys = scales.get("smoke").keys(k=k, synthetic_train=500, epochs=1, device="cpu", **overrides)
    return used_keys(keys)


def _unreadable_cifar10(data_dir: Path) -> None:
    """The layout CIFAR-10 needs, but files no loader can read: validation passes, the run fails."""
    batches = data_dir / "cifar-10-batches-py"
    batches.mkdir(parents=True)
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch", "batches.meta"]:
        (batches / name).write_bytes(b"not a pickle")


@pytest.mark.slow
def test_a_failing_run_surfaces_as_an_error_naming_the_run_and_its_log(tmp_path):
    _unreadable_cifar10(tmp_path / "cifar10")
    keys = tiny_keys(dataset="cifar10", data_dir=str(tmp_path / "cifar10"))
    out = tmp_path / "out"
    cfg = config.from_dict({**keys, "study": "failing", "out_dir": str(out)})
    log = out / "failing" / f"{cfg.run_name()}.log"
    with pytest.raises(ex.RunFailed) as err:
        ex.sweep("failing", [keys], out_dir=out, parallel=1, wandb="disabled")
    assert cfg.run_name() in str(err.value) and str(log) in str(err.value), str(err.value)
    assert "UnpicklingError" in str(err.value)  # the error line of the run's log
    assert "UnpicklingError" in log.read_text()


@pytest.mark.slow
def test_a_failing_run_fails_its_notebook_with_the_run_and_its_log(tmp_path, monkeypatch):
    # profile=cifar10 reads data_dir=data/cifar10 relative to the kernel's cwd: unreadable files
    # there pass validation, and the run's loader fails at once (no training).
    _unreadable_cifar10(tmp_path / "data" / "cifar10")
    nb = tmp_path / "01_quickstart.ipynb"
    shutil.copy(REPO / "notebooks" / "01_quickstart.ipynb", nb)
    out = tmp_path / "out"
    params = {"profile": "cifar10", "out_dir": str(out), "parallel": 1, "wandb": "disabled"}
    monkeypatch.chdir(tmp_path)  # the run name hashes data_dir as given: relative
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # the notebook's runs take no device key
    P = scales.get("cifar10")
    name = config.from_dict({**P.keys(k=16, seed=P.seeds[0]), "study": "quickstart"}).run_name()
    log = out / "cifar10" / "quickstart" / f"{name}.log"  # results/<profile>/<study>/
    with pytest.raises(papermill.PapermillExecutionError) as err:
        papermill.execute_notebook(
            str(nb),
            str(tmp_path / "executed.ipynb"),
            parameters=params,
            kernel_name="python3",
            cwd=str(tmp_path),
            progress_bar=False,
        )
    text = str(err.value)
    # the log as the sweep's lines name it: relative to the kernel's working directory
    assert "RunFailed" in text and name in text and str(log.relative_to(tmp_path)) in text, text
    assert "UnpicklingError" in log.read_text()


@pytest.mark.slow
def test_sweep_skips_runs_already_complete_and_survives_divergence(tmp_path, capsys):
    def sweep(runs):
        df = ex.sweep("skips", runs, out_dir=tmp_path, parallel=2, wandb="disabled")
        return df, capsys.readouterr().out

    runs = [tiny_keys(), tiny_keys(k=2)]
    first, _ = sweep(runs)
    assert list(first["status"]) == ["completed", "completed"], first[["run_dir", "status"]]
    names = [Path(d).name for d in first["run_dir"]]
    files = [p for n in names for p in (tmp_path / "skips").glob(f"{n}*") if p.is_file()]  # logs
    files += [tmp_path / "skips" / n / f for n in names for f in ("summary.json", "metrics.jsonl")]
    before = {p: p.stat().st_mtime_ns for p in files}

    second, printed = sweep(runs)
    pd.testing.assert_frame_equal(first, second)
    assert {p: p.stat().st_mtime_ns for p in files} == before, "the second sweep rewrote a run"
    assert ": started" not in printed and ": resumed" not in printed, printed
    for n in names:
        assert re.search(rf"\] {re.escape(n)}: skipped \(already completed\)", printed), printed

    # a diverging run is recorded as such, and the sweep returns every row (the others skipped)
    third, printed = sweep([*runs, tiny_keys(base_lr=1e8, warmup="none")])
    assert len(third) == 3, printed
    assert list(third["status"]) == ["completed", "completed", "diverged"], printed
    # the same values for the skipped runs (a column that the diverged run lacks turns float)
    pd.testing.assert_frame_equal(third.iloc[:2][first.columns], first, check_dtype=False)
    assert {p: p.stat().st_mtime_ns for p in files} == before, printed


@pytest.mark.parametrize(
    "bad, key",
    [({"bogus_key": 1}, "bogus_key"), ({"warmup": "sometimes"}, "warmup")],
    ids=["unknown key", "bad value"],
)
def test_sweep_refuses_bad_input_before_starting_anything(tmp_path, bad, key):
    out = tmp_path / "out"
    runs = [tiny_keys(), {**tiny_keys(seed=1), **bad}]  # the first run is fine
    with pytest.raises(ConfigError, match=re.escape(key)):
        ex.sweep("refused", runs, out_dir=out, parallel=1, wandb="disabled")
    assert not out.exists(), f"the refused sweep created {sorted(out.rglob('*'))}"
