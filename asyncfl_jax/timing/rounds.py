"""Synchronous rounds in which the server waits for suspended clients.

The package's :func:`~asyncfl_jax.timing.synchronous` protocol lets a client that is suspended at the start of a round
sit the round out. :func:`wait_rounds` is the other reading of a synchronous server under suspensions (the AsyncFedED
digest's reading of the paper's FedAvg, digest 001 section 4.2): every round takes all n clients and lasts until the
last of them reports, a suspended client starting its job when it returns.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from asyncfl_jax.timing.delays import DelayModel
from asyncfl_jax.timing.protocols import job_durations_table, suspension_table, synchronous
from asyncfl_jax.timing.schedule import Schedule


def wait_rounds(n: int, num_rounds: int, delays: DelayModel, seed: int) -> Schedule:
    """Synchronous rounds of all n clients in which the server waits for suspended clients: client i starts round t
    when the round starts or, if it was suspended after its upload of round t-1, when it returns; its job durations
    and suspensions are those of the other protocols (same streams)."""
    base = synchronous(n, num_rounds, dataclasses.replace(delays, suspension_prob=0.0), seed)
    clients = np.arange(n)[None, :]
    rounds = np.arange(num_rounds)[:, None]
    durations = job_durations_table(n, delays, seed).durations(clients, rounds)
    hang = np.zeros((num_rounds, n))
    if num_rounds > 1 and delays.suspension_prob > 0:
        hang[1:] = np.nan_to_num(suspension_table(n, delays, seed).lengths(clients, rounds[:-1]), nan=0.0)
    dispatch, arrival, steps = np.empty((num_rounds, n)), np.empty((num_rounds, n)), np.empty(num_rounds)
    start, previous = 0.0, np.zeros(n)
    for t in range(num_rounds):
        dispatch[t] = np.maximum(start, previous + hang[t]) if t else start
        arrival[t] = dispatch[t] + durations[t]
        steps[t] = start = arrival[t].max()
        previous = arrival[t]
    info = {**base.info, "delays": delays.to_dict(), "suspensions": "wait"}
    schedule = dataclasses.replace(base, dispatch_times=dispatch, arrival_times=arrival, step_times=steps, info=info)
    schedule.validate()
    return schedule
