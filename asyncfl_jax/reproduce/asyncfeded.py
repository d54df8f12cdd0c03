"""The AsyncFedED paper's experiment (Wang et al. 2022; digest 001), on the in-scan event clock.

Two tasks. ``--task synthetic`` (the ``--scale paper`` default) is the paper's Synthetic(1, 1) experiment, described
below. ``--task fashion_mnist`` (the ``--scale cpu`` default) keeps that experiment's clock, suspensions, methods and
paper hyper-parameters on an image task with the paper's MLP shape: Fashion-MNIST over 10 clients with a
Dirichlet(0.3) label split, the MLP 784-200-200-10, each method at the client learning rate (and AsyncFedED at the
lambda) a small sweep chose (``--sweep``), budget 60 time units, P in {0.1, 0.5, 0.9}, 5 seeds, the constant-K
ablation K in {5, 10, 20} at P = 0.1; its ``table.md`` ends with verdict tables
(:mod:`asyncfl_jax.reproduce.verdicts`) at equal uploads, virtual time and local steps, and it draws
``claims_p<P>.png`` and ``claims_ablation.png`` (see the section "cpu: Fashion-MNIST" below and
docs/reproduce_asyncfeded.md).

Task: LEAF's Synthetic(1, 1) with 10 clients (``synthetic_leaf(num_clients=10, alpha=1, beta=1)``, its natural
one-client-per-generator partition, 10% of each client held out for the pooled test set) and the paper's MLP
60-200-200-10. Every method runs its paper preset (``asyncfl_jax.presets``, ``asyncfeded/synthetic/<method>``): SGD
with momentum 0.5, K = 10 local steps of batch 10, local learning rate 0.01, and

=================  ===========================================================  =====================================
method             rule (preset hyper-parameters)                               protocol
=================  ===========================================================  =====================================
AsyncFedED         x += lambda / (gamma + eps) Delta_i, K_i adapted towards     ``EventClock``: every client always
                   gamma_bar (lambda 5, eps 5, gamma_bar 3, kappa 1, K <= 50)   training, one arrival per server step,
FedAsync+Constant  x = (1 - alpha) x + alpha x_i (alpha 0.1)                    a job of K steps takes K/10 times the
FedAsync+Hinge     alpha_t = alpha s(tau), hinge a = 5, b = 5 (alpha 0.1)       compute time of a job of 10
FedAvg             mean of the 10 local models                                  ``synchronous`` rounds of all
FedProx            FedAvg with the proximal term mu = 0.1                       available clients
=================  ===========================================================  =====================================

Virtual time (digest section 4.2, mapped onto ``DelayModel``). Compute is homogeneous: a job of K = 10 steps takes
``comm_time + eps`` with ``eps = exp(N(0, 0.1^2))`` (``speed="constant"``, ``noise="lognormal"``, so one unit of
virtual time is the compute time of one 10-step job) and ``comm_time = 0.2`` (communication ~20% of compute). The
``DelayModel`` has no separate communication noise, so the small log-normal spread on the compute part stands for
the paper's random transmission coefficient. Suspensions: after each upload a client is suspended with probability P
for an exponential time of mean 1.2 (about one round; the digest's mild reading of the paper's "hang time"). The
synchronous methods use ``asyncfl_jax.timing.synchronous``: a round takes the clients available at its start (a
suspended client sits the round out) and lasts until its slowest participant reports; with
``--sync-suspensions wait`` the round instead waits for every client, a suspended one starting when it returns (the
digest's reading of the paper's FedAvg). Every method gets the same fixed budget of virtual time (the synchronous
ones enough rounds to cover it) and is compared on the time axis (``History.times``).

Reported per (method, P), as the paper's Fig. 3: the maximum test accuracy within the budget and the time to reach 90%
of that run's own maximum; also the time to reach a common absolute accuracy (``--target``), since the 90%-of-own-max
metric rewards a low plateau. Each metric is computed per seed and averaged (mean and std over seeds). Plus the
paper's Fig. 4 ablation: AsyncFedED with a constant K (``asyncfeded/synthetic/asyncfeded_constant_k``) against the
adaptive K, at P = 0.1. Expected direction (paper): AsyncFedED converges faster than every baseline for every P and
stays stable as P grows while FedAsync degrades at large P; adaptive K beats every constant K.

How the runs are batched. Seeds and suspension probabilities are one vmapped replica axis of explicit replicas
(``asyncfl_jax.reproduce.grid.run_grid``): replica (P_j, seed s) has the event clock (or schedule) of timing seed
``s`` with suspension probability P_j, the label (method, P, seed) and the training seed ``1000 j + s``, so every
method sees the same timing streams for the same (P, seed). Methods that differ only in a
hyper-parameter share one compiled program: FedAvg and FedProx (``prox_mu`` 0 and 0.1), and FedAsync+Constant and
+Hinge (Constant is run as the hinge rule with ``a = 0``, which is ``s(tau) = 1`` exactly). The event clock's run
length is a number of server steps, not a time: it is computed so that every replica covers the budget (exactly for
state-independent durations; for AsyncFedED, whose durations follow K, a run that falls short is run again longer).

Not reproduced: FEMNIST (CNN) and Shakespeare (LSTM): this project has no loader for LEAF's FEMNIST or Shakespeare
data and no LSTM model, so ``--task femnist`` / ``--task shakespeare`` stop with an error and ``--scale paper`` runs
Synthetic(1, 1) only; the paper's local learning-rate decay of 0.995 per round (constant here); wall-clock time (the
paper's time axis is real seconds of a 10-process emulation; here it is virtual time).

The command is ``scripts/reproduce_asyncfeded.py`` (examples in its docstring, options in ``--help``).

``--task synthetic`` at ``--scale cpu``: budget 40 time units (about 330 server updates at P = 0), P in {0, 0.5, 0.9}, seeds 0 and 1,
ablation K in {5, 10, 20} at P = 0.1. ``--scale paper``: P in {0, 0.1, ..., 0.9}, seeds 0-4, ablation K in
{5, 10, 15, 20}, budget 60 units: the paper's 300 s with the digest's calibration of the clock (section 4.2: a 300 s
budget yields a few hundred server updates), i.e. 5 s per unit, about 500 server updates at P = 0. Virtual time has
no natural unit in seconds; ``--budget`` sets another. The runs reach their plateaus within about 5 (AsyncFedED) to
30 units, so a much longer budget only flattens the max-accuracy metric. At ``--scale cpu`` about a third of the time
is compilation (5-15 s for each of the six programs) and a third the AsyncFedED run, whose jobs run as many local
steps as the largest K among its replicas and which needs the most server steps (its K falls to about 4 at P = 0).

It writes ``table.md``, ``results.json`` (per (method, P) means and stds, and every run's evaluations),
``accuracy.png`` (test accuracy against virtual time, mean over seeds, one panel per P), ``metrics_vs_p.png`` (the
Fig. 3 metrics and the time to the common target against P) and ``ablation.png`` (Fig. 4) to ``--out``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import sys
from typing import Any, Callable

import numpy as np

from asyncfl_jax import (Algorithm, EventClock, History, LocalConfig, ReplicaSpec, Schedule, Task, get_algorithm,
                         make_model, make_task)
from asyncfl_jax.data import partition, synthetic_leaf
from asyncfl_jax.presets import get_preset
from asyncfl_jax.reproduce.data import DataUnavailable, check_dataset, load_dataset
from asyncfl_jax.reproduce.curves import finite_mean_std, first_passage, mean_on_grid
from asyncfl_jax.reproduce.grid import command_main, replica_runs, run_grid, setting_seed
from asyncfl_jax.reproduce.report import (distinct_seeds_problem, label_axes, pyplot, round_up, save_png,
                                          write_atomic, write_outputs, yes_no)
from asyncfl_jax.reproduce.settings import ReproductionSettings
from asyncfl_jax.reproduce.verdicts import (Verdict, compare, plot_methods, value_at_budget, verdict_json,
                                            verdict_lines)
from asyncfl_jax.timing import DelayModel, all_active, build_past, steps_within, synchronous, wait_rounds

METHODS = ("AsyncFedED", "FedAsync+Constant", "FedAsync+Hinge", "FedAvg", "FedProx")
PRESETS = {"AsyncFedED": "asyncfeded", "FedAsync+Constant": "fedasync_constant", "FedAsync+Hinge": "fedasync_hinge",
           "FedAvg": "fedavg", "FedProx": "fedprox"}
BASELINES = METHODS[1:]
TASKS = ("fashion_mnist", "synthetic", "femnist", "shakespeare")
UNAVAILABLE = ("the paper's {task} task is not available in this project: it has no loader for LEAF's FEMNIST or "
               "Shakespeare data (and no LSTM for Shakespeare); only Synthetic(1, 1) can be reproduced "
               "(--task synthetic, which --scale paper runs at the paper's budget and 5 seeds)")
SCALES = {
    # budget (virtual time units), suspension probabilities, seeds, constant K of the ablation, evaluations
    "cpu": {"budget": 40.0, "probs": [0.0, 0.5, 0.9], "seeds": [0, 1], "ablation_k": [5, 10, 20], "evals": 60},
    "paper": {"budget": 60.0, "probs": [round(0.1 * i, 1) for i in range(10)], "seeds": [0, 1, 2, 3, 4],
              "ablation_k": [5, 10, 15, 20], "evals": 120},
}
QUICK = {"budget": 12.0, "probs": [0.0, 0.9], "seeds": [0], "ablation_k": [5], "evals": 24}
ADAPTIVE_MARGIN = 2.2  # AsyncFedED's first guess of its steps: this many times those of K = 10 jobs


def build_parser() -> argparse.ArgumentParser:
    """The command line of ``scripts/reproduce_asyncfeded.py``."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--scale", choices=list(SCALES), default="cpu",
                   help="cpu (default): Fashion-MNIST, budget 60, P in {0.1, 0.5, 0.9}, 5 seeds (with --task "
                        "synthetic: budget 40, P in {0, 0.5, 0.9}, 2 seeds); paper: Synthetic(1, 1), budget 60 (300 s "
                        "at 5 s per unit), P = 0, 0.1, ..., 0.9, 5 seeds")
    p.add_argument("--task", choices=TASKS, default=None,
                   help="fashion_mnist (the --scale cpu default: the MLP 784-200-200-10 on a Dirichlet split over 10 "
                        "clients, verdict tables) or synthetic (the paper's Synthetic(1, 1); the --scale paper "
                        "default); FEMNIST and Shakespeare are not in this project")
    add_cpu_arguments(p)
    p.add_argument("--quick", action="store_true",
                   help="a smoke-sized run: Fashion-MNIST budget 4, P in {0.1, 0.9}, two seeds, K = 5 (Synthetic: "
                        "budget 12, P in {0, 0.9}, one seed, K = 5)")
    p.add_argument("--budget", type=float, default=None, help="virtual-time budget (default: from --scale)")
    p.add_argument("--probs", type=float, nargs="+", default=None, help="suspension probabilities P")
    p.add_argument("--seeds", type=int, nargs="+", default=None)
    p.add_argument("--ablation-prob", type=float, default=0.1, help="P of the constant-K ablation (paper: 0.1)")
    p.add_argument("--ablation-k", type=int, nargs="*", default=None, help="constant K values of the ablation")
    p.add_argument("--target", type=float, default=0.85, help="common absolute test accuracy for the time-to-target")
    p.add_argument("--comm-time", type=float, default=0.2, help="communication time per job")
    p.add_argument("--noise-sigma", type=float, default=0.1, help="log-normal spread of the job times")
    p.add_argument("--suspension-mean", type=float, default=1.2, help="mean suspension length (about one round)")
    p.add_argument("--sync-suspensions", choices=["skip", "wait"], default="skip",
                   help="synchronous rounds under suspensions: skip (the package's synchronous: a suspended client "
                        "sits the round out) or wait (the round waits for it)")
    p.add_argument("--evals", type=int, default=None, help="evaluations per run within the budget (about)")
    p.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS))
    p.add_argument("--out", default="results/reproduce_asyncfeded")
    return p


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The arguments with the scale's defaults filled in and checked (a bad one exits with a usage error)."""
    p = build_parser()
    args = p.parse_args(argv)
    problem = cpu_argument_problem(args)
    if problem:
        p.error(problem)
    defaults = scale_defaults(args)
    for name in ("budget", "probs", "seeds", "ablation_k", "evals"):
        if getattr(args, name) is None:
            setattr(args, name, defaults[name])
    if not args.budget > 0:
        p.error(f"--budget must be > 0, got {args.budget}")
    if any(not 0 <= q <= 1 for q in [*args.probs, args.ablation_prob]):
        p.error("suspension probabilities must be in [0, 1]")
    if distinct_seeds_problem(args.seeds):
        p.error(distinct_seeds_problem(args.seeds))
    args.probs = sorted(set(args.probs))
    return args


