"""The memory budget of a run: the carry's shapes before anything is compiled, XLA's own analysis after.

Three checks, each refusing with :class:`MemoryRefusal` (a ``MemoryError``; the ``asyncfl`` command ends with exit
code 2 and its message): :func:`asyncfl_jax.preflight.check_memory` from the configuration alone (before data and
schedules are built), :meth:`MemoryBudget.check` from the prepared run's carry shapes (before compiling), and
:func:`check_compiled` from ``compiled.memory_analysis()`` of the compiled chunk (arguments, outputs and XLA's
temporaries: the activations of local training, the lookahead buffer) before it first runs.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import jax
import numpy as np


class MemoryRefusal(MemoryError):
    """A run refused before it allocates what cannot fit; the message names the sizes and the option to lower."""


@dataclasses.dataclass(frozen=True)
class MemoryBudget:
    """Bytes the simulation state needs on the device, known before anything is compiled.

    Attributes:
      server: the algorithms' server states of all replicas (the model, and n x d caches where there are).
      clients: per-client state of all replicas (AREA's client memory, ...).
      pending: messages of the jobs in flight (``num_slots`` per replica).
      data: the task's arrays (training set, evaluation sets), shared by the replicas.
      replicas: number of replicas.
      available: bytes one device can hold (physical memory on a CPU, the allocator limit on a GPU), or None.
      devices: number of devices the state is placed on (``shard_replicas``, ``shard_clients``), 1 otherwise.
      device_state: bytes of the state the most loaded device holds (its shards and the replicated leaves);
        ``None``: all of it (one device).
      shared_memory: the devices share one memory (host devices of a CPU), so ``available`` holds all of them.
      activations: the layer outputs one local step keeps for the backward pass, on the most loaded device
        (:mod:`asyncfl_jax.engine.activations`: batch x per example x jobs and replicas trained together).
    """

    server: int
    clients: int
    pending: int
    data: int
    replicas: int
    available: int | None
    devices: int = 1
    device_state: int | None = None
    shared_memory: bool = False
    activations: int = 0

    @property
    def state(self) -> int:
        return self.server + self.clients + self.pending

    @property
    def total(self) -> int:
        return self.state + self.data + self.activations

    @property
    def state_per_device(self) -> int:
        """Bytes of the state on the most loaded device (all of it on one device)."""
        return self.state if self.device_state is None else self.device_state

    @property
    def per_device(self) -> int:
        """Bytes one device holds: its share of the state, a copy of the data and its local step's activations."""
        return self.state_per_device + self.data + self.activations

    def describe(self) -> str:
        room = f" of {_gib(self.available)} available" if self.available else ""
        text = (f"memory budget {_gib(self.total)}{room}: state {_gib(self.state)} for {self.replicas} replica(s) "
                f"(server {_gib(self.server)}, clients {_gib(self.clients)}, in-flight messages "
                f"{_gib(self.pending)}), data {_gib(self.data)}, activations of a local step "
                f"{_gib(self.activations)}")
        if self.devices > 1:
            text += (f"; over {self.devices} devices: {_gib(self.per_device)} per device (state share, data and "
                     "activations)")
        return text

    def check(self, fraction: float = 0.9) -> None:
        """Raises :class:`MemoryRefusal` (a ``MemoryError``; before compiling) when the state and the data cannot
        fit ``fraction`` of the device(s)' memory (:func:`device_memory_bytes`: the allocator's ``bytes_limit`` on an
        accelerator).

        The state is counted once: the host loop donates the carry to every chunk (``donate_argnums``), so XLA
        updates it in place (the compiled chunk's outputs alias its inputs; ``tests/test_accelerator_path.py``
        checks it for ACE's and CA2FL's ``n x d`` caches). What this cannot see (local training's activations, the
        lookahead buffer) is checked on XLA's own analysis of the compiled chunk (:func:`check_compiled`)."""
        state = self.state_per_device
        needed = state + self.data + self.activations
        where = "the device has"
        if self.devices > 1:
            where = f"each of the {self.devices} devices has"
            if self.shared_memory:  # host devices of one CPU: all their shares in one memory
                needed, where = self.devices * needed, f"the {self.devices} devices share"
        if self.available and needed > fraction * self.available:
            if self.activations > state + self.data:
                raise MemoryRefusal(
                    f"this run needs about {_gib(needed)}: the activations of a local training step take "
                    f"{_gib(self.activations)} (the batch x the layer outputs of one example x the jobs and replicas "
                    f"trained together), the state {_gib(state)} and the data {_gib(self.data)}, but {where} "
                    f"{_gib(self.available)}: lower local.batch_size, train fewer jobs at a time (job_executor "
                    "'unrolled' or 'grouped:G'; a smaller buffer_size) or fewer replicas together (replica_batch)")
            raise MemoryRefusal(
                f"this run needs about {_gib(needed)} (the simulation state of {_gib(state)}"
                f"{' per device' if self.devices > 1 else ''}, plus {_gib(self.data)} of data"
                f"{' on each device' if self.devices > 1 else ''}, plus {_gib(self.activations)} of activations of "
                f"a local step) but {where} {_gib(self.available)}: use fewer "
                "replicas or clients, a smaller per-client cache (an algorithm option cache='bfloat16' or 'int8'), "
                "or spread the per-client state over several accelerators (shard_clients)"
            )

    def as_dict(self) -> dict[str, Any]:
        return {"server_bytes": self.server, "clients_bytes": self.clients, "pending_bytes": self.pending,
                "data_bytes": self.data, "replicas": self.replicas, "available_bytes": self.available,
                "devices": self.devices, "device_state_bytes": self.device_state,
                "activations_bytes": self.activations}


def format_bytes(nbytes: int | None) -> str:
    """``nbytes`` in KiB, MiB or GiB for messages ("?" for None)."""
    return _gib(nbytes)


def _gib(nbytes: int | None) -> str:
    if nbytes is None:
        return "?"
    if nbytes >= 2**28:
        return f"{nbytes / 2**30:.2f} GiB"
    return f"{nbytes / 2**20:.1f} MiB" if nbytes >= 2**20 else f"{nbytes / 2**10:.1f} KiB"


def _tree_bytes(tree: Any) -> int:
    return int(sum(np.prod(leaf.shape, dtype=np.int64) * np.dtype(leaf.dtype).itemsize
                   for leaf in jax.tree_util.tree_leaves(tree)))


def device_memory_bytes(device: Any = None) -> int | None:
    """Memory one device can hold: the allocator limit of an accelerator, physical memory for the CPU."""
    device = device or jax.devices()[0]
    try:
        stats = device.memory_stats()
    except Exception:  # noqa: BLE001 - not every backend reports statistics
        stats = None
    if stats and stats.get("bytes_limit"):
        return int(stats["bytes_limit"])
    if device.platform == "cpu":
        try:
            return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
        except (ValueError, OSError, AttributeError):
            return None
    return None


def host_memory_bytes() -> int | None:
    """The machine's physical memory (None where the system does not say)."""
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return None


def compiled_bytes(compiled: Any) -> int | None:
    """Bytes a compiled XLA program holds while it runs, from ``compiled.memory_analysis()``: arguments + outputs -
    the donated buffers they share (aliases) + temporaries (activations, the scan's buffers). None where the backend
    gives no analysis."""
    try:
        stats = compiled.memory_analysis()
    except Exception:  # noqa: BLE001 - not every backend implements it
        return None
    if stats is None:
        return None
    fields = ("argument_size_in_bytes", "output_size_in_bytes", "alias_size_in_bytes", "temp_size_in_bytes")
    if not all(hasattr(stats, f) for f in fields):
        return None
    arg, out, alias, temp = (int(getattr(stats, f)) for f in fields)
    return arg + out - alias + temp


def check_compiled(compiled: Any, label: str, available: int | None = None, fraction: float = 0.9,
                   what: str = "server-step chunk") -> int | None:
    """Refuses (:class:`MemoryRefusal`) a compiled program (``what``: the server-step chunk, or the initialization,
    which may train every client once) whose XLA memory analysis (:func:`compiled_bytes`) exceeds ``fraction`` of one
    device's memory (``available``, default :func:`device_memory_bytes`), before it runs. Returns the analysed bytes
    (None: no analysis)."""
    needed = compiled_bytes(compiled)
    available = device_memory_bytes() if available is None else available
    if needed is not None and available and needed > fraction * available:
        raise MemoryRefusal(
            f"{label}: the compiled {what} needs {_gib(needed)} (XLA's memory analysis: the state, the "
            f"program's inputs and outputs and its temporaries such as local training's activations and the lookahead "
            f"buffer) but the device has {_gib(available)}: lower local.batch_size, --lookahead, --eval-every (the "
            "chunk length), the seeds or swept hyper-parameters, or data.num_clients")
    return needed


def memory_budget(carry_shape: Any, data: Any, num_replicas: int, placement: Any = None) -> MemoryBudget:
    """The :class:`MemoryBudget` of a run whose vmapped carry has the shapes ``carry_shape``.

    ``placement``: the carry's shardings (a pytree of ``jax.sharding.Sharding`` matching the carry) when it is spread
    over several devices; each leaf then counts its largest shard on the device that holds it. The jobs in flight are
    the store's state (messages, lookahead buffer, or the event clock's job inputs) and the clock's.
    """
    states = (carry_shape.server, carry_shape.clients, (carry_shape.clock, carry_shape.store))
    devices, device_state, shared = 1, None, False
    if placement is not None:
        places = (placement.server, placement.clients, (placement.clock, placement.store))
        device_state = sum(_tree_bytes(jax.tree_util.tree_map(_one_shard, tree, where)) for tree, where in
                           zip(states, places))
        devices = len(jax.tree_util.tree_leaves(placement)[0].device_set)
        shared = jax.devices()[0].platform == "cpu"
    return MemoryBudget(server=_tree_bytes(states[0]), clients=_tree_bytes(states[1]), pending=_tree_bytes(states[2]),
                        data=_tree_bytes(data), replicas=int(num_replicas), available=device_memory_bytes(),
                        devices=devices, device_state=device_state, shared_memory=shared)


def _one_shard(leaf: jax.ShapeDtypeStruct, sharding: Any) -> jax.ShapeDtypeStruct:
    """The shape of the largest shard of ``leaf`` under ``sharding``."""
    return jax.ShapeDtypeStruct(sharding.shard_shape(leaf.shape), leaf.dtype)
