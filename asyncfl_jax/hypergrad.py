"""Hyper-gradients through a whole run: the derivative of a final loss with respect to hyper-parameters.

A run over a pre-sampled :class:`~asyncfl_jax.timing.schedule.Schedule` is a pure JAX function of its
hyper-parameters (:func:`~asyncfl_jax.engine.make_simulation`): the schedule (who trains from which model version,
who arrives when) is fixed, and every server and client rule in between is a differentiable function of the
server / client learning rates, a staleness function's parameters, FedAdam's, ... So

    J(theta) = objective(metrics of the run with hyper-parameters theta)

has an exact gradient through every server step. :func:`make_objective` builds ``J`` as a jittable function of the
vector ``theta`` of the chosen hyper-parameters (``wrt``); :func:`hypergradient` returns ``J`` and its gradient:

* ``mode="reverse"``: ``jax.value_and_grad``, with the server steps rematerialized (``jax.checkpoint``) in
  segments of ``remat_steps`` steps: the backward pass keeps the carry at each segment's start and recomputes one
  segment at a time, so memory is about ``T / S`` carries plus one segment's intermediates (``S = remat_steps``,
  default ``ceil(sqrt(T))``) instead of every step's intermediates; the price is one more forward pass.
* ``mode="forward"``: ``jax.jvp`` along each hyper-parameter (vmapped): memory of a plain run, cost about one run
  per hyper-parameter; the better choice for one or two hyper-parameters.
* ``mode="smoothed"``: the gradient of the Gaussian-smoothed objective ``E_eps J(theta + sigma * eps)``, estimated
  with ``samples`` antithetic pairs of plain runs (no differentiation): the alternative where the exact gradient
  is not meaningful (chaotic horizons, discontinuities). Its standard error is reported.

Where the exact gradient would be a wrong or meaningless number, the function says so rather than return it:

* refused before compiling: event clocks (job durations that depend on the state: the schedule is not fixed),
  compressed uploads (top-k / random-k selection, stochastic or nearest quantization, sign: their derivatives are
  zero or undefined almost everywhere, and JAX would return the derivative of a surrogate), quantized or bfloat16
  caches (rounding: the same), and a run that diverges (NaN/inf: no gradient);
* checked after computing (``check``): a central finite difference along the gradient's direction is compared with
  the exact directional derivative. On a chaotic horizon (a long run at a large learning rate), the exact gradient
  is dominated by exponentially growing sensitivities that say nothing about the loss at any finite scale (it can be
  1e5 where finite differences range from -0.6 to -4e3); the check then fails and ``check="raise"`` (default)
  raises :class:`UnreliableGradientError` naming the remedies (a shorter horizon, a smaller learning rate, or
  ``mode="smoothed"``). ``check="warn"`` warns, ``check="off"`` skips the two extra runs.

Functions with kinks (the hinge staleness at ``tau = b``, AsyncFedED's integer local step counts and thresholds,
clips) are differentiable almost everywhere: the gradient returned is that of the piece the run is on (as
``jax.grad`` of ``relu``), and the finite-difference check flags a point where a jump falls inside its step.
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from typing import Any, Callable, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from asyncfl_jax.algorithms.base import Algorithm
from asyncfl_jax.client import LocalConfig, check_optimizer_hparams
from asyncfl_jax.engine.hparams import check_hparam_value, default_hparams, make_replicas, resolve_hparams
from asyncfl_jax.engine.inputs import schedule_arrays
from asyncfl_jax.engine.loop import check_count, check_model_outputs
from asyncfl_jax.engine.step import Carry, Program, build_program
from asyncfl_jax.precision import cast_task, check_precision, precision_dtype, precision_scope
from asyncfl_jax.task import Task, TaskArrays, task_arrays
from asyncfl_jax.timing.schedule import Schedule

MODES = ("reverse", "forward", "smoothed")
CHECKS = ("raise", "warn", "off")
OBJECTIVES = ("train_loss", "val_loss", "test_loss")
"""Objectives by name: the metric's value after the last server step."""

FULL_PRECISION_CACHES = ("float32",)
"""Cache kinds whose rows hold the values exactly (every other kind rounds them)."""


class UnreliableGradientError(ValueError):
    """The exact gradient disagrees with a finite difference of the objective: it is not a useful slope (a chaotic
    horizon, or a discontinuity inside the check's step)."""