@dataclasses.dataclass(frozen=True)
class AsyncfededSettings(ReproductionSettings):
    """The settings of one AsyncFedED reproduction: the command line's options after :func:`parse_args` filled in
    the defaults of ``--scale``, ``--quick``, ``--task`` and ``--sweep`` and checked them. Build it with
    :func:`parse_settings` (a command line) or :meth:`from_keywords` (the options as keywords); both check it alike.

    Attributes:
        scale: ``cpu`` (Fashion-MNIST by default) or ``paper`` (Synthetic(1, 1), the paper's budget and P grid).
        task: the task run: ``fashion_mnist`` or ``synthetic`` (``femnist`` / ``shakespeare`` are refused when the
            data are checked: not in this project).
        alpha: the Dirichlet concentration of Fashion-MNIST's label split; None for Synthetic(1, 1).
        data_dir: the folder of Fashion-MNIST's IDX files; None: the usual places.
        sweep: run the client learning-rate (and lambda) sweep and write ``sweep.md`` instead of the comparison.
        quick: a smoke-sized run (the ``QUICK`` / ``CPU_QUICK`` defaults).
        budget: the virtual-time budget every method gets.
        probs: the suspension probabilities P, ascending, without repeats.
        seeds: the timing seeds (distinct); replica (P_j, seed s) trains with seed ``setting_seed(j, s)``.
        ablation_prob: the P of the constant-K ablation (the sweep's P with ``--sweep``).
        ablation_k: the constant K values of the ablation (empty: no ablation).
        target: the common absolute test accuracy of the time-to-target metric.
        comm_time: the communication time of a job (one unit: the compute time of a 10-step job).
        noise_sigma: the log-normal spread of the job times.
        suspension_mean: the mean length of a suspension.
        sync_suspensions: the synchronous rounds under suspensions: ``skip`` (a suspended client sits the round
            out) or ``wait`` (the round waits for it).
        evals: the evaluations per run within the budget (about).
        methods: the methods compared (``METHODS`` names).
        out: the output folder.
        client_lrs: each method's client learning rate (Fashion-MNIST: ``CPU_LR``); None: the presets'.
        feded_lambda: AsyncFedED's lambda (Fashion-MNIST: ``CPU_LAMBDA``); None: the preset's (Synthetic) or the
            sweep's grid (``--sweep``).
    """

    scale: str
    task: str
    alpha: float | None
    data_dir: str | None
    sweep: bool
    quick: bool
    budget: float
    probs: list[float]
    seeds: list[int]
    ablation_prob: float
    ablation_k: list[int]
    target: float
    comm_time: float
    noise_sigma: float
    suspension_mean: float
    sync_suspensions: str
    evals: int
    methods: list[str]
    out: str
    client_lrs: dict[str, float] | None
    feded_lambda: float | None

    @classmethod
    def from_keywords(cls, **options: Any) -> AsyncfededSettings:
        """The settings of the command line that gives ``options`` (``dest=value`` as the flags take them, e.g.
        ``quick=True, task="synthetic", probs=[0.0, 0.9]``): the same defaults, filling and checks as
        :func:`parse_args`; a refused value raises :class:`~asyncfl_jax.reproduce.settings.SettingsError` with the
        command line's message."""
        return cls._from_keywords(build_parser(), parse_args, options)


