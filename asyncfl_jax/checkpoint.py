"""Checkpoints of a running simulation: the scan state between two chunks, saved atomically and resumed bit for bit.

A checkpoint folder (one per run, e.g. ``<out>/checkpoints/<run>/``) holds

* ``state-<chunk>/``: an `orbax <https://orbax.readthedocs.io>`_ checkpoint (tensorstore, OCDBT, uncompressed) of
  every leaf of the scan carry (:class:`~asyncfl_jax.engine.Carry`, replica axis included; any dtype, bfloat16 and
  int8 caches included, comes back bit for bit), the evaluation steps so far, the metrics of every evaluation so far
  and the in-scan clock's per-step records. The carry's leaves are handed to orbax as they are: a ``jax.Array``
  sharded over several devices (``shard_clients``, ``shard_replicas``), or over the devices of several hosts, is
  written shard by shard, each process writing its own, and :func:`load` can read it straight into given shardings;
* ``checkpoint.json``: the record that makes a state folder current: the format, the run's identity (see
  :func:`run_identity`), the state folder's name, the SHA-256 of each of its files, the shape and dtype of each
  stored array, the index of the next chunk and server step, the replicas whose divergence was already reported, the
  early-stop flag and the compile and run seconds so far; and ``record_sha256``, the SHA-256 of all of that
  (:func:`record_checksum`), so that a record edited by hand (e.g. ``next_chunk`` + 1, which would skip server steps)
  is refused.

Atomicity: orbax writes the state into ``state-<chunk>.orbax-checkpoint-tmp`` and, once every process has written
its shards, renames it to ``state-<chunk>`` (process 0, after writing ``commit_success.txt``). Then process 0 reads
the finalized folder back to hash it, flushing each file and folder to disk (``fsync``: orbax does not sync its
rename), and only then replaces the record (temporary file, ``fsync``, ``os.replace``), so the record never points
to an unfinished or unsynced state. Superseded, orphaned (finalized but never recorded) and temporary state folders
are deleted after that, and by the next :func:`save` or :func:`load`. A process killed at any instant therefore
leaves the previous checkpoint or the new one, never a mix. A state whose files do not match the record's SHA-256 is
refused with :class:`CheckpointError`, as is anything orbax cannot read, a record whose content does not match its
checksum, and a state that disagrees with its record (:func:`load` checks the chunk of the state folder's name, the
number of evaluations and the last evaluation step against ``next_chunk`` and ``next_step``, the evaluation steps
against the run's chunk length, and every array's shape and dtype). Saving the chunk of the current state again
writes ``state-<chunk>-1`` (and the other name the time after), never over the state the record points to.

The carry's tree structure is never stored (no pickle): it is rebuilt from the program with ``jax.eval_shape``.
Randomness needs no state: the key of a job is ``fold_in(fold_in(PRNGKey(seed), t + 1), j)`` and the server's is
``fold_in(fold_in(PRNGKey(seed), t + 1), SERVER_STREAM)``, pure functions of the seed and of the step ``t`` read from
the schedule, so restoring the carry and the chunk index restores the random streams.

orbax is imported only when a checkpoint is written or read (it adds 0.3 to 0.7 s to a process that has imported
jax), so that ``import asyncfl_jax`` and the command line start without it. Format 1 (``state-<chunk>.npz``) is refused with a
:class:`CheckpointError` that says so.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import re
import shutil
import signal
import threading
import time
from typing import Any, Iterator, Mapping, Sequence

import jax
import numpy as np

from asyncfl_jax.engine.state import LoopState  # (defined here before; the name stays importable here)
from asyncfl_jax.engine.replica_groups import whole_carry

FORMAT = 2  # 1: the carry as raw bytes in state-<chunk>.npz; 2: an orbax folder state-<chunk>/
RECORD = "checkpoint.json"
CHECKSUM = "record_sha256"  # the record's checksum of its own content (see record_checksum)
STATE_PREFIX = "state-"
# The entries of a checkpoint folder that belong to the checkpoint besides its record: state folders (finalized, or
# orbax's temporary ones), states of format 1, temporary record files of atomic_file.
OWNED = re.compile(r"state-\d{6,}(-1)?(\.orbax-checkpoint-tmp.*)?|state-\d{6,}\.npz|\.tmp-.*" + re.escape(RECORD))
RECORD_KEYS = ("identity", "state_dir", "state_files", "arrays", "next_chunk", "next_step", "num_chunks", "complete",
               "stopped_early", "reported", "metric_names", "trace_names", "carry_leaves", "compile_seconds",
               "run_seconds")


class CheckpointError(ValueError):
    """A checkpoint that cannot be used (unreadable, corrupt, or of another format)."""


class CheckpointMismatchError(CheckpointError):
    """The checkpoint was written by a different run (other schedules, replicas, algorithm, task...)."""


class SimulationInterrupted(KeyboardInterrupt):
    """Raised by :func:`~asyncfl_jax.engine.simulate` when Ctrl-C or SIGTERM stopped it after saving a checkpoint.

    A ``KeyboardInterrupt`` (so ``except Exception`` does not swallow it). Attributes: ``label`` (the run),
    ``reason`` ("SIGINT", "SIGTERM" or "KeyboardInterrupt"), ``step`` (server steps done and saved), ``num_steps``,
    ``checkpoint_dir`` and ``saved`` (False when no consistent state could be saved: the last checkpoint on disk, if
    any, is then older).
    """

    def __init__(self, label: str, reason: str, step: int, num_steps: int, checkpoint_dir: str | None, saved: bool):
        self.label, self.reason, self.step, self.num_steps = label, reason, step, num_steps
        self.checkpoint_dir, self.saved = checkpoint_dir, saved
        where = (f"checkpoint saved in {checkpoint_dir} after server step {step} of {num_steps}" if saved else
                 f"no new checkpoint could be saved (the last one in {checkpoint_dir}, if any, is older)"
                 if checkpoint_dir else "no checkpoint (checkpoint_dir not given)")
        super().__init__(f"{label}: interrupted by {reason}; {where}")


# ---------------------------------------------------------------------------------------------------- cadence
DEFAULT_INTERVAL = 60.0  # seconds of wall time between two checkpoints when neither option is given


@dataclasses.dataclass(frozen=True)
class Cadence:
    """When a running simulation saves a checkpoint besides the end and a signal: every ``every`` evaluation chunks,
    or once ``interval`` seconds of wall time have passed since the last save (checked after each chunk). Exactly
    one of the two is set; :func:`cadence` builds it from the user's options."""

    every: int | None = None
    interval: float | None = None

    def due(self, next_chunk: int, seconds_since_save: float) -> bool:
        """Whether the state after ``next_chunk`` chunks is saved, ``seconds_since_save`` after the last save (or
        the start of the loop)."""
        if self.every is not None:
            return next_chunk % self.every == 0
        return seconds_since_save >= self.interval

    def describe(self) -> str:
        return (f"every {self.every} chunk{'s' if self.every != 1 else ''}" if self.every is not None
                else f"every {self.interval:g} s")


