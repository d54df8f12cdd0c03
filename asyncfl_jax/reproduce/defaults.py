"""The sweep behind every algorithm's default hyper-parameters (``docs/defaults.md``).

Each algorithm runs as ``asyncfl run --algorithm NAME`` would run it: the embedded default task (LEAF Synthetic(1, 1),
100 clients with their natural data, MLP 60-200-200-10, K = 10, B = 32, local lr 0.05, heterogeneous speeds) under
that algorithm's usual protocol and number of uploads (:mod:`asyncfl_jax.algorithms.defaults`, which the command line
reads too). Its main server hyper-parameter is swept over a small grid (one vmapped program per algorithm) with two
seeds. The default is the earlier default when no seed diverged there and its mean final test accuracy is within 0.03
of the best point's (defaults are not moved for noise); otherwise it is the best point among those where no seed
diverged.

Usage::

    python scripts/sweep_defaults.py                       # every algorithm (about 20 minutes on 2 CPU cores)
    python scripts/sweep_defaults.py --algorithms ace aced --arrivals 1000 --out results/defaults
"""

from __future__ import annotations

import argparse
import json
import os
from typing import Any, Sequence

GRIDS: dict[str, dict[str, list[float]]] = {
    # algorithm -> the hyper-parameter swept and its values
    "ace": {"server_lr": [0.002, 0.005, 0.01, 0.02, 0.1]},
    "aced": {"server_lr": [0.002, 0.005, 0.01, 0.02, 0.1]},
    "delay_adaptive_asgd": {"server_lr": [0.01, 0.02, 0.05, 0.1]},
    "asgd": {"server_lr": [0.1, 0.3, 1.0]},
    "fedasync": {"alpha": [0.1, 0.3, 0.5, 0.9]},
    "fedbuff": {"server_lr": [0.5, 1.0, 2.0]},
    "fedavg": {"server_lr": [0.5, 1.0, 2.0]},
    "ca2fl": {"server_lr": [0.5, 1.0, 2.0]},
    "mf_ca2fl": {"server_lr": [0.5, 1.0, 2.0]},
    "mifa": {"server_lr": [0.5, 1.0, 2.0]},
    "asynfl": {"server_lr": [1.0, 2.0, 5.0, 10.0]},
    "asynflc": {"server_lr": [1.0, 2.0, 5.0, 10.0]},
    "asynflc_ef": {"server_lr": [1.0, 2.0, 5.0, 10.0]},
    "asyncfeded": {"feded_lambda": [0.5, 1.0, 2.0, 5.0]},
    "area": {},
    "as_fedavg": {},
}
"""The swept hyper-parameter of each algorithm (none: the algorithm has no server hyper-parameter)."""


def sweep_config(algorithm: str, arrivals: int | None, seeds: Sequence[int]) -> Any:
    """The configuration of ``asyncfl run --algorithm ALGORITHM`` with the algorithm's grid swept (``arrivals``:
    ``None`` keeps the algorithm's usual number of uploads: 3,000, or 12,000 for AREA and AS-FedAvg; see
    :mod:`asyncfl_jax.algorithms.defaults`)."""
    from asyncfl_jax.config import ExperimentConfig, RunConfig

    run = RunConfig(algorithm=algorithm, hparams={name: list(values) for name, values in GRIDS[algorithm].items()},
                    arrivals=arrivals)
    return ExperimentConfig(runs=[run], seeds=list(seeds))


def sweep(algorithm: str, arrivals: int | None = None, seeds: Sequence[int] = (0, 1)) -> list[dict[str, Any]]:
    """Final test accuracy per grid point: mean over the seeds that did not diverge, and the diverged seeds."""
    from asyncfl_jax.config import validate
    from asyncfl_jax.experiment import run_config

    cfg = sweep_config(algorithm, arrivals, seeds)
    validate(cfg)
    (history,) = run_config(cfg, progress=False, write=False)
    names = list(GRIDS[algorithm])
    rows = []
    for point, stats in zip(history.points(), history.point_stats("test_accuracy")):  # seeds apart per point
        left_out = {seed for seed, _ in stats.diverged} | set(stats.non_finite)
        rows.append({
            "algorithm": algorithm,
            "hparams": {k: point.hparams[k] for k in names},
            "final_test_accuracy": stats.mean,
            "seeds": [seed for seed in point.seeds if seed not in left_out],
            "diverged_seeds": sorted(left_out),
        })
    return rows


def current_default(algorithm: str) -> dict[str, float]:
    """The algorithm's default values of its swept hyper-parameters."""
    from asyncfl_jax.algorithms import get_algorithm

    defaults = dict(get_algorithm(algorithm).hyperparams)
    return {name: float(defaults[name]) for name in GRIDS[algorithm]}


def choose(rows: list[dict[str, Any]], current: dict[str, float]) -> dict[str, Any]:
    """The chosen point (see the module docstring): the current default unless a clean point beats it by > 0.03."""
    clean = [r for r in rows if not r["diverged_seeds"] and r["final_test_accuracy"] is not None]
    if not clean:
        raise RuntimeError(f"every point of {rows[0]['algorithm']} diverged: widen the grid")
    best = max(clean, key=lambda r: r["final_test_accuracy"])
    for r in clean:
        if r["hparams"] == current and r["final_test_accuracy"] >= best["final_test_accuracy"] - 0.03:
            return r
    return best


def table(results: dict[str, list[dict[str, Any]]]) -> str:
    lines = ["| algorithm | point | final test accuracy (mean of seeds) | diverged seeds | chosen |",
             "| --- | --- | ---: | --- | :---: |"]  # "chosen": the rule of choose() against the current default
    for algorithm, rows in results.items():
        chosen = choose(rows, current_default(algorithm))
        for r in rows:
            point = ", ".join(f"{k}={v:g}" for k, v in r["hparams"].items()) or "(none)"
            acc = "-" if r["final_test_accuracy"] is None else f"{r['final_test_accuracy']:.4f}"
            lines.append(f"| {algorithm} | {point} | {acc} | {r['diverged_seeds'] or ''} | "
                         f"{'yes' if r is chosen else ''} |")
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--algorithms", nargs="+", default=list(GRIDS), choices=list(GRIDS))
    parser.add_argument("--arrivals", type=int, default=None,
                        help="client uploads per run (default: what asyncfl run --algorithm NAME uses)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--out", default="results/defaults")
    args = parser.parse_args(argv)
    results = {}
    for algorithm in args.algorithms:
        results[algorithm] = sweep(algorithm, args.arrivals, args.seeds)
        print(table({algorithm: results[algorithm]}), flush=True)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "results.json"), "w") as f:
        json.dump(results, f, indent=1)
    with open(os.path.join(args.out, "table.md"), "w") as f:
        f.write(table(results))
    print(table(results))
    return 0
