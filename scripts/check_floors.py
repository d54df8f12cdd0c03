#!/usr/bin/env python
"""Checks that the dependency floors in ``pyproject.toml`` really work.

It creates a fresh virtual environment, installs every runtime dependency and every dependency of the extras
``[leaf]``, ``[tfds]`` and ``[tensorboard]`` at exactly its declared floor (``jax>=0.8.0`` becomes ``jax==0.8.0``; pip
resolves the rest), installs this project without its dependencies, and runs a tiny experiment through the command
line (data, compile, checkpoints with orbax, results files, the plot, TensorBoard scalars with tensorboardX; the
console entries ``asyncfl`` and ``asyncfl-launch-local``) and a short Python session (import, simulate, History; a
LEAF FEMNIST parquet file written with pyarrow and Pillow and read back; a TFDS dataset mocked by
``tfds.testing.mock_data``, nothing downloaded). It prints the installed versions and
ends with exit code 0 when all of it worked, 1 when an installed floor failed to run, 2 when the floors cannot be
installed together.

Usage::

    python scripts/check_floors.py                 # a temporary environment, removed at the end
    python scripts/check_floors.py --keep DIR      # build it in DIR and keep it (a second call reuses it)
    python scripts/check_floors.py --no-extras     # the runtime dependencies only

It needs the package index (PyPI) and takes a few minutes (mostly downloading jaxlib; pip's cache makes a second
run faster). CI runs it (``.ci/run``).
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
from typing import Sequence

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

EXTRAS_CHECK = """
import io, os, tempfile
import numpy as np
import asyncfl_jax as afl

tmp = tempfile.mkdtemp()
# [leaf]: a FEMNIST parquet file in Flower's columns (PNG images), written with pyarrow and Pillow, read back
import pyarrow as pa, pyarrow.parquet as pq
from PIL import Image
rng = np.random.default_rng(0)
def png(image):
    buffer = io.BytesIO()
    Image.fromarray(image).save(buffer, format="PNG")
    return buffer.getvalue()
images = rng.integers(0, 256, (24, 28, 28), dtype=np.uint8)
table = pa.table({"image": [{"bytes": png(im), "path": None} for im in images],
                  "writer_id": [f"f{i % 3:04d}_00" for i in range(24)], "hsf_id": [0] * 24,
                  "character": rng.integers(0, 62, 24).tolist()})
os.makedirs(os.path.join(tmp, "femnist"))
pq.write_table(table, os.path.join(tmp, "femnist", "train.parquet"))
leaf = afl.data.load_leaf("leaf/femnist", os.path.join(tmp, "femnist"), num_clients=3, seed=0)
assert leaf.input_shape == (28, 28, 1) and leaf.num_classes == 62, (leaf.input_shape, leaf.num_classes)
print("leaf check: FEMNIST parquet", leaf.train_x.shape, leaf.test_x.shape)
# [tfds]: MNIST from tfds.testing.mock_data (no download), a task and two server steps
import tensorflow_datasets as tfds
with tfds.testing.mock_data(num_examples=40, policy=tfds.testing.MockPolicy.USE_CODE):
    mnist = afl.data.load_tfds("mnist", data_dir=tmp)