def cadence(every: int | None = None, interval: float | None = None, *, every_name: str = "checkpoint_every",
            interval_name: str = "checkpoint_interval") -> Cadence:
    """The :class:`Cadence` of the options ``every`` (chunks, an integer >= 1) and ``interval`` (seconds, a finite
    number > 0); neither: every :data:`DEFAULT_INTERVAL` seconds. Both are refused (one of them would be ignored);
    the names in the messages are the caller's (e.g. ``--checkpoint-every``)."""
    if every is not None and interval is not None:
        raise ValueError(f"{every_name} = {every!r} and {interval_name} = {interval!r} cannot both be given: "
                         f"checkpoints are saved either every N chunks ({every_name}) or every so many seconds "
                         f"({interval_name}, default {DEFAULT_INTERVAL:g})")
    if every is not None:
        if isinstance(every, bool) or not isinstance(every, (int, np.integer)) or every < 1:
            raise ValueError(f"invalid option {every_name} = {every!r}: must be an integer >= 1")
        return Cadence(every=int(every))
    if interval is None:
        return Cadence(interval=DEFAULT_INTERVAL)
    if isinstance(interval, bool) or not isinstance(interval, (int, float, np.integer, np.floating)) or not (
            np.isfinite(interval) and interval > 0):
        raise ValueError(f"invalid option {interval_name} = {interval!r}: must be a number of seconds > 0")
    return Cadence(interval=float(interval))


# ---------------------------------------------------------------------------------------------------- identity
def hash_arrays(tree: Any) -> str:
    """SHA-256 of every leaf of ``tree`` (dtype, shape and bytes), in tree order (arrays split across the processes
    of a multi-process run are gathered first: every process must call it)."""
    from asyncfl_jax.distributed import to_host

    h = hashlib.sha256()
    for leaf in jax.tree_util.tree_leaves(to_host(tree)):
        a = np.ascontiguousarray(np.asarray(leaf))
        h.update(f"{a.dtype.str}{a.shape}".encode())
        h.update(a.reshape(-1).view(np.uint8).tobytes())
    return h.hexdigest()


def tree_signature(tree: Any) -> list[list[Any]]:
    """``[shape, dtype]`` of every leaf (arrays or ``ShapeDtypeStruct``)."""
    return [[list(leaf.shape), str(np.dtype(leaf.dtype))] for leaf in jax.tree_util.tree_leaves(tree)]


def _canonical(value: Any) -> Any:
    """A JSON round trip (tuples become lists, numpy scalars numbers, anything else its repr)."""

    def default(o: Any) -> Any:
        if isinstance(o, np.generic):
            return o.item()
        if isinstance(o, np.ndarray):
            return o.tolist()
        return repr(o)

    return json.loads(json.dumps(value, sort_keys=True, default=default))


