"""Runs over several processes (multi-controller JAX): start-up, global inputs, gathered outputs.

With ``jax.distributed`` every process runs the same program on its own devices (one process per host, or several
on one machine); ``jax.devices()`` lists the devices of every process and ``jax.local_devices()`` those of this one.
A run spread over them (``shard_replicas`` or ``shard_clients``) needs three things that one process does not:

* **global inputs**: the host arrays every process builds identically (data, schedules, keys, hyper-parameters) are
  turned into ``jax.Array`` objects spread over all devices with :func:`put_global` (each process places only its
  own shards: ``jax.make_array_from_callback``); :func:`check_same_everywhere` refuses processes that were started with
  different inputs (a different configuration or seed), which would otherwise give a silently wrong run;
* **gathered outputs**: what the host reads (metrics, divergence steps, clock counters, final models) is gathered
  with :func:`to_host` (``multihost_utils.process_allgather`` for arrays split across processes), so every process
  holds the whole History. Gathering is a collective: every process must call it, in the same order;
* **one writer**: only process 0 (:func:`is_primary`) writes result files; checkpoints are written by every process
  (each its own shards, see :mod:`asyncfl_jax.checkpoint`).

:func:`initialize` starts the runtime (before anything touches a JAX device); :func:`initialize_from_env` reads the
``ASYNCFL_*`` environment variables the command line and ``asyncfl-launch-local`` (:mod:`asyncfl_jax.launch_local`) use.
"""

from __future__ import annotations

import hashlib
import os
import threading
from typing import Any, Callable, Mapping, Sequence

import jax
import numpy as np

ENV_COORDINATOR = "ASYNCFL_COORDINATOR"
ENV_NUM_PROCESSES = "ASYNCFL_NUM_PROCESSES"
ENV_PROCESS_ID = "ASYNCFL_PROCESS_ID"
ENV_TIMEOUT = "ASYNCFL_COORDINATOR_TIMEOUT"


def process_count() -> int:
    """The number of processes of this run (1 without ``jax.distributed``)."""
    return jax.process_count()


def is_primary() -> bool:
    """Whether this process writes the result files (process 0)."""
    return jax.process_index() == 0


def sync(name: str) -> None:
    """A barrier across the processes (nothing to wait for with one process)."""
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        multihost_utils.sync_global_devices(f"asyncfl_jax:{name}")


def _check_launch(coordinator: str | None, num_processes: int | None, process_id: int | None) -> None:
    """Refuses an incomplete or inconsistent launch before the runtime starts (``ValueError`` naming the option)."""
    given = {"coordinator": coordinator, "num_processes": num_processes, "process_id": process_id}
    missing = [k for k, v in given.items() if v is None]
    if missing and len(missing) < 3:
        raise ValueError(f"a run over several processes needs the coordinator, the number of processes and this "
                         f"process's id together; missing: {', '.join(missing)} (or give none of them to let "
                         f"jax.distributed.initialize() read the cluster's environment, e.g. SLURM)")
    if coordinator is not None:
        host, _, port = coordinator.rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"invalid coordinator {coordinator!r}: expected HOST:PORT, e.g. localhost:12355")
    if num_processes is not None:
        if isinstance(num_processes, bool) or not isinstance(num_processes, int) or num_processes < 1:
            raise ValueError(f"invalid number of processes {num_processes!r}: must be an integer >= 1")
        if isinstance(process_id, bool) or not isinstance(process_id, int) or not 0 <= process_id < num_processes:
            raise ValueError(f"invalid process id {process_id!r}: must be an integer in [0, {num_processes - 1}] "
                             f"for {num_processes} processes")


DEFAULT_TIMEOUT = 120.0
"""Seconds a process waits for the coordinator and the other processes at start-up, and the heartbeat timeout after
which the runtime declares a silent process dead (``--coordinator-timeout``)."""


def _watchdog(seconds: float, message: str) -> threading.Event:
    """Ends the process with exit code 2 and ``message`` on stderr unless the returned event is set within
    ``seconds`` (``jax.distributed.initialize`` cannot be interrupted: at its own timeout it aborts the process with
    a C++ stack trace)."""
    done = threading.Event()

    def watch() -> None:
        if not done.wait(seconds):
            from asyncfl_jax import _signals

            os.write(2, f"asyncfl: error: {message}\n".encode())
            _signals.exit_now(2)

    threading.Thread(target=watch, name="asyncfl-coordinator-watchdog", daemon=True).start()
    return done


