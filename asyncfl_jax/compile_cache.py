"""JAX's persistent compilation cache for the command line, the scripts and notebooks.

XLA compiles every program the first time a process needs it; the persistent compilation cache writes the compiled
executables to a folder, so that a later process (a second ``asyncfl run`` of the same experiment, a notebook kernel
after a restart, a script run again) loads them instead of compiling again. The cache key is a hash of the lowered
program, the devices, the compile options, the XLA flags and the jax/jaxlib versions: a program that changes in any
of these gets a new entry, and a loaded executable is the one XLA compiled before, so results are bit-identical
with and without the cache.

Importing ``asyncfl_jax`` changes no global JAX setting. The command line (``asyncfl run``) and the scripts call
:func:`enable_compile_cache` first thing; a notebook or a user's script may call it too::

    import asyncfl_jax as afl
    afl.enable_compile_cache()        # the user cache folder, or $ASYNCFL_COMPILE_CACHE

Where the cache lives, in order of precedence:

1. ``enable_compile_cache(path)``: an explicit folder (``"off"`` turns the cache off);
2. ``$ASYNCFL_COMPILE_CACHE``: a folder, or ``off`` (also ``0``, ``false``, ``no``, ``none``) to turn it off;
3. a folder already set in JAX (``jax.config.update("jax_compilation_cache_dir", ...)`` or
   ``$JAX_COMPILATION_CACHE_DIR``);
4. ``$XDG_CACHE_HOME/asyncfl_jax/jax``, else ``~/.cache/asyncfl_jax/jax``.

``asyncfl run --no-compile-cache`` turns it off for one command. The folder grows with every new program (a few
hundred kB to a few MB each); delete it to reclaim the space, nothing else refers to it. The cache is trusted code:
JAX loads and runs what it finds there, so the folder is created readable by its owner only and should never be
shared with users you do not trust.

Caveat: the cache is supported by XLA:CPU, GPU and TPU in current jax, but on some CPUs jaxlib refuses to load its
own CPU executables (it logs an error and compiles again, jax issue 38445): then the cache costs a little disk space
and saves nothing, and results are unchanged.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

import jax

from asyncfl_jax.config import ConfigError

ENV_VAR = "ASYNCFL_COMPILE_CACHE"
OFF_WORDS = frozenset({"off", "0", "false", "no", "none"})
#: Cache every program, however quick to compile: an experiment compiles a handful of programs (init, the chunk,
#: its frozen variant, the evaluator) and the small ones add up in short runs and in the test suite.
DEFAULT_MIN_COMPILE_TIME_SECS = 0.0
#: No lower bound on an entry's size (0 lets JAX pick its file-system default, which is 0 for local folders).
DEFAULT_MIN_ENTRY_SIZE_BYTES = 0


@dataclass(frozen=True)
class CacheSettings:
    """The three JAX options this module sets: the cache folder (``None``: no persistent cache) and the thresholds
    a compiled program must reach to be written (compile seconds, entry bytes)."""

    directory: str | None
    min_compile_time_secs: float
    min_entry_size_bytes: int


def default_cache_dir(environ: Mapping[str, str] | None = None) -> Path:
    """``$XDG_CACHE_HOME/asyncfl_jax/jax`` when ``XDG_CACHE_HOME`` is set (and absolute), else
    ``~/.cache/asyncfl_jax/jax``."""
    environ = os.environ if environ is None else environ
    xdg = environ.get("XDG_CACHE_HOME", "")
    base = Path(xdg) if xdg and os.path.isabs(xdg) else Path.home() / ".cache"
    return base / "asyncfl_jax" / "jax"


def resolve_cache_dir(path: str | os.PathLike | None = None,
                      environ: Mapping[str, str] | None = None) -> Path | None:
    """The cache folder to use, or ``None`` for no cache, by the precedence in the module docstring.

    ``path`` and ``$ASYNCFL_COMPILE_CACHE`` accept a folder or an off word (``off``, ``0``, ``false``, ``no``,
    ``none``, any case); an empty value counts as not given. Relative folders are made absolute against the current
    directory, so that a process started elsewhere with the same value finds the same folder.
    """
    environ = os.environ if environ is None else environ
    for given in (path, environ.get(ENV_VAR)):
        if given is None or str(given).strip() == "":
            continue
        text = os.fspath(given).strip()
        if text.lower() in OFF_WORDS:
            return None
        return Path(text).expanduser().absolute()
    configured = jax.config.jax_compilation_cache_dir
    if configured:
        return Path(configured)
    return default_cache_dir(environ)


def current_settings() -> CacheSettings:
    """JAX's current persistent-cache settings (to restore them later with :func:`apply_settings`)."""
    return CacheSettings(jax.config.jax_compilation_cache_dir, jax.config.jax_persistent_cache_min_compile_time_secs,
                         jax.config.jax_persistent_cache_min_entry_size_bytes)


