"""LEAF's FEMNIST and Shakespeare with their natural clients (writers, speaking roles), read from local files.

Two datasets, :data:`LEAF_DATASETS`:

* ``leaf/femnist``: handwritten characters, one client per writer (3,550 writers in LEAF). Inputs are 28×28×1
  float32 in ``[0, 1]``; labels int32 in ``[0, 62)``: digits ``0-9`` (0-9), upper case ``A-Z`` (10-35), lower case
  ``a-z`` (36-61). The pixel values are LEAF's as stored: ``value / 255`` of the grayscale scan, so the background
  is 1 (white) and the ink is near 0. LEAF does **not** invert the NIST images the way MNIST is stored (ink 1,
  background 0); the values are kept as LEAF gives them, the same from both file formats.
* ``leaf/shakespeare``: next-character prediction, one client per speaking role (1,129 roles in LEAF). Inputs are
  80 character ids (float32 [N, 80], the form of every feature array here), the target is the id of the next
  character (int32); both over LEAF's 80-character vocabulary :data:`ALL_LETTERS` (id = position in that string,
  LEAF's ``word_to_indices`` / ``letter_to_index``). A character outside the vocabulary is refused (LEAF would map it
  to -1) rather than mapped to a guess.

Nothing is downloaded. Two file formats, recognised from the folder's contents:

1. **LEAF JSON** (the output of LEAF's ``preprocess.sh``): ``<folder>/train/*.json`` and ``<folder>/test/*.json``,
   each ``{"users": [...], "num_samples": [...], "user_data": {user: {"x": [...], "y": [...]}}}``; ``<folder>`` is
   LEAF's ``data/<dataset>/data`` folder (a folder with a ``data/`` subfolder holding them is accepted too). FEMNIST
   ``x`` entries are 784 floats (row-major 28×28) and ``y`` integers; Shakespeare ``x`` entries are 80-character
   strings and ``y`` single characters. The test set is LEAF's own per-user test split of the chosen clients,
   pooled (LEAF's default ``-t sample`` split holds out a fraction of every user's samples; with ``-t user`` the test
   users differ from the training users and the chosen clients have no test samples, which is refused).
2. **Parquet** (Flower's ``flwrlabs/femnist`` and ``flwrlabs/shakespeare`` on the Hugging Face hub): every
   ``*.parquet`` file under the folder (searched recursively), one table. FEMNIST columns: ``writer_id`` (string),
   ``image`` (PNG bytes, or the ``datasets`` Image struct ``{bytes, path}``), ``character`` (int class in
   ``[0, 62)``, the same order as LEAF). Shakespeare columns: ``character_id`` (string), ``x`` (80-character
   string), ``y`` (one character). These files have no test split: a random :data:`PARQUET_TEST_FRACTION` (10%) of
   each chosen client's samples is held out (drawn with the data seed) and pooled into the test set, the split the
   AsyncFedED paper describes; client ``i`` keeps ``max(1, int(0.9 n_i))`` training samples. Reading parquet needs
   ``pyarrow`` (``pip install -e ".[leaf]"`` from a clone); PNG decoding needs Pillow.

**Clients.** ``num_clients`` writers / roles are chosen among those with training samples, uniformly at random
without replacement with ``np.random.default_rng(seed)`` from the sorted user ids, then sorted: the same seed gives
the same clients (the AsyncFedED paper picks 10 at random). The client order is the sorted order of their ids and
``natural_partition[i]`` indexes client ``i``'s (contiguous) training samples.

**Where the files are looked for**, in order (as for :mod:`asyncfl_jax.data.idx`): the ``path`` argument (only
there when given), ``$ASYNCFL_FEMNIST_DIR`` / ``$ASYNCFL_SHAKESPEARE_DIR``, ``$ASYNCFL_DATA_DIR/femnist`` /
``$ASYNCFL_DATA_DIR/shakespeare``. A missing dataset raises :class:`~asyncfl_jax.data.idx.DatasetNotFoundError`
listing the folders searched and how to get the files.
"""

from __future__ import annotations

import dataclasses
import glob
import io
import json
import os
from typing import Any, Sequence

import numpy as np

from asyncfl_jax.data.client_data import Dataset
from asyncfl_jax.data.idx import DATA_DIR_ENV, DatasetNotFoundError
from asyncfl_jax.errors import InputError

LEAF_DATASETS = ("leaf/femnist", "leaf/shakespeare")
"""The dataset names (``data.name``) of this module."""

ALL_LETTERS = "\n !\"&'(),-.0123456789:;>?ABCDEFGHIJKLMNOPQRSTUVWXYZ[]abcdefghijklmnopqrstuvwxyz}"
"""LEAF's Shakespeare vocabulary (``models/utils/language_utils.py``): a character's id is its position here."""

