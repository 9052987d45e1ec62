"""A study's notebook session: where the study writes (``results/<profile>/<study>/``), how it
launches its runs, and what it saved (table, figures, findings), logged to W&B as one run of the
study's group."""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lbsgd import config
from lbsgd.lab import experiments as ex
from lbsgd.lab import findings as fs
from lbsgd.lab import studies
from lbsgd.lab.findings import Finding
from lbsgd.lab.studies import scales

# -- where results go --------------------------------------------------------------------------


def repo_root() -> Path:
    """The checkout holding lbsgd (an editable install), else the working directory."""
    here = Path(__file__).resolve().parents[3]  # lbsgd/lab/studies/session.py
    return here if (here / "pyproject.toml").is_file() else Path.cwd()


def results_root(out_dir: str | os.PathLike | None = None) -> Path:
    """The results root: ``None`` is the repository's ``results/``; a relative path is taken from
    the repository root (not the kernel's working directory); an absolute path is itself."""
    if out_dir is None:
        return repo_root() / "results"
    config.check_folder_path("out_dir", str(out_dir))  # '' would be the repository itself
    path = Path(out_dir).expanduser()
    return path if path.is_absolute() else repo_root() / path


# -- a study session ---------------------------------------------------------------------------


@dataclass
class Session:
    """One study at one profile: where it writes, how it launches, what it has saved."""

    study: str
    title: str
    profile: scales.Profile
    seeds: list[int]
    root: Path  # results root
    launch: Mapping[str, Any]  # sweep's launch parameters (processes, parallel runs, W&B mode)
    table_path: Path | None = None
    figure_paths: list[Path] = field(default_factory=list)

    @property
    def out(self) -> Path:
        """The profile's folder: the runs' ``out_dir``."""
        return self.root / self.profile.name

    @property
    def dir(self) -> Path:
        """The study's folder: ``<root>/<profile>/<study>/``."""
        return self.out / self.study

    def sweep(self, runs: Sequence[Mapping[str, Any]]):
        """Train the runs (see :func:`lbsgd.lab.experiments.sweep`) into this study's folder."""
        return ex.sweep(
            self.study, runs, out_dir=self.out, profile=self.profile.name, **self.launch
        )

    def save_table(self, table, name: str = "table.csv", digits: int | None = 6):
        """Write ``table`` (ours beside the paper) to the study's folder (:func:`ex.save_table`);
        returns it as it is (:func:`readable` shows it rounded)."""
        path = ex.save_table(table, self.out, self.study, name, digits)
        if name == "table.csv":
            self.table_path = path
        return table

    def save_figure(self, fig, name: str) -> None:
        """Save ``fig`` to the study's folder; the notebook still displays it (inline backend)."""
        path = ex.save_figure(fig, self.out, self.study, name)
        if path not in self.figure_paths:
            self.figure_paths.append(path)

    def findings(self, findings: Iterable[Finding], seeds: Sequence[int] | None = None) -> None:
        """Write ``findings.json``, print each verdict, and log the study (table, figures,
        findings) to W&B as one run of the study's group."""
        p = self.profile
        findings = [fs.with_s_min(f, p.s_min, p.s_min_target) for f in findings]
        used = list(self.seeds if seeds is None else seeds)
        study_dir = ex.study_dir(self.out, self.study)
        fs.write(study_dir, self.study, self.profile.name, used, findings, title=self.title)
        if self.launch.get("wandb", "auto") != "disabled":
            log_study(
                self.dir,
                study=self.study,
                profile=self.profile.name,
                mode=self.launch.get("wandb", "auto"),
                table=self.table_path,
                figures=tuple(self.figure_paths),
                findings=findings,
            )


def one_line_errors() -> bool:
    """In an IPython kernel (JupyterLab, papermill): a ConfigError (a bad notebook parameter,
    a bad key) shows as its one line, ``lbsgd: error: …``, in the cell and in papermill's
    report, as on the command line, instead of a traceback through lbsgd; an interrupt as its
    one line (the sweep's summary); other errors keep theirs. IPython's public ways: a custom
    exception handler, which shows the exception with ``_render_traceback_`` (IPython's hook for
    an exception's own traceback). Returns whether a kernel was there to set it in."""
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    if shell is None:
        return False

    def one_line(shell, etype, value, tb, tb_offset=None):
        if issubclass(etype, KeyboardInterrupt):  # an interrupt: the sweep's summary, or this
            line = f"{etype.__name__}: {value}" if str(value) else "KeyboardInterrupt: interrupted"
        else:
            line = f"lbsgd: error: {value}"
        value._render_traceback_ = lambda: [line]  # the cell's error output: this line alone
        shell.showtraceback((etype, value, tb))
        return [line]

    shell.set_custom_exc((config.ConfigError, KeyboardInterrupt), one_line)
    return True


