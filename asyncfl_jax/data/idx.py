"""MNIST and Fashion-MNIST from their canonical IDX files (``.gz`` or uncompressed), parsed with numpy.

Each dataset is four files in one folder::

    train-images-idx3-ubyte.gz  train-labels-idx1-ubyte.gz  t10k-images-idx3-ubyte.gz  t10k-labels-idx1-ubyte.gz

(the same names without ``.gz`` are accepted too). The folder is looked for, in order, in

1. the ``path`` argument (the folder itself, or its ``fashion-mnist`` / ``mnist`` subfolder); when a path is given,
   nowhere else is searched;
2. the environment variable ``ASYNCFL_FASHION_MNIST_DIR`` (resp. ``ASYNCFL_MNIST_DIR``);
3. ``$ASYNCFL_DATA_DIR/fashion-mnist`` (resp. ``$ASYNCFL_DATA_DIR/mnist``);
4. ``/usr/share/datasets/fashion-mnist`` (resp. ``/usr/share/datasets/mnist``): Debian's and Ubuntu's
   ``dataset-fashion-mnist`` package installs Fashion-MNIST there (``apt-get install dataset-fashion-mnist``).

If none has all four files, :class:`DatasetNotFoundError` says where it looked and how to get the files.
"""

from __future__ import annotations

import dataclasses
import gzip
import os

import numpy as np

from asyncfl_jax.data.client_data import Dataset
from asyncfl_jax.errors import InputError

SYSTEM_DATA_DIR = "/usr/share/datasets"
"""Where system packages install datasets (Debian's ``dataset-fashion-mnist``); read at call time, so tests can
point it elsewhere with ``monkeypatch.setattr(idx, "SYSTEM_DATA_DIR", ...)``."""

DATA_DIR_ENV = "ASYNCFL_DATA_DIR"
"""Environment variable naming a folder that holds one subfolder per dataset."""

IDX_FILES = {
    "train_x": "train-images-idx3-ubyte",
    "train_y": "train-labels-idx1-ubyte",
    "test_x": "t10k-images-idx3-ubyte",
    "test_y": "t10k-labels-idx1-ubyte",
}
"""The four IDX files of an MNIST-format dataset, without the optional ``.gz`` suffix."""


@dataclasses.dataclass(frozen=True)
class _IdxSpec:
    name: str  # Dataset.name
    subdir: str  # folder name under $ASYNCFL_DATA_DIR and SYSTEM_DATA_DIR
    env: str  # environment variable naming the folder itself
    url: str  # the dataset's home page
    apt_package: str | None  # Debian/Ubuntu package that installs it under SYSTEM_DATA_DIR


_SPECS = {
    "fashion_mnist": _IdxSpec(
        name="fashion_mnist",
        subdir="fashion-mnist",
        env="ASYNCFL_FASHION_MNIST_DIR",
        url="https://github.com/zalandoresearch/fashion-mnist",
        apt_package="dataset-fashion-mnist",
    ),
    "mnist": _IdxSpec(
        name="mnist",
        subdir="mnist",
        env="ASYNCFL_MNIST_DIR",
        url="http://yann.lecun.com/exdb/mnist/",
        apt_package=None,
    ),
}
_ALIASES = {"fashion_mnist": "fashion_mnist", "fashion-mnist": "fashion_mnist", "fashionmnist": "fashion_mnist",
            "mnist": "mnist"}


class DatasetNotFoundError(FileNotFoundError):
    """The files of a dataset were not found in any of the places searched (the message lists them)."""


class IdxFormatError(InputError):
    """A file is not a well-formed IDX file."""


_IDX_DTYPES = {
    0x08: np.dtype(np.uint8),
    0x09: np.dtype(np.int8),
    0x0B: np.dtype(">i2"),
    0x0C: np.dtype(">i4"),
    0x0D: np.dtype(">f4"),
    0x0E: np.dtype(">f8"),
}


def _spec(name: str) -> _IdxSpec:
    key = _ALIASES.get(name.lower())
    if key is None:
        raise ValueError(f"unknown IDX dataset {name!r}; known: {sorted(_SPECS)}")
    return _SPECS[key]