SEQUENCE_LENGTH = 80
"""Characters in one Shakespeare input (LEAF's window)."""

FEMNIST_CLASSES = 62
FEMNIST_SIDE = 28

PARQUET_TEST_FRACTION = 0.1
"""Fraction of each client's samples held out for the test set when the files (parquet) have no test split."""


class LeafFormatError(InputError):
    """A LEAF or parquet file does not hold what the dataset needs (the message names the file and the field)."""


@dataclasses.dataclass(frozen=True)
class _LeafSpec:
    name: str  # data.name
    short: str  # femnist / shakespeare: folder under $ASYNCFL_DATA_DIR
    env: str
    client_column: str  # parquet column of the client id
    x_column: str
    y_column: str
    leaf_command: str  # LEAF's preprocessing command (run in leaf/data/<short>)


_SPECS = {
    "leaf/femnist": _LeafSpec("leaf/femnist", "femnist", "ASYNCFL_FEMNIST_DIR", "writer_id", "image", "character",
                              "./preprocess.sh -s niid --sf 1.0 -k 0 -t sample"),
    "leaf/shakespeare": _LeafSpec("leaf/shakespeare", "shakespeare", "ASYNCFL_SHAKESPEARE_DIR", "character_id", "x",
                                  "y", "./preprocess.sh -s niid --sf 1.0 -k 0 -t sample"),
}


def _spec(name: str) -> _LeafSpec:
    if name not in _SPECS:
        raise ValueError(f"unknown LEAF dataset {name!r}; known: {list(LEAF_DATASETS)}")
    return _SPECS[name]


# ------------------------------------------------------------------------------------------------- vocabulary
_CHAR_ID = {c: i for i, c in enumerate(ALL_LETTERS)}


def encode_text(text: str, where: str = "text") -> np.ndarray:
    """Character ids of ``text`` over :data:`ALL_LETTERS` (int32 [len(text)]).

    Raises:
      LeafFormatError: a character is not in the vocabulary (named, with ``where``).
    """
    try:
        return np.fromiter((_CHAR_ID[c] for c in text), dtype=np.int32, count=len(text))
    except KeyError as e:
        raise LeafFormatError(f"{where}: character {e.args[0]!r} is not in LEAF's 80-character Shakespeare "
                              f"vocabulary {ALL_LETTERS!r}") from None


def decode_ids(ids: Sequence[int] | np.ndarray) -> str:
    """The text of character ids (the inverse of :func:`encode_text`)."""
    return "".join(ALL_LETTERS[int(i)] for i in ids)


# ------------------------------------------------------------------------------------------------- finding files
def _json_dir(folder: str) -> str | None:
    """The folder holding ``train/*.json`` and ``test/*.json`` (``folder`` itself or its ``data/``), or None."""
    for candidate in (folder, os.path.join(folder, "data")):
        if glob.glob(os.path.join(candidate, "train", "*.json")) and glob.glob(
                os.path.join(candidate, "test", "*.json")):
            return candidate
    return None


def _parquet_files(folder: str) -> list[str]:
    return sorted(glob.glob(os.path.join(folder, "**", "*.parquet"), recursive=True))


@dataclasses.dataclass(frozen=True)
class LeafFiles:
    """Where a LEAF dataset was found: ``format`` is ``"json"`` (``folder`` holds train/ and test/) or ``"parquet"``
    (``files``: every parquet file under ``folder``)."""

    name: str
    format: str
    folder: str
    files: tuple[str, ...]


def _candidates(spec: _LeafSpec, path: str | os.PathLike | None) -> list[tuple[str, str]]:
    if path is not None:
        return [(os.fspath(path), "path argument / data.path")]  # a given folder is the only place searched
    out = []
    if os.environ.get(spec.env):
        out.append((os.environ[spec.env], f"${spec.env}"))
    if os.environ.get(DATA_DIR_ENV):
        out.append((os.path.join(os.environ[DATA_DIR_ENV], spec.short), f"${DATA_DIR_ENV}/{spec.short}"))
    return out


