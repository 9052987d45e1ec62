"""What a plan shows: plan.png (the predicted steps, with each row's interval, and the wall time
against the batch) and the text ``lbsgd plan`` prints, both read from plan.json's document."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from lbsgd import rundir
from lbsgd.plan import lr_range, timer


def draw(doc: dict[str, Any], path: Path) -> None:
    """Predicted steps to the target and wall time against the batch, one line per GPU count."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    draw_steps(a, doc)
    rows = doc["rows"]
    for g in sorted({r["gpus"] for r in rows}):
        sel = [r for r in rows if r["gpus"] == g]
        b.plot([r["batch"] for r in sel], [r["wall_s"] for r in sel], "o-", label=f"{g} GPU(s)")
    best = doc["recommended"]
    if best:
        b.plot([best["batch"]], [best["wall_s"]], "r*", ms=14, label="recommended")
    b.set(xscale="log", yscale="log", xlabel="batch", ylabel="predicted wall time (s)")
    b.legend(fontsize=8)
    with rundir.replacing(path) as tmp:
        fig.savefig(tmp, dpi=110, bbox_inches="tight")
    plt.close(fig)


def draw_steps(ax, doc: dict[str, Any]) -> None:
    """The plan's steps per batch on ``ax``: the prediction and its range (``Row.steps_range``, the
    one ``lbsgd plan --check`` prints)."""
    rows = doc["rows"]
    first = min(r["gpus"] for r in rows)
    one = [r for r in rows if r["gpus"] == first]
    ax.plot([r["batch"] for r in one], [r["steps"] for r in one], "o-", label="predicted")
    _draw_bands(ax, one)
    ax.plot([doc["probe"]["batch"]], [doc["probe"]["steps"]], "k*", ms=12, label="probe run")
    ax.axvline(doc["b_crit"], color="grey", ls="--", label=f"B_crit {doc['b_crit']:.0f}")
    ax.set(xscale="log", yscale="log", xlabel="batch", ylabel="steps to target")
    ax.set_title(f"steps to {doc['target']}")
    ax.legend(fontsize=8)


def _unvouched(row: dict[str, Any]) -> list[str]:
    """The row's marks that concern its steps (not its GPU count)."""
    return [e for e in row.get("extrapolated", ()) if "B_crit" in e]


def steps_band(row: dict[str, Any]) -> tuple[float, float] | None:
    """A row's steps interval as plan.json holds it (:func:`lbsgd.plan.model.steps_range`): the
    band the figure draws and the range ``lbsgd plan --check`` prints (None: none measured)."""
    pair = row.get("steps_range")
    return (float(pair[0]), float(pair[1])) if pair else None


def _draw_bands(ax, one: list[dict[str, Any]]) -> None:
    """The steps' interval as a band (an unbounded top drawn to the axes' top), and the rows
    whose steps the plan does not vouch for hollow, labelled with their marks."""
    ranged = [(r["batch"], *steps_band(r)) for r in one if steps_band(r)]
    if ranged:
        batch, lo, hi = zip(*ranged, strict=True)
        top = ax.get_ylim()[1]
        ax.fill_between(
            batch,
            lo,
            [h if math.isfinite(h) else top for h in hi],
            alpha=0.25,
            label="its range (B_crit's 95% interval, unbounded above where a lower bound; "
            "the probe's bracket; the lr's)",
        )
    _draw_unvouched(ax, [r for r in one if _unvouched(r)])


def _draw_unvouched(ax, far: list[dict[str, Any]]) -> None:
    if not far:
        return
    marks = sorted({m for r in far for m in _unvouched(r)})
    ax.plot(
        [r["batch"] for r in far],
        [r["steps"] for r in far],
        "o",
        mfc="white",
        color="C0",
        label=f"not vouched for ({'; '.join(marks)})",
    )


def _one_group(compute: dict[str, Any]) -> str:
    """The one-BN-group step where timed apart (plans written before it have none)."""
    t = compute.get("one_group_s")
    if t is None:
        return ""
    what = "a micro-batch" if compute.get("bn_layers") == 0 else "one BN group"
    return f" ({what} of {compute['group']}: {t * 1e3:.2f} ms)"