def parse_settings(argv: list[str] | None = None) -> AsyncfededSettings:
    """The settings of a command line (:func:`parse_args`; a bad argument exits with a usage error)."""
    return AsyncfededSettings.from_args(parse_args(argv))


# ------------------------------------------------------------------------------------------------ virtual time
def delay_model(args: AsyncfededSettings, prob: float, k_scale: float = 1.0) -> DelayModel:
    """Homogeneous compute (speed ``k_scale``), log-normal job noise, a fixed communication time, suspensions."""
    return DelayModel(speed="constant", speed_value=k_scale, noise="lognormal", noise_sigma=args.noise_sigma,
                      comm_time=args.comm_time, suspension_prob=prob, suspension_mean=args.suspension_mean)


def async_steps(args: AsyncfededSettings, n: int, probs: list[float], seeds: list[int], k_scale: float = 1.0) -> int:
    """Server steps an all-active run of jobs ``k_scale`` times as long as a 10-step job needs to pass the budget on
    every (P, seed): the event clock's events are then those of ``all_active`` (exact, not an estimate)."""
    needed = 1
    for prob in probs:
        delays = delay_model(args, prob, k_scale)
        rate = n / (args.comm_time + k_scale + prob * args.suspension_mean)  # arrivals per unit of time, about
        for seed in seeds:
            schedule, _ = build_past(lambda steps: all_active(n, steps, delays, seed), args.budget,
                                     int(1.3 * args.budget * rate) + 20)
            needed = max(needed, steps_within(schedule, args.budget) + 1)
    return needed


def sync_schedules(args: AsyncfededSettings, n: int, probs: list[float], seeds: list[int]) -> list[Schedule]:
    """One synchronous schedule per (P, seed), all with the rounds that the slowest needs to pass the budget (so
    that they run as one vectorized program)."""
    def build(prob: float, seed: int, rounds: int) -> Schedule:
        delays = delay_model(args, prob)
        return wait_rounds(n, rounds, delays, seed) if args.sync_suspensions == "wait" else synchronous(
            n, rounds, delays, seed)

    rounds = int(args.budget / (args.comm_time + 1.0)) + 5
    while True:
        schedules = [build(prob, seed, rounds) for prob in probs for seed in seeds]
        if min(s.step_times[-1] for s in schedules) > args.budget:
            break
        rounds *= 2
    needed = max(steps_within(s, args.budget) + 1 for s in schedules)
    return [s.truncate(needed) for s in schedules]  # the engine pads them to common widths


# ------------------------------------------------------------------------------------------------ the runs
def local_config(preset: dict) -> tuple[LocalConfig, dict]:
    """A preset's local training and its local hyper-parameters (step size, momentum)."""
    loc = preset["local"]
    local = LocalConfig(steps=loc["steps"], batch_size=loc["batch_size"], use_momentum=loc["momentum"] > 0)
    return local, {"client_lr": loc["lr"], "momentum": loc["momentum"]}


def run_group(task: Task, name: str, preset: dict, options: dict, hparams: dict, variants: list[tuple[str, dict]],
              settings: list[tuple[float, int, int]], args: AsyncfededSettings, k_scale: float = 1.0) -> list[dict]:
    """Runs one compiled program: every (P, seed) setting x variant as a replica. ``variants`` are (label,
    hyper-parameter values) pairs; ``settings`` are (P, prob_index, seed), the replica's training seed
    ``setting_seed(prob_index, seed)``. Returns one record per replica with its evaluation times, accuracies and
    (AsyncFedED) mean local steps."""
    local, local_hp = local_config(preset)
    algorithm = get_algorithm(preset["algorithm"], **options)
    if preset["protocol"]["name"] == "synchronous":
        probs = sorted({q for q, _, _ in settings})
        timing_seeds = sorted({s for _, _, s in settings})
        by_setting = dict(zip([(q, s) for q in probs for s in timing_seeds],
                              sync_schedules(args, task.num_clients, probs, timing_seeds)))
        replicas = grid_replicas(settings, variants, {**local_hp, **hparams}, lambda q, s: by_setting[(q, s)])
        frame = run_grid(task, algorithm, replicas, local=local, name=name, eval_every=1, log_width=22)
    else:
        adaptive = preset["algorithm"] == "asyncfeded" and options.get("adaptive_steps", True)
        frame = run_over_budget(task, algorithm, name, settings, variants, {**local_hp, **hparams}, local, args,
                                k_scale, adaptive)
    extra = ("mean_k",) if "mean_k" in frame.columns else ()
    series = {"times": "time", "accuracy": "test_accuracy", "uploads": "uploads"}
    if "local_steps" in frame.columns:  # local steps trained for the uploads received: the equal-computation axis
        series["local_steps"] = "local_steps"
    runs = replica_runs(frame, ("method", "prob", "timing_seed", "seed", "diverged_at", *extra), series)
    return [{"method": r["method"], "prob": r["prob"], "seed": r["timing_seed"], "training_seed": r["seed"],
             "times": r["times"], "accuracy": r["accuracy"], "uploads": r["uploads"], "diverged_at": r["diverged_at"],
             **{k: r[k] for k in ("local_steps", *extra) if k in r}} for r in runs]


def grid_replicas(settings: list[tuple[float, int, int]], variants: list[tuple[str, dict]], hparams: dict,
                  timing: Callable[[float, int], Any]) -> list[ReplicaSpec]:
    """The replicas of one program: for each (P, prob_index, seed) setting, each variant; the schedule or event
    clock ``timing(P, seed)``, the training seed ``setting_seed(prob_index, seed)``, the label (method, P, seed)."""
    return [ReplicaSpec(timing(q, s), seed=setting_seed(j, s), hparams={**hparams, **values},
                        label={"method": label, "prob": q, "timing_seed": s})
            for q, j, s in settings for label, values in variants]


def run_over_budget(task: Task, algorithm: Algorithm, name: str, settings: list[tuple[float, int, int]],
                    variants: list[tuple[str, dict]], hparams: dict, local: LocalConfig, args: AsyncfededSettings,
                    k_scale: float, adaptive: bool) -> Any:
    """A program of the event clock (``settings``: (P, prob_index, seed)) whose every replica passes the budget:
    the steps that ``all_active`` needs (times ``ADAPTIVE_MARGIN`` for AsyncFedED's adaptive K), run again longer
    while a replica falls short. Returns the :func:`run_grid` frame, with AsyncFedED's ``mean_k`` per replica."""
    n = task.num_clients
    steps = async_steps(args, n, sorted({q for q, _, _ in settings}), sorted({s for _, _, s in settings}), k_scale)
    rate = n / (args.comm_time + k_scale)  # arrivals per unit of time at P = 0
    eval_every = max(1, int(round(args.budget / args.evals * rate)))
    if adaptive:
        steps = int(steps * ADAPTIVE_MARGIN)  # K moves the job lengths; re-run longer below if it falls short
    while True:
        steps = round_up(steps, eval_every)  # one chunk size: one compilation
        replicas = grid_replicas(settings, variants, hparams,
                                 lambda q, s: EventClock(n, steps, delay_model(args, q), s))
        frame = run_grid(task, algorithm, replicas, local=local, name=name, eval_every=eval_every, log_width=22,
                         per_replica=lambda history: {"mean_k": [mean_k(history, r, args.budget)
                                                                 for r in range(history.num_replicas)]})
        ends = frame.groupby("replica").time.last()
        every_diverged = bool((frame.groupby("replica").diverged_at.first() >= 0).all())
        if ends.min() > args.budget or every_diverged:
            return frame
        grow = max(1.3 * args.budget / max(float(ends.min()), 1e-9), 1.3)
        print(f"{name}: {steps} steps cover only {ends.min():.1f} < {args.budget:g} time units; running "
              f"{int(steps * grow)} steps", file=sys.stderr, flush=True)
        steps = int(steps * grow)


