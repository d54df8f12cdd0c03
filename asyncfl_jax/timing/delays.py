"""Delay models: how long one local-training job of one client takes, in virtual time.

A job of client ``i`` takes::

    duration = s_i * eps + comm_time      (combine = "multiply", the default)
    duration = s_i + eps + comm_time      (combine = "add")

where ``s_i`` is the client's persistent *speed factor* (a scale: larger means slower), drawn once per schedule, and
``eps`` is a fresh per-job noise draw. All durations are ``>= 0``. Some settings make durations exactly ``0`` (e.g.
``speed="constant", speed_value=0`` or ``noise="uniform", noise_low=0`` at the boundary); this is allowed: the arrival
protocols resolve equal event times deterministically (see :mod:`asyncfl_jax.timing.events`).

Speed distributions (``speed``):

* ``"constant"``    ``s_i = speed_value`` (default 1.0);
* ``"uniform"``     ``s_i ~ U(speed_low, speed_high)`` (defaults 0, 5: CA2FL's ``s ~ Unif(0, 5)``);
* ``"lognormal"``   ``s_i = exp(N(speed_mean, speed_sigma^2))``;
* ``"exponential"`` ``s_i ~ Exp(scale=speed_value)`` (mean ``speed_value``);
* ``"normal"``      ``s_i = max(N(speed_mean, speed_std^2), speed_min)`` ("normal clipped > 0").

Noise distributions (``noise``):

* ``"none"``        ``eps = 1`` with ``combine="multiply"``, ``eps = 0`` with ``combine="add"``;
* ``"exponential"`` ``eps ~ Exp(scale=noise_scale)``;
* ``"half_normal"`` ``eps = |N(0, noise_scale^2)|``;
* ``"lognormal"``   ``eps = exp(N(0, noise_sigma^2))``;
* ``"uniform"``     ``eps ~ U(noise_low, noise_high)``.

CA2FL's delay model (each client draws ``s_i ~ U(0, 5)`` once, then every task takes ``HalfNormal(scale=s_i)``) is the
default: ``DelayModel()`` == ``DelayModel(speed="uniform", speed_low=0, speed_high=5, noise="half_normal",
noise_scale=1, combine="multiply")``; see :meth:`DelayModel.ca2fl`.

Noise is produced from two uniforms per job through :meth:`DelayModel.noise_from_uniforms` (inverse transform for
exponential/uniform, Box-Muller for the normal-based ones). The uniforms come either from a numpy ``Generator``
(:meth:`DelayModel.sample_noise`) or from the counter-based per-(client, job) stream :class:`JobDurations`, which the
protocols use so that the ``k``-th job of client ``i`` has the same duration whichever code path asks for it.

Client availability (off by default; see :class:`asyncfl_jax.timing.policies.Availability` and the protocols):

* dropouts: ``floor(dropout_fraction * n)`` clients, drawn once per schedule, leave for good at virtual time
  ``dropout_time`` (default ``inf``: never);
* suspensions: after each upload a client is suspended with probability ``suspension_prob`` for an exponential time
  of mean ``suspension_mean``. The coin and the length after client ``i``'s ``u``-th upload are a pure function of
  ``(seed, i, u)`` (:class:`Suspensions`, the same counter-based construction as :class:`JobDurations`).
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from typing import Any, Mapping

import numpy as np

SPEEDS = ("constant", "uniform", "lognormal", "exponential", "normal")
NOISES = ("none", "exponential", "half_normal", "lognormal", "uniform")
COMBINES = ("multiply", "add")

_FLOAT_FIELDS = (
    "speed_value",
    "speed_low",
    "speed_high",
    "speed_mean",
    "speed_sigma",
    "speed_std",
    "speed_min",
    "noise_scale",
    "noise_sigma",
    "noise_low",
    "noise_high",
    "comm_time",
)
# Client availability (dropouts, suspensions). ``to_dict`` writes these only when they differ from their defaults, so
# the description of a delay model without dropouts or suspensions is the same as before they existed.
_AVAILABILITY_DEFAULTS = {
    "dropout_fraction": 0.0,
    "dropout_time": math.inf,
    "suspension_prob": 0.0,
    "suspension_mean": 1.0,
}


@dataclasses.dataclass(frozen=True)
class DelayModel:
    """Per-client speed factor x per-job noise (+ a fixed communication time). See the module docstring.

    Construction validates the fields (:meth:`validate`); integers are accepted for float fields and stored as float.
    """

    speed: str = "uniform"
    speed_value: float = 1.0
    speed_low: float = 0.0
    speed_high: float = 5.0
    speed_mean: float = 0.0
    speed_sigma: float = 1.0
    speed_std: float = 1.0
    speed_min: float = 1e-3
    noise: str = "half_normal"
    noise_scale: float = 1.0
    noise_sigma: float = 1.0
    noise_low: float = 0.0
    noise_high: float = 1.0
    combine: str = "multiply"
    comm_time: float = 0.0
    dropout_fraction: float = 0.0
    dropout_time: float = math.inf
    suspension_prob: float = 0.0
    suspension_mean: float = 1.0

    def __post_init__(self) -> None:
        for name in (*_FLOAT_FIELDS, *_AVAILABILITY_DEFAULTS):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, numbers.Real):
                raise ValueError(f"delays.{name} must be a real number, got {value!r}")
            object.__setattr__(self, name, float(value))
        self.validate()

    # ------------------------------------------------------------------ presets
    @classmethod
    def ca2fl(cls, scale_high: float = 5.0, shift: float = 0.0) -> "DelayModel":
        """CA2FL (App. D): ``s_i ~ U(0, scale_high)``, job time ``|N(0, s_i^2)| + shift``."""
        return cls(speed="uniform", speed_low=0.0, speed_high=scale_high, noise="half_normal", noise_scale=1.0,
                   combine="multiply", comm_time=shift)

    @classmethod
    def constant(cls, value: float = 1.0) -> "DelayModel":
        """Every job takes exactly ``value``."""
        return cls(speed="constant", speed_value=value, noise="none", combine="multiply")

    # ------------------------------------------------------------------ validation
    def validate(self) -> None:
        """Raises ``ValueError`` naming the field, its value and what is allowed."""
        for name, value, allowed in (("speed", self.speed, SPEEDS), ("noise", self.noise, NOISES),
                                     ("combine", self.combine, COMBINES)):
            if not isinstance(value, str) or value not in allowed:
                raise ValueError(f"delays.{name} must be one of {list(allowed)}, got {value!r}")
        for name in _FLOAT_FIELDS:
            value = getattr(self, name)
            if not math.isfinite(value):
                raise ValueError(f"delays.{name} must be finite, got {value}")

        def at_least(name: str, bound: float, strict: bool, why: str = "") -> None:
            value = getattr(self, name)
            if value < bound or (strict and value == bound):
                op = ">" if strict else ">="
                raise ValueError(f"delays.{name} must be {op} {bound}{why}, got {value}")

        if self.speed == "constant":
            at_least("speed_value", 0.0, strict=False, why=" (speed='constant')")
        elif self.speed == "exponential":
            at_least("speed_value", 0.0, strict=True, why=" (scale of speed='exponential')")
        elif self.speed == "uniform":
            at_least("speed_low", 0.0, strict=False, why=" (speed='uniform')")
            if not self.speed_high > self.speed_low:
                raise ValueError(
                    f"delays.speed_high must be > speed_low, got {self.speed_high} <= {self.speed_low}"
                )
        elif self.speed == "lognormal":
            at_least("speed_sigma", 0.0, strict=False, why=" (speed='lognormal')")
        elif self.speed == "normal":
            at_least("speed_std", 0.0, strict=False, why=" (speed='normal')")
            at_least("speed_min", 0.0, strict=False, why=" (clip of speed='normal')")
        if self.noise in ("exponential", "half_normal"):
            at_least("noise_scale", 0.0, strict=True, why=f" (noise={self.noise!r})")
        elif self.noise == "lognormal":
            at_least("noise_sigma", 0.0, strict=False, why=" (noise='lognormal')")
        elif self.noise == "uniform":
            at_least("noise_low", 0.0, strict=False, why=" (noise='uniform')")
            if not self.noise_high > self.noise_low:
                raise ValueError(
                    f"delays.noise_high must be > noise_low, got {self.noise_high} <= {self.noise_low}"
                )
        at_least("comm_time", 0.0, strict=False)
        # Client availability.
        for name in ("dropout_fraction", "suspension_prob", "suspension_mean"):
            if not math.isfinite(getattr(self, name)):
                raise ValueError(f"delays.{name} must be finite, got {getattr(self, name)}")
        if not 0.0 <= self.dropout_fraction < 1.0:
            raise ValueError(f"delays.dropout_fraction must be in [0, 1) (the fraction of clients that leave), "
                             f"got {self.dropout_fraction}")
        if math.isnan(self.dropout_time) or self.dropout_time < 0.0:
            raise ValueError(f"delays.dropout_time must be >= 0 (a virtual time; inf = never), got {self.dropout_time}")
        if not 0.0 <= self.suspension_prob <= 1.0:
            raise ValueError(f"delays.suspension_prob must be in [0, 1] (a probability), got {self.suspension_prob}")
        at_least("suspension_mean", 0.0, strict=True, why=" (mean length of a suspension)")

    # ------------------------------------------------------------------ client availability
    def num_dropped(self, num_clients: int) -> int:
        """``floor(dropout_fraction * num_clients)``, the number of clients that leave (computed with a 1e-9 tolerance,
        so that e.g. ``0.29 * 100`` gives 29 and not 28)."""
        return int(math.floor(self.dropout_fraction * num_clients + 1e-9))

    def has_dropouts(self, num_clients: int) -> bool:
        """Whether some client leaves at a finite time (``num_dropped(n) >= 1`` and ``dropout_time < inf``)."""
        return self.num_dropped(num_clients) >= 1 and math.isfinite(self.dropout_time)

    @property
    def has_suspensions(self) -> bool:
        """Whether clients may be suspended after an upload (``suspension_prob > 0``)."""
        return self.suspension_prob > 0.0

    # ------------------------------------------------------------------ (de)serialisation
    def to_dict(self) -> dict[str, Any]:
        """All fields as a flat JSON-friendly dict.

        The availability fields (``dropout_fraction``, ``dropout_time``, ``suspension_prob``, ``suspension_mean``) are
        written only when they differ from their defaults: a model without dropouts or suspensions has the same
        description as before these fields existed, and ``dropout_time = inf`` is never written (JSON has no inf).
        """
        d = dataclasses.asdict(self)
        for name, default in _AVAILABILITY_DEFAULTS.items():
            if d[name] == default:
                del d[name]
        return d

    @classmethod
    def from_dict(cls, config: Mapping[str, Any]) -> "DelayModel":
        """Inverse of :meth:`to_dict`; missing keys take their defaults, unknown keys raise ``ValueError``;
        ``dropout_time: null`` means never (``inf``)."""
        if isinstance(config, DelayModel):
            return config
        if not isinstance(config, Mapping):
            raise ValueError(f"delays must be a DelayModel or a dict, got {type(config).__name__}")
        valid = [f.name for f in dataclasses.fields(cls)]
        unknown = [k for k in config if k not in valid]
        if unknown:
            raise ValueError(f"delays: unknown key {unknown[0]!r}; valid keys are {valid}")
        values = dict(config)
        if "dropout_time" in values and values["dropout_time"] is None:  # null in JSON: never (inf)
            values["dropout_time"] = math.inf
        return cls(**values)

    # ------------------------------------------------------------------ sampling
    def sample_speeds(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """float64 [n]: the persistent speed factor ``s_i`` of each of ``n`` clients (drawn once per schedule)."""
        if self.speed == "constant":
            return np.full(n, self.speed_value, dtype=np.float64)
        if self.speed == "uniform":
            return rng.uniform(self.speed_low, self.speed_high, size=n).astype(np.float64)
        if self.speed == "lognormal":
            return np.exp(rng.normal(self.speed_mean, self.speed_sigma, size=n)).astype(np.float64)
        if self.speed == "exponential":
            return rng.exponential(self.speed_value, size=n).astype(np.float64)
        if self.speed == "normal":
            return np.maximum(rng.normal(self.speed_mean, self.speed_std, size=n), self.speed_min).astype(np.float64)
        raise AssertionError(self.speed)  # unreachable after validate()

    def noise_from_uniforms(self, u1: np.ndarray, u2: np.ndarray) -> np.ndarray:
        """Per-job noise ``eps`` from two independent U[0, 1) arrays (same shape), elementwise.

        exponential: ``-scale*log(1-u1)``; half_normal: ``scale*|z|``; lognormal: ``exp(sigma*z)`` with the Box-Muller
        normal ``z = sqrt(-2 log(1-u1)) cos(2 pi u2)``; uniform: ``low + (high-low)*u1``; none: 1 (multiply) / 0 (add).
        """
        u1 = np.asarray(u1, dtype=np.float64)
        if self.noise == "none":
            return np.full(u1.shape, 1.0 if self.combine == "multiply" else 0.0)
        if self.noise == "exponential":
            return -self.noise_scale * np.log1p(-u1)
        if self.noise == "uniform":
            return self.noise_low + (self.noise_high - self.noise_low) * u1
        z = np.sqrt(-2.0 * np.log1p(-u1)) * np.cos((2.0 * np.pi) * np.asarray(u2, dtype=np.float64))
        if self.noise == "half_normal":
            return self.noise_scale * np.abs(z)
        if self.noise == "lognormal":
            return np.exp(self.noise_sigma * z)
        raise AssertionError(self.noise)  # unreachable after validate()

    def combine_durations(self, speeds: np.ndarray, noise: np.ndarray) -> np.ndarray:
        """Job durations from speed factors and noise (broadcasting): ``s*eps + comm`` or ``s + eps + comm``."""
        speeds = np.asarray(speeds, dtype=np.float64)
        noise = np.asarray(noise, dtype=np.float64)
        base = speeds * noise if self.combine == "multiply" else speeds + noise
        return base + self.comm_time

    def sample_noise(self, rng: np.random.Generator, shape: int | tuple[int, ...]) -> np.ndarray:
        """float64 [shape]: per-job noise drawn from ``rng``."""
        return self.noise_from_uniforms(rng.random(shape), rng.random(shape))

    def sample_durations(self, rng: np.random.Generator, speeds_of_clients: np.ndarray) -> np.ndarray:
        """float64 [k]: one job duration for each entry of ``speeds_of_clients`` (all ``>= 0``)."""
        speeds = np.asarray(speeds_of_clients, dtype=np.float64)
        return self.combine_durations(speeds, self.sample_noise(rng, speeds.shape))

    def mean_duration(self, speeds: np.ndarray) -> np.ndarray:
        """Expected job duration of clients with the given speed factors (``E[eps]`` in closed form)."""
        if self.noise == "none":
            mean_eps = 1.0 if self.combine == "multiply" else 0.0
        elif self.noise == "exponential":
            mean_eps = self.noise_scale
        elif self.noise == "half_normal":
            mean_eps = self.noise_scale * math.sqrt(2.0 / math.pi)
        elif self.noise == "lognormal":
            mean_eps = math.exp(self.noise_sigma**2 / 2.0)
        else:
            mean_eps = (self.noise_low + self.noise_high) / 2.0
        return self.combine_durations(speeds, mean_eps)


# ---------------------------------------------------------------------- counter-based per-(client, job) stream
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_CLIENT_MUL = np.uint64(0xD1B54A32D192ED03)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)


def _mix64(x: np.ndarray) -> np.ndarray:
    """SplitMix64's finalizer (a bijection of uint64 with good avalanche), elementwise, wrapping arithmetic."""
    x = x ^ (x >> np.uint64(30))
    x = x * _M1
    x = x ^ (x >> np.uint64(27))
    x = x * _M2
    return x ^ (x >> np.uint64(31))


