"""Which options each arrival protocol and each algorithm reads: one table, so that an option that would be ignored
is refused, the same way from the command line, a configuration file and Python.

An option *set* for a run that does not read it is an error naming the option, the run and why it is not read:

* a protocol option (``protocol.concurrency``, ``buffer_size``, ``refill``, ``participants``) is per run: it is
  refused when that run's protocol does not read it (:data:`PROTOCOL_READS`; ``buffer_size`` is not read under a
  server clock, which steps with whatever has arrived);
* a local-training option (``local.steps``, ``local.epochs``, ``local.lr``, ``local.momentum``) is shared by the
  runs of an experiment: it is refused when *no* run reads it (:func:`unread_local`: an algorithm that uploads one
  minibatch gradient trains no local steps and uses no local optimizer, so only ``local.steps = 1`` is accepted for
  it; AsyncFedED sets each job's steps itself; AREA's decreasing step size replaces ``client_lr``);
* a hyper-parameter in a run's ``hparams`` is refused when that run does not read it (the same rule; hyper-parameters
  an algorithm does not know at all are refused by :func:`asyncfl_jax.engine.resolve_hparams`, algorithm options by
  the algorithm's constructor);
* an algorithm option that its other options make unread (:func:`unread_options`: ``cache_rounding`` with a float
  cache, AsyncFedED's ``min_steps``/``rounding`` without adaptive steps) is refused when it is not its default.

"Set" means: given on the command line (``--concurrency 20`` for ACE is refused even though 20 is the default), or,
in a configuration file, holding a value other than the default (a resolved ``config.json`` writes every field, and
an unread field at its default changes nothing). From Python, :func:`check_unread_hparams` refuses a sweep over a
hyper-parameter the algorithm does not read (its replicas would be identical) and a local setting (``epochs``, a
custom optimizer) the algorithm does not use.

Documented mappings (read, not ignored): FedAsync with ``buffer_size`` M > 1 mixes a step's M arrivals in one at a
time in arrival order, each with its own staleness (:mod:`asyncfl_jax.algorithms.fedasync`); with ``buffer_size`` 1
the refills "immediate" and "boundary" give the same schedule (every arrival is a step), so either is accepted.
"""

from __future__ import annotations

from typing import Any, Iterable, Sequence

from asyncfl_jax.algorithms import get_algorithm
from asyncfl_jax.errors import InputError

PROTOCOL_READS: dict[str, tuple[str, ...]] = {
    "concurrent": ("concurrency", "buffer_size", "refill"),
    "all_active": (),
    "event_clock": (),
    "synchronous": ("participants",),
}
"""The protocol options (besides ``aggregation``, ``period`` and ``rate``, checked by ``config.validate``) that each
protocol reads."""

PROTOCOL_FIELDS = ("concurrency", "buffer_size", "refill", "participants")

_WHY_PROTOCOL = {
    "all_active": "protocol 'all_active' keeps every client training (concurrency = data.num_clients) and applies "
                  "one arrival per step (or a server clock's ticks)",
    "event_clock": "protocol 'event_clock' keeps every client training and applies every arrival as it comes",
    "synchronous": "protocol 'synchronous' runs rounds of protocol.participants clients (null: all) and steps when "
                   "the round is in",
    "concurrent": "protocol 'concurrent' keeps protocol.concurrency clients in flight",
}

MATCHING_VALUE = {("gradient", "local.steps"): 1}
"""(upload kind, option) -> the one value that states what the algorithm does and is therefore accepted although
not read: ``local.steps = 1`` for a gradient upload (one minibatch gradient is one local step)."""


class UnreadOption(InputError):
    """An option set for runs that do not read it."""