def mean_k(history: History, r: int, budget: float) -> float | None:
    """Replica ``r``'s mean local steps K over the updates it applied within the budget (None without updates)."""
    step_times = np.asarray(history.realized_schedules[r].step_times)
    within = history.job_steps[r][: int(np.searchsorted(step_times, budget, side="right"))]
    return float(within.mean()) if within.size else None


def make_synthetic_task() -> Task:
    """LEAF's Synthetic(1, 1) over 10 clients (seed 0, its natural one-client-per-generator partition) with the
    paper's MLP 60-200-200-10 (initial weights seed 0)."""
    dataset = synthetic_leaf(num_clients=10, alpha=1.0, beta=1.0, seed=0)
    model = make_model("mlp", dataset.input_shape, dataset.num_classes, seed=0, hidden=(200, 200))
    return make_task(dataset, dataset.natural_partition, model)


def run_all(args: AsyncfededSettings, task: Task) -> list[dict]:
    """Every program on ``task`` (:func:`load_task`): AsyncFedED (main grid and ablation P), the constant-K
    ablation, the two FedAsyncs together and FedAvg / FedProx together."""
    presets = {m: get_preset(f"asyncfeded/{preset_task(args)}/{PRESETS[m]}") for m in METHODS}
    lr = client_lr_of(args)
    probs = list(args.probs)
    main = [(q, j, s) for j, q in enumerate(probs) for s in args.seeds]
    ablation_index = probs.index(args.ablation_prob) if args.ablation_prob in probs else len(probs)
    ablation = [(args.ablation_prob, ablation_index, s) for s in args.seeds]
    records: list[dict] = []
    if "AsyncFedED" in args.methods or args.ablation_k:
        pre = presets["AsyncFedED"]
        settings = main if ablation_index < len(probs) else main + ablation
        if "AsyncFedED" not in args.methods:
            settings = ablation
        records += run_group(task, "AsyncFedED", pre, pre["options"], {**pre["hparams"], **lr("AsyncFedED")},
                             asyncfeded_variants(args), settings, args)
    for k in args.ablation_k:
        pre = get_preset(f"asyncfeded/{preset_task(args)}/asyncfeded_constant_k")
        options = {**pre["options"], "initial_steps": k, "max_steps": max(k, pre["options"].get("max_steps", 50))}
        records += run_group(task, f"AsyncFedED constant K={k}", pre, options,
                             {**pre["hparams"], **lr("AsyncFedED"), **feded_lambda_of(args)},
                             [(f"AsyncFedED K={k}", {})], ablation, args, k_scale=k / pre["local"]["steps"])
    fedasync = [m for m in ("FedAsync+Constant", "FedAsync+Hinge") if m in args.methods]
    if fedasync:
        const, hinge = presets["FedAsync+Constant"], presets["FedAsync+Hinge"]
        if const["hparams"]["alpha"] != hinge["hparams"]["alpha"]:
            raise SystemExit("the FedAsync presets have different alphas; they cannot share one program")
        a = {"FedAsync+Constant": 0.0, "FedAsync+Hinge": hinge["hparams"]["staleness_a"]}
        records += run_group(task, "FedAsync", hinge, hinge["options"],
                             {k: v for k, v in hinge["hparams"].items() if k != "staleness_a"},
                             [(m, {"staleness_a": a[m], **lr(m)}) for m in fedasync], main, args)
    sync = [m for m in ("FedAvg", "FedProx") if m in args.methods]
    if sync:
        mu = {"FedAvg": presets["FedAvg"]["hparams"].get("prox_mu", 0.0),
              "FedProx": presets["FedProx"]["hparams"]["prox_mu"]}
        records += run_group(task, "FedAvg/FedProx", presets["FedProx"], presets["FedProx"]["options"], {},
                             [(m, {"prox_mu": mu[m], **lr(m)}) for m in sync], main, args)
    return records


# ------------------------------------------------------------------------------------------------ metrics
def run_metrics(rec: dict, budget: float, target: float) -> dict:
    """The Fig. 3 metrics of one run, on its evaluations within the budget."""
    times, acc = np.asarray(rec["times"]), np.asarray(rec["accuracy"])
    keep = times <= budget
    times, acc, uploads = times[keep], acc[keep], np.asarray(rec["uploads"])[keep]
    best = float(np.nanmax(acc))
    t90 = float(times[np.argmax(acc >= 0.9 * best)])
    return {"max_accuracy": best, "time_to_90pct_max": t90, "time_to_target": first_passage(times, acc, target),
            "uploads_in_budget": int(uploads[-1])}


def summarize(records: list[dict], args: AsyncfededSettings) -> list[dict]:
    """Mean and std over seeds of every metric, per (method, P)."""
    groups: dict[tuple[str, float], list[dict]] = {}
    for rec in records:
        rec.update(run_metrics(rec, args.budget, args.target))
        groups.setdefault((rec["method"], rec["prob"]), []).append(rec)
    rows = []
    for (method, prob), recs in groups.items():
        row = {"method": method, "prob": prob, "seeds": [r["seed"] for r in recs]}
        for key in ("max_accuracy", "time_to_90pct_max", "time_to_target", "uploads_in_budget", "mean_k"):
            row[key], row[key + "_std"], count = finite_mean_std(r.get(key) for r in recs)
            if key == "time_to_target":
                row["target_reached"] = count
        rows.append(row)
    return rows


def cell(row: dict | None, key: str, digits: int, budget: float) -> str:
    """A metric as ``mean ± std`` (time to target: ``(k/n)`` when k of n seeds reached it, ``> budget`` if none)."""
    if row is None:
        return "-"
    if key == "time_to_target":
        n = len(row["seeds"])
        if row["target_reached"] == 0:
            return f"> {budget:g}"
        text = f"{row[key]:.{digits}f} ± {row[key + '_std']:.{digits}f}"
        return text if row["target_reached"] == n else f"{row[key]:.{digits}f} ({row['target_reached']}/{n})"
    if row.get(key) is None:
        return "-"
    return f"{row[key]:.{digits}f} ± {row[key + '_std']:.{digits}f}"


def time_key(row: dict | None, key: str) -> float:
    """A time metric for comparisons: not reached by every seed counts as never (inf)."""
    if row is None or row.get(key) is None:
        return math.inf
    if key == "time_to_target" and row["target_reached"] < len(row["seeds"]):
        return math.inf
    return row[key]