@dataclasses.dataclass(frozen=True)
class GradientCheck:
    """The comparison made by :func:`hypergradient`'s ``check``.

    Along the unit direction ``u`` of the gradient in scaled coordinates (hyper-parameter ``i`` scaled by
    ``s_i = max(|theta_i|, 1e-3)``), ``exact = sum_i g_i s_i u_i`` and ``finite_difference = (J(theta + h s u) -
    J(theta - h s u)) / (2 h)`` with ``h = step``. ``agrees``: ``|exact - finite_difference| <= rtol * max(|exact|,
    |finite_difference|) + atol``, ``atol`` the float noise of ``J`` divided by ``h``."""

    direction: dict[str, float]
    step: float
    exact: float
    finite_difference: float
    rtol: float
    atol: float
    agrees: bool


@dataclasses.dataclass(frozen=True)
class HyperGradient:
    """Result of :func:`hypergradient`: ``value`` (the objective at ``point``), ``grad`` (its derivative with
    respect to each hyper-parameter of ``wrt``), the ``mode``, the finite-difference ``check`` (None when off or
    smoothed) and, for ``mode="smoothed"``, the Monte-Carlo standard error of each entry (``stderr``)."""

    value: float
    grad: dict[str, float]
    point: dict[str, float]
    mode: str
    check: GradientCheck | None = None
    stderr: dict[str, float] | None = None
    notes: tuple[str, ...] = ()  # what the gradient means for this run's non-smooth pieces (:func:`kink_notes`)


@dataclasses.dataclass(frozen=True)
class HyperObjective:
    """``J(theta)`` as a pure function (:func:`make_objective`): ``fn(theta)`` with ``theta`` a vector of the
    hyper-parameters ``names`` (in that order; ``point`` is the vector at the given values). ``fn`` can be
    ``jax.jit``-ed, ``jax.vmap``-ed (a grid search), ``jax.grad``-ed; call it inside ``precision_scope(precision)``
    (:meth:`__call__` and :meth:`grid` do)."""

    fn: Callable[[jax.Array], jax.Array]
    names: tuple[str, ...]
    point: np.ndarray
    precision: str
    with_divergence: Callable[[jax.Array], tuple[jax.Array, jax.Array]]  # theta -> (J, first diverged step or -1)

    def __call__(self, theta: Any) -> float:
        with precision_scope(self.precision):
            return float(jax.jit(self.fn)(jnp.asarray(theta, precision_dtype(self.precision))))

    def grid(self, thetas: Any) -> np.ndarray:
        """``J`` at each row of ``thetas`` [k, len(names)], as one vmapped compiled program."""
        with precision_scope(self.precision):
            return np.asarray(jax.jit(jax.vmap(self.fn))(jnp.asarray(thetas, precision_dtype(self.precision))))


def check_differentiable(algorithm: Algorithm, schedule: Any) -> None:
    """Refuses, before compiling, a run whose exact gradient would not mean what it says (module docstring)."""
    if not isinstance(schedule, Schedule):
        raise ValueError(f"hyper-gradients need a pre-sampled Schedule (the schedule is fixed, the hyper-parameters "
                         f"move), got {type(schedule).__name__}; an EventClock's job durations depend on the training "
                         f"state, so its event times are not differentiable")
    options = dict(algorithm.options)
    compressor = options.get("compressor")
    if compressor is not None and compressor != "identity":
        raise ValueError(f"{algorithm.name}: compressed uploads (compressor={compressor!r}) have no meaningful "
                         f"gradient: selection (top-k, random-k with a content-hashed key) and rounding (quantizers, "
                         f"sign) are piecewise constant, so their derivative is zero or undefined almost everywhere "
                         f"and JAX would return that of a surrogate; differentiate the uncompressed algorithm, or use "
                         f"mode='smoothed'")
    cache = options.get("cache")
    if "bits" in options or (cache is not None and cache not in FULL_PRECISION_CACHES):
        kind = cache if cache is not None else f"int{options['bits']}"
        raise ValueError(f"{algorithm.name}: a {kind} cache rounds the cached values (stochastic or nearest rounding), "
                         f"whose derivative is zero almost everywhere; JAX would differentiate through it as if it "
                         f"were the identity. Use cache='float32', or mode='smoothed'")


