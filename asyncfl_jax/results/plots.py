"""The curves of a History's hyper-parameter points and the comparison figure (:func:`plot_accuracy`)."""

from __future__ import annotations

import warnings
from typing import Any, Sequence

import numpy as np

from asyncfl_jax.results.history import History


def point_curves(history: History, metric: str | None = None) -> list[dict[str, Any]]:
    """The curves :func:`plot_accuracy` draws for one History, one per hyper-parameter point: ``label``, ``point``
    (:class:`Point`), ``n`` (seeds averaged), ``mean``/``lo``/``hi`` (float [E]: mean, min and max over the point's
    non-diverged seeds; NaN where none is finite), the x axes ``time``/``step``/``uploads`` (the mean over those
    seeds; over all the point's seeds when every one diverged) and ``diverged`` (``(seed, step)`` pairs)."""
    metric = history._metric(metric)
    out = []
    points = history.points()
    for p in points:
        idx = np.asarray(p.replicas)
        alive = idx[history.diverged_at[idx] < 0]
        values = np.asarray(history.metrics[metric][alive], dtype=np.float64)
        values = np.where(np.isfinite(values), values, np.nan)
        axis_rows = alive if alive.size else idx
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # columns without a finite value give NaN
            mean = np.nanmean(values, axis=0) if alive.size else np.full(len(history.steps), np.nan)
            lo = np.nanmin(values, axis=0) if alive.size else mean
            hi = np.nanmax(values, axis=0) if alive.size else mean
        name = history.label if len(points) == 1 or not p.name else f"{history.label} {p.name}"
        out.append({"label": name, "point": p, "n": int(alive.size), "mean": mean, "lo": lo, "hi": hi,
                    "time": np.mean(history.times[axis_rows], axis=0), "step": np.asarray(history.steps),
                    "uploads": np.mean(history.uploads[axis_rows], axis=0),
                    "diverged": [(int(history.seeds[r]), int(history.diverged_at[r])) for r in idx
                                 if history.diverged_at[r] >= 0]})
    return out


def plot_accuracy(histories: Sequence[History], path: str | None = None, metric: str | None = None,
                  title: str | None = None, band: str = "minmax", axes: Sequence[str] | None = None,
                  labels: Sequence[str] | None = None):
    """The figure comparing the methods of ``histories`` (one or several runs, of one or several results folders):
    ``metric`` (default: each History's :attr:`~History.headline`) against client uploads, virtual time and local
    steps trained, one panel each; one line per (run, hyper-parameter point) with a band over its non-diverged seeds
    (``band``: ``"minmax"``, the default, or ``"std"`` = mean ± std), a colour per method kept across the panels, one legend for
    the figure, the y-axis fitted to the data, ``title`` (e.g. :func:`asyncfl_jax.figures.setting_title` of the
    configuration) above. See :func:`asyncfl_jax.figures.plot_comparison`. Returns the matplotlib figure; with
    ``path`` it is also saved (atomically): ``.png``, ``.pdf``, or both when ``path`` has no suffix."""
    from asyncfl_jax.figures import DEFAULT_AXES, plot_comparison

    return plot_comparison(histories, path, metric=metric, axes=tuple(axes or DEFAULT_AXES), band=band, title=title,
                           labels=labels)
