"""The CA2FL paper's experiments (Wang et al. 2023, "Tackling the Data Heterogeneity in Asynchronous Federated
Learning with Cached Update Calibration"; digest 003): CA2FL and MF-CA2FL against the asynchronous baselines.

Protocol (paper App. D, digest sections 2-4): n = 100 clients with a Dirichlet(alpha) label split (FedMA's
"hetero-dir" with at least 10 examples per client), concurrency Mc = 20, buffer M = 10 with the paper's *boundary*
refill (``concurrent``, ``refill="boundary"``: M new clients start from the new model after each global step, so
the mean staleness tends to (Mc - M) / M), client job times ``|N(0, s_i^2)|`` with a per-client scale
``s_i ~ U(0, 5)`` (``DelayModel.ca2fl()``), 2 local epochs of plain SGD at batch 50 (``K_i = 2 ceil(n_i / 50)``,
different per client), weight decay 1e-4, eta_l = 0.01 and eta = 1.0 for every method (Table 6), 500 global rounds.

=========================  ====================================================  ====================================
method (``--methods``)     rule                                                  protocol
=========================  ====================================================  ====================================
Async FL = FedBuff         x += eta mean of the M buffered deltas (Alg. 2,       Mc = 20, M = 10, boundary refill
(``asyncfl``)              averaged; FedBuff without DP, the paper's baseline)
CA2FL (``ca2fl``)          v = hbar + mean_{S_t}(Delta_i - h_i), x += eta v,     same
                           h_i = Delta_i (Alg. 1; caches start at 0)
MF-CA2FL 8/4/2 bits        CA2FL with the cache stored as b-bit codes with       same
(``mf8``, ``mf4``,         stochastic rounding (h_i = Q(Delta_i)); the fresh
``mf2``)                   term uses the full-precision Delta_i
FedBuff, immediate refill  Async FL's rule with the original FedBuff's refill    Mc = 20, M = 10, immediate refill
(``fedbuff_immediate``)    (not in the paper; concurrency stays Mc)
FedAsync constant /        x = (1 - a_t) x + a_t x_i on every arrival,           Mc = 20, M = 1, immediate refill
polynomial                 a_t = alpha s(tau), s = 1 or (tau + 1)^-beta; local   (Fig. 6; Table 7: rho 1.0, alpha
(``fedasync_constant``,    proximal term rho (App. D.2)                          0.3 / 0.5, beta 0.3 for the CNN;
``fedasync_polynomial``)                                                         0.1, 0.3, 0.3 for the ResNet)
=========================  ====================================================  ====================================

Every method gets the same number of client updates (rounds x M); FedAsync's axis is client updates (one of its
server steps is one update; the digest's reading of Fig. 6). MF-CA2FL 2 bits, FedAsync and the immediate-refill
FedBuff run only in the Table 1 setting (the first setting listed; paper: CIFAR-10 Dir(0.3)).

Ablations (on ``--ablation-setting``; paper scale: CIFAR-10, ResNet-18, Dir(0.3), as the paper; cpu scale: the
Dir(0.1) setting), Async FL and CA2FL only:

- Fig. 4 / Table 4: concurrency Mc in {15, 20, 25} with M = 10 and buffer M in {5, 10, 15} with Mc = 20, all at the
  same number of global rounds (as the paper's round axis; so M = 15 sees 1.5 times the updates of M = 10). With
  ``--grid`` the full Mc x M grid runs and ``heatmap.png`` shows it.
- Fig. 5(a): every client's jobs from the same halfnorm(5) ("fixed") instead of a per-client scale s_i ~ U(0, 5).
  Fig. 5(b, c) (s_i ~ U(0, 1) and U(0, 0.5)) need no training run: multiplying every s_i by one constant leaves the
  order of events, hence the schedule and the training, unchanged (digest 3.3); the script checks this and reports
  the delay statistics of Table 5.
- Delay statistics (Tables 4 and 5): tau_max and tau_avg of 500-round schedules for every (Mc, M) and delay
  distribution, beside the paper's, and the digest's calibration (job time + 5) that brings tau_max near the paper's.

Scales:

- ``--scale cpu`` (default): Fashion-MNIST (IDX files), the MLP 784-64-10 (a non-convex model, as the paper's; the
  logistic regression of earlier versions put every gain within the seed noise), 12,000 training examples drawn once
  (so 2 epochs at batch 50 are 2-18 local steps, like the paper's 2-100), the full test set, alpha = 0.1 (the label
  skew the claim is about), 300 rounds (3,000 uploads), seeds 0-4 (ablations: seed 0, at Dir(0.1)), eval
  every 5 rounds, eta_l = 0.1 (the paper's 0.01 is tuned for the CNN; 0.1 was the best of {0.03, 0.1, 0.3} for both
  Async FL and CA2FL in a sweep on seeds 100 and 101, docs/reproduce_ca2fl.md), eta = 1.0; Async FL, CA2FL and
  MF-CA2FL only (FedAsync and the immediate-refill FedBuff, not swept here, with ``--methods``). Test accuracy, not
  the paper's CIFAR numbers, is what it measures; the paper's CIFAR-10 CNN numbers at the same alpha are printed
  beside it as a reference for the direction and size of the effects only. R# target: 75%. ``table.md`` ends with
  one verdict table per setting (:mod:`asyncfl_jax.reproduce.verdicts`).
- ``--scale paper``: CIFAR-10 with the CA2FL CNN and ResNet-18 (GroupNorm) at Dir(0.3) and Dir(0.1), CIFAR-100 with
  ResNet-18 at Dir(0.1) and Dir(0.01) (tfds ``cifar10`` / ``cifar100``, prepared beforehand; see docs/simulator.md),
  images normalised with the CIFAR mean/std of the reference code, 500 rounds, seeds 0, 1, 2, eval every round,
  eta_l = 0.01, eta = 1.0; the ablations on CIFAR-10/ResNet-18/Dir(0.3) with seed 0. R# targets: 50% (CNN) and 80%
  (ResNet-18), as Table 1. ``--settings`` picks a subset. This needs an accelerator: the CNN cache alone is
  100 x 2.2M floats (0.9 GB) per replica, the ResNet's 4.5 GB, and every job runs the largest client's K steps (the
  others masked), up to about 100 steps of batch 50 at Dir(0.1).

Deviations from the paper (see docs/reproduce_ca2fl.md): ResNet-18 uses GroupNorm instead of BatchNorm; no data
augmentation (the client has none); the Dirichlet split is drawn once (seed 0) and shared by every seed and method
(the training seed and the timing seed change with the seed); FedAsync's ResNet hyper-parameters that the extracted
Table 7 misses are the digest's fill-ins; FedAsync's rounds are counted in client updates.

The command is ``scripts/reproduce_ca2fl.py`` (examples in its docstring, options in ``--help``).

It writes ``table.md`` (also printed), ``results.json`` (per (setting, method, variant) means and stds, every run's
curve, the delay statistics and the direction checks), ``accuracy.png`` (test accuracy against global rounds, one
panel per setting; Fig. 2), ``fedasync.png`` (against client updates; Fig. 6), ``ablation.png`` (Fig. 4 and 5(a)) and,
with ``--grid``, ``heatmap.png`` to ``--out``.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import sys
from typing import Any

import numpy as np

from asyncfl_jax import (LocalConfig, ReplicaSpec, Schedule, Task, get_algorithm, make_model, make_schedule,
                         make_task)
from asyncfl_jax.data import Dataset, partition
from asyncfl_jax.errors import PartitionError
from asyncfl_jax.reproduce.curves import finite_mean_std, first_passage, mean_of_aligned
from asyncfl_jax.reproduce.data import (DATASET_TITLES, DataUnavailable, check_dataset, load_dataset,
                                        standardize_channels)
from asyncfl_jax.reproduce.grid import command_main, replica_runs, run_grid, setting_seed
from asyncfl_jax.reproduce.report import distinct_seeds_problem, label_axes, pyplot, save_png, write_outputs, yes_no
from asyncfl_jax.reproduce.settings import ReproductionSettings
from asyncfl_jax.reproduce.verdicts import (claim_verdicts, participation_line, plot_methods, schedule_fastest_share,
                                            verdict_json, verdict_lines)
from asyncfl_jax.timing import DelayModel, schedule_summary


# ------------------------------------------------------------------------------------------------ methods, settings
@dataclasses.dataclass(frozen=True)
class Method:
    """A method of the comparison: its key, label, project algorithm and options, and its protocol."""

    key: str
    label: str
    algorithm: str
    options: dict
    kind: str  # "buffered" (boundary refill), "immediate" (FedBuff's refill) or "fedasync" (M = 1)
    table1_only: bool = False  # runs only in the Table 1 setting (the first one)


METHODS = {m.key: m for m in (
    Method("asyncfl", "Async FL (FedBuff)", "fedbuff", {}, "buffered"),
    Method("ca2fl", "CA2FL", "ca2fl", {}, "buffered"),
    Method("mf8", "MF-CA2FL (8 bits)", "mf_ca2fl", {"bits": 8}, "buffered"),
    Method("mf4", "MF-CA2FL (4 bits)", "mf_ca2fl", {"bits": 4}, "buffered"),
    Method("mf2", "MF-CA2FL (2 bits)", "mf_ca2fl", {"bits": 2}, "buffered", table1_only=True),
    Method("fedbuff_immediate", "FedBuff (immediate refill)", "fedbuff", {}, "immediate", table1_only=True),
    Method("fedasync_constant", "FedAsync (constant)", "fedasync", {"staleness": "constant"}, "fedasync",
           table1_only=True),
    Method("fedasync_polynomial", "FedAsync (polynomial)", "fedasync", {"staleness": "polynomial"}, "fedasync",
           table1_only=True),
)}
ABLATION_METHODS = ("asyncfl", "ca2fl")


@dataclasses.dataclass(frozen=True)
class Setting:
    """One task: a dataset, a model and the Dirichlet concentration of the label split."""

    dataset: str  # fashion_mnist | synthetic | cifar10 | cifar100
    model: str  # logreg | mlp | ca2fl_cnn | resnet18_gn | cnn
    alpha: float

    @property
    def key(self) -> str:
        """``DATASET/MODEL/ALPHA``, as on the command line."""
        return f"{self.dataset}/{self.model}/{self.alpha:g}"

    @property
    def title(self) -> str:
        """A figure title, e.g. ``CIFAR-10 CNN Dir(0.3)``."""
        models = {"ca2fl_cnn": "CNN", "resnet18_gn": "ResNet-18", "logreg": "logreg", "mlp": "MLP", "cnn": "CNN"}
        return (f"{DATASET_TITLES.get(self.dataset, self.dataset)} {models.get(self.model, self.model)} "
                f"Dir({self.alpha:g})")


DATASETS = ("fashion_mnist", "synthetic", "cifar10", "cifar100")
MODELS = ("logreg", "mlp", "cnn", "ca2fl_cnn", "resnet18_gn")
CIFAR_NORMALISATION = "cifar10"  # the reference code's per-channel statistics, for CIFAR-10 and CIFAR-100 (digest 4.1)

SCALES: dict[str, dict[str, Any]] = {
    # cpu: a non-convex model (the 784-64-10 MLP) at the label skew CA2FL is about, Dir(0.1) (Dir(0.05) has no split
    # of the 12,000 examples with 10 per client, and the full 60,000 make K up to 130 steps); 3,000
    # uploads (300 rounds of M = 10); eta_l = 0.1, the best of {0.03, 0.1, 0.3} for both Async FL and CA2FL in a
    # sweep on other seeds (100, 101; docs/reproduce_ca2fl.md); FedAsync and the immediate-refill FedBuff (not swept
    # on this task) only with --methods.
    "cpu": {"settings": ["fashion_mnist/mlp/0.1"], "rounds": 300, "seeds": [0, 1, 2, 3, 4],
            "ablation_seeds": [0], "eval_every": 5, "client_lr": 0.1, "train_subset": 12000,
            "ablation_setting": "fashion_mnist/mlp/0.1", "target": 0.75,
            "methods": ["asyncfl", "ca2fl", "mf8", "mf4", "mf2"]},
    "paper": {"settings": ["cifar10/ca2fl_cnn/0.3", "cifar10/resnet18_gn/0.3", "cifar10/ca2fl_cnn/0.1",
                           "cifar10/resnet18_gn/0.1", "cifar100/resnet18_gn/0.1", "cifar100/resnet18_gn/0.01"],
              "rounds": 500, "seeds": [0, 1, 2], "ablation_seeds": [0], "eval_every": 1, "client_lr": 0.01,
              "train_subset": None, "ablation_setting": "cifar10/resnet18_gn/0.3", "target": None,
              "methods": list(METHODS)},
}
QUICK = {"rounds": 40, "seeds": [0], "ablation_seeds": [0], "eval_every": 5}
QUICK_SETTINGS = {"cpu": "fashion_mnist/mlp/0.1", "paper": "cifar10/ca2fl_cnn/0.3"}  # one setting, where the
# CPU task separates the methods

# ------------------------------------------------------------------------------------------------ the paper's numbers
# Table 2 (CIFAR-10) and Table 3 (CIFAR-100): final test accuracy (%) after 500 rounds, mean and std over 3 seeds.
PAPER_ACCURACY: dict[tuple[str, str, float], dict[str, tuple[float, float]]] = {
    ("cifar10", "ca2fl_cnn", 0.3): {"asyncfl": (50.15, 1.50), "ca2fl": (53.30, 0.49), "mf8": (52.73, 0.59),
                                    "mf4": (52.72, 0.45)},
    ("cifar10", "resnet18_gn", 0.3): {"asyncfl": (75.60, 1.13), "ca2fl": (76.36, 0.57), "mf8": (74.77, 0.45),
                                      "mf4": (74.30, 0.73)},
    ("cifar10", "ca2fl_cnn", 0.1): {"asyncfl": (43.71, 3.13), "ca2fl": (50.13, 1.10), "mf8": (49.72, 0.99),
                                    "mf4": (49.92, 0.62)},
    ("cifar10", "resnet18_gn", 0.1): {"asyncfl": (57.31, 4.23), "ca2fl": (68.37, 1.97), "mf8": (67.75, 3.26),
                                      "mf4": (68.79, 2.82)},
    ("cifar100", "resnet18_gn", 0.1): {"asyncfl": (43.64, 1.42), "ca2fl": (44.40, 1.27), "mf8": (43.84, 0.47),
                                       "mf4": (43.85, 0.44)},
    ("cifar100", "resnet18_gn", 0.01): {"asyncfl": (22.15, 1.54), "ca2fl": (26.67, 2.20), "mf8": (25.89, 0.82),
                                        "mf4": (25.09, 1.75)},
}
# Table 1: CIFAR-10 Dir(0.3), one run: final accuracy (%) and R#, the first round reaching the target (None: 500+).
PAPER_TABLE1: dict[str, dict[str, tuple[float, int | None]]] = {
    "ca2fl_cnn": {"asyncfl": (50.23, 284), "ca2fl": (53.66, 294), "mf8": (53.54, 314), "mf4": (53.38, 329),
                  "mf2": (41.55, None)},
    "resnet18_gn": {"asyncfl": (74.22, None), "ca2fl": (77.16, 449), "mf8": (75.09, 461), "mf4": (74.18, None),
                    "mf2": (51.19, None)},
}
PAPER_TARGET = {"ca2fl_cnn": 0.5, "resnet18_gn": 0.8}  # Table 1's R# targets
# Table 4 (ResNet-18, CIFAR-10): (Mc, M) -> (tau_max, tau_avg); Table 5: delay distribution -> (tau_max, tau_avg).
PAPER_DELAYS = {(15, 10): (3, 0.4888), (20, 10): (4, 0.9184), (25, 10): (5, 1.312), (20, 15): (2, 0.3264),
                (20, 5): (9, 2.6512)}
PAPER_DELAY_DISTRIBUTIONS = {"U(0,5)": (4, 0.9184), "U(0,1)": (6, 0.9092), "U(0,0.5)": (6, 0.8992),
                             "fixed halfnorm(5)": (None, 0.9946)}
# Table 7 (FedAsync; CIFAR-10 Dir(0.3)): rho (proximal weight), alpha, beta. The ResNet row misses two cells in the
# extracted text: the constant alpha (0.3) and the polynomial eta_l (0.01, the common one) are the digest's fill-ins.
PAPER_FEDASYNC = {
    "ca2fl_cnn": {"fedasync_constant": {"rho": 1.0, "alpha": 0.3}, "fedasync_polynomial": {"rho": 1.0, "alpha": 0.5,
                                                                                             "beta": 0.3}},
    "resnet18_gn": {"fedasync_constant": {"rho": 0.1, "alpha": 0.3}, "fedasync_polynomial": {"rho": 0.1, "alpha": 0.3,
                                                                                               "beta": 0.3}},
}


def paper_reference(setting: Setting) -> tuple[tuple[str, str, float] | None, str]:
    """The paper's row to put beside a setting: its own for CIFAR, the CIFAR-10 CNN at the same alpha otherwise."""
    own = (setting.dataset, setting.model, setting.alpha)
    if own in PAPER_ACCURACY:
        return own, "same setting"
    ref = ("cifar10", "ca2fl_cnn", setting.alpha)
    if ref in PAPER_ACCURACY:
        return ref, f"CIFAR-10 CNN Dir({setting.alpha:g}); another task, a reference only"
    return None, "no paper row"