def run_identity(
    *,
    label: str,
    algorithm: Any,
    local: Any,
    replicas: Sequence[Any],
    schedules: Any,
    num_slots: int,
    num_steps: int,
    eval_every: int,
    task: Any,
    data: Any,
    carry_shape: Any,
    engine: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """What a checkpoint must match to be resumed: everything that determines the run's result.

    The schedules enter as a hash of their arrays; the task as its name, number of clients and parameters, the
    shapes and dtypes of its arrays, a hash of the initial model ``x0`` (the data themselves are not hashed) and its
    evaluation split (held-out fractions and evaluated clients) when it has one. ``engine``: the engine options' part
    (:meth:`~asyncfl_jax.engine.options.EngineOptions.identity`: the placement's switches, and the trajectory's record
    shapes, the replica groups and the job executor when they differ from a plain run, so that other runs keep their
    identity).
    """
    return _canonical({
        "label": label,
        "algorithm": algorithm.name,
        "algorithm_options": dict(algorithm.options),
        "init_round": algorithm.init_round is not None,
        "local": local.identity(),
        "replicas": [{"seed": r.seed, "hparams": r.hparams} for r in replicas],
        "schedules": {"sha256": hash_arrays(schedules), "num_slots": int(num_slots)},
        "num_steps": int(num_steps),
        "eval_every": int(eval_every),
        "task": {"name": task.name, "num_clients": int(task.num_clients), "num_params": int(task.num_params),
                 "arrays": tree_signature(data), "x0_sha256": hash_arrays(data.x0),
                 **_evaluation_identity(task)},
        "carry": tree_signature(carry_shape),
        **dict(engine or {}),
    })


def _evaluation_identity(task: Any) -> dict[str, Any]:
    """The task's evaluation split (held-out fractions, evaluated clients) when it has one; nothing otherwise, so
    that the identity of a task without one is what it always was."""
    options = getattr(task, "evaluation_options", None)
    split = options() if callable(options) else {}
    return {"evaluation": split} if split else {}


def _differences(saved: Mapping[str, Any], current: Mapping[str, Any]) -> list[str]:
    out = []
    for key in sorted(set(saved) | set(current)):
        if saved.get(key) != current.get(key):
            a, b = json.dumps(saved.get(key)), json.dumps(current.get(key))
            if len(a) + len(b) > 200:
                a, b = a[:90] + "...", b[:90] + "..."
            out.append(f"{key} (checkpoint: {a}; this run: {b})")
    return out


# ---------------------------------------------------------------------------------------------------- state
def _is_primary() -> bool:
    """Whether this process writes the record and deletes files (process 0; every process of a multi-host run calls
    :func:`save` and :func:`load`, and orbax has each one write or read its own shards)."""
    return jax.process_index() == 0


def _sync_processes(name: str) -> None:
    """A barrier across the processes of a multi-host run (nothing to wait for with one process)."""
    if jax.process_count() > 1:
        from orbax.checkpoint import multihost

        multihost.sync_global_processes(f"asyncfl_jax.checkpoint:{name}")


def _checkpointer() -> Any:
    """A synchronous orbax checkpointer of array trees: ``save`` returns once the step folder is finalized (written
    to ``<name>.orbax-checkpoint-tmp`` and renamed to ``<name>`` by process 0 after every process wrote its shards).
    OCDBT (a few data files per process) and no compression: the arrays are stored as they are."""
    import orbax.checkpoint as ocp

    return ocp.Checkpointer(ocp.PyTreeCheckpointHandler(use_ocdbt=True, use_compression=False))


def _async_checkpointer() -> Any:
    """The asynchronous twin of :func:`_checkpointer` (same handler, same files): ``save`` returns once the arrays
    are handed over (device arrays brought to host memory; on a CPU a numpy view of the buffer, not a copy) and a
    background thread writes and finalizes the folder; ``wait_until_finished`` waits for it and raises its error."""
    import orbax.checkpoint as ocp

    return ocp.AsyncCheckpointer(ocp.PyTreeCheckpointHandler(use_ocdbt=True, use_compression=False))


def _state_arrays(state: LoopState) -> tuple[dict[str, Any], dict[str, list[Any]], int]:
    """The arrays of ``state`` under flat orbax keys (the carry's leaves as they are, device arrays and their
    shardings included), the layout of every key (``[shape, dtype]``, what the record keeps) and the number of carry
    leaves. Zero-size arrays (which orbax refuses) are left out of the arrays: their layout is enough to rebuild them.
    """
    arrays: dict[str, Any] = {}
    leaves = jax.tree_util.tree_leaves(whole_carry(state.carry))  # replicas computed in groups: joined
    for i, leaf in enumerate(leaves):
        arrays[f"c{i:04d}"] = _storable(leaf)
    arrays["eval_steps"] = np.asarray(state.eval_steps, np.int64)
    for i, rows in enumerate(state.metrics.values()):
        arrays[f"m{i:03d}"] = np.stack([np.asarray(r) for r in rows])
    for i, parts in enumerate(state.traces.values()):  # the in-scan clock's per-step records (steps on axis 1)
        arrays[f"t{i:03d}"] = np.concatenate([np.asarray(p) for p in parts], axis=1)
    layout = {key: [list(a.shape), str(np.dtype(a.dtype))] for key, a in arrays.items()}
    return {k: a for k, a in arrays.items() if a.size > 0}, layout, len(leaves)


def _storable(leaf: Any) -> Any:
    """A carry leaf as orbax can store it: a ``jax.Array`` as it is, except, in a multi-host run, one that lives on
    this process's devices only (orbax refuses those there; the value is taken to be the same on every process,
    as a replicated leaf is, and process 0 writes it as a numpy array); anything else as a numpy array."""
    if isinstance(leaf, jax.Array) and not (jax.process_count() > 1 and leaf.is_fully_addressable):
        return leaf
    return np.asarray(leaf)


def _state_name(chunk: int, current: str | None) -> str:
    """The folder of the state after ``chunk`` chunks: ``state-<chunk>``, or ``state-<chunk>-1`` when the current
    checkpoint is ``state-<chunk>`` (saving the same chunk again must not touch the state the record points to)."""
    name = f"{STATE_PREFIX}{chunk:06d}"
    return f"{name}-1" if name == current else name


def _current_state(directory: str) -> str | None:
    """The state folder that the record of ``directory`` points to (None without a readable record)."""
    try:
        record = read_record(directory)
    except CheckpointError:
        return None
    return None if record is None else record.get("state_dir")


def _remove_stale(directory: str, keep: str | None) -> None:
    """Deletes, on process 0, every entry of ``directory`` that belongs to a checkpoint (see ``OWNED``) but ``keep``:
    orbax's temporary folders left by a killed or failed write (``state-<chunk>.orbax-checkpoint-tmp``), finalized
    folders that no record points to, states superseded by a newer record, ``.npz`` states of format 1 and temporary
    record files. Other files stay."""
    if not _is_primary() or not os.path.isdir(directory):
        return
    for name in os.listdir(directory):
        if name == keep or not OWNED.fullmatch(name):
            continue
        path = os.path.join(directory, name)
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path, ignore_errors=True)
        else:
            with contextlib.suppress(FileNotFoundError):
                os.remove(path)


