"""The random streams of virtual time, and the per-client tables built from them.

Everything is a deterministic function of ``seed`` (a non-negative int) and never touches numpy's global state or the
host clock. Timing has its own streams, independent of any training randomness; stream ``k`` is
``np.random.default_rng([seed, TIMING_TAG, k])`` (:func:`timing_rng`), or a counter-based stream keyed by
``SeedSequence([seed, TIMING_TAG, k])``:

1. speeds: ``delays.sample_speeds(timing_rng(seed, 1), n)``, drawn once (:func:`client_speeds`);
2. the initial clients of ``concurrent``;
3. client choices at refills (uniforms in blocks) and the participants of synchronous rounds;
4. job durations: client ``i``'s ``k``-th job (``k = 0, 1, ...`` counts its jobs in dispatch order) takes a pure
   function of ``(seed, i, k)`` (:func:`job_durations_table`). So a client's durations are the same in every protocol
   and code path, and a schedule of ``T`` steps is a prefix of the one of ``T' > T`` steps;
5. dropped clients: ``timing_rng(seed, 5).choice(n, size=floor(dropout_fraction * n), replace=False)``, sorted
   (:func:`dropped_clients`);
6. suspensions: the coin and the length after client ``i``'s ``u``-th upload, a pure function of ``(seed, i, u)``
   (:func:`suspension_table`);
7. Poisson server clock: inter-step gaps ``timing_rng(seed, 7).exponential(1 / rate)`` in blocks of 1024;
8. device traces: the device of each client (:func:`asyncfl_jax.timing.traces.assign_devices`);
9. device traces with a separate availability file (FedScale's): the availability device of each client.

The event loop, the vectorized fast paths and the in-scan event clock (:mod:`asyncfl_jax.timing.clock`) all draw from
these functions, which is what makes their schedules agree bit for bit.
"""

from __future__ import annotations

import numbers
from typing import Any, Callable, Mapping

import numpy as np

from asyncfl_jax.timing.delays import DelayModel, JobDurations, Suspensions
from asyncfl_jax.timing.seeds import TIMING_TAG, timing_rng
from asyncfl_jax.timing.traces import TraceDelays, TraceDurations

FORMAT = "asyncfl_jax.timing/1"  # the ``info["rng"]`` of every schedule: the version of these streams
BASE_JOBS = 32  # at most this many jobs per client are precomputed in one vectorized call
EXTEND_JOBS = 64  # a client's table is extended by at least this many entries (or doubled) when it runs out


def check_int(name: str, value: Any, low: int, high: int | None = None, high_name: str = "") -> int:
    """``value`` as an int in ``[low, high]`` (``high=None``: no upper bound); ``ValueError`` naming ``name``
    otherwise (bools are refused)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    value = int(value)
    if value < low or (high is not None and value > high):
        bound = f"[{low}, {high_name or high}]" if high is not None else f">= {low}"
        raise ValueError(f"{name} must be in {bound}, got {value}" if high is not None else
                         f"{name} must be {bound}, got {value}")
    return value


def check_common(num_clients: Any, num_steps: Any, delays: Any, seed: Any) -> tuple[int, int, DelayModel, int]:
    """Validates the arguments every protocol takes; returns ``(n, T, delays, seed)`` with ``delays`` a
    :class:`DelayModel` (a dict is converted) or a :class:`~asyncfl_jax.timing.traces.TraceDelays`."""
    n = check_int("num_clients", num_clients, 1)
    T = check_int("num_steps", num_steps, 1)
    if not isinstance(delays, (DelayModel, TraceDelays)):
        delays = DelayModel.from_dict(delays)
    seed = check_int("seed", seed, 0)
    return n, T, delays, seed


def _stream_key(seed: int, stream: int) -> int:
    return int(np.random.SeedSequence([seed, TIMING_TAG, stream]).generate_state(1, np.uint64)[0])


def client_speeds(num_clients: int, delays: DelayModel | Mapping[str, Any], seed: int) -> np.ndarray:
    """float64 [n]: the speed factors ``s_i`` every protocol uses for ``(delays, seed)``."""
    n, _, delays, seed = check_common(num_clients, 1, delays, seed)
    if isinstance(delays, TraceDelays):
        raise ValueError("device traces have no speed factors: every job of client i takes "
                         "job_durations_table(n, delays, seed).per_client[i]")
    return delays.sample_speeds(timing_rng(seed, 1), n)


def job_durations_table(num_clients: int, delays: DelayModel | Mapping[str, Any], seed: int) -> JobDurations:
    """The :class:`JobDurations` every protocol uses for ``(delays, seed)``: ``.durations(i, k)`` is the duration of
    client ``i``'s ``k``-th job."""
    n, _, delays, seed = check_common(num_clients, 1, delays, seed)
    if isinstance(delays, TraceDelays):
        return TraceDurations(delays.client_durations(n, seed))
    return JobDurations(delays, _stream_key(seed, 4), client_speeds(n, delays, seed))


