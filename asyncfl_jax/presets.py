"""The hyper-parameters the papers selected, as ready-made runs (``asyncfl run --preset NAME``).

A preset is named ``<paper>/<task>/<method>`` and gives the algorithm, its options and hyper-parameters, the protocol
and the local-training settings of that method in that paper's experiments. ``asyncfl run --preset`` puts them into
the configuration (so ``config.json`` holds the expanded values); other command-line options given with it override
them.

AsyncFedED (Wang et al. 2022; digest 001, Tables 1-4 and App. B.4). Every method uses SGD with momentum 0.5 and
K = 10 local steps (AsyncFedED: K_init = 10), batch 10 (the paper gives none; digest recommendation), local learning
rate 0.01 (Synthetic, FEMNIST) or 1.0 (Shakespeare):

============  ==========================================  ===========  ===========  ===========
method        hyper-parameters                            Synthetic    FEMNIST      Shakespeare
============  ==========================================  ===========  ===========  ===========
asyncfeded    lambda, epsilon (= lambda / (lambda/eps))   5, 5         1, 1         5, 10
              gamma_bar, kappa                            3, 1         3, 0.05      3, 1
fedasync_     alpha                                       0.1          0.5          0.1
constant
fedasync_     alpha (the Constant alpha; not stated),     0.1; 5, 5    0.5; 0.5,    0.1; 15, 15
hinge         a, b                                                     0.5
fedprox       mu (synchronous rounds of all clients)      0.1          1            0.01
fedavg        (synchronous rounds of all clients)         -            -            -
============  ==========================================  ===========  ===========  ===========

Each preset carries its task: Synthetic(1, 1) with its 10 natural clients and the MLP 60-200-200-10 (digest 001,
sections 5.1, 5.2 and 6.1); FEMNIST (10 writers drawn with ``data.seed``, ``femnist_cnn``) and Shakespeare (10
speaking roles, ``shakespeare_lstm``) read LEAF's files or Flower's parquet files (:mod:`asyncfl_jax.data.leaf`),
which nothing downloads: ``asyncfl run --preset asyncfeded/femnist/... --set data.path=<folder>`` runs when the files
are there, and without them stops with exit code 2 saying how to get them (the check of ``config.validate``).

CPU-scale CNN presets (``ca2fl/cpu_cnn/...``, ``ace/cpu_cnn/ace``, ``asyncfeded/cpu_cnn/...``,
``asynflc_ef/cpu_cnn/...``): the papers' CNN experiments sized to run in minutes on 2 CPU cores, on the Debian
Fashion-MNIST files (see ``_cpu_cnn_presets``);
each sets its own number of uploads (``arrivals``). AREA has none: its experiments use logistic regression only.

Not reproduced: the paper decays the local learning rate by 0.995 (per local round, digest recommendation); here it
is constant. AsyncFedED's K is capped at 50 (the paper has no cap; digest 001, section 2.6).
"""

from __future__ import annotations

import copy
import difflib
from typing import Any

_ASYNC = {"name": "event_clock"}  # every client always training, one arrival per step, durations follow K
_SYNC = {"name": "synchronous", "participants": None}

_ASYNCFEDED_DATA = {
    # task: (data section, model section) of the configuration
    "synthetic": ({"name": "synthetic", "num_clients": 10, "partition": "natural", "synthetic_alpha": 1.0,
                   "synthetic_beta": 1.0}, {"name": "mlp", "hidden": [200, 200]}),
    "femnist": ({"name": "leaf/femnist", "num_clients": 10, "partition": "natural"}, {"name": "femnist_cnn"}),
    "shakespeare": ({"name": "leaf/shakespeare", "num_clients": 10, "partition": "natural"},
                    {"name": "shakespeare_lstm"}),
}

_ASYNCFEDED_TASKS = {
    # task: (local lr, AsyncFedED (lambda, epsilon, gamma_bar, kappa), Constant alpha, Hinge (a, b), FedProx mu)
    "synthetic": (0.01, (5.0, 5.0, 3.0, 1.0), 0.1, (5.0, 5.0), 0.1),
    "femnist": (0.01, (1.0, 1.0, 3.0, 0.05), 0.5, (0.5, 0.5), 1.0),
    "shakespeare": (1.0, (5.0, 10.0, 3.0, 1.0), 0.1, (15.0, 15.0), 0.01),
}


