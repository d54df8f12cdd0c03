"""asyncfl_jax: a JAX-accelerated, vectorized simulator for asynchronous federated learning.

The same experiment is a few calls::

    import asyncfl_jax as afl

    dataset = afl.data.synthetic_leaf(num_clients=100, alpha=1.0, beta=1.0)
    model = afl.make_model("mlp", dataset.input_shape, dataset.num_classes)
    task = afl.make_task(dataset, dataset.natural_partition, model)
    schedules = afl.default_schedules("fedbuff", 100, seeds=[0, 1])  # FedBuff's usual protocol, one per seed
    history = afl.simulate(task, afl.fedbuff(), schedules, afl.LocalConfig(steps=10, batch_size=32),
                           seeds=[0, 1], hparams={"client_lr": [0.02, 0.05]})

(the same experiment as ``asyncfl run --algorithm fedbuff --seeds 0,1 --hparam client_lr=0.02,0.05``: the protocol,
number of uploads and evaluation points of an algorithm's usual run come from :mod:`asyncfl_jax.algorithms.defaults`
at every entry point),

and the pieces are pure functions: :func:`make_simulation` returns the whole run as one function of (schedule
arrays, hyper-parameters, key, task arrays) that can be ``jax.jit``-ed and ``jax.vmap``-ed, and every algorithm is an
:class:`Algorithm` of pure ``init`` / ``client`` / ``server`` functions.

Messages (memory budgets, resumed runs, progress without a terminal) go to the ``asyncfl_jax`` logger at INFO;
nothing is shown unless logging is configured (``logging.basicConfig(level=logging.INFO)``); the ``asyncfl`` command
prints them to stderr.
"""

from asyncfl_jax import _signals

_signals.hold_imports()  # the `asyncfl` command only: Ctrl-C / SIGTERM while JAX imports is raised once main() starts

import logging as _logging

_logging.getLogger("asyncfl_jax").addHandler(_logging.NullHandler())

from asyncfl_jax import algorithms, data, losses, timing
from asyncfl_jax.algorithms import (Algorithm, ServerMeta, asgd, asyncfeded, ca2fl, fedasync, fedavg, fedbuff,
                                    get_algorithm, with_server_optimizer)
from asyncfl_jax.algorithms.defaults import run_defaults
from asyncfl_jax.client import LocalConfig, make_local_update
from asyncfl_jax.compile_cache import enable_compile_cache
from asyncfl_jax.hypergrad import HyperGradient, UnreliableGradientError, hypergradient, make_objective
from asyncfl_jax.engine import (
    ReplicaSpec,
    ScheduleArrays,
    SimulationOutput,
    default_hparams,
    make_simulation,
    schedule_arrays,
    simulate,
)
from asyncfl_jax.losses import Batch, Loss, custom_loss
from asyncfl_jax.models import Model, make_model, model_from_apply, model_from_flax
from asyncfl_jax.results import History, load_results, plot_accuracy, write_results
from asyncfl_jax.task import Task, TaskArrays, make_task, task_arrays
from asyncfl_jax.timing import DelayModel, Schedule, make_schedule, schedule_summary
from asyncfl_jax.timing.clock import EventClock
from asyncfl_jax.timing.traces import TraceDelays, load_device_trace, load_fedscale_traces
from asyncfl_jax.usual_runs import default_schedules, usual_hparams

__version__ = "0.1.0"

__all__ = [
    "Algorithm",
    "Batch",
    "DelayModel",
    "EventClock",
    "History",
    "HyperGradient",
    "LocalConfig",
    "Loss",
    "Model",
    "ReplicaSpec",
    "Schedule",
    "ScheduleArrays",
    "ServerMeta",
    "SimulationOutput",
    "Task",
    "TaskArrays",
    "TraceDelays",
    "UnreliableGradientError",
    "algorithms",
    "asgd",
    "asyncfeded",
    "ca2fl",
    "custom_loss",
    "data",
    "default_hparams",
    "default_schedules",
    "enable_compile_cache",
    "fedasync",
    "fedavg",
    "fedbuff",
    "get_algorithm",
    "hypergradient",
    "load_device_trace",
    "load_fedscale_traces",
    "load_results",
    "losses",
    "make_local_update",
    "make_model",
    "make_objective",
    "make_schedule",
    "make_simulation",
    "make_task",
    "model_from_apply",
    "model_from_flax",
    "plot_accuracy",
    "run_defaults",
    "schedule_arrays",
    "schedule_summary",
    "simulate",
    "task_arrays",
    "timing",
    "usual_hparams",
    "with_server_optimizer",
    "write_results",
]
