"""The statistics behind a verdict: intervals of a mean difference over seeds, their tests
against a claim's threshold or margin, one contrast's three outcomes, false-discovery control,
the seeds a claim needs, and the fit of steps to a target over batch sizes; every distribution
from scipy, nothing about runs or papers (docs/verdicts.md).

A claim's :class:`Test` gives ``p_for``, the smallest α at which its two-sided (1 − α) interval
lies wholly on the claim's side, and ``p_against``, the same for the other side (1 where the mean
is not on that side); the claim is decided at α when the smaller, :attr:`Test.p`, is below α, so
the verdict and the printed interval always agree.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy import integrate
from scipy import stats as sps

# The level of every verdict's interval (two-sided 95%) and of the report's false-discovery rate.
ALPHA = 0.05
# The power a seed plan asks for at the effect it is planned for.
POWER = 0.80


@dataclass(frozen=True)
class Interval:
    """A mean difference ``mean(x) − mean(y)`` over seeds with its two-sided (1 − α) interval:
    ``test`` is "paired t" (the mean of the per-seed differences, Student), "Welch t", or, with
    a lone run in one arm, Student's pooled t."""

    test: str
    n: int  # seeds (pairs when paired; the smaller arm when not)
    diff: float
    low: float
    high: float

    def text(self, unit: str = "points") -> str:
        level = round(100 * (1 - ALPHA))
        return (
            f"{self.diff:+.2f} {unit}, {level}% CI [{self.low:+.2f}, {self.high:+.2f}] "
            f"({self.test}, n = {self.n})"
        )


@dataclass(frozen=True)
class Test:
    """A claim's test: the interval it reads and the two p-values of its decision."""

    interval: Interval
    p_for: float
    p_against: float

    @property
    def p(self) -> float:
        return min(self.p_for, self.p_against)


def _result(x: np.ndarray, y: np.ndarray, paired: bool, alternative: str = "two-sided"):
    if paired:
        return sps.ttest_rel(x, y, alternative=alternative)
    # Welch's; with a lone run in an arm, Student's pooled t (the lone run has no spread of its
    # own: it is taken to share the other arm's), which Welch's cannot give
    pooled = min(len(x), len(y)) < 2
    return sps.ttest_ind(x, y, equal_var=pooled, alternative=alternative)


def _arrays(x: Sequence[float], y: Sequence[float], paired: bool) -> tuple[np.ndarray, np.ndarray]:
    a, b = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    if paired and len(a) != len(b):
        raise ValueError(f"paired arms need one value per seed each ({len(a)} vs {len(b)})")
    if paired and len(a) < 2:
        raise ValueError("a paired interval needs two seeds (pairs)")
    if not paired and (min(len(a), len(b)) < 1 or max(len(a), len(b)) < 2):
        raise ValueError("an unpaired interval needs two runs in one arm and one in the other")
    return a, b


def interval(x: Sequence[float], y: Sequence[float], *, paired: bool) -> Interval:
    """``mean(x) − mean(y)`` and its two-sided (1 − α) interval: Student's on the
    per-seed differences when ``paired`` (``x[i]``, ``y[i]`` from seed i), else Welch's (Student's
    pooled with a lone run in an arm). Where the
    differences have no spread at all (identical runs) the interval is the point itself."""
    a, b = _arrays(x, y, paired)
    diff, n = float(a.mean() - b.mean()), int(min(len(a), len(b)))
    name = "paired t" if paired else "Welch t" if n >= 2 else "pooled t, a lone run"
    if _no_spread(a, b, paired):
        return Interval(name, n, diff, diff, diff)
    ci = _result(a, b, paired).confidence_interval(1 - ALPHA)
    return Interval(name, n, diff, float(ci.low), float(ci.high))


def _no_spread(a: np.ndarray, b: np.ndarray, paired: bool) -> bool:
    if paired:
        return bool(np.ptp(a - b) == 0)
    return bool(np.ptp(a) == 0 and np.ptp(b) == 0)


