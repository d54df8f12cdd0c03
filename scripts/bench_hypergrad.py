"""Memory and time of a reverse-mode hyper-gradient through a whole run, with and without rematerialization.

For each horizon T it compiles ``jax.value_and_grad`` of :func:`asyncfl_jax.make_objective`'s objective twice: with
one segment of T steps (``remat_steps=T``: the backward pass holds every step's intermediates) and with the default
segments of ``ceil(sqrt(T))`` steps, and reports XLA's temporary memory of each compiled program
(``memory_analysis().temp_size_in_bytes``), the time of one gradient and of one plain run (the median of
``--repeats`` calls after a warm-up call), side by side in one process::

    python scripts/bench_hypergrad.py --steps 250 1000
"""

from __future__ import annotations

import argparse
import json
import math
import time

import jax
import jax.numpy as jnp
import numpy as np

import asyncfl_jax as afl
from asyncfl_jax.precision import precision_scope


def median_seconds(fn, arg, repeats: int) -> float:
    jax.block_until_ready(fn(arg))  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn(arg))
        times.append(time.perf_counter() - start)
    return float(np.median(times))


def measure(task, local, steps: int, remat_steps: int | None, repeats: int) -> dict:
    schedule = afl.make_schedule("concurrent", task.num_clients, steps, afl.DelayModel(), seed=0, concurrency=8,
                                 buffer_size=4, refill="boundary")
    objective = afl.make_objective(task, afl.fedbuff(), schedule, local, {"client_lr": 0.05},
                                   wrt=("server_lr", "client_lr"), remat_steps=remat_steps)
    with precision_scope(objective.precision):
        theta = jnp.asarray(objective.point)
        gradient = jax.jit(jax.value_and_grad(objective.fn)).lower(theta).compile()
        run = jax.jit(objective.fn).lower(theta).compile()
        memory = gradient.memory_analysis()
        grad_s, run_s = median_seconds(gradient, theta, repeats), median_seconds(run, theta, repeats)
    return {"steps": steps, "remat_steps": remat_steps or math.isqrt(steps - 1) + 1,
            "temp_MiB": round(memory.temp_size_in_bytes / 2**20, 1) if memory is not None else None,
            "gradient_s": round(grad_s, 3), "run_s": round(run_s, 3), "gradient_in_runs": round(grad_s / run_s, 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, nargs="+", default=[250, 1000], help="horizons T (server steps)")
    parser.add_argument("--clients", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    dataset = afl.data.synthetic_leaf(num_clients=args.clients, seed=0)
    model = afl.make_model("mlp", dataset.input_shape, dataset.num_classes, hidden=(64,))
    task = afl.make_task(dataset, dataset.natural_partition, model)
    local = afl.LocalConfig(steps=5, batch_size=16)
    print(f"device: {jax.devices()[0].device_kind}; model: {task.num_params} parameters; float64")
    for steps in args.steps:
        for remat_steps in (steps, None):
            print(json.dumps(measure(task, local, steps, remat_steps, args.repeats)), flush=True)


if __name__ == "__main__":
    main()
