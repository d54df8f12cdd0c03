#!/usr/bin/env python
"""Checks that the dependency floors in ``pyproject.toml`` really work.

It creates a fresh virtual environment, installs every runtime dependency at exactly its declared floor (``jax>=0.6.0``
becomes ``jax==0.6.0``; pip resolves the rest), installs this project without its dependencies, and runs a tiny
experiment through the command line (data, compile, checkpoints with orbax, results files, the plot) and a short
Python session (import, simulate, History). It prints the installed versions and ends with exit code 0 when all of
it worked, 1 when an installed floor failed to run, 2 when the floors cannot be installed together.

Usage::

    python scripts/check_floors.py                 # a temporary environment, removed at the end
    python scripts/check_floors.py --keep DIR      # build it in DIR and keep it

It needs the package index (PyPI) and takes a few minutes (mostly downloading jaxlib).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

PYTHON_CHECK = """
import asyncfl_jax as afl
data = afl.data.synthetic_leaf(num_clients=8, alpha=1.0, beta=1.0, max_samples=60)
task = afl.make_task(data, data.natural_partition, afl.make_model("mlp", data.input_shape, data.num_classes))
schedule = afl.make_schedule("concurrent", 8, 20, afl.DelayModel(), seed=0, concurrency=4, buffer_size=2)
history = afl.simulate(task, afl.fedbuff(), schedule, afl.LocalConfig(steps=2, batch_size=8), seeds=[0, 1],
                       hparams={"server_lr": [0.5, 1.0]}, eval_every=10, progress=False)
assert history.metrics["test_accuracy"].shape == (4, 3), history.metrics["test_accuracy"].shape
print("python check: final test accuracy", history.final("test_accuracy"))
"""

CLI_ARGS = ["run", "--set", "data.num_clients=10", "--set", "data.synthetic_max_samples=60",
            "--set", "runs.arrivals=60", "--set", "runs.protocol.concurrency=10", "--set", "local.steps=2",
            "--set", "eval_points=3", "--no-progress"]


def floors(pyproject: Path) -> list[str]:
    """``name==floor`` for every runtime dependency declared as ``name>=floor``."""
    with open(pyproject, "rb") as f:
        dependencies = tomllib.load(f)["project"]["dependencies"]
    pinned = []
    for requirement in dependencies:
        match = re.fullmatch(r"\s*([A-Za-z0-9_.\-\[\]]+)\s*>=\s*([0-9][^,;\s]*)\s*", requirement.split("#")[0])
        if match is None:
            raise SystemExit(f"cannot read a floor from the requirement {requirement!r} (expected name>=version)")
        pinned.append(f"{match.group(1)}=={match.group(2)}")
    return pinned


def run(command: list[str], **kwargs) -> subprocess.CompletedProcess:
    print("$", " ".join(command), flush=True)
    return subprocess.run(command, **kwargs)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--keep", metavar="DIR", help="build the environment in DIR and keep it")
    args = parser.parse_args(argv)
    pinned = floors(ROOT / "pyproject.toml")
    with tempfile.TemporaryDirectory(prefix="asyncfl-floors-") as tmp:
        env_dir = Path(args.keep) if args.keep else Path(tmp) / "venv"
        run([sys.executable, "-m", "venv", str(env_dir)], check=True)
        python = str(env_dir / "bin" / "python")
        run([python, "-m", "pip", "install", "-q", "--upgrade", "pip"], check=True)
        if run([python, "-m", "pip", "install", "-q", *pinned]).returncode != 0:
            print(f"FAIL: the floors cannot be installed together: {pinned}")
            return 2
        run([python, "-m", "pip", "install", "-q", "--no-deps", "-e", str(ROOT)], check=True)
        run([python, "-m", "pip", "list", "--format=freeze"])
        env = {**os.environ, "MPLBACKEND": "Agg"}
        env.pop("PYTHONPATH", None)
        ok = run([python, "-c", PYTHON_CHECK], cwd=tmp, env=env).returncode == 0
        out = str(Path(tmp) / "cli-run")
        ok = run([str(env_dir / "bin" / "asyncfl"), *CLI_ARGS, "--out", out], cwd=tmp, env=env).returncode == 0 and ok
        ok = ok and all((Path(out) / name).exists() for name in ("metrics.csv", "summary.json", "accuracy.png"))
    print(("PASS" if ok else "FAIL") + f": the declared floors {pinned}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
