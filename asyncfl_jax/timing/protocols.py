"""Arrival protocols: turn a :class:`DelayModel` into a :class:`Schedule` (see ``schedule.py`` for the conventions).

Every protocol is the one event loop of :mod:`asyncfl_jax.timing.events` with a choice of policies
(:mod:`asyncfl_jax.timing.policies`):

* a refill: ``Immediate`` (keep ``Mc`` jobs in flight, replace each arrival at once), ``Boundary`` (replace a step's
  arrivals when it is applied) or ``Rounds`` (synchronous rounds of ``participants`` clients);
* an aggregation: ``Count`` (a step every ``M`` arrivals), ``Clock`` (periodic or Poisson ticks) or ``AllInFlight``
  (a step when every job in flight is in: synchronous rounds, a time window of infinite length);
* an availability: dropouts and suspensions from the delay model (none by default).

Combinations in which the events can be computed without stepping through them one by one have vectorized fast paths
(:mod:`asyncfl_jax.timing.fast`): all clients active with one arrival per step, and synchronous rounds (all at once
without dropouts or suspensions, one round at a time with them). They give the loop's schedules bit for bit (tested)
and are only faster.

Randomness: every schedule is a deterministic function of ``seed`` through the timing streams of
:mod:`asyncfl_jax.timing.streams` (speeds, initial clients, refill choices, job durations, dropped clients,
suspensions, Poisson ticks), independent of any training randomness. A client's ``k``-th job takes the same time in
every protocol and code path, and a schedule for ``T`` steps is a prefix of the one for ``T' > T`` steps.

Ties: events at equal virtual times are handled in the order dropout, arrivals (by client id, including those of
jobs dispatched at that instant), returns from suspension (by client id), server tick (see
:mod:`asyncfl_jax.timing.events`). So a job dispatched at a tick's time starts from the model before that tick, and an
arrival at a tick's time belongs to that tick's step.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from typing import Any, Mapping

from asyncfl_jax import arguments
from asyncfl_jax.timing.delays import DelayModel
from asyncfl_jax.timing.events import simulate_events, to_schedule
from asyncfl_jax.timing.fast import all_active_fast, rounds_log, synchronous_fast
from asyncfl_jax.timing.policies import (AllInFlight, Availability, Aggregation, Boundary, Clock, Count, Immediate,
                                         Refill, Rounds)
from asyncfl_jax.timing.schedule import Schedule
from asyncfl_jax.timing.traces import TraceDelays
from asyncfl_jax.timing.streams import (check_common, check_int, client_speeds, dropped_clients, job_durations_table,
                                        schedule_info, suspension_table)

__all__ = ["AGGREGATIONS", "PROTOCOLS", "REFILLS", "all_active", "client_speeds", "concurrent", "dropped_clients",
           "job_durations_table", "make_schedule", "suspension_table", "synchronous"]

REFILLS = ("immediate", "boundary")
PROTOCOLS = ("all_active", "concurrent", "synchronous")
AGGREGATIONS = ("count", "periodic", "poisson")


# ---------------------------------------------------------------------- one schedule from policies
def build_schedule(protocol: str, n: int, T: int, delays: DelayModel, seed: int, refill: Refill,
                   aggregation: Aggregation, options: dict[str, Any], fast: bool = True) -> Schedule:
    """The schedule of ``protocol`` with these policies and the availability ``delays`` gives (arguments already
    validated); ``options`` are written to ``info``. With ``fast`` a vectorized path builds it where one covers the
    combination (the same schedule; ``fast=False`` always runs the event loop)."""
    table = job_durations_table(n, delays, seed)
    availability = Availability.of(n, delays, seed)
    info = schedule_info(protocol, n, T, delays, seed, **options, **availability.info())
    fast = fast and availability.windows is None  # the vectorized paths know no availability windows
    if fast and isinstance(refill, Rounds):
        if availability.always:
            return synchronous_fast(n, T, n if refill.participants is None else refill.participants, table, seed,
                                    info)
        return to_schedule(rounds_log(n, T, refill, table, availability, seed), n, aggregation, info)
    if fast and availability.always and refill.concurrency == n and aggregation == Count(1):
        return all_active_fast(n, T, table, info)  # either refill: the only idle client is the one that arrived
    log = simulate_events(n, T, table, seed, refill, aggregation, availability)
    if availability.windows is not None:  # device traces: when jobs were lost (Schedule.validate, the statistics)
        info["offline_discards"] = list(log.discard_times)
    return to_schedule(log, n, aggregation, info)


# ---------------------------------------------------------------------- public protocols
def _check_positive(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value) or not value > 0:
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
    return float(value)


def _check_clock(aggregation: Any, period: Any, rate: Any) -> tuple[str, float | None, float | None]:
    """Validates the server-clock options; returns ``(aggregation, period, rate)``."""
    if not isinstance(aggregation, str) or aggregation not in AGGREGATIONS:
        raise ValueError(f"aggregation must be one of {list(AGGREGATIONS)}, got {aggregation!r}")
    if aggregation == "periodic":
        if period is None:
            raise ValueError("aggregation='periodic' requires period (the time between server steps, > 0)")
        if not (isinstance(period, numbers.Real) and not isinstance(period, bool) and period == math.inf):
            period = _check_positive("period", period)  # inf: wait for everyone (synchronous rounds)
    elif period is not None:
        raise ValueError(f"period is only used with aggregation='periodic', got period={period!r} with "
                         f"aggregation={aggregation!r}")
    if aggregation == "poisson":
        if rate is None:
            raise ValueError("aggregation='poisson' requires rate (server steps per unit of virtual time, > 0)")
        rate = _check_positive("rate", rate)
    elif rate is not None:
        raise ValueError(f"rate is only used with aggregation='poisson', got rate={rate!r} with "
                         f"aggregation={aggregation!r}")
    return aggregation, period, rate


def _aggregation(aggregation: str, buffer_size: int | None, period: float | None,
                 rate: float | None) -> tuple[Aggregation, dict[str, Any]]:
    """The aggregation policy of validated options, and its entries of ``info``."""
    if aggregation == "count":
        return Count(buffer_size), {"buffer_size": buffer_size}
    if aggregation == "periodic":
        return Clock(period=period), {"aggregation": aggregation, "period": period}
    return Clock(rate=rate), {"aggregation": aggregation, "rate": rate}


def concurrent(num_clients: int, num_steps: int, delays: DelayModel | Mapping[str, Any], seed: int,
               concurrency: int, buffer_size: int | None = None, refill: str = "immediate",
               aggregation: str = "count", period: float | None = None, rate: float | None = None) -> Schedule:
    """Fixed concurrency ``Mc`` with a buffer of ``M`` results per server step (FedBuff / CA2FL Algorithm 2).

    ``Mc`` distinct clients, sampled uniformly without replacement, start from ``x_0`` at time 0 (``init_clients``,
    sorted by id, slots ``0..Mc-1``). With ``aggregation="count"`` (the default) the server applies step ``t`` at the
    arrival time of its ``M``-th result (``M = buffer_size``, required).

    * ``refill="boundary"`` (CA2FL): right after step ``t`` is applied, ``M`` clients are sampled uniformly without
      replacement from all clients not training (including those that just reported); they start from ``x_{t+1}`` at
      that time and form ``dispatch_clients[t+1]`` (``dispatch_clients[0]`` is empty). Between boundaries only
      ``Mc - M`` .. ``Mc`` clients are in flight; the mean staleness tends to ``(Mc - M) / M``.
    * ``refill="immediate"`` (original FedBuff): every arrival is replaced at once by one client sampled uniformly
      from the idle clients (including the one that arrived). Replacements of arrivals ``1..M-1`` of step ``t`` start
      from ``x_t`` (``dispatch_clients[t]``); the replacement of the ``M``-th starts from ``x_{t+1}``
      (``dispatch_clients[t+1]``). So ``dispatch_clients[0]`` holds ``M-1`` clients, later rows ``M``.

    Dispatch width ``D = M``. Arrivals are listed in time order (ties: by client id). Requires
    ``1 <= buffer_size <= concurrency <= num_clients``. With ``concurrency == num_clients`` and ``buffer_size == 1``
    (both refills coincide) a vectorized path builds the same schedule as the event loop.

    Server clock (``aggregation="periodic"`` with ``period``, or ``"poisson"`` with ``rate``): step ``t`` is applied
    at the ``t``-th tick (``step_times[t] = (t+1) * period``, or the ``t``-th point of a Poisson process of rate
    ``rate``) with every result that arrived in ``(step_times[t-1], step_times[t]]`` (possibly none: an empty step).
    Refill is immediate only (``refill="boundary"`` raises) and ``buffer_size`` must not be given. ``period=inf``
    (a window that waits for everyone) gives synchronous rounds: :func:`synchronous` with ``participants = Mc``
    (all clients when ``Mc = n``; ``info`` then also says ``aggregation="periodic", period="inf"``). The arrival width
    ``M`` is the largest number of arrivals in a step (at least 1), the dispatch width the largest number of
    dispatches; shorter rows are padded with -1.

    Dropouts and suspensions (fields of ``delays``): ``target = min(Mc, live clients)`` jobs are kept in flight. A
    job of a dropped client still in flight at ``dropout_time`` is discarded (its slot is released with the current
    step's) and replaced at once by a job of a live idle client, if any, which starts from the current model ``x_t``
    (``dispatch_clients[t]``, ``t`` = steps applied so far). A suspended client is not in the idle pool until it
    returns; a refill that finds the pool empty is made when a client returns (also mid-step with ``"boundary"``).
    Dispatch rows may then hold more than ``M`` jobs (width: the largest row, at least ``M``). Raises ``ValueError``
    if, with ``refill="boundary"``, fewer than ``buffer_size`` live clients remain to complete the requested steps.
    """
    n, T, delays, seed = check_common(num_clients, num_steps, delays, seed)
    Mc = check_int("concurrency", concurrency, 1, n, f"num_clients={n}")
    if not isinstance(refill, str) or refill not in REFILLS:
        raise ValueError(f"refill must be one of {list(REFILLS)}, got {refill!r}")
    aggregation, period, rate = _check_clock(aggregation, period, rate)
    if aggregation == "count":
        if buffer_size is None:
            raise ValueError("buffer_size is required with aggregation='count' (a server step every buffer_size "
                             "arrivals)")
        M = check_int("buffer_size", buffer_size, 1, Mc, f"concurrency={Mc}")
    else:
        if buffer_size is not None:
            raise ValueError(f"buffer_size must not be given with aggregation={aggregation!r}: the server clock "
                             f"decides when a step is applied (got buffer_size={buffer_size!r})")
        if refill != "immediate":
            raise ValueError(f"refill must be 'immediate' with aggregation={aggregation!r} (an arriving client is "
                             f"replaced at once), got refill={refill!r}")
        M = None
    if period == math.inf:  # a window that waits for every client in flight: synchronous rounds of Mc clients
        return _infinite_window(synchronous(n, T, delays, seed, participants=None if Mc == n else Mc))
    policy, options = _aggregation(aggregation, M, period, rate)
    if M is None:
        options = {"concurrency": Mc, "refill": refill, **options}
    else:
        options = {"concurrency": Mc, **options, "refill": refill}
    return build_schedule("concurrent", n, T, delays, seed, Boundary(Mc) if refill == "boundary" else Immediate(Mc),
                          policy, options)


def all_active(num_clients: int, num_steps: int, delays: DelayModel | Mapping[str, Any], seed: int,
               aggregation: str = "count", period: float | None = None, rate: float | None = None) -> Schedule:
    """All clients always training, one arrival per server step (ACE, AREA, FedAsync).

    Equal to ``concurrent(n, T, delays, seed, concurrency=n, buffer_size=1)`` (except ``info["protocol"]``): every
    arriving client is immediately sent the new model ``x_{t+1}``. Client ``i`` keeps slot ``i``.

    With a server clock (``aggregation="periodic"``/``"poisson"``, see :func:`concurrent`) an arriving client is
    re-dispatched at once from ``x_t`` (``t`` = steps applied so far) and its result is applied at the next tick.
    With dropouts, a dropped client's job in flight at ``dropout_time`` is discarded and not replaced (no client is
    idle). A suspended client starts its next job when it returns, from the model current at that time, so dispatch
    rows hold a variable number of jobs (padded with -1 to the largest). In these cases slots are handed out from the
    LIFO free list (a client does not keep its slot) and the schedule comes from the event loop, not from the
    vectorized path.
    """
    n, T, delays, seed = check_common(num_clients, num_steps, delays, seed)
    aggregation, period, rate = _check_clock(aggregation, period, rate)
    if period == math.inf:  # a window that waits for everyone: synchronous rounds of all clients
        return _infinite_window(synchronous(n, T, delays, seed))
    policy, options = _aggregation(aggregation, 1, period, rate)
    return build_schedule("all_active", n, T, delays, seed, Immediate(n), policy, {"concurrency": n, **options})


def _infinite_window(schedule: Schedule) -> Schedule:
    """A synchronous schedule standing for a time-window server with ``period = inf``."""
    return dataclasses.replace(schedule, info={**schedule.info, "aggregation": "periodic", "period": "inf"})


def synchronous(num_clients: int, num_steps: int, delays: DelayModel | Mapping[str, Any], seed: int,
                participants: int | None = None) -> Schedule:
    """Synchronous rounds (FedAvg): the server waits for the slowest participant.

    Round ``t`` starts at ``start_t`` (``start_0 = 0``, ``start_{t+1} = step_times[t]``): ``m = participants`` clients
    (``None``: all ``n``, in id order; else sampled uniformly without replacement, then sorted) start from ``x_t`` and
    all arrive in step ``t`` (staleness 0) at ``start_t + d_i``; ``step_times[t] = start_t + max_i d_i``.
    ``dispatch_clients[t] == arrival_clients[t]`` with slots ``0..m-1``; there are no initial jobs.

    Dropouts and suspensions (fields of ``delays``; the event loop then builds the schedule): a round samples
    only from the clients *available* at its start (not dropped, i.e. start ``< dropout_time``, and not suspended);
    if fewer than ``participants`` are available, all of them take part (``None``: all available, in id order); if
    none is, the round starts when the first one returns. A participant that drops while training never reports; the
    round then ends when every participant has reported or left: ``step_times[t] = max(last arrival,
    dropout_time)``, possibly with no arrival at all. Arrivals stay in client-id order, in the slots of their
    dispatch; the widths are the largest rows (padded with -1).
    """
    n, T, delays, seed = check_common(num_clients, num_steps, delays, seed)
    m = n if participants is None else check_int("participants", participants, 1, n, f"num_clients={n}")
    return build_schedule("synchronous", n, T, delays, seed, Rounds(None if participants is None else m), AllInFlight(),
                          {"participants": m})


_OPTIONS = {
    "all_active": (all_active, ("aggregation", "period", "rate")),
    "concurrent": (concurrent, ("concurrency", "buffer_size", "refill", "aggregation", "period", "rate")),
    "synchronous": (synchronous, ("participants",)),
}


def check_make_schedule(protocol: Any, num_clients: Any, num_steps: Any, delays: Any, seed: Any) -> None:
    """The types of :func:`~asyncfl_jax.timing.protocols.make_schedule`'s positional arguments."""
    arguments.check_str("protocol", protocol)
    arguments.check_int("num_clients", num_clients, minimum=1)
    arguments.check_int("num_steps", num_steps, minimum=1)
    if not isinstance(delays, (DelayModel, TraceDelays, Mapping)):
        raise TypeError(f"delays must be a DelayModel, its to_dict() form or a TraceDelays (device traces), "
                        f"{arguments._got(delays)}")
    arguments.check_int("seed", seed, minimum=0)