def fedasync_hparams(setting: Setting, key: str) -> dict[str, float]:
    """Table 7's values; the CNN's for every model but ResNet-18."""
    return dict(PAPER_FEDASYNC["resnet18_gn" if setting.model == "resnet18_gn" else "ca2fl_cnn"][key])


# ------------------------------------------------------------------------------------------------ arguments
def parse_setting(text: str) -> Setting:
    """A ``DATASET/MODEL/ALPHA`` argument (``argparse.ArgumentTypeError`` with the reason for a bad one)."""
    parts = text.split("/")
    if len(parts) != 3:
        raise argparse.ArgumentTypeError(f"a setting is DATASET/MODEL/ALPHA, e.g. cifar10/ca2fl_cnn/0.3; got {text!r}")
    dataset, model, alpha = parts
    if dataset not in DATASETS:
        raise argparse.ArgumentTypeError(f"dataset must be one of {list(DATASETS)}, got {dataset!r}")
    if model not in MODELS:
        raise argparse.ArgumentTypeError(f"model must be one of {list(MODELS)}, got {model!r}")
    try:
        value = float(alpha)
    except ValueError:
        raise argparse.ArgumentTypeError(f"alpha must be a number, got {alpha!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"alpha must be > 0, got {alpha!r}")
    return Setting(dataset, model, value)


def build_parser() -> argparse.ArgumentParser:
    """The command line of ``scripts/reproduce_ca2fl.py``."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--scale", choices=list(SCALES), default="cpu",
                   help="cpu: Fashion-MNIST MLP, alpha 0.1, 300 rounds, 5 seeds (default); "
                        "paper: the six CIFAR settings of Tables 2 and 3, 500 rounds, 3 seeds")
    p.add_argument("--quick", action="store_true",
                   help="one setting (cpu: Dir(0.1); paper: CIFAR-10 CNN Dir(0.3)), 40 rounds, one seed")
    p.add_argument("--settings", type=parse_setting, nargs="+", default=None,
                   help="DATASET/MODEL/ALPHA, e.g. cifar10/ca2fl_cnn/0.3 (default: from --scale); the first one is "
                        "the Table 1 setting (MF 2 bits, FedAsync, FedBuff with immediate refill)")
    p.add_argument("--dataset", choices=["fashion_mnist", "synthetic"], default=None,
                   help="replace the dataset of the cpu settings (synthetic: LEAF Synthetic(1, 1) pooled, no files)")
    p.add_argument("--methods", nargs="+", choices=list(METHODS), default=None,
                   help="default: Async FL, CA2FL and MF-CA2FL 8/4/2 bits (cpu); every method (paper)")
    p.add_argument("--rounds", type=int, default=None, help="global rounds (FedAsync: rounds x M client updates)")
    p.add_argument("--seeds", type=int, nargs="+", default=None)
    p.add_argument("--eval-every", type=int, default=None, help="evaluate every this many rounds")
    p.add_argument("--clients", type=int, default=100)
    p.add_argument("--concurrency", type=int, default=20, help="Mc")
    p.add_argument("--buffer", type=int, default=10, help="M")
    p.add_argument("--client-lr", type=float, default=None, help="eta_l (default: 0.2 cpu, 0.01 paper)")
    p.add_argument("--server-lr", type=float, default=1.0, help="eta (Table 6: 1.0)")
    p.add_argument("--weight-decay", type=float, default=1e-4)
    p.add_argument("--local-epochs", type=float, default=2.0)
    p.add_argument("--batch-size", type=int, default=50)
    p.add_argument("--hidden", type=int, nargs="+", default=[64], help="hidden widths of the mlp model")
    p.add_argument("--train-subset", type=int, default=None,
                   help="use this many training examples, drawn once (default: 12000 cpu, all paper; 0: all)")
    p.add_argument("--delay-high", type=float, default=5.0, help="s_i ~ U(0, this) (paper: 5)")
    p.add_argument("--delay-shift", type=float, default=0.0,
                   help="a constant added to every job time (0: the paper's model; 5: the digest's calibration)")
    p.add_argument("--target", type=float, default=None,
                   help="test accuracy for R# (default: 0.75 cpu; paper: 0.5 CNN, 0.8 ResNet-18 as Table 1, "
                        "none for other models)")
    p.add_argument("--ablation-setting", type=parse_setting, default=None,
                   help="where the Mc/M and delay ablations run (default: the first setting at cpu scale, "
                        "cifar10/resnet18_gn/0.3 at paper scale if it is listed, else the first)")
    p.add_argument("--ablation-concurrency", type=int, nargs="*", default=[15, 25],
                   help="other Mc values of the Fig. 4 sweep (M fixed)")
    p.add_argument("--ablation-buffer", type=int, nargs="*", default=[5, 15],
                   help="other M values of the Fig. 4 sweep (Mc fixed)")
    p.add_argument("--ablation-seeds", type=int, nargs="+", default=None)
    p.add_argument("--grid", action="store_true", help="run the full Mc x M grid of the ablation (heat map)")
    p.add_argument("--no-ablation", action="store_true", help="skip the training runs of the ablations")
    p.add_argument("--no-fixed-delay", action="store_true", help="skip the fixed halfnorm(5) run (Fig. 5a)")
    p.add_argument("--delay-rounds", type=int, default=500, help="rounds of the schedules behind the delay tables")
    p.add_argument("--data-dir", default=None, help="Fashion-MNIST IDX folder, or the TFDS data folder for CIFAR")
    p.add_argument("--out", default="results/reproduce_ca2fl")
    return p


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The arguments with the scale's defaults filled in and checked (a bad one exits with a usage error)."""
    p = build_parser()
    args = p.parse_args(argv)
    defaults = apply_scale_defaults(args)
    problem = settings_problem(args) or argument_problem(args)
    if problem:
        p.error(problem)
    if args.ablation_setting is None:
        wanted = parse_setting(defaults["ablation_setting"])
        if args.dataset is not None and wanted.dataset in ("fashion_mnist", "synthetic"):
            wanted = dataclasses.replace(wanted, dataset=args.dataset)
        args.ablation_setting = next((s for s in args.settings if s.key == wanted.key), args.settings[0])
    return args


@dataclasses.dataclass(frozen=True)
class Ca2flSettings(ReproductionSettings):
    """The settings of one CA2FL reproduction: the command line's options after :func:`parse_args` filled in the
    defaults of ``--scale`` and ``--quick``, replaced the CPU settings' dataset by ``--dataset`` and chose the
    ablation setting. Build it with :func:`parse_settings` (a command line) or :meth:`from_keywords` (the options as
    keywords); both check it alike.

    Attributes:
        scale: ``cpu`` (Fashion-MNIST MLP, Dir(0.1)) or ``paper`` (the six CIFAR settings of Tables 2 and 3).
        quick: one setting, 40 rounds, one seed.
        settings: the (dataset, model, alpha) settings run; the first is Table 1's.
        dataset: the dataset that replaced the CPU settings' (``fashion_mnist`` or ``synthetic``), or None.
        methods: the methods run (``METHODS`` keys).
        rounds: the global rounds of every method (FedAsync: rounds x M client updates).
        seeds: the seeds (distinct, in [0, 1000)).
        eval_every: evaluate every this many rounds.
        clients: n, the number of clients.
        concurrency: Mc, the clients in flight.
        buffer: M, the updates per global round.
        client_lr: eta_l, the clients' learning rate.
        server_lr: eta, the server's learning rate.
        weight_decay: the clients' weight decay.
        local_epochs: the local epochs of a client job (turned into steps per client).
        batch_size: the clients' minibatch.
        hidden: the hidden widths of the ``mlp`` model.
        train_subset: use this many training examples, drawn once (None: all).
        delay_high: the delay scales s_i ~ U(0, delay_high).
        delay_shift: a constant added to every job time (0: the paper's model; 5: the digest's calibration).
        target: the test accuracy behind R# (None: the settings' own, as Table 1).
        ablation_setting: the setting where the Mc/M and delay ablations run (one of ``settings``).
        ablation_concurrency: the other Mc values of the Fig. 4 sweep (M fixed).
        ablation_buffer: the other M values of the Fig. 4 sweep (Mc fixed).
        ablation_seeds: the seeds of the ablations (distinct, in [0, 1000)).
        grid: run the full Mc x M grid of the ablation (heat map).
        no_ablation: skip the training runs of the ablations.
        no_fixed_delay: skip the fixed halfnorm(5) run (Fig. 5a).
        delay_rounds: the rounds of the schedules behind the delay tables.
        data_dir: the Fashion-MNIST IDX folder or the TFDS data folder for CIFAR; None: the default places.
        out: the output folder.
    """

    scale: str
    quick: bool
    settings: list[Setting]
    dataset: str | None
    methods: list[str]
    rounds: int
    seeds: list[int]
    eval_every: int
    clients: int
    concurrency: int
    buffer: int
    client_lr: float
    server_lr: float
    weight_decay: float
    local_epochs: float
    batch_size: int
    hidden: list[int]
    train_subset: int | None
    delay_high: float
    delay_shift: float
    target: float | None
    ablation_setting: Setting
    ablation_concurrency: list[int]
    ablation_buffer: list[int]
    ablation_seeds: list[int]
    grid: bool
    no_ablation: bool
    no_fixed_delay: bool
    delay_rounds: int
    data_dir: str | None
    out: str

    @classmethod
    def from_keywords(cls, **options: Any) -> Ca2flSettings:
        """The settings of the command line that gives ``options`` (``dest=value`` as the flags take them, e.g.
        ``quick=True, settings=["fashion_mnist/mlp/0.1"], rounds=20``): the same defaults, filling and checks as
        :func:`parse_args`; a refused value raises :class:`~asyncfl_jax.reproduce.settings.SettingsError` with the
        command line's message."""
        return cls._from_keywords(build_parser(), parse_args, options)


def parse_settings(argv: list[str] | None = None) -> Ca2flSettings:
    """The settings of a command line (:func:`parse_args`; a bad argument exits with a usage error)."""
    return Ca2flSettings.from_args(parse_args(argv))


def apply_scale_defaults(args: argparse.Namespace) -> dict[str, Any]:
    """Fills every argument left unset (but the ablation setting) from ``--scale`` and ``--quick``; ``--dataset``
    replaces the dataset of the CPU settings. Returns the defaults used."""
    defaults = dict(SCALES[args.scale])
    if args.quick:
        defaults.update(QUICK, settings=[QUICK_SETTINGS[args.scale]])
    if args.settings is None:
        args.settings = [parse_setting(s) for s in defaults["settings"]]
    if args.dataset is not None:
        args.settings = [dataclasses.replace(s, dataset=args.dataset) if s.dataset in ("fashion_mnist", "synthetic")
                         else s for s in args.settings]
    for name in ("rounds", "seeds", "ablation_seeds", "eval_every", "client_lr", "train_subset", "target",
                 "methods"):
        if getattr(args, name) is None:
            setattr(args, name, defaults[name])
    if args.train_subset == 0:
        args.train_subset = None
    return defaults


def settings_problem(args: argparse.Namespace) -> str | None:
    """A repeated setting, or an ablation setting that is not among the settings; else None."""
    keys = [s.key for s in args.settings]
    if len(set(keys)) != len(keys):
        return f"--settings repeats a setting: {keys}"
    if args.ablation_setting is not None and args.ablation_setting.key not in keys:
        return f"--ablation-setting {args.ablation_setting.key} must be one of --settings {keys}"
    return None


def argument_problem(args: argparse.Namespace) -> str | None:
    """What is wrong with the numbers of the (filled-in) arguments, or None."""
    for name in ("rounds", "eval_every", "clients", "concurrency", "buffer", "batch_size", "delay_rounds"):
        if getattr(args, name) < 1:
            return f"--{name.replace('_', '-')} must be >= 1"
    if not args.buffer <= args.concurrency <= args.clients:
        return (f"need 1 <= --buffer ({args.buffer}) <= --concurrency ({args.concurrency}) <= --clients "
                f"({args.clients})")
    for mc in args.ablation_concurrency:
        if not args.buffer <= mc <= args.clients:
            return f"--ablation-concurrency {mc}: need --buffer ({args.buffer}) <= Mc <= --clients ({args.clients})"
    for m in args.ablation_buffer:
        if not 1 <= m <= args.concurrency:
            return f"--ablation-buffer {m}: need 1 <= M <= --concurrency ({args.concurrency})"
    for name in ("seeds", "ablation_seeds"):
        if distinct_seeds_problem(getattr(args, name)):
            return distinct_seeds_problem(getattr(args, name), f"--{name.replace('_', '-')}")
    if not (args.client_lr > 0 and args.server_lr > 0 and args.local_epochs > 0 and args.delay_high > 0
            and args.delay_shift >= 0 and args.weight_decay >= 0):
        return "learning rates, --local-epochs and --delay-high must be > 0; --delay-shift, --weight-decay >= 0"
    if args.target is not None and not 0 < args.target <= 1:
        return "--target must be in (0, 1]"
    return None


def check_data(setup: Ca2flSettings) -> str | None:
    """Every dataset the settings need is there (cheap, before anything runs); the error message otherwise."""
    for dataset in sorted({s.dataset for s in setup.settings}):
        problem = check_dataset(dataset, setup.data_dir, setup.data_dir)
        if problem:
            hint = "\n(or --dataset synthetic at cpu scale, which needs no files)" if dataset == "fashion_mnist" else ""
            return problem + hint
    return None


# ------------------------------------------------------------------------------------------------ data, task
def partition_problem(setup: Ca2flSettings, datasets: dict[str, Dataset]) -> str | None:
    """Why some setting's Dirichlet split cannot be drawn (e.g. an alpha too small for ``--clients`` with at least 10
    examples each), or None: checked for every setting before any training."""
    for setting in setup.settings:
        try:
            partition("dirichlet", datasets[setting.dataset].train_y, setup.clients, seed=0, alpha=setting.alpha)
        except PartitionError as e:
            return f"setting {setting.key}: {e}"
    return None


def load_setting_dataset(name: str, setup: Ca2flSettings) -> Dataset:
    """The dataset of a setting: CIFAR normalised per channel as the reference code, and (``--train-subset``) a
    subset of the training examples drawn once."""
    ds = load_dataset(name, setup.data_dir, setup.data_dir, synthetic_clients=setup.clients)
    if name in ("cifar10", "cifar100"):
        ds = standardize_channels(ds, CIFAR_NORMALISATION)
    if setup.train_subset is not None and setup.train_subset < len(ds.train_y):
        rng = np.random.default_rng([0, 0xCA2F])
        keep = np.sort(rng.choice(len(ds.train_y), setup.train_subset, replace=False))
        ds = dataclasses.replace(ds, train_x=ds.train_x[keep], train_y=ds.train_y[keep])
    return dataclasses.replace(ds, natural_partition=None)


def local_steps(sizes: np.ndarray, setup: Ca2flSettings) -> np.ndarray:
    """K_i = ceil(epochs * ceil(n_i / B)), the client's ``epochs`` mode."""
    return np.ceil(setup.local_epochs * np.ceil(np.asarray(sizes) / setup.batch_size)).astype(int)


def make_setting_task(setting: Setting, dataset: Dataset,
                      setup: Ca2flSettings) -> tuple[Task, LocalConfig, dict[str, Any]]:
    """The task of a setting (the Dirichlet split drawn once, seed 0), its local training (2 epochs: K_i steps, the
    largest K_i compiled) and a description (client sizes, local steps, parameters)."""
    parts = partition("dirichlet", dataset.train_y, setup.clients, seed=0, alpha=setting.alpha)
    sizes = np.array([len(p) for p in parts])
    k = local_steps(sizes, setup)
    model = make_model(setting.model, dataset.input_shape, dataset.num_classes, seed=0, hidden=tuple(setup.hidden))
    task = make_task(dataset, parts, model)
    local = LocalConfig(steps=int(k.max()), batch_size=setup.batch_size, epochs=setup.local_epochs)
    info = {"client_sizes": [int(sizes.min()), float(np.median(sizes)), int(sizes.max())],
            "local_steps": [int(k.min()), float(np.median(k)), int(k.max())], "num_params": int(task.num_params),
            "train_examples": int(sizes.sum()), "test_examples": int(len(dataset.test_y))}
    return task, local, info


# ------------------------------------------------------------------------------------------------ variants, schedules
@dataclasses.dataclass(frozen=True)
class Variant:
    """One protocol setting: concurrency, buffer and delay distribution."""

    name: str
    concurrency: int
    buffer: int
    delays: str = "random"  # "random": s_i ~ U(0, delay_high); "fixed": halfnorm(5) for every client


def delay_model(kind: str, high: float, shift: float) -> DelayModel:
    """``random``: CA2FL's ``|N(0, s_i^2)|`` with ``s_i ~ U(0, high)`` (``--delay-high``); ``fixed``:
    ``halfnorm(5)`` for every client; both plus ``shift`` (``--delay-shift``)."""
    if kind == "fixed":
        return DelayModel(speed="constant", speed_value=5.0, noise="half_normal", noise_scale=1.0, comm_time=shift)
    return DelayModel.ca2fl(scale_high=high, shift=shift)


def main_variant(setup: Ca2flSettings) -> Variant:
    """The main protocol: Mc = ``--concurrency``, M = ``--buffer``, per-client delay scales."""
    return Variant("main", setup.concurrency, setup.buffer)


def ablation_variants(setup: Ca2flSettings) -> list[Variant]:
    """The (Mc, M) points of Fig. 4 other than the main one (one sweep of each, or the full grid), and the fixed
    halfnorm(5) delays of Fig. 5(a)."""
    mcs = sorted({setup.concurrency, *setup.ablation_concurrency})
    ms = sorted({setup.buffer, *setup.ablation_buffer})
    points = ([(mc, m) for mc in mcs for m in ms if m <= mc] if setup.grid
              else [(mc, setup.buffer) for mc in mcs] + [(setup.concurrency, m) for m in ms])
    out, seen = [], {(setup.concurrency, setup.buffer)}
    for mc, m in points:
        if (mc, m) not in seen:
            seen.add((mc, m))
            out.append(Variant(f"Mc={mc}, M={m}", mc, m))
    if not setup.no_fixed_delay:
        out.append(Variant("fixed halfnorm(5)", setup.concurrency, setup.buffer, "fixed"))
    return out


def schedule_for(method: Method, variant: Variant, rounds: int, seed: int, setup: Ca2flSettings) -> Schedule:
    """A method's schedule of ``rounds`` global rounds (FedAsync: rounds x M client updates, one per step)."""
    delays = delay_model(variant.delays, setup.delay_high, setup.delay_shift)
    if method.kind == "fedasync":
        return make_schedule("concurrent", setup.clients, rounds * variant.buffer, delays, seed,
                             concurrency=variant.concurrency, buffer_size=1, refill="immediate")
    refill = "immediate" if method.kind == "immediate" else "boundary"
    return make_schedule("concurrent", setup.clients, rounds, delays, seed, concurrency=variant.concurrency,
                         buffer_size=variant.buffer, refill=refill)


# ------------------------------------------------------------------------------------------------ running
def hparams_for(method: Method, setting: Setting, setup: Ca2flSettings) -> dict[str, float]:
    """A method's hyper-parameters: Table 6's (eta_l, eta, weight decay), FedAsync's from Table 7."""
    hp = {"client_lr": setup.client_lr, "weight_decay": setup.weight_decay}
    if method.kind == "fedasync":
        t7 = fedasync_hparams(setting, method.key)
        hp.update(prox_mu=t7["rho"], alpha=t7["alpha"])
        if "beta" in t7:
            hp["staleness_a"] = t7["beta"]
    else:
        hp["server_lr"] = setup.server_lr
    return hp


def run_group(task: Task, local: LocalConfig, setting: Setting, method: Method, items: list[tuple[Variant, int, int]],
              setup: Ca2flSettings) -> list[dict]:
    """One compiled program: every (variant, seed) in ``items`` (variant, variant index, seed) as a replica, all
    with the same buffer width. Replica (v, s) has the schedule of timing seed ``s`` and the training seed
    ``setting_seed(v, s)``."""
    algorithm = get_algorithm(method.algorithm, **method.options)
    replicas = [ReplicaSpec(schedule_for(method, v, setup.rounds, s, setup), seed=setting_seed(j, s),
                            hparams=hparams_for(method, setting, setup),
                            label={"variant": v.name, "concurrency": v.concurrency, "buffer": v.buffer,
                                   "delays": v.delays, "timing_seed": s})
                for v, j, s in items]
    per_round = items[0][0].buffer if method.kind == "fedasync" else 1  # server steps per round
    stats = [schedule_summary(r.schedule) for r in replicas]
    frame = run_grid(task, algorithm, replicas, local=local, name=f"{setting.key} {method.label}",
                     eval_every=setup.eval_every * per_round, log_width=48,
                     per_replica=lambda _: {"tau_avg": [x["staleness_mean"] for x in stats],
                                            "tau_max": [x["staleness_max"] for x in stats]})
    frame["rounds"] = frame["step"] / per_round  # global rounds; FedAsync: client updates / M of the main protocol
    counted = "local_steps" in frame.columns
    runs = replica_runs(frame, ("variant", "concurrency", "buffer", "delays", "timing_seed", "seed", "tau_avg",
                                "tau_max", "diverged_at"),
                        {"rounds": "rounds", "uploads": "uploads", "times": "time", "accuracy": "test_accuracy",
                         "test_loss": "test_loss", **({"local_steps": "local_steps"} if counted else {})})
    return [{"setting": setting.key, "method": method.key, "variant": r["variant"], "concurrency": r["concurrency"],
             "buffer": r["buffer"], "delays": r["delays"], "seed": r["timing_seed"], "training_seed": r["seed"],
             "rounds": r["rounds"], "uploads": r["uploads"], "times": r["times"],
             "local_steps": r.get("local_steps"), "accuracy": r["accuracy"], "test_loss": r["test_loss"],
             "tau_avg": r["tau_avg"], "tau_max": r["tau_max"], "diverged_at": r["diverged_at"]} for r in runs]


def methods_for(setting: Setting, setup: Ca2flSettings) -> list[Method]:
    """The methods run on a setting (the Table 1 ones only on the first setting)."""
    first = setting.key == setup.settings[0].key
    return [METHODS[k] for k in METHODS if k in setup.methods and (first or not METHODS[k].table1_only)]


def run_setting(setting: Setting, dataset: Dataset, setup: Ca2flSettings) -> tuple[list[dict], dict]:
    """Every method of a setting (and, on the ablation setting, every ablation variant), one program per method and
    buffer width: the records of every run and the task's description."""
    task, local, info = make_setting_task(setting, dataset, setup)
    print(f"{setting.key}: {info['train_examples']} training examples, client sizes (min/median/max) "
          f"{info['client_sizes']}, local steps {info['local_steps']}, d = {info['num_params']}",
          file=sys.stderr, flush=True)
    ablate = setting.key == setup.ablation_setting.key and not setup.no_ablation
    extra = ablation_variants(setup) if ablate else []
    records = []
    for method in methods_for(setting, setup):
        items = [(main_variant(setup), 0, s) for s in setup.seeds]
        if method.key in ABLATION_METHODS:
            # The ablation's main point uses the ablation seeds too; seeds already run are not repeated.
            items += [(main_variant(setup), 0, s) for s in setup.ablation_seeds if extra and s not in setup.seeds]
            items += [(v, j + 1, s) for j, v in enumerate(extra) for s in setup.ablation_seeds]
        groups: dict[int, list] = {}
        for item in items:  # one program per buffer width (no padded jobs)
            groups.setdefault(item[0].buffer if method.kind != "fedasync" else 1, []).append(item)
        for group in groups.values():
            records += run_group(task, local, setting, method, group, setup)
    return records, info


# ------------------------------------------------------------------------------------------------ metrics
def run_metrics(rec: dict, target: float | None) -> dict:
    """Final, last-10%-of-rounds mean and best test accuracy, and R# (first round reaching ``target``)."""
    rounds, acc = np.asarray(rec["rounds"], float), np.asarray(rec["accuracy"], float)
    tail = acc[rounds >= 0.9 * rounds[-1]]
    return {"final": float(acc[-1]), "tail": float(np.mean(tail)), "best": float(np.nanmax(acc)),
            "r_target": first_passage(rounds, acc, target)}


def target_for(setting: Setting, setup: Ca2flSettings) -> float | None:
    """The accuracy of R#: ``--target``, else Table 1's for the CIFAR-10 models (None for the others)."""
    if setup.target is not None:
        return setup.target
    if setting.dataset == "cifar10":
        return PAPER_TARGET.get(setting.model)
    return None


def summarize(records: list[dict], setup: Ca2flSettings) -> list[dict]:
    """Mean and std over seeds of every metric, per (setting, method, variant)."""
    by_key = {s.key: s for s in setup.settings}
    groups: dict[tuple[str, str, str], list[dict]] = {}
    for rec in records:
        rec.update(run_metrics(rec, target_for(by_key[rec["setting"]], setup)))
        groups.setdefault((rec["setting"], rec["method"], rec["variant"]), []).append(rec)
    rows = []
    for (setting, method, variant), recs in groups.items():
        main_seeds = setup.seeds if variant == "main" else setup.ablation_seeds
        row = {"setting": setting, "method": method, "variant": variant, "concurrency": recs[0]["concurrency"],
               "buffer": recs[0]["buffer"], "delays": recs[0]["delays"], "seeds": [r["seed"] for r in recs],
               "main_seeds": [r["seed"] for r in recs if r["seed"] in main_seeds]}
        for key in ("final", "tail", "best", "r_target", "tau_avg", "tau_max"):
            for suffix, subset in (("", [r for r in recs if r["seed"] in main_seeds]),
                                   ("_ablation", [r for r in recs if r["seed"] in setup.ablation_seeds])):
                row[key + suffix], row[key + suffix + "_std"], count = finite_mean_std(r[key] for r in subset)
                if key == "r_target":
                    row["reached" + suffix] = count
                    row["runs" + suffix] = len(subset)
        row["diverged"] = sum(r["diverged_at"] >= 0 for r in recs)
        rows.append(row)
    return rows


def schedule_staleness(setup: Ca2flSettings, mc: int, m: int, delays: DelayModel) -> dict[str, Any]:
    """tau_avg and tau_max (mean over the seeds, and the range of tau_max) of ``delay_rounds``-round boundary-refill
    schedules with concurrency ``mc`` and buffer ``m``, and their arrival orders (``orders``)."""
    taus, maxes, orders = [], [], []
    for seed in setup.seeds:
        sched = make_schedule("concurrent", setup.clients, setup.delay_rounds, delays, seed, concurrency=mc,
                              buffer_size=m, refill="boundary")
        summary = schedule_summary(sched)
        taus.append(summary["staleness_mean"])
        maxes.append(summary["staleness_max"])
        orders.append(sched.arrival_clients)
    return {"tau_avg": float(np.mean(taus)), "tau_max": float(np.mean(maxes)), "tau_max_range": [min(maxes),
            max(maxes)], "expected": (mc - m) / m, "orders": orders}


def delay_tables(setup: Ca2flSettings) -> dict[str, Any]:
    """Tables 4 and 5: tau_max / tau_avg of ``delay_rounds``-round boundary-refill schedules (mean over the seeds)
    for every (Mc, M) of the ablation and every delay distribution of Table 5, plus the digest's calibration (+5 per
    job), and whether the three uniform scales give the same order of events."""
    mcs = sorted({setup.concurrency, *setup.ablation_concurrency})
    ms = sorted({setup.buffer, *setup.ablation_buffer})
    points = sorted({(mc, setup.buffer) for mc in mcs} | {(setup.concurrency, m) for m in ms}
                    | ({(mc, m) for mc in mcs for m in ms if m <= mc} if setup.grid else set()))
    protocol = []
    for mc, m in points:
        s = schedule_staleness(setup, mc, m, delay_model("random", setup.delay_high, setup.delay_shift))
        s.pop("orders")
        protocol.append({"concurrency": mc, "buffer": m, **s, "paper": PAPER_DELAYS.get((mc, m))})
    mc, m = setup.concurrency, setup.buffer
    dists = {}
    for name, delays in (("U(0,5)", delay_model("random", 5.0, 0.0)), ("U(0,1)", delay_model("random", 1.0, 0.0)),
                         ("U(0,0.5)", delay_model("random", 0.5, 0.0)),
                         ("fixed halfnorm(5)", delay_model("fixed", 5.0, 0.0)),
                         ("U(0,5) + 5 (digest calibration)", DelayModel.ca2fl(5.0, shift=5.0))):
        dists[name] = {**schedule_staleness(setup, mc, m, delays), "paper": PAPER_DELAY_DISTRIBUTIONS.get(name)}
    same = all(np.array_equal(a, b) and np.array_equal(a, c) for a, b, c in zip(
        dists["U(0,5)"]["orders"], dists["U(0,1)"]["orders"], dists["U(0,0.5)"]["orders"]))
    for d in dists.values():
        d.pop("orders")
    return {"rounds": setup.delay_rounds, "seeds": list(setup.seeds), "protocol": protocol, "distributions": dists,
            "uniform_scales_same_events": bool(same), "shift": setup.delay_shift}


# ------------------------------------------------------------------------------------------------ checks, tables
def _at(rows: list[dict]) -> dict[tuple[str, str, str], dict]:
    """The rows by (setting, method, variant)."""
    return {(r["setting"], r["method"], r["variant"]): r for r in rows}


def direction_checks(rows: list[dict], setup: Ca2flSettings) -> list[str]:
    """The paper's claims, checked on the measured means (final accuracy over the main seeds)."""
    at = _at(rows)

    def final(setting: str, method: str, variant: str = "main", key: str = "final") -> float | None:
        row = at.get((setting, method, variant))
        return None if row is None else row[key]

    return comparison_checks(final, setup) + ablation_checks(rows, at, setup)


def comparison_checks(final: Any, setup: Ca2flSettings) -> list[str]:
    """Tables 1-3: CA2FL above Async FL (and more so at the smaller alpha), MF-CA2FL close to CA2FL at 8 and 4 bits
    and below it at 2, FedAsync below CA2FL. ``final(setting, method, key=...)`` reads a measured mean."""
    out = []
    keys = [s.key for s in setup.settings]
    pairs = [(k, final(k, "ca2fl"), final(k, "asyncfl")) for k in keys]
    pairs = [(k, c, a) for k, c, a in pairs if c is not None and a is not None]
    if pairs:
        wins = [k for k, c, a in pairs if c > a]
        out.append("CA2FL above Async FL (final accuracy) in every setting: "
                   f"{yes_no(len(wins) == len(pairs))} ({len(wins)}/{len(pairs)}; gaps "
                   + ", ".join(f"{k} {100 * (c - a):+.2f}" for k, c, a in pairs) + " points; paper: +0.8 to +11.1)")
        tails = [(k, final(k, "ca2fl", key="tail"), final(k, "asyncfl", key="tail")) for k, _, _ in pairs]
        wins = [k for k, c, a in tails if c > a]
        out.append(f"... on the mean of the last 10% of rounds: {yes_no(len(wins) == len(tails))} "
                   f"({len(wins)}/{len(tails)})")
        by_task: dict[tuple[str, str], list[tuple[float, float]]] = {}
        for k, c, a in pairs:
            s = parse_setting(k)
            by_task.setdefault((s.dataset, s.model), []).append((s.alpha, c - a))
        for (dataset, model), gaps in by_task.items():
            if len(gaps) > 1:
                gaps.sort()
                grows = gaps[0][1] > gaps[-1][1]
                out.append(f"The gap is larger at the smaller alpha ({dataset} {model}): {yes_no(grows)} "
                           f"(alpha {gaps[0][0]:g}: {100 * gaps[0][1]:+.2f}, alpha {gaps[-1][0]:g}: "
                           f"{100 * gaps[-1][1]:+.2f} points)")
    for bits in (8, 4):
        cells = [(k, final(k, f"mf{bits}"), final(k, "ca2fl")) for k in keys]
        cells = [(k, m, c) for k, m, c in cells if m is not None and c is not None]
        if cells:
            ok = [k for k, m, c in cells if m >= c - 0.02]
            out.append(f"MF-CA2FL ({bits} bits) at most 2 points below CA2FL in every setting: "
                       f"{yes_no(len(ok) == len(cells))} (" + ", ".join(
                           f"{k} {100 * (m - c):+.2f}" for k, m, c in cells) + ")")
    first = keys[0]
    m2, c, a = final(first, "mf2"), final(first, "ca2fl"), final(first, "asyncfl")
    if m2 is not None and c is not None:
        out.append(f"MF-CA2FL (2 bits) clearly below CA2FL (> 2 points) in {first}: {yes_no(m2 < c - 0.02)}"
                   f" ({100 * (m2 - c):+.2f} points; paper: -12.1 CNN, -26.0 ResNet-18)")
    for key in ("fedasync_constant", "fedasync_polynomial"):
        f = final(first, key)
        if f is not None and c is not None:
            out.append(f"{METHODS[key].label} below CA2FL at equal client updates in {first}: "
                       f"{yes_no(f < c)} ({100 * (f - c):+.2f} points)")
    return out


def ablation_checks(rows: list[dict], at: dict[tuple[str, str, str], dict], setup: Ca2flSettings) -> list[str]:
    """Fig. 4 and Fig. 5a on the ablation setting: CA2FL less sensitive to (Mc, M) and above Async FL at every point;
    fixed delays lower both methods."""
    out = []
    abl = setup.ablation_setting.key
    sweep = [r for r in rows if r["setting"] == abl and r["delays"] == "random" and r["method"] in ABLATION_METHODS
             and r["final_ablation"] is not None]
    points = sorted({(r["concurrency"], r["buffer"]) for r in sweep})
    if len(points) > 1:
        acc = {(r["method"], r["concurrency"], r["buffer"]): r["final_ablation"] for r in sweep}
        both = [p for p in points if ("ca2fl", *p) in acc and ("asyncfl", *p) in acc]
        if both:
            spread = {m: max(acc[(m, *p)] for p in both) - min(acc[(m, *p)] for p in both) for m in ABLATION_METHODS}
            out.append(f"CA2FL less sensitive to (Mc, M) than Async FL (range of final accuracy over {len(both)} "
                       f"points): {yes_no(spread['ca2fl'] < spread['asyncfl'])} (CA2FL "
                       f"{100 * spread['ca2fl']:.2f}, Async FL {100 * spread['asyncfl']:.2f} points)")
            wins = [p for p in both if acc[("ca2fl", *p)] > acc[("asyncfl", *p)]]
            out.append(f"CA2FL above Async FL at every (Mc, M): {yes_no(len(wins) == len(both))} "
                       f"({len(wins)}/{len(both)})")
    fixed = {r["method"]: r for r in rows if r["setting"] == abl and r["delays"] == "fixed"}
    if fixed:
        lower = []
        for m, r in fixed.items():
            base = at.get((abl, m, "main"))
            if base is not None and base["final_ablation"] is not None:
                lower.append((m, r["final_ablation"] - base["final_ablation"]))
        if lower:
            out.append("Fixed halfnorm(5) delays lower both methods (Fig. 5a): "
                       f"{yes_no(all(d < 0 for _, d in lower))} (" + ", ".join(
                           f"{METHODS[m].label} {100 * d:+.2f}" for m, d in lower) + " points)")
    return out


def pct(value: float | None, std: float | None = None) -> str:
    """An accuracy in percent with two decimals (``± std`` when given), ``-`` for None."""
    if value is None:
        return "-"
    return f"{100 * value:.2f}" + (f" ± {100 * std:.2f}" if std is not None else "")


def paper_cell(ref: tuple | None, method: str) -> str:
    """The paper's ``mean ± std`` of a method in the row ``ref`` of Tables 2-3, ``-`` if none."""
    if ref is None or method not in PAPER_ACCURACY.get(ref, {}):
        return "-"
    mean, std = PAPER_ACCURACY[ref][method]
    return f"{mean:.2f} ± {std:.2f}"


def r_cell(row: dict | None, rounds: int) -> str:
    """R#: the mean first round reaching the target (``(k/n)`` when k of n runs did; ``rounds+`` if none did)."""
    if row is None or row.get("runs", 0) == 0:
        return "-"
    if row["reached"] == 0:
        return f"{rounds}+"
    text = f"{row['r_target']:.0f}"
    return text if row["reached"] == row["runs"] else f"{text} ({row['reached']}/{row['runs']})"


def format_table(rows: list[dict], delays: dict, infos: dict, setup: Ca2flSettings, seconds: float) -> str:
    """``table.md``: the setup and tasks, Tables 2-3 and Table 1 beside the paper's, the ablation, the delay tables
    (4 and 5), the claims and the diverged runs."""
    at = _at(rows)
    lines = task_lines(infos, setup) + accuracy_lines(at, setup) + table1_lines(at, setup)
    lines += ablation_lines(rows, setup) + delay_lines(delays, setup)
    checks = direction_checks(rows, setup)
    if checks:
        lines += ["**The paper's claims, on these means**", ""] + [f"- {c}" for c in checks] + [""]
    diverged = [f"{r['setting']} {r['method']} {r['variant']}" for r in rows if r["diverged"]]
    if diverged:
        lines += ["Diverged (NaN) runs: " + "; ".join(diverged), ""]
    lines.append(f"Wall time: {seconds:.0f} s.")
    return "\n".join(lines) + "\n"


def task_lines(infos: dict, setup: Ca2flSettings) -> list[str]:
    """The setup paragraph and one row per task (sizes, local steps, parameters, the paper row beside it)."""
    keys = [s.key for s in setup.settings]
    by_key = {s.key: s for s in setup.settings}
    lines = [f"CA2FL reproduction, --scale {setup.scale}: {setup.clients} clients, Mc = {setup.concurrency}, "
             f"M = {setup.buffer} (boundary refill), {setup.rounds} global rounds, eta_l = {setup.client_lr:g}, "
             f"eta = {setup.server_lr:g}, {setup.local_epochs:g} local epochs at batch {setup.batch_size}, "
             f"weight decay {setup.weight_decay:g}, job times |N(0, s_i^2)| with s_i ~ U(0, {setup.delay_high:g})"
             + (f" + {setup.delay_shift:g}" if setup.delay_shift else "") + f"; mean ± std over seeds {setup.seeds}. "
             "Accuracies in %.", ""]
    lines += ["**Tasks**", "", "| setting | training examples | client size min / median / max | local steps K_i | "
              "parameters | paper row beside it |", "|---|---|---|---|---|---|"]
    for k in keys:
        info = infos.get(k)
        if info:
            lo, med, hi = info["client_sizes"]
            klo, kmed, khi = info["local_steps"]
            lines.append(f"| {k} | {info['train_examples']} | {lo} / {med:g} / {hi} | {klo} / {kmed:g} / {khi} | "
                         f"{info['num_params']:,} | {paper_reference(by_key[k])[1]} |")
    lines.append("")
    return lines


def accuracy_lines(at: dict[tuple[str, str, str], dict], setup: Ca2flSettings) -> list[str]:
    """Tables 2 and 3: final and last-10% accuracy of every method per setting, beside the paper's, and the gap."""
    keys = [s.key for s in setup.settings]
    by_key = {s.key: s for s in setup.settings}
    main_methods = [m for m in METHODS if m in setup.methods and not METHODS[m].table1_only]
    lines = ["**Tables 2 and 3: final test accuracy after the last round (measured / mean of the last 10% of rounds "
              "/ paper)**", ""]
    head = "| method | " + " | ".join(f"{k}: final | last 10% | paper" for k in keys) + " |"
    lines += [head, "|---|" + "---|---|---|" * len(keys)]
    for m in main_methods:
        cells = []
        for k in keys:
            row = at.get((k, m, "main"))
            ref = paper_reference(by_key[k])[0]
            cells.append(" | ".join([pct(row and row["final"], row and row["final_std"]),
                                     pct(row and row["tail"], row and row["tail_std"]), paper_cell(ref, m)]))
        lines.append(f"| {METHODS[m].label} | " + " | ".join(cells) + " |")
    gap_cells = []
    for k in keys:
        c, a = at.get((k, "ca2fl", "main")), at.get((k, "asyncfl", "main"))
        ref = paper_reference(by_key[k])[0]
        paper_gap = (f"{PAPER_ACCURACY[ref]['ca2fl'][0] - PAPER_ACCURACY[ref]['asyncfl'][0]:+.2f}"
                     if ref in PAPER_ACCURACY else "-")
        if c and a:
            gap_cells.append(f"{100 * (c['final'] - a['final']):+.2f} | {100 * (c['tail'] - a['tail']):+.2f} | "
                             f"{paper_gap}")
        else:
            gap_cells.append(f"- | - | {paper_gap}")
    if "ca2fl" in main_methods and "asyncfl" in main_methods:
        lines.append("| gap CA2FL - Async FL | " + " | ".join(gap_cells) + " |")
    lines.append("")
    return lines


def table1_lines(at: dict[tuple[str, str, str], dict], setup: Ca2flSettings) -> list[str]:
    """Table 1 on the first setting: final and best accuracy and R# of every method, beside the paper's."""
    first = setup.settings[0]
    t1 = [m for m in ("asyncfl", "ca2fl", "mf8", "mf4", "mf2", "fedbuff_immediate", "fedasync_constant",
                      "fedasync_polynomial") if m in setup.methods]
    target = target_for(first, setup)
    paper_t1 = PAPER_TABLE1.get(first.model if first.model in PAPER_TABLE1 else "ca2fl_cnn")
    same = first.dataset == "cifar10" and first.model in PAPER_TABLE1
    paper_model = "same model" if same else "CIFAR-10 CNN, reference"
    target_text = f"{100 * target:g}%" if target is not None else "none"
    lines = [f"**Table 1 ({first.key}): final accuracy, best accuracy and R# (first round with test accuracy >= "
              f"{target_text}; FedAsync: client updates / {setup.buffer}); paper Table 1 ({paper_model}, one run, "
              f"R# at {100 * PAPER_TARGET.get(first.model, 0.5):g}%)**", "",
              "| method | final | best | R# | paper acc. | paper R# |", "|---|---|---|---|---|---|"]
    for m in t1:
        row = at.get((first.key, m, "main"))
        if row is None:
            continue
        p = paper_t1.get(m)
        paper_acc = f"{p[0]:.2f}" if p else "-"
        paper_r = ("500+" if p[1] is None else str(p[1])) if p else "-"
        lines.append(f"| {METHODS[m].label} | {pct(row['final'], row['final_std'])} | "
                     f"{pct(row['best'], row['best_std'])} | {r_cell(row, setup.rounds)} | {paper_acc} | {paper_r} |")
    lines.append("")
    return lines


def ablation_lines(rows: list[dict], setup: Ca2flSettings) -> list[str]:
    """Fig. 4 and Fig. 5a: final accuracy of Async FL and CA2FL at every ablation point (when there are several)."""
    lines: list[str] = []
    abl = setup.ablation_setting.key
    sweep = sorted([r for r in rows if r["setting"] == abl and r["method"] in ABLATION_METHODS
                    and r["final_ablation"] is not None],
                   key=lambda r: (r["delays"] != "random", r["concurrency"], r["buffer"]))
    points = []
    for r in sweep:
        if (r["concurrency"], r["buffer"], r["delays"]) not in points:
            points.append((r["concurrency"], r["buffer"], r["delays"]))
    if len(points) > 1:
        acc = {(r["method"], r["concurrency"], r["buffer"], r["delays"]): r for r in sweep}
        lines += [f"**Ablation (Fig. 4, Fig. 5a) on {abl}: final accuracy, seeds {setup.ablation_seeds}, "
                  f"{setup.rounds} rounds each**", "",
                  "| Mc | M | delays | tau_avg | tau_max | Async FL | CA2FL | CA2FL - Async FL |",
                  "|---|---|---|---|---|---|---|---|"]
        for mc, m, d in points:
            a, c = acc.get(("asyncfl", mc, m, d)), acc.get(("ca2fl", mc, m, d))
            ref = a or c
            gap = f"{100 * (c['final_ablation'] - a['final_ablation']):+.2f}" if a and c else "-"
            dname = "s_i ~ U(0, %g)" % setup.delay_high if d == "random" else "halfnorm(5)"
            lines.append(f"| {mc} | {m} | {dname} | {ref['tau_avg_ablation']:.3f} | {ref['tau_max_ablation']:.0f} | "
                         f"{pct(a and a['final_ablation'])} | {pct(c and c['final_ablation'])} | {gap} |")
        lines.append("")
    return lines


def delay_lines(delays: dict, setup: Ca2flSettings) -> list[str]:
    """Tables 4 and 5: the staleness of the schedules beside the paper's."""
    lines = [f"**Table 4: delays of {delays['rounds']}-round schedules (mean over seeds {delays['seeds']}; "
              f"job times {'+ %g' % delays['shift'] if delays['shift'] else 'without shift'})**", "",
              "| Mc | M | tau_avg | (Mc - M) / M | paper tau_avg | tau_max (range) | paper tau_max |",
              "|---|---|---|---|---|---|---|"]
    for p in delays["protocol"]:
        paper = p["paper"]
        lines.append(f"| {p['concurrency']} | {p['buffer']} | {p['tau_avg']:.3f} | {p['expected']:.3f} | "
                     f"{paper[1] if paper else '-'} | {p['tau_max']:.1f} ({p['tau_max_range'][0]}-"
                     f"{p['tau_max_range'][1]}) | {paper[0] if paper else '-'} |")
    lines += ["", f"**Table 5: delay distributions (Mc = {setup.concurrency}, M = {setup.buffer})**", "",
              "| job times | tau_avg | paper tau_avg | tau_max (range) | paper tau_max |", "|---|---|---|---|---|"]
    for name, d in delays["distributions"].items():
        paper = d["paper"]
        lines.append(f"| {name} | {d['tau_avg']:.3f} | {paper[1] if paper else '-'} | {d['tau_max']:.1f} "
                     f"({d['tau_max_range'][0]}-{d['tau_max_range'][1]}) | "
                     f"{paper[0] if paper and paper[0] is not None else '-'} |")
    lines += ["", "U(0,5), U(0,1) and U(0,0.5) give the same order of events (so the same training): "
              f"{yes_no(delays['uniform_scales_same_events'])}.", ""]
    return lines


# ------------------------------------------------------------------------------------------------ verdicts
# The claims with a direction (Tables 1-3): (claim, method, baseline); the paper's numbers come from the CIFAR-10 CNN
# at the same alpha (Table 2) and, for 2 bits, Table 1.
CLAIMS = (("CA2FL above Async FL", "ca2fl", "asyncfl"), ("MF-CA2FL 8 bits above Async FL", "mf8", "asyncfl"),
          ("MF-CA2FL 4 bits above Async FL", "mf4", "asyncfl"), ("CA2FL above MF-CA2FL 4 bits", "ca2fl", "mf4"),
          ("CA2FL above MF-CA2FL 2 bits", "ca2fl", "mf2"))


def paper_claim_text(setting: Setting, method: str, baseline: str) -> str:
    """The paper's numbers of a claim: Table 2's CNN row at the setting's alpha (Table 1 for 2 bits)."""
    ref = ("cifar10", "ca2fl_cnn", setting.alpha)
    if method == "ca2fl" and baseline == "mf2":
        t1 = PAPER_TABLE1["ca2fl_cnn"]
        return f"{t1['ca2fl'][0]:.2f} vs {t1['mf2'][0]:.2f} (Table 1, CNN Dir(0.3))"
    if ref in PAPER_ACCURACY and method in PAPER_ACCURACY[ref] and baseline in PAPER_ACCURACY[ref]:
        (a, sa), (b, sb) = PAPER_ACCURACY[ref][method], PAPER_ACCURACY[ref][baseline]
        return f"{a:.2f} ± {sa:.2f} vs {b:.2f} ± {sb:.2f} (CNN)"
    return "-"


def setting_verdicts(records: list[dict], setup: Ca2flSettings) -> dict[str, list]:
    """Per setting, the verdicts on :data:`CLAIMS` over the main seeds, at equal uploads, virtual time and local
    computation (the methods of one protocol share the schedule, so the three budgets agree for them)."""
    out = {}
    for setting in setup.settings:
        runs = {m: [r for r in records if r["setting"] == setting.key and r["method"] == m
                    and r["variant"] == "main" and r["seed"] in setup.seeds] for m in METHODS}
        claims = [(text, m, b, paper_claim_text(setting, m, b)) for text, m, b in CLAIMS]
        out[setting.key] = claim_verdicts(runs, claims)
    return out


def main_fastest_share(setup: Ca2flSettings) -> float:
    """The share of uploads made by the fastest 20% of the clients in the main protocol's schedules (mean over the
    seeds; the same for every method of the boundary-refill protocol)."""
    method, variant = METHODS["asyncfl"], main_variant(setup)
    delays = delay_model(variant.delays, setup.delay_high, setup.delay_shift)
    return float(np.mean([schedule_fastest_share(schedule_for(method, variant, setup.rounds, seed, setup), delays,
                                                 seed) for seed in setup.seeds]))


def plot_verdict_figures(records: list[dict], setup: Ca2flSettings) -> list[str]:
    """``claims_<dataset>_<model>_<alpha>.png``: per setting, one line per method with a band over the main seeds,
    against uploads, virtual time and local steps (:func:`asyncfl_jax.reproduce.verdicts.plot_methods`)."""
    written = []
    for setting in setup.settings:
        runs = {m: [r for r in records if r["setting"] == setting.key and r["method"] == m
                    and r["variant"] == "main" and r["seed"] in setup.seeds] for m in METHODS}
        name = f"claims_{setting.dataset}_{setting.model}_{setting.alpha:g}.png"
        plot_methods(runs, os.path.join(setup.out, name),
                     f"{setting.title}, n = {setup.clients}, Mc = {setup.concurrency}, M = {setup.buffer}, "
                     f"eta_l = {setup.client_lr:g}", labels={k: m.label for k, m in METHODS.items()})
        written.append(name)
    return written


# ------------------------------------------------------------------------------------------------ figures
STYLE = {"asyncfl": ("C0", "--"), "ca2fl": ("C3", "-"), "mf8": ("C1", "-"), "mf4": ("C2", "-"), "mf2": ("C4", "-"),
         "fedbuff_immediate": ("C7", ":"), "fedasync_constant": ("C5", "-."), "fedasync_polynomial": ("C8", "-.")}


def plot(records: list[dict], rows: list[dict], setup: Ca2flSettings) -> list[str]:
    """The figures: ``accuracy.png`` (Fig. 2), ``fedasync.png`` (Fig. 6, with FedAsync), ``ablation.png`` (Fig. 4 and
    5a, with an ablation) and, with ``--grid``, ``heatmap.png``; returns the names written."""
    main = [r for r in records if r["variant"] == "main" and r["seed"] in setup.seeds]
    ablation = [r for r in records if r["setting"] == setup.ablation_setting.key and r["method"] in ABLATION_METHODS
                and r["seed"] in setup.ablation_seeds]
    written = [plot_accuracy(main, setup), plot_fedasync(main, setup), plot_ablation(ablation, setup)]
    if setup.grid and len({r["variant"] for r in ablation}) > 1:
        written.append(plot_grid(rows, setup))
    return [name for name in written if name]


def plot_accuracy(main: list[dict], setup: Ca2flSettings) -> str:
    """Fig. 2: test accuracy against global rounds, one panel per setting (FedAsync left out)."""
    plt = pyplot()
    keys = [s.key for s in setup.settings]
    cols = min(len(keys), 3)
    nrows = math.ceil(len(keys) / cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(4.6 * cols, 3.5 * nrows), squeeze=False)
    for ax, k in zip(axes.flat, keys):
        for m in METHODS:
            recs = [r for r in main if r["setting"] == k and r["method"] == m and METHODS[m].kind != "fedasync"]
            if recs:
                color, ls = STYLE[m]
                ax.plot(*mean_of_aligned(recs, "rounds"), ls, color=color, label=METHODS[m].label, linewidth=1.3)
        label_axes(ax, next(s.title for s in setup.settings if s.key == k), "global round", "test accuracy")
    for ax in axes.flat[len(keys):]:
        ax.axis("off")
    fig.tight_layout()
    return save_png(fig, setup.out, "accuracy.png")


def plot_fedasync(main: list[dict], setup: Ca2flSettings) -> str | None:
    """Fig. 6: CA2FL and Async FL against FedAsync on the first setting, against client updates."""
    plt = pyplot()
    first = setup.settings[0].key
    fa = [r for r in main if r["setting"] == first]
    if not any(METHODS[r["method"]].kind == "fedasync" for r in fa):
        return None
    fig, ax = plt.subplots(figsize=(5.5, 3.8))
    for m in ("asyncfl", "ca2fl", "fedasync_constant", "fedasync_polynomial"):
        recs = [r for r in fa if r["method"] == m]
        if recs:
            color, ls = STYLE[m]
            ax.plot(*mean_of_aligned(recs, "uploads"), ls, color=color, label=METHODS[m].label)
    label_axes(ax, f"Fig. 6: CA2FL vs FedAsync, {setup.settings[0].title}", "client updates received", "test accuracy")
    fig.tight_layout()
    return save_png(fig, setup.out, "fedasync.png")


def plot_ablation(ab: list[dict], setup: Ca2flSettings) -> str | None:
    """Fig. 4 and 5a: Async FL and CA2FL over Mc, over M and under fixed delays."""
    plt = pyplot()
    abl = setup.ablation_setting.key
    if len({r["variant"] for r in ab}) < 2:
        return None
    fig, axes = plt.subplots(2, 3, figsize=(14, 7), squeeze=False)
    for i, m in enumerate(ABLATION_METHODS):
        mine = [r for r in ab if r["method"] == m]
        sweeps = (("concurrency", lambda r: r["buffer"] == setup.buffer and r["delays"] == "random",
                   lambda r: f"Mc = {r['concurrency']}"),
                  ("buffer", lambda r: r["concurrency"] == setup.concurrency and r["delays"] == "random",
                   lambda r: f"M = {r['buffer']}"),
                  ("delays", lambda r: r["concurrency"] == setup.concurrency and r["buffer"] == setup.buffer,
                   lambda r: "halfnorm(5) for all" if r["delays"] == "fixed" else
                   f"s_i ~ U(0, {setup.delay_high:g})"))
        for j, (field, keep, label) in enumerate(sweeps):
            ax = axes[i][j]
            picked = sorted([r for r in mine if keep(r)],
                            key=lambda r: (r[field] != "random" if field == "delays" else r[field], r["seed"]))
            labels = []
            for r in picked:
                if label(r) not in labels:
                    labels.append(label(r))
            for lab in labels:
                recs = [r for r in picked if label(r) == lab]
                tau = np.mean([r["tau_avg"] for r in recs])
                ax.plot(*mean_of_aligned(recs, "rounds"), label=f"{lab} (tau_avg {tau:.2f})", linewidth=1.2)
            swept = {"concurrency": "Mc", "buffer": "M", "delays": "delays"}[field]
            label_axes(ax, f"{METHODS[m].label}: {swept}", "global round", "test accuracy")
    fig.suptitle(f"Ablations on {next(s.title for s in setup.settings if s.key == abl)} (Fig. 4, Fig. 5a)",
                 fontsize=11)
    fig.tight_layout()
    return save_png(fig, setup.out, "ablation.png")


def plot_grid(rows: list[dict], setup: Ca2flSettings) -> str:
    """The full Mc x M grid of the ablation (``--grid``) as heat maps of the final accuracy and the gap."""
    plt = pyplot()
    abl = setup.ablation_setting.key
    sweep = [r for r in rows if r["setting"] == abl and r["delays"] == "random" and r["method"] in ABLATION_METHODS
             and r["final_ablation"] is not None]
    mcs = sorted({r["concurrency"] for r in sweep})
    ms = sorted({r["buffer"] for r in sweep})
    grid = {m: np.full((len(mcs), len(ms)), np.nan) for m in ABLATION_METHODS}
    for r in sweep:
        grid[r["method"]][mcs.index(r["concurrency"]), ms.index(r["buffer"])] = 100 * r["final_ablation"]
    panels = [(METHODS[m].label, grid[m], "viridis") for m in ABLATION_METHODS]
    panels.append(("CA2FL - Async FL (points)", grid["ca2fl"] - grid["asyncfl"], "RdBu"))
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8))
    for ax, (title, values, cmap) in zip(axes, panels):
        finite = values[np.isfinite(values)]
        kw = {}
        if cmap == "RdBu" and finite.size:
            lim = max(float(np.abs(finite).max()), 1e-6)
            kw = {"vmin": -lim, "vmax": lim}
        im = ax.imshow(values, cmap=cmap, origin="lower", aspect="auto", **kw)
        for a in range(len(mcs)):
            for b in range(len(ms)):
                if np.isfinite(values[a, b]):
                    ax.text(b, a, f"{values[a, b]:.1f}", ha="center", va="center", fontsize=8)
        ax.set_xticks(range(len(ms)), [str(m) for m in ms])
        ax.set_yticks(range(len(mcs)), [str(m) for m in mcs])
        ax.set_xlabel("buffer M")
        ax.set_ylabel("concurrency Mc")
        ax.set_title(f"{title}, final acc. (%)", fontsize=10)
        fig.colorbar(im, ax=ax)
    fig.tight_layout()
    return save_png(fig, setup.out, "heatmap.png")