def initialize(coordinator: str | None = None, num_processes: int | None = None, process_id: int | None = None,
               cluster: bool = False, timeout: float = DEFAULT_TIMEOUT) -> bool:
    """Starts the multi-controller runtime (``jax.distributed.initialize``); returns whether it was started.

    Give the coordinator (``HOST:PORT`` of process 0, reachable from every process), the number of processes and this
    process's id together; or none of them with ``cluster=True`` to let JAX read a cluster's environment (SLURM,
    Open MPI, Cloud TPU). Nothing happens with none of them and ``cluster=False``, or with ``num_processes == 1``.
    On CPU the cross-process collectives are gloo's (``jax_cpu_collectives_implementation``). Must be called before
    anything touches a JAX device (``jax.devices()``, any array); raises ``ValueError`` for an incomplete or invalid
    launch and ``RuntimeError`` when JAX's backends already started.

    ``timeout`` (seconds): when the coordinator or a process does not show up within it, the process ends with exit
    code 2 and a message naming this process and the coordinator (not JAX's abort after 300 s); it is also the
    runtime's heartbeat timeout, after which a process that stopped answering (killed) is declared dead.
    """
    _check_launch(coordinator, num_processes, process_id)
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 < timeout < 86_400:
        raise ValueError(f"invalid coordinator timeout {timeout!r}: must be a number of seconds in (0, 86400)")
    if coordinator is None and not cluster:
        return False
    if num_processes == 1:
        return False
    if jax.distributed.is_initialized():  # started already (by the caller): nothing to do
        return True
    from jax._src import xla_bridge  # noqa: PLC0415  (the only way to ask whether a backend already started)

    if xla_bridge.backends_are_initialized():
        raise RuntimeError("jax.distributed must start before JAX uses a device; call asyncfl_jax.distributed."
                           "initialize (or pass the launch options) before any other JAX call")
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    who = f"process {process_id} of {num_processes}" if process_id is not None else "this process"
    done = _watchdog(timeout, f"{who} could not start the run with the coordinator {coordinator or '(from the cluster)'} "
                              f"within {timeout:g} s (--coordinator-timeout): "
                              + ("the coordinator (process 0) is not reachable there" if process_id else
                                 "not every process connected to it")
                              + "; check that every process was started with the same coordinator and number of "
                                "processes and that process 0 runs")
    timeouts = {"initialization_timeout": int(timeout) + 60, "heartbeat_timeout_seconds": max(1, int(timeout))}
    try:
        if coordinator is None:
            jax.distributed.initialize(**timeouts)
        else:
            jax.distributed.initialize(coordinator_address=coordinator, num_processes=num_processes,
                                       process_id=process_id, **timeouts)
    finally:
        done.set()
    return True


def launch_from_env(environ: Mapping[str, str] | None = None) -> tuple[str | None, int | None, int | None]:
    """(coordinator, number of processes, process id) from ``ASYNCFL_COORDINATOR``, ``ASYNCFL_NUM_PROCESSES`` and
    ``ASYNCFL_PROCESS_ID`` (None where unset); ``ValueError`` for a count or id that is not an integer."""
    environ = os.environ if environ is None else environ

    def integer(name: str) -> int | None:
        value = environ.get(name)
        if value is None or value == "":
            return None
        try:
            return int(value)
        except ValueError:
            raise ValueError(f"invalid {name} = {value!r}: must be an integer") from None

    return environ.get(ENV_COORDINATOR) or None, integer(ENV_NUM_PROCESSES), integer(ENV_PROCESS_ID)


# ---------------------------------------------------------------------------------------------------- arrays
def _spans_processes(leaf: Any) -> bool:
    return isinstance(leaf, jax.Array) and not leaf.is_fully_addressable


def to_host(tree: Any) -> Any:
    """``tree`` with every leaf a numpy array holding its whole (global) value.

    A ``jax.Array`` split across processes is gathered (``multihost_utils.process_allgather``, one collective for
    all such leaves: every process must call this with arrays of the same shardings, in the same order); a replicated
    one is read from this process's copy; anything else goes through ``np.asarray``."""
    leaves, treedef = jax.tree_util.tree_flatten(tree)
    split = [i for i, leaf in enumerate(leaves) if _spans_processes(leaf) and not leaf.is_fully_replicated]
    out = [np.asarray(leaf) for leaf in leaves] if not split else list(leaves)
    if split:
        from jax.experimental import multihost_utils

        gathered = multihost_utils.process_allgather([leaves[i] for i in split], tiled=True)
        for i, value in zip(split, gathered):
            out[i] = value
        out = [np.asarray(leaf) for leaf in out]
    return jax.tree_util.tree_unflatten(treedef, out)


