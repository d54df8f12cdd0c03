"""How many uploaded bits does each method need to reach a target accuracy? A CPU-scale demonstration of AsynFLC-EF.

Setting (the AsynFLC-EF paper's protocol, scaled down): Fashion-MNIST, logistic regression, n = 50 clients with a
Dirichlet(alpha = 0.4) label split. Job durations follow the digest's normal model: client i's mean duration
``mu_i ~ N(1, 0.3^2)`` (at least 0.1), each job ``mu_i * LogNormal(0, 0.1^2)`` (about 10% jitter). A job is K = 10
local SGD steps (batch 32, step size 0.05) from the model the client last received. Each method runs for the same
number of client uploads (2,000) and is scored, as in the paper's Table III, by the cumulative upload volume (bits)
at which its test accuracy first reaches the target (75%, the paper's Fashion-MNIST target):

==================  =====================================================================  ===========================
method              rule                                                                   protocol
==================  =====================================================================  ===========================
AsynFL              x += (eta_g / n) sum_{S_t} Delta_i, 32 d bits per upload                all clients, window W
FedBuff             x += eta_g mean of M = 10 buffered deltas, weights 1/sqrt(1 + tau)     all clients, M = 10
AsynFLC top-k       AsynFL with uploads Top_k(Delta_i), k = 3% of d, no error feedback      all clients, window W
AsynFLC-EF top-k    uploads Top_k(Delta_i + e_i), e_i <- Delta_i + e_i - message           all clients, window W
AsynFLC-EF top-k+Q  as above with Q_4bit(Top_k(.)), max-abs stochastic quantizer (s = 7)   all clients, window W
==================  =====================================================================  ===========================

The window server is ``all_active`` with ``aggregation="periodic"`` and ``period`` W = 0.5 (so about half of the
clients report per window, as at the paper's W = 500 s for durations near 500 s); FedBuff sees the same client
durations. Bits are the paper's cost model (payload: 32 d for float32, 32 k for top-k, 4 k + 32 for top-k+Q4b, the
32 being the quantizer's one float scale, which the paper leaves out) and, beside it, the payload plus the
``k ceil(log2 d)`` index bits a sparse message also has to send.

Every method gets a small server learning-rate grid (a vmapped sweep); the reported value is the one with the best
final accuracy (the mean of the last three evaluations, averaged over seeds; a value that diverged on some seed ranks
last), and the table also gives the fewest bits to the target over the whole grid and every grid value. A method
reaches the target on a seed at the first evaluation (about 40 per run) whose test accuracy is at least the target
(``History.to_reach``); its bits to target is the mean over seeds, reported only when every seed reached it.
Expected direction (AsynFLC-EF paper, Table III and Figs. 1 and 5): the error-feedback variants reach the target
with far fewer bits than AsynFL and FedBuff (the paper's Fashion-MNIST row: 24x for top3, 480x for its 2-bit top3)
in about as many uploads as AsynFL; top-k without error feedback is unstable or needs several times more uploads, the
more so the more non-IID the data.

The command is ``scripts/demo_compression.py`` (examples in its docstring, options in ``--help``).

Most of the quick run is compiling (about 10 s per method on 2 CPU cores).

It needs the Fashion-MNIST IDX files (Debian: ``apt-get install dataset-fashion-mnist``, or ``--data-dir``); with
``--dataset synthetic`` it runs on the embedded LEAF Synthetic(1, 1) data instead. It writes ``table.md``,
``results.json`` and ``accuracy_vs_bits.png`` to ``--out``.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import sys
import time
from typing import Any

import numpy as np

from asyncfl_jax import (Algorithm, History, LocalConfig, Schedule, get_algorithm, make_model, make_schedule,
                         make_task, simulate)
from asyncfl_jax.data import partition
from asyncfl_jax.reproduce.curves import best_on_grid, fewest_on_grid, mean_if_all
from asyncfl_jax.reproduce.data import DataUnavailable, add_dataset_arguments, load_dataset
from asyncfl_jax.reproduce.report import fmt_bits, pyplot, save_png, write_outputs, yes_no
from asyncfl_jax.reproduce.settings import ReproductionSettings
from asyncfl_jax.timing import DelayModel, pad_to_common_widths

# name: (algorithm, options, protocol, swept hyper-parameter, grid). The compressors' "fraction" and "quant_bits" are
# filled in from the command line.
METHODS = {
    "AsynFL": ("asynfl", {}, "window", "server_lr", [0.5, 1.0, 2.0, 4.0]),
    "FedBuff": ("fedbuff", {"staleness": "inverse_sqrt"}, "buffer", "server_lr", [0.25, 0.5, 1.0, 2.0]),
    "AsynFLC top-k": ("asynflc", {"compressor": "top_k"}, "window", "server_lr", [0.5, 1.0, 2.0, 4.0]),
    "AsynFLC-EF top-k": ("asynflc_ef", {"compressor": "top_k"}, "window", "server_lr", [0.5, 1.0, 2.0, 4.0]),
    "AsynFLC-EF top-k+Q": ("asynflc_ef", {"compressor": "top_k_qsgd"}, "window", "server_lr", [0.5, 1.0, 2.0, 4.0]),
}
UNCOMPRESSED = ("AsynFL", "FedBuff")
ERROR_FEEDBACK = ("AsynFLC-EF top-k", "AsynFLC-EF top-k+Q")
EVALUATIONS = 40  # evaluations per run: the resolution of "bits to target" is about 1/40 of the run
DEFAULT_TARGETS = {"fashion_mnist": 0.75, "synthetic": 0.6}  # FMNIST: the paper's Table III target (75%)


def build_parser() -> argparse.ArgumentParser:
    """The command line of ``scripts/demo_compression.py``."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--clients", type=int, default=50)
    p.add_argument("--uploads", type=int, default=None, help="client uploads per run, all methods (default 2000)")
    p.add_argument("--dirichlet-alpha", type=float, default=0.4, help="label-split concentration (paper: 0.4)")
    p.add_argument("--seeds", type=int, nargs="+", default=None, help="training and timing seeds (default: 0 1)")
    p.add_argument("--target", type=float, default=None,
                   help="test accuracy to reach (default: 0.75 on Fashion-MNIST, the paper's target, 0.6 on synthetic)")
    p.add_argument("--model", choices=["logreg", "mlp"], default="logreg", help="mlp: one hidden layer of 64 units")
    p.add_argument("--local-steps", type=int, default=10, help="K, local SGD steps per upload")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--client-lr", type=float, default=0.05, help="local SGD step size (eta)")
    p.add_argument("--period", type=float, default=0.5,
                   help="the window W of the AsynFL servers, in units of the mean job duration")
    p.add_argument("--buffer-size", type=int, default=10, help="FedBuff's M")
    p.add_argument("--fraction", type=float, default=0.03, help="top-k keeps this fraction of d (paper: top3)")
    p.add_argument("--quant-bits", type=int, default=4, help="bits per value of the top-k+Q quantizer (paper: Q4b)")
    p.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS))
    add_dataset_arguments(p)
    p.add_argument("--quick", action="store_true", help="1000 uploads, one seed, three grid values (unless given)")
    p.add_argument("--out", default="results/demo_compression")
    return p


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The arguments with the defaults of ``--quick`` and of the dataset's target filled in."""
    args = build_parser().parse_args(argv)
    quick = args.quick
    args.uploads = args.uploads or (1000 if quick else 2000)
    args.seeds = args.seeds or ([0] if quick else [0, 1])
    if args.target is None:
        args.target = DEFAULT_TARGETS[args.dataset]
    return args