def _point_p(d: float, alternative: str) -> float:
    """The p of a point interval ``d`` away from the null: certain on either side, undecidable
    on it."""
    return 0.0 if {"two-sided": d != 0, "greater": d > 0, "less": d < 0}[alternative] else 1.0


def p_at(
    x: Sequence[float], y: Sequence[float], value: float, *, paired: bool, alternative="two-sided"
) -> float:
    """The t test's p of ``mean(x) − mean(y) = value`` (the null), ``alternative`` as scipy's:
    "greater" asks whether the difference exceeds ``value``."""
    a, b = _arrays(x, y, paired)
    if _no_spread(a, b, paired):
        return _point_p(float(a.mean() - b.mean()) - value, alternative)
    return float(_result(a, b + value, paired, alternative).pvalue)


def _side(iv: Interval, threshold: float, p: float) -> Test:
    """The claim "above ``threshold``" of interval ``iv``, ``p`` the two-sided p against it."""
    if iv.diff == threshold:
        return Test(iv, 1.0, 1.0)
    return Test(iv, p, 1.0) if iv.diff > threshold else Test(iv, 1.0, p)


def _within(iv: Interval, centre: float, margin: float, p) -> Test:
    """The closeness claim ``|value − centre| < margin`` of interval ``iv``: replayed when the
    whole (1 − α) interval lies inside ``centre ± margin`` (two one-sided tests, each at α/2:
    ``p_for`` is twice the larger of their p's), not replayed when it lies wholly outside
    (``p_against``: the two-sided test against the nearer bound, when the value lies beyond it).
    ``p(value, alternative)``: the t test's p of the null ``value``."""
    if margin <= 0:
        raise ValueError(f"an equivalence margin must be > 0, not {margin}")
    p_for = min(1.0, 2 * max(p(centre + margin, "less"), p(centre - margin, "greater")))
    off = iv.diff - centre
    if abs(off) <= margin:
        return Test(iv, p_for, 1.0)
    return Test(iv, p_for, p(centre + math.copysign(margin, off), "two-sided"))


def above(x: Sequence[float], y: Sequence[float], threshold: float, *, paired: bool) -> Test:
    """The claim ``mean(x) − mean(y) > threshold`` (a direction, e.g. "a's error is lower")."""
    return _side(interval(x, y, paired=paired), threshold, p_at(x, y, threshold, paired=paired))


def below(x: Sequence[float], y: Sequence[float], threshold: float, *, paired: bool) -> Test:
    """The claim ``mean(x) − mean(y) < threshold``."""
    t = above(x, y, threshold, paired=paired)
    return Test(t.interval, t.p_against, t.p_for)


def equivalent(x: Sequence[float], y: Sequence[float], margin: float, *, paired: bool) -> Test:
    """The closeness claim ``|mean(x) − mean(y)| < margin`` (:func:`_within` about 0)."""
    iv = interval(x, y, paired=paired)
    return _within(iv, 0.0, margin, lambda v, alt: p_at(x, y, v, paired=paired, alternative=alt))


# the outcomes of one contrast of two arms (:func:`contrast`), in the order the rule tries them
CONTRAST_OUTCOMES = ("matches", "beats", "loses")


@dataclass(frozen=True)
class Contrast:
    """One contrast of two arms, ``Δ = mean(x) − mean(y)`` against a margin δ: its interval and
    the p of each outcome (:data:`CONTRAST_OUTCOMES`): *matches*, the equivalence test's (the
    interval inside ±δ); *beats*, the t test's when the mean is above 0 (the interval wholly
    above 0); *loses*, when below. Above 0 is the caller's "beats" (for errors: the other arm's
    less this one's)."""

    interval: Interval
    margin: float
    p: dict[str, float]

    @property
    def outcome(self) -> str | None:
        """The outcome decided at :data:`ALPHA`: matches when the interval lies inside ±δ, else
        beats when wholly above 0, else loses when wholly below; None (undecided) otherwise."""
        return next((o for o in CONTRAST_OUTCOMES if self.p[o] < ALPHA), None)

    def test(self, expected: str) -> Test:
        """The claim that the outcome is ``expected``: ``p_for`` its p (1 when another outcome is
        decided), ``p_against`` the smallest p of the others (1 when ``expected`` is decided),
        so that the claim's verdict at α is the rule's and at most one p is below α."""
        if expected not in CONTRAST_OUTCOMES:
            raise ValueError(f"expected={expected!r} is not one of {CONTRAST_OUTCOMES}")
        decided = self.outcome
        p_for = self.p[expected] if decided in (expected, None) else 1.0
        others = min(v for o, v in self.p.items() if o != expected)
        return Test(self.interval, p_for, 1.0 if decided == expected else others)