def suspension_table(num_clients: int, delays: DelayModel | Mapping[str, Any], seed: int) -> Suspensions:
    """The :class:`Suspensions` every protocol uses for ``(delays, seed)``: ``.lengths(i, u)`` is the suspension after
    client ``i``'s ``u``-th upload (``nan``: none)."""
    _, _, delays, seed = check_common(num_clients, 1, delays, seed)
    return Suspensions(delays, _stream_key(seed, 6))


def dropped_clients(num_clients: int, delays: DelayModel | Mapping[str, Any], seed: int) -> np.ndarray:
    """int64 [floor(dropout_fraction * n)], sorted: the clients that leave at ``delays.dropout_time``."""
    n, _, delays, seed = check_common(num_clients, 1, delays, seed)
    k = delays.num_dropped(n)
    if k == 0:
        return np.zeros(0, dtype=np.int64)
    return np.sort(timing_rng(seed, 5).choice(n, size=k, replace=False).astype(np.int64))


def dropout_info(n: int, delays: DelayModel, seed: int) -> tuple[list[int], float, dict[str, Any]]:
    """``(dropped clients, dropout time, entries for schedule.info)``; ``([], inf, {})`` without dropouts."""
    if not delays.has_dropouts(n):
        return [], float("inf"), {}
    dropped = dropped_clients(n, delays, seed).tolist()
    time = float(delays.dropout_time)
    return dropped, time, {"dropped_clients": dropped, "dropout_time": time}


def schedule_info(protocol: str, n: int, T: int, delays: DelayModel, seed: int, **extra: Any) -> dict[str, Any]:
    """The ``info`` dict of a schedule: protocol, sizes, seed, delay model, the protocol's options, stream version
    (and, with device traces, the client -> device mapping)."""
    traced = delays.schedule_info(n, seed) if isinstance(delays, TraceDelays) else {}
    return {"protocol": protocol, "num_clients": n, "num_steps": T, "seed": seed, "delays": delays.to_dict(),
            **extra, **traced, "rng": FORMAT}


def base_width(n: int, jobs: int) -> int:
    """Jobs per client to precompute for about ``jobs`` jobs in all: about twice the mean per client, in ``[2, 32]``.
    (Values do not depend on how they are batched; this only trades memory for later per-client extensions.)"""
    return int(min(BASE_JOBS, max(2, -(-2 * jobs // n) + 2)))


class ClientSequences:
    """Per-client sequences of a counter-based table (job durations, suspension lengths) as Python floats.

    ``lists[c]`` holds entries ``0 .. len - 1`` of client ``c``; :meth:`extend` makes sure entry ``k`` is there. The
    first ``width`` entries of every client come from one vectorized call, later ones from per-client calls that at
    least double the list. Entries do not depend on this chunking.
    """

    def __init__(self, block: Callable[[np.ndarray, int, int], np.ndarray], n: int, width: int) -> None:
        self._block = block
        self.lists: list[list[float]] = block(np.arange(n), 0, width).tolist()

    def extend(self, c: int, k: int) -> list[float]:
        """Client ``c``'s list, long enough to hold entry ``k``."""
        lst = self.lists[c]
        while k >= len(lst):
            lst.extend(self._block(np.array([c]), len(lst), max(len(lst), EXTEND_JOBS))[0].tolist())
        return lst
