"""Memory known from a configuration alone, before any data, schedule or state is built.

:func:`estimate_memory` reads only the configuration (numbers of clients, steps, seeds and swept points), the
datasets' known sizes (:data:`DATASET_SIZES`), the model's parameter count (``jax.eval_shape`` of its
initialisation: nothing is allocated) and the algorithm's server and per-client state (``jax.eval_shape`` of its
``init`` and ``init_clients``). Every term is a *lower bound* of what the run will hold, so a refusal is never wrong:

- data (host, then device): ``N_examples x (4 x prod(input_shape) + 4)`` bytes (float32 features, int32 labels);
  LEAF Synthetic has ``N >= 50 n`` examples (each client's size is ``LogNormal(4, 2) + 50``); ``dirichlet_sampled``
  adds its ``n x examples_per_client`` int32 indices; a LEAF dataset at least one example per client;
- schedules (host, one per seed): ``T x (36 M + 8)`` bytes (per arrival its client, slot, version and time, per
  dispatch its client, slot and time; ``M`` arrivals per step, one for a server clock or the event clock);
- state (device): ``R x (server + clients)`` bytes for ``R`` replicas (seeds x swept points): the algorithm's server
  state (the model, and ``n x d`` caches where there are) and per-client state; the messages in flight are left out
  (compressed uploads may be smaller than float32). The scan carry is double-buffered while a chunk runs, so the
  state counts twice;
- activations (device): the layer outputs one local step keeps for the backward pass, ``batch x per example x jobs
  trained together x replicas computed together`` (:mod:`asyncfl_jax.engine.activations`; where the executor or
  the replica grouping is chosen automatically, one job and one replica at a time, so the bound holds).

:func:`check_memory` refuses (:class:`MemoryRefusal`, before anything is built) a configuration whose host part
exceeds 90% of the physical memory or whose device part exceeds 90% of one device's memory, and names the option to
lower. What this estimate cannot see (activations, temporaries of the compiled step, padding) is checked later: the
state's exact budget once the run is prepared (:meth:`~asyncfl_jax.engine.loop.Run.budget`), and XLA's own
``memory_analysis()`` of the compiled chunk before it runs (:func:`~asyncfl_jax.engine.budget.check_compiled`).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any

from asyncfl_jax.config import ConfigError, ExperimentConfig
from asyncfl_jax.engine.budget import MemoryRefusal, device_memory_bytes, format_bytes, host_memory_bytes

# name: (train examples, test examples, input shape, classes); None examples: known only from the files.
DATASET_SIZES: dict[str, tuple[int | None, int | None, tuple[int, ...], int]] = {
    "synthetic": (None, None, (60,), 10),
    "mnist": (60_000, 10_000, (28, 28, 1), 10),
    "fashion_mnist": (60_000, 10_000, (28, 28, 1), 10),
    "tfds/mnist": (60_000, 10_000, (28, 28, 1), 10),
    "tfds/fashion_mnist": (60_000, 10_000, (28, 28, 1), 10),
    "tfds/emnist": (697_932, 116_323, (28, 28, 1), 62),
    "tfds/cifar10": (50_000, 10_000, (32, 32, 3), 10),
    "tfds/cifar100": (50_000, 10_000, (32, 32, 3), 100),
    "leaf/femnist": (None, None, (28, 28, 1), 62),
    "leaf/shakespeare": (None, None, (80,), 80),
}
SYNTHETIC_MIN_SAMPLES = 50
FRACTION = 0.9


@dataclasses.dataclass(frozen=True)
class MemoryEstimate:
    """Lower bounds, in bytes, of what a configuration will hold (see the module docstring).

    Attributes:
      data: the dataset's arrays (on the host, and once more on the device).
      schedules: the schedules of every run's seeds (host; the largest run).
      state: the simulation state of the largest run, all replicas (device).
      replicas: replicas of that run; params: the model's parameter count d.
      dominant: for each part, the option that grows it most (named in a refusal).
    """

    data: int
    schedules: int
    state: int
    replicas: int
    params: int
    dominant: dict[str, str] = dataclasses.field(default_factory=dict)
    activations: int = 0  # local training's activations while a step runs (engine/activations.py)

    @property
    def host(self) -> int:
        return self.data + self.schedules

    @property
    def device(self) -> int:
        return 2 * self.state + self.data + self.activations


def _example_bytes(shape: tuple[int, ...]) -> int:
    return 4 * math.prod(shape) + 4


def data_examples(cfg: ExperimentConfig) -> int:
    """A lower bound of the examples the task will hold (train + test + sampled indices counted as examples)."""
    d = cfg.data
    train, test, _, _ = DATASET_SIZES[d.name]
    if d.name == "synthetic":
        return SYNTHETIC_MIN_SAMPLES * d.num_clients
    if train is None:  # LEAF: at least one example per client
        return d.num_clients
    return train + test


def check_partition_fits(cfg: ExperimentConfig) -> None:
    """Refuses (ConfigError) more clients than the dataset has training examples, or a ``min_size`` / number of
    shards it cannot give, for the datasets of known size, before anything is loaded."""
    d = cfg.data
    train = DATASET_SIZES[d.name][0]
    if train is None or d.partition in ("natural", "dirichlet_sampled"):
        return
    need, what = d.num_clients, "one example per client"
    if d.partition in ("dirichlet", "power_law"):
        need, what = d.num_clients * d.min_size, f"data.min_size = {d.min_size} examples per client"
    elif d.partition == "shards":
        need, what = d.num_clients * d.shards_per_client, f"data.shards_per_client = {d.shards_per_client} shards " \
                                                          "of at least one example per client"
    if need > train:
        raise ConfigError(f"invalid option data.num_clients = {d.num_clients}: {d.name} has {train} training examples, "
                          f"fewer than the {need} that {what} needs with partition {d.partition!r}; lower "
                          "data.num_clients, or use partition 'dirichlet_sampled' (any number of clients)")


def model_params(cfg: ExperimentConfig) -> int:
    """The model's parameter count d, from ``jax.eval_shape`` of its initialisation (nothing allocated)."""
    _, _, shape, classes = DATASET_SIZES[cfg.data.name]
    return _param_count(cfg.model.name, shape, classes, tuple(cfg.model.hidden))


