"""The committed replay (results/cpu/) is what its runs produced: every run finished under the
profile's instruction-set cap, its folder is the name its config gives, and the report is the one
`lbsgd report` builds from the study files (no number edited by hand)."""

import json
from pathlib import Path

import pytest
import yaml

from lbsgd import config, report

CPU = Path(__file__).resolve().parents[1] / "results" / "cpu"
RUNS = sorted(p.parent for p in CPU.glob("*/*/summary.json"))

pytestmark = pytest.mark.skipif(not RUNS, reason="no committed results/cpu/ in this checkout")


def test_every_committed_cpu_run_finished_under_the_avx2_cap_in_its_own_folder():
    for run in RUNS:
        summary = json.loads((run / "summary.json").read_text())
        assert summary["status"] in ("completed", "diverged"), run
        keys = yaml.safe_load((run / "config.yaml").read_text())
        cfg = config.from_dict({k: v for k, v in keys.items() if k in config.KEYS})
        assert (cfg.profile, cfg.study, cfg.cpu_isa) == ("cpu", run.parent.name, "avx2"), run
        assert cfg.run_name() == run.name and summary["experiment_id"] == cfg.experiment_id()
        caps = summary["environment"]["cpu_isa"]
        assert caps["in_effect"] and caps["pinned_before_torch"] and caps["aten"] == "AVX2", run


def test_the_committed_report_is_the_one_built_from_the_study_files():
    assert (CPU / "REPORT.md").read_text() == report.build(CPU)