def contrast(x: Sequence[float], y: Sequence[float], margin: float, *, paired: bool) -> Contrast:
    """The three-outcome rule on ``Δ = mean(x) − mean(y)``: one verdict per contrast, where a
    directional claim and its closeness twin on the same two arms would each read the same
    interval and could both be decided (:class:`Contrast`)."""
    side = above(x, y, 0.0, paired=paired)
    near = equivalent(x, y, margin, paired=paired)
    p = {"matches": near.p_for, "beats": side.p_for, "loses": side.p_against}
    return Contrast(side.interval, margin, p)


def all_of(tests: Sequence[Test]) -> tuple[float, float]:
    """``(p_for, p_against)`` of a claim that holds when every one of ``tests`` does
    (intersection–union): replayed at α when each is, not replayed when any one is not."""
    return max(t.p_for for t in tests), min(t.p_against for t in tests)


def bh_adjusted(ps: Sequence[float]) -> list[float]:
    """Benjamini–Hochberg adjusted p-values (scipy's ``false_discovery_control``): a claim is
    decided at false-discovery rate α when its adjusted p is below α."""
    return [float(q) for q in sps.false_discovery_control(np.asarray(ps, dtype=float), method="bh")]


def power(effect: float, sd: float, n: int, *, paired: bool = True) -> float:
    """The power of the two-sided t test at level α to detect a true mean difference
    ``effect`` at per-seed standard deviation ``sd`` (of the differences when ``paired``, of each
    arm when not) with ``n`` seeds (pairs; per arm when not paired): the noncentral t's mass
    beyond the critical values."""
    if sd <= 0:
        return 1.0 if effect != 0 else ALPHA
    d = abs(effect) / sd
    if paired:
        df, nc = n - 1, d * math.sqrt(n)
    else:
        df, nc = 2 * (n - 1), d * math.sqrt(n / 2)
    crit = sps.t.ppf(1 - ALPHA / 2, df)
    return float(sps.nct.sf(crit, df, nc) + sps.nct.cdf(-crit, df, nc))


def seeds_to_decide(effect: float, sd: float, *, paired: bool = True) -> int | None:
    """The fewest seeds (pairs; per arm when not paired) for which the two-sided t test at
    α has power :data:`POWER` (80%) to decide a true ``effect`` (the distance of the mean
    difference from the claim's threshold) at per-seed spread ``sd``; None when no number up to
    10,000 does (an effect of 0)."""
    if effect == 0:
        return None
    most = 10_000

    def enough(n: int) -> bool:
        return power(effect, sd, n, paired=paired) >= POWER

    # start from the normal approximation with Guenther's correction for the t's heavier tails
    # (n ≈ ((z_{1−α/2} + z_power) / d)² + z²_{1−α/2} / 2, twice that per arm unpaired), then step
    # to the exact answer: power grows with n
    z = sps.norm.ppf(1 - ALPHA / 2)
    d = abs(effect) / sd if sd > 0 else math.inf
    per = 1 if paired else 2
    n = (
        max(2, math.ceil(per * ((z + sps.norm.ppf(POWER)) / d) ** 2 + z * z / 2))
        if d < math.inf
        else 2
    )
    if n > most:
        return None
    while n > 2 and enough(n - 1):
        n -= 1
    while not enough(n):
        if n >= most:
            return None
        n += 1
    return n