def counter_uniforms(key: int, clients: np.ndarray, jobs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Two U[0, 1) arrays that are a pure function of ``(key, client, job)``, elementwise (broadcasting).

    Client ``i`` owns a SplitMix64 stream seeded with ``mix(key + i * C)``; its ``j``-th output is
    ``mix(seed_i + (j + 1) * golden)``. Job ``k`` uses outputs ``2k`` and ``2k + 1``, turned into doubles with 53 bits.
    """
    clients = np.asarray(clients).astype(np.uint64)
    jobs = np.asarray(jobs).astype(np.uint64)
    with np.errstate(over="ignore"):
        seeds = _mix64(np.uint64(key) + clients * _CLIENT_MUL)
        first = seeds + (np.uint64(2) * jobs + np.uint64(1)) * _GOLDEN
        x1 = _mix64(first)
        x2 = _mix64(first + _GOLDEN)
    scale = 2.0**-53
    return (x1 >> np.uint64(11)).astype(np.float64) * scale, (x2 >> np.uint64(11)).astype(np.float64) * scale


class JobDurations:
    """Duration of the ``k``-th job of client ``i``: a pure function of ``(delays, key, speeds, i, k)``.

    ``durations(clients, jobs)`` evaluates it for any index arrays at once, so event-driven and vectorized code paths
    obtain bit-identical durations without sharing any sequential random state.
    """

    def __init__(self, delays: DelayModel, key: int, speeds: np.ndarray) -> None:
        self.delays = delays
        self.key = int(key)
        self.speeds = np.asarray(speeds, dtype=np.float64)

    def durations(self, clients: np.ndarray, jobs: np.ndarray) -> np.ndarray:
        """float64, broadcast shape of ``clients`` and ``jobs``: duration of job ``jobs`` of client ``clients``."""
        return self.compute_times(clients, jobs) + self.delays.comm_time

    def compute_times(self, clients: np.ndarray, jobs: np.ndarray) -> np.ndarray:
        """float64: the durations without ``comm_time`` (``s_i * eps`` or ``s_i + eps``), what scales with the work of
        a job under the in-scan event clock."""
        clients = np.asarray(clients, dtype=np.int64)
        jobs = np.asarray(jobs, dtype=np.int64)
        u1, u2 = counter_uniforms(self.key, clients, jobs)
        noise = self.delays.noise_from_uniforms(u1, u2)
        speeds = self.speeds[clients]
        return speeds * noise if self.delays.combine == "multiply" else speeds + noise

    def block(self, clients: np.ndarray, first_job: int, count: int) -> np.ndarray:
        """float64 [len(clients), count]: jobs ``first_job .. first_job+count-1`` of each client in ``clients``."""
        clients = np.asarray(clients, dtype=np.int64)
        jobs = np.arange(first_job, first_job + count, dtype=np.int64)
        return self.durations(clients[:, None], jobs[None, :])


class Suspensions:
    """Suspension after the ``u``-th upload of client ``i``: a pure function of ``(delays, key, i, u)``.

    Uses :func:`counter_uniforms` (``u1``, ``u2``) with its own key: the client is suspended iff
    ``u1 < suspension_prob``, for ``-suspension_mean * log(1 - u2)`` (exponential with mean ``suspension_mean``).
    """

    def __init__(self, delays: DelayModel, key: int) -> None:
        self.prob = float(delays.suspension_prob)
        self.mean = float(delays.suspension_mean)
        self.key = int(key)

    def lengths(self, clients: np.ndarray, uploads: np.ndarray) -> np.ndarray:
        """float64, broadcast shape: suspension length after upload ``uploads`` of client ``clients``; ``nan`` where the
        client is not suspended."""
        u1, u2 = counter_uniforms(self.key, np.asarray(clients, dtype=np.int64), np.asarray(uploads, dtype=np.int64))
        return np.where(u1 < self.prob, -self.mean * np.log1p(-u2), np.nan)

    def block(self, clients: np.ndarray, first_upload: int, count: int) -> np.ndarray:
        """float64 [len(clients), count]: uploads ``first_upload .. first_upload+count-1`` of each client."""
        clients = np.asarray(clients, dtype=np.int64)
        uploads = np.arange(first_upload, first_upload + count, dtype=np.int64)
        return self.lengths(clients[:, None], uploads[None, :])
