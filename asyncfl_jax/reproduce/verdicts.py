"""Honest verdicts on a paper's claims: does the direction hold, by how much in units of the seed noise, on how many
seeds, at which equal budget, and had the curves flattened?

Every reproduction compares a method with a baseline on several seeds (the same seeds, hence the same data split,
arrival schedules and initial model, for both). One claim is read as follows.

* **Values.** Each seed gives one number per method: the mean test accuracy over the evaluations in the last
  ``window`` (10%) of a common budget (:func:`value_at_budget`). The budget is the largest position every run of
  both methods reached on the axis of the comparison: client uploads, virtual time, or local computation (local
  steps trained; a gradient-uploading method does one per upload, a method with ``K`` local steps ``K``), or, for a
  claim about communication, the cumulative uploaded bits.
* **Gap and noise.** ``gap = mean(method) - mean(baseline)`` (the sign flipped for a lower-is-better metric), and the
  seed spread ``s = sqrt((s_m^2 + s_b^2) / 2)``, the pooled sample standard deviation (``ddof = 1``) of one run's value
  over seeds (:func:`seed_spread`); the table shows ``gap / s``.
* **Outcome** (:func:`outcome`): ``holds`` when ``gap > 2 s``, ``reversed`` when ``gap < -2 s``, ``within noise``
  otherwise, and ``one seed`` when ``s`` cannot be estimated. A gap within twice the noise is never called a win,
  whatever its sign; such a claim asks for five seeds (:data:`SEEDS_WITHIN_NOISE`), which the table says when it ran
  fewer.
* **Flattened** (:func:`curve_flattened`): a mean curve over seeds has flattened when the least-squares line through
  its evaluations in the last ``window`` (20%) of its axis rises by at most ``tolerance`` (half a point of accuracy)
  across that window. A claim whose curves still rise is about a run that was cut short, and the table says so.

Participation skew, the heterogeneity ACE/ACED and AREA are about, is reported as the share of all uploads made by
the fastest 20% of the clients (:func:`fastest_share`; fastest = the smallest expected job time of the delay model).
Under uniform participation it is 20%.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Mapping, Sequence

import numpy as np

NOISE_MULTIPLE = 2.0
"""A gap counts (for or against a claim) only beyond this many seed spreads."""
SEEDS_WITHIN_NOISE = 5
"""Seeds a claim needs when its gap is within :data:`NOISE_MULTIPLE` seed spreads."""
FINAL_WINDOW = 0.1
"""A run's value at a budget: the mean of its evaluations in the last 10% of the budget."""
FLAT_WINDOW = 0.2
"""A curve has flattened when it rises little over the last 20% of its axis ..."""
FLAT_TOLERANCE = 0.005
"""... namely by at most half a point of accuracy (the least-squares rise across that window)."""
FASTEST_FRACTION = 0.2
"""The participation skew is the share of uploads made by this fraction of the fastest clients."""
FIGURE_DPI = 90
"""Resolution of the verdict figures (a three-panel PNG of about 100 KB, small enough for the docs)."""
BUDGET_AXES = {"uploads": "equal uploads", "times": "equal virtual time", "local_steps": "equal local computation",
               "bits": "equal bits sent"}
"""Record keys of the axes a comparison can be made at, with their names in the tables (``bits``: cumulative
uploaded bits, for a paper's communication claim)."""


# ------------------------------------------------------------------------------------------------ numbers
def seed_spread(method: Sequence[float], baseline: Sequence[float]) -> float:
    """The pooled sample standard deviation ``sqrt((s_m^2 + s_b^2) / 2)`` (``ddof = 1``) of one run's value over
    seeds; NaN when either side has fewer than two seeds."""
    a, b = np.asarray(method, dtype=np.float64), np.asarray(baseline, dtype=np.float64)
    if a.size < 2 or b.size < 2:
        return math.nan
    return float(math.sqrt((a.var(ddof=1) + b.var(ddof=1)) / 2.0))


def outcome(gap: float, spread: float, multiple: float = NOISE_MULTIPLE) -> str:
    """``"holds"`` (``gap > multiple * spread``), ``"reversed"`` (``gap < -multiple * spread``), ``"within noise"``
    (otherwise), ``"one seed"`` (``spread`` NaN: no estimate of the noise, so no verdict either way) or
    ``"diverged"`` (``gap`` NaN: some run diverged)."""
    if math.isnan(gap):
        return "diverged"
    if not math.isfinite(spread):
        return "one seed"
    if gap > multiple * spread:
        return "holds"
    if gap < -multiple * spread:
        return "reversed"
    return "within noise"