# ------------------------------------------------------------------------------------------------ main
def main(argv: list[str] | None = None) -> int:
    """The command: runs every setting (and the ablation) of the arguments and writes ``table.md``, ``results.json``
    and the figures to ``--out``; 2 when a dataset is not available."""
    return command_main(argv, parse_settings, run_all, write_report, load=check_available)


def check_available(setup: Ca2flSettings) -> dict[str, Dataset]:
    """Every setting's dataset, each loaded once; ``DataUnavailable`` when one cannot be read (:func:`check_data`) or
    a setting's Dirichlet split cannot be drawn (:func:`partition_problem`): before anything is compiled, not after
    the first settings' runs."""
    problem = check_data(setup)
    if problem:
        raise DataUnavailable(problem)
    datasets = {name: load_setting_dataset(name, setup) for name in dict.fromkeys(s.dataset for s in setup.settings)}
    problem = partition_problem(setup, datasets)
    if problem:
        raise DataUnavailable(problem)
    return datasets


def run_all(setup: Ca2flSettings, datasets: dict[str, Dataset]) -> dict[str, Any]:
    """Every setting (its dataset from :func:`check_available`): the runs, the tasks' descriptions and the delay
    tables."""
    delays = delay_tables(setup)
    records, infos = [], {}
    for setting in setup.settings:
        recs, infos[setting.key] = run_setting(setting, datasets[setting.dataset], setup)
        records += recs
    return {"runs": records, "tasks": infos, "delays": delays}