def decision_power(low: float, high: float, true: float, sd: float, n: int) -> float:
    """The chance that the two-sided (1 − α) paired interval of ``n`` pairs decides a test
    with two outcomes, "the difference is above ``low``" (the interval wholly above it) or "below
    ``high``" (wholly below it), when the true mean difference is ``true`` at per-pair sd ``sd``.
    Neither is decided only when the interval covers both bounds: its half-width h = t·s/√n at
    least (high − low)/2 and its mean inside [high − h, low + h]; the mean is normal and s² a
    scaled χ² apart from it, so that chance is one integral over s (``scipy.integrate.quad``).
    Lowest where ``true`` lies midway between the bounds."""
    if n < 2 or high <= low:
        raise ValueError(f"decision_power needs n >= 2 and high > low (n={n}, {low}..{high})")
    df = n - 1
    crit = float(sps.t.ppf(1 - ALPHA / 2, df))
    se = sd / math.sqrt(n)

    def undecided(q: float) -> float:  # q: the χ²(n − 1) draw of (n − 1) s² / sd²
        half = crit * sd * math.sqrt(q / df) / math.sqrt(n)
        if 2 * half <= high - low:
            return 0.0
        inside = sps.norm.cdf((low + half - true) / se) - sps.norm.cdf((high - half - true) / se)
        return float(inside * sps.chi2.pdf(q, df))

    return 1.0 - integrate.quad(undecided, 0.0, math.inf, limit=200)[0]


def pairs_to_decide(low: float, high: float, sd: float) -> int | None:
    """The fewest pairs of seeds whose paired 95% interval decides "above ``low``" or "below
    ``high``" with probability :data:`POWER` whatever the true difference
    (:func:`decision_power` at the midpoint, its lowest); None past 1,000."""
    mid = (low + high) / 2
    for n in range(2, 1_001):
        if decision_power(low, high, mid, sd, n) >= POWER:
            return n
    return None


# -- the slope of a line ------------------------------------------------------------------------


def slope(x: Sequence[float], y: Sequence[float]) -> Interval:
    """The least-squares slope of ``y`` on ``x`` (scipy's ``linregress``) and its two-sided
    (1 − α) interval, Student's t on n − 2 degrees of freedom: e.g. log2 steps on log2
    batch, −1 where the steps halve as the batch doubles. Needs three points and two x values."""
    a, b = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    if len(a) != len(b) or len(a) < 3 or np.ptp(a) == 0:
        raise ValueError(
            f"a slope's interval needs three points over two x values ({len(a)} given)"
        )
    r = sps.linregress(a, b)
    half = float(sps.t.ppf(1 - ALPHA / 2, len(a) - 2) * r.stderr)
    s = float(r.slope)
    return Interval("OLS slope", len(a), s, s - half, s + half)


def _slope_p(x, y, value: float, alternative: str) -> float:
    """The t test's p of ``slope = value`` against ``alternative`` (scipy's words)."""
    a, b = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    r = sps.linregress(a, b)
    if r.stderr == 0:  # the points on one line
        return _point_p(r.slope - value, alternative)
    t = (r.slope - value) / r.stderr
    dist = sps.t(len(a) - 2)
    return float(
        {"two-sided": 2 * dist.sf(abs(t)), "greater": dist.sf(t), "less": dist.cdf(t)}[alternative]
    )


def slope_above(x: Sequence[float], y: Sequence[float], threshold: float) -> Test:
    """The claim ``slope > threshold``."""
    return _side(slope(x, y), threshold, _slope_p(x, y, threshold, "two-sided"))


def slope_within(x: Sequence[float], y: Sequence[float], centre: float, margin: float) -> Test:
    """The claim ``|slope − centre| < margin`` (equivalence, :func:`_within`)."""
    return _within(slope(x, y), centre, margin, lambda v, alt: _slope_p(x, y, v, alt))


# -- a statistic of seeds, left out one at a time -------------------------------------------------


