"""Figures that compare methods: several Histories (one or more results folders) in one figure.

:func:`plot_comparison` draws a metric (default: the headline, ``test_accuracy``) against client uploads, virtual time
and local computation (local steps trained), one panel each:

* one line per method (a History's label, and its hyper-parameter point when it sweeps one): the mean over its seeds
  that did not diverge, with a band over those seeds: their minimum to maximum (``band="minmax"``, the default) or
  the mean ± one standard deviation (``band="std"``); drawn with at least two seeds. The x position of a point is the mean
  over the same seeds (uploads are equal between seeds; virtual time and local steps may differ);
* a colour per method, the same in every panel; one legend for the whole figure (below the panels) naming the method
  and its number of seeds (and diverged seeds, which are left out of the mean and the band);
* the y-axis fitted to the data: it spans the lines and bands from the first evaluation after the first 10% of each
  curve on (so the initial model's accuracy near chance does not squash the range where the methods differ), with a
  5% margin; ``ylim`` sets it explicitly;
* the setting in the title (``title``; :func:`setting_title` writes one from a configuration: dataset, clients,
  partition, model, local training, delay model) and axis labels with units: uploads (client results received),
  virtual time (delay-model time units: a job of speed factor 1 and unit noise takes 1), local steps (minibatch
  gradients trained by the uploaded jobs, :attr:`~asyncfl_jax.results.History.local_steps`).

A panel is left out when no History has its axis (``local_steps`` of a History read from files older than the
field). :func:`save_figure_files` writes PNG and PDF. ``asyncfl plot RUN_DIR... --out FIG`` is this function on the
folders' Histories. This module reads Histories through their attributes only (no import of :mod:`asyncfl_jax.results`,
which calls it for ``accuracy.png``).
"""

from __future__ import annotations

import math
import os
import warnings
from typing import Any, Mapping, Sequence

import numpy as np

from asyncfl_jax.atomic import write_atomic

AXES = {"uploads": "client uploads (results received)",
        "time": "virtual time (delay-model time units)",
        "local_steps": "local computation (local steps trained)",
        "step": "server steps"}
"""x axes :func:`plot_comparison` can draw, with their labels."""
DEFAULT_AXES = ("uploads", "time", "local_steps")
BANDS = ("std", "minmax")
TAIL_START = 0.1
"""The y-axis is fitted to the evaluations after this fraction of each curve's x range."""


def method_curves(history: Any, metric: str | None = None, band: str = "minmax") -> list[dict[str, Any]]:
    """One curve per hyper-parameter point of ``history``: ``label``, ``n`` (seeds averaged), ``diverged`` (seeds),
    ``mean``/``lo``/``hi`` (float [E]: the mean and the band over the non-diverged seeds; NaN where none is finite),
    and the x values of each axis of :data:`AXES` present (the mean over the same seeds)."""
    if band not in BANDS:
        raise ValueError(f"band must be one of {list(BANDS)}, got {band!r}")
    metric = history._metric(metric)
    points = history.points()
    axes = {"uploads": history.uploads, "time": history.times,
            "step": np.broadcast_to(np.asarray(history.steps), history.uploads.shape)}
    if getattr(history, "local_steps", None) is not None:
        axes["local_steps"] = history.local_steps
    out = []
    for p in points:
        idx = np.asarray(p.replicas)
        alive = idx[np.asarray(history.diverged_at)[idx] < 0]
        rows = alive if alive.size else idx
        values = np.asarray(history.metrics[metric][alive], dtype=np.float64)
        values = np.where(np.isfinite(values), values, np.nan)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # an evaluation without a finite value gives NaN
            mean = np.nanmean(values, axis=0) if alive.size else np.full(len(history.steps), np.nan)
            if band == "std":
                std = np.nanstd(values, axis=0) if alive.size else mean
                lo, hi = mean - std, mean + std
            else:
                lo = np.nanmin(values, axis=0) if alive.size else mean
                hi = np.nanmax(values, axis=0) if alive.size else mean
        label = history.label if len(points) == 1 or not p.name else f"{history.label} {p.name}"
        curve = {"label": label, "metric": metric, "n": int(alive.size), "diverged": int(idx.size - alive.size),
                 "mean": mean, "lo": lo, "hi": hi}
        curve.update({k: np.mean(np.asarray(v, dtype=np.float64)[rows], axis=0) for k, v in axes.items()})
        out.append(curve)
    return out