def direction_checks(rows: list[dict], args: AsyncfededSettings) -> list[str]:
    """The paper's claims, checked on the measured means (yes / no per claim)."""
    at = {(r["method"], r["prob"]): r for r in rows}
    base = [m for m in BASELINES if m in args.methods]
    out = []
    if "AsyncFedED" in args.methods and base:
        for key, label in (("time_to_target", f"reaches {args.target:g} first"),
                           ("time_to_90pct_max", "reaches 90% of its own max first")):
            wins = [p for p in args.probs
                    if all(time_key(at.get(("AsyncFedED", p)), key) < time_key(at.get((m, p)), key) for m in base)]
            out.append(f"AsyncFedED {label} at every P: {yes_no(len(wins) == len(args.probs))} "
                       f"(P where it does: {', '.join(f'{p:g}' for p in wins) or 'none'})")
        wins = [p for p in args.probs if all(at[("AsyncFedED", p)]["max_accuracy"] >= at[(m, p)]["max_accuracy"]
                                             for m in base if (m, p) in at)]
        out.append(f"AsyncFedED has the highest max accuracy at every P: "
                   f"{yes_no(len(wins) == len(args.probs))} "
                   f"(P where it does: {', '.join(f'{p:g}' for p in wins) or 'none'})")
        if len(args.probs) > 1:
            lo, hi = args.probs[0], args.probs[-1]
            changes = []
            for m in ["AsyncFedED", *base]:
                if (m, lo) in at and (m, hi) in at:
                    d_acc = at[(m, hi)]["max_accuracy"] - at[(m, lo)]["max_accuracy"]
                    t_lo, t_hi = time_key(at[(m, lo)], "time_to_target"), time_key(at[(m, hi)], "time_to_target")
                    changes.append(f"{m} {d_acc:+.3f} acc, time to target {t_lo:.3g} -> {t_hi:.3g}")
            out.append(f"From P = {lo:g} to P = {hi:g}: " + "; ".join(changes))
    ablation = [r for r in rows if r["method"].startswith("AsyncFedED K=")]
    adaptive = at.get(("AsyncFedED", args.ablation_prob))
    if ablation and adaptive is not None:
        beats = [r["method"] for r in ablation
                 if time_key(adaptive, "time_to_target") < time_key(r, "time_to_target")]
        out.append(f"Adaptive K reaches {args.target:g} before every constant K (P = {args.ablation_prob:g}): "
                   f"{yes_no(len(beats) == len(ablation))} (beats: {', '.join(beats) or 'none'})")
    return out


def format_table(rows: list[dict], args: AsyncfededSettings, test_examples: int) -> str:
    """``table.md`` (``test_examples``: the test set's size): the Fig. 3 metrics per method and P, AsyncFedED's
    mean K, the Fig. 4 ablation and the claims."""
    at = {(r["method"], r["prob"]): r for r in rows}
    methods = [m for m in METHODS if m in args.methods]
    probs = args.probs
    head = "| method | " + " | ".join(f"P = {p:g}" for p in probs) + " |"
    rule = "|" + "---|" * (len(probs) + 1)
    lines = [f"AsyncFedED reproduction: {task_title(args)}, budget {args.budget:g} units "
             f"of virtual time (one unit: the compute time of a 10-step job; communication {args.comm_time:g}; "
             f"suspension mean {args.suspension_mean:g}; synchronous rounds: {args.sync_suspensions}), "
             f"mean ± std over seeds {args.seeds}. The test set has {test_examples} examples (accuracy moves in "
             f"steps of {1 / test_examples:.4f}).", ""]
    sections = (("Max test accuracy within the budget", "max_accuracy", 4),
                ("Time to reach 90% of its own max accuracy", "time_to_90pct_max", 2),
                (f"Time to reach test accuracy {args.target:g} (k/n: reached by k of n seeds, mean over those)",
                 "time_to_target", 2),
                ("Client uploads within the budget", "uploads_in_budget", 0))
    for title, key, digits in sections:
        lines += [f"**{title}**", "", head, rule]
        for m in methods:
            lines.append(f"| {m} | " + " | ".join(cell(at.get((m, p)), key, digits, args.budget) for p in probs) + " |")
        lines.append("")
    if "AsyncFedED" in methods:
        lines += ["**AsyncFedED: mean local steps K of the updates within the budget**", "", head, rule,
                  "| AsyncFedED | " + " | ".join(cell(at.get(("AsyncFedED", p)), "mean_k", 1, args.budget)
                                                 for p in probs) + " |", ""]
    ablation = [r for r in rows if r["method"].startswith("AsyncFedED K=")]
    adaptive = at.get(("AsyncFedED", args.ablation_prob))
    if ablation:
        lines += [f"**Ablation (Fig. 4): adaptive vs constant K at P = {args.ablation_prob:g}**", "",
                  f"| variant | max accuracy | time to 90% of max | time to {args.target:g} | uploads | mean K |",
                  "|---|---|---|---|---|---|"]
        variants = ([("adaptive K (K_init = 10)", adaptive)] if adaptive is not None else []) + [
            (f"constant K = {r['method'].split('=')[1]}", r) for r in ablation]
        for label, r in variants:
            lines.append(f"| {label} | " + " | ".join(cell(r, k, d, args.budget) for k, d in (
                ("max_accuracy", 4), ("time_to_90pct_max", 2), ("time_to_target", 2), ("uploads_in_budget", 0),
                ("mean_k", 1))) + " |")
        lines.append("")
    checks = direction_checks(rows, args)
    if checks:
        lines += ["**The paper's direction, on these means**", ""] + [f"- {c}" for c in checks] + [""]
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------------ figures
STYLES = {"AsyncFedED": "-", "FedAsync+Constant": "--", "FedAsync+Hinge": "--", "FedAvg": ":", "FedProx": "-."}


def plot(records: list[dict], rows: list[dict], args: AsyncfededSettings) -> list[str]:
    """The figures: ``accuracy.png``, ``metrics_vs_p.png`` and, with the ablation, ``ablation.png``."""
    written = [plot_accuracy(records, args), plot_metrics(rows, args)]
    ablation = plot_ablation(records, args)
    return written + ([ablation] if ablation else [])


def plot_accuracy(records: list[dict], args: AsyncfededSettings) -> str:
    """Test accuracy against virtual time, mean over seeds, one panel per P."""
    plt = pyplot()
    grid = np.linspace(0.0, args.budget, 400)
    methods = [m for m in METHODS if m in args.methods]
    probs = args.probs
    cols = min(len(probs), 5)
    nrows = math.ceil(len(probs) / cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(3.8 * cols, 3.2 * nrows), squeeze=False, sharey=True)
    for ax, p in zip(axes.flat, probs):
        for m in methods:
            recs = [r for r in records if r["method"] == m and r["prob"] == p]
            if recs:
                ax.plot(grid, mean_on_grid(recs, grid), STYLES[m], label=m, linewidth=1.6 if m == "AsyncFedED" else 1)
        ax.axhline(args.target, color="grey", linewidth=0.5)
        ax.set_title(f"P = {p:g}")
        ax.set_xlabel("virtual time")
        ax.grid(alpha=0.3)
    for ax in axes.flat[len(probs):]:
        ax.axis("off")
    for row in axes:
        row[0].set_ylabel("test accuracy")
    axes.flat[0].legend(fontsize=7)
    fig.tight_layout()
    return save_png(fig, args.out, "accuracy.png")


def plot_metrics(rows: list[dict], args: AsyncfededSettings) -> str:
    """The Fig. 3 metrics and the time to the common target against P."""
    plt = pyplot()
    methods = [m for m in METHODS if m in args.methods]
    probs = args.probs
    at = {(r["method"], r["prob"]): r for r in rows}
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.4))
    for ax, (key, label) in zip(axes, (("max_accuracy", "max test accuracy within the budget"),
                                       ("time_to_90pct_max", "time to 90% of own max"),
                                       ("time_to_target", f"time to accuracy {args.target:g}"))):
        for m in methods:
            ps = [p for p in probs if (m, p) in at and at[(m, p)].get(key) is not None]
            ax.errorbar(ps, [at[(m, p)][key] for p in ps], yerr=[at[(m, p)][key + "_std"] for p in ps],
                        fmt=STYLES[m] + "o", markersize=3, capsize=2, label=m)
        ax.set_xlabel("suspension probability P")
        ax.set_title(label, fontsize=10)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    return save_png(fig, args.out, "metrics_vs_p.png")