def jackknife(n: int, statistic) -> np.ndarray:
    """``statistic(idx)`` on each of the ``n`` sets of seeds' indices that leave one seed out;
    ``statistic`` takes an array of indices into the seeds and returns a positive number. Needs
    two seeds."""
    if n < 2:
        raise ValueError(f"a jackknife needs two seeds ({n} given)")
    every = np.arange(n)
    return np.array([statistic(np.delete(every, i)) for i in range(n)], dtype=float)


def jackknife_t(loo: np.ndarray, point: float, n: int) -> tuple[Interval, float]:
    """The 95% jackknife-t interval of a positive statistic of ``n`` seeds (``point`` on every
    seed, ``loo`` its :func:`jackknife` values) on the log scale, log point ± t(n − 1)·se with
    se² = (n − 1)/n · Σ(log loo − their mean)² (where the statistic is a geometric mean of
    per-seed ratios, the t interval of their logs), and se; NaN ends where it has no value. Its
    coverage at 3, 6 and 8 seeds is checked by simulation (tests/test_study_steps_to_target.py),
    where the percentile bootstrap's 95% covers about 75% and 86% at 3 and 6."""
    logs = np.log(np.asarray(loo, dtype=float))
    if not math.isfinite(point) or point <= 0 or not np.isfinite(logs).all():
        return Interval("jackknife-t", n, float(point), math.nan, math.nan), math.nan
    se = float(np.sqrt((n - 1) / n * np.sum((logs - logs.mean()) ** 2)))
    half = float(sps.t.ppf(1 - ALPHA / 2, n - 1)) * se
    low, high = math.exp(math.log(point) - half), math.exp(math.log(point) + half)
    return Interval("jackknife-t", n, float(point), low, high), se


def band(loo: np.ndarray, point: float, low: float, high: float, n: int) -> Test:
    """The claim ``low < value < high`` read from :func:`jackknife_t`'s interval: replayed when
    it lies inside (low, high), not replayed when wholly outside; ``p_for``: twice the larger
    one-sided t p against the two ends; ``p_against``: the two-sided t p against the end the
    estimate lies beyond."""
    if point == 0 and not np.any(loo):  # 0 on every set of seeds (none reached a target)
        return Test(Interval("jackknife-t", n, 0.0, 0.0, 0.0), 1.0, 0.0 if low > 0 else 1.0)
    iv, se = jackknife_t(loo, point, n)
    if not math.isfinite(iv.low):
        return Test(iv, 1.0, 1.0)
    centre = math.log(point)

    def below(end: float) -> float:  # the one-sided p of "value < end"
        if end <= 0 or end == math.inf:
            return 1.0 if end <= 0 else 0.0
        if se == 0:
            return 0.0 if centre < math.log(end) else 1.0
        return float(sps.t.cdf((centre - math.log(end)) / se, n - 1))

    p_for = min(1.0, 2 * max(below(high), 1 - below(low)))
    p_against = 1.0
    if point >= high:
        p_against = min(1.0, 2 * (1 - below(high)))
    elif point <= low:
        p_against = min(1.0, 2 * below(low))
    return Test(iv, p_for, p_against)


# -- steps to a target: S(B) = S_min (1 + B_crit/B) over seeds ------------------------------------


@dataclass(frozen=True)
class Fit:
    """S(B) = S_min (1 + B_crit/B), E(B) = B·S(B) = E_min (1 + B/B_crit), B_crit = E_min/S_min;
    ``rms`` the root-mean-square relative residual of the fitted steps."""

    s_min: float
    e_min: float
    b_crit: float
    rms: float
    points: int

    def steps(self, batch):
        """The predicted steps at ``batch`` (a number or an array)."""
        return self.s_min + self.e_min / np.asarray(batch, dtype=float)