def fitted_ylim(curves: Sequence[Mapping[str, Any]], key: str = "uploads", tail_start: float = TAIL_START,
                margin: float = 0.05) -> tuple[float, float] | None:
    """The y range of the curves' lines and bands over the evaluations whose ``key`` value is at least
    ``tail_start`` of the way along the curve (the first evaluation excluded whatever the fraction), widened by
    ``margin`` of the range on each side; None when nothing is finite."""
    lows, highs = [], []
    for c in curves:
        x = np.asarray(c[key] if key in c else np.arange(len(c["mean"])), dtype=np.float64)
        if x.size == 0:
            continue
        start = x[0] + tail_start * (x[-1] - x[0])
        keep = (x >= start) & (np.arange(x.size) > 0) if x.size > 1 else np.ones(1, bool)
        for arr in (c["mean"], c["lo"], c["hi"]):
            v = np.asarray(arr, dtype=np.float64)[keep]
            v = v[np.isfinite(v)]
            if v.size:
                lows.append(v.min())
                highs.append(v.max())
    if not lows:
        return None
    lo, hi = min(lows), max(highs)
    pad = margin * (hi - lo) if hi > lo else max(abs(hi) * margin, 1e-3)
    return lo - pad, hi + pad


def plot_comparison(histories: Sequence[Any], path: str | None = None, metric: str | None = None,
                    axes: Sequence[str] = DEFAULT_AXES, band: str = "minmax", title: str | None = None,
                    ylim: tuple[float, float] | None = None, labels: Sequence[str] | None = None):
    """One figure comparing the methods of ``histories`` (see the module docstring). ``labels``: a legend name per
    History instead of its label (e.g. to tell two folders' runs of one algorithm apart). Returns the matplotlib
    figure; with ``path`` it is also written (:func:`save_figure_files`: the format from the suffix, ``.png`` or
    ``.pdf``; without a suffix both)."""
    if not histories:
        raise ValueError("plot_comparison needs at least one History")
    if labels is not None and len(labels) != len(histories):
        raise ValueError(f"labels must name each of the {len(histories)} histories, got {len(labels)}")
    curves = []
    for i, h in enumerate(histories):
        for c in method_curves(h, metric, band):
            if labels is not None:
                c["label"] = labels[i] if c["label"] == h.label else f"{labels[i]} {c['label'][len(h.label) + 1:]}"
            curves.append(c)
    return draw_curves(curves, path, axes=axes, band=band, title=title, ylim=ylim)


def seed_curve(label: str, runs: Sequence[Mapping[str, Any]], y: str = "accuracy",
               axes: Mapping[str, str] | None = None, band: str = "minmax") -> dict[str, Any]:
    """The curve of one method from per-seed records (the reproductions' dicts: equal-length arrays ``y`` and the x
    keys ``axes`` maps to, e.g. ``{"uploads": "uploads", "time": "times"}``), for :func:`draw_curves`: the mean over
    the seeds with the band of ``band``; an x position is the mean over the seeds."""
    if band not in BANDS:
        raise ValueError(f"band must be one of {list(BANDS)}, got {band!r}")
    if not runs:
        raise ValueError(f"seed_curve {label!r}: no runs")
    axes = dict(axes or {"uploads": "uploads", "time": "times"})
    values = np.asarray([np.asarray(r[y], dtype=np.float64) for r in runs])
    values = np.where(np.isfinite(values), values, np.nan)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        mean = np.nanmean(values, axis=0)
        if band == "std":
            std = np.nanstd(values, axis=0)
            lo, hi = mean - std, mean + std
        else:
            lo, hi = np.nanmin(values, axis=0), np.nanmax(values, axis=0)
    curve = {"label": label, "metric": y, "n": len(runs), "diverged": 0, "mean": mean, "lo": lo, "hi": hi}
    curve.update({axis: np.mean([np.asarray(r[key], dtype=np.float64) for r in runs], axis=0)
                  for axis, key in axes.items()})
    return curve


