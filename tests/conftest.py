"""Test-session setup: one persistent compilation cache for the whole session, shared by the xdist workers.

Most of the suite's time is XLA compiling the same small programs again: many tests build the same task, algorithm
and schedule shapes through new closures, which ``jax.jit``'s in-memory cache (keyed by function identity) cannot
reuse but the persistent cache (keyed by the lowered program) can. The session's first process (the xdist
controller, or the only process with ``-n 0``) makes a fresh temporary folder and exports it as
``$ASYNCFL_COMPILE_CACHE`` (and ``$JAX_COMPILATION_CACHE_DIR``), so the workers and every subprocess a test starts
(``asyncfl``, the scripts, ``python -c`` programs, notebook kernels) use it too; it is deleted at the end of the
session. Every program is cached (minimum compile time 0). A loaded executable is the one
XLA compiled, so no result depends on the cache (``tests/test_compile_cache.py`` checks this).

``ASYNCFL_COMPILE_CACHE=DIR python -m pytest`` keeps the cache in DIR across sessions instead (it is then not
deleted), and ``ASYNCFL_COMPILE_CACHE=off`` runs the suite without it.
"""

from __future__ import annotations

import os
import shutil
import tempfile

import pytest

from hypothesis import settings as hypothesis_settings

# The property tests draw the same examples on every run (CI included), so that a run's outcome depends on the code
# alone; `HYPOTHESIS_PROFILE=explore python -m pytest` searches new random examples instead, to look for bugs.
hypothesis_settings.register_profile("derandomized", derandomize=True)
hypothesis_settings.register_profile("explore", derandomize=False)
hypothesis_settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "derandomized"))

ENV_VAR = "ASYNCFL_COMPILE_CACHE"  # asyncfl_jax.compile_cache.ENV_VAR, without importing jax in the controller
_OWNED = pytest.StashKey[str]()  # the folder this process made (and deletes at the end)


def pytest_configure(config: pytest.Config) -> None:
    """In the session's first process, a fresh cache folder for the session unless the environment names one."""
    if hasattr(config, "workerinput") or os.environ.get(ENV_VAR, "").strip():
        return
    folder = tempfile.mkdtemp(prefix="asyncfl-jax-test-compile-cache-")
    # Inherited by the xdist workers (started after this hook) and by every subprocess: the asyncfl command and the
    # scripts read ASYNCFL_COMPILE_CACHE, any other Python process that imports jax reads JAX_COMPILATION_CACHE_DIR.
    os.environ[ENV_VAR] = folder
    os.environ["JAX_COMPILATION_CACHE_DIR"] = folder
    os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"
    config.stash[_OWNED] = folder


def pytest_unconfigure(config: pytest.Config) -> None:
    folder = config.stash.get(_OWNED, None)
    if folder is not None:
        shutil.rmtree(folder, ignore_errors=True)
        for name in (ENV_VAR, "JAX_COMPILATION_CACHE_DIR", "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"):
            os.environ.pop(name, None)


# The files holding the longest tests (measured with --durations: the README commands in order, 4-device sharding in
# a subprocess, the README example, the notebooks, ...) run first. xdist's worksteal hands out tests in collection
# order, so a long test collected last would start last and leave the other worker idle at the end.
LONG_FIRST = ("test_readme_commands.py", "test_sharding.py", "test_readme.py", "test_lookahead.py",
              "test_notebooks.py", "test_reproduce_ace.py", "test_scripts.py", "test_defaults_and_floors.py")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """A stable reordering by file: LONG_FIRST's files first (in that order), the others after in their order;
    a file's tests stay together (its module fixtures are set up once)."""
    rank = {name: i for i, name in enumerate(LONG_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(LONG_FIRST)))


@pytest.fixture(scope="session", autouse=True)
def session_compile_cache() -> None:
    """Every test process compiles into and loads from the session's cache folder (every program: no minimum
    compile time)."""
    from asyncfl_jax.compile_cache import enable_compile_cache

    enable_compile_cache(min_compile_time_secs=0.0)