def _fsync(path: str) -> None:
    """Flushes a file or folder to disk (a folder: the names in it, e.g. after a rename)."""
    with contextlib.suppress(OSError):  # e.g. a platform where folders cannot be opened
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _file_hashes(folder: str, sync: bool = False) -> dict[str, str]:
    """SHA-256 of every file under ``folder`` (by path relative to it, ``/``-separated). With ``sync`` each file and
    folder is also flushed to disk (orbax does not sync its rename), so that the record written next never points
    to a state that a power cut could lose."""
    hashes = {}
    for root, dirs, files in os.walk(folder):
        dirs.sort()
        for name in sorted(files):
            path = os.path.join(root, name)
            h = hashlib.sha256()
            with open(path, "rb") as f:
                for block in iter(lambda: f.read(1 << 22), b""):
                    h.update(block)
                if sync:
                    os.fsync(f.fileno())
            hashes[os.path.relpath(path, folder).replace(os.sep, "/")] = h.hexdigest()
        if sync:
            _fsync(root)
    return hashes


def _shorter(message: str, limit: int = 600) -> str:
    """An error message of orbax or tensorstore without the JSON spec that tensorstore appends, and cut in the middle
    when still longer than ``limit`` characters (its start says what failed, its end the system's error)."""
    message = re.sub(r"\s*\[tensorstore_spec='.*?'\]", "", message, flags=re.DOTALL)
    half = limit // 2
    return message if len(message) <= limit else f"{message[:half]} ... {message[-half:]}"


def _write_state(path: str, arrays: Mapping[str, Any]) -> None:
    """Writes ``arrays`` as the orbax checkpoint folder ``path`` (on every process) and returns once it is
    finalized. On an error, :class:`CheckpointError` says why (e.g. a full disk) and the temporary folder is removed
    (the next save or load removes it otherwise: orbax's writing threads may still add to it for a moment)."""
    import orbax.checkpoint as ocp

    from asyncfl_jax.quiet import library_logs_held

    checkpointer = _checkpointer()
    with library_logs_held():  # orbax's threads would log each failure with its traceback; it is raised below
        try:
            checkpointer.save(path, args=ocp.args.PyTreeSave(dict(arrays)))
        except Exception as e:  # orbax and tensorstore raise many types (OSError, ValueError, RuntimeError...)
            raise _write_error(path, e, checkpointer) from e
        checkpointer.close()


def _start_state(path: str, arrays: Mapping[str, Any]) -> Any:
    """Starts writing ``arrays`` as the orbax checkpoint folder ``path`` and returns the asynchronous checkpointer
    once the arrays are handed over (:func:`_async_checkpointer`); :func:`_finish_state` waits for the folder."""
    import orbax.checkpoint as ocp

    checkpointer = _async_checkpointer()
    try:
        checkpointer.save(path, args=ocp.args.PyTreeSave(dict(arrays)))
    except Exception as e:  # noqa: BLE001
        raise _write_error(path, e, checkpointer) from e
    return checkpointer


def _finish_state(path: str, checkpointer: Any) -> None:
    """Waits until the background write of :func:`_start_state` has finalized ``path`` (errors as in
    :func:`_write_state`)."""
    try:
        checkpointer.wait_until_finished()
    except Exception as e:  # noqa: BLE001
        raise _write_error(path, e, checkpointer) from e
    checkpointer.close()


def _write_error(path: str, error: Exception, checkpointer: Any) -> CheckpointError:
    """The :class:`CheckpointError` of a failed write of the state folder ``path``, after closing the checkpointer
    and removing what the write left (the previous checkpoint stays)."""
    with contextlib.suppress(Exception):
        checkpointer.close()
    directory = os.path.dirname(path)
    _wait_until_still(directory)
    _remove_stale(directory, keep=_current_state(directory))
    return CheckpointError(f"the checkpoint state {path} could not be written ({type(error).__name__}: "
                           f"{_shorter(str(error))}); the previous checkpoint, if any, is kept")


def _wait_until_still(directory: str, quiet_seconds: float = 0.3, limit_seconds: float = 10.0) -> None:
    """Waits (at most ``limit_seconds``) until nothing under ``directory`` has changed for ``quiet_seconds``.

    When a write fails inside orbax, the writes tensorstore had already started for the other arrays go on in
    tensorstore's own threads after orbax raises, and nothing hands them back to wait for: removing the failed
    state's folder at once can leave it to be recreated a moment later (seen under load), so the folder is removed
    only once those writes have drained."""
    def snapshot() -> list[tuple[str, int]]:
        seen = []
        for root, _, files in os.walk(directory):
            for name in files:
                with contextlib.suppress(OSError):
                    seen.append((os.path.join(root, name), os.stat(os.path.join(root, name)).st_size))
        return sorted(seen)

    deadline = time.monotonic() + limit_seconds
    last = snapshot()
    while time.monotonic() < deadline:
        time.sleep(quiet_seconds)
        now = snapshot()
        if now == last:
            return
        last = now