def fit_steps(batches: Sequence[float], steps: Sequence[float]) -> Fit | None:
    """Least squares of S(B) = S_min + E_min/B in relative error, min Σ ((S(B_i) − S_i)/S_i)²,
    over S_min, E_min ≥ 0 (linear in them: rows (1/S_i, 1/(B_i S_i)), target 1); then
    B_crit = E_min/S_min (∞ when S_min = 0: perfect scaling over the whole range; 0 when
    E_min = 0: no step saved by any batch). None with fewer than two points."""
    b = np.asarray(batches, dtype=float)
    s = np.asarray(steps, dtype=float)
    keep = np.isfinite(b) & np.isfinite(s) & (s > 0) & (b > 0)
    b, s = b[keep], s[keep]
    if len(b) < 2:
        return None
    a = np.stack([1 / s, 1 / (b * s)], axis=1)
    one = np.ones(len(b))

    def residual(x: np.ndarray) -> float:
        return float(np.sum((a @ x - one) ** 2))

    x = np.linalg.lstsq(a, one, rcond=None)[0]
    if (x < 0).any():  # the optimum lies on an edge of S_min, E_min ≥ 0: the better edge
        edges = [
            np.array([one @ a[:, 0] / (a[:, 0] @ a[:, 0]), 0.0]),
            np.array([0.0, one @ a[:, 1] / (a[:, 1] @ a[:, 1])]),
        ]
        x = min(edges, key=residual)
    s_min, e_min = float(x[0]), float(x[1])
    b_crit = e_min / s_min if s_min > 0 else math.inf
    rms = math.sqrt(residual(x) / len(b))
    return Fit(s_min, e_min, b_crit, rms, len(b))


def gmean(values) -> float:
    """The geometric mean (NaN where one value is NaN)."""
    return float(np.exp(np.log(np.asarray(values, dtype=float)).mean()))


@dataclass(frozen=True)
class SeedSteps:
    """Each k's steps to the target at its chosen lr, seed by seed: ``batches`` (one per k),
    ``steps`` and ``noise`` (B_noise at the target) as k × seed arrays (NaN: never reached, or
    not measured), over the measuring ``seeds`` that ran at every k. The fit and its jackknife
    resample the seeds (columns) together: a seed's runs at every k move as one."""

    batches: np.ndarray
    steps: np.ndarray
    noise: np.ndarray
    seeds: tuple[int, ...]

    @classmethod
    def of(cls, runs) -> SeedSteps:
        """From one run per (k, seed) (a DataFrame: k, batch_size, seed, steps_to_target,
        b_noise_target), over the seeds that ran at every k."""
        r = runs.assign(k=runs["k"].astype(float))
        ks = sorted(set(r["k"]))
        seeds = sorted(set.intersection(*(set(r[r["k"] == k]["seed"]) for k in ks)))
        r = r[r["seed"].isin(seeds)]

        def table(column: str) -> np.ndarray:
            t = r.pivot(index="k", columns="seed", values=column)
            return t.reindex(index=ks, columns=seeds).to_numpy(dtype=float)

        batches = r.groupby("k")["batch_size"].first().reindex(ks).to_numpy(dtype=float)
        return cls(
            batches, table("steps_to_target"), table("b_noise_target"), tuple(map(int, seeds))
        )

    def means(self, idx=None) -> np.ndarray:
        """Per k, the geometric mean of the steps over the seeds ``idx`` (None: all); NaN where
        one never reached the target."""
        st = self.steps if idx is None else self.steps[:, idx]
        return np.exp(np.log(st).mean(axis=1))

    def fit(self, idx=None) -> Fit | None:
        """S(B) = S_min (1 + B_crit/B) through :meth:`means` (a k with a seed never reaching
        the target left out)."""
        return fit_steps(self.batches, self.means(idx))

    def jackknife(self, statistic) -> np.ndarray:
        """``statistic(idx)`` leaving out one seed at a time (:func:`jackknife`)."""
        return jackknife(len(self.seeds), statistic)

    def interval(self, statistic) -> Interval:
        """The jackknife-t interval of ``statistic`` (:func:`jackknife_t`)."""
        every = np.arange(len(self.seeds))
        return jackknife_t(self.jackknife(statistic), statistic(every), len(self.seeds))[0]
