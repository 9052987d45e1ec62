"""What a run tells whoever watches its output (rank 0 alone): tqdm's bar on a terminal, plain
progress lines without one (nohup, SLURM, a sweep's per-run ``.log``), and one line at its end,
however it ended (:func:`ending_line`).

The lines use only values the loop has read already (a metric flush's losses, an evaluation's
record): they add no host synchronisation to a step.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

from tqdm import tqdm

# Without a terminal, a progress line at every epoch's end and at the first metric flush at least
# this many seconds (wall clock) after the previous line: a line a flush at the most, so under a
# large log_every the lines come at flushes, as seldom as they do.
PLAIN_EVERY_S = 30.0
# A run whose first timed steps put its whole length past this many seconds gets one warning line
# (epochs=1e9 would otherwise start a run of years without a word)
LONG_RUN_S = 86_400.0


class Flushed(NamedTuple):
    """The values of a metric flush's last step, as the flush read them."""

    step: int  # optimizer steps done
    loss: float  # training loss, averaged over the processes
    lr: float
    img_per_s: float  # the flush window's throughput


class Progress:
    """Progress of a run of ``total_steps`` steps started at ``start_step`` (after a resume: the
    checkpoint's step); ``show``: this process reports (rank 0). On a terminal (``terminal``;
    default: whether stderr is one) tqdm's bar, else plain lines (:meth:`report`).
    ``t_start``: when the run began on ``clock`` (the lines' elapsed time counts from there)."""

    def __init__(
        self,
        total_steps: int,
        start_step: int,
        epoch_of: Callable[[int], float],
        show: bool,
        t_start: float,
        terminal: bool | None = None,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        if terminal is None:
            terminal = sys.stderr.isatty()
        self.total_steps, self.start_step, self.epoch_of = total_steps, start_step, epoch_of
        self.plain = show and not terminal  # plain lines instead of the bar
        self.bar = tqdm(
            total=total_steps,
            initial=start_step,
            unit="step",
            dynamic_ncols=True,
            disable=not (show and terminal),
        )
        self.clock, self.t_start = clock, t_start
        self.t_loop = self.last_line = clock()  # the loop's start (ETA's rate); the last line
        self.latest: Flushed | None = None
        self.show = show

    def step(self) -> None:
        """One optimizer step done (the bar moves; nothing read from the device)."""
        self.bar.update(1)

    def flushed(self, latest: Flushed) -> None:
        """A metric flush's values: the bar's postfix, the next plain line's numbers; at the
        first, the long-run warning (:meth:`too_long`)."""
        if self.latest is None:
            self.too_long(latest.step, self.clock())
        self.latest = latest
        self.bar.set_postfix(
            loss=f"{latest.loss:.4f}", lr=f"{latest.lr:.4g}", img_s=f"{latest.img_per_s:.0f}"
        )

    def too_long(self, step: int, now: float) -> str | None:
        """One warning line (printed, returned) when the pace of the steps so far puts the rest
        of the run past :data:`LONG_RUN_S`, naming its epochs; None otherwise."""
        done = step - self.start_step
        if not self.show or done <= 0:
            return None
        left = (now - self.t_loop) / done * (self.total_steps - step)
        if left <= LONG_RUN_S:
            return None
        line = (
            f"lbsgd: warning: at {(now - self.t_loop) / done:.3g} s a step, the "
            f"{self.total_steps - step:,} steps left (epochs={self.epoch_of(self.total_steps):g}) "
            f"take about {left / LONG_RUN_S:,.1f} days; stop it (Ctrl-C) and lower epochs if "
            "that is not meant"
        )
        print(line, file=sys.stderr, flush=True)
        return line

    def report(self, step: int, epoch_end: bool, top1_error: float | None = None) -> str | None:
        """After step ``step``'s decisions: a plain line (printed, returned) when the step was
        flushed and it ends an epoch (or the run), or :data:`PLAIN_EVERY_S` passed since the last
        line; ``top1_error``: the step's evaluation, if it had one."""
        if not self.plain or self.latest is None or self.latest.step != step:
            return None
        now = self.clock()
        if not epoch_end and now - self.last_line < PLAIN_EVERY_S:
            return None
        self.last_line = now
        line = self.line(now, top1_error)
        print(line, flush=True)
        return line

    def line(self, now: float, top1_error: float | None = None) -> str:
        """The plain line of the latest flush at time ``now``: step, epoch, loss, lr, img/s,
        elapsed time, ETA (from the loop's pace so far, evaluations included)."""
        f = self.latest
        done = f.step - self.start_step
        eta = (now - self.t_loop) / done * (self.total_steps - f.step) if done > 0 else math.nan
        line = (
            f"lbsgd: step {f.step}/{self.total_steps} epoch {self.epoch_of(f.step):.2f} "
            f"loss {f.loss:.4f} lr {f.lr:.4g} img/s {f.img_per_s:.0f} "
            f"elapsed {hms(now - self.t_start)} eta {hms(eta)}"
        )
        if top1_error is not None:
            line += f" top-1 error {top1_error:.2f}%"
        return line

    def close(self) -> None:
        self.bar.close()


def hms(seconds: float, decimals: int = 0) -> str:
    """``seconds`` as h:mm:ss (``decimals`` on the seconds); "?" when not finite."""
    if not math.isfinite(seconds):
        return "?"
    unit = 10**decimals  # whole units of the last decimal: no float carry (59.96 -> 1:00.0)
    h, rest = divmod(round(max(seconds, 0.0) * unit), 3600 * unit)
    m, s = divmod(rest, 60 * unit)
    width = 2 + (decimals + 1 if decimals else 0)
    return f"{h}:{m:02d}:{s / unit:0{width}.{decimals}f}"


def ending_line(summary: dict[str, Any], run_dir: Path | str, written: bool = True) -> str:
    """The one line a run ends with, from its summary.json content: status, final and best top-1
    error (%, "n/a" before any evaluation), steps, wall time, and where summary.json is (with
    ``written`` False, a run that ended before writing one: its run folder)."""
    final = summary.get("final", {}).get("top1_error_pct")
    best = summary.get("best", {})
    best_text = "n/a"
    if best.get("top1_error_pct") is not None:
        best_text = f"{best['top1_error_pct']:.2f}% (step {best['step']})"
    wall = summary.get("wall_time_s")
    wall_text = "n/a" if wall is None else hms(wall, 1)
    if (summary.get("attempts") or 1) > 1 and summary.get("total_wall_time_s") is not None:
        wall_text += (
            f" (this attempt; {hms(summary['total_wall_time_s'], 1)} over "
            f"{summary['attempts']} attempts)"
        )
    return (
        f"lbsgd: {summary.get('status', 'unknown')}: final top-1 error "
        f"{'n/a' if final is None else f'{final:.2f}%'}, best {best_text}, "
        f"{summary.get('steps', '?')}/{summary.get('total_steps', '?')} steps, wall time "
        f"{wall_text}, "
        + (f"summary {Path(run_dir) / 'summary.json'}" if written else f"no summary in {run_dir}")
    )
