"""A History as files of its own (``history.npz`` + ``history.json``, in each run's checkpoint folder: what
``asyncfl run --resume`` reuses). The files keep the first, flat layout of the History's fields
(:meth:`~asyncfl_jax.results.History.flat_fields`), so that files of every version load."""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
from typing import Any

import numpy as np

from asyncfl_jax.outputs import atomic
from asyncfl_jax.results.history import History

HISTORY_FORMAT = 1


def _json_default(o: Any) -> Any:
    if isinstance(o, np.generic):
        return o.item()
    if isinstance(o, np.ndarray):
        return o.tolist()
    raise TypeError(f"{type(o).__name__} is not JSON serialisable")


def save_history(history: History, directory: str, meta: Any = None) -> list[str]:
    """Saves ``history`` as ``history.npz`` (its arrays, bit for bit) and ``history.json`` (everything else, the
    SHA-256 of the npz and ``meta``, any JSON value), both atomically, the JSON last; :func:`load_history` reads them
    back."""
    arrays: dict[str, np.ndarray] = {}
    fields: dict[str, Any] = {}
    array_dicts: dict[str, list[str]] = {}
    for name, value in history.flat_fields().items():
        if name in ("realized_schedules", "trajectory"):  # written as files of their own by the runner
            continue
        if isinstance(value, np.ndarray):
            arrays[f"array__{name}"] = value
        elif isinstance(value, dict) and value and all(isinstance(v, np.ndarray) for v in value.values()):
            array_dicts[name] = list(value)
            arrays.update({f"dict__{name}__{k}": v for k, v in value.items()})
        else:
            fields[name] = value
    if history.labels is not None:  # explicit replicas' labels; a History without them keeps the first layout
        fields["labels"] = history.labels
    npz = os.path.join(directory, "history.npz")
    with atomic.atomic_file(npz) as fh:
        np.savez(fh, **arrays)
    with open(npz, "rb") as fh:
        digest = hashlib.sha256(fh.read()).hexdigest()
    record = {"format": HISTORY_FORMAT, "fields": fields, "array_dicts": array_dicts, "npz_sha256": digest,
              "meta": meta}
    path = os.path.join(directory, "history.json")
    atomic.write_atomic(path, json.dumps(record, indent=1, default=_json_default) + "\n")
    return [npz, path]


def load_history(directory: str, meta: Any = None) -> History | None:
    """The History saved by :func:`save_history` in ``directory``; None when there is none, it is incomplete, or
    (when ``meta`` is given) it was saved with another ``meta``."""
    path = os.path.join(directory, "history.json")
    npz = os.path.join(directory, "history.npz")
    try:
        with open(path) as f:
            record = json.load(f)
        with open(npz, "rb") as f:
            blob = f.read()
    except (OSError, json.JSONDecodeError):
        return None
    if record.get("format") != HISTORY_FORMAT or hashlib.sha256(blob).hexdigest() != record.get("npz_sha256"):
        return None
    if meta is not None and record.get("meta") != json.loads(json.dumps(meta, default=_json_default)):
        return None
    kwargs = dict(record["fields"])
    with np.load(io.BytesIO(blob), allow_pickle=False) as z:
        for key in z.files:
            if key.startswith("array__"):
                kwargs[key[len("array__"):]] = z[key]
        for name, keys in record["array_dicts"].items():
            kwargs[name] = {k: z[f"dict__{name}__{k}"] for k in keys}
    return History(**kwargs)  # the file's flat names (the first layout) are grouped into the History's records


def remove_history(directory: str) -> None:
    """Deletes the History files of ``directory`` (if any)."""
    for name in ("history.json", "history.npz"):  # the record first: a lone npz is never read
        with contextlib.suppress(FileNotFoundError):
            os.remove(os.path.join(directory, name))