def put_global(tree: Any, shardings: Any) -> Any:
    """``tree`` placed with ``shardings`` (one ``Sharding``, or a tree of them matching ``tree``).

    With one process this is ``jax.device_put``. Over several processes every leaf must hold the same value on
    every process (a host array, or a ``jax.Array`` this process can read whole): each process builds only the
    shards of its own devices (``jax.make_array_from_callback``), so nothing crosses processes."""
    if jax.process_count() == 1:
        return jax.device_put(tree, shardings)
    if isinstance(shardings, jax.sharding.Sharding):
        shardings = jax.tree_util.tree_map(lambda _: shardings, tree)

    def put(leaf: Any, sharding: Any) -> Any:
        if _spans_processes(leaf):
            return jax.device_put(leaf, sharding)  # already global: a reshard among the same devices
        value = np.asarray(leaf)
        return jax.make_array_from_callback(value.shape, sharding, lambda index: value[index])

    return jax.tree_util.tree_map(put, tree, shardings)


def fingerprint(tree: Any) -> bytes:
    """SHA-256 of every leaf of ``tree`` (dtype, shape and bytes, read on the host), in tree order."""
    h = hashlib.sha256()
    for leaf in jax.tree_util.tree_leaves(tree):
        a = np.ascontiguousarray(np.asarray(leaf))
        h.update(f"{a.dtype.str}{a.shape}".encode())
        h.update(a.reshape(-1).view(np.uint8).tobytes())
    return h.digest()


def check_same_everywhere(what: str, tree: Any) -> None:
    """Refuses (``ValueError``) inputs that differ between the processes of a run (compared by their SHA-256, one
    small collective); nothing to compare with one process.

    Every process builds the run's inputs from its own configuration; processes started with another configuration,
    seed or dataset would otherwise compute one silently wrong run together."""
    if jax.process_count() == 1:
        return
    from jax.experimental import multihost_utils

    mine = np.frombuffer(fingerprint(tree), dtype=np.uint32)
    every = np.asarray(multihost_utils.process_allgather(mine))  # [processes, 8]
    differing = [p for p in range(every.shape[0]) if not np.array_equal(every[p], every[0])]
    if differing:
        raise ValueError(f"the {what} of process(es) {differing} differ from those of process 0: every process of a "
                         f"run must be started with the same configuration, seeds and data")


def initialize_from_options(coordinator: str | None = None, num_processes: int | None = None,
                            process_id: int | None = None, cluster: bool = False,
                            environ: Mapping[str, str] | None = None, timeout: float | None = None) -> bool:
    """:func:`initialize` from the command line's options, each falling back on its ``ASYNCFL_*`` environment
    variable (:func:`launch_from_env`; ``ASYNCFL_COORDINATOR_TIMEOUT`` for ``timeout``) when not given; returns
    whether the runtime was started."""
    env = launch_from_env(environ)
    given = (coordinator, num_processes, process_id)
    coordinator, num_processes, process_id = (g if g is not None else e for g, e in zip(given, env))
    if timeout is None:
        text = (os.environ if environ is None else environ).get(ENV_TIMEOUT) or ""
        try:
            timeout = float(text) if text else DEFAULT_TIMEOUT
        except ValueError:
            raise ValueError(f"invalid {ENV_TIMEOUT} = {text!r}: must be a number of seconds") from None
    return initialize(coordinator, num_processes, process_id, cluster=cluster, timeout=timeout)


def largest_everywhere(value: int) -> int:
    """The largest of the processes' ``value`` (one small collective; every process must call it at the same
    point), ``value`` itself with one process."""
    if jax.process_count() == 1:
        return int(value)
    from jax.experimental import multihost_utils

    return int(np.max(np.asarray(multihost_utils.process_allgather(np.int32(value)))))


def from_primary(decide: Callable[[], str], choices: Sequence[str]) -> str:
    """``decide()`` computed by process 0 alone and shared with every process (one small collective): what the
    output folder holds is process 0's to judge (it holds the folder's lock), so the others follow its decision
    instead of judging a folder that process 0 may already be writing to. When process 0 refuses (its exception is
    raised there), the other processes raise an :class:`~asyncfl_jax.errors.InputError` saying so. With one process:
    ``decide()``."""
    if jax.process_count() == 1:
        return decide()
    from jax.experimental import multihost_utils

    from asyncfl_jax.errors import InputError

    index, error = -1, None
    if is_primary():
        try:
            index = list(choices).index(decide())
        except Exception as e:  # noqa: BLE001 - raised below, after the others were told
            error = e
    shared = int(np.asarray(multihost_utils.broadcast_one_to_all(np.int32(index))))
    if error is not None:
        raise error
    if shared < 0:
        raise InputError(f"process 0 refused the run (its message says why); process {jax.process_index()} stops "
                         "with it")
    return list(choices)[shared]
