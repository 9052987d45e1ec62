"""The study tables as people read them: column names that cannot be confused (lbsgd's ``k`` is the
minibatch over the reference batch; the papers' GPU count is ``paper_gpus``), numbers rounded where
they are shown (a notebook's table, REPORT.md) and kept to 6 significant digits in ``table.csv``."""

import json
import re

import pandas as pd

from lbsgd.lab import report, studies
from lbsgd.lab.studies import scaling, warmup

# a "k=" in a cell of text: the papers' k (GPUs) would read as lbsgd's k
K_IN_TEXT = re.compile(r"(?<![A-Za-z_])k\s*=")


def warmup_runs() -> pd.DataFrame:
    """Runs as ``experiments.load_runs`` gives them: the baseline (k = 1) and k = 16, two seeds."""
    rows = [
        {"k": k, "batch_size": 16 * k, "warmup": w, "seed": s, "final_top1_error_pct": 5.0 + s}
        for k, w in [(1, "none"), (16, "none"), (16, "constant"), (16, "gradual")]
        for s in (0, 1)
    ]
    return pd.DataFrame(rows)


def test_the_papers_gpu_count_is_paper_gpus_and_k_is_only_lbsgds():
    t = warmup.table(warmup_runs()).set_index(["k", "warmup"])
    # Goyal Table 1: the baseline on 8 GPUs (256), the 8k runs on 256 GPUs; our k = 1 and 16
    assert t.loc[(1, "none"), "paper_gpus"] == 8 and t.loc[(1, "none"), "paper_batch"] == 256
    for w in warmup.WARMUPS:
        assert t.loc[(16, w), "paper_gpus"] == 256 and t.loc[(16, w), "paper_batch"] == 8192
    assert t["paper_variant"].notna().all()  # the paper's words for each row, without its k
    cells = [str(v) for v in t.to_numpy().ravel()]
    assert not [v for v in cells if K_IN_TEXT.search(v)], cells
    # the published scaling runs: their GPUs are the paper's too
    pub = scaling.published()
    assert "gpus" not in pub.columns and set(pub["paper_gpus"]) == {256, 2048}


def test_shown_tables_are_rounded_and_table_csv_keeps_six_digits(tmp_path):
    table = pd.DataFrame(
        {
            "k": [1.0, 0.5],
            "lr": [0.0123456, 0.2],
            "final_top1_error_pct_mean": [62.18666, 3.0],
            "final_top1_error_pct_std": [0.740091, float("nan")],
            "img_per_s_mean": [2703.912, 576.2364],
            "diverged": [True, False],
            "paper_variant": ["gradual", None],
        }
    )
    s = studies.start(
        "warmup", title="2. Warmup", profile="smoke", out_dir=tmp_path, wandb="disabled"
    )
    assert s.save_table(table) is table  # the notebook goes on with every digit
    s.findings([studies.Finding("gradual warmup helps", None, "one seed")])
    csv = (s.dir / "table.csv").read_text().splitlines()
    assert csv[1] == "1,0.0123456,62.1867,0.740091,2703.91,True,gradual"  # 6 significant digits

    shown = studies.readable(table)  # what the notebook displays
    expected = [
        ["1", "0.01235", "62.19", "0.74", "2704", "True", "gradual"],
        ["0.5", "0.2", "3.00", "", "576.2", "False", ""],
    ]
    assert shown.values.tolist() == expected
    assert list(shown.columns) == list(table.columns)

    text = report.build(s.out)  # REPORT.md: the same cells, read from table.csv
    rows = [line for line in text.splitlines() if line.startswith("| 1 |") or "| 0.5 |" in line]
    assert rows == ["| " + " | ".join(r) + " |" for r in expected]
    assert json.loads((s.dir / "findings.json").read_text())["study"] == "warmup"