@dataclasses.dataclass(frozen=True)
class CompressionSettings(ReproductionSettings):
    """The settings of the compression demonstration: the command line's options after :func:`parse_args` filled in
    the defaults of ``--quick`` and the dataset's target. Build it with :func:`parse_settings` (a command line) or
    :meth:`from_keywords` (the options as keywords).

    Attributes:
        clients: n, the number of clients.
        uploads: the client uploads of every run (every method).
        dirichlet_alpha: the concentration of the Dirichlet label split.
        seeds: the training and timing seeds.
        target: the test accuracy whose bits to reach are counted.
        model: ``logreg`` or ``mlp`` (one hidden layer of 64 units).
        local_steps: K, the local SGD steps per upload.
        batch_size: the clients' minibatch.
        client_lr: the local SGD step size.
        period: the window W of the AsynFL servers, in units of the mean job duration.
        buffer_size: FedBuff's M.
        fraction: the fraction of d top-k keeps.
        quant_bits: the bits per value of the top-k+Q quantizer.
        methods: the methods run (``METHODS`` keys).
        dataset: ``fashion_mnist`` or ``synthetic``.
        data_dir: the IDX (or TFDS) data folder; None: the default places.
        quick: 1000 uploads, one seed, the grids without their smallest value.
        out: the output folder.
    """

    clients: int
    uploads: int
    dirichlet_alpha: float
    seeds: list[int]
    target: float
    model: str
    local_steps: int
    batch_size: int
    client_lr: float
    period: float
    buffer_size: int
    fraction: float
    quant_bits: int
    methods: list[str]
    dataset: str
    data_dir: str | None
    quick: bool
    out: str

    @classmethod
    def from_keywords(cls, **options: Any) -> CompressionSettings:
        """The settings of the command line that gives ``options`` (``dest=value`` as the flags take them, e.g.
        ``quick=True, methods=["AsynFL", "FedBuff"]``): the same defaults and filling as :func:`parse_args`; a
        refused value raises :class:`~asyncfl_jax.reproduce.settings.SettingsError` with the command line's
        message."""
        return cls._from_keywords(build_parser(), parse_args, options)