def make_schedule(protocol: str, num_clients: int, num_steps: int, delays: DelayModel | Mapping[str, Any],
                  seed: int, **options: Any) -> Schedule:
    """Builds a schedule by protocol name (``"all_active"``, ``"concurrent"``, ``"synchronous"``).

    ``delays`` may be a :class:`DelayModel` or its ``to_dict()`` form; ``options`` are the protocol's keyword
    arguments (``concurrent``: ``concurrency`` (required), ``buffer_size`` (required with the default
    ``aggregation="count"``, not allowed with a clock), ``refill``, ``aggregation``, ``period``, ``rate``;
    ``all_active``: ``aggregation``, ``period``, ``rate``; ``synchronous``: ``participants``).
    """
    check_make_schedule(protocol, num_clients, num_steps, delays, seed)
    if protocol not in _OPTIONS:
        raise ValueError(f"protocol must be one of {list(PROTOCOLS)}, got {protocol!r}")
    fn, valid = _OPTIONS[protocol]
    unknown = [k for k in options if k not in valid]
    if unknown:
        raise ValueError(f"unknown option {unknown[0]!r} for protocol {protocol!r}; valid options are {list(valid)}")
    if protocol == "concurrent":
        required = ["concurrency"]
        if options.get("aggregation", "count") == "count":
            required.append("buffer_size")
        missing = [k for k in required if k not in options]
        if missing:
            raise ValueError(f"protocol 'concurrent' requires option {missing[0]!r}")
    return fn(num_clients, num_steps, delays, seed, **options)
