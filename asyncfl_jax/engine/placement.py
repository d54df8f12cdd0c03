"""Placement: where a run's arrays live when there are several devices.

The program never looks at devices; a placement decides everything around it:

* :class:`SingleDevice`: everything on the default device (one CPU or accelerator); every placement derives from
  :class:`Placement`, which places nothing;
* :class:`ShardJobs`: the jobs trained together at a step are split over the devices (``constrain_jobs`` is the only
  hook inside the program); the state is replicated;
* :class:`ShardReplicas`: the replica axis (seeds x hyper-parameter points) of the carry and the inputs is split over
  the devices; the data and whatever replicas share are replicated;
* :class:`ShardClients`: every leaf of the state with a leading client axis (caches, residuals, client memories) is
  split along it, and so are the stores' per-slot arrays when their slot count splits evenly; the model and the data
  are replicated. XLA partitions the row gathers and scatters (a masked local gather and an all-reduce of the rows
  read, O(M d) per step), so no device ever holds all ``n`` rows.

Each is a ``jax.sharding.Mesh`` over ``jax.devices()`` (every device of every process). Results equal the
single-device run up to float rounding.

Over several processes (``jax.distributed``, see :mod:`asyncfl_jax.distributed`) the inputs every process builds
identically become global arrays (:func:`~asyncfl_jax.distributed.put_global`: each process places only its own
shards), so ``shard_replicas`` splits the replicas and ``shard_clients`` the per-client state across processes.
``shard_jobs`` and no placement are refused there (:func:`check_processes`): they would run the whole program on
every process.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import jax
import numpy as np

from asyncfl_jax.algorithms.base import Algorithm
from asyncfl_jax.distributed import put_global


@dataclasses.dataclass(frozen=True)
class Placed:
    """A run's inputs on their devices, the carry's shardings (None: one device) and the ``jax.jit`` options of the
    init and chunk functions."""

    hp: Any
    keys: Any
    data: Any
    inputs: Any
    carry: Any = None
    init_jit: dict = dataclasses.field(default_factory=dict)
    chunk_jit: dict = dataclasses.field(default_factory=dict)


class Placement:
    """Where a run's arrays live: the base of every placement, which itself keeps everything on the default device
    (nothing is placed). ``name`` is the ``shard_*`` option that chose it ("" for one device)."""

    name = ""
    splits_state = False  # whether the run's state is split over the devices (and processes): replicas or clients
    constrain_jobs: Callable[[jax.Array], jax.Array] | None = None

    def check(self, num_replicas: int, num_clients: int) -> None:
        del num_replicas, num_clients

    def place(self, carry_shape: Any, hp: Any, keys: Any, data: Any, inputs: Any, input_axes: Any,
              program: Any) -> Placed:
        del carry_shape, input_axes, program
        return Placed(hp, keys, data, inputs)

    def place_chunk(self, part: Any, chunk_axes: Any) -> Any:
        """A chunk's inputs (``Timeline.chunk_inputs``) placed like the run's inputs; as they are with one process
        (``jit`` places them), global arrays over several."""
        del chunk_axes
        return part


def _replicated_inputs(carry: Any, everywhere: Any, hp: Any, keys: Any, data: Any, inputs: Any) -> Placed:
    """The run's inputs placed with ``everywhere`` (a copy on every device, made once before the first chunk) and the
    carry with the shardings ``carry``, which the init and chunk programs also give their outputs (the chunk's
    records replicated)."""
    hp, keys, data, inputs = put_global((hp, keys, data, inputs), everywhere)
    return Placed(hp, keys, data, inputs, carry=carry, init_jit={"out_shardings": carry},
                  chunk_jit={"out_shardings": (carry, everywhere)})


def _mesh(axis: str) -> Any:
    from jax.sharding import Mesh

    return Mesh(np.array(jax.devices()), (axis,))


def job_sharding() -> Any:
    """A sharding that splits a 1-D array of jobs over every device."""
    from jax.sharding import NamedSharding, PartitionSpec

    return NamedSharding(_mesh("jobs"), PartitionSpec("jobs"))


class SingleDevice(Placement):
    """One device (the default placement): nothing is placed."""


class ShardJobs(Placement):
    """The jobs trained together at a step spread over every device."""

    name = "shard_jobs"

    def __init__(self) -> None:
        sharding = job_sharding()
        self.constrain_jobs = lambda a: jax.lax.with_sharding_constraint(a, sharding)

    def place(self, carry_shape: Any, hp: Any, keys: Any, data: Any, inputs: Any, input_axes: Any,
              program: Any) -> Placed:
        """The run's inputs (the data above all) and its state replicated on every device, once, before the first chunk.

        Left on the default device, they were copied to the other devices by every call of the chunk program (it
        runs on all of them): for Fashion-MNIST's 188 MB of training images about 66 ms per chunk on the 2-core
        CPU, 3.3 ms per server step of the FedBuff MLP with 20-step chunks, which is what made ``shard_jobs`` no
        faster than one device there (docs/benchmarks.md, "Issue 24 on a quiet machine")."""
        del input_axes, program
        from jax.sharding import NamedSharding, PartitionSpec

        everywhere = NamedSharding(_mesh("jobs"), PartitionSpec())
        # The state is replicated as well (every device runs the server's part of the step): said explicitly, so
        # that the memory budget counts a copy per device and a restored checkpoint goes straight to every device.
        return _replicated_inputs(jax.tree_util.tree_map(lambda _: everywhere, carry_shape), everywhere, hp, keys,
                                  data, inputs)


def replica_shardings(num_replicas: int) -> tuple[Any, Any]:
    """(replica axis over every device, replicated) shardings; raises ``ValueError`` when ``num_replicas`` is not a
    multiple of the number of devices."""
    from jax.sharding import NamedSharding, PartitionSpec

    devices = jax.devices()
    if num_replicas % len(devices):
        raise ValueError(f"shard_replicas needs a number of replicas (seeds x hyper-parameter points) that is a "
                         f"multiple of the {len(devices)} devices, got {num_replicas}")
    mesh = _mesh("replicas")
    return NamedSharding(mesh, PartitionSpec("replicas")), NamedSharding(mesh, PartitionSpec())


class ShardReplicas(Placement):
    """The replica axis over every device; what the replicas share (data, a shared schedule) is replicated."""

    name = "shard_replicas"
    splits_state = True

    def check(self, num_replicas: int, num_clients: int) -> None:
        replica_shardings(num_replicas)

    def place(self, carry_shape: Any, hp: Any, keys: Any, data: Any, inputs: Any, input_axes: Any,
              program: Any) -> Placed:
        over, everywhere = replica_shardings(int(keys.shape[0]))
        inputs = put_global(inputs, _by_replica_axis(inputs, input_axes))
        # Every output (carry, per-step records) keeps its replica axis spread over the devices.
        return Placed(put_global(hp, over), put_global(keys, over), put_global(data, everywhere), inputs,
                      carry=jax.tree_util.tree_map(lambda _: over, carry_shape), init_jit={"out_shardings": over},
                      chunk_jit={"out_shardings": over})

    def place_chunk(self, part: Any, chunk_axes: Any) -> Any:
        if jax.process_count() == 1:
            return part
        return put_global(part, _by_replica_axis(part, chunk_axes))


def _by_replica_axis(tree: Any, axes: Any) -> Any:
    """The sharding of each leaf of ``tree`` given its vmap axis (``axes``, an ``in_axes`` prefix): split along the
    replica axis (0) over every device, or replicated (None)."""
    from jax.sharding import NamedSharding, PartitionSpec

    mesh = _mesh("replicas")
    over, everywhere = NamedSharding(mesh, PartitionSpec("replicas")), NamedSharding(mesh, PartitionSpec())
    return jax.tree_util.tree_map(lambda _, axis: everywhere if axis is None else over, tree, _axes_like(axes, tree))


def _axes_like(axes: Any, tree: Any) -> Any:
    """The vmap ``in_axes`` prefix ``axes`` expanded to one entry per leaf of ``tree``."""
    if axes is None or isinstance(axes, int):
        return jax.tree_util.tree_map(lambda _: axes, tree)
    return type(axes)(*(_axes_like(a, t) for a, t in zip(axes, tree)))


def per_client_leaves(algorithm: Algorithm, x0: Any, num_clients: int) -> tuple[Any, Any]:
    """Which leaves of the server state and of the client state have a leading client axis (two pytrees of bools).

    A leaf is per-client when its leading dimension follows ``num_clients``: it is found by building both states
    (shapes only) for ``num_clients`` and ``num_clients + 1`` clients, so no algorithm has to declare it.
    """
    x0 = jax.ShapeDtypeStruct(np.shape(x0), x0.dtype)

    def flags(init: Callable[[jax.Array, int], Any]) -> Any:
        a = jax.eval_shape(lambda x: init(x, num_clients), x0)
        b = jax.eval_shape(lambda x: init(x, num_clients + 1), x0)
        return jax.tree_util.tree_map(lambda u, v: u.shape[:1] != v.shape[:1], a, b)

    return flags(algorithm.init), flags(algorithm.init_clients)


def client_shardings(carry_shape: Any, server_flags: Any, client_flags: Any, num_clients: int,
                     store_flags: Any = None) -> tuple[Any, Any]:
    """(carry sharding, replicated sharding) that spread the per-client state over every device.

    The leaves flagged by :func:`per_client_leaves` (shape ``[replicas, n, ...]`` in the vmapped carry) are split along
    their client axis, and so are the store's per-slot arrays (``store_flags``, default every store leaf; shape
    ``[replicas, slots, ...]``: messages in flight, or the event clock's job inputs) when the number of slots is a
    multiple of the number of devices. Everything else (the
    model, the data, the clock) is replicated. Raises ``ValueError`` when ``num_clients`` is not a multiple of the
    number of devices.
    """
    from jax.sharding import NamedSharding, PartitionSpec

    devices = jax.devices()
    if num_clients % len(devices):
        raise ValueError(f"shard_clients needs a number of clients that is a multiple of the {len(devices)} devices, "
                         f"got {num_clients}")
    mesh = _mesh("clients")
    spread, everywhere = NamedSharding(mesh, PartitionSpec(None, "clients")), NamedSharding(mesh, PartitionSpec())

    def by_flag(per_client: bool) -> Any:
        return spread if per_client else everywhere

    def by_slots(leaf: jax.ShapeDtypeStruct) -> Any:
        return spread if leaf.ndim >= 2 and leaf.shape[1] % len(devices) == 0 else everywhere

    placed = jax.tree_util.tree_map(lambda _: everywhere, carry_shape)
    if store_flags is None:  # every store leaf has a slot axis
        store_flags = jax.tree_util.tree_map(lambda _: True, carry_shape.store)
    placed_store = jax.tree_util.tree_map(lambda leaf, per_slot: by_slots(leaf) if per_slot else everywhere,
                                          carry_shape.store, store_flags)
    placed = placed._replace(server=jax.tree_util.tree_map(by_flag, server_flags),
                             clients=jax.tree_util.tree_map(by_flag, client_flags), store=placed_store)
    return placed, everywhere


class ShardClients(Placement):
    """The per-client state over every device along its client axis (see :func:`client_shardings`)."""

    name = "shard_clients"
    splits_state = True

    def check(self, num_replicas: int, num_clients: int) -> None:
        if num_clients % len(jax.devices()):
            raise ValueError(f"shard_clients needs a number of clients that is a multiple of the "
                             f"{len(jax.devices())} devices, got {num_clients}")

    def place(self, carry_shape: Any, hp: Any, keys: Any, data: Any, inputs: Any, input_axes: Any,
              program: Any) -> Placed:
        del input_axes
        n = program.num_clients
        flags = per_client_leaves(program.algorithm, data.x0, n)
        carry, everywhere = client_shardings(carry_shape, *flags, n, program.store.slot_leaves(carry_shape.store))
        return _replicated_inputs(carry, everywhere, hp, keys, data, inputs)

    def place_chunk(self, part: Any, chunk_axes: Any) -> Any:
        del chunk_axes
        if jax.process_count() == 1:
            return part
        from jax.sharding import NamedSharding, PartitionSpec

        return put_global(part, NamedSharding(_mesh("clients"), PartitionSpec()))


def check_processes(placement: Placement) -> None:
    """Refuses (``ValueError``) a placement that cannot spread a run over several processes: with
    ``jax.distributed`` only ``shard_replicas`` and ``shard_clients`` split the work between the processes (no
    placement, or ``shard_jobs``, would run the whole program on every process, or mix their devices)."""
    n = jax.process_count()
    if n > 1 and not placement.splits_state:
        chosen = placement.name or "no placement"
        raise ValueError(f"this run spans {n} processes (jax.distributed), which needs shard_replicas=True or "
                         f"shard_clients=True to split the work between them; got {chosen}")


PLACEMENT_OPTIONS = ("shard_jobs", "shard_replicas", "shard_clients")
"""The options that choose a placement (at most one of them)."""


def placement_conflict(shard_jobs: bool, shard_replicas: bool, shard_clients: bool) -> tuple[str, str] | None:
    """None when at most one switch is on; else the last one on and the earlier ones it cannot be combined with
    (``("shard_clients", "shard_jobs or shard_replicas")``)."""
    on = [name for name, flag in zip(PLACEMENT_OPTIONS, (shard_jobs, shard_replicas, shard_clients)) if flag]
    if len(on) < 2:
        return None
    earlier = PLACEMENT_OPTIONS[:PLACEMENT_OPTIONS.index(on[-1])]
    return on[-1], " or ".join(earlier)


def make_placement(shard_jobs: bool = False, shard_replicas: bool = False, shard_clients: bool = False) -> Placement:
    """The placement the ``shard_*`` options ask for (at most one of them: :func:`placement_conflict`)."""
    conflict = placement_conflict(shard_jobs, shard_replicas, shard_clients)
    if conflict is not None:
        raise ValueError(f"{conflict[0]} cannot be combined with {conflict[1]}: choose one axis to spread over the "
                         "devices")
    chosen = [cls for on, cls in ((shard_jobs, ShardJobs), (shard_replicas, ShardReplicas),
                                  (shard_clients, ShardClients)) if on]
    return chosen[0]() if chosen else SingleDevice()
