"""Plain float64 numpy references for compressed uploads and error feedback (AsynFL, AsynFLC, AsynFLC-EF).

Written from the paper's rules (AsynFLC-EF digest Eqs. 5, 7-10, Alg. 1), independently of the package. They plug into
``reference.replay_steps``: the client objects are its ``client(c, start, result)`` callable (a client has at most one
job in flight, so doing its work at arrival is the same as at dispatch), the server steps its
``server(x, t, arrivals)``.
"""

from __future__ import annotations

import math
from typing import Callable

import numpy as np


# ---------------------------------------------------------------------------------------------------- compressors
def kept(d: int, fraction: float | None = None, k: int | None = None) -> int:
    """k of a sparsifier: ``k``, or ``ceil(fraction * d)`` for a fraction."""
    return k if k is not None else max(1, math.ceil(fraction * d - 1e-9))


def top_k(v: np.ndarray, k: int) -> np.ndarray:
    """The k entries of largest |v_j| (ties: the lower index), the others 0."""
    order = np.argsort(-np.abs(v), kind="stable")[:k]
    out = np.zeros_like(v)
    out[order] = v[order]
    return out


def scaled_sign(v: np.ndarray) -> np.ndarray:
    """``(||v||_1 / d) sign(v)`` with sign(0) = +1."""
    return np.where(v >= 0, 1.0, -1.0) * np.abs(v).sum() / v.size


def identity(v: np.ndarray) -> np.ndarray:
    return np.array(v, dtype=np.float64)


# ---------------------------------------------------------------------------------------------------- clients
class CompressedClient:
    """AsynFLC: the client sends ``C(m)`` (``m``: what ``inner`` would send, the delta by default)."""

    def __init__(self, compress: Callable[[np.ndarray], np.ndarray], inner=None):
        self.compress, self.inner = compress, inner

    def __call__(self, c, start, result):
        m = result if self.inner is None else self.inner(c, start, result)
        return self.compress(m)


class ErrorFeedbackClient:
    """AsynFLC-EF: client c keeps ``e_c`` (zeros), sends ``C(m + e_c)`` and sets ``e_c <- e_c + m - C(m + e_c)``."""

    def __init__(self, num_clients: int, dim: int, compress: Callable[[np.ndarray], np.ndarray], inner=None):
        self.e = np.zeros((num_clients, dim))
        self.compress, self.inner = compress, inner

    def __call__(self, c, start, result):
        m = result if self.inner is None else self.inner(c, start, result)
        sent = self.compress(m + self.e[c])  # Eq. 8
        self.e[c] = self.e[c] + m - sent  # Eq. 9
        return sent


# ---------------------------------------------------------------------------------------------------- servers
def asynfl_step(server_lr: float, num_clients: int, normalization: str = "clients"):
    """AsynFL / AsynFLC / AsynFLC-EF server (Eqs. 5, 7, 10): ``x + eta_g / n * sum_{S_t} message`` (or divided by
    ``|S_t|`` with ``normalization="arrivals"``); no change when nothing arrives."""

    def step(x, t, arrivals):
        if not arrivals:
            return x
        total = sum(a.message for a in arrivals)
        z = num_clients if normalization == "clients" else len(arrivals)
        return x + server_lr * total / z

    return step


def tuple_step(step):
    """A ``reference.replay``-style server ``step(x, [(client, staleness, message, start)])`` as a replay_steps one."""
    return lambda x, t, arrivals: step(x, [(a.client, a.staleness, a.message, a.start) for a in arrivals])


def dispatched_jobs(schedule) -> list[tuple[int, int]]:
    """Every job of the schedule as (client, start version), in dispatch order (initial jobs first)."""
    jobs = [(int(c), 0) for c in schedule.init_clients.tolist() if c >= 0]
    for t in range(schedule.num_steps):
        jobs += [(int(c), t) for c in schedule.dispatch_clients[t].tolist() if c >= 0]
    return jobs
