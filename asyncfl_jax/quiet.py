"""Holding back what orbax and tensorstore print while a checkpoint is written.

orbax writes a checkpoint in threads of its own; when a write fails (a full disk: tensorstore's "No space left on
device"), each thread logs the error with its traceback through absl's logger (100 to 200 lines on stderr), and then
the save raises it once more in the calling thread. The package reports that one exception
(:class:`~asyncfl_jax.checkpoint.CheckpointError`, exit code 2 in the command, with what to do), so the threads' copies
are held back while a save runs: :func:`library_logs_held` raises the level of their loggers above CRITICAL for the
block, and catches what tensorstore's callbacks print when they find orbax's event loop already closed (each a
"RuntimeError: Event loop is closed" traceback through ``sys.excepthook``, ``sys.unraisablehook`` or
``threading.excepthook``), and restores all of it afterwards. The traceback of the exception itself stays available
(``asyncfl run --debug``).
"""

from __future__ import annotations

import contextlib
import logging
import sys
import threading
from typing import Iterator

LIBRARY_LOGGERS = ("absl", "orbax", "tensorstore")
"""The loggers orbax's and tensorstore's threads write to (absl's carries orbax's messages)."""


@contextlib.contextmanager
def library_logs_held(names: tuple[str, ...] = LIBRARY_LOGGERS) -> Iterator[None]:
    """While the block runs, the loggers ``names`` (and their children, which inherit the level) print nothing; their
    levels are restored when it ends."""
    loggers = [logging.getLogger(name) for name in names]
    levels = [logger.level for logger in loggers]
    hooks = (sys.excepthook, sys.unraisablehook, threading.excepthook)
    held: list[object] = []
    for logger in loggers:
        logger.setLevel(logging.CRITICAL + 1)
    sys.excepthook = lambda *args: held.append(args)
    sys.unraisablehook = threading.excepthook = held.append
    try:
        yield
    finally:
        sys.excepthook, sys.unraisablehook, threading.excepthook = hooks
        for logger, level in zip(loggers, levels):
            logger.setLevel(level)