def draw_curves(curves: Sequence[dict[str, Any]], path: str | None = None, axes: Sequence[str] = DEFAULT_AXES,
                band: str = "minmax", title: str | None = None, ylim: tuple[float, float] | None = None):
    """The figure of :func:`plot_comparison` from curves (:func:`method_curves`, :func:`seed_curve`): one panel per
    axis of ``axes`` that some curve has, a colour per curve kept across the panels, one legend below them, the
    y-axis fitted (:func:`fitted_ylim`) unless ``ylim`` is given, ``title`` above. Returns the figure; with ``path``
    it is also written (:func:`save_figure_files`)."""
    unknown = [a for a in axes if a not in AXES]
    if unknown or not axes:
        raise ValueError(f"axes must be a non-empty list of {list(AXES)}, got {list(axes)!r}")
    if band not in BANDS:
        raise ValueError(f"band must be one of {list(BANDS)}, got {band!r}")
    import matplotlib

    if path is not None:
        matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    curves = [dict(c) for c in curves]
    _unique_labels(curves)
    shown = [a for a in axes if any(a in c for c in curves)]
    if not shown:
        raise ValueError(f"no curve has the axes {list(axes)}")
    colours = plt.rcParams["axes.prop_cycle"].by_key().get("color", ["C0"])
    fig, panels = plt.subplots(1, len(shown), figsize=(4.6 * len(shown), 3.9), squeeze=False, layout="constrained")
    panels = panels[0]
    handles = []
    for k, c in enumerate(curves):
        colour = colours[k % len(colours)]
        legend = f"{c['label']} ({c['n']} seed{'s' if c['n'] != 1 else ''}"
        legend += f", {c['diverged']} diverged)" if c["diverged"] else ")"
        handle = None
        for ax, key in zip(panels, shown):
            if key not in c:
                continue
            (line,) = ax.plot(c[key], c["mean"], color=colour, lw=1.6, label=legend)
            handle = handle or line
            if c["n"] > 1:
                ax.fill_between(c[key], c["lo"], c["hi"], color=colour, alpha=0.2, lw=0)
        if handle is not None:
            handles.append(handle)
    metrics = sorted({c["metric"] for c in curves})
    ylabel = " / ".join(metrics).replace("_", " ")
    limits = ylim if ylim is not None else fitted_ylim(curves, key=shown[0])
    for ax, key in zip(panels, shown):
        ax.set_xlabel(AXES[key])
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        if limits is not None:
            ax.set_ylim(*limits)
    band_text = "mean ± std over seeds" if band == "std" else "mean, min-max over seeds"
    fig.suptitle(f"{title}\n{ylabel} ({band_text})" if title else f"{ylabel} ({band_text})", fontsize="medium")
    fig.legend(handles=handles, loc="outside lower center", ncol=min(len(handles), 4), fontsize="small",
               frameon=False)
    if path is not None:
        save_figure_files(fig, path)
    return fig


def _unique_labels(curves: list[dict[str, Any]]) -> None:
    """Numbers repeated labels (``fedbuff``, ``fedbuff [2]``), so that every line has its own legend entry."""
    seen: dict[str, int] = {}
    for c in curves:
        count = seen.get(c["label"], 0) + 1
        seen[c["label"]] = count
        if count > 1:
            c["label"] = f"{c['label']} [{count}]"