def value_at_budget(x: Sequence[float], y: Sequence[float], budget: float, window: float = FINAL_WINDOW) -> float:
    """A run's value at ``budget`` on axis ``x``: the mean of ``y`` over the evaluations with
    ``(1 - window) budget <= x <= budget``, or the latest evaluation at or before ``budget`` when none is in the
    window; NaN when any of them is not finite (a diverged run) or none is at or before ``budget``."""
    x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    keep = (x >= (1.0 - window) * budget) & (x <= budget)
    if not keep.any():
        before = np.nonzero(x <= budget)[0]
        if not before.size:
            return math.nan
        keep = np.zeros(x.size, bool)
        keep[before[-1]] = True
    tail = y[keep]
    return float(tail.mean()) if np.all(np.isfinite(tail)) else math.nan


def common_budget(runs: Sequence[Mapping[str, Any]], axis: str) -> float:
    """The largest position on ``axis`` that every run reached: the minimum over runs of its last value."""
    return float(min(np.asarray(r[axis], dtype=np.float64)[-1] for r in runs))


def curve_flattened(x: Sequence[float], y: Sequence[float], window: float = FLAT_WINDOW,
                    tolerance: float = FLAT_TOLERANCE) -> bool:
    """Whether the curve ``y(x)`` has flattened: the least-squares slope of its evaluations in the last ``window`` of
    the x range, times the width of that window, is at most ``tolerance`` (a falling or noisy-but-level curve has
    flattened; one still rising has not). Fewer than three evaluations in the window: not flattened (no evidence)."""
    x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    ok = np.isfinite(x) & np.isfinite(y)
    x, y = x[ok], y[ok]
    if x.size < 3:
        return False
    start = x[-1] - window * (x[-1] - x[0])
    keep = x >= start
    if keep.sum() < 3 or np.ptp(x[keep]) == 0:
        return False
    slope = np.polyfit(x[keep], y[keep], 1)[0]
    return bool(slope * (x[-1] - start) <= tolerance)


def mean_curve(runs: Sequence[Mapping[str, Any]], axis: str, y: str = "accuracy") -> tuple[np.ndarray, np.ndarray]:
    """``(x, y)``: the mean over runs of ``axis`` and ``y`` (runs evaluated at the same steps)."""
    return (np.mean([np.asarray(r[axis], dtype=np.float64) for r in runs], axis=0),
            np.mean([np.asarray(r[y], dtype=np.float64) for r in runs], axis=0))


def fastest_share(uploads_per_client: Sequence[float], mean_job_time: Sequence[float],
                  fraction: float = FASTEST_FRACTION) -> float:
    """The share of all uploads made by the ``ceil(fraction n)`` clients with the smallest expected job time (ties
    broken by client index)."""
    counts = np.asarray(uploads_per_client, dtype=np.float64)
    times = np.asarray(mean_job_time, dtype=np.float64)
    if counts.shape != times.shape or counts.ndim != 1 or not counts.size:
        raise ValueError(f"need one upload count and one job time per client, got shapes {counts.shape} and "
                         f"{times.shape}")
    if not 0 < fraction <= 1:
        raise ValueError(f"fraction must be in (0, 1], got {fraction}")
    k = math.ceil(fraction * counts.size - 1e-9)
    fastest = np.argsort(times, kind="stable")[:k]
    total = counts.sum()
    return float(counts[fastest].sum() / total) if total > 0 else math.nan


def schedule_fastest_share(schedule: Any, delays: Any, seed: int, fraction: float = FASTEST_FRACTION) -> float:
    """:func:`fastest_share` of a schedule made with ``delays`` (a :class:`~asyncfl_jax.timing.DelayModel`) and timing
    seed ``seed``: the clients' expected job times are those of the speeds the schedule drew."""
    from asyncfl_jax.timing import client_speeds
    from asyncfl_jax.timing.stats import participation_counts

    speeds = client_speeds(schedule.num_clients, delays, seed)
    return fastest_share(participation_counts(schedule), delays.mean_duration(speeds), fraction)


