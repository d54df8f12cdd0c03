"""Atomic files: what a reader sees at a path is the old content or the whole new one, never a partial write.

Every file this package writes (results, manifest, History files, checkpoint records, figures) goes through
:func:`atomic_file`, looked up in this module at each write (one place for fault-injection tests to replace it)."""

from __future__ import annotations

import contextlib
import os
import tempfile
from typing import Any, BinaryIO, Iterator


@contextlib.contextmanager
def atomic_file(path: str) -> Iterator[BinaryIO]:
    """A binary file that becomes ``path`` only when the block ends without an error: it is written as a temporary
    file in the same folder, flushed to disk (``fsync``) and renamed over ``path`` (``os.replace``, atomic); the
    folder is then synced so that the rename itself survives a crash. On an error the temporary file is removed and
    ``path`` is untouched."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tmp-", suffix=os.path.basename(path))
    try:
        with os.fdopen(fd, "wb") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise
    _fsync_dir(directory)


def _fsync_dir(directory: str) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:  # e.g. a platform where folders cannot be opened
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_atomic(path: str, data: str | bytes) -> None:
    """Writes ``data`` to ``path`` through a temporary file in the same folder, ``fsync`` and an atomic rename."""
    with atomic_file(path) as f:
        f.write(data.encode() if isinstance(data, str) else data)


def save_figure(fig: Any, path: str, dpi: int = 120) -> None:
    """Saves a matplotlib figure as PNG at ``path`` atomically (:func:`atomic_file`) and closes it."""
    import matplotlib.pyplot as plt

    with atomic_file(path) as f:
        fig.savefig(f, format="png", dpi=dpi)
    plt.close(fig)