def _find_file(folder: str, stem: str) -> str | None:
    for candidate in (stem + ".gz", stem):
        full = os.path.join(folder, candidate)
        if os.path.isfile(full):
            return full
    return None


def _has_all_files(folder: str) -> bool:
    return os.path.isdir(folder) and all(_find_file(folder, stem) is not None for stem in IDX_FILES.values())


def _candidates(spec: _IdxSpec, path: str | os.PathLike | None) -> list[tuple[str, str]]:
    """(folder, where it came from) in search order."""
    out: list[tuple[str, str]] = []
    if path is not None:
        path = os.fspath(path)
        out.append((path, "path argument"))
        out.append((os.path.join(path, spec.subdir), "path argument"))
        return out  # an explicit folder is the only place searched: a wrong path is an error, never a fallback
    env_dir = os.environ.get(spec.env)
    if env_dir:
        out.append((env_dir, f"${spec.env}"))
    data_dir = os.environ.get(DATA_DIR_ENV)
    if data_dir:
        out.append((os.path.join(data_dir, spec.subdir), f"${DATA_DIR_ENV}/{spec.subdir}"))
    out.append((os.path.join(SYSTEM_DATA_DIR, spec.subdir), "system default"))
    return out


def find_idx_dir(name: str, path: str | os.PathLike | None = None) -> str:
    """Returns the folder holding the four IDX files of ``name`` (``"fashion_mnist"`` or ``"mnist"``).

    Cheap (only checks that the files exist), so a command line can fail early, before compiling anything.

    Args:
      name: ``"fashion_mnist"`` (also ``"fashion-mnist"``) or ``"mnist"``.
      path: the folder with the files, or a folder with a ``fashion-mnist`` / ``mnist`` subfolder. When given, it is
        the only place searched (a wrong path is reported, not silently replaced by another copy).

    Raises:
      DatasetNotFoundError: no searched folder has all four files; the message lists every folder searched and how
        to get the files.
      ValueError: ``name`` is not a known IDX dataset.
    """
    spec = _spec(name)
    candidates = _candidates(spec, path)
    for folder, _ in candidates:
        if _has_all_files(folder):
            return folder
    searched = "\n".join(f"  - {folder}  ({origin})" for folder, origin in candidates)
    unset = [var for var in (spec.env, DATA_DIR_ENV) if not os.environ.get(var)]
    if unset:
        searched += f"\n  ({' and '.join(unset)} not set)"
    files = ", ".join(stem + ".gz" for stem in IDX_FILES.values())
    how = []
    if spec.apt_package is not None:
        how.append(
            f"  * on Debian/Ubuntu: apt-get install {spec.apt_package}  "
            f"(installs them into {os.path.join('/usr/share/datasets', spec.subdir)})"
        )
    how.append(
        f"  * {'or ' if how else ''}download the four IDX files ({files}) from {spec.url} into a folder, and pass that folder as "
        f"--data-dir (path=...) or set {spec.env}=<folder> (or {DATA_DIR_ENV}=<parent> with a '{spec.subdir}' "
        "subfolder)"
    )
    raise DatasetNotFoundError(
        f"{spec.name} not found: no folder with all four IDX files ({', '.join(IDX_FILES.values())}, "
        f".gz or not). Searched:\n{searched}\nTo get the files:\n" + "\n".join(how)
    )


