"""Evaluation curves and the numbers read from them: values on a common grid, first passages of a target, final
values, means over seeds, and the choice of one value of a hyper-parameter grid."""

from __future__ import annotations

import math
from typing import Any, Iterable, Mapping, Sequence

import numpy as np


def value_on_grid(x: Sequence[float], values: Sequence[float], grid: np.ndarray) -> np.ndarray:
    """The value in effect at each grid point: the latest evaluation at or before it (the first one before the
    first evaluation)."""
    x, values = np.asarray(x, dtype=np.float64), np.asarray(values, dtype=np.float64)
    return values[np.clip(np.searchsorted(x, grid, side="right") - 1, 0, len(values) - 1)]


def mean_on_grid(records: Iterable[Mapping[str, Any]], grid: np.ndarray, x: str = "times",
                 y: str = "accuracy") -> np.ndarray:
    """Mean over runs of :func:`value_on_grid` (each run a record with the evaluation positions ``x`` and values
    ``y``)."""
    return np.mean([value_on_grid(r[x], r[y], grid) for r in records], axis=0)


def mean_of_aligned(records: Sequence[Mapping[str, Any]], x: str, y: str = "accuracy") -> tuple[np.ndarray, np.ndarray]:
    """``(x, mean y)`` of runs evaluated at the same positions (those of the first run)."""
    return np.asarray(records[0][x], float), np.mean([r[y] for r in records], axis=0)


def first_reach(values: np.ndarray, positions: np.ndarray, target: float) -> np.ndarray:
    """float [R]: for each row of ``values`` [R, E], its ``positions`` (broadcast to [R, E]) at the first evaluation
    with ``values >= target``; NaN if never."""
    reached = values >= target
    first = np.argmax(reached, axis=1)
    out = np.asarray(positions, dtype=np.float64)
    out = np.broadcast_to(out, values.shape)[np.arange(values.shape[0]), first]
    return np.where(reached.any(axis=1), out, np.nan)


def first_passage(positions: Sequence[float], values: Sequence[float], target: float | None) -> float | None:
    """The position of the first evaluation with ``value >= target``; None if never (or no target)."""
    if target is None:
        return None
    reached = first_reach(np.asarray(values, dtype=np.float64)[None, :], np.asarray(positions), target)[0]
    return None if np.isnan(reached) else float(reached)


def final_value(values: Sequence[float], window: int) -> float:
    """Mean of the last ``window`` evaluations; NaN when any is not finite (a diverged run)."""
    tail = np.asarray(values, dtype=np.float64)[-window:]
    return float(tail.mean()) if np.all(np.isfinite(tail)) else math.nan


def finite_mean_std(values: Iterable[float | None]) -> tuple[float | None, float | None, int]:
    """``(mean, std, count)`` of the finite values (None and NaN left out; ``(None, None, 0)`` if none); the std is
    the population one (``ddof = 0``)."""
    a = np.array([np.nan if v is None else v for v in values], dtype=np.float64)
    finite = a[np.isfinite(a)]
    if not finite.size:
        return None, None, 0
    return float(finite.mean()), float(finite.std()), int(finite.size)


def mean_if_all(values: np.ndarray) -> float | None:
    """The mean over seeds, None unless every value is finite (every seed reached the target)."""
    return float(np.mean(values)) if np.isfinite(values).all() else None


def best_on_grid(tail: np.ndarray, diverged: np.ndarray) -> tuple[int, np.ndarray]:
    """The grid value with the best final accuracy and the final accuracy of every value.

    ``tail`` [S, G]: each seed's final accuracy at each grid value (NaN counts as 0); ``diverged`` [S, G]: the runs
    that diverged. A value that diverged on some seed ranks below every other; among the rest the highest mean over
    seeds wins (the first on ties)."""
    final = np.where(np.isfinite(tail), tail, 0.0).mean(axis=0)
    best = max(range(final.size), key=lambda g: (not diverged[:, g].any(), final[g]))
    return best, final


def fewest_on_grid(cost: np.ndarray, diverged: np.ndarray) -> int | None:
    """The grid value with the lowest mean ``cost`` [S, G] (e.g. bits to a target) among those that reached the
    target (finite cost) on every seed and never diverged; None if no value did."""
    ok = [g for g in range(cost.shape[1]) if np.isfinite(cost[:, g]).all() and not diverged[:, g].any()]
    return min(ok, key=lambda g: cost[:, g].mean()) if ok else None
