"""The cost of checkpoints: ``simulate`` with the default checkpoints against no checkpoints, side by side.

Used by ``scripts/bench.py --parts checkpoints``. Each workload runs through ``simulate``, alternately without
checkpoints and with the default ones as ``asyncfl run`` makes them (by wall-clock interval, written in the background
while the next chunks run; no save after the last chunk, since the command saves the finished History there
instead: ``final_checkpoint=False``), ``repeats`` times each. Compared: the best time of each, measured as the
call's wall time minus ``History.compile_seconds`` (the compiled programs are the same with and without checkpoints,
and compiling, tens of seconds under load, would drown the difference; the run identity hashed for the checkpoints,
the chunks, evaluations and every wait for a save are in). Measured once each, informational: ``simulate``'s own
default (the same plus the final save, waited for) and the old default, a save after every chunk (asynchronous now).

Workloads (Fashion-MNIST; the evaluation sets shrunk to 2 examples so that the run is mostly training, which makes
the saves a larger share: a stricter test of the target):

* ``fedbuff_mlp``: the benchmark task (bench.py's FedBuff setting, MLP 784-200-200-10);
* ``ace``: ACE with its n x d gradient cache (n = 1000 clients, logistic regression, all clients active);
* ``logreg_10k``: FedBuff logistic regression, 10,000 server steps evaluated every 10 (1,000 chunks);
* ``fedbuff_mlp_long`` (plan ``long``: ``python scripts/bench_checkpoints.py --plan long``): the benchmark task run
  long enough (3,000 server steps, over a minute on 2 cores) that the default saves in the background mid-run, not
  only the bookkeeping of the other plans' shorter runs; 3 alternating repeats. The number of saves each run made is
  reported beside its time.

Target (issue: checkpoints that cost almost nothing): default wall time <= 1.05x that of no checkpoints.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from typing import Any

import jax

from bench_scale import SEED, _ace_setup, _ca2fl_setup, _shrunk_eval, log

from asyncfl_jax.data import partition
from asyncfl_jax.data.client_data import Dataset
from asyncfl_jax.engine import simulate
from asyncfl_jax.engine.callbacks import Checkpoints
from asyncfl_jax.models.core import make_model
from asyncfl_jax.task import make_task

TARGET_RATIO = 1.05  # default checkpoints: at most 1.05x the wall time of no checkpoints

# Per mode and workload: (server steps, eval_every, repeats, also time a save after every chunk).
PLANS = {
    "full": {"fedbuff_mlp": (600, 20, 2, True), "ace": (3000, 100, 5, True), "logreg_10k": (10_000, 10, 2, False)},
    "quick": {"fedbuff_mlp": (200, 20, 2, True), "ace": (1000, 100, 4, True), "logreg_10k": (3000, 10, 2, False)},
    "smoke": {"fedbuff_mlp": (4, 2, 1, True), "ace": (10, 5, 1, True), "logreg_10k": (20, 5, 1, False)},
    "long": {"fedbuff_mlp_long": (3000, 20, 3, False)},
}


def _workload(name: str, ds: Dataset, steps: int):
    """(task, algorithm, local, schedule, hyper-parameters) of a workload."""
    if name == "ace":
        n = 1000 if steps >= 100 else 50
        algorithm, local, schedule, hparams = _ace_setup(n, steps)
        model = "logreg"
    else:
        n = 100
        algorithm, local, schedule, hparams = _ca2fl_setup(n, steps, name="fedbuff")
        model = "mlp" if name.startswith("fedbuff_mlp") else "logreg"
    task = make_task(ds, partition("iid", ds.train_y, n, SEED),
                     make_model(model, ds.input_shape, ds.num_classes, seed=SEED), seed=SEED)
    return _shrunk_eval(task), algorithm, local, schedule, hparams


MODES = {"none": {}, "default": {"final_checkpoint": False}, "simulate_default": {},
         "every_chunk": {"checkpoint_every": 1}}


def _timed(task, algorithm, local, schedule, hparams, eval_every: int, mode: str) -> dict[str, Any]:
    """One ``simulate`` call: ``mode`` one of ``MODES`` ("none": no checkpoints; "default": as ``asyncfl run``)."""
    folder = tempfile.mkdtemp(prefix="bench-ckpt-") if mode != "none" else None
    kwargs = MODES[mode]
    saves = []
    original = Checkpoints.save

    def counted(self, loop, wait=True):
        saves.append(wait)
        return original(self, loop, wait)

    Checkpoints.save = counted  # counts the saves the run makes (mid-run ones are not waited for)
    try:
        t0 = time.perf_counter()
        h = simulate(task, algorithm, schedule, local, hparams=hparams, eval_every=eval_every, progress=False,
                     checkpoint_dir=folder, **kwargs)
        wall = time.perf_counter() - t0
    finally:
        Checkpoints.save = original
        if folder is not None:
            shutil.rmtree(folder, ignore_errors=True)
    jax.clear_caches()
    return {"seconds": wall - h.compile_seconds, "wall_seconds": wall, "compile_seconds": h.compile_seconds,
            "run_seconds": h.run_seconds, "checkpoint_seconds": h.checkpoint_seconds, "saves": len(saves)}


def run_checkpoints(ds: Dataset, mode: str) -> dict[str, Any]:
    """Default checkpoints vs none (and a save after every chunk) for each workload of ``PLANS[mode]``."""
    import orbax.checkpoint  # noqa: F401  (imported once per process by the first save; not part of a run's cost)

    out = {}
    for name, (steps, eval_every, repeats, every_chunk) in PLANS[mode].items():
        task, algorithm, local, schedule, hparams = _workload(name, ds, steps)
        runs: dict[str, list[dict[str, Any]]] = {"none": [], "default": []}
        for _ in range(repeats):  # alternated, so that a change of the machine's load hits both
            for which in ("none", "default"):
                runs[which].append(_timed(task, algorithm, local, schedule, hparams, eval_every, which))
        best = {k: min(v, key=lambda r: r["seconds"]) for k, v in runs.items()}
        row = {"steps": steps, "eval_every": eval_every, "chunks": -(-steps // eval_every), "repeats": repeats,
               "none": best["none"], "default": best["default"], "all_runs": runs,
               "ratio": best["default"]["seconds"] / best["none"]["seconds"]}
        for extra in ("simulate_default",) + (("every_chunk",) if every_chunk else ()):
            row[extra] = _timed(task, algorithm, local, schedule, hparams, eval_every, extra)
            row[f"{extra}_ratio"] = row[extra]["seconds"] / best["none"]["seconds"]
        out[name] = row
        log(f"  [{name}: {steps} steps, eval every {eval_every}] " + _describe(row))
    return out


def _describe(row: dict[str, Any]) -> str:
    parts = [f"none {row['none']['seconds']:.1f} s, default {row['default']['seconds']:.1f} s (waits "
             f"{row['default']['checkpoint_seconds']:.2f} s, {row['default'].get('saves', 0)} saves) = "
             f"{row['ratio']:.3f}x"]
    if row.get("repeats", 1) > 1:  # every repeat's ratio, in the order run (the spread the load makes)
        pairs = zip(row["all_runs"]["none"], row["all_runs"]["default"])
        parts.append("repeats " + ", ".join(f"{d['seconds'] / n['seconds']:.3f}x" for n, d in pairs))
    for extra, label in (("simulate_default", "with the final save"), ("every_chunk", "a save after every chunk")):
        if extra in row:
            parts.append(f"{label} {row[extra]['seconds']:.1f} s = {row[f'{extra}_ratio']:.2f}x (waits "
                         f"{row[extra]['checkpoint_seconds']:.2f} s)")
    return "; ".join(parts)


def print_checkpoints(cp: dict[str, Any]) -> None:
    print("\nCheckpoints: default (interval 60 s, asynchronous) vs none; best wall time of simulate() minus compile")
    for name, row in cp.items():
        print(f"  {name:<12} {row['steps']:>6} steps / eval {row['eval_every']:<4}: {_describe(row)}")


def targets(cp: dict[str, Any]) -> list[tuple[str, float, float]]:
    """(name, measured ratio, target) per workload: default / none <= TARGET_RATIO."""
    return [(f"checkpoints: default / none wall time, {name}", row["ratio"], TARGET_RATIO) for name, row in cp.items()]


def main(argv: list[str] | None = None) -> int:
    """``python scripts/bench_checkpoints.py --plan long``: one plan of this part on its own (Fashion-MNIST, or
    bench.py's synthetic stand-in when it is missing), printed and optionally written as JSON."""
    import argparse
    import json

    from bench import load_data

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--plan", choices=sorted(PLANS), default="long")
    p.add_argument("--out", default=None, help="write the results as JSON here")
    args = p.parse_args(argv)
    ds, _ = load_data()
    res = run_checkpoints(ds, args.plan)
    print_checkpoints(res)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(res, f, indent=1, default=float)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
