"""Hyper-parameter points and their statistics over seeds: the replicas of a run that share every hyper-parameter
value form a point (:class:`Point`); a point's final or best metric is summarised over its seeds by
:func:`seed_stats` (diverged seeds reported apart, never averaged in)."""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import numpy as np

METRIC_COLUMNS = ("test_accuracy", "test_loss", "train_loss")  # the classification task's metrics (not exhaustive)


def swept_names(hparams: Sequence[dict[str, float]]) -> list[str]:
    """Names of the hyper-parameters whose value differs between replicas."""
    return [k for k in hparams[0] if len({h[k] for h in hparams}) > 1]


def headline_metric(names: Sequence[str]) -> str:
    """The metric a result is summarised by: ``test_accuracy`` when present, else ``test_loss``, else the first name
    ending in ``loss``, else the first name."""
    names = list(names)
    if not names:
        raise ValueError("no metrics to choose a headline metric from")
    for preferred in ("test_accuracy", "test_loss"):
        if preferred in names:
            return preferred
    return next((n for n in names if n.endswith("loss")), names[0])


def lower_is_better(metric: str) -> bool:
    """True for losses (names ending in ``loss``): their best value is the smallest."""
    return metric.endswith("loss")


def point_name(swept: dict[str, float]) -> str:
    """``name=value, ...`` of a point's swept hyper-parameters (``""`` when nothing is swept)."""
    return ", ".join(f"{k}={v:g}" for k, v in swept.items())


def label_name(label: dict[str, Any]) -> str:
    """``delays=lognormal, P=0.5`` of a replica's label (a string label, key ``setting``, by itself)."""
    return ", ".join(str(v) if k == "setting" else f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}"
                     for k, v in label.items())


@dataclasses.dataclass(frozen=True)
class Point:
    """One hyper-parameter point of a run: the replicas that share every hyper-parameter value (they differ by seed).

    Attributes:
      index: position among the run's points (first-seen order of the replicas).
      hparams: every hyper-parameter value of the point; ``swept``: those that differ between the run's points.
      replicas: indices of its replicas (into ``History.seeds``); ``seeds``: their seeds, in the same order.
      label: the label its replicas share (explicit replicas, ``History.labels``); ``{}`` without labels.
    """

    index: int
    hparams: dict[str, float]
    swept: dict[str, float]
    replicas: tuple[int, ...]
    seeds: tuple[int, ...]
    label: dict[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def name(self) -> str:
        """``alpha=0.3, server_lr=1`` (the swept values), after the label's values (``delays=lognormal``; a string
        label by itself); ``""`` when the run sweeps nothing and has no labels."""
        return ", ".join(filter(None, [label_name(self.label), point_name(self.swept)]))


@dataclasses.dataclass(frozen=True)
class SeedStats:
    """A statistic of one point over its seeds. ``mean``/``std`` (population std, ``ddof=0``) and ``n`` are over
    the seeds that did not diverge and whose value is finite; ``mean``/``std`` are None when ``n == 0`` (e.g. every
    seed diverged). ``diverged``: ``(seed, server step)`` of the point's diverged seeds, never averaged in;
    ``non_finite``: seeds that did not diverge but whose value is NaN/inf (left out too)."""

    mean: float | None
    std: float | None
    n: int
    seeds: tuple[int, ...]
    diverged: tuple[tuple[int, int], ...]
    non_finite: tuple[int, ...] = ()

    def describe(self, digits: int = 4) -> str:
        """``0.8123 ± 0.0040 (n=3 seeds)``, or ``no value (every seed diverged)``."""
        if self.n == 0:
            why = "every seed diverged" if len(self.diverged) == len(self.seeds) else "no finite value"
            return f"no value ({why})"
        if self.n == 1:
            return f"{self.mean:.{digits}f} (n=1 seed)"
        return f"{self.mean:.{digits}f} ± {self.std:.{digits}f} (n={self.n} seeds)"


def seed_stats(values: np.ndarray, seeds: Sequence[int], diverged_at: np.ndarray) -> SeedStats:
    """Mean, std and count of ``values`` (one per seed of a point) over the finite values of the non-diverged
    seeds (``diverged_at < 0``); see :class:`SeedStats`."""
    values = np.asarray(values, dtype=np.float64)
    diverged_at = np.asarray(diverged_at)
    alive = diverged_at < 0
    finite = np.isfinite(values)
    kept = values[alive & finite]
    mean = float(np.mean(kept)) if kept.size else None
    std = float(np.std(kept)) if kept.size else None
    return SeedStats(mean, std, int(kept.size), tuple(int(s) for s in seeds),
                     tuple((int(s), int(d)) for s, d in zip(seeds, diverged_at) if d >= 0),
                     tuple(int(s) for s, a, f in zip(seeds, alive, finite) if a and not f))
