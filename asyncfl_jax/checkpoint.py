"""Checkpoints of a running simulation: the scan state between two chunks, saved atomically and resumed bit for bit.

A checkpoint folder (one per run, e.g. ``<out>/checkpoints/<run>/``) holds

* ``state-<chunk>.npz``: the scan carry (every leaf of :class:`~asyncfl_jax.engine.Carry`, with its replica axis,
  stored as raw bytes so that any dtype, bfloat16 and int8 caches included, comes back bit for bit), the evaluation
  steps so far and the metrics of every evaluation so far;
* ``checkpoint.json``: the record that makes a state file current: the run's identity (see :func:`run_identity`), the
  index of the next chunk and server step, the replicas whose divergence was already reported, the early-stop flag,
  the compile and run seconds so far, the name of the state file and its SHA-256.

Both are written through a temporary file in the same folder, flushed with ``fsync`` and renamed with
``os.replace``; the JSON record is replaced only after its state file is complete, and older state files are deleted
only after that, so a process killed at any instant leaves the previous checkpoint or the new one, never a mix.

The carry's tree structure is never stored (no pickle): it is rebuilt from the program with ``jax.eval_shape``.
Randomness needs no state: the key of a job is ``fold_in(fold_in(PRNGKey(seed), t + 1), j)`` and the server's is
``fold_in(fold_in(PRNGKey(seed), t + 1), SERVER_STREAM)``, pure functions of the seed and of the step ``t`` read from
the schedule, so restoring the carry and the chunk index restores the random streams.
"""

from __future__ import annotations

import contextlib
import dataclasses
import glob
import hashlib
import json
import os
import signal
import threading
from typing import Any, Iterator, Mapping, Sequence

import jax
import numpy as np

from asyncfl_jax.results import atomic_file, write_atomic

FORMAT = 1
RECORD = "checkpoint.json"


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


# ---------------------------------------------------------------------------------------------------- identity
def hash_arrays(tree: Any) -> str:
    """SHA-256 of every leaf of ``tree`` (dtype, shape and bytes), in tree order."""
    h = hashlib.sha256()
    for leaf in jax.tree_util.tree_leaves(tree):
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
    shard_jobs: bool,
    shard_replicas: bool = False,
    shard_clients: bool = False,
) -> dict[str, Any]:
    """What a checkpoint must match to be resumed: everything that determines the run's result.

    The schedules enter as a hash of their arrays; the task as its name, number of clients and parameters, the
    shapes and dtypes of its arrays and a hash of the initial model ``x0`` (the data themselves are not hashed).
    """
    return _canonical({
        "label": label,
        "algorithm": algorithm.name,
        "algorithm_options": dict(algorithm.options),
        "init_round": algorithm.init_round is not None,
        "local": dataclasses.asdict(local),
        "replicas": [{"seed": r.seed, "hparams": r.hparams} for r in replicas],
        "schedules": {"sha256": hash_arrays(schedules), "num_slots": int(num_slots)},
        "num_steps": int(num_steps),
        "eval_every": int(eval_every),
        "task": {"name": task.name, "num_clients": int(task.num_clients), "num_params": int(task.num_params),
                 "arrays": tree_signature(data), "x0_sha256": hash_arrays(data.x0)},
        "carry": tree_signature(carry_shape),
        "shard_jobs": bool(shard_jobs),
        "shard_replicas": bool(shard_replicas),
        "shard_clients": bool(shard_clients),
    })


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
@dataclasses.dataclass
class LoopState:
    """The host loop's state after a whole number of chunks (what :func:`save` writes and :func:`load` returns)."""

    next_chunk: int
    eval_steps: list[int]
    metrics: dict[str, list[np.ndarray]]  # name -> one [R] array per evaluation
    reported: set[int]
    stopped_early: bool
    compile_seconds: float
    run_seconds: float
    carry: Any  # the carry pytree (device arrays when running; host arrays as loaded)
    traces: dict[str, list[np.ndarray]] = dataclasses.field(default_factory=dict)  # name -> [R, steps] per chunk


def _as_bytes(leaf: Any) -> np.ndarray:
    a = np.ascontiguousarray(np.asarray(leaf))
    return a.reshape(-1).view(np.uint8)