def plot_ablation(records: list[dict], args: AsyncfededSettings) -> str | None:
    """Fig. 4: AsyncFedED's adaptive K against every constant K at the ablation's P (None without the ablation)."""
    plt = pyplot()
    grid = np.linspace(0.0, args.budget, 400)
    ablation = sorted({r["method"] for r in records if r["method"].startswith("AsyncFedED K=")},
                      key=lambda m: int(m.split("=")[1]))
    if ablation:
        fig, ax = plt.subplots(figsize=(5, 3.4))
        for m in ["AsyncFedED", *ablation]:
            recs = [r for r in records if r["method"] == m and r["prob"] == args.ablation_prob]
            if recs:
                ax.plot(grid, mean_on_grid(recs, grid), "-" if m == "AsyncFedED" else "--",
                        label="adaptive K" if m == "AsyncFedED" else f"constant K = {m.split('=')[1]}")
        label_axes(ax, f"AsyncFedED, adaptive vs constant K (P = {args.ablation_prob:g})", "virtual time",
                   "test accuracy")
        fig.tight_layout()
        return save_png(fig, args.out, "ablation.png")
    return None


def main(argv: list[str] | None = None) -> int:
    """The command: runs every program and writes ``table.md``, ``results.json`` and the figures to ``--out``; 2 for
    the paper's tasks that are not available."""
    return command_main(argv, parse_settings, run_command, report_command, load=load_task)


def check_task(args: AsyncfededSettings) -> None:
    """Synthetic(1, 1) and (cpu scale) Fashion-MNIST are available: the paper's other tasks, or Fashion-MNIST's
    missing files, raise ``DataUnavailable``."""
    if args.task == CPU_TASK:
        problem = check_dataset(CPU_TASK, args.data_dir)
        if problem:
            raise DataUnavailable(problem)
        return
    if args.task != "synthetic":
        raise DataUnavailable(UNAVAILABLE.format(task=args.task.capitalize() if args.task != "femnist" else "FEMNIST"))
    if args.scale == "paper" and not args.quick:
        print("--scale paper: Synthetic(1, 1) only; the paper's FEMNIST and Shakespeare tasks are not available in "
              "this project", file=sys.stderr)


def load_task(args: AsyncfededSettings) -> Task:
    """The task of the runs, once the data are known to be there (:func:`check_task`): Fashion-MNIST
    (:func:`make_cpu_task`) or Synthetic(1, 1) (:func:`make_synthetic_task`)."""
    check_task(args)
    return make_cpu_task(args) if args.task == CPU_TASK else make_synthetic_task()


def write_report(args: AsyncfededSettings, records: list[dict], seconds: float, test_examples: int) -> str:
    """``table.md``, ``results.json`` (the settings with the test set's size, ``test_examples``) and the figures;
    returns the table."""
    rows = summarize(records, args)
    seconds = round(seconds, 1)
    table = format_table(rows, args, test_examples) + f"\nWall time: {seconds} s.\n"
    verdicts = cpu_verdicts(records, args) if args.task == CPU_TASK else {}
    table += "".join("\n" + "\n".join(verdict_lines(vs, title)) for title, vs in verdicts.items())
    write_outputs(args.out, table, {"args": {**vars(args), "test_examples": test_examples},
                                    "results": rows, "checks": direction_checks(rows, args),
                                    "runs": records, "seconds": seconds,
                                    "verdicts": {t: [verdict_json(v) for v in vs] for t, vs in verdicts.items()}})
    plot(records, rows, args)
    if args.task == CPU_TASK:
        plot_cpu_figures(records, args)
    return table


# ------------------------------------------------------------------------------------------------ cpu: Fashion-MNIST
# ``--scale cpu`` (default task ``fashion_mnist``): the paper's claims on a non-convex model and an image task that
# runs on 2 CPU cores. The paper's image task (FEMNIST, a CNN) has no loader here and the CNN does not finish on a CPU;
# this setting keeps everything else of the Synthetic experiment (10 clients, all always training on the event clock,
# K_init = 10 steps of batch 10 with momentum 0.5, the suspension model, the Synthetic column's lambda = 5,
# epsilon = 5, gamma_bar = 3, kappa = 1 and FedAsync / FedProx values) on Fashion-MNIST (the IDX files, all 60,000
# training and 10,000 test examples) with a Dirichlet label split over the 10 clients and the paper's MLP shape
# (two hidden layers of 200) on 784 inputs. Each method trains at the client learning rate a small sweep chose
# (:func:`run_sweep`, ``--sweep``; docs/reproduce_asyncfeded.md), not at the paper's 0.01 tuned for its tasks.
CPU_TASK = "fashion_mnist"
CPU_CLIENTS = 10
CPU_HIDDEN = (200, 200)
CPU_ALPHA = 0.3  # the Dirichlet concentration of the label split (lower: more skew)
CPU_TEST_EXAMPLES = 5000  # of the 10,000 test examples, drawn once: accuracy in steps of 0.02 points
CPU_TRAIN_EVAL_EXAMPLES = 500  # the train loss (not used by the verdicts) on a small sample
CPU_SCALE = {"budget": 60.0, "probs": [0.1, 0.5, 0.9], "seeds": [0, 1, 2, 3, 4], "ablation_k": [5, 10, 20],
             "evals": 40}
CPU_QUICK = {"budget": 4.0, "probs": [0.1, 0.9], "seeds": [0, 1], "ablation_k": [5], "evals": 8}
LR_GRID = [0.003, 0.01, 0.03, 0.1, 0.3]  # the client learning rates of the sweep
LAMBDA_GRID = [0.5, 1.0, 2.0, 5.0]  # AsyncFedED's lambda (its server step lambda / (gamma + epsilon)) in the sweep
SWEEP_SEEDS = [100, 101]  # not the reported seeds: the choice does not select on their noise
SWEEP_PROB = 0.5
CPU_LR = {"AsyncFedED": 0.1, "FedAsync+Constant": 0.1, "FedAsync+Hinge": 0.1, "FedAvg": 0.1, "FedProx": 0.1}
CPU_LAMBDA = 0.5
"""AsyncFedED's lambda at ``--scale cpu`` (epsilon stays the Synthetic column's 5): the sweep's choice over
:data:`LAMBDA_GRID` jointly with its learning rate. The Synthetic column's lambda = 5 makes the server step
``5 / (gamma + 5)`` about 1 for a fresh update, which on a label-skewed split pulls the model to each client in turn."""
"""Each method's client learning rate at ``--scale cpu``: the choice of the sweep (``--sweep``) over
:data:`LR_GRID`, highest mean test accuracy over the last 10% of the budget on :data:`SWEEP_SEEDS` at
P = :data:`SWEEP_PROB`. The constant-K ablation uses AsyncFedED's."""
EARLY_FRACTION = 0.25  # "converges faster": the verdicts also compare at this fraction of the time budget
SERIES = ("times", "accuracy", "uploads", "local_steps")  # a record's per-evaluation lists


def add_cpu_arguments(p: argparse.ArgumentParser) -> None:
    """The options of the Fashion-MNIST task (``--task fashion_mnist``), refused with any other task."""
    p.add_argument("--alpha", type=float, default=None,
                   help=f"fashion_mnist: Dirichlet concentration of the label split over the 10 clients "
                        f"(default {CPU_ALPHA:g})")
    p.add_argument("--data-dir", default=None, help="fashion_mnist: the folder of the IDX files (default: the usual "
                                                    "places, e.g. the Debian package's)")
    p.add_argument("--sweep", action="store_true",
                   help=f"fashion_mnist: sweep each method's client learning rate over {LR_GRID} on seeds "
                        f"{SWEEP_SEEDS} at P = {SWEEP_PROB:g} (no ablation) and write sweep.md instead of the "
                        "comparison")


def default_task(scale: str) -> str:
    """``fashion_mnist`` at ``--scale cpu``, the paper's ``synthetic`` at ``--scale paper``."""
    return CPU_TASK if scale == "cpu" else "synthetic"