OTHER_IMAGE_SUFFIXES = (".svg", ".jpg", ".jpeg", ".eps", ".ps", ".tif", ".tiff", ".gif", ".webp", ".bmp")
"""Image formats a figure is not written in (refused rather than written as PNG under that name)."""


def save_figure_files(fig: Any, path: str, dpi: int = 150) -> list[str]:
    """Writes ``fig`` atomically as ``path`` when it ends in ``.png`` or ``.pdf``, else as ``path.png`` and
    ``path.pdf`` (another image suffix, e.g. ``.svg``, is refused); closes the figure; returns the paths written."""
    import io

    import matplotlib.pyplot as plt

    suffix = os.path.splitext(path)[1].lower()
    if suffix in OTHER_IMAGE_SUFFIXES:
        raise ValueError(f"a figure is written as .png or .pdf (or both, without a suffix), got {path!r}")
    targets = [path] if suffix in (".png", ".pdf") else [f"{path}.png", f"{path}.pdf"]
    for target in targets:
        buf = io.BytesIO()
        fig.savefig(buf, format=os.path.splitext(target)[1][1:].lower(), dpi=dpi)
        write_atomic(target, buf.getvalue())
    plt.close(fig)
    return targets


def setting_title(config: Mapping[str, Any]) -> str:
    """A one-line description of an experiment's setting from its configuration (``config.json``'s dict):
    dataset, number of clients, partition, model, local training and delay model, e.g.
    ``fashion_mnist, n=100, dirichlet(0.3), mlp; K=10, B=32; speed uniform[0.5, 5] x half_normal noise``."""
    data, model = config.get("data", {}), config.get("model", {})
    local, delays = config.get("local", {}), config.get("delays", {})
    partition = data.get("partition", "?")
    if partition in ("dirichlet", "dirichlet_sampled"):
        partition = f"{partition}({data.get('dirichlet_alpha')})"
    parts = [f"{data.get('name', '?')}, n={data.get('num_clients', '?')}, {partition}, {model.get('name', '?')}"]
    if local:
        k = f"{local.get('epochs')} epochs (K<={local.get('steps')})" if local.get("epochs") else f"K={local.get('steps')}"
        batch = local.get("batch_size")
        parts.append(f"{k}, B={'full' if batch is None else batch}")
    if delays:
        parts.append(f"delays: {_speed_text(delays)} x {delays.get('noise', '?')} noise")
    return "; ".join(parts)


def _speed_text(delays: Mapping[str, Any]) -> str:
    speed = delays.get("speed", "?")
    if speed == "uniform":
        return f"speed uniform[{_num(delays.get('speed_low'))}, {_num(delays.get('speed_high'))}]"
    if speed == "lognormal":
        return f"speed lognormal(sigma={_num(delays.get('speed_sigma'))})"
    if speed in ("constant", "exponential"):
        return f"speed {speed}({_num(delays.get('speed_value'))})"
    return f"speed {speed}"


def _num(value: Any) -> str:
    return f"{value:g}" if isinstance(value, (int, float)) and math.isfinite(value) else str(value)


def run_settings(config: Mapping[str, Any]) -> dict[str, str]:
    """Each run's protocol in words, by run label (for legends): ``Mc=20, M=10`` (concurrent), ``all active``,
    ``event clock``, ``rounds of 20`` (synchronous)."""
    out = {}
    for run in config.get("runs", []):
        p = run.get("protocol", {})
        name = p.get("name")
        if name == "concurrent":
            text = f"Mc={p.get('concurrency')}, " + (f"M={p.get('buffer_size')}" if p.get("aggregation", "count") ==
                                                     "count" else f"{p.get('aggregation')} clock")
        elif name == "synchronous":
            text = f"rounds of {p.get('participants') or 'all'}"
        else:
            text = str(name).replace("_", " ")
        out[run.get("label") or run.get("algorithm")] = text
    return out