def how_to_get(name: str) -> str:
    """The instructions printed when the files of ``name`` are missing."""
    spec = _spec(name)
    hub = f"flwrlabs/{spec.short}"
    return (
        "To get the files (once, on a machine with internet access; nothing is downloaded at run time):\n"
        f"  * LEAF JSON: git clone https://github.com/TalwalkarLab/leaf; cd leaf/data/{spec.short}; "
        f"{spec.leaf_command}; then pass the folder leaf/data/{spec.short}/data (with train/ and test/) as "
        "data.path (--data-dir)\n"
        f"  * or the parquet form published for Flower (Hugging Face dataset {hub}): pip install datasets; "
        f"python -c \"from datasets import load_dataset; load_dataset('{hub}', split='train')"
        f".to_parquet('DIR/train.parquet')\"; then pass DIR as data.path (--data-dir); reading it needs "
        "pip install -e \".[leaf]\" from a clone (pyarrow)\n"
        f"  * instead of data.path, ${spec.env}=<folder> or ${DATA_DIR_ENV}=<parent> with a '{spec.short}' "
        "subfolder also work")


def find_leaf_files(name: str, path: str | os.PathLike | None = None) -> LeafFiles:
    """Finds the files of ``name`` (``"leaf/femnist"`` or ``"leaf/shakespeare"``); cheap (only lists files), so a
    command line can fail before compiling anything.

    Raises:
      DatasetNotFoundError: no searched folder holds LEAF JSON (train/ and test/) or parquet files; the message lists
        the folders and :func:`how_to_get`.
      ValueError: ``name`` is not a LEAF dataset.
    """
    spec = _spec(name)
    candidates = _candidates(spec, path)
    for folder, _ in candidates:
        if not os.path.isdir(folder):
            continue
        json_dir = _json_dir(folder)
        if json_dir is not None:
            return LeafFiles(name, "json", json_dir, ())
        files = _parquet_files(folder)
        if files:
            return LeafFiles(name, "parquet", folder, tuple(files))
    searched = "\n".join(f"  - {folder}  ({origin})" for folder, origin in candidates) or "  (nowhere)"
    unset = [v for v in (spec.env, DATA_DIR_ENV) if not os.environ.get(v)]
    if path is None and unset:
        searched += f"\n  ({' and '.join('$' + v for v in unset)} not set; no data.path given)"
    raise DatasetNotFoundError(
        f"{name} not found: no folder with LEAF JSON files (train/*.json and test/*.json) or parquet files "
        f"(*.parquet). Searched:\n{searched}\n{how_to_get(name)}")


def require_pyarrow() -> Any:
    """``pyarrow.parquet``, or an ImportError that says how to install it."""
    try:
        import pyarrow.parquet as pq
    except ImportError as e:
        raise ImportError(f"reading the parquet form of the LEAF datasets needs pyarrow ({e}); install it with "
                          "pip install -e \".[leaf]\" from a clone (or pip install pyarrow)") from None
    return pq


# ------------------------------------------------------------------------------------------------- choosing clients
def choose_clients(users: Sequence[str], num_clients: int, seed: int, name: str = "dataset") -> list[str]:
    """``num_clients`` distinct users drawn uniformly without replacement from the sorted ``users`` with
    ``np.random.default_rng(seed)``, returned sorted.

    Raises:
      ValueError: fewer users than ``num_clients``.
    """
    pool = sorted(set(users))
    if num_clients < 1 or num_clients > len(pool):
        raise ValueError(f"data.num_clients = {num_clients}: {name} has {len(pool)} clients with training samples; "
                         f"choose between 1 and {len(pool)}")
    picked = np.random.default_rng(seed).choice(len(pool), size=num_clients, replace=False)
    return [pool[i] for i in sorted(picked)]


# ------------------------------------------------------------------------------------------------- decoding samples
def _femnist_x(values: Any, where: str) -> np.ndarray:
    arr = np.asarray(values, dtype=np.float32)
    if arr.shape != (FEMNIST_SIDE * FEMNIST_SIDE,):
        raise LeafFormatError(f"{where}: a FEMNIST image must be 784 floats (28x28), got shape {arr.shape}")
    if not np.all(np.isfinite(arr)) or arr.min() < 0 or arr.max() > 1:
        raise LeafFormatError(f"{where}: FEMNIST pixel values must lie in [0, 1] (LEAF stores value / 255)")
    return arr.reshape(FEMNIST_SIDE, FEMNIST_SIDE, 1)


def _femnist_png(cell: Any, where: str) -> np.ndarray:
    raw = cell.get("bytes") if isinstance(cell, dict) else cell
    if not isinstance(raw, (bytes, bytearray)):
        raise LeafFormatError(f"{where}: the image column must hold PNG bytes or a {{bytes, path}} struct, got "
                              f"{type(raw).__name__}")
    from PIL import Image

    with Image.open(io.BytesIO(raw)) as img:
        arr = np.asarray(img.convert("L"), dtype=np.float32) / np.float32(255.0)
    if arr.shape != (FEMNIST_SIDE, FEMNIST_SIDE):
        raise LeafFormatError(f"{where}: a FEMNIST image must be 28x28, got {arr.shape[1]}x{arr.shape[0]}")
    return arr[..., None]


