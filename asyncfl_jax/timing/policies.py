"""The policies of the event loop (:mod:`asyncfl_jax.timing.events`): who is dispatched when, when the server steps,
and which clients can take part.

Every arrival protocol is one choice of each:

================================  ======================  =====================  ==========================
protocol                          refill                  aggregation            availability
================================  ======================  =====================  ==========================
``all_active``                    ``Immediate(n)``        ``Count(1)``/``Clock``   from the delay model
``concurrent``, refill immediate  ``Immediate(Mc)``       ``Count(M)``/``Clock``   from the delay model
``concurrent``, refill boundary   ``Boundary(Mc)``        ``Count(M)``             from the delay model
``synchronous``                   ``Rounds(m)``           ``AllInFlight()``        from the delay model
================================  ======================  =====================  ==========================

A time window that waits for everyone (``aggregation="periodic", period=inf``) is ``synchronous``.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Union

import numpy as np

from asyncfl_jax.timing.delays import DelayModel, Suspensions
from asyncfl_jax.timing.streams import dropout_info, suspension_table, timing_rng
from asyncfl_jax.timing.traces import ClientWindows, TraceDelays

CLOCK_BLOCK = 1024  # Poisson inter-step gaps drawn per rng call


# ---------------------------------------------------------------------- refill: who is dispatched, and when
@dataclasses.dataclass(frozen=True)
class KeepInFlight:
    """Keep ``min(concurrency, live clients)`` jobs in flight (the common part of :class:`Immediate` and
    :class:`Boundary`).

    ``concurrency`` distinct clients, sampled uniformly without replacement (stream 2; all clients, in id order, when
    ``concurrency == n``), start from ``x_0`` at time 0 in slots ``0 .. concurrency - 1``. After every event the loop
    dispatches clients drawn uniformly from the idle pool (live, not training, not suspended; stream 3) until the
    target is in flight. A job started while ``t`` steps have been applied starts from ``x_t`` and is listed in
    ``dispatch_clients[t]``; it takes the most recently released slot (released when the step that read it was
    applied), or a new one.
    """

    concurrency: int

    def initial_clients(self, n: int, seed: int) -> np.ndarray:
        """int64, sorted: the clients whose jobs start from ``x_0`` before the first event."""
        if self.concurrency == n:
            return np.arange(n, dtype=np.int64)
        return np.sort(timing_rng(seed, 2).choice(n, size=self.concurrency, replace=False).astype(np.int64))

    def initial_among(self, online: np.ndarray, n: int, seed: int) -> np.ndarray:
        """int64, sorted: the initial clients when only ``online`` (sorted) are available at time 0 (device traces):
        ``min(concurrency, len(online))`` of them drawn as :meth:`initial_clients` draws from all ``n`` (the same
        clients when all are online)."""
        if self.concurrency >= online.size:
            return online
        return np.sort(online[timing_rng(seed, 2).choice(online.size, size=self.concurrency, replace=False)])

    def target(self, live: int) -> int:
        """Jobs to keep in flight while ``live`` clients have not dropped out."""
        return min(self.concurrency, live)


@dataclasses.dataclass(frozen=True)
class Immediate(KeepInFlight):
    """Refill at once (FedBuff): every arrival is replaced right after it, by a client drawn from the idle pool
    (including the one that arrived). ``all_active`` is ``Immediate(n)``: the only idle client is the one that
    arrived (or, with suspensions, one that returns)."""


@dataclasses.dataclass(frozen=True)
class Boundary(KeepInFlight):
    """Refill at step boundaries (CA2FL): the arrivals of the step being filled are not replaced until that step is
    applied; then they are replaced at once, from ``x_{t+1}``. Only with :class:`Count` aggregation."""


@dataclasses.dataclass(frozen=True)
class Rounds:
    """Synchronous rounds (FedAvg): no job is in flight between rounds.

    A round starts when the previous one is over (time 0 for the first) with the clients then available (the idle
    pool): ``participants`` of them sampled uniformly without replacement with ``rng.choice`` (stream 3), or all of
    them when ``participants`` is ``None`` or at least their number; they are dispatched in id order, into slots
    ``0, 1, ...``. If nobody is available the round starts as soon as a client returns from a suspension.
    """

    participants: int | None = None

    def initial_clients(self, n: int, seed: int) -> np.ndarray:
        """No initial jobs: round 0 is dispatched at time 0 from ``x_0`` (``dispatch_clients[0]``)."""
        return np.zeros(0, dtype=np.int64)

    def initial_among(self, online: np.ndarray, n: int, seed: int) -> np.ndarray:
        """No initial jobs, whoever is online (device traces): round 0 samples from the clients on at time 0."""
        return np.zeros(0, dtype=np.int64)

    def target(self, live: int) -> int:
        """Jobs are only started at round starts, never by the refill after an event."""
        return 0

    def choose(self, available: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """The participants of a round, sorted, among ``available`` (int64, sorted)."""
        m = self.participants
        if m is None or m >= available.size:
            return available
        return np.sort(available[rng.choice(available.size, size=m, replace=False)])


Refill = Union[Immediate, Boundary, Rounds]  # KeepInFlight itself is not a refill


# ---------------------------------------------------------------------- aggregation: when the server applies a step
@dataclasses.dataclass(frozen=True)
class Count:
    """A server step every ``size`` arrivals (the buffer of FedBuff / CA2FL; 1 for FedAsync, ACE, AREA), applied at
    the time of its last arrival."""

    size: int


@dataclasses.dataclass(frozen=True)
class Clock:
    """A server clock: step ``t`` is applied at the ``t``-th tick with every result that arrived since the previous
    tick (possibly none). Ticks at ``(t + 1) * period`` (``"periodic"``) or at the points of a Poisson process of
    rate ``rate`` (``"poisson"``, gaps from stream 7)."""

    period: float | None = None
    rate: float | None = None

    def ticks(self, seed: int) -> "TickTimes":
        """The tick times of this clock for ``seed``."""
        return TickTimes(self.period, self.rate, seed)


@dataclasses.dataclass(frozen=True)
class AllInFlight:
    """A step when every job in flight has arrived or has been discarded at the dropout (synchronous rounds, or a
    time window of infinite length): at the last arrival, or at the dropout time if that comes later. Its arrivals
    are listed in client-id order (``Rounds`` dispatched them in that order, so that is also slot order)."""


Aggregation = Union[Count, Clock, AllInFlight]


class TickTimes:
    """Tick times of a :class:`Clock`: ``(k + 1) * period``, or the cumulative sums of exponential gaps drawn in
    blocks of :data:`CLOCK_BLOCK` (so a shorter schedule sees a prefix of a longer one's ticks)."""

    def __init__(self, period: float | None, rate: float | None, seed: int) -> None:
        self.period = period
        self.rate = rate
        self.rng = timing_rng(seed, 7) if rate is not None else None
        self.times: list[float] = []
        self.last = 0.0

    def __call__(self, k: int) -> float:
        """Virtual time of the ``k``-th tick (``k = 0, 1, ...``), i.e. of server step ``k``."""
        if self.rng is None:
            return (k + 1) * self.period
        while k >= len(self.times):
            gaps = self.rng.exponential(1.0 / self.rate, size=CLOCK_BLOCK)
            block = np.cumsum(np.concatenate([[self.last], gaps]))[1:]
            self.times.extend(block.tolist())
            self.last = float(block[-1])
        return self.times[k]


# ---------------------------------------------------------------------- availability: who can take part
@dataclasses.dataclass(frozen=True)
class Availability:
    """Dropouts and suspensions (see :class:`~asyncfl_jax.timing.delays.DelayModel`); the default is "always there".

    * ``dropped`` clients (sorted) leave for good at ``dropout_time``: an idle one leaves the pool, a job of one
      that would finish after that time is discarded (its slot is released with the current step's), a suspended one
      never returns, and one whose result arrives at the dropout time itself uploads it and leaves.
    * after client ``i``'s ``u``-th upload it is suspended for ``suspensions.lengths(i, u)`` (``nan``: not
      suspended); it rejoins the idle pool when that time has passed (if it has not left meanwhile).
    * ``windows`` (device traces, :mod:`asyncfl_jax.timing.traces`): client ``i`` is on during its windows
      ``[start, end)`` only. It is dispatched only while on; at ``end`` an idle one leaves the pool and a job of one
      that would finish after ``end`` is discarded (as at a dropout); it rejoins the pool at its next ``start``.
    """

    dropped: tuple[int, ...] = ()
    dropout_time: float = math.inf
    suspensions: Suspensions | None = None
    windows: ClientWindows | None = None

    @classmethod
    def of(cls, n: int, delays: DelayModel | TraceDelays, seed: int) -> "Availability":
        """The availability that ``delays`` gives ``n`` clients with timing seed ``seed``."""
        if isinstance(delays, TraceDelays):
            return cls(windows=delays.client_windows(n, seed))
        dropped, time, _ = dropout_info(n, delays, seed)
        suspensions = suspension_table(n, delays, seed) if delays.has_suspensions else None
        return cls(tuple(dropped), time, suspensions)

    def info(self) -> dict[str, Any]:
        """The entries of ``schedule.info`` (``dropped_clients``, ``dropout_time``; none without dropouts)."""
        if not self.dropped:
            return {}
        return {"dropped_clients": list(self.dropped), "dropout_time": self.dropout_time}

    @property
    def always(self) -> bool:
        """Whether every client is always available (no dropout, no suspension)."""
        return not self.dropped and self.suspensions is None and self.windows is None
