"""An independent, plain event-by-event reference for the algorithms, written with numpy only.

It shares nothing with the package but the :class:`Schedule` it replays: the model (multinomial logistic regression),
its gradient, local training and every server rule are written out here by hand, in float64. Each arrival at step
``t`` that was computed on version ``v`` is trained lazily from the stored model ``x_v`` (full-batch steps, so there is
no randomness to share), and the server rules are applied arrival by arrival, in schedule order.

:func:`replay_steps` is the richer walk used by the bias-correcting methods (ACE/ACED, AREA, MIFA, MF-CA2FL...): it
gives the server the step index and each arrival's staleness and version, lets clients keep memory (done at arrival
time: a client has at most one job in flight), and can run the init round of the cache-based gradient methods.
"""

from __future__ import annotations

import math
from typing import Callable, NamedTuple

import numpy as np


class LogReg:
    """Softmax regression ``logits = X W + b`` with flat parameters ``[W.ravel(), b]`` (the order of ravel_pytree
    for the dict ``{"W": ..., "b": ...}``)."""

    def __init__(self, num_features: int, num_classes: int):
        self.f, self.c = num_features, num_classes

    def split(self, flat: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        w = flat[: self.f * self.c].reshape(self.f, self.c)
        return w, flat[self.f * self.c:]

    def loss_grad(self, flat: np.ndarray, x: np.ndarray, y: np.ndarray) -> np.ndarray:
        """Gradient of the mean cross-entropy over (x, y)."""
        w, b = self.split(flat)
        z = x @ w + b
        z = z - z.max(axis=1, keepdims=True)
        p = np.exp(z)
        p /= p.sum(axis=1, keepdims=True)
        p[np.arange(len(y)), y] -= 1.0
        p /= len(y)
        return np.concatenate([(x.T @ p).ravel(), p.sum(axis=0)])


def local_delta(model: LogReg, x0: np.ndarray, data: tuple[np.ndarray, np.ndarray], steps: int, lr: float,
                momentum: float = 0.0, weight_decay: float = 0.0, prox_mu: float = 0.0) -> np.ndarray:
    """K full-batch steps of SGD with coupled weight decay, heavy-ball momentum and a FedProx term; returns y_K - x0."""
    y = x0.copy()
    buf = np.zeros_like(y)
    for _ in range(steps):
        g = model.loss_grad(y, *data) + prox_mu * (y - x0) + weight_decay * y
        buf = momentum * buf + g
        y = y - lr * buf
    return y - x0


def staleness_weight(kind: str, tau: int, a: float = 0.0, b: float = 0.0) -> float:
    if kind == "constant":
        return 1.0
    if kind == "polynomial":
        return (tau + 1.0) ** (-a)
    if kind == "hinge":
        return 1.0 if tau <= b else 1.0 / (a * (tau - b) + 1.0)
    if kind == "inverse_sqrt":
        return 1.0 / math.sqrt(1.0 + tau)
    raise ValueError(kind)


def replay(schedule, x0: np.ndarray, train: Callable[[int, np.ndarray], np.ndarray], server_step) -> np.ndarray:
    """Replays the schedule: at step t, every arrival (client c, version v) brings ``train(c, x_v)``; ``server_step``
    folds the list of (client, staleness, result, start model) into the model. Returns the final model."""
    models = [x0.copy()]
    x = x0.copy()
    for t in range(schedule.num_steps):
        arrivals = []
        for c, v in zip(schedule.arrival_clients[t], schedule.arrival_versions[t]):
            if c < 0:
                continue
            start = models[int(v)]
            arrivals.append((int(c), t - int(v), train(int(c), start), start))
        x = server_step(x, arrivals)
        models.append(x.copy())
    return x


def fedbuff_step(server_lr: float, staleness: str = "constant", normalization: str = "buffer", a=0.0, b=0.0):
    def step(x, arrivals):
        if not arrivals:
            return x
        weights = [staleness_weight(staleness, tau, a, b) for _, tau, _, _ in arrivals]
        total = sum(w * delta for w, (_, _, delta, _) in zip(weights, arrivals))
        z = {"buffer": len(arrivals), "weights": sum(weights), "none": 1.0}[normalization]
        return x + server_lr * total / z

    return step


def fedavg_step(server_lr: float):
    def step(x, arrivals):
        return x + server_lr * sum(d for _, _, d, _ in arrivals) / len(arrivals)

    return step


def asgd_step(server_lr: float):
    def step(x, arrivals):
        for _, _, delta, _ in arrivals:
            x = x + server_lr * delta
        return x

    return step


def fedasync_step(alpha: float, staleness: str = "constant", a=0.0, b=0.0):
    def step(x, arrivals):
        for _, tau, delta, start in arrivals:
            alpha_t = alpha * staleness_weight(staleness, tau, a, b)
            local_model = start + delta
            x = (1.0 - alpha_t) * x + alpha_t * local_model
        return x

    return step


class CA2FLReference:
    """CA2FL's Algorithm 1 as printed: caches h_i (zeros), v = hbar + mean_{S}(Delta_i - h_i) with the values from
    before the step, x += eta v, then h_i = Delta_i. For schedules where a client arrives at most once per step."""

    def __init__(self, num_clients: int, dim: int, server_lr: float):
        self.h = {i: np.zeros(dim) for i in range(num_clients)}
        self.n, self.lr = num_clients, server_lr

    def __call__(self, x, arrivals):
        if not arrivals:
            return x
        hbar = sum(self.h.values()) / self.n
        v = hbar + sum(delta - self.h[c] for c, _, delta, _ in arrivals) / len(arrivals)
        for c, _, delta, _ in arrivals:
            self.h[c] = delta
        return x + self.lr * v


# ---------------------------------------------------------------------------------------------------- gradients
def gradient(model: LogReg, x: np.ndarray, data: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
    """What a gradient-uploading client sends: one full-batch gradient of its loss at the start model (no weight
    decay)."""
    return model.loss_grad(x, *data)


# ---------------------------------------------------------------------------------------------------- cache rounding
def quantize_row(v: np.ndarray, bits: int, rounding: str = "nearest",
                 rng: np.random.Generator | None = None) -> np.ndarray:
    """The stored value Q(v) of one row with ``bits``-bit codes, in ``v``'s own dtype and in this order of operations:
    lo = min v, hi = max v, L = 2^bits - 1, scale = (hi - lo) / L, code = clip(floor((v - lo) / scale + r), 0, L)
    with r = 1/2 ("nearest") or r ~ U[0, 1) per entry ("stochastic"), Q = lo + code * scale; Q(v) = v if hi == lo."""
    v = np.asarray(v)
    f = v.dtype.type
    lo, hi = v.min(), v.max()
    if hi == lo:
        return v.copy()
    levels = f(2 ** bits - 1)
    scale = (hi - lo) / levels
    r = f(0.5) if rounding == "nearest" else rng.random(v.shape).astype(v.dtype)
    code = np.clip(np.floor((v - lo) / scale + r), f(0), levels)
    return lo + code * scale


def round_bfloat16(v: np.ndarray) -> np.ndarray:
    """``v`` rounded to bfloat16 (through float32, to nearest, ties to even), returned in ``v``'s dtype."""
    v = np.asarray(v)
    bits = np.asarray(v, np.float32).view(np.uint32).astype(np.uint64)
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return bits.astype(np.uint32).view(np.float32).astype(v.dtype)


def cache_store(kind: str) -> Callable[[np.ndarray], np.ndarray]:
    """What a server cache of ``kind`` ("float32", "bfloat16", "int8", "int4", "int2") holds for a row, with
    round-to-nearest for the integer kinds. "float32" keeps the float64 row (the float32 error is the tolerance's)."""
    if kind == "float32":
        return lambda v: np.array(v, dtype=np.float64)
    if kind == "bfloat16":
        return round_bfloat16
    bits = {"int8": 8, "int4": 4, "int2": 2}[kind]
    return lambda v: quantize_row(v, bits, "nearest")


# ---------------------------------------------------------------------------------------------------- richer replay
class Arrival(NamedTuple):
    """One result applied at server step ``t``: its client, staleness ``t - version``, uploaded message, the model
    the job started from, and that model's version (-1 for the init round)."""

    client: int
    staleness: int
    message: np.ndarray
    start: np.ndarray
    version: int


def replay_steps(schedule, x0: np.ndarray, train: Callable[[int, np.ndarray, int], np.ndarray], server,
                 client: Callable[[int, np.ndarray, np.ndarray], np.ndarray] | None = None,
                 init_round: bool = False) -> list[np.ndarray]:
    """Replays the schedule event by event and returns the models ``[x_0, ..., x_T]``.

    Every arrival (client ``c``, version ``v``) at step ``t`` is trained here, ``result = train(c, x_v, v)``, and
    turned into its message by ``client(c, x_v, result)`` (the client's memory, if any, lives in that callable; a
    client has at most one job in flight, so doing its work at arrival is the same as at dispatch); then
    ``x_{t+1} = server(x_t, t, arrivals)`` with the step's :class:`Arrival` list in schedule order.

    ``init_round``: before the schedule, every client ``0..n-1`` computes its result at ``x0`` and the server takes
    one step with all ``n`` messages in client order (step index -1, staleness 0, version -1); its model is ``x_0``.
    """
    client = client or (lambda c, start, result: result)
    x = np.array(x0, dtype=np.float64)
    if init_round:
        arrivals = [Arrival(c, 0, client(c, x, train(c, x, -1)), x, -1) for c in range(schedule.num_clients)]
        x = server(x, -1, arrivals)
    models = [x.copy()]
    for t in range(schedule.num_steps):
        arrivals = []
        for c, v in zip(schedule.arrival_clients[t].tolist(), schedule.arrival_versions[t].tolist()):
            if c < 0:
                continue
            start = models[v]
            arrivals.append(Arrival(c, t - v, client(c, start, train(c, start, v)), start, v))
        x = server(x, t, arrivals)
        models.append(x.copy())
    return models


# ---------------------------------------------------------------------------------------------------- gradient methods
class ACEReference:
    """ACE (all-client gradient caching): ``U[c] <- store(g)`` for every arrival in order (a client arriving twice
    keeps its last), then ``x <- x - eta (1/n) sum_{i=1..n} U_i``: every client's latest gradient, every step."""

    direction = -1.0  # gradients: step against them

    def __init__(self, num_clients: int, dim: int, server_lr: float, store: Callable = cache_store("float32")):
        self.cache = np.zeros((num_clients, dim))
        self.lr, self.store = server_lr, store

    def __call__(self, x, t, arrivals):
        for a in arrivals:
            self.cache[a.client] = self.store(a.message)
        return x + self.direction * self.lr * self.cache.mean(axis=0)


class ACEDReference:
    """ACED (the ACE paper's Algorithm a.1): the cache update of ACE, but the step averages only the active clients,
    ``x <- x - eta (1/n_t) sum_{i in A_t} U_i`` (no step when ``A_t`` is empty).

    ``active="since_report"``: ``A_t = {i : t - t_start_i <= tau}``, ``t_start`` taken before this step's resets,
    then ``t_start_c <- t + 1`` for the arrivals (all 0 after the init round, which is step -1).
    ``active="cache_age"``: ``A_t = {i : t - v_i <= tau}``, ``v_i`` the version the cached gradient was computed on
    (-1 for the init round), updated for the arrivals first. ``active_counts[t]`` records ``n_t`` (the init round
    is step -1).
    """

    def __init__(self, num_clients: int, dim: int, server_lr: float, tau_algo: float, active: str = "since_report",
                 store: Callable = cache_store("float32")):
        if active not in ("since_report", "cache_age"):
            raise ValueError(active)
        self.cache = np.zeros((num_clients, dim))
        self.t_start = np.zeros(num_clients, dtype=np.int64)
        self.version = np.full(num_clients, -1, dtype=np.int64)
        self.lr, self.tau, self.active, self.store = server_lr, tau_algo, active, store
        self.active_counts: dict[int, int] = {}

    def __call__(self, x, t, arrivals):
        for a in arrivals:
            self.cache[a.client] = self.store(a.message)
            self.version[a.client] = t - a.staleness
        age = t - (self.t_start if self.active == "since_report" else self.version)
        active = age <= self.tau
        self.active_counts[t] = int(active.sum())
        if active.any():
            x = x - self.lr * self.cache[active].mean(axis=0)
        for a in arrivals:
            self.t_start[a.client] = t + 1
        return x


def delay_adaptive_step(server_lr: float, tau_c: float):
    """Delay-adaptive ASGD: ``x <- x - sum_i eta min(1, tau_c / tau_i) g_i`` (step size eta at staleness 0)."""

    def step(x, t, arrivals):
        for a in arrivals:
            scale = 1.0 if a.staleness == 0 else min(1.0, tau_c / a.staleness)
            x = x - server_lr * scale * a.message
        return x

    return step


def gradient_asgd_step(server_lr: float):
    """ASGD with gradient uploads: ``x <- x - eta sum_i g_i``."""

    def step(x, t, arrivals):
        return x - server_lr * sum((a.message for a in arrivals), np.zeros_like(x))

    return step


# -------------------------------------------------------------------------------------------------- model/delta methods
class AREAReference:
    """AREA: client ``i`` remembers ``y_i`` (``x_init`` at the start); a job started from ``x_start`` with delta
    ``Delta`` ends at ``x_new = x_start + Delta``, uploads ``m_i = x_new - y_i`` and sets ``y_i <- x_new``; the server
    adds ``(1/n) sum_{i in S_t} m_i``. Use ``client`` as replay_steps' client and the object as its server; ``mean_y``
    records ``(1/n) sum_i y_i`` after every step (y of the arrived jobs only)."""

    def __init__(self, num_clients: int, x_init: np.ndarray):
        self.y = np.tile(np.asarray(x_init, np.float64), (num_clients, 1))
        self.mean_y: list[np.ndarray] = []

    def client(self, c, start, delta):
        x_new = start + delta
        message = x_new - self.y[c]
        self.y[c] = x_new
        return message

    def __call__(self, x, t, arrivals):
        x = x + sum((a.message for a in arrivals), np.zeros_like(x)) / self.y.shape[0]
        self.mean_y.append(self.y.mean(axis=0))
        return x


def area_step_sizes(schedule, lr_c: float, lr_d: float) -> np.ndarray:
    """float64 [T]: AREA's decreasing local step size of a job that starts from ``x_t``, ``lr_c / (k_t + lr_d)``
    with ``k_t = sum_{s < t} (|S_s| + 1)`` (receipts and aggregations before step t; initial jobs use t = 0)."""
    events = schedule.uploads_per_step + 1
    k = np.concatenate([[0], np.cumsum(events)[:-1]])
    return lr_c / (k + lr_d)


def as_fedavg_step():
    """AS-FedAvg: the new model is the mean of the local models ``x_start + Delta`` that arrive (unchanged if none)."""

    def step(x, t, arrivals):
        if not arrivals:
            return x
        return sum(a.start + a.message for a in arrivals) / len(arrivals)

    return step


class MIFAReference(ACEReference):
    """MIFA: a cache ``G`` (zeros) of every client's latest delta; ``G[c] <- store(Delta)`` for the arrivals, then
    ``x <- x + eta (1/n) sum_i G_i`` at every step (ACE's rule on deltas, which point downhill)."""

    direction = 1.0


class CachedCA2FLReference:
    """CA2FL with a cache that holds ``store(Delta)`` (MF-CA2FL: a quantized delta), arrivals folded in order:
    ``v = hbar + (1/|S_t|) sum_k (fresh_k - prev_k)`` with ``hbar`` the mean of the stored rows before the step,
    ``prev_k`` the row client ``c_k`` held just before arrival ``k`` (for a client arriving twice, what its first
    arrival stored) and ``fresh_k = Delta_k`` (``store(Delta_k)`` with ``quantize_fresh``); then ``x += eta v``,
    ``cache[c_k] = store(Delta_k)``. With the identity store and one arrival per client this is CA2FLReference."""

    def __init__(self, num_clients: int, dim: int, server_lr: float, store: Callable = cache_store("float32"),
                 quantize_fresh: bool = False):
        self.cache = np.zeros((num_clients, dim))
        self.lr, self.store, self.quantize_fresh = server_lr, store, quantize_fresh

    def __call__(self, x, t, arrivals):
        if not arrivals:
            return x
        hbar = self.cache.mean(axis=0)
        acc = np.zeros_like(x)
        for a in arrivals:
            stored = self.store(a.message)
            acc += (stored if self.quantize_fresh else a.message) - self.cache[a.client]
            self.cache[a.client] = stored
        return x + self.lr * (hbar + acc / len(arrivals))