def cpu_argument_problem(args: argparse.Namespace) -> str | None:
    """What is wrong with the task's options (before the scale's defaults are filled in), or None: the
    Fashion-MNIST options with another task would be ignored, and Fashion-MNIST is a cpu-scale stand-in."""
    task = args.task or default_task(args.scale)
    if task != CPU_TASK:
        given = [flag for flag, value in (("--alpha", args.alpha), ("--data-dir", args.data_dir),
                                          ("--sweep", args.sweep or None)) if value is not None]
        if given:
            return f"{', '.join(given)} apply only to --task {CPU_TASK} (got --task {task})"
        return None
    if args.scale == "paper":
        return (f"--task {CPU_TASK} is the cpu-scale stand-in for the paper's image task; --scale paper runs the "
                "paper's Synthetic(1, 1) (--task synthetic)")
    if args.alpha is not None and not args.alpha > 0:
        return f"--alpha must be > 0, got {args.alpha}"
    if args.sweep and any(v is not None for v in (args.probs, args.seeds, args.ablation_k)):
        return f"--sweep runs its own P ({SWEEP_PROB:g}) and seeds {SWEEP_SEEDS} without the ablation: drop " \
               "--probs, --seeds and --ablation-k"
    return None


def scale_defaults(args: argparse.Namespace) -> dict:
    """The defaults of ``--scale`` / ``--quick`` for the task (also fills ``args.task`` and, for Fashion-MNIST,
    ``args.alpha`` and ``args.client_lrs``, each method's client learning rate)."""
    args.task = args.task or default_task(args.scale)
    if args.task != CPU_TASK:
        args.client_lrs = args.feded_lambda = None
        return dict(QUICK if args.quick else SCALES[args.scale])
    args.alpha = CPU_ALPHA if args.alpha is None else args.alpha
    args.client_lrs = dict(CPU_LR)
    args.feded_lambda = None if args.sweep else CPU_LAMBDA
    defaults = dict(CPU_QUICK if args.quick else CPU_SCALE)
    if args.sweep:
        defaults.update(probs=[SWEEP_PROB], seeds=list(SWEEP_SEEDS), ablation_k=[])
        args.ablation_prob = SWEEP_PROB  # no ablation: AsyncFedED runs at the sweep's P only
    return defaults


def preset_task(args: AsyncfededSettings) -> str:
    """The presets' task: Fashion-MNIST runs the Synthetic column's hyper-parameters (its own learning rates)."""
    return "synthetic" if args.task == CPU_TASK else args.task


def client_lr_of(args: AsyncfededSettings) -> Callable[[str], dict]:
    """``method -> {"client_lr": value}`` for the methods with their own learning rate (Fashion-MNIST), else ``{}``
    (the preset's)."""
    lrs = args.client_lrs or {}
    return lambda method: {"client_lr": lrs[method]} if method in lrs else {}


def feded_lambda_of(args: AsyncfededSettings) -> dict:
    """``{"feded_lambda": value}`` when the task sets AsyncFedED's lambda (Fashion-MNIST), else ``{}`` (the
    preset's)."""
    value = args.feded_lambda
    return {} if value is None else {"feded_lambda": value}


def asyncfeded_variants(args: AsyncfededSettings) -> list[tuple[str, dict]]:
    """AsyncFedED's replicas per (P, seed): one, or in the sweep one per lambda of :data:`LAMBDA_GRID` (labelled
    ``AsyncFedED lambda=V``)."""
    if args.sweep:
        return [(f"AsyncFedED lambda={lam:g}", {"feded_lambda": lam}) for lam in LAMBDA_GRID]
    return [("AsyncFedED", feded_lambda_of(args))]


def task_title(args: AsyncfededSettings) -> str:
    """The task in words, for the tables and figures."""
    if args.task == CPU_TASK:
        return (f"Fashion-MNIST, {CPU_CLIENTS} clients Dir({args.alpha:g}), MLP 784-"
                f"{'-'.join(map(str, CPU_HIDDEN))}-10")
    return "Synthetic(1, 1), 10 clients, MLP 60-200-200-10"


def make_cpu_task(args: AsyncfededSettings) -> Task:
    """Fashion-MNIST (IDX files; all 60,000 training examples, pixels / 255) over :data:`CPU_CLIENTS` clients with
    a Dirichlet(``args.alpha``) label split drawn once (seed 0, shared by every seed and method), the MLP
    784-200-200-10 (initial weights seed 0), and :data:`CPU_TEST_EXAMPLES` test examples drawn once (seed 0; the
    synchronous baselines evaluate after every round, and evaluation is most of the run's cost on a CPU)."""
    dataset = load_dataset(CPU_TASK, args.data_dir)
    if CPU_TEST_EXAMPLES < len(dataset.test_y):
        keep = np.sort(np.random.default_rng(0).choice(len(dataset.test_y), CPU_TEST_EXAMPLES, replace=False))
        dataset = dataclasses.replace(dataset, test_x=dataset.test_x[keep], test_y=dataset.test_y[keep])
    parts = partition("dirichlet", dataset.train_y, CPU_CLIENTS, seed=0, alpha=args.alpha)
    model = make_model("mlp", dataset.input_shape, dataset.num_classes, seed=0, hidden=CPU_HIDDEN)
    return make_task(dataset, parts, model, train_eval_size=CPU_TRAIN_EVAL_EXAMPLES)


@dataclasses.dataclass(frozen=True)
class Runs:
    """What the command ran: every run's record, and the size of the test set they were evaluated on (the table
    states it, and ``results.json`` keeps it with the settings as ``args.test_examples``)."""

    records: list[dict]
    test_examples: int


def run_command(args: AsyncfededSettings, task: Task) -> Runs:
    """The runs of the command on ``task`` (:func:`load_task`): the learning-rate sweep (``--sweep``) or the
    comparison."""
    records = run_sweep(args, task) if args.sweep else run_all(args, task)
    return Runs(records, int(task.test_y.shape[0]))


def report_command(args: AsyncfededSettings, runs: Runs, seconds: float) -> str:
    """The report of the command: ``sweep.md`` (``--sweep``) or the comparison's ``table.md``, JSON and figures."""
    if args.sweep:
        return write_sweep_report(args, runs.records, seconds)
    return write_report(args, runs.records, seconds, runs.test_examples)


# ------------------------------------------------------------------------------------------------ cpu: the sweep
def run_sweep(args: AsyncfededSettings, task: Task) -> list[dict]:
    """Every method at every client learning rate of :data:`LR_GRID` (one comparison per value, every method at
    it), tagged with ``client_lr``."""
    records = []
    for lr in LR_GRID:
        at = dataclasses.replace(args, client_lrs={m: lr for m in METHODS})
        records += [{**r, "client_lr": lr} for r in run_all(at, task)]
    return records


def sweep_scores(records: list[dict], budget: float) -> dict[str, dict[float, list[float]]]:
    """``{method: {client_lr: [value per seed]}}``: each run's mean test accuracy over the last 10% of the time
    budget (:func:`~asyncfl_jax.reproduce.verdicts.value_at_budget`; NaN for a diverged run)."""
    scores: dict[str, dict[float, list[float]]] = {}
    for r in records:
        value = value_at_budget(r["times"], r["accuracy"], budget)
        scores.setdefault(r["method"], {}).setdefault(r["client_lr"], []).append(value)
    return scores


def sweep_choice(by_lr: dict[float, list[float]]) -> float:
    """The learning rate with the highest mean score over seeds; a value with a diverged (NaN) run ranks last."""
    return max(sorted(by_lr), key=lambda lr: (bool(np.all(np.isfinite(by_lr[lr]))), float(np.nanmean(by_lr[lr]))
                                              if np.any(np.isfinite(by_lr[lr])) else -math.inf))