def _steadiness(steady: dict[str, Any]) -> str:
    """The machine's load while timing, each timed size's runs slowest over fastest, and the fitted
    slope's range over the rounds."""
    parts = []
    for who in ("1", str(timer.SYNC_PROCESSES)):
        s = steady.get(who)
        if not s:
            continue
        sizes = ", ".join(f"{m}: x{a:.2f}" for m, a in s["apart"].items())
        slopes = s["slopes_s"]
        fit = (
            f"; a sample {min(slopes) * 1e6:.1f}-{max(slopes) * 1e6:.1f} us over the rounds"
            if len(slopes) > 1
            else ""
        )
        parts.append(f"{who} process{'es' if who != '1' else ''} {sizes}{fit}")
    runs = min((steady[w]["runs"] for w in ("1", "2") if w in steady), default=0)
    load = steady.get("load_average")
    busy = (
        f", the machine's load average {min(load):.1f}-{max(load):.1f} on {steady['cores']} cores"
        if load
        else ""
    )
    return f"timing: the fastest of each size's {runs} run(s){busy}; slowest over fastest: " + (
        "; ".join(parts)
    )


def render(doc: dict[str, Any], gpus: Sequence[int] | None = None) -> str:
    """The plan as text: its sources, the table and the recommendation."""
    p = doc["probe"]
    lines = [
        f"target {doc['target']}; the small-batch run ({p['source']}) at batch {p['batch']}: "
        f"{p['steps']:.0f} steps to the target"
        + (f" ({p['extrapolation']})" if p["extrapolation"] else ""),
        "B_simple over the probe: "
        + ", ".join(f"step {s} {b:.0f}" for s, b in p["trend"])
        + f"; x{p['growth']:.2f} per doubling of the steps (second half)",
        f"B_crit {doc['b_crit']:.0f} (B_simple at the target), S_min {doc['s_min']:.0f}, "
        f"E_min {doc['e_min']:.0f} samples ({doc['s_min_from']})",
        f"lr: {doc['lr_rule']['rule']} rule ({doc['lr_rule']['source']}); "
        f"{doc['lr_rule'].get('inputs', '')}",
        *(
            [lr_range.RangeTest(**doc["lr_range_test"]).describe()]
            if doc.get("lr_range_test")
            else []
        ),
        f"interconnect: alpha {doc['interconnect']['alpha_s'] * 1e6:.1f} us, beta "
        f"{doc['interconnect']['bandwidth_Bps'] / 1e9:.3g} GB/s, {doc['interconnect']['source']}",
        f"compute: {doc['compute']['per_micro_s'] * 1e3:.2f} ms per micro-batch + "
        f"{doc['compute']['per_sample_s'] * 1e6:.1f} us per sample{_one_group(doc['compute'])}, "
        "backward share "
        f"{doc['compute']['backward_fraction']:.2f}; among several processes: "
        f"{doc['compute'].get('sync_from', 'not measured')}",
        *([_steadiness(doc["timing_steadiness"])] if doc.get("timing_steadiness") else []),
        "",
        f"{'batch':>6} {'gpus':>4} {'steps':>8} {'epochs':>7} {'lr':>8} {'warmup':>6} "
        f"{'step ms':>8} {'wall':>9} {'stat eff':>8} {'sys eff':>7} {'E<=2Emin':>8} "
        f"{'steps range':>11}",
    ]
    lines += [_row(r) for r in doc["rows"] if gpus is None or r["gpus"] in gpus]
    if doc.get("caveats"):
        lines += [""] + [f"caveat: {c}" for c in doc["caveats"]]
    return "\n".join(lines + ["", *_recommendation(doc)])


def _row(r: dict[str, Any]) -> str:
    return (
        f"{r['batch']:>6} {r['gpus']:>4} {r['steps']:>8.0f} {r['epochs']:>7.2f} "
        f"{r['lr']:>8.4g} {r['warmup_steps']:>6} {r['step_s'] * 1e3:>8.2f} "
        f"{_duration(r['wall_s']):>9} {r['statistical_efficiency']:>8.2f} "
        f"{r['system_efficiency']:>7.2f} {'yes' if r['within_factor'] else 'no':>8} "
        f"{'-' if not r.get('steps_range') else '{:.0f}-{:.0f}'.format(*r['steps_range']):>11}"
        + (f"  ~ {', '.join(r['extrapolated'])}" if r.get("extrapolated") else "")
        + (f"  ! {r['warning']}" if r["warning"] else "")
    )


def _recommendation(doc: dict[str, Any]) -> list[str]:
    best = doc["recommended"]
    if best:
        return [
            f"recommended: batch {best['batch']} on {best['gpus']} GPU(s), lr {best['lr']:.4g}, "
            f"warmup {best['warmup_steps']} steps: {best['steps']:.0f} steps, "
            f"{_duration(best['wall_s'])} predicted (the shortest with E <= "
            f"{doc['e_factor']:g} E_min)",
            f"run it: {best.get('command', '')}",
        ]
    if any(r["within_factor"] for r in doc["rows"]):
        return ["no recommendation: the timing rounds rank the rows apart (caveat above)"]
    return [f"no row keeps E <= {doc['e_factor']:g} E_min: plan smaller batches"]


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.1f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.2f} h"
