"""Helpers shared by the test modules: a small deterministic FL problem and its delay model, schedule padding, a job
replay, and the environment of a script run in a subprocess."""

from __future__ import annotations

import os
import re
import shlex
from typing import Mapping

import jax.numpy as jnp
import numpy as np

from asyncfl_jax.data.client_data import Dataset
from asyncfl_jax.models.core import model_from_apply
from asyncfl_jax.task import Task, make_task
from asyncfl_jax.timing.delays import DelayModel
from asyncfl_jax.timing.schedule import Schedule

FEATURES, CLASSES = 5, 3
TOY_DELAYS = DelayModel(speed="uniform", speed_low=1.0, speed_high=4.0, noise="exponential")
"""The delay model of the small schedules: client speeds 1-4x apart, exponential noise."""


def toy_problem(num_clients: int, seed: int = 0) -> tuple[Task, list[tuple[np.ndarray, np.ndarray]], np.ndarray]:
    """A small non-IID classification problem (client i's inputs are shifted by a client-specific mean) with a
    softmax-regression model: the engine's task, each client's (x, y) in float64 for the references, and the initial
    flat parameters ``x0`` (``W.ravel()`` then ``b``) in float64."""
    rng = np.random.default_rng(seed)
    sizes = rng.integers(4, 12, size=num_clients)
    xs, ys, parts, start = [], [], [], 0
    true_w = rng.normal(size=(FEATURES, CLASSES))
    for i, m in enumerate(sizes):
        x = rng.normal(loc=0.5 * i, size=(m, FEATURES)).astype(np.float32) / 3
        y = np.argmax(x @ true_w + rng.normal(scale=0.5, size=(m, CLASSES)), axis=1).astype(np.int32)
        xs.append(x), ys.append(y), parts.append(np.arange(start, start + m))
        start += m
    x_all, y_all = np.concatenate(xs), np.concatenate(ys)
    dataset = Dataset("toy", x_all, y_all, x_all[:10], y_all[:10], CLASSES)
    params = {"W": jnp.asarray(rng.normal(scale=0.1, size=(FEATURES, CLASSES)), jnp.float32),
              "b": jnp.zeros((CLASSES,), jnp.float32)}
    model = model_from_apply(lambda p, x: x.reshape(x.shape[0], -1) @ p["W"] + p["b"], params, "logreg")
    task = make_task(dataset, parts, model)
    client_data = [(xs[i].astype(np.float64), ys[i]) for i in range(num_clients)]
    x0 = np.concatenate([np.asarray(params["W"]).ravel(), np.asarray(params["b"])]).astype(np.float64)
    return task, client_data, x0


def common_widths(schedules: Mapping[str, Schedule]) -> dict[str, Schedule]:
    """The schedules padded to one arrival and one dispatch width, so that any subset of them stacks as replicas
    (``engine.stack_schedules`` pads the initial jobs itself)."""
    m = max(s.buffer_width for s in schedules.values())
    d = max(s.dispatch_width for s in schedules.values())
    out = {k: s.pad(buffer_width=m, dispatch_width=d) for k, s in schedules.items()}
    for s in out.values():
        s.validate()
    return out


def replay_jobs(s: Schedule) -> list[dict]:
    """Every job (client, version, start time, arrival step/time) by replaying the slot protocol. A slot written
    again before it is read held a discarded job (arrival None)."""
    jobs: list[dict] = []
    holder: dict[int, int] = {}

    def start(c: int, slot: int, version: int, when: float) -> None:
        holder[slot] = len(jobs)
        jobs.append({"client": c, "version": version, "start": when, "step": None, "arrival": None})

    for c, slot in zip(s.init_clients.tolist(), s.init_slots.tolist()):
        if c >= 0:
            start(c, slot, 0, s.init_time)
    for t in range(s.num_steps):
        for j in range(s.dispatch_width):
            c = int(s.dispatch_clients[t, j])
            if c >= 0:
                start(c, int(s.dispatch_slots[t, j]), t, float(s.dispatch_times[t, j]))
        for j in range(s.buffer_width):
            c = int(s.arrival_clients[t, j])
            if c >= 0:
                job = jobs[holder.pop(int(s.arrival_slots[t, j]))]
                assert job["client"] == c and job["version"] == s.arrival_versions[t, j]
                job["step"], job["arrival"] = t, float(s.arrival_times[t, j])
    return jobs


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def script_env(fast_compile: bool = True, **extra: str) -> dict[str, str]:
    """The environment of a script run in a subprocess: the repository on ``PYTHONPATH``, JAX on the CPU unless set,
    and (``fast_compile``) XLA's backend optimizations off, which cuts the compile time of the tiny runs."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")])),
               JAX_PLATFORMS=os.environ.get("JAX_PLATFORMS", "cpu"), **extra)
    if fast_compile:
        flags = [os.environ.get("XLA_FLAGS", ""), "--xla_backend_optimization_level=0"]
        env["XLA_FLAGS"] = " ".join(filter(None, flags))
    return env


def command_argv(command: str) -> tuple[list[str], str | None]:
    """The arguments after ``asyncfl`` of a documented shell command line (leading ``NAME=value`` environment
    settings dropped) and the file its stdout is redirected to (if any)."""
    words = shlex.split(command)
    while words and re.fullmatch(r"[A-Z_]+=.*", words[0]):  # environment variables (XLA_FLAGS)
        words.pop(0)
    assert words[0] == "asyncfl", command
    redirect = None
    if ">" in words:
        i = words.index(">")
        redirect, words = words[i + 1], words[:i]
    return words[1:], redirect
