"""Do the bias-correcting methods do what their papers claim? A CPU-scale demonstration.

Setting: Fashion-MNIST, logistic regression, n = 100 clients with a Dirichlet(alpha = 0.1) label split, every client
always training (full concurrency), so fast clients report far more often than slow ones. Client speeds are
log-normal, ``speed_i = exp(N(0, sigma^2))``, with exponential job noise; ``sigma`` is the speed spread (0: every
client equally fast on average). Each method runs for the same number of client uploads (so the same virtual time,
the same client work: by default one minibatch gradient of 32 examples per upload, as in the ACE paper's comparison),
with its paper's protocol:

===========  ==========================================================================  ==========================
method       rule                                                                        protocol
===========  ==========================================================================  ==========================
FedBuff      x += eta mean of the M = 10 buffered deltas                                 all clients, M = 10
FedAsync     x <- (1 - a_t) x + a_t x_i on every arrival, a_t = alpha (tau + 1)^-0.5     all clients, M = 1
CA2FL        FedBuff step calibrated by the cache of every client's latest delta         all clients, M = 10
ACE          x -= eta (1/n) sum_i U_i on every arrival (latest gradient of every client)  all clients, M = 1
AREA         x = mean of every client's latest local model (client memory, 1/n)          all clients, Delta = 10
===========  ==========================================================================  ==========================

Every method gets a small learning-rate grid (a vmapped sweep; the best final accuracy, the mean of the last three
evaluations averaged over seeds, is reported), so a gap is not an artefact of one step size. Expected direction (ACE,
CA2FL and AREA papers): the cache/memory methods (ACE, CA2FL, AREA) end higher than FedBuff and FedAsync, and the gap
grows with the speed spread.

The command is ``scripts/demo_bias_correction.py`` (examples in its docstring, options in ``--help``).

It needs the Fashion-MNIST IDX files (Debian: ``apt-get install dataset-fashion-mnist``, or ``--data-dir``); with
``--dataset synthetic`` it runs on the embedded LEAF Synthetic(1, 1) data instead. It writes ``table.md``,
``results.json``, ``accuracy.png`` and, per setting, ``compare_alpha<a>_sigma<s>.png`` and ``.pdf`` (each method
against uploads, virtual time and local steps, with its band over the seeds: :mod:`asyncfl_jax.figures`) to
``--out``.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time
from typing import Any

import numpy as np

from asyncfl_jax import LocalConfig, Schedule, Task, get_algorithm, make_model, make_schedule, make_task, simulate
from asyncfl_jax.data import partition
from asyncfl_jax.reproduce.data import DataUnavailable, add_dataset_arguments, load_dataset
from asyncfl_jax.figures import draw_curves, save_figure_files, seed_curve
from asyncfl_jax.reproduce.report import pyplot, save_png, write_outputs
from asyncfl_jax.reproduce.settings import ReproductionSettings
from asyncfl_jax.timing import DelayModel

# name: (algorithm, options, protocol arguments, swept hyper-parameter, grid, fixed hyper-parameters)
METHODS = {
    "FedBuff": ("fedbuff", {}, {"protocol": "concurrent", "buffer_size": 10}, "server_lr", [1.0, 2.0, 4.0, 8.0], {}),
    "FedAsync": ("fedasync", {"staleness": "polynomial"}, {"protocol": "concurrent", "buffer_size": 1}, "alpha",
                 [0.2, 0.5, 0.9], {"staleness_a": 0.5}),
    "CA2FL": ("ca2fl", {}, {"protocol": "concurrent", "buffer_size": 10}, "server_lr", [1.0, 2.0, 4.0, 8.0], {}),
    "ACE": ("ace", {}, {"protocol": "all_active"}, "server_lr", [0.01, 0.02, 0.05, 0.1], {}),
    "AREA": ("area", {}, {"protocol": "concurrent", "buffer_size": 10}, "client_lr", [0.3, 1.0, 3.0], {}),
}
CORRECTING = ("CA2FL", "ACE", "AREA")
BASELINES = ("FedBuff", "FedAsync")


def build_parser() -> argparse.ArgumentParser:
    """The command line of ``scripts/demo_bias_correction.py``."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--clients", type=int, default=100)
    p.add_argument("--concurrency", type=int, default=None,
                   help="clients in flight for FedBuff, CA2FL, AREA and FedAsync (default: all clients; ACE always "
                        "has every client computing); e.g. 20 for the CA2FL paper's regime")
    p.add_argument("--uploads", type=int, default=4000, help="client uploads per run (all methods)")
    p.add_argument("--spreads", type=float, nargs="+", default=[0.0, 1.0, 2.0], help="log-normal speed sigmas")
    p.add_argument("--alpha", type=float, nargs="+", default=[0.1], help="Dirichlet concentration(s)")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    p.add_argument("--local-steps", type=int, default=1,
                   help="local SGD steps of the delta methods (1: every method does one gradient per upload, as in "
                        "the ACE paper's comparison; ACE always uploads one gradient)")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--client-lr", type=float, default=0.1, help="local SGD step size (except AREA's sweep)")
    p.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS))
    add_dataset_arguments(p)
    p.add_argument("--quick", action="store_true", help="1500 uploads, one seed")
    p.add_argument("--out", default="results/demo_bias_correction")
    return p


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The arguments (``--quick``: 1500 uploads, one seed)."""
    args = build_parser().parse_args(argv)
    if args.quick:
        args.uploads, args.seeds = 1500, [0]
    return args


@dataclasses.dataclass(frozen=True)
class BiasCorrectionSettings(ReproductionSettings):
    """The settings of the bias-correction demonstration: the command line's options (``--quick``: 1500 uploads,
    one seed). Build it with :func:`parse_settings` (a command line) or :meth:`from_keywords` (the options as
    keywords).

    Attributes:
        clients: n, the number of clients.
        concurrency: the clients in flight of FedBuff, CA2FL, AREA and FedAsync (None: every client).
        uploads: the client uploads of every run (every method).
        spreads: the log-normal speed sigmas (the participation imbalance).
        alpha: the Dirichlet concentrations of the label split.
        seeds: the seeds.
        local_steps: the local SGD steps of the delta methods (ACE always uploads one gradient).
        batch_size: the clients' minibatch.
        client_lr: the local SGD step size (except AREA's sweep).
        methods: the methods run (``METHODS`` keys).
        dataset: ``fashion_mnist`` or ``synthetic``.
        data_dir: the IDX (or TFDS) data folder; None: the default places.
        quick: 1500 uploads, one seed.
        out: the output folder.
    """

    clients: int
    concurrency: int | None
    uploads: int
    spreads: list[float]
    alpha: list[float]
    seeds: list[int]
    local_steps: int
    batch_size: int
    client_lr: float
    methods: list[str]
    dataset: str
    data_dir: str | None
    quick: bool
    out: str

    @classmethod
    def from_keywords(cls, **options: Any) -> BiasCorrectionSettings:
        """The settings of the command line that gives ``options`` (``dest=value`` as the flags take them, e.g.
        ``quick=True, spreads=[0.0, 1.5]``): the same defaults as :func:`parse_args`; a refused value raises
        :class:`~asyncfl_jax.reproduce.settings.SettingsError` with the command line's message."""
        return cls._from_keywords(build_parser(), parse_args, options)


def parse_settings(argv: list[str] | None = None) -> BiasCorrectionSettings:
    """The settings of a command line (:func:`parse_args`; a bad argument exits with a usage error)."""
    return BiasCorrectionSettings.from_args(parse_args(argv))


def schedules_for(method: str, n: int, uploads: int, sigma: float, seeds: list[int],
                  concurrency: int | None = None) -> list[Schedule]:
    """One schedule per seed of a method's protocol with ``uploads`` uploads (log-normal speeds of spread ``sigma``,
    exponential job noise; every client training unless ``concurrency`` says otherwise)."""
    protocol = dict(METHODS[method][2])
    name = protocol.pop("protocol")
    delays = DelayModel(speed="lognormal", speed_mean=0.0, speed_sigma=sigma, noise="exponential", noise_scale=1.0)
    if name == "concurrent":
        protocol.update(concurrency=concurrency or n, refill="immediate")
        steps = uploads // protocol["buffer_size"]
    else:
        steps = uploads
    return [make_schedule(name, n, steps, delays, seed, **protocol) for seed in seeds]


def main(argv: list[str] | None = None) -> int:
    """The command: every method at every (alpha, sigma), then ``table.md``, ``results.json`` and ``accuracy.png`` in
    ``--out``; 2 when the dataset is not available."""
    setup = parse_settings(argv)
    try:
        dataset = load_dataset(setup.dataset, setup.data_dir, setup.data_dir, synthetic_clients=setup.clients)
    except DataUnavailable as e:
        print(f"error: {e}\n(--dataset synthetic needs no files)", file=sys.stderr)
        return 2
    os.makedirs(setup.out, exist_ok=True)
    model = make_model("logreg", dataset.input_shape, dataset.num_classes, seed=0)
    results = []
    curves = {}
    started = time.perf_counter()
    for alpha in setup.alpha:
        parts = partition("dirichlet", dataset.train_y, setup.clients, seed=0, alpha=alpha)
        task = make_task(dataset, parts, model)
        for sigma in setup.spreads:
            for method in setup.methods:
                row, curves[(alpha, sigma, method)] = run_method(task, method, alpha, sigma, setup)
                results.append(row)
    table = format_table(results, setup)
    print(table)
    write_outputs(setup.out, table, {"args": vars(setup), "results": results,
                                    "seconds": round(time.perf_counter() - started, 1)}, indent=2)
    plot(curves, setup, os.path.join(setup.out, "accuracy.png"))
    plot_comparisons(curves, setup)
    return 0


def run_method(task: Task, method: str, alpha: float, sigma: float,
               setup: BiasCorrectionSettings) -> tuple[dict[str, Any], tuple[np.ndarray, np.ndarray]]:
    """One program: a method over its grid and the seeds. Its row (at the best grid value: the highest final
    accuracy, the mean of the last three evaluations over seeds) and its mean curve (time, accuracy) there."""
    algorithm_name, options, _, swept, grid, fixed = METHODS[method]
    schedules = schedules_for(method, setup.clients, setup.uploads, sigma, setup.seeds, setup.concurrency)
    history = simulate(task, get_algorithm(algorithm_name, **options), schedules,
                       local=LocalConfig(steps=setup.local_steps, batch_size=setup.batch_size), seeds=setup.seeds,
                       hparams={"client_lr": setup.client_lr, **fixed, swept: grid},
                       eval_every=max(1, schedules[0].num_steps // 20), progress=False,
                       label=f"{method} alpha={alpha:g} sigma={sigma:g}")
    # The mean of the last three evaluations (the last ~10% of the run): less noisy than the last one.
    tail = history.metrics["test_accuracy"][:, -3:].mean(axis=1)
    final = tail.reshape(len(setup.seeds), len(grid)).mean(axis=0)
    best = int(np.nanargmax(np.where(np.isfinite(final), final, -1.0)))
    stats = history.schedule_stats[0]
    row = {
        "method": method, "dirichlet_alpha": alpha, "sigma": sigma, "swept": swept,
        "best_value": grid[best],
        "final_accuracy": float(final[best]), "grid_accuracy": [float(v) for v in final],
        "virtual_time": float(history.times[0, -1]), "uploads": int(history.uploads[0, -1]),
        "participation_cv": participation_cv(stats["participation"]),
        "seconds": round(history.compile_seconds + history.run_seconds, 1),
    }
    replicas = [r * len(grid) + best for r in range(len(setup.seeds))]
    print(f"alpha={alpha:<4g} sigma={sigma:<4g} {method:<9} acc={row['final_accuracy']:.4f} "
          f"({swept}={grid[best]:g}; grid {np.round(final, 4).tolist()})  {row['seconds']}s",
          file=sys.stderr, flush=True)
    runs = [{"uploads": history.uploads[r], "times": history.times[r], "local_steps": history.local_steps[r],
             "accuracy": history.metrics["test_accuracy"][r]} for r in replicas]
    return row, seed_curve(method, runs, axes={"uploads": "uploads", "time": "times", "local_steps": "local_steps"})


def participation_cv(counts: list[int] | np.ndarray) -> float:
    """Coefficient of variation of the per-client upload counts (0: every client reports equally often)."""
    counts = np.asarray(counts, dtype=np.float64)
    return float(counts.std() / max(counts.mean(), 1e-12))


def format_table(results: list[dict], setup: BiasCorrectionSettings) -> str:
    """Final test accuracy per method (rows) and (alpha, sigma) setting (columns), and the correction gap."""
    settings = sorted({(r["dirichlet_alpha"], r["sigma"]) for r in results})
    acc = {(r["method"], r["dirichlet_alpha"], r["sigma"]): r["final_accuracy"] for r in results}
    head = "| method | " + " | ".join(f"Dir {a:g}, sigma {s:g}" for a, s in settings) + " |"
    lines = [f"Final test accuracy (mean of the last 3 evaluations and over seeds {setup.seeds}; best of each method's "
             "grid), "
             f"{setup.clients} clients, {setup.uploads} uploads each.", "", head,
             "|" + "---|" * (len(settings) + 1)]
    for method in setup.methods:
        cells = [f"{acc[(method, a, s)]:.4f}" if (method, a, s) in acc else "-" for a, s in settings]
        lines.append(f"| {method} | " + " | ".join(cells) + " |")
    if any(m in setup.methods for m in CORRECTING) and any(m in setup.methods for m in BASELINES):
        gaps = []
        for a, s in settings:
            best_fix = max(acc.get((m, a, s), -1) for m in CORRECTING)
            best_base = max(acc.get((m, a, s), -1) for m in BASELINES)
            gaps.append(f"{best_fix - best_base:+.4f}")
        lines.append("| gap (best of ACE/CA2FL/AREA - best of FedBuff/FedAsync) | " + " | ".join(gaps) + " |")
    cv = {(r["dirichlet_alpha"], r["sigma"]): r["participation_cv"] for r in results if r["method"] == "FedBuff"}
    if cv:
        lines.append("| participation CV (FedBuff schedule) | " + " | ".join(
            f"{cv[k]:.2f}" if cv.get(k) is not None else "-" for k in settings) + " |")
    return "\n".join(lines) + "\n"


def plot_comparisons(curves: dict, setup: BiasCorrectionSettings) -> list[str]:
    """``compare_alpha<a>_sigma<s>.png`` and ``.pdf`` per setting: the methods (each at its best grid value) against
    uploads, virtual time and local steps trained, one line per method with its min-max band over the seeds
    (:func:`asyncfl_jax.figures.draw_curves`); returns the paths written."""
    written = []
    for a, s in sorted({(a, s) for a, s, _ in curves}):
        chosen = [curves[(a, s, m)] for m in setup.methods if (a, s, m) in curves]
        title = (f"{setup.dataset}, n={setup.clients}, dirichlet({a:g}), logreg; K={setup.local_steps} "
                 f"(delta methods), B={setup.batch_size}; delays: speed lognormal(sigma={s:g}) x exponential noise")
        fig = draw_curves(chosen, title=title)
        written += save_figure_files(fig, os.path.join(setup.out, f"compare_alpha{a:g}_sigma{s:g}"))
    return written


def plot(curves: dict, setup: BiasCorrectionSettings, path: str) -> None:
    """``accuracy.png``: the mean test accuracy against virtual time, one panel per (alpha, sigma)."""
    plt = pyplot()
    settings = sorted({(a, s) for a, s, _ in curves})
    fig, axes = plt.subplots(1, len(settings), figsize=(4.2 * len(settings), 3.4), squeeze=False, sharey=True)
    for ax, (a, s) in zip(axes[0], settings):
        for method in setup.methods:
            if (a, s, method) in curves:
                curve = curves[(a, s, method)]
                ax.plot(curve["time"], curve["mean"], label=method, linestyle="-" if method in CORRECTING else "--")
        ax.set_title(f"Dir({a:g}), speed sigma {s:g}")
        ax.set_xlabel("virtual time")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("test accuracy")
    axes[0][-1].legend(fontsize=8)
    fig.tight_layout()
    save_png(fig, os.path.dirname(path), os.path.basename(path))
