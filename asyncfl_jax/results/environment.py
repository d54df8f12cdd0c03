"""What produced a result (``environment.json``): versions, devices, the git state, the command line."""

from __future__ import annotations

import json
import os
import platform
from typing import Any

ENVIRONMENT_PACKAGES = (("asyncfl_jax", "asyncfl-jax"), ("jax", "jax"), ("jaxlib", "jaxlib"), ("flax", "flax"),
                        ("optax", "optax"), ("numpy", "numpy"))


VOLATILE_ENVIRONMENT = ("command", "started_utc")  # per invocation: in environment.json, not in summary.json


def git_state(folder: str, timeout: float = 5.0) -> dict[str, Any] | None:
    """``{"commit": sha, "dirty": bool}`` of the git repository holding ``folder`` (dirty: a tracked file differs
    from the commit; untracked files do not count); None when ``folder`` is in no repository, git is missing, or
    it does not answer within ``timeout`` seconds."""
    import subprocess

    def git(*args: str) -> str | None:
        try:
            out = subprocess.run(["git", "-C", folder, *args], capture_output=True, text=True, timeout=timeout,
                                 check=False)
        except (OSError, subprocess.SubprocessError):
            return None
        return out.stdout.strip() if out.returncode == 0 else None

    commit = git("rev-parse", "HEAD")
    if not commit:
        return None
    status = git("status", "--porcelain", "--untracked-files=no")
    return {"commit": commit, "dirty": None if status is None else bool(status)}


def invocation_info() -> dict[str, Any]:
    """The per-invocation part of ``environment.json``: ``command`` (``sys.argv``) and ``started_utc`` (now, UTC,
    ISO 8601 to the second)."""
    import datetime
    import sys

    now = datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0)
    return {"command": list(sys.argv), "started_utc": now.isoformat()}


def environment_info() -> dict[str, Any]:
    """What produced a result: versions of Python, this package, jax, jaxlib, flax, optax and numpy, the JAX backend
    and the kinds of its devices, the operating system, and ``git`` (:func:`git_state` of the repository holding the
    package, else of the working folder; absent outside a repository)."""
    import importlib.metadata as metadata
    import sys

    import jax

    info: dict[str, Any] = {"python": platform.python_version()}
    for module, dist in ENVIRONMENT_PACKAGES:
        version = None
        loaded = sys.modules.get(module)
        if loaded is not None:
            version = getattr(loaded, "__version__", None)
        if version is None:
            try:
                version = metadata.version(dist)
            except metadata.PackageNotFoundError:
                version = "not installed"
        info[module] = str(version)
    devices = jax.devices()
    info.update(jax_backend=jax.default_backend(), device_kinds=sorted({d.device_kind for d in devices}),
                device_count=len(devices), platform=platform.platform())
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # asyncfl_jax/
    git = git_state(package) or git_state(os.getcwd())
    if git is not None:
        info["git"] = git
    return info


def environment_json(environment: dict[str, Any], config: dict[str, Any]) -> str:
    """The text of ``environment.json``: the environment and the resolved configuration."""
    return json.dumps({**environment, "config": config}, indent=2, sort_keys=True) + "\n"