@functools.lru_cache(maxsize=64)
def _param_count(name: str, shape: tuple[int, ...], classes: int, hidden: tuple[int, ...]) -> int:
    import jax

    from asyncfl_jax.models.core import make_model

    params = jax.eval_shape(lambda: make_model(name, shape, classes, 0, hidden).init_params)
    return int(sum(math.prod(leaf.shape) for leaf in jax.tree_util.tree_leaves(params)))


def _replicas(cfg: ExperimentConfig, run: Any) -> int:
    sweep = {**cfg.local.hparams(), **run.hparams}
    return len(cfg.seeds) * math.prod(len(v) if isinstance(v, (list, tuple)) else 1 for v in sweep.values())


def _state_bytes(run: Any, num_clients: int, d: int) -> int:
    """Server state + per-client state (``jax.eval_shape`` of the algorithm's init functions) of one replica."""
    import jax
    import jax.numpy as jnp

    from asyncfl_jax.algorithms import get_algorithm

    algorithm = get_algorithm(run.algorithm, **run.options)
    x0 = jax.ShapeDtypeStruct((d,), jnp.float32)
    trees = [jax.eval_shape(functools.partial(fn, num_clients=num_clients), x0)
             for fn in (_positional(algorithm.init), _positional(algorithm.init_clients))]
    nbytes = sum(math.prod(leaf.shape) * leaf.dtype.itemsize for tree in trees for leaf in jax.tree_util.tree_leaves(tree))
    return int(nbytes)  # the in-flight messages are left out: compressed uploads may take less than 4 bytes each


def _positional(fn: Any) -> Any:
    return lambda x0, num_clients: fn(x0, num_clients)


def _schedule_bytes(run: Any, num_clients: int, seeds: int) -> int:
    p = run.protocol
    per_step = 1 if p.name in ("all_active", "event_clock") or p.aggregation != "count" else \
        p.arrivals_per_step(num_clients)
    steps = run.num_steps(num_clients) if (run.steps is not None or run.arrivals is not None) else 0
    return seeds * steps * (36 * per_step + 8)


def estimate_memory(cfg: ExperimentConfig) -> MemoryEstimate:
    """The :class:`MemoryEstimate` of a validated configuration (see the module docstring)."""
    d = cfg.data
    shape = DATASET_SIZES[d.name][2]
    data = data_examples(cfg) * _example_bytes(shape)
    if d.partition == "dirichlet_sampled":
        data += 4 * d.num_clients * d.examples_per_client
    params = model_params(cfg)
    schedules = max(_schedule_bytes(run, d.num_clients, len(cfg.seeds)) for run in cfg.runs)
    states = [(_replicas(cfg, run) * _state_bytes(run, d.num_clients, params), _replicas(cfg, run))
              for run in cfg.runs]
    state, replicas = max(states)
    devices = _devices(cfg)
    activations = max(_activation_bytes(cfg, run) for run in cfg.runs)
    dominant = {
        "data": "data.num_clients" + (" or data.examples_per_client" if d.partition == "dirichlet_sampled" else ""),
        "schedules": "runs[i].steps or runs[i].arrivals (or the number of seeds)",
        "state": ("the seeds or swept hyper-parameters" if replicas > 1 else "data.num_clients")
                 + ", the model (model.name, model.hidden) or the algorithm's per-client state "
                 "(an option cache='bfloat16' or 'int8' where there is one)",
        "activations": "local.batch_size, the jobs trained together at a server step (runs[i].protocol.buffer_size"
                       ", or participants; --job-executor unrolled trains them one at a time) or the replicas "
                       "computed together (--replica-batch)",
    }
    return MemoryEstimate(data=data, schedules=schedules, state=state // devices, replicas=replicas, params=params,
                          dominant=dominant, activations=activations)