def _asyncfeded_presets() -> dict[str, dict[str, Any]]:
    out = {}
    for task, (lr, (lam, eps, gamma_bar, kappa), alpha, (a, b), mu) in _ASYNCFEDED_TASKS.items():
        local = {"steps": 10, "batch_size": 10, "lr": lr, "momentum": 0.5}
        runs = {
            "asyncfeded": {"algorithm": "asyncfeded", "options": {"initial_steps": 10, "max_steps": 50},
                           "hparams": {"feded_lambda": lam, "feded_epsilon": eps, "target_staleness": gamma_bar,
                                       "kappa": kappa}, "protocol": _ASYNC},
            "asyncfeded_constant_k": {"algorithm": "asyncfeded", "options": {"initial_steps": 10,
                                                                              "adaptive_steps": False},
                                      "hparams": {"feded_lambda": lam, "feded_epsilon": eps}, "protocol": _ASYNC},
            "fedasync_constant": {"algorithm": "fedasync", "options": {"staleness": "constant"},
                                  "hparams": {"alpha": alpha}, "protocol": _ASYNC},
            "fedasync_hinge": {"algorithm": "fedasync", "options": {"staleness": "hinge"},
                               "hparams": {"alpha": alpha, "staleness_a": a, "staleness_b": b}, "protocol": _ASYNC},
            "fedprox": {"algorithm": "fedavg", "options": {}, "hparams": {"prox_mu": mu}, "protocol": _SYNC},
            "fedavg": {"algorithm": "fedavg", "options": {}, "hparams": {}, "protocol": _SYNC},
        }
        data, model = _ASYNCFEDED_DATA[task]
        for method, run in runs.items():
            out[f"asyncfeded/{task}/{method}"] = {**run, "label": method, "local": local, "data": data,
                                                  "model": model}
    return out


# ------------------------------------------------------------------------------------------- CPU-scale CNN tasks
# The papers' convolutional experiments (CIFAR-10/100 and FEMNIST) take hours on a CPU. Each `<paper>/cpu_cnn/...`
# preset keeps the paper's CNN (or, for ACE's ResNet-18, the small built-in CNN), its algorithm rules, protocol and
# hyper-parameters, on a task sized to run in minutes on 2 CPU cores: Fashion-MNIST (the Debian package's files,
# nothing downloaded) over 20 clients (10 for AsyncFedED, as in its experiments) with a Dirichlet(0.3) label split,
# fewer local steps and a few hundred uploads. The dataset is a stand-in: the papers' accuracies are not expected.
_CPU_CNN_DATA = {"name": "fashion_mnist", "num_clients": 20, "partition": "dirichlet", "dirichlet_alpha": 0.3}
_CA2FL_PROTOCOL = {"name": "concurrent", "concurrency": 10, "buffer_size": 5, "refill": "boundary"}
_ACE_ARRIVALS = 600