def _label(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not 0 <= value < FEMNIST_CLASSES:
        raise LeafFormatError(f"{where}: a FEMNIST label must be an integer in [0, {FEMNIST_CLASSES}), got {value!r}")
    return int(value)


def _text_x(value: Any, where: str) -> np.ndarray:
    if not isinstance(value, str) or len(value) != SEQUENCE_LENGTH:
        raise LeafFormatError(f"{where}: a Shakespeare input must be a string of {SEQUENCE_LENGTH} characters, got "
                              f"{value!r}")
    return encode_text(value, where).astype(np.float32)


def _text_y(value: Any, where: str) -> int:
    if not isinstance(value, str) or len(value) != 1:
        raise LeafFormatError(f"{where}: a Shakespeare target must be one character, got {value!r}")
    return int(encode_text(value, where)[0])


def _decode(name: str, xs: Sequence[Any], ys: Sequence[Any], where: str, png: bool = False
            ) -> tuple[np.ndarray, np.ndarray]:
    if len(xs) != len(ys):
        raise LeafFormatError(f"{where}: {len(xs)} inputs but {len(ys)} targets")
    if name == "leaf/femnist":
        to_x = _femnist_png if png else _femnist_x
        x = [to_x(v, f"{where}, sample {j}") for j, v in enumerate(xs)]
        y = [_label(v, f"{where}, sample {j}") for j, v in enumerate(ys)]
        shape = (FEMNIST_SIDE, FEMNIST_SIDE, 1)
    else:
        x = [_text_x(v, f"{where}, sample {j}") for j, v in enumerate(xs)]
        y = [_text_y(v, f"{where}, sample {j}") for j, v in enumerate(ys)]
        shape = (SEQUENCE_LENGTH,)
    return np.asarray(x, np.float32).reshape(-1, *shape), np.asarray(y, np.int32)


# ------------------------------------------------------------------------------------------------- readers
def _read_json_split(folder: str, split: str) -> dict[str, dict[str, list]]:
    """``user -> {"x": [...], "y": [...]}`` over every JSON file of ``folder/split`` (file name order)."""
    out: dict[str, dict[str, list]] = {}
    for filename in sorted(glob.glob(os.path.join(folder, split, "*.json"))):
        try:
            with open(filename) as f:
                content = json.load(f)
        except json.JSONDecodeError as e:
            raise LeafFormatError(f"{filename}: not valid JSON ({e})") from None
        if not isinstance(content, dict) or not isinstance(content.get("user_data"), dict):
            raise LeafFormatError(f"{filename}: a LEAF file is an object with a 'user_data' object")
        for user, data in content["user_data"].items():
            if not isinstance(data, dict) or "x" not in data or "y" not in data:
                raise LeafFormatError(f"{filename}: user_data[{user!r}] must be an object with 'x' and 'y' lists")
            entry = out.setdefault(str(user), {"x": [], "y": [], "file": filename})
            entry["x"].extend(data["x"])
            entry["y"].extend(data["y"])
    return out


def _pool(name: str, chosen: Sequence[str], per_user: dict[str, tuple[np.ndarray, np.ndarray]]
          ) -> tuple[np.ndarray, np.ndarray, list[np.ndarray]]:
    xs, ys, parts, offset = [], [], [], 0
    for user in chosen:
        x, y = per_user[user]
        xs.append(x)
        ys.append(y)
        parts.append(np.arange(offset, offset + len(y), dtype=np.int64))
        offset += len(y)
    return np.concatenate(xs), np.concatenate(ys), parts


def _load_json(files: LeafFiles, num_clients: int, seed: int) -> Dataset:
    name = files.name
    train = _read_json_split(files.folder, "train")
    test = _read_json_split(files.folder, "test")
    users = [u for u, d in train.items() if len(d["y"]) > 0]
    chosen = choose_clients(users, num_clients, seed, name)
    train_arrays = {u: _decode(name, train[u]["x"], train[u]["y"], f"{train[u]['file']}, user {u!r}")
                    for u in chosen}
    train_x, train_y, parts = _pool(name, chosen, train_arrays)
    test_arrays = [_decode(name, test[u]["x"], test[u]["y"], f"{test[u]['file']}, user {u!r}")
                   for u in chosen if u in test and len(test[u]["y"]) > 0]
    if not test_arrays:
        raise LeafFormatError(
            f"{files.folder}: none of the chosen clients {chosen} has test samples in test/*.json; LEAF splits by "
            "sample with '-t sample' (every user's samples split into train and test), which is what the pooled "
            "test set of the chosen clients needs ('-t user' puts other users in the test files)")
    test_x = np.concatenate([a[0] for a in test_arrays])
    test_y = np.concatenate([a[1] for a in test_arrays])
    return _dataset(name, train_x, train_y, test_x, test_y, parts)


def _load_parquet(files: LeafFiles, num_clients: int, seed: int, test_fraction: float) -> Dataset:
    pq = require_pyarrow()
    import pyarrow as pa

    spec = _spec(files.name)
    columns = [spec.client_column, spec.x_column, spec.y_column]
    tables = []
    for filename in files.files:
        schema = pq.read_schema(filename)
        missing = [c for c in columns if c not in schema.names]
        if missing:
            raise LeafFormatError(f"{filename}: {files.name} parquet files need the columns {columns}; missing "
                                  f"{missing} (found {schema.names})")
        tables.append(pq.read_table(filename, columns=[spec.client_column]))
    ids = pa.concat_tables(tables).column(spec.client_column).to_pylist()
    chosen = choose_clients([str(u) for u in ids], num_clients, seed, files.name)
    wanted = set(chosen)
    rows: dict[str, tuple[list, list]] = {u: ([], []) for u in chosen}
    for filename in files.files:
        table = pq.read_table(filename, columns=columns)
        for user, x, y in zip(*(table.column(c).to_pylist() for c in columns)):
            if str(user) in wanted:
                rows[str(user)][0].append(x)
                rows[str(user)][1].append(y)
    rng = np.random.default_rng(seed)
    train_arrays, test_x, test_y = {}, [], []
    for user in chosen:  # sorted ids: the held-out draws do not depend on the file order of the clients
        x, y = _decode(files.name, rows[user][0], rows[user][1], f"{files.folder}, client {user!r}",
                       png=files.name == "leaf/femnist")
        keep, held = split_held_out(len(y), test_fraction, rng)
        train_arrays[user] = (x[keep], y[keep])
        test_x.append(x[held])
        test_y.append(y[held])
    train_x, train_y, parts = _pool(files.name, chosen, train_arrays)
    return _dataset(files.name, train_x, train_y, np.concatenate(test_x), np.concatenate(test_y), parts)


def split_held_out(n: int, test_fraction: float, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """(train, test) sorted indices of ``n`` samples: ``max(1, int((1 - test_fraction) n))`` kept for training, a
    uniformly random subset (one ``rng.permutation(n)``) of the rest held out."""
    n_train = max(1, int((1.0 - test_fraction) * n))
    order = rng.permutation(n)
    return np.sort(order[:n_train]), np.sort(order[n_train:])


def _dataset(name: str, train_x: np.ndarray, train_y: np.ndarray, test_x: np.ndarray, test_y: np.ndarray,
             parts: list[np.ndarray]) -> Dataset:
    num_classes = FEMNIST_CLASSES if name == "leaf/femnist" else len(ALL_LETTERS)
    return Dataset(name=name, train_x=train_x, train_y=train_y, test_x=test_x, test_y=test_y,
                   num_classes=num_classes, natural_partition=parts)


def load_leaf(name: str, path: str | os.PathLike | None = None, num_clients: int = 10, seed: int = 0,
              test_fraction: float = PARQUET_TEST_FRACTION) -> Dataset:
    """Loads ``num_clients`` writers (``"leaf/femnist"``) or speaking roles (``"leaf/shakespeare"``) with their
    natural partition; see the module docstring for the formats, the client choice and the test set.

    Args:
      name: ``"leaf/femnist"`` or ``"leaf/shakespeare"``.
      path: the folder with the files (LEAF's ``data/`` with train/ and test/, or a folder of parquet files).
      num_clients: how many writers / roles to keep.
      seed: draws the clients (and, for parquet, each client's held-out test samples).
      test_fraction: parquet only (LEAF JSON has its own test split): fraction of each client's samples held out.

    Returns:
      A :class:`Dataset` named ``name`` with ``natural_partition`` (client ``i``: the ``i``-th chosen id in sorted
      order) and ``num_classes`` 62 (FEMNIST) or 80 (Shakespeare).

    Raises:
      DatasetNotFoundError: no files (with how to get them); LeafFormatError: malformed files; ValueError: more
      clients asked for than the data has; ImportError: parquet files without pyarrow.
    """
    if not 0.0 < test_fraction < 1.0:
        raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction}")
    files = find_leaf_files(name, path)
    if files.format == "json":
        return _load_json(files, num_clients, seed)
    return _load_parquet(files, num_clients, seed, test_fraction)