def kink_notes(algorithm: Algorithm) -> tuple[str, ...]:
    """What the exact gradient means for the non-smooth pieces of ``algorithm`` (empty when it is smooth)."""
    options, notes = dict(algorithm.options), []
    if options.get("staleness") == "hinge":
        notes.append("hinge staleness: s(tau) has a kink at tau = b; the derivative is that of the piece each "
                     "arrival is on (d/d staleness_b is 0 for tau <= b), the true derivative except where b is an "
                     "observed staleness value")
    if algorithm.jobs.steps is not None and options.get("adaptive_steps", True):
        notes.append(f"{algorithm.name}: the per-job local step counts are integers (floor and clip of a rule); "
                     f"the gradient holds them at their values in this run, and the objective jumps where one "
                     f"changes (the finite-difference check flags a jump inside its step)")
    if options.get("discard_above") is not None:
        notes.append(f"{algorithm.name}: discard_above is a threshold; a result crossing it makes the objective jump")
    return tuple(notes)


def _check_wrt(wrt: Sequence[str] | str, known: Mapping[str, float]) -> tuple[str, ...]:
    names = (wrt,) if isinstance(wrt, str) else tuple(wrt)
    if not names:
        raise ValueError("wrt must name at least one hyper-parameter")
    for name in names:
        if name not in known:
            raise ValueError(f"wrt: {name!r} is not a hyper-parameter of this run (known: {sorted(known)})")
    if len(set(names)) != len(names):
        raise ValueError(f"wrt must not repeat a name, got {list(names)}")
    return names


def _objective_of_metrics(objective: str | Callable[[dict[str, jax.Array]], jax.Array],
                          task: Task) -> Callable[[dict[str, jax.Array]], jax.Array]:
    if callable(objective):
        return objective
    if objective not in OBJECTIVES:
        raise ValueError(f"objective must be one of {list(OBJECTIVES)} or a function of the metrics, got "
                         f"{objective!r}")
    if objective == "val_loss" and task.val_x is None:
        raise ValueError("objective='val_loss' needs a validation set: make the task with validation_fraction > 0")
    return lambda metrics: metrics[objective][-1]


def _segments(advance: Callable[..., Carry], carry: Carry, steps: Any, length: int, size: int, hp: Any) -> Carry:
    """``length`` server steps as a scan of rematerialized segments of ``size`` steps (and a shorter last one)."""
    full, rest = divmod(length, size)
    segment = jax.checkpoint(advance)
    if full:
        blocks = jax.tree_util.tree_map(lambda a: a[: full * size].reshape(full, size, *a.shape[1:]), steps)
        carry, _ = jax.lax.scan(lambda c, b: (segment(c, b, hp), None), carry, blocks)
    if rest:
        carry = segment(carry, jax.tree_util.tree_map(lambda a: a[full * size:], steps), hp)
    return carry


def differentiable_run(program: Program, sched: Any, key: jax.Array, data: TaskArrays, num_steps: int,
                       eval_every: int, remat_steps: int) -> Callable[[Mapping[str, jax.Array]], tuple[Any, Any]]:
    """``run(hp) -> (metrics, diverged_at)``: :func:`~asyncfl_jax.engine.make_simulation`'s run (the same steps and
    evaluations after steps 0, E, 2E, ..., T) with its steps rematerialized in segments of ``remat_steps``."""
    params = program.algorithm.params

    def advance(c: Carry, block: Any, hp: Any) -> Carry:
        return program.advance(c, block, hp, key, data)[0]

    def run(hp: Mapping[str, jax.Array]) -> tuple[dict[str, jax.Array], jax.Array]:
        carry = program.init(sched, hp, key, data)
        evaluations, scanned = [program.evaluate(params(carry.server), data)], [False]
        full, rest = divmod(num_steps, eval_every)
        size = min(remat_steps, eval_every)
        if full:
            blocks = jax.tree_util.tree_map(
                lambda a: a[: full * eval_every].reshape(full, eval_every, *a.shape[1:]), sched.steps)

            def block(c: Carry, steps: Any) -> tuple[Carry, Any]:
                c = _segments(advance, c, steps, eval_every, size, hp)
                return c, program.evaluate(params(c.server), data)

            carry, metrics = jax.lax.scan(block, carry, blocks)
            evaluations.append(metrics)
            scanned.append(True)
        if rest:
            tail = jax.tree_util.tree_map(lambda a: a[full * eval_every:], sched.steps)
            carry = _segments(advance, carry, tail, rest, min(remat_steps, rest), hp)
            evaluations.append(program.evaluate(params(carry.server), data))
            scanned.append(False)
        return _stack_evaluations(evaluations, scanned), carry.diverged_at

    return run