class PendingSave:
    """A checkpoint being written (:func:`start_save`): :meth:`wait` returns the record's path once the new state is
    the current checkpoint, or raises the write's :class:`CheckpointError`. Until then the record still points to
    the previous state, so a process killed meanwhile leaves the previous checkpoint."""

    def __init__(self, path: str, finish: Any = None, held: contextlib.ExitStack | None = None) -> None:
        self.path = path
        self._held = held  # the libraries' logs, held until the write is waited for (asyncfl_jax.quiet)
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None
        if finish is not None:
            self._thread = threading.Thread(target=self._run, args=(finish,), name="asyncfl_jax-checkpoint")
            self._thread.start()

    def _run(self, finish: Any) -> None:
        try:
            finish()
        except BaseException as e:  # noqa: BLE001  (raised again by wait, in the caller's thread)
            self._error = e

    def done(self) -> bool:
        """Whether the write has ended (finished or failed): :meth:`wait` then returns at once."""
        return self._thread is None or not self._thread.is_alive()

    def wait(self) -> str:
        """Waits for the write; returns the record's path or raises its error (once)."""
        if self._thread is not None:
            self._thread.join()
        if self._held is not None:
            self._held.close()
            self._held = None
        error, self._error = self._error, None
        if error is not None:
            raise error
        return self.path


def save(directory: str, identity: Mapping[str, Any], state: LoopState, num_chunks: int) -> str:
    """Writes ``state`` as the current checkpoint of ``directory`` (atomically) and returns the record's path once it
    is written (:func:`start_save` without a background write)."""
    return start_save(directory, identity, state, num_chunks, asynchronous=False).wait()


def start_save(directory: str, identity: Mapping[str, Any], state: LoopState, num_chunks: int,
               asynchronous: bool = True) -> PendingSave:
    """Starts writing ``state`` as the current checkpoint of ``directory`` (atomically).

    Returns once everything the write needs is taken from ``state`` (its arrays handed to orbax, its record's fields
    copied), so the caller may go on with the next chunk, even donating the carry's buffers; a background thread
    then writes the state folder, hashes and syncs its files and only then replaces the record
    (:meth:`PendingSave.wait`). The previous save of the same folder must have been waited for. With
    ``asynchronous=False``, or in a multi-host run (whose barriers stay in the main thread), everything is done
    before it returns. Every process of a multi-host run must call it (each writes the shards of the carry it holds);
    process 0 then checks the state's files into the record and deletes the superseded states.
    """
    directory = os.path.abspath(directory)
    path = os.path.join(directory, RECORD)
    _sync_processes("save")  # every process reads the same record (process 0 wrote the last one)
    current = _current_state(directory)
    state_name = _state_name(state.next_chunk, current)
    if _is_primary():
        os.makedirs(directory, exist_ok=True)
        _remove_stale(directory, keep=current)  # the destination too, when no record names it
    arrays, layout, carry_leaves = _state_arrays(state)
    record = _record_body(identity, state, num_chunks, state_name, layout, carry_leaves)
    state_path = os.path.join(directory, state_name)

    def commit() -> None:
        if _is_primary():
            _write_record(path, record)
            _remove_stale(directory, keep=state_name)  # superseded states (only after the record)
        _sync_processes("saved")  # every process returns once the new checkpoint is the current one

    if not asynchronous or jax.process_count() > 1:
        _write_state(state_path, arrays)
        commit()
        return PendingSave(path)
    from asyncfl_jax.quiet import library_logs_held

    held = contextlib.ExitStack()  # orbax's threads would log a failed write with its traceback; wait() raises it
    held.enter_context(library_logs_held())
    try:
        checkpointer = _start_state(state_path, arrays)
    except BaseException:
        held.close()
        raise
    del arrays  # orbax holds what it writes; the carry's buffers are free for the next chunk

    def finish() -> None:
        _finish_state(state_path, checkpointer)
        commit()

    return PendingSave(path, finish, held)


def _record_body(identity: Mapping[str, Any], state: LoopState, num_chunks: int, state_name: str,
                 layout: Mapping[str, Any], carry_leaves: int) -> dict[str, Any]:
    """The record of ``state`` without the state files' hashes (known once the folder is written)."""
    return {
        "format": FORMAT,
        "identity": dict(identity),
        "state_dir": state_name,
        "arrays": dict(layout),
        "next_chunk": int(state.next_chunk),
        "next_step": int(state.eval_steps[-1]),
        "num_chunks": int(num_chunks),
        "complete": bool(state.stopped_early or state.next_chunk >= num_chunks),
        "stopped_early": bool(state.stopped_early),
        "reported": sorted(int(r) for r in state.reported),
        "metric_names": list(state.metrics),
        "trace_names": list(state.traces),
        "carry_leaves": carry_leaves,
        "compile_seconds": float(state.compile_seconds),
        "run_seconds": float(state.run_seconds),
        "checkpoint_seconds": float(state.checkpoint_seconds),
    }


def _write_record(path: str, body: Mapping[str, Any]) -> None:
    """Makes the finalized state folder ``body["state_dir"]`` current: hashes and syncs its files, then replaces the
    record ``path`` atomically."""
    directory = os.path.dirname(path)
    state_path = os.path.join(directory, body["state_dir"])
    _fsync(directory)  # the rename of the finalized folder
    record = {**body, "state_files": _file_hashes(state_path, sync=True)}
    record[CHECKSUM] = record_checksum(record)
    from asyncfl_jax.outputs.atomic import write_atomic  # here: the output folder's package imports the configuration

    write_atomic(path, json.dumps(record, indent=1) + "\n")