def parse_settings(argv: list[str] | None = None) -> CompressionSettings:
    """The settings of a command line (:func:`parse_args`; a bad argument exits with a usage error)."""
    return CompressionSettings.from_args(parse_args(argv))


def grid_of(method: str, quick: bool) -> list[float]:
    """The server learning rates swept for a method (``quick``: all but the smallest)."""
    grid = METHODS[method][4]
    return grid[1:] if quick else grid


def algorithm_of(method: str, fraction: float, quant_bits: int) -> Algorithm:
    """The algorithm of a method, with ``fraction`` (``--fraction``) and ``quant_bits`` (``--quant-bits``) for its
    compressor."""
    name, options, *_ = METHODS[method]
    options = dict(options)
    if "compressor" in options:
        options["fraction"] = fraction
        if options["compressor"] == "top_k_qsgd":
            options["quant_bits"] = quant_bits
    return get_algorithm(name, **options)


def delay_model() -> DelayModel:
    """The digest's normal durations (scaled so that the mean is 1): ``mu_i ~ N(1, 0.3^2)``, 10% jitter per job."""
    return DelayModel(speed="normal", speed_mean=1.0, speed_std=0.3, speed_min=0.1, noise="lognormal", noise_sigma=0.1)


def schedules_for(method: str, setup: CompressionSettings) -> tuple[list[Schedule], int]:
    """One schedule per seed with (at least) ``setup.uploads`` uploads, every seed with the same number of steps, and
    the evaluation interval (about 40 evaluations; the steps are a multiple of it, so one chunk size is compiled)."""
    n, delays = setup.clients, delay_model()
    if METHODS[method][2] == "buffer":
        needed = math.ceil(setup.uploads / setup.buffer_size)
        every = max(1, math.ceil(needed / EVALUATIONS))
        steps = math.ceil(needed / every) * every
        return [make_schedule("concurrent", n, steps, delays, seed, concurrency=n, buffer_size=setup.buffer_size,
                              refill="immediate") for seed in setup.seeds], every
    # A window holds a random number of arrivals (about n W / mean duration): build a long schedule per seed and cut
    # every seed's at the step where the slowest seed reaches the upload budget (a shorter schedule is a prefix).
    guess = math.ceil(2 * setup.uploads / max(1.0, n * setup.period)) + 2 * EVALUATIONS
    long = [make_schedule("all_active", n, guess, delays, seed, aggregation="periodic", period=setup.period)
            for seed in setup.seeds]
    needed = max(int(np.searchsorted(np.cumsum(s.uploads_per_step), setup.uploads)) + 1 for s in long)
    every = max(1, math.ceil(needed / EVALUATIONS))
    steps = math.ceil(needed / every) * every
    if steps > guess:
        raise RuntimeError(f"the window schedules have fewer than {setup.uploads} uploads in {guess} steps")
    return pad_to_common_widths([s.truncate(steps) for s in long]), every  # the seeds run as one program