def protocol_unread(protocol: Any) -> dict[str, str]:
    """The fields of a :class:`~asyncfl_jax.config.ProtocolConfig` its protocol does not read -> why."""
    reads = PROTOCOL_READS.get(protocol.name, PROTOCOL_FIELDS)
    why = _WHY_PROTOCOL.get(protocol.name, "")
    out = {field: f"{why}; it does not read protocol.{field}" for field in PROTOCOL_FIELDS if field not in reads}
    if protocol.name == "concurrent" and protocol.aggregation != "count":
        out["buffer_size"] = (f"a server clock (aggregation {protocol.aggregation!r}) steps with whatever has arrived "
                              "at each tick; it does not read protocol.buffer_size")
    return out


def unread_local(algorithm: Any) -> dict[str, str]:
    """The local-training options ``algorithm`` does not read -> why. Keys are ``local.<key>`` (``steps``,
    ``epochs``, ``lr``, ``momentum``) and the hyper-parameters ``client_lr``, ``momentum``, ``prox_mu``."""
    out: dict[str, str] = {}
    if algorithm.upload == "gradient":
        why = (f"{algorithm.name} uploads one minibatch gradient at the model it receives (no local steps, no local "
               "optimizer; its step size is server_lr)")
        for key in ("local.steps", "local.epochs", "local.lr", "local.momentum", "client_lr", "momentum", "prox_mu"):
            out[key] = why
        return out
    if algorithm.jobs.steps is not None:
        why = (f"{algorithm.name} sets each job's number of local steps itself (its options initial_steps, "
               "min_steps, max_steps)")
        out["local.steps"] = why
        out["local.epochs"] = why
    if algorithm.options.get("adaptive_steps") is False:
        why = f"{algorithm.name} with adaptive_steps = false keeps every job at initial_steps (no step-count update)"
        out["target_staleness"] = why
        out["kappa"] = why
    if algorithm.options.get("lr_schedule") == "decreasing":
        why = f"{algorithm.name}'s decreasing step size lr_c / (k + lr_d) replaces the client learning rate"
        out["local.lr"] = why
        out["client_lr"] = why
    return out


def unread_options(algorithm: Any) -> dict[str, str]:
    """The algorithm options ``algorithm`` was built with but does not read, given its other options -> why:
    ``cache_rounding`` and ``quantize_fresh`` with a float32 cache (rounding applies to the int caches; the fresh
    term's ``Q`` is then the identity), AsyncFedED's ``min_steps`` and ``rounding`` with ``adaptive_steps`` off."""
    o = algorithm.options
    out: dict[str, str] = {}
    cache = o.get("cache")
    if isinstance(cache, str) and not cache.startswith("int"):
        out["cache_rounding"] = f"cache_rounding applies to the int caches, not to cache = {cache!r}"
        if cache == "float32":
            out["quantize_fresh"] = "with cache = 'float32' the cache stores the values as they are (Q is the identity)"
    if o.get("adaptive_steps") is False:
        why = "with adaptive_steps = false every job runs initial_steps local steps"
        out["min_steps"] = why
        out["rounding"] = why
    return out


def _is_set(key: str, value: Any, default: Any, explicit: Iterable[str]) -> bool:
    return key in explicit or value != default