def record_checksum(record: Mapping[str, Any]) -> str:
    """SHA-256 of a record's content without its own checksum field: canonical JSON (sorted keys, no spaces), so
    that any change to a value, a key or a nested entry changes it."""
    body = {k: v for k, v in record.items() if k != CHECKSUM}
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def _check_checksum(path: str, record: Mapping[str, Any]) -> None:
    """Refuses a record without its checksum, or whose content does not match it (a hand edit)."""
    if CHECKSUM not in record:
        raise CheckpointError(f"the checkpoint record {path} has no {CHECKSUM} (written by an earlier asyncfl_jax, "
                              "or edited): it cannot be trusted; delete the folder or start over with resume=False "
                              "(asyncfl run --overwrite)")
    if record[CHECKSUM] != record_checksum(record):
        raise CheckpointError(f"the checkpoint record {path} was changed after it was written (its content does not "
                              f"match its {CHECKSUM}): it cannot be trusted; restore it, delete the folder or start "
                              "over with resume=False (asyncfl run --overwrite)")


def _check_state(state_path: str, record: Mapping[str, Any], arrays: Mapping[str, Any],
                 identity: Mapping[str, Any]) -> None:
    """Refuses a state whose content disagrees with its record: the chunk (``state-<next_chunk>`` holds
    ``next_chunk + 1`` evaluation steps), the step (the last evaluation step is ``next_step``), the evaluation steps
    themselves (``min(k * eval_every, num_steps)`` when the run's identity gives both), the metrics (one row per
    evaluation), the per-step traces (``next_step`` columns, or ``next_step + 1`` when they start with the initial
    state's record, as a trajectory does) and every array's shape and dtype."""
    chunk, step = record["next_chunk"], record["next_step"]
    steps = [int(s) for s in np.asarray(arrays["eval_steps"]).reshape(-1)]
    problems = []
    if record["state_dir"] not in (f"{STATE_PREFIX}{chunk:06d}", f"{STATE_PREFIX}{chunk:06d}-1"):
        problems.append(f"the record's next_chunk {chunk} is not the chunk of its state folder {record['state_dir']}")
    if len(steps) != chunk + 1:
        problems.append(f"the state holds {len(steps)} evaluations, a state after chunk {chunk} holds {chunk + 1}")
    if not steps or steps[-1] != step:
        problems.append(f"the state's last evaluation is at step {steps[-1] if steps else None}, the record's "
                        f"next_step is {step}")
    every, total = identity.get("eval_every"), identity.get("num_steps")
    expected = [min(k * every, total) for k in range(len(steps))] if isinstance(every, int) and isinstance(
        total, int) and every > 0 else steps
    if steps != expected:
        problems.append(f"the state's evaluation steps {_some([str(s) for s in steps])} are not those of chunks of "
                        f"{every} of {total} steps")
    if not isinstance(record["num_chunks"], int) or not 0 <= chunk <= record["num_chunks"]:
        problems.append(f"next_chunk {chunk} is not between 0 and num_chunks {record['num_chunks']}")
    for key, (shape, dtype) in record["arrays"].items():
        a = arrays.get(key)
        if a is None or list(np.shape(a)) != list(shape) or np.dtype(a.dtype) != np.dtype(dtype):
            found = None if a is None else [list(np.shape(a)), str(np.dtype(a.dtype))]
            problems.append(f"array {key!r} is {found} in the state, {[shape, dtype]} in the record")
    for i, _ in enumerate(record["metric_names"]):
        rows = np.shape(arrays.get(f"m{i:03d}", np.zeros((0,))))[0]
        if rows != len(steps):
            problems.append(f"metric {i} has {rows} evaluations, the state {len(steps)}")
    for i, _ in enumerate(record["trace_names"]):
        shape = np.shape(arrays.get(f"t{i:03d}", np.zeros((0, 0))))
        if len(shape) < 2 or shape[1] not in (step, step + 1):  # steps 1..next_step, or 0..next_step (trajectory)
            problems.append(f"trace {i} covers {shape[1] if len(shape) >= 2 else None} steps, the record {step}")
    if problems:
        raise CheckpointError(f"the checkpoint state {state_path} does not match its record {RECORD}: "
                              + "; ".join(problems[:4]) + ". Delete the folder or start over with resume=False "
                              "(asyncfl run --overwrite)")


def read_record(directory: str) -> dict[str, Any] | None:
    """The checkpoint record of ``directory`` (None when there is none)."""
    path = os.path.join(directory, RECORD)
    try:
        with open(path) as f:
            record = json.load(f)
    except FileNotFoundError:
        return None
    except (OSError, json.JSONDecodeError) as e:
        raise CheckpointError(f"the checkpoint record {path} cannot be read: {e}") from None
    if not isinstance(record, dict) or record.get("format") != FORMAT:
        found = record.get("format") if isinstance(record, dict) else None
        old = " (a .npz checkpoint of asyncfl_jax before orbax; it cannot be resumed)" if found == 1 else ""
        raise CheckpointError(f"{path} is not a checkpoint of format {FORMAT}{old}: delete the folder or start over "
                              f"with resume=False (asyncfl run --overwrite)")
    problem = _record_problem(record)
    if problem:
        raise CheckpointError(f"the checkpoint record {path} is incomplete or was edited: {problem}")
    return record