# ------------------------------------------------------------------------------------------------ one claim
@dataclasses.dataclass(frozen=True)
class Verdict:
    """One claim checked at one equal budget (see the module docstring)."""

    claim: str
    budget: str  # a name of BUDGET_AXES, e.g. "equal uploads"
    method: float  # mean over seeds
    baseline: float
    gap: float  # method - baseline, in the claim's direction (positive: the claim's way)
    spread: float  # seed spread (NaN with one seed)
    seeds: int
    flattened: bool  # both mean curves had flattened
    paper: str = ""  # the paper's numbers for the claim, as text

    @property
    def outcome(self) -> str:
        """:func:`outcome` of the gap and the spread."""
        return outcome(self.gap, self.spread)

    @property
    def direction_holds(self) -> bool:
        """The measured gap points the claim's way (whatever its size)."""
        return self.gap > 0

    @property
    def gap_in_spread(self) -> float:
        """``gap / spread`` (NaN without a spread, +-inf with a zero one)."""
        if not math.isfinite(self.spread):
            return math.nan
        if self.spread == 0:
            return math.copysign(math.inf, self.gap) if self.gap else 0.0
        return self.gap / self.spread

    @property
    def needs_more_seeds(self) -> bool:
        """Within twice the noise (or one seed) on fewer than :data:`SEEDS_WITHIN_NOISE` seeds."""
        return self.outcome in ("within noise", "one seed") and self.seeds < SEEDS_WITHIN_NOISE


def compare(claim: str, method_runs: Sequence[Mapping[str, Any]], baseline_runs: Sequence[Mapping[str, Any]],
            axis: str = "uploads", y: str = "accuracy", higher_is_better: bool = True, paper: str = "",
            window: float = FINAL_WINDOW) -> Verdict:
    """The verdict on "method beats baseline" at an equal budget on ``axis`` (a key of :data:`BUDGET_AXES` that every
    run record has, beside ``y``): each run's value at the common budget, the gap of the means, the seed spread, and
    whether both mean curves had flattened by then."""
    if axis not in BUDGET_AXES:
        raise ValueError(f"axis must be one of {list(BUDGET_AXES)}, got {axis!r}")
    if not method_runs or not baseline_runs:
        raise ValueError(f"{claim}: each side needs at least one run")
    budget = common_budget([*method_runs, *baseline_runs], axis)
    a = [value_at_budget(r[axis], r[y], budget, window) for r in method_runs]
    b = [value_at_budget(r[axis], r[y], budget, window) for r in baseline_runs]
    sign = 1.0 if higher_is_better else -1.0
    gap = sign * (float(np.mean(a)) - float(np.mean(b)))
    flat = all(curve_flattened(*clip_curve(*mean_curve(runs, axis, y), budget)) for runs in (method_runs,
                                                                                            baseline_runs))
    return Verdict(claim, BUDGET_AXES[axis], float(np.mean(a)), float(np.mean(b)), gap, seed_spread(a, b),
                   min(len(a), len(b)), flat, paper)


def clip_curve(x: np.ndarray, y: np.ndarray, budget: float) -> tuple[np.ndarray, np.ndarray]:
    """The part of a curve at or before ``budget``."""
    keep = x <= budget
    return x[keep], y[keep]


# ------------------------------------------------------------------------------------------------ tables
VERDICT_HEADER = ["| claim | budget | method | baseline | gap (points) | gap / seed spread | seeds | direction | "
                  "verdict | curves flattened | paper |", "|---|---|---|---|---|---|---|---|---|---|---|"]


def verdict_row(v: Verdict, scale: float = 100.0) -> str:
    """One table row; accuracies in percent (``scale``)."""
    ratio = v.gap_in_spread
    ratio_text = "-" if math.isnan(ratio) else ("inf" if math.isinf(ratio) else f"{ratio:+.1f}")
    verdict = v.outcome + (f" (needs {SEEDS_WITHIN_NOISE} seeds)" if v.needs_more_seeds else "")
    return (f"| {v.claim} | {v.budget} | {scale * v.method:.2f} | {scale * v.baseline:.2f} | {scale * v.gap:+.2f} | "
            f"{ratio_text} | {v.seeds} | {'holds' if v.direction_holds else 'opposite'} | {verdict} | "
            f"{'yes' if v.flattened else 'no'} | {v.paper or '-'} |")