def write_report(setup: Ca2flSettings, results: dict[str, Any], seconds: float) -> str:
    """``table.md``, ``results.json`` and the figures; returns the table."""
    records, infos, delays = results["runs"], results["tasks"], results["delays"]
    rows = summarize(records, setup)
    table = format_table(rows, delays, infos, setup, seconds)
    verdicts = setting_verdicts(records, setup)
    table += "\n".join(line for key, vs in verdicts.items()
                       for line in ["", *verdict_lines(vs, f"Verdicts, {key}, seeds {setup.seeds}")]) + "\n"
    table += participation_line({f"Mc = {setup.concurrency}, M = {setup.buffer}, s_i ~ U(0, {setup.delay_high:g})":
                                 main_fastest_share(setup)}) + "\n"
    saved_args = {k: ([s.key for s in v] if k == "settings" else v.key if k == "ablation_setting" else v)
                  for k, v in vars(setup).items()}
    write_outputs(setup.out, table, {"args": saved_args, "tasks": infos, "results": rows,
                                    "checks": direction_checks(rows, setup), "delays": delays, "runs": records,
                                    "verdicts": {k: [verdict_json(v) for v in vs] for k, vs in verdicts.items()},
                                    "seconds": round(seconds, 1)})
    plot(records, rows, setup)
    plot_verdict_figures(records, setup)
    return table