def _stack_evaluations(evaluations: list[dict[str, jax.Array]], scanned: list[bool]) -> dict[str, jax.Array]:
    """The evaluations (single ones, or a scan's stacked ones) concatenated along a leading evaluation axis."""
    return {k: jnp.concatenate([e[k] if s else e[k][None] for e, s in zip(evaluations, scanned)])
            for k in evaluations[0]}


def make_objective(task: Task, algorithm: Algorithm, schedule: Schedule, local: LocalConfig | None = None,
                   hparams: Mapping[str, float] | None = None,
                   objective: str | Callable[[dict[str, jax.Array]], jax.Array] = "train_loss",
                   wrt: Sequence[str] | str = ("server_lr",), seed: int = 0, eval_every: int | None = None,
                   remat_steps: int | None = None, precision: str = "float64") -> HyperObjective:
    """``J(theta)``: the objective of one run as a pure function of the hyper-parameters ``wrt`` (the others fixed
    at ``hparams`` and the defaults). Arguments as :func:`hypergradient`'s."""
    precision = check_precision(precision)
    check_differentiable(algorithm, schedule)
    schedule.validate()
    local = local or LocalConfig()
    local.validate()
    check_model_outputs(task)
    resolved = resolve_hparams(algorithm, hparams)
    names = _check_wrt(wrt, default_hparams(algorithm))
    for name, value in resolved.items():
        if isinstance(value, (list, tuple, np.ndarray)):
            raise ValueError(f"hparams[{name!r}]: one value per hyper-parameter (a gradient is taken at one point), "
                             f"got {value!r}")
        check_hparam_value(name, value)
    replicas = make_replicas(algorithm, [seed], resolved)
    check_optimizer_hparams(local, replicas)
    if local.use_momentum is False and (resolved["momentum"] != 0 or "momentum" in names):
        local = dataclasses.replace(local, use_momentum=True)
    num_steps = check_count("the schedule's number of server steps", schedule.num_steps)
    eval_every = num_steps if eval_every is None else check_count("eval_every", eval_every)
    remat = math.isqrt(num_steps - 1) + 1 if remat_steps is None else check_count("remat_steps", remat_steps)
    metric_of = _objective_of_metrics(objective, task)
    with precision_scope(precision):
        task = cast_task(task, precision)
        program = build_program(task, algorithm, local, schedule.num_slots, differentiable_steps=True)
        run = differentiable_run(program, schedule_arrays(schedule), jax.random.PRNGKey(seed), task_arrays(task),
                                 num_steps, eval_every, remat)
    dtype = precision_dtype(precision)
    fixed = {k: float(v) for k, v in resolved.items()}

    def hp_of(theta: jax.Array) -> dict[str, jax.Array]:
        hp = {k: jnp.asarray(v, dtype) for k, v in fixed.items()}
        return {**hp, **{name: theta[i] for i, name in enumerate(names)}}

    def with_divergence(theta: jax.Array) -> tuple[jax.Array, jax.Array]:
        metrics, diverged_at = run(hp_of(theta))
        return jnp.asarray(metric_of(metrics)), diverged_at

    def fn(theta: jax.Array) -> jax.Array:
        return with_divergence(theta)[0]

    with precision_scope(precision):
        shape = jax.eval_shape(fn, jax.ShapeDtypeStruct((len(names),), dtype))
    if shape.shape != () or not jnp.issubdtype(shape.dtype, jnp.floating):
        raise ValueError(f"objective must return a float scalar, got {shape.dtype} of shape {shape.shape}")
    return HyperObjective(fn, names, np.asarray([fixed[n] for n in names], dtype), precision, with_divergence)