def _sha256_file(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


def save(directory: str, identity: Mapping[str, Any], state: LoopState, num_chunks: int) -> str:
    """Writes ``state`` as the current checkpoint of ``directory`` (atomically); returns the record's path."""
    os.makedirs(directory, exist_ok=True)
    leaves = jax.tree_util.tree_leaves(jax.device_get(state.carry))
    arrays = {f"carry_{i:04d}": _as_bytes(leaf) for i, leaf in enumerate(leaves)}
    arrays["eval_steps"] = np.asarray(state.eval_steps, np.int64)
    for name, rows in state.metrics.items():
        arrays[f"metric_{name}"] = np.stack([np.asarray(r) for r in rows])
    for name, parts in state.traces.items():  # the in-scan clock's per-step records (steps on axis 1)
        arrays[f"trace_{name}"] = np.concatenate([np.asarray(p) for p in parts], axis=1)
    state_name = f"state-{state.next_chunk:06d}.npz"
    state_path = os.path.join(directory, state_name)
    with atomic_file(state_path) as f:
        np.savez(f, **arrays)
    record = {
        "format": FORMAT,
        "identity": dict(identity),
        "state_file": state_name,
        "state_sha256": _sha256_file(state_path),
        "next_chunk": int(state.next_chunk),
        "next_step": int(state.eval_steps[-1]),
        "num_chunks": int(num_chunks),
        "complete": bool(state.stopped_early or state.next_chunk >= num_chunks),
        "stopped_early": bool(state.stopped_early),
        "reported": sorted(int(r) for r in state.reported),
        "metric_names": list(state.metrics),
        "trace_names": list(state.traces),
        "carry_leaves": len(leaves),
        "compile_seconds": float(state.compile_seconds),
        "run_seconds": float(state.run_seconds),
    }
    path = os.path.join(directory, RECORD)
    write_atomic(path, json.dumps(record, indent=1) + "\n")
    for old in glob.glob(os.path.join(directory, "state-*.npz")):  # superseded states (only after the record)
        if os.path.basename(old) != state_name:
            with contextlib.suppress(FileNotFoundError):
                os.remove(old)
    return path


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
        raise CheckpointError(f"{path} is not a checkpoint of format {FORMAT} (written by another version?)")
    return record


def load(directory: str, identity: Mapping[str, Any], carry_shape: Any) -> LoopState | None:
    """The checkpoint of ``directory``, or None when it holds none.

    Raises :class:`CheckpointMismatchError` when it was written by a different run (the message names what differs)
    and :class:`CheckpointError` when it is unreadable or corrupt. ``carry_shape`` (``jax.eval_shape`` of the
    program's ``init``) gives the carry's tree structure, shapes and dtypes.
    """
    record = read_record(directory)
    if record is None:
        return None
    differences = _differences(record.get("identity", {}), dict(identity))
    if differences:
        raise CheckpointMismatchError(
            f"the checkpoint in {directory} belongs to a different run, so it cannot be resumed; it differs in: "
            + "; ".join(differences) + ". Use another checkpoint folder, delete this one, or resume=False to start over"
        )
    state_path = os.path.join(directory, record["state_file"])
    try:
        digest = _sha256_file(state_path)
    except OSError as e:
        raise CheckpointError(f"the checkpoint state {state_path} cannot be read: {e}") from None
    if digest != record["state_sha256"]:
        raise CheckpointError(f"the checkpoint state {state_path} is corrupt (its SHA-256 does not match {RECORD})")
    shapes, treedef = jax.tree_util.tree_flatten(carry_shape)
    if record["carry_leaves"] != len(shapes):
        raise CheckpointMismatchError(f"the checkpoint in {directory} has {record['carry_leaves']} carry arrays, this "
                                      f"run has {len(shapes)}")
    with np.load(state_path, allow_pickle=False) as z:
        leaves = [z[f"carry_{i:04d}"].view(np.dtype(s.dtype)).reshape(s.shape) for i, s in enumerate(shapes)]
        eval_steps = [int(s) for s in z["eval_steps"]]
        metrics = {name: list(z[f"metric_{name}"]) for name in record["metric_names"]}
        traces = {name: [z[f"trace_{name}"]] for name in record.get("trace_names", [])}
    return LoopState(
        next_chunk=int(record["next_chunk"]),
        eval_steps=eval_steps,
        metrics=metrics,
        reported=set(int(r) for r in record["reported"]),
        stopped_early=bool(record["stopped_early"]),
        compile_seconds=float(record["compile_seconds"]),
        run_seconds=float(record["run_seconds"]),
        carry=jax.tree_util.tree_unflatten(treedef, leaves),
        traces=traces,
    )


def clear(directory: str) -> None:
    """Deletes the checkpoint (record and state files) of ``directory``; other files stay."""
    with contextlib.suppress(FileNotFoundError):
        os.remove(os.path.join(directory, RECORD))
    for path in glob.glob(os.path.join(directory, "state-*.npz")):
        with contextlib.suppress(FileNotFoundError):
            os.remove(path)


# ---------------------------------------------------------------------------------------------------- signals
class StopRequest:
    """Set by the signal handlers of :func:`stop_on_signals`; the loop reads ``reason`` at the end of each chunk."""

    def __init__(self) -> None:
        self.reason: str | None = None


@contextlib.contextmanager
def stop_on_signals(enabled: bool = True) -> Iterator[StopRequest]:
    """While active, SIGTERM and the first Ctrl-C (SIGINT) only set ``request.reason``, so that the loop can finish
    its chunk, save and stop; a second Ctrl-C raises ``KeyboardInterrupt`` at once. The previous handlers are
    restored on exit. Does nothing outside the main thread (where Python cannot install handlers) or when not
    ``enabled``."""
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