def read_idx(filename: str | os.PathLike) -> np.ndarray:
    """Reads one IDX file (gzip-compressed if its name ends in ``.gz``) into a numpy array of its native type.

    The format: two zero bytes, a type byte (0x08 = uint8, 0x09 = int8, 0x0B = int16, 0x0C = int32, 0x0D = float32,
    0x0E = float64), a byte with the number of dimensions ``k``, ``k`` big-endian uint32 sizes, then the data in
    C order (big-endian for multi-byte types).

    Raises:
      IdxFormatError: the file is not a well-formed IDX file (bad magic number, truncated header, or a data length
        that does not match the dimensions), or is not valid gzip. The message names the file.
    """
    filename = os.fspath(filename)
    opener = gzip.open if filename.endswith(".gz") else open
    try:
        with opener(filename, "rb") as f:
            raw = f.read()
    except (OSError, EOFError) as e:
        if isinstance(e, FileNotFoundError):
            raise
        raise IdxFormatError(f"{filename}: cannot read ({e})") from e
    if len(raw) < 4:
        raise IdxFormatError(f"{filename}: not an IDX file (only {len(raw)} bytes)")
    zero0, zero1, type_code, ndim = raw[0], raw[1], raw[2], raw[3]
    if zero0 != 0 or zero1 != 0 or type_code not in _IDX_DTYPES:
        raise IdxFormatError(
            f"{filename}: not an IDX file (magic number 0x{int.from_bytes(raw[:4], 'big'):08X}; expected 0x0000TTDD "
            f"with type TT in {{{', '.join(f'{t:02X}' for t in _IDX_DTYPES)}}})"
        )
    header = 4 + 4 * ndim
    if len(raw) < header:
        raise IdxFormatError(f"{filename}: truncated IDX header ({ndim} dimensions need {header} bytes, got {len(raw)})")
    dims = tuple(int(d) for d in np.frombuffer(raw, dtype=">u4", count=ndim, offset=4))
    dtype = _IDX_DTYPES[type_code]
    expected = int(np.prod(dims, dtype=np.int64)) * dtype.itemsize
    if len(raw) - header != expected:
        raise IdxFormatError(
            f"{filename}: IDX data has {len(raw) - header} bytes but dimensions {dims} of {dtype} need {expected}"
        )
    data = np.frombuffer(raw, dtype=dtype, offset=header).reshape(dims)
    return data.astype(dtype.newbyteorder("="), copy=True)


def _images(filename: str) -> np.ndarray:
    arr = read_idx(filename)
    if arr.ndim != 3:
        raise IdxFormatError(f"{filename}: expected images of shape [N, rows, cols], got shape {arr.shape}")
    scale = 255.0 if arr.dtype == np.uint8 else 1.0
    return (arr.astype(np.float32) / np.float32(scale))[..., None]


def _labels(filename: str) -> np.ndarray:
    arr = read_idx(filename)
    if arr.ndim != 1:
        raise IdxFormatError(f"{filename}: expected labels of shape [N], got shape {arr.shape}")
    return arr.astype(np.int32)


def load_idx_dataset(name: str, path: str | os.PathLike | None = None, num_classes: int = 10) -> Dataset:
    """Loads an MNIST-format dataset found by :func:`find_idx_dir`.

    Images become float32 in ``[0, 1]`` with shape ``[N, rows, cols, 1]``; labels int32.
    """
    spec = _spec(name)
    folder = find_idx_dir(spec.name, path)
    files = {key: _find_file(folder, stem) for key, stem in IDX_FILES.items()}
    train_x, train_y = _images(files["train_x"]), _labels(files["train_y"])
    test_x, test_y = _images(files["test_x"]), _labels(files["test_y"])
    for x, y, split in ((train_x, train_y, "train"), (test_x, test_y, "test")):
        if len(x) != len(y):
            raise IdxFormatError(f"{folder}: {split} split has {len(x)} images but {len(y)} labels")
        if len(y) and (y.min() < 0 or y.max() >= num_classes):
            raise IdxFormatError(
                f"{folder}: {split} labels must lie in [0, {num_classes}), got [{y.min()}, {y.max()}]"
            )
    return Dataset(
        name=spec.name, train_x=train_x, train_y=train_y, test_x=test_x, test_y=test_y, num_classes=num_classes
    )


def load_fashion_mnist(path: str | os.PathLike | None = None) -> Dataset:
    """Fashion-MNIST (60,000 train / 10,000 test, 28×28×1, 10 classes) from IDX files; see :func:`find_idx_dir`."""
    return load_idx_dataset("fashion_mnist", path)


def load_mnist(path: str | os.PathLike | None = None) -> Dataset:
    """MNIST (60,000 train / 10,000 test, 28×28×1, 10 classes) from IDX files; see :func:`find_idx_dir`."""
    return load_idx_dataset("mnist", path)