def hypergradient(task: Task, algorithm: Algorithm, schedule: Schedule, local: LocalConfig | None = None,
                  hparams: Mapping[str, float] | None = None,
                  objective: str | Callable[[dict[str, jax.Array]], jax.Array] = "train_loss",
                  wrt: Sequence[str] | str = ("server_lr",), mode: str = "reverse", seed: int = 0,
                  eval_every: int | None = None, remat_steps: int | None = None, precision: str = "float64",
                  check: str = "raise", check_step: float | None = None, check_rtol: float = 0.05,
                  smoothing: float = 0.05, samples: int = 16) -> HyperGradient:
    """The objective of one run and its gradient with respect to the hyper-parameters ``wrt``.

    Args:
      task, algorithm, schedule, local: the run (as for :func:`~asyncfl_jax.engine.simulate`); the schedule is a
        pre-sampled :class:`~asyncfl_jax.timing.schedule.Schedule` and stays fixed.
      hparams: the point: one value per hyper-parameter (the others at their defaults).
      objective: ``"train_loss"``, ``"val_loss"`` (needs a validation set) or ``"test_loss"`` after the last step,
        or ``fn(metrics) -> scalar`` with ``metrics[name]`` the ``[E]`` evaluations after steps 0, ``eval_every``,
        ..., T (e.g. ``lambda m: m["val_loss"].mean()``, the area under the curve). Accuracies are piecewise
        constant: their gradient is zero.
      wrt: the hyper-parameters to differentiate (names of ``default_hparams(algorithm)``, e.g. ``"server_lr"``,
        ``"client_lr"``, ``"staleness_a"``, a user staleness function's parameters, ``"server_opt_lr"``).
      mode: ``"reverse"`` (rematerialized backward pass), ``"forward"`` (one JVP per hyper-parameter) or
        ``"smoothed"`` (the gradient of ``E J(theta + sigma eps)``, ``eps ~ N(0, I)``, ``sigma_i = smoothing *
        max(|theta_i|, 1e-3)``, from ``samples`` antithetic pairs of runs; see the module docstring).
      seed: the training seed (minibatches, the server's randomness).
      eval_every: the evaluations a function ``objective`` sees (default: after step 0 and after the last step).
      remat_steps: the segment length of the reverse pass's rematerialization (default ``ceil(sqrt(T))``).
      precision: ``"float64"`` (default: a gradient through thousands of steps wants it) or ``"float32"``.
      check: ``"raise"`` (default), ``"warn"`` or ``"off"``: compare the exact gradient with a central finite
        difference along its direction (:class:`GradientCheck`, two more runs) and raise
        :class:`UnreliableGradientError` (or warn) when they disagree.
      check_step: the finite difference's relative step ``h`` (default 1e-3 in float64, 1e-2 in float32).
      check_rtol: the relative tolerance of the check.
      smoothing, samples: ``mode="smoothed"``'s relative scale and number of antithetic pairs.

    Returns a :class:`HyperGradient`. Raises ValueError before compiling for what has no meaningful gradient
    (:func:`check_differentiable`, bad arguments), and when the run diverges at the point.
    """
    if mode not in MODES:
        raise ValueError(f"mode must be one of {list(MODES)}, got {mode!r}")
    if check not in CHECKS:
        raise ValueError(f"check must be one of {list(CHECKS)}, got {check!r}")
    for name, value, low in (("check_rtol", check_rtol, 0.0), ("smoothing", smoothing, 0.0),
                             ("check_step", 1.0 if check_step is None else check_step, 0.0)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= low:
            raise ValueError(f"{name} must be a number > {low}, got {value!r}")
    samples = check_count("samples", samples)
    obj = make_objective(task, algorithm, schedule, local, hparams, objective, wrt, seed, eval_every, remat_steps,
                         precision)
    with precision_scope(obj.precision):
        theta = jnp.asarray(obj.point)
        if mode == "smoothed":
            return _smoothed(obj, theta, smoothing, samples, seed)
        value, grad, diverged = _exact(obj, theta, mode)
        if diverged >= 0:
            raise _diverged(obj, diverged)
        if not np.all(np.isfinite(grad)):
            raise UnreliableGradientError(
                f"the exact hyper-gradient is not finite: {dict(zip(obj.names, map(float, grad)))} (J = {value:.6g} "
                f"is finite): a rule of the run has no derivative at this point (a division by 0 or a square root "
                f"at 0 in a branch); use mode='smoothed', or move the point")
        result = HyperGradient(value, dict(zip(obj.names, map(float, grad))), dict(zip(obj.names, map(float,
                               obj.point))), mode, notes=kink_notes(algorithm))
        if check == "off":
            return result
        step = check_step if check_step is not None else (1e-3 if obj.precision == "float64" else 1e-2)
        report = finite_difference_check(obj, theta, value, grad, step, check_rtol)
        result = dataclasses.replace(result, check=report)
    if not report.agrees:
        message = (f"the exact hyper-gradient {result.grad} is not a useful slope here: along its direction it "
                   f"gives {report.exact:.4g}, a central finite difference of relative step {step:g} gives "
                   f"{report.finite_difference:.4g}. The run is likely chaotic in these hyper-parameters (long "
                   f"horizon, large learning rate) or a jump lies within the step. Use a shorter horizon or a "
                   f"smaller learning rate, or mode='smoothed' (the gradient of the Gaussian-smoothed objective)")
        if check == "raise":
            raise UnreliableGradientError(message)
        warnings.warn(message, RuntimeWarning, stacklevel=2)
    return result


def _diverged(obj: HyperObjective, step: int) -> ValueError:
    return ValueError(f"the run diverges at server step {step} at {dict(zip(obj.names, map(float, obj.point)))}: "
                      f"the objective has no gradient there; lower the learning rates")


def _exact(obj: HyperObjective, theta: jax.Array, mode: str) -> tuple[float, np.ndarray, int]:
    """``J(theta)``, its exact gradient (reverse mode, or one vmapped JVP per hyper-parameter) and the run's first
    diverged step (-1 if none)."""
    if mode == "reverse":
        (value, diverged), grad = jax.jit(jax.value_and_grad(obj.with_divergence, has_aux=True))(theta)
        return float(value), np.asarray(grad), int(diverged)

    def along(direction: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
        value, tangent, diverged = jax.jvp(obj.with_divergence, (theta,), (direction,), has_aux=True)
        return value, tangent, diverged

    values, tangents, diverged = jax.jit(jax.vmap(along))(jnp.eye(theta.shape[0], dtype=theta.dtype))
    return float(values[0]), np.asarray(tangents), int(diverged[0])


def _scales(point: np.ndarray) -> np.ndarray:
    """Each hyper-parameter's scale ``max(|theta_i|, 1e-3)``: steps are relative to it."""
    return np.maximum(np.abs(point), 1e-3)


def finite_difference_check(obj: HyperObjective, theta: jax.Array, value: float, grad: np.ndarray, step: float,
                            rtol: float) -> GradientCheck:
    """The :class:`GradientCheck` of ``grad`` at ``theta`` (two runs, vmapped)."""
    scales = _scales(obj.point)
    scaled = grad * scales
    norm = float(np.linalg.norm(scaled))
    unit = scaled / norm if norm > 0 else np.ones_like(scaled) / math.sqrt(scaled.size)
    offset = jnp.asarray(step * scales * unit, theta.dtype)
    plus, minus = np.asarray(jax.jit(jax.vmap(obj.fn))(jnp.stack([theta + offset, theta - offset])))
    fd = float(plus - minus) / (2 * step)
    exact = float(np.dot(scaled, unit))
    noise = 256 * float(jnp.finfo(theta.dtype).eps) * max(abs(value), 1.0) / step
    agrees = bool(np.isfinite(exact) and abs(exact - fd) <= rtol * max(abs(exact), abs(fd)) + noise)
    return GradientCheck(dict(zip(obj.names, map(float, unit))), step, exact, fd, rtol, noise, agrees)


def _smoothed(obj: HyperObjective, theta: jax.Array, smoothing: float, samples: int, seed: int) -> HyperGradient:
    """Antithetic Gaussian-smoothing estimate: ``g_i = mean_k (J(theta + sigma eps_k) - J(theta - sigma eps_k))
    eps_k,i / (2 sigma_i)``, an unbiased estimate of the gradient of ``E_eps J(theta + sigma eps)``."""
    sigma = jnp.asarray(smoothing * _scales(obj.point), theta.dtype)
    eps = jax.random.normal(jax.random.PRNGKey(seed), (samples, theta.shape[0]), theta.dtype)
    points = jnp.concatenate([theta + sigma * eps, theta - sigma * eps, theta[None]])
    values, diverged = map(np.asarray, jax.jit(jax.vmap(obj.with_divergence))(points))
    if diverged[-1] >= 0:
        raise _diverged(obj, int(diverged[-1]))
    if np.any(diverged >= 0):
        raise ValueError(f"mode='smoothed': {int(np.sum(diverged >= 0))} of the {2 * samples} perturbed runs diverge "
                         f"(smoothing={smoothing} of each hyper-parameter); lower smoothing or the learning rates")
    plus, minus, value = values[:samples], values[samples:2 * samples], float(values[-1])
    per_sample = (plus - minus)[:, None] * np.asarray(eps) / (2 * np.asarray(sigma))
    grad = per_sample.mean(axis=0)
    stderr = per_sample.std(axis=0, ddof=1) / math.sqrt(samples) if samples > 1 else np.full(grad.shape, np.nan)
    names = obj.names
    return HyperGradient(value, dict(zip(names, map(float, grad))), dict(zip(names, map(float, obj.point))),
                         "smoothed", stderr=dict(zip(names, map(float, stderr))))