def write_sweep_report(args: AsyncfededSettings, records: list[dict], seconds: float) -> str:
    """``sweep.md`` and ``sweep.json``: per method, the score of every learning rate (mean ± std over the sweep
    seeds, in %) and the choice; returns the table."""
    scores = sweep_scores(records, args.budget)
    lines = [f"Client learning-rate sweep: {task_title(args)}, P = {args.probs[0]:g}, seeds {args.seeds}, budget "
             f"{args.budget:g}; score = mean test accuracy (%) over the last 10% of the budget, mean ± std over the "
             "seeds; the chosen value in bold.", "",
             "| method | " + " | ".join(f"lr {lr:g}" for lr in LR_GRID) + " | chosen |",
             "|---|" + "---|" * (len(LR_GRID) + 1)]
    chosen = {}
    for m in scores:  # AsyncFedED at each lambda, then the baselines
        chosen[m] = sweep_choice(scores[m])
        cells = []
        for lr in LR_GRID:
            v = np.asarray(scores[m].get(lr, [math.nan]), dtype=np.float64)
            text = "diverged" if not np.all(np.isfinite(v)) else f"{100 * v.mean():.2f} ± {100 * v.std():.2f}"
            cells.append(f"**{text}**" if lr == chosen[m] else text)
        lines.append(f"| {m} | " + " | ".join(cells) + f" | {chosen[m]:g} |")
    feded = {m: float(np.mean(scores[m][chosen[m]])) for m in chosen if m.startswith("AsyncFedED")}
    if feded:
        best = max(feded, key=feded.get)
        lines += ["", f"AsyncFedED's choice: {best.split(' ', 1)[1]}, lr {chosen[best]:g} ({100 * feded[best]:.2f})."]
    table = "\n".join(lines) + f"\n\nWall time: {round(seconds, 1)} s.\n"
    results = {"args": vars(args), "scores": {m: {str(lr): v for lr, v in s.items()} for m, s in scores.items()},
               "chosen": chosen, "runs": records, "seconds": round(seconds, 1)}
    write_atomic(os.path.join(args.out, "sweep.md"), table)
    write_atomic(os.path.join(args.out, "sweep.json"), json.dumps(results, indent=1))
    return table


# ------------------------------------------------------------------------------------------------ cpu: verdicts
def evaluations_within(record: dict, limit: float) -> int:
    """How many of ``record``'s evaluations are at virtual time ``<= limit`` (times ascend)."""
    return int(np.searchsorted(np.asarray(record["times"], dtype=np.float64), limit, side="right"))


def runs_of(records: list[dict], method: str, prob: float, limit: float) -> list[dict]:
    """The runs of ``method`` at suspension probability ``prob``, each cut to the evaluations that every one of them
    made by virtual time ``limit`` (the same count for every seed, as the mean curves need: the seeds' clocks
    differ, so the last kept evaluation may be a little before ``limit``)."""
    runs = [r for r in records if r["method"] == method and r["prob"] == prob]
    count = min((evaluations_within(r, limit) for r in runs), default=0)
    return [{**r, **{k: list(r[k][:count]) for k in SERIES if k in r}} for r in runs]


PAPER_FASTER = "faster at every P (Figs. 2, 3, 5-14; curves, no numbers)"
PAPER_ABLATION = "adaptive K faster and smoother than K = 5, 10, 15, 20 (Fig. 4; curves)"


def cpu_verdicts(records: list[dict], args: AsyncfededSettings) -> dict[str, list[Verdict]]:
    """The verdict tables of the Fashion-MNIST comparison, ``{title: verdicts}``:

    * per P: AsyncFedED above each baseline at the end of the budget, at equal uploads, virtual time and local steps
      (the paper's Fig. 3a, max accuracy within the budget, read as the accuracy at its end), and at equal virtual time
      at a quarter of the budget (Figs. 2 and 3b: "converges faster");
    * across P (equal virtual time): AsyncFedED not below itself from the smallest to the largest P ("quite stable";
      the claim is a gap within the noise or positive) and FedAsync+Constant / +Hinge below themselves (they
      "decline drastically when P is large": the claim is this gap beyond the noise);
    * the ablation (Fig. 4): adaptive K above each constant K at the ablation's P, at the three budgets."""
    out: dict[str, list[Verdict]] = {}
    budget, early = args.budget, EARLY_FRACTION * args.budget
    base = [m for m in BASELINES if m in args.methods]
    seeds = f"seeds {args.seeds}"
    if "AsyncFedED" in args.methods:
        for p in args.probs:
            mine = runs_of(records, "AsyncFedED", p, budget)
            rows = []
            for m in base:
                theirs = runs_of(records, m, p, budget)
                if mine and theirs:
                    for axis in ("uploads", "times", "local_steps"):
                        rows.append(compare(f"AsyncFedED above {m}", mine, theirs, axis=axis, paper=PAPER_FASTER))
            for m in base:
                early_mine, theirs = runs_of(records, "AsyncFedED", p, early), runs_of(records, m, p, early)
                if early_mine and theirs:
                    rows.append(compare(f"AsyncFedED above {m} at t = {early:g} (faster)", early_mine, theirs,
                                        axis="times", paper=PAPER_FASTER))
            out[f"Verdicts, P = {p:g}, {seeds}"] = rows
    if len(args.probs) > 1:
        lo, hi = args.probs[0], args.probs[-1]
        rows = []
        for m, paper in (("AsyncFedED", "quite stable as P grows (Fig. 3)"),
                         ("FedAsync+Constant", "declines drastically at large P (Fig. 3)"),
                         ("FedAsync+Hinge", "declines drastically at large P (Fig. 3)")):
            at_lo, at_hi = runs_of(records, m, lo, budget), runs_of(records, m, hi, budget)
            if at_lo and at_hi:
                if m == "AsyncFedED":
                    rows.append(compare(f"AsyncFedED at P = {hi:g} not below P = {lo:g}", at_hi, at_lo,
                                        axis="times", paper=paper))
                else:
                    rows.append(compare(f"{m} lower at P = {hi:g} than at P = {lo:g}", at_lo, at_hi,
                                        axis="times", paper=paper))
        if rows:
            out[f"Verdicts across P (equal virtual time), {seeds}"] = rows
    adaptive = runs_of(records, "AsyncFedED", args.ablation_prob, budget)
    rows = []
    for k in args.ablation_k:
        constant = runs_of(records, f"AsyncFedED K={k}", args.ablation_prob, budget)
        if adaptive and constant:
            for axis in ("uploads", "times", "local_steps"):
                rows.append(compare(f"adaptive K above constant K = {k}", adaptive, constant, axis=axis,
                                    paper=PAPER_ABLATION))
    if rows:
        out[f"Verdicts, ablation at P = {args.ablation_prob:g}, {seeds}"] = rows
    return out


def plot_cpu_figures(records: list[dict], args: AsyncfededSettings) -> list[str]:
    """``claims_p<P>.png`` per P (every method) and ``claims_ablation.png`` (adaptive against constant K): one line
    per method with a min-max band over the seeds against uploads, virtual time and local steps, cut at the budget
    (:func:`asyncfl_jax.reproduce.verdicts.plot_methods`)."""
    written = []
    setting = f"{task_title(args)}, budget {args.budget:g}"
    for p in args.probs:
        runs = {m: runs_of(records, m, p, args.budget) for m in METHODS if m in args.methods}
        name = f"claims_p{p:g}.png"
        plot_methods(runs, os.path.join(args.out, name), f"{setting}, suspension P = {p:g}")
        written.append(name)
    if args.ablation_k:
        runs = {"adaptive K": runs_of(records, "AsyncFedED", args.ablation_prob, args.budget),
                **{f"constant K = {k}": runs_of(records, f"AsyncFedED K={k}", args.ablation_prob, args.budget)
                   for k in args.ablation_k}}
        name = "claims_ablation.png"
        plot_methods(runs, os.path.join(args.out, name), f"AsyncFedED, {setting}, P = {args.ablation_prob:g}")
        written.append(name)
    return written