def summarise(method: str, history: History, grid: list[float],
              setup: CompressionSettings) -> tuple[dict[str, Any], list[int]]:
    """The row of ``method`` at its best grid value (highest final accuracy; a value that diverged on some seed ranks
    last) and the replicas of that value."""
    S, G = len(setup.seeds), len(grid)

    def per_value(a):  # [R] in replica order (seed-major, then grid) -> [S, G]
        return np.asarray(a, dtype=np.float64).reshape(S, G)

    bits = per_value(history.to_reach(setup.target, by="upload_bits"))
    bits_index = per_value(history.to_reach(setup.target, by="upload_bits_with_index"))
    uploads = per_value(history.to_reach(setup.target, by="uploads"))
    diverged = per_value(history.diverged_at >= 0).astype(bool)
    # The mean of the last three evaluations (the last ~7% of the run): less noisy than the last one.
    best, final = best_on_grid(per_value(np.nanmean(history.metrics["test_accuracy"][:, -3:], axis=1)), diverged)
    reached = np.isfinite(bits).sum(axis=0)
    # The paper's optimistic reading: the fewest bits over the grid (values that reach the target on every seed).
    fewest = fewest_on_grid(bits, diverged)

    row = {
        "method": method, "algorithm": history.algorithm, "algorithm_options": history.algorithm_options,
        "swept": METHODS[method][3], "best_value": grid[best],
        "final_accuracy": float(final[best]),
        "bits_to_target": mean_if_all(bits[:, best]),
        "bits_to_target_with_index": mean_if_all(bits_index[:, best]),
        "uploads_to_target": mean_if_all(uploads[:, best]),
        "bits_to_target_per_seed": [None if not np.isfinite(b) else float(b) for b in bits[:, best]],
        "seeds_reached": int(reached[best]), "diverged": bool(diverged[:, best].any()),
        "diverged_in_grid": int(diverged.sum()),
        "fewest_bits_value": None if fewest is None else grid[fewest],
        "fewest_bits_to_target": None if fewest is None else float(bits[:, fewest].mean()),
        "message_bits": history.message_bits,
        "grid": [{"value": v, "final_accuracy": float(final[g]), "seeds_reached": int(reached[g]),
                  "bits_to_target": mean_if_all(bits[:, g]),
                  "bits_to_target_with_index": mean_if_all(bits_index[:, g]),
                  "uploads_to_target": mean_if_all(uploads[:, g]), "diverged_seeds": int(diverged[:, g].sum())}
                 for g, v in enumerate(grid)],
        "uploads": int(history.uploads[0, -1]), "steps": int(history.num_steps),
        "seconds": round(history.compile_seconds + history.run_seconds, 1),
    }
    return row, [s * G + best for s in range(S)]


def main(argv: list[str] | None = None) -> int:
    """The command: every method over its grid, then ``table.md``, ``results.json`` and ``accuracy_vs_bits.png`` in
    ``--out``; 2 when the dataset is not available."""
    setup = parse_settings(argv)
    try:
        dataset = load_dataset(setup.dataset, setup.data_dir, setup.data_dir, synthetic_clients=setup.clients)
    except DataUnavailable as e:
        print(f"error: {e}\n(--dataset synthetic needs no files)", file=sys.stderr)
        return 2
    os.makedirs(setup.out, exist_ok=True)
    model = make_model(setup.model, dataset.input_shape, dataset.num_classes, seed=0, hidden=(64,))
    parts = partition("dirichlet", dataset.train_y, setup.clients, seed=0, alpha=setup.dirichlet_alpha)
    task = make_task(dataset, parts, model)
    local = LocalConfig(steps=setup.local_steps, batch_size=setup.batch_size)
    results, curves = [], {}
    started = time.perf_counter()
    for method in setup.methods:
        grid = grid_of(method, setup.quick)
        schedules, every = schedules_for(method, setup)
        algorithm = algorithm_of(method, setup.fraction, setup.quant_bits)
        history = simulate(task, algorithm, schedules, local=local, seeds=setup.seeds,
                           hparams={"client_lr": setup.client_lr, METHODS[method][3]: grid}, eval_every=every,
                           progress=False, label=method)
        row, replicas = summarise(method, history, grid, setup)
        results.append(row)
        curves[method] = (history.upload_bits[replicas].mean(axis=0),
                          history.upload_bits_with_index[replicas].mean(axis=0),
                          history.metrics["test_accuracy"][replicas].mean(axis=0))
        print(f"{method:<19} acc={row['final_accuracy']:.4f} bits to target={fmt_bits(row['bits_to_target'])} "
              f"(server_lr={row['best_value']:g}; grid acc {[round(g['final_accuracy'], 4) for g in row['grid']]}, "
              f"reached {[g['seeds_reached'] for g in row['grid']]})  {row['seconds']}s", file=sys.stderr, flush=True)
    table = format_table(results, setup)
    print(table)
    write_outputs(setup.out, table, {"args": vars(setup), "d": int(task.num_params), "results": results,
                                    "seconds": round(time.perf_counter() - started, 1)}, indent=2)
    plot(curves, setup, os.path.join(setup.out, "accuracy_vs_bits.png"))
    return 0