def _cpu_cnn_presets() -> dict[str, dict[str, Any]]:
    """CA2FL (digest 003: its CIFAR CNN, eta_l = 0.01, eta = 1, boundary refill, Mc/M = 2; K = 5 steps of 32 instead
    of 2 epochs of 50), ACE (digest 000: K = 1 gradient of batch 50, all clients active, eta = 0.2 sqrt(n / T)),
    AsyncFedED (digest 001, its FEMNIST column: the FEMNIST CNN, K = 10 of batch 10, lr 0.01, momentum 0.5) and
    AsynFLC-EF (digest 004, its CIFAR-10 CNN row: plain SGD at lr 0.01, top-k 3% with error feedback against
    uncompressed AsynFL, the buffered protocol of algorithms/defaults.py; K = 5 steps of 32 instead of the paper's
    unstated K with batch 128)."""
    ca2fl_local = {"steps": 5, "batch_size": 32, "lr": 0.01, "momentum": 0.0}
    ca2fl_model = {"name": "ca2fl_cnn"}
    ace_local = {"steps": 1, "batch_size": 50, "lr": 0.05, "momentum": 0.0}
    ace_lr = round(0.2 * (_CPU_CNN_DATA["num_clients"] / _ACE_ARRIVALS) ** 0.5, 4)
    feded_data = {**_CPU_CNN_DATA, "num_clients": 10}
    feded_local = {"steps": 10, "batch_size": 10, "lr": 0.01, "momentum": 0.5}
    lr, (lam, eps, gamma_bar, kappa), alpha, _, _ = _ASYNCFEDED_TASKS["femnist"]
    runs = {
        "ca2fl/cpu_cnn/ca2fl": {"algorithm": "ca2fl", "options": {}, "hparams": {"server_lr": 1.0},
                                "protocol": _CA2FL_PROTOCOL, "local": ca2fl_local, "model": ca2fl_model,
                                "arrivals": 300},
        "ca2fl/cpu_cnn/fedbuff": {"algorithm": "fedbuff", "options": {}, "hparams": {"server_lr": 1.0},
                                  "protocol": _CA2FL_PROTOCOL, "local": ca2fl_local, "model": ca2fl_model,
                                  "arrivals": 300},
        "ace/cpu_cnn/ace": {"algorithm": "ace", "options": {}, "hparams": {"server_lr": ace_lr},
                            "protocol": {"name": "all_active"}, "local": ace_local, "model": {"name": "cnn"},
                            "arrivals": _ACE_ARRIVALS},
        "asyncfeded/cpu_cnn/asyncfeded": {
            "algorithm": "asyncfeded", "options": {"initial_steps": 10, "max_steps": 50},
            "hparams": {"feded_lambda": lam, "feded_epsilon": eps, "target_staleness": gamma_bar, "kappa": kappa},
            "protocol": _ASYNC, "local": feded_local, "model": {"name": "femnist_cnn"}, "data": feded_data,
            "arrivals": 150},
        "asyncfeded/cpu_cnn/fedasync_constant": {
            "algorithm": "fedasync", "options": {"staleness": "constant"}, "hparams": {"alpha": alpha},
            "protocol": _ASYNC, "local": feded_local, "model": {"name": "femnist_cnn"}, "data": feded_data,
            "arrivals": 150},
    }
    ef_local = {"steps": 5, "batch_size": 32, "lr": 0.01, "momentum": 0.0}
    runs.update({
        "asynflc_ef/cpu_cnn/asynflc_ef": {"algorithm": "asynflc_ef", "options": {"compressor": "top_k"},
                                          "hparams": {}, "protocol": _CA2FL_PROTOCOL, "local": ef_local,
                                          "model": {"name": "cnn"}, "arrivals": 300},
        "asynflc_ef/cpu_cnn/asynfl": {"algorithm": "asynfl", "options": {}, "hparams": {},
                                      "protocol": _CA2FL_PROTOCOL, "local": ef_local, "model": {"name": "cnn"},
                                      "arrivals": 300},
    })
    assert lr == feded_local["lr"]
    return {name: {"label": name.split("/")[-1], "data": _CPU_CNN_DATA, **run} for name, run in runs.items()}


PRESETS: dict[str, dict[str, Any]] = {**_asyncfeded_presets(), **_cpu_cnn_presets()}
"""Every preset by name: ``{"label", "algorithm", "options", "hparams", "protocol", "local", "data", "model"}``
(``data`` and ``model``: the configuration sections of the paper's task), and optionally ``arrivals`` (the run's
length; default the CLI's)."""


def unavailable(preset: dict[str, Any]) -> str | None:
    """Why the preset's task cannot run in this version (its dataset has no loader here), or None when it can.

    Every preset's dataset has a loader now; whether its files are present is checked by ``config.validate`` once
    ``data.path`` is known (a missing LEAF dataset is a ConfigError saying how to get the files)."""
    from asyncfl_jax.config import DATASETS

    name = preset["data"]["name"]
    if name in DATASETS:
        return None
    return (f"its task is {name.split('/')[-1]} with its natural clients and the {preset['model']['name']} model, "
            "and this version of asyncfl_jax has no loader for that dataset (it will not run another task under the "
            "paper's name); the asyncfeded/synthetic/... presets run, and `asyncfl presets` shows this one's "
            "hyper-parameters for use with your own data")


def get_preset(name: str) -> dict[str, Any]:
    """A copy of the preset ``name``; an unknown name is an error that suggests the closest one."""
    if name not in PRESETS:
        close = difflib.get_close_matches(name, list(PRESETS), n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise ValueError(f"unknown preset {name!r} (known: {sorted(PRESETS)}){hint}")
    return copy.deepcopy(PRESETS[name])