def verdict_lines(verdicts: Sequence[Verdict], title: str = "Verdicts on the paper's claims") -> list[str]:
    """A Markdown table of verdicts with the rule that reads it; empty without verdicts."""
    if not verdicts:
        return []
    return [f"**{title}** (gap = method - baseline in the claim's direction, each run's mean over the last "
            f"{FINAL_WINDOW:.0%} of the common budget; seed spread = pooled sample std over seeds; verdict: holds / "
            f"reversed beyond {NOISE_MULTIPLE:g} spreads, else within noise; flattened: the mean curves rose by at most "
            f"{100 * FLAT_TOLERANCE:g} points over the last {FLAT_WINDOW:.0%} of the budget)", "",
            *VERDICT_HEADER, *(verdict_row(v) for v in verdicts), ""]


def verdict_json(v: Verdict) -> dict[str, Any]:
    """A verdict as JSON-ready values (NaN as None)."""
    def num(x: float) -> float | None:
        return float(x) if math.isfinite(x) else None

    return {"claim": v.claim, "budget": v.budget, "method": num(v.method), "baseline": num(v.baseline),
            "gap": num(v.gap), "spread": num(v.spread), "gap_in_spread": num(v.gap_in_spread), "seeds": v.seeds,
            "direction_holds": v.direction_holds, "outcome": v.outcome, "needs_more_seeds": v.needs_more_seeds,
            "flattened": v.flattened, "paper": v.paper}


# ------------------------------------------------------------------------------------------------ several claims
def claim_verdicts(runs: Mapping[str, Sequence[Mapping[str, Any]]], claims: Sequence[tuple[str, str, str, str]],
                   y: str = "accuracy", axes: Sequence[str] = tuple(BUDGET_AXES)) -> list[Verdict]:
    """The verdicts of ``claims`` (``(claim text, method, baseline, the paper's numbers)``) on the runs of each
    method (``runs[method]``: one record per seed), at every equal budget of ``axes`` that every record of the two
    methods has; a claim whose method or baseline did not run is left out."""
    out = []
    for text, method, baseline, paper in claims:
        mine, theirs = runs.get(method) or [], runs.get(baseline) or []
        if not mine or not theirs:
            continue
        for axis in axes:
            if all(axis in r and r[axis] is not None for r in (*mine, *theirs)):
                out.append(compare(text, mine, theirs, axis=axis, y=y, paper=paper))
    return out


def plot_methods(runs: Mapping[str, Sequence[Mapping[str, Any]]], path: str, title: str, y: str = "accuracy",
                 labels: Mapping[str, str] | None = None) -> str:
    """The paper-style figure of a setting (:func:`asyncfl_jax.figures.draw_curves`, as ``asyncfl plot``): one line
    per method with a min-max band over its seeds, against uploads, virtual time and local steps (the axes every
    record has: ``uploads``, ``times``, ``local_steps``), the y-axis fitted to the data; written as a PNG at
    ``path``, which is returned."""
    from asyncfl_jax.figures import draw_curves, save_figure_files, seed_curve
    from asyncfl_jax.reproduce.report import pyplot

    keys = {"uploads": "uploads", "time": "times", "local_steps": "local_steps"}
    curves = []
    for method, recs in runs.items():
        if not recs:
            continue
        present = {axis: key for axis, key in keys.items() if all(r.get(key) is not None for r in recs)}
        curves.append(seed_curve((labels or {}).get(method, method), recs, y=y, axes=present))
    pyplot()  # the non-interactive backend
    fig = draw_curves(curves, None, axes=[a for a in keys if any(a in c for c in curves)], title=title)
    save_figure_files(fig, path, dpi=FIGURE_DPI)
    return path


def participation_line(shares: Mapping[str, float], fraction: float = FASTEST_FRACTION) -> str:
    """A sentence giving the share of uploads of the fastest clients per protocol (``{name: share}``)."""
    parts = ", ".join(f"{name} {share:.0%}" for name, share in shares.items())
    return (f"Share of uploads made by the fastest {fraction:.0%} of the clients (uniform participation: "
            f"{fraction:.0%}): {parts}.")