def check_config(cfg: Any, explicit: Iterable[str] = ()) -> None:
    """Refuses options of ``cfg`` (an :class:`~asyncfl_jax.config.ExperimentConfig`) that no run reading them would
    read (see the module docstring). ``explicit``: option keys given explicitly (``protocol.concurrency``,
    ``local.steps``, ...; the command line passes its flags), which count as set whatever their value.
    Raises :class:`UnreadOption`."""
    explicit = set(explicit)
    local_defaults = type(cfg.local)()
    algorithms = [get_algorithm(run.algorithm, **run.options) for run in cfg.runs]
    for i, (run, algorithm) in enumerate(zip(cfg.runs, algorithms)):
        proto_defaults = type(run.protocol)()
        replayed = run.schedule_files is not None  # a replayed schedule reads no protocol option (documented)
        for field, why in ({} if replayed else protocol_unread(run.protocol)).items():
            key = f"protocol.{field}"
            if _is_set(key, getattr(run.protocol, field), getattr(proto_defaults, field), explicit):
                raise UnreadOption(_message(key, getattr(run.protocol, field), f"runs[{i}] ({run.name})", why,
                                            "leave it out or choose a protocol that reads it"))
        defaults = get_algorithm(run.algorithm).options
        for name, why in unread_options(algorithm).items():
            if name in run.options and run.options[name] != defaults.get(name):
                raise UnreadOption(f"invalid option runs[{i}].options.{name} = {run.options[name]!r}: not read by "
                                   f"runs[{i}] ({run.name}): {why}; remove it")
        unread = unread_local(algorithm)
        for name in run.hparams:  # an algorithm's own hyper-parameter at its default is what a resolved config holds
            if name in unread and run.hparams[name] != algorithm.hyperparams.get(name, object()):
                raise UnreadOption(f"invalid option runs[{i}].hparams.{name} = {run.hparams[name]!r}: {unread[name]}; "
                                   "remove it")
    for key in ("steps", "epochs", "lr", "momentum"):
        value, default = getattr(cfg.local, key), getattr(local_defaults, key)
        if not _is_set(f"local.{key}", value, default, explicit):
            continue
        reasons = [None if value == MATCHING_VALUE.get((a.upload, f"local.{key}"), object()) else
                   unread_local(a).get(f"local.{key}") for a in algorithms]
        if all(reasons):
            runs = ", ".join(f"runs[{i}] ({r.name})" for i, r in enumerate(cfg.runs))
            raise UnreadOption(_message(f"local.{key}", value, runs, reasons[0],
                                        "leave it out" + (" (the batch size B is still read)" if key == "steps" else "")))


def _message(key: str, value: Any, where: str, why: str, fix: str) -> str:
    return f"invalid option {key} = {value!r}: not read by {where}: {why}; {fix}"


def explicit_from_cli(args: Any) -> set[str]:
    """The option keys the ``asyncfl run`` flags in ``args`` give explicitly (``--concurrency``, ``--local-steps``,
    ``--set runs.protocol.refill=...``, ...)."""
    out = set()
    for key, flag in (("protocol.concurrency", "concurrency"), ("protocol.buffer_size", "buffer_size"),
                      ("protocol.refill", "refill"), ("protocol.participants", "participants"),
                      ("local.steps", "local_steps"), ("local.lr", "lr")):
        if getattr(args, flag, None) is not None:
            out.add(key)
    for item in getattr(args, "set", None) or []:
        name = item.split("=", 1)[0].strip()
        if name.startswith("runs.protocol.") or name.startswith("local."):
            out.add(name.removeprefix("runs."))
    return out


def check_unread_hparams(algorithm: Any, local: Any, replicas: Sequence[Any]) -> None:
    """The Python side of the rule (``simulate`` / ``prepare_run``): refuses a sweep over a hyper-parameter
    ``algorithm`` does not read (its replicas would be the same run), ``local.epochs`` or a custom
    ``local.optimizer`` for an algorithm that trains no local steps of its own. Raises ``ValueError``."""
    unread = unread_local(algorithm)
    for name in unread:
        if "." in name:
            continue
        values = {float(r.hparams[name]) for r in replicas if name in r.hparams}
        if len(values) > 1:
            raise ValueError(f"hyper-parameter {name} is swept over {sorted(values)} but not read: {unread[name]}; "
                             "its replicas would be the same run")
    if getattr(local, "epochs", None) is not None and "local.epochs" in unread:
        raise ValueError(f"local.epochs = {local.epochs!r} is not read: {unread['local.epochs']}; leave it None")
    if algorithm.upload == "gradient" and getattr(local, "optimizer", None) is not None:
        raise ValueError(f"local.optimizer is not used: {unread['local.steps']}; leave it None")
