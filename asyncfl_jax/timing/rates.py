"""Clients whose updates form Poisson processes: per-client rates ``lambda_i`` as a :class:`DelayModel`.

Client i's jobs take ``Exp(mean 1 / lambda_i)``, so its updates arrive as a Poisson process of rate ``lambda_i`` (the
AREA paper's event model, digest 002 section 3). The rates are the speed factors of a :class:`DelayModel`
(``s_i = 1 / lambda_i`` with exponential job noise of mean 1), drawn once per schedule from a normal distribution
truncated below, so every protocol sees the same rates for the same seed.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from asyncfl_jax.timing.delays import DelayModel
from asyncfl_jax.timing.protocols import client_speeds

_RATE_FIELDS = ("rate_mean", "rate_std", "rate_min")


@dataclasses.dataclass(frozen=True)
class PoissonRates(DelayModel):
    """Client i's jobs take ``Exp(mean 1 / lambda_i)``: its updates form a Poisson process of rate lambda_i.

    ``lambda_i ~ N(rate_mean, rate_std^2)`` drawn once per schedule (from the protocols' speed stream), redrawn while
    ``<= rate_min`` (a truncated normal; ``rate_std = 0``: every client at ``rate_mean``). The speed factor is
    ``s_i = 1 / lambda_i`` with exponential job noise of mean 1 (``s_i * Exp(1)``); the other fields are those of
    :class:`~asyncfl_jax.timing.DelayModel` (use ``noise="exponential"``, ``noise_scale=1``; :func:`poisson_delays`
    builds one).
    """

    rate_mean: float = 10.0
    rate_std: float = 0.0
    rate_min: float = 0.0

    def sample_speeds(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """float64 [n]: ``s_i = 1 / lambda_i`` for rates drawn by :func:`draw_rates`."""
        return 1.0 / draw_rates(rng, n, self.rate_mean, self.rate_std, self.rate_min)

    def to_dict(self) -> dict[str, Any]:
        """The ``DelayModel`` fields only (what a schedule's ``info["delays"]`` must hold to be read back); the
        rates are recorded separately (e.g. ``info["poisson_rates"]``)."""
        d = super().to_dict()
        for key in _RATE_FIELDS:
            d.pop(key)
        return d


def draw_rates(rng: np.random.Generator, n: int, mean: float, std: float, minimum: float = 0.0) -> np.ndarray:
    """n rates from ``N(mean, std^2)`` truncated to ``> minimum`` (rejection: only the offending draws are redrawn)."""
    if std == 0.0:
        return np.full(n, float(mean))
    rates = rng.normal(mean, std, size=n)
    for _ in range(10_000):
        bad = rates <= minimum
        if not bad.any():
            return rates.astype(np.float64)
        rates[bad] = rng.normal(mean, std, size=int(bad.sum()))
    raise ValueError(f"could not draw rates > {minimum} from N({mean}, {std}^2)")


def poisson_delays(rate_mean: float, rate_std: float) -> PoissonRates:
    """Poisson arrivals with rates ``lambda_i ~ N(rate_mean, rate_std^2)`` truncated to ``> 0``: job time
    ``(1 / lambda_i) * Exp(1)``."""
    return PoissonRates(speed="constant", speed_value=1.0, noise="exponential", noise_scale=1.0, combine="multiply",
                        rate_mean=float(rate_mean), rate_std=float(rate_std))


def client_rates(n: int, rate_mean: float, rate_std: float, seed: int) -> np.ndarray:
    """float64 [n]: the rates lambda_i every protocol uses for timing seed ``seed`` (:func:`poisson_delays`)."""
    return 1.0 / client_speeds(n, poisson_delays(rate_mean, rate_std), seed)


def rates_info(delays: PoissonRates, n: int, seed: int) -> dict[str, Any]:
    """The rates of a schedule as JSON: their distribution and the ``lambda_i`` drawn for ``seed``."""
    return {"mean": delays.rate_mean, "std": delays.rate_std, "min": delays.rate_min,
            "lambda": (1.0 / client_speeds(n, delays, seed)).tolist()}