def format_table(results: list[dict], setup: CompressionSettings) -> str:
    """One row per method: final accuracy, bits to the target (payload; with indices), uploads, divergence; then
    every grid value."""
    S = len(setup.seeds)
    reference = next((r["bits_to_target"] for r in results if r["method"] == "AsynFL"), None)

    def cost(value, reached):
        return fmt_bits(value) if reached == S else f"not reached ({reached}/{S} seeds)"

    lines = [f"Upload volume to reach {setup.target:.0%} test accuracy: {setup.dataset}, {setup.model}, "
             f"{setup.clients} clients, Dirichlet({setup.dirichlet_alpha:g}), {setup.uploads} uploads per run, "
             f"mean over seeds {setup.seeds}; each method at the server_lr of its grid with the best final accuracy "
             "(mean of the last 3 evaluations). Bits: payload only (the paper's Table III), and payload + index.", "",
             "| method | server_lr | final acc. | bits to target | x fewer than AsynFL | bits with index | "
             "uploads to target | fewest bits on the grid (server_lr) | diverged |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        reached = r["seeds_reached"]
        ratio = f"{reference / r['bits_to_target']:.1f}" if reference and r["bits_to_target"] else "-"
        fewest = ("-" if r["fewest_bits_value"] is None else
                  f"{fmt_bits(r['fewest_bits_to_target'])} ({r['fewest_bits_value']:g})")
        diverged = yes_no(r["diverged"])
        if r["diverged_in_grid"]:
            diverged += f" ({r['diverged_in_grid']} of {len(r['grid']) * S} grid runs did)"
        lines.append(f"| {r['method']} | {r['best_value']:g} | {r['final_accuracy']:.4f} | "
                     f"{cost(r['bits_to_target'], reached)} | {ratio} | "
                     f"{cost(r['bits_to_target_with_index'], reached)} | {cost(r['uploads_to_target'], reached)} | "
                     f"{fewest} | {diverged} |")
    values = sorted({g["value"] for r in results for g in r["grid"]})
    lines += ["", "Every grid value: final accuracy / bits to target (payload; '-': not reached on every seed; "
              "'div': diverged on some seed).", "",
              "| method | " + " | ".join(f"server_lr {v:g}" for v in values) + " |", "|---" * (len(values) + 1) + "|"]
    for r in results:
        cells = {g["value"]: f"{g['final_accuracy']:.4f} / {fmt_bits(g['bits_to_target'])}"
                 f"{' div' if g['diverged_seeds'] else ''}" for g in r["grid"]}
        lines.append(f"| {r['method']} | " + " | ".join(cells.get(v, "") for v in values) + " |")
    return "\n".join(lines) + "\n"


def plot(curves: dict, setup: CompressionSettings, path: str) -> None:
    """``accuracy_vs_bits.png``: the mean test accuracy against the cumulative upload bits (payload; with indices)."""
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8), sharey=True)
    for method, (bits, bits_index, acc) in curves.items():
        style = "-" if method in ERROR_FEEDBACK else (":" if method in UNCOMPRESSED else "--")
        for ax, x in zip(axes, (bits, bits_index)):
            keep = x > 0  # the initial model (0 bits) has no place on a log axis
            ax.plot(x[keep], acc[keep], label=method, linestyle=style)
    for ax, what in zip(axes, ("payload", "payload + index")):
        ax.axhline(setup.target, color="grey", linewidth=0.8)
        ax.set_xscale("log")
        ax.set_xlabel(f"cumulative upload bits ({what})")
        ax.grid(alpha=0.3, which="both")
    axes[0].set_ylabel("test accuracy")
    axes[0].set_title(f"{setup.dataset}, {setup.model}, Dir({setup.dirichlet_alpha:g}), target {setup.target:g}",
                      fontsize=9)
    axes[1].legend(fontsize=8)
    fig.tight_layout()
    save_png(fig, os.path.dirname(path), os.path.basename(path))
