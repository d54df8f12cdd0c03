"""An independent, plain event-by-event reference for the algorithms, written with numpy only.

It shares nothing with the package but the :class:`Schedule` it replays: the model (multinomial logistic regression),
its gradient, local training and every server rule are written out here by hand, in float64. Each arrival at step
``t`` that was computed on version ``v`` is trained lazily from the stored model ``x_v`` (full-batch steps, so there is
no randomness to share), and the server rules are applied arrival by arrival, in schedule order.
"""

from __future__ import annotations

import math
from typing import Callable

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