def activations_per_example(cfg: ExperimentConfig) -> int:
    """Bytes of the layer outputs of the configured model for one example
    (:func:`~asyncfl_jax.engine.activations.activation_bytes_per_example`)."""
    _, _, shape, classes = DATASET_SIZES[cfg.data.name]
    return _activations_per_example(cfg.model.name, shape, classes, tuple(cfg.model.hidden))


@functools.lru_cache(maxsize=64)
def _activations_per_example(name: str, shape: tuple[int, ...], classes: int, hidden: tuple[int, ...]) -> int:
    import jax
    import jax.numpy as jnp

    from asyncfl_jax.engine.activations import activation_bytes_per_example
    from asyncfl_jax.models.core import make_model

    example = jax.ShapeDtypeStruct(shape, jnp.int32 if name == "shakespeare_lstm" else jnp.float32)
    counted: list[int] = []

    def build() -> Any:  # the model built on abstract values (nothing computed); its forward pass traced
        model = make_model(name, shape, classes, 0, hidden)
        counted.append(activation_bytes_per_example(model.flat_apply, model.flat_params, example))
        return model.flat_params

    jax.eval_shape(build)
    return counted[0]


def _activation_bytes(cfg: ExperimentConfig, run: Any) -> int:
    """A lower bound of the activations of one local step of ``run``, all jobs and replicas trained together
    (:func:`~asyncfl_jax.engine.activations.local_step_activation_bytes`): the batch (``local.batch_size``, or a
    client's mean number of training examples for full batch), the jobs of a server step the executor trains at
    once (one at a time for ``auto``, which may choose ``unrolled``), and the replicas computed together (all of them
    only where that is known: ``replica_batch``, or an accelerator without ``replica_batch``; else one)."""
    import jax

    from asyncfl_jax.engine.activations import (jobs_in_parallel, local_step_activation_bytes,
                                                replicas_trained_together)

    d = cfg.data
    train = DATASET_SIZES[d.name][0]
    batch = cfg.local.batch_size or (max(1, train // d.num_clients) if train else 1)
    p = run.protocol
    jobs = p.arrivals_per_step(d.num_clients) if p.aggregation == "count" else 1
    from asyncfl_jax.engine.options import EngineOptions

    options = EngineOptions.from_config(cfg)
    together = replicas_trained_together(options, _replicas(cfg, run), jax.default_backend())
    return local_step_activation_bytes(activations_per_example(cfg), batch, jobs_in_parallel(options, jobs), together)


def _devices(cfg: ExperimentConfig) -> int:
    """Devices the state is spread over (shard_replicas / shard_clients), else 1."""
    from asyncfl_jax.engine.activations import devices_of
    from asyncfl_jax.engine.options import EngineOptions

    return devices_of(EngineOptions.from_config(cfg).placement)


def check_memory(cfg: ExperimentConfig, estimate: MemoryEstimate | None = None) -> MemoryEstimate:
    """Refuses (:class:`MemoryRefusal`, a ``MemoryError``) a validated configuration that cannot fit, before anything
    is built: first more clients than the dataset's examples (ConfigError), then the host part (data and schedules)
    against the physical memory and the device part (twice the state, plus the data) against one device's memory.
    Returns the estimate."""
    check_partition_fits(cfg)
    est = estimate or estimate_memory(cfg)
    host, device = host_memory_bytes(), device_memory_bytes()
    if host and est.host > FRACTION * host:
        part = "data" if est.data >= est.schedules else "schedules"
        raise MemoryRefusal(f"this configuration needs at least {format_bytes(est.host)} of host memory before it "
                            f"runs (data {format_bytes(est.data)}, schedules {format_bytes(est.schedules)}) but the "
                            f"machine has {format_bytes(host)}: lower {est.dominant[part]}")
    if device and est.device > FRACTION * device:
        parts = {"data": est.data, "state": 2 * est.state, "activations": est.activations}
        part = max(parts, key=parts.get)
        raise MemoryRefusal(f"this configuration needs at least {format_bytes(est.device)} of device memory (twice "
                            f"the simulation state of {format_bytes(est.state)} for {est.replicas} replica(s) of a "
                            f"model of {est.params} parameters, plus {format_bytes(est.data)} of data, plus "
                            f"{format_bytes(est.activations)} of activations of a local training step) but the device "
                            f"has {format_bytes(device)}: lower {est.dominant[part]}")
    return est