def _record_problem(record: Mapping[str, Any]) -> str | None:
    """What makes a record of the current format unusable (a missing or ill-typed field), or None."""
    missing = [k for k in RECORD_KEYS if k not in record]
    if missing:
        return "missing " + ", ".join(missing)
    name = record["state_dir"]
    if not isinstance(name, str) or not name.startswith(STATE_PREFIX) or os.path.basename(name) != name:
        return f"state_dir {name!r} is not a state folder's name"
    files = record["state_files"]
    if not isinstance(files, dict) or not all(isinstance(v, str) for v in files.values()):
        return "state_files is not a table of SHA-256"
    arrays = record["arrays"]
    if not isinstance(arrays, dict):
        return "arrays is not a table of [shape, dtype]"
    for key, entry in arrays.items():
        if not _is_layout(entry):
            return f"arrays[{key!r}] = {entry!r} is not [shape, dtype]"
    integers = ("next_chunk", "next_step", "num_chunks", "carry_leaves")
    if not all(isinstance(record[k], int) for k in integers) or not all(
            isinstance(record[k], list) for k in ("reported", "metric_names", "trace_names")):
        return f"{', '.join(integers)} must be integers and reported, metric_names, trace_names lists"
    return None


def _is_layout(entry: Any) -> bool:
    """Whether ``entry`` is ``[shape, dtype]`` (a list of sizes and a dtype's name)."""
    if not (isinstance(entry, list) and len(entry) == 2 and isinstance(entry[0], list)):
        return False
    if not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in entry[0]):
        return False
    try:
        np.dtype(entry[1])
    except TypeError:
        return False
    return True


def _check_files(directory: str, record: Mapping[str, Any]) -> str:
    """The state folder of ``record``, after checking that each of its files has the recorded SHA-256."""
    state_path = os.path.join(directory, record["state_dir"])
    if not os.path.isdir(state_path):
        raise CheckpointError(f"the checkpoint state {state_path} is missing (the record {RECORD} points to it)")
    try:
        found = _file_hashes(state_path)
    except OSError as e:
        raise CheckpointError(f"the checkpoint state {state_path} cannot be read: {e}") from None
    expected = record["state_files"]
    changed = sorted(name for name in expected if name in found and found[name] != expected[name])
    missing = sorted(name for name in expected if name not in found)
    problems = []
    if changed:
        problems.append(f"{_some(changed)} {'does' if len(changed) == 1 else 'do'} not match the SHA-256 in {RECORD}")
    if missing:
        problems.append(f"{_some(missing)} {'is' if len(missing) == 1 else 'are'} missing")
    if problems or not expected:
        raise CheckpointError(f"the checkpoint state {state_path} is corrupt: "
                              + ("; ".join(problems) or f"{RECORD} lists none of its files"))
    return state_path


def _some(names: Sequence[str]) -> str:
    """A few of ``names`` for a message."""
    return ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")


def _check_layout(directory: str, record: Mapping[str, Any], shapes: Sequence[Any]) -> None:
    """Refuses a record whose carry arrays are not those of ``shapes`` (``carry_shape``'s leaves)."""
    if record["carry_leaves"] != len(shapes):
        raise CheckpointMismatchError(f"the checkpoint in {directory} has {record['carry_leaves']} carry arrays, this "
                                      f"run has {len(shapes)}")
    for i, s in enumerate(shapes):
        if record["arrays"].get(f"c{i:04d}") != [list(s.shape), str(np.dtype(s.dtype))]:
            raise CheckpointMismatchError(
                f"the checkpoint in {directory} has carry array {i} of shape and dtype "
                f"{record['arrays'].get(f'c{i:04d}')}, this run {[list(s.shape), str(np.dtype(s.dtype))]}")


def _leaf_shardings(shardings: Any, treedef: Any) -> list[Any]:
    """One target sharding per carry leaf (None: host numpy arrays) from ``load``'s ``shardings`` argument."""
    if shardings is None or isinstance(shardings, jax.sharding.Sharding):
        return [shardings] * treedef.num_leaves
    return treedef.flatten_up_to(shardings)


def _restore_args(layout: Mapping[str, Any], leaf_shardings: Sequence[Any]) -> dict[str, Any]:
    """Orbax's restore arguments of every stored key: carry leaves placed with their target sharding (as
    ``jax.Array``) or read as numpy arrays; the evaluation steps, metrics and traces always as numpy arrays."""
    import orbax.checkpoint as ocp

    args = {}
    for key, (shape, dtype) in layout.items():
        if int(np.prod(shape)) == 0:
            continue
        sharding = leaf_shardings[int(key[1:])] if key.startswith("c") else None
        if sharding is None:
            args[key] = ocp.RestoreArgs(restore_type=np.ndarray, dtype=np.dtype(dtype))
        else:
            args[key] = ocp.ArrayRestoreArgs(restore_type=jax.Array, sharding=sharding, global_shape=tuple(shape),
                                             dtype=np.dtype(dtype))
    return args


def _read_state(state_path: str, record: Mapping[str, Any], leaf_shardings: Sequence[Any]) -> dict[str, Any]:
    """Every array of the state folder (zero-size ones rebuilt from the layout); :class:`CheckpointError` when orbax
    cannot read it."""
    import orbax.checkpoint as ocp

    layout = record["arrays"]
    checkpointer = _checkpointer()
    try:
        restored = checkpointer.restore(
            state_path, args=ocp.args.PyTreeRestore(restore_args=_restore_args(layout, leaf_shardings)))
    except Exception as e:  # noqa: BLE001  (orbax and tensorstore raise many types)
        raise CheckpointError(f"the checkpoint state {state_path} cannot be read ({type(e).__name__}: "
                              f"{_shorter(str(e))})") from None
    finally:
        checkpointer.close()
    arrays = dict(restored)
    for key, (shape, dtype) in layout.items():
        if int(np.prod(shape)) == 0:
            empty = np.zeros(shape, np.dtype(dtype))
            sharding = leaf_shardings[int(key[1:])] if key.startswith("c") else None
            arrays[key] = empty if sharding is None else jax.device_put(empty, sharding)
        elif key not in arrays:
            raise CheckpointError(f"the checkpoint state {state_path} has no array {key!r}")
    return arrays