def apply_settings(settings: CacheSettings) -> None:
    """Set JAX's persistent-cache options to ``settings`` and make them take effect in this process.

    JAX opens its cache once per process, on the first compilation, and keeps using that folder; resetting it
    (``compilation_cache.reset_cache``) makes the next compilation open the folder set here, or none.
    """
    from jax.experimental.compilation_cache import compilation_cache

    _check_thresholds(settings.min_compile_time_secs, settings.min_entry_size_bytes)
    jax.config.update("jax_compilation_cache_dir", settings.directory)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", float(settings.min_compile_time_secs))
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", settings.min_entry_size_bytes)
    compilation_cache.reset_cache()


def enable_compile_cache(path: str | os.PathLike | None = None, *,
                         min_compile_time_secs: float = DEFAULT_MIN_COMPILE_TIME_SECS,
                         min_entry_size_bytes: int = DEFAULT_MIN_ENTRY_SIZE_BYTES,
                         environ: Mapping[str, str] | None = None) -> Path | None:
    """Turn on JAX's persistent compilation cache for this process; returns the folder, or ``None`` when off.

    Args:
      path: a folder, or ``"off"``; ``None`` follows ``$ASYNCFL_COMPILE_CACHE``, then JAX's own setting, then
        the user cache folder (module docstring).
      min_compile_time_secs: programs that compiled faster than this are not written (JAX's default is 1 s; here
        0: every program).
      min_entry_size_bytes: entries smaller than this are not written (0: JAX's default, -1: no limit).
      environ: the environment to read (``os.environ`` when ``None``).

    Call it before the first compilation you want cached; calling it again switches folders (or turns the cache
    off) for the compilations that follow. The folder is created with owner-only permissions when new. A folder
    that cannot be created or written raises :class:`~asyncfl_jax.config.ConfigError` (a ``ValueError``) naming
    the setting it came from.
    """
    _check_thresholds(min_compile_time_secs, min_entry_size_bytes)
    directory = resolve_cache_dir(path, environ)
    if directory is None:
        disable_compile_cache()
        return None
    try:
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        usable = directory.is_dir() and os.access(directory, os.W_OK)
        reason = "not a writable folder"
    except FileExistsError:
        usable, reason = False, "it exists and is not a folder"
    except OSError as e:
        usable, reason = False, f"cannot create the folder ({e.strerror})"
    if not usable:
        raise ConfigError(f"invalid option {_source(path, environ)} = {str(directory)!r}: {reason}; give a "
                          f"writable folder, or 'off' for no compilation cache")
    apply_settings(CacheSettings(str(directory), min_compile_time_secs, min_entry_size_bytes))
    return directory


def disable_compile_cache() -> None:
    """Turn JAX's persistent compilation cache off for the compilations that follow in this process."""
    settings = current_settings()
    apply_settings(CacheSettings(None, settings.min_compile_time_secs, settings.min_entry_size_bytes))


def _check_thresholds(min_compile_time_secs: float, min_entry_size_bytes: int) -> None:
    """Refuse thresholds JAX would misread: a negative or non-numeric time, a size below -1 or not an integer."""
    if isinstance(min_compile_time_secs, bool) or not isinstance(min_compile_time_secs, (int, float)) \
            or not min_compile_time_secs >= 0:
        raise ConfigError(f"invalid option min_compile_time_secs = {min_compile_time_secs!r}: must be a number >= 0")
    if isinstance(min_entry_size_bytes, bool) or not isinstance(min_entry_size_bytes, int) or min_entry_size_bytes < -1:
        raise ConfigError(f"invalid option min_entry_size_bytes = {min_entry_size_bytes!r}: must be an integer >= -1 "
                          f"(-1: no size limit and no file-system override, 0: JAX's default)")


def _source(path: str | os.PathLike | None, environ: Mapping[str, str] | None) -> str:
    """The name of the setting that gave the cache folder, for error messages."""
    environ = os.environ if environ is None else environ
    if path is not None and str(path).strip():
        return "compile cache folder"
    if environ.get(ENV_VAR, "").strip():
        return f"${ENV_VAR}"
    if jax.config.jax_compilation_cache_dir:
        return "jax_compilation_cache_dir"
    return "the default compile cache folder ($XDG_CACHE_HOME or ~/.cache)"