def start(
    study: str,
    *,
    title: str,
    profile: str = "cpu",
    seeds: Sequence[int] | None = None,
    epochs: float | None = None,
    out_dir: str | os.PathLike | None = None,
    nproc_per_node: int = 1,
    nnodes: int = 1,
    rdzv_endpoint: str | None = None,
    parallel: int = 1,
    wandb: str = "auto",
    launcher: str = "local",
    cluster: str | None = None,
) -> Session:
    """A study's session from its notebook's parameters; bad values fail here, one line each
    (in a notebook too: :func:`one_line_errors`). ``launcher="slurm"`` sends each run to
    ``cluster`` (a file of the repository's configs/cluster/ or a path, with key=value
    overrides: docs/cluster.md)."""
    one_line_errors()
    if study not in studies.STUDIES:
        raise config.ConfigError(f"study={study!r} is not one of {', '.join(studies.STUDIES)}")
    if wandb not in ("auto", "online", "offline", "disabled"):
        raise config.ConfigError(f"wandb={wandb!r} must be one of auto, online, offline, disabled")
    launch = {
        "nproc_per_node": nproc_per_node,
        "nnodes": nnodes,
        "rdzv_endpoint": rdzv_endpoint,
        "parallel": parallel,
    }
    ex.check_launch(**launch)
    cluster = ex.launcher_of(launcher, cluster, repo_root())  # its file read now
    p = scales.get(profile, epochs=epochs)
    chosen = list(seeds) if seeds is not None else list(p.seeds)
    if not chosen or any(isinstance(s, bool) or not isinstance(s, int) or s < 0 for s in chosen):
        raise config.ConfigError(f"seeds={seeds!r} must be a non-empty list of integers >= 0")
    launch |= {"wandb": wandb, "launcher": launcher, "cluster": cluster}
    return Session(study, title, p, chosen, results_root(out_dir), launch)


# -- the study's W&B run -----------------------------------------------------------------------


def log_study(
    study_dir: str | os.PathLike,
    *,
    study: str,
    profile: str,
    mode: str,
    table: Any = None,
    figures: Iterable[str | os.PathLike] = (),
    findings: Iterable[Any] | None = None,
) -> str | None:
    """One W&B run for the study (job_type=study, group=study, name ``<study> (<profile>)``)
    holding ``table`` (a CSV path or a DataFrame: ours beside the paper) as ``table``, each PNG of
    ``figures`` as an image named by its file stem, and ``findings`` (dicts or Findings: claim,
    replayed, evidence) as the table ``findings`` (claim, verdict, evidence).

    The study has one W&B run, whatever the mode: its id is kept in ``<study_dir>/wandb_id``
    (written by the first call, out of git like a run's), and every later call (a notebook run
    again) logs to that id. Online it resumes the run (``resume="allow"``): the table, figures and
    findings of the re-run are its next step. Offline each call writes a folder
    ``wandb/offline-run-<time>-<id>`` of the same id; ``wandb sync`` syncs the folders of one id
    into that one W&B run, in the order of their start times. Returns the W&B id, or None
    (disabled, or a failure: one RuntimeWarning; never raises)."""
    try:
        run = _study_run(Path(study_dir), study, profile, mode)
        if run is None:
            return None
        try:
            data = _study_data(table, figures, findings)
            if data:
                run.log(data)
        finally:
            run.finish()
        return run.id
    except Exception as e:  # W&B never fails the notebook
        warnings.warn(
            f"W&B: study {study} not logged ({type(e).__name__}: {e})", RuntimeWarning, stacklevel=2
        )
        return None


def _study_run(study_dir: Path, study: str, profile: str, mode: str) -> Any:
    """The study's W&B run, its id kept in ``<study_dir>/wandb_id`` (None: disabled)."""
    from lbsgd import tracking

    id_file = study_dir / tracking.ID_FILE
    # where the id was kept before (online only), so that such a study keeps its W&B run
    earlier = tracking.read_id(id_file) or tracking.read_id(study_dir / "wandb" / "study_id")
    run = tracking.init_after(
        mode,
        study_dir,
        project="lbsgd",
        group=study,
        job_type="study",
        id=earlier or tracking.new_run_id(),
        name=f"{study} ({profile})",
        tags=[t for t in (profile, study) if t],
        config={"study": study, "profile": profile},
    )
    if run is not None and tracking.read_id(id_file) is None:
        # the first call (an online failure's fallback keeps it)
        id_file.write_text((earlier or run.id) + "\n")
    return run


def _study_data(table: Any, figures: Iterable[str | os.PathLike], findings: Any) -> dict:
    """What the study's W&B run logs: its table, figures and findings (claim, verdict, evidence)."""
    import wandb

    data: dict[str, Any] = {}
    if table is not None:
        import pandas as pd

        df = table if isinstance(table, pd.DataFrame) else pd.read_csv(table)
        data["table"] = wandb.Table(dataframe=df)
    for fig in figures:
        data[f"figures/{Path(fig).stem}"] = wandb.Image(str(fig))
    if findings is not None:  # a dict reads as a Finding would; what it may leave out: empty
        empty = {"claim": "", "evidence": "", "replayed": None}
        found = [
            f if isinstance(f, Finding) else Finding.from_dict({**empty, **f}) for f in findings
        ]
        rows = [[str(f.claim), f.outcome, str(f.evidence)] for f in found]
        data["findings"] = wandb.Table(columns=["claim", "verdict", "evidence"], data=rows)
    return data