def load(directory: str, identity: Mapping[str, Any], carry_shape: Any, *, shardings: Any = None) -> LoopState | None:
    """The checkpoint of ``directory``, or None when it holds none.

    Raises :class:`CheckpointMismatchError` when it was written by a different run (the message names what differs)
    and :class:`CheckpointError` when it is unreadable or corrupt. ``carry_shape`` (``jax.eval_shape`` of the
    program's ``init``) gives the carry's tree structure, shapes and dtypes. ``shardings`` places the carry: None
    (default) returns host numpy arrays; a ``jax.sharding.Sharding``, or a tree of them with ``carry_shape``'s
    structure (e.g. a compiled ``init``'s ``output_shardings``), returns ``jax.Array`` leaves read straight into
    that placement (in a multi-host run each process reads only its shards). Temporary or superseded state folders
    left by a killed save are deleted first.
    """
    directory = os.path.abspath(directory)
    record = read_record(directory)
    _remove_stale(directory, keep=None if record is None else record["state_dir"])
    if record is None:
        return None
    differences = _differences(record.get("identity", {}), dict(identity))
    if differences:
        raise CheckpointMismatchError(
            f"the checkpoint in {directory} belongs to a different run, so it cannot be resumed; it differs in: "
            + "; ".join(differences) + ". Use another checkpoint folder, delete this one, or resume=False to start over"
        )
    shapes, treedef = jax.tree_util.tree_flatten(carry_shape)
    _check_layout(directory, record, shapes)
    _check_checksum(os.path.join(directory, RECORD), record)
    state_path = _check_files(directory, record)
    arrays = _read_state(state_path, record, _leaf_shardings(shardings, treedef))
    _check_state(state_path, record, arrays, identity)
    return LoopState(
        next_chunk=int(record["next_chunk"]),
        eval_steps=[int(s) for s in arrays["eval_steps"]],
        metrics={name: list(arrays[f"m{i:03d}"]) for i, name in enumerate(record["metric_names"])},
        reported=set(int(r) for r in record["reported"]),
        stopped_early=bool(record["stopped_early"]),
        compile_seconds=float(record["compile_seconds"]),
        run_seconds=float(record["run_seconds"]),
        checkpoint_seconds=float(record.get("checkpoint_seconds", 0.0)),  # absent in records of earlier versions
        carry=jax.tree_util.tree_unflatten(treedef, [arrays[f"c{i:04d}"] for i in range(len(shapes))]),
        traces={name: [arrays[f"t{i:03d}"]] for i, name in enumerate(record["trace_names"])},
    )


def clear(directory: str) -> None:
    """Deletes the checkpoint (record and state folders, temporary ones included) of ``directory``; other files
    stay."""
    with contextlib.suppress(FileNotFoundError):
        os.remove(os.path.join(directory, RECORD))
    _remove_stale(directory, keep=None)



# ---------------------------------------------------------------------------------------------------- signals
class StopRequest:
    """Set by the signal handlers of :func:`stop_on_signals`; the loop reads ``reason`` ("SIGINT" or "SIGTERM") at
    the end of each chunk and before and after each save. In the ``asyncfl`` command it reads the flag of the
    command's own handlers (:mod:`asyncfl_jax._signals`)."""

    def __init__(self, recorded: Any = None) -> None:
        self._reason: str | None = None
        self._recorded = recorded  # a function giving the recorded signal number, or None

    @property
    def reason(self) -> str | None:
        if self._reason is None and self._recorded is not None:
            signum = self._recorded()
            if signum is not None:
                return signal.Signals(signum).name
        return self._reason

    @reason.setter
    def reason(self, value: str | None) -> None:
        self._reason = value


@contextlib.contextmanager
def stop_on_signals(enabled: bool = True) -> Iterator[StopRequest]:
    """While active, SIGTERM and the first Ctrl-C (SIGINT) only set ``request.reason``, so that the loop can finish
    its chunk, save and stop; a second Ctrl-C raises ``KeyboardInterrupt`` at once. The previous handlers are
    restored on exit. Does nothing outside the main thread (where Python cannot install handlers) or when not
    ``enabled``. Under the ``asyncfl`` command's handlers (which only set a flag, :mod:`asyncfl_jax._signals`) the
    request reads that flag and no handler is replaced."""
    from asyncfl_jax import _signals

    if enabled and _signals.handlers_installed():
        yield StopRequest(_signals.stop_signal)
        return
    request = StopRequest()
    if not enabled or threading.current_thread() is not threading.main_thread():
        yield request
        return

    def on_term(signum, frame):  # noqa: ARG001
        request.reason = "SIGTERM"

    def on_int(signum, frame):  # noqa: ARG001
        if request.reason is not None:
            raise KeyboardInterrupt
        request.reason = "SIGINT"

    previous = {}
    try:
        for signum, handler in ((signal.SIGTERM, on_term), (signal.SIGINT, on_int)):
            previous[signum] = signal.signal(signum, handler)
        yield request
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, signal.SIG_DFL if handler is None else handler)
