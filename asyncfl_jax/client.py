"""Local training: a pure, vmappable function from (start model, client id, key, hyper-parameters) to a result.

A client ``i`` that receives the server model ``x`` runs K optimizer steps on its own data

    y_0 = x,   y_{k+1} = y_k - eta_l * u_k,   u_k = opt(g_k),   g_k = grad F_i(y_k; batch_k) + wd * y_k + mu * (y_k - x)

(``wd``: coupled L2 weight decay as in PyTorch's SGD; ``mu``: the FedProx proximal term; ``opt``: optional heavy-ball
momentum) and returns the model delta ``Delta = y_K - x``. Gradient-based methods (ACE, ACED, ASGD with gradient
uploads, delay-adaptive ASGD) instead ask for a single minibatch gradient with the same weight-decay term,

    g = grad F_i(x; batch_0) + wd * x,

so ``weight_decay`` means the same L2 term whatever the upload kind (the ACE digest's recommendation, item 5 of its
ambiguities: "a flag that adds wd * w uniformly to every method's gradient"; with the default ``wd = 0`` nothing is
added).

Minibatches: at the start of each job the client's examples are shuffled once; step ``k`` takes positions
``k*B .. k*B+B-1`` of that order, wrapping around (so ``K*B > n_i`` cycles through the data in the same order); a
client with ``n_i < B`` uses all its examples, each once, at every step.
``batch_size=None`` uses the client's full data at every step (deterministic; used by the exact tests).
With ``epochs`` set, client ``i`` runs ``K_i = ceil(epochs * ceil(n_i / B))`` steps (at most ``steps``; CA2FL's
"2 local epochs at batch 50" is ``K_i = 2 ceil(n_i / 50)``); the static
maximum is unrolled and the surplus steps are masked out.

All hyper-parameters that may differ between replicas (``client_lr``, ``momentum``, ``weight_decay``, ``prox_mu``)
are read from a dict of arrays at call time, so a sweep over them is a ``vmap``.

Your own optimizer (``LocalConfig(optimizer=...)``): any optax ``GradientTransformation``, or a factory
``hp -> GradientTransformation`` called inside the vmapped job with the replica's hyper-parameter arrays (so a swept
``client_lr`` read by the factory stays one vmapped program). A step is then

    g_k = grad F_i(y_k; batch_k) + mu * (y_k - x),   (u_k, s_{k+1}) = opt.update(g_k, s_k, y_k),   y_{k+1} = y_k + u_k

(optax's convention: the transformation's output is added, so it carries the learning rate and its sign). The
FedProx term ``prox_mu`` is still added to the gradient. ``momentum`` and ``weight_decay`` belong to the default
SGD chain only: with a custom optimizer they must keep their default 0 (put them in your chain, e.g.
``optax.add_decayed_weights``), and with a fixed transformation ``client_lr`` must keep its default too (the
transformation has its own learning rate); a non-default or swept value is refused rather than ignored.
``upload="gradient"`` algorithms send one minibatch gradient and use no optimizer.

Loss: the task's :class:`~asyncfl_jax.losses.Loss` on a :class:`~asyncfl_jax.losses.Batch` ``(x, y, weight, key)``.
Dropout: for a model with a training mode (``Model.train_apply``) step ``k`` of a job with key ``key`` uses the
dropout key ``fold_in(fold_in(key, DROPOUT_STREAM), k)``: independent between steps, clients, replicas (job keys
differ) and of the minibatch shuffle (which uses ``key`` itself); models without a training mode draw no key.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any, Callable, Mapping, Sequence

import jax
import jax.numpy as jnp
import optax

from asyncfl_jax.data.client_data import ClientData
from asyncfl_jax.losses import CLASSIFICATION, Batch, Loss
from asyncfl_jax.models.core import Model

HParams = Mapping[str, jax.Array]
LocalFn = Callable[..., jax.Array]
OptimizerFactory = Callable[[HParams], optax.GradientTransformation]
DROPOUT_STREAM = 0x0D50  # fold_in index of a job's dropout keys (the job key itself draws the minibatch order)

LOCAL_HPARAMS = {"client_lr": 0.05, "momentum": 0.0, "weight_decay": 0.0, "prox_mu": 0.0}
"""Local-training hyper-parameters (sweepable) and their defaults."""

HPARAM_SPELLINGS = {"lr": "client_lr", "learning_rate": "client_lr", "local_lr": "client_lr",
                    "client_learning_rate": "client_lr"}
"""Other spellings of a hyper-parameter, refused with the canonical name (the client learning rate is ``client_lr`` in
Python and in ``hparams``; ``--lr`` / ``local.lr`` on the command line and in a configuration file's ``local``)."""


def spelling_hint(name: str) -> str:
    """``"; did you mean 'client_lr' ..."`` for another spelling of a hyper-parameter, else ``""``."""
    if name not in HPARAM_SPELLINGS:
        return ""
    return (f"; the client learning rate is the hyper-parameter {HPARAM_SPELLINGS[name]!r} (hparams={{"
            f"'{HPARAM_SPELLINGS[name]}': ...}} in Python, --hparam {HPARAM_SPELLINGS[name]}=... to sweep it; "
            "--lr or local.lr sets it for every run)")


@dataclasses.dataclass(frozen=True)
class LocalConfig:
    """Static settings of local training (they fix the shapes of the compiled program).

    Attributes:
      steps: K, the number of local steps (the maximum when ``epochs`` is set).
      batch_size: B, examples per step; ``None`` for full-batch steps.
      epochs: if set, client i runs ``ceil(epochs * ceil(n_i / B))`` steps, capped at ``steps``.
      use_momentum: keep a momentum buffer (needed when any replica has ``momentum > 0``).
      optimizer: ``None`` for the default SGD chain (:func:`client_optimizer`), an optax ``GradientTransformation``,
        or a factory ``hp -> GradientTransformation`` (see the module docstring for how the hyper-parameters
        interact with it).
    """

    steps: int = 10
    batch_size: int | None = 32
    epochs: float | None = None
    use_momentum: bool = False
    optimizer: optax.GradientTransformation | OptimizerFactory | None = None

    def __new__(cls, *args: Any, **kwargs: Any) -> "LocalConfig":
        misnamed = [k for k in kwargs if k in HPARAM_SPELLINGS or k in LOCAL_HPARAMS]
        if misnamed:  # hyper-parameters are not static settings: they go to simulate(hparams=...) and can be swept
            key = misnamed[0]
            name = HPARAM_SPELLINGS.get(key, key)
            what = "the client learning rate" if name == "client_lr" else repr(key)
            where = "; on the command line --lr, in a configuration file local.lr" if name == "client_lr" else ""
            raise TypeError(f"LocalConfig() got the keyword {key!r}: {what} is not one of its static settings but "
                            f"the hyper-parameter {name!r}: give it as simulate(..., hparams={{{name!r}: value}}) "
                            f"(a list of values sweeps it){where}")
        return super().__new__(cls)
    def __post_init__(self) -> None:
        """The fields' types, checked when the settings are made (their values by :meth:`validate`)."""
        from asyncfl_jax.arguments import check_bool, check_int, check_real

        check_int("LocalConfig.steps", self.steps)
        check_int("LocalConfig.batch_size", self.batch_size, optional=True)
        check_real("LocalConfig.epochs", self.epochs, optional=True)
        check_bool("LocalConfig.use_momentum", self.use_momentum)

    def identity(self) -> dict[str, Any]:
        """The settings as JSON values (what a checkpoint must match); a custom optimizer by its name."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "optimizer"}
        if self.optimizer is not None:
            out["optimizer"] = optimizer_name(self.optimizer)
        return out

    def validate(self) -> None:
        if not isinstance(self.steps, int) or self.steps < 1:
            raise ValueError(f"local.steps must be an integer >= 1, got {self.steps!r}")
        if self.batch_size is not None and (not isinstance(self.batch_size, int) or self.batch_size < 1):
            raise ValueError(f"local.batch_size must be an integer >= 1 or null (full batch), got {self.batch_size!r}")
        if self.epochs is not None:
            if self.batch_size is None:
                raise ValueError("local.epochs needs local.batch_size (steps per epoch = ceil(n_i / batch_size))")
            if not self.epochs > 0:
                raise ValueError(f"local.epochs must be > 0, got {self.epochs!r}")
        if self.optimizer is not None:
            if not (isinstance(self.optimizer, optax.GradientTransformation) or callable(self.optimizer)):
                raise ValueError("local.optimizer must be None (SGD), an optax GradientTransformation or a function "
                                 f"hparams -> GradientTransformation, got {self.optimizer!r}")
            if self.use_momentum:
                raise ValueError("local.use_momentum belongs to the default SGD optimizer; with a custom "
                                 "local.optimizer put momentum in its chain (e.g. optax.sgd(lr, momentum=0.9))")

    def make_optimizer(self, hp: HParams) -> optax.GradientTransformation:
        """The optimizer of one job with hyper-parameters ``hp`` (scalar arrays)."""
        if self.optimizer is None:
            return client_optimizer(hp, self.use_momentum)
        if isinstance(self.optimizer, optax.GradientTransformation):
            return self.optimizer
        tx = self.optimizer(hp)
        if not isinstance(tx, optax.GradientTransformation):
            raise ValueError(f"local.optimizer: the factory must return an optax GradientTransformation, got {tx!r}")
        return tx


def optimizer_name(optimizer: Any) -> str:
    """A short description of a custom optimizer (a factory's qualified name, or "optax transformation")."""
    if isinstance(optimizer, optax.GradientTransformation):
        return "optax transformation"
    return f"factory {getattr(optimizer, '__module__', '?')}.{getattr(optimizer, '__qualname__', repr(optimizer))}"


def check_optimizer_hparams(config: LocalConfig, replicas: Sequence[Any]) -> None:
    """Refuses hyper-parameters a custom optimizer would silently ignore (``replicas``: objects with ``hparams``).

    With ``local.optimizer`` set, ``momentum`` and ``weight_decay`` (parts of the default SGD chain) must be 0 in
    every replica; with a fixed transformation (not a factory), ``client_lr`` must keep its default too.
    """
    if config.optimizer is None:
        return
    fixed = isinstance(config.optimizer, optax.GradientTransformation)
    names = ("momentum", "weight_decay") + (("client_lr",) if fixed else ())
    for name in names:
        values = sorted({float(r.hparams[name]) for r in replicas})
        if values != [float(LOCAL_HPARAMS[name])]:
            why = ("the transformation has its own learning rate; pass a factory hp -> transformation to read "
                   "client_lr" if name == "client_lr" else "it belongs to the default SGD chain; put it in your "
                   "optimizer's chain instead")
            raise ValueError(f"hyper-parameter {name} = {values if len(values) > 1 else values[0]} is not used by a "
                             f"custom local.optimizer ({why}); leave it at {LOCAL_HPARAMS[name]}")


def client_optimizer(hp: HParams, use_momentum: bool) -> optax.GradientTransformation:
    """SGD with coupled weight decay and optional heavy-ball momentum: ``u = m*u + (g + wd*y)``, ``y -= lr*u``."""
    parts = [optax.add_decayed_weights(hp["weight_decay"])]
    if use_momentum:
        parts.append(optax.trace(decay=hp["momentum"], nesterov=False))
    parts.append(optax.scale(-hp["client_lr"]))
    return optax.chain(*parts)


def _batch_loss(model: Model, loss: Loss, flat: jax.Array, x: jax.Array, y: jax.Array, w: jax.Array | None,
                key: jax.Array | None = None) -> jax.Array:
    """The task's loss of the flat parameters on one batch (``key``: the step's dropout key or ``None``)."""
    if w is None:
        w = jnp.ones(x.shape[:1], jnp.float32)
    return loss.value(model, model.unravel(flat), Batch(x, y, w, key))


@dataclasses.dataclass(frozen=True)
class _Layers:
    """The form of a job's iterate ``y`` inside its local loop: the model's parameters as a list of arrays, one per
    leaf of the model's pytree, in the flat vector's dtype (``to_layers`` splits and reshapes the flat vector,
    ``to_flat`` concatenates the leaves back: the layout of ``ravel_pytree``, so ``to_flat(to_layers(v)) == v``).

    Carried this way, a local step reads and writes each layer's array in place; carried as one flat vector (the
    form of the engine's messages), every step cut the weight matrices out of the vector (a copy of each) and
    concatenated the gradient back into one (another), about 2.4 MB of extra memory traffic per job-step of the
    784-200-200-10 MLP (docs/benchmarks.md, "Issue 24 leftovers"). The arithmetic is the same element by element.
    """

    treedef: Any
    shapes: tuple[tuple[int, ...], ...]
    dtypes: tuple[Any, ...]

    @classmethod
    def of(cls, model: Model) -> "_Layers":
        leaves, treedef = jax.tree_util.tree_flatten(model.init_params)
        return cls(treedef, tuple(tuple(jnp.shape(a)) for a in leaves), tuple(jnp.result_type(a) for a in leaves))

    def to_layers(self, flat: jax.Array) -> list[jax.Array]:
        out, at = [], 0
        for shape in self.shapes:
            size = math.prod(shape)
            out.append(flat[at:at + size].reshape(shape))
            at += size
        return out

    def to_flat(self, layers: Sequence[jax.Array]) -> jax.Array:
        return jnp.concatenate([a.reshape(-1) for a in layers])

    def params(self, layers: Sequence[jax.Array]) -> Any:
        """The model's parameter pytree (each leaf in the model's dtype, as ``Model.unravel`` gives it)."""
        return jax.tree_util.tree_unflatten(self.treedef, [a.astype(d) for a, d in zip(layers, self.dtypes)])


def dropout_key(key: jax.Array, step: jax.Array) -> jax.Array:
    """The dropout key of local step ``step`` of the job with key ``key``."""
    return jax.random.fold_in(jax.random.fold_in(key, DROPOUT_STREAM), step)


def _shuffled_order(key: jax.Array, count: jax.Array, size: int, needed: int) -> jax.Array:
    """The first ``min(needed, size)`` entries of a random order of the client's ``count`` examples.

    When ``needed >= count`` the first ``count`` entries are a random permutation of ``0..count-1`` (padding comes
    after them); otherwise they are ``needed`` distinct random examples. ``top_k`` of random scores does this without
    a full sort (sorting is slow on XLA:CPU).
    """
    scores = jax.random.uniform(key, (size,))
    scores = jnp.where(jnp.arange(size) < count, scores, -1.0)  # padding comes last
    return jax.lax.top_k(scores, min(needed, size))[1]


def _check_local_update(config: LocalConfig, output: str, max_steps: int | None,
                        differentiable_steps: bool) -> None:
    """The arguments of :func:`make_local_update` that cannot work together, refused before anything is traced."""
    config.validate()
    if output not in ("delta", "gradient"):
        raise ValueError(f"output must be 'delta' or 'gradient', got {output!r}")
    if differentiable_steps and max_steps is None:
        raise ValueError("differentiable_steps applies to a per-job number of local steps (max_steps); without it the "
                         "loop has a fixed trip count and is differentiable as it is")
    if max_steps is not None:
        if output != "delta" or config.epochs is not None:
            raise ValueError("a per-job number of local steps needs output='delta' and local.epochs unset")
        if not isinstance(max_steps, int) or max_steps < 1:
            raise ValueError(f"max_steps must be an integer >= 1, got {max_steps!r}")


def _minibatch(batch: int | None, data: ClientData, client: jax.Array, order: jax.Array | None, count: jax.Array,
               k: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Local step ``k``'s minibatch of ``client`` (features, labels, weights): the examples at positions
    ``k B .. k B + B - 1`` (mod ``n_i``) of the job's random ``order``; ``batch=None``: every example, padding
    masked."""
    if batch is None:  # full batch: every example, padding masked out
        rows = data.indices[client]
        weights = (jnp.arange(data.max_size) < count).astype(jnp.float32)
        return data.features[rows], data.labels[rows], weights
    positions = (k * batch + jnp.arange(batch)) % count
    rows = data.indices[client, order[positions]]
    # A client with fewer than B examples uses each once per step (the wrapped-around repeats get weight 0).
    weights = (jnp.arange(batch) < count).astype(jnp.float32)
    return data.features[rows], data.labels[rows], weights


def make_local_update(model: Model, config: LocalConfig, output: str = "delta",
                      max_steps: int | None = None, loss: Loss | None = None,
                      differentiable_steps: bool = False) -> LocalFn:
    """Returns ``local(x, client, key, hp, data, steps=None) -> result`` (a flat vector of length d).

    ``data`` (every client's :class:`ClientData`) is an argument rather than a constant of the function, so the
    compiled program does not embed the dataset (which makes compiling slow).

    Args:
      model: the model (its ``flat_apply`` is used).
      config: static local-training settings.
      output: ``"delta"`` for ``y_K - x`` or ``"gradient"`` for one minibatch gradient at ``x``.
      max_steps: when given, ``local`` takes a per-job step count ``steps`` (an int32 array, ``1 <= steps <=
        max_steps``; AsyncFedED's adaptive K) and runs exactly that many steps (a loop with a traced bound) instead
        of ``config.steps``; minibatches are drawn as for a job of ``max_steps`` steps, so a job's first ``k`` steps
        do not depend on its length.
      loss: the loss to minimize (default: softmax cross-entropy, :data:`asyncfl_jax.losses.CLASSIFICATION`).
      differentiable_steps: with ``max_steps``, run the per-job step count as ``max_steps`` steps of which the
        steps ``k >= steps`` are masked (they leave the state unchanged) instead of a loop with a traced bound: the
        same result, but reverse-mode differentiable (``jax.grad`` cannot go through a loop whose trip count is
        traced), at the cost of ``max_steps`` gradient evaluations per job. Used by
        :func:`asyncfl_jax.hypergrad.hypergradient`.
    """
    loss = CLASSIFICATION if loss is None else loss
    uses_dropout = model.train_apply is not None
    _check_local_update(config, output, max_steps, differentiable_steps)
    batch = config.batch_size
    examples_needed = (1 if output == "gradient" else max(config.steps, max_steps or 0)) * (batch or 0)
    minibatch = functools.partial(_minibatch, batch)

    # The iterate's form inside the loop: per layer with the built-in SGD chain (elementwise, so the same arithmetic);
    # a custom optimizer sees the flat vector, as it always has (a layer-wise one, e.g. LARS, would otherwise change).
    layers = _Layers.of(model) if config.optimizer is None and output == "delta" else None
    to_form = (lambda v: v) if layers is None else layers.to_layers
    from_form = (lambda v: v) if layers is None else layers.to_flat

    def form_loss(y, xb, yb, wb, kb):
        if layers is None:
            return _batch_loss(model, loss, y, xb, yb, wb, kb)
        if wb is None:
            wb = jnp.ones(xb.shape[:1], jnp.float32)
        return loss.value(model, layers.params(y), Batch(xb, yb, wb, kb))

    def local(x: jax.Array, client: jax.Array, key: jax.Array, hp: HParams, data: ClientData,
              steps: jax.Array | None = None) -> jax.Array:
        count = data.counts[client]
        order = _shuffled_order(key, count, data.max_size, examples_needed) if batch is not None else None
        grad_fn = jax.grad(form_loss)

        def step_key(k):
            return dropout_key(key, k) if uses_dropout else None

        if output == "gradient":  # one minibatch gradient at x, with the same coupled weight decay as a local step
            g = grad_fn(x, *minibatch(data, client, order, count, jnp.int32(0)), step_key(jnp.int32(0)))
            return g + hp["weight_decay"] * x

        opt = config.make_optimizer(hp)
        x_form = to_form(x)

        def one_step(k, carry):
            y, opt_state = carry
            g = grad_fn(y, *minibatch(data, client, order, count, k), step_key(k))
            g = jax.tree_util.tree_map(lambda gi, yi, xi: gi + hp["prox_mu"] * (yi - xi), g, y, x_form)  # FedProx
            updates, opt_state = opt.update(g, opt_state, y)
            return jax.tree_util.tree_map(jnp.add, y, updates), opt_state

        def masked_step(k, carry):  # per-client step count: the static maximum runs, surplus steps are masked
            steps_per_epoch = -(-count // batch)  # ceil(n_i / B): the last partial batch counts as a step
            steps_i = jnp.clip(jnp.ceil(config.epochs * steps_per_epoch).astype(jnp.int32), 1, config.steps)
            return jax.tree_util.tree_map(lambda n, o: jnp.where(k < steps_i, n, o), one_step(k, carry), carry)

        body = one_step if config.epochs is None else masked_step
        if max_steps is not None:
            if steps is None:
                raise ValueError("this local update takes a per-job number of steps")
            count_i = jnp.clip(steps, 1, max_steps)
            if differentiable_steps:  # a static trip count (a scan): the steps past count_i keep the state

                def counted_step(k, carry):
                    return jax.tree_util.tree_map(lambda n, o: jnp.where(k < count_i, n, o), one_step(k, carry), carry)

                y, _ = jax.lax.fori_loop(0, max_steps, counted_step, (x_form, opt.init(x_form)))
            else:
                y, _ = jax.lax.fori_loop(0, count_i, one_step, (x_form, opt.init(x_form)))
            return from_form(y) - x
        y, _ = jax.lax.fori_loop(0, config.steps, body, (x_form, opt.init(x_form)))
        return from_form(y) - x

    return local


def local_flops_per_job(model: Model, data: ClientData, config: LocalConfig, loss: Loss | None = None) -> float:
    """FLOPs of one local job (K forward+backward passes on B examples), from XLA's cost analysis."""
    b = config.batch_size or data.max_size
    x = jnp.zeros((b, *data.features.shape[1:]), jnp.float32)
    y = jnp.zeros((b, *data.labels.shape[1:]), data.labels.dtype)
    loss = CLASSIFICATION if loss is None else loss
    grad = jax.jit(jax.grad(lambda flat: _batch_loss(model, loss, flat, x, y, None)))
    cost = grad.lower(model.flat_params).compile().cost_analysis()
    if isinstance(cost, (list, tuple)):
        cost = cost[0]
    flops = float(cost.get("flops", math.nan)) if cost else math.nan
    return flops * config.steps