parts = afl.data.partition("iid", mnist.train_y, 4, seed=0)
task = afl.make_task(mnist, parts, afl.make_model("logreg", mnist.input_shape, mnist.num_classes))
schedule = afl.make_schedule("concurrent", 4, 2, afl.DelayModel(), seed=0, concurrency=2, buffer_size=1)
history = afl.simulate(task, afl.fedbuff(), schedule, afl.LocalConfig(steps=1, batch_size=4), progress=False)
print("tfds check: mocked MNIST, final test accuracy", history.final("test_accuracy"))
"""

CLI_ARGS = ["run", "--set", "data.num_clients=10", "--set", "data.synthetic_max_samples=60",
            "--set", "runs.arrivals=60", "--set", "runs.protocol.concurrency=10", "--set", "local.steps=2",
            "--set", "eval_points=3", "--no-progress"]

EXTRAS = ("leaf", "tfds", "tensorboard")
"""The extras whose floors are checked with the runtime dependencies."""


def floors(pyproject: Path, extras: Sequence[str] = ()) -> list[str]:
    """``name==floor`` for every runtime dependency, and every dependency of ``extras``, declared as ``name>=floor``
    (a dependency declared without a version, e.g. ``importlib_resources``, is installed as declared)."""
    with open(pyproject, "rb") as f:
        project = tomllib.load(f)["project"]
    requirements = list(project["dependencies"])
    for extra in extras:
        requirements += project["optional-dependencies"][extra]
    pinned = []
    for requirement in requirements:
        text = requirement.split("#")[0].strip()
        if re.fullmatch(r"[A-Za-z0-9_.\-]+", text):
            pinned.append(text)
            continue
        match = re.fullmatch(r"([A-Za-z0-9_.\-\[\]]+)\s*>=\s*([0-9][^,;\s]*)", text)
        if match is None:
            raise SystemExit(f"cannot read a floor from the requirement {requirement!r} (expected name>=version)")
        pinned.append(f"{match.group(1)}=={match.group(2)}")
    return list(dict.fromkeys(pinned))


def run(command: list[str], **kwargs) -> subprocess.CompletedProcess:
    print("$", " ".join(command), flush=True)
    return subprocess.run(command, **kwargs)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--keep", metavar="DIR",
                        help="build the environment in DIR and keep it (reused when it exists)")
    parser.add_argument("--no-extras", action="store_true", help=f"check the runtime dependencies only, not {EXTRAS}")
    args = parser.parse_args(argv)
    extras = () if args.no_extras else EXTRAS
    pinned = floors(ROOT / "pyproject.toml", extras)
    with tempfile.TemporaryDirectory(prefix="asyncfl-floors-") as tmp:
        env_dir = Path(args.keep) if args.keep else Path(tmp) / "venv"
        python = str(env_dir / "bin" / "python")
        if not Path(python).exists():
            run([sys.executable, "-m", "venv", str(env_dir)], check=True)
            run([python, "-m", "pip", "install", "-q", "--upgrade", "pip"], check=True)
        if run([python, "-m", "pip", "install", "-q", *pinned]).returncode != 0:
            print(f"FAIL: the floors cannot be installed together: {pinned}")
            return 2
        run([python, "-m", "pip", "install", "-q", "--no-deps", "-e", str(ROOT)], check=True)
        run([python, "-m", "pip", "list", "--format=freeze"])
        env = {**os.environ, "MPLBACKEND": "Agg", "ASYNCFL_COMPILE_CACHE": "off"}
        env.pop("PYTHONPATH", None)
        ok = run([python, "-c", PYTHON_CHECK], cwd=tmp, env=env).returncode == 0
        if extras:
            ok = run([python, "-c", EXTRAS_CHECK], cwd=tmp, env=env).returncode == 0 and ok
        out = Path(tmp) / "cli-run"
        tensorboard = ["--tensorboard", str(out / "events")] if "tensorboard" in extras else []
        ok = run([str(env_dir / "bin" / "asyncfl"), *CLI_ARGS, "--out", str(out), *tensorboard], cwd=tmp,
                 env=env).returncode == 0 and ok
        ok = ok and all((out / name).exists() for name in ("metrics.csv", "summary.json", "accuracy.png"))
        for entry in (["asyncfl", "--version"], ["asyncfl-launch-local", "--help"]):  # the installed console entries
            called = run([str(env_dir / "bin" / entry[0]), *entry[1:]], env=env, stdout=subprocess.DEVNULL)
            ok = called.returncode == 0 and ok
        if tensorboard:
            events = list((out / "events").rglob("events.out.tfevents.*"))
            print(f"tensorboard check: {len(events)} event file(s)")
            ok = ok and len(events) > 0
    print(("PASS" if ok else "FAIL") + f": the declared floors {pinned}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
