"""The model abstraction: a pure ``apply_fn(params, x) -> logits`` with its initial parameters.

Everything the simulator stores per client or per replica is a flat float32 vector (``jax.flatten_util``), so a model
also carries the ``unravel`` function that turns a flat vector back into the parameter pytree. Only trainable
parameters are in that vector: :func:`model_from_flax` (which :func:`make_model` uses) refuses a Flax module whose
``init`` returns other collections (BatchNorm's ``batch_stats``...), rather than train them as parameters.

Dropout: a model may carry ``train_apply(params, x, key)``, its training-mode forward pass with the dropout key
``key``; local training calls it with a fresh key at every step, evaluation calls ``apply_fn`` (deterministic).
"""

from __future__ import annotations

import inspect
from typing import Any, Callable, NamedTuple, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.flatten_util import ravel_pytree

from asyncfl_jax.losses import cross_entropy_loss

from asyncfl_jax.models.flax_models import CNN, MLP, LogisticRegression
from asyncfl_jax.models.paper_models import (
    AlexNetCIFAR,
    AREALogisticRegression,
    CA2FLCNN,
    FEMNISTCNN,
    ResNet18GN,
    ShakespeareLSTM,
)

ApplyFn = Callable[[Any, jax.Array], jax.Array]
TrainApplyFn = Callable[[Any, jax.Array, jax.Array], jax.Array]
TRAIN_ARGS = ("train", "deterministic")
MODEL_NAMES = (
    "logreg",
    "mlp",
    "cnn",
    "ca2fl_cnn",
    "resnet18_gn",
    "alexnet_cifar",
    "femnist_cnn",
    "shakespeare_lstm",
    "area_logreg",
)
_IMAGE_MODELS = ("cnn", "ca2fl_cnn", "resnet18_gn", "alexnet_cifar", "femnist_cnn")


class Model(NamedTuple):
    """A model as pure functions and data.

    Attributes:
      apply_fn: ``apply_fn(params, x) -> logits`` for a batch ``x``; pure and differentiable in ``params``.
      init_params: the initial parameter pytree (the server's ``x_0``).
      name: a short description.
      train_apply: ``train_apply(params, x, key) -> logits``, the training-mode forward pass with dropout key
        ``key`` (e.g. ``module.apply({"params": p}, x, train=True, rngs={"dropout": key})``); ``None`` when the
        model has no training mode (then training uses ``apply_fn`` and no key is drawn).
    """

    apply_fn: ApplyFn
    init_params: Any
    name: str = "model"
    train_apply: TrainApplyFn | None = None

    def forward(self, params: Any, x: jax.Array, key: jax.Array | None = None) -> jax.Array:
        """The forward pass: ``train_apply(params, x, key)`` when a key is given and the model has a training mode,
        else ``apply_fn(params, x)``."""
        if key is None or self.train_apply is None:
            return self.apply_fn(params, x)
        return self.train_apply(params, x, key)

    @property
    def flat_params(self) -> jax.Array:
        """The initial parameters as one float vector of length d: float64 when the parameters are float64 (a float64
        run, :mod:`asyncfl_jax.precision`), else float32."""
        flat = ravel_pytree(self.init_params)[0]
        return flat if flat.dtype == jnp.float64 else flat.astype(jnp.float32)

    @property
    def unravel(self) -> Callable[[jax.Array], Any]:
        """Turns a flat vector of length d back into the parameter pytree."""
        return ravel_pytree(self.init_params)[1]

    @property
    def num_params(self) -> int:
        return int(self.flat_params.shape[0])

    def flat_apply(self, flat_params: jax.Array, x: jax.Array) -> jax.Array:
        """``apply_fn`` on a flat parameter vector."""
        return self.apply_fn(self.unravel(flat_params), x)


def model_from_apply(apply_fn: ApplyFn, params: Any, name: str = "custom",
                     train_apply: TrainApplyFn | None = None) -> Model:
    """Wraps any pure ``(apply_fn, params)`` pair, e.g. a hand-written JAX model, as a :class:`Model`
    (``train_apply(params, x, key)``: an optional training-mode forward pass with a dropout key)."""
    return Model(apply_fn=apply_fn, init_params=params, name=name, train_apply=train_apply)


def _train_arg(module: nn.Module, train_arg: str | None) -> str | None:
    if train_arg != "auto":
        if train_arg is not None and train_arg not in TRAIN_ARGS:
            raise ValueError(f"model_from_flax: train_arg must be 'auto', None or one of {list(TRAIN_ARGS)}, "
                             f"got {train_arg!r}")
        return train_arg
    names = inspect.signature(type(module).__call__).parameters
    found = [a for a in TRAIN_ARGS if a in names]
    return found[0] if found else None


def _mode_kwargs(train_arg: str | None, train: bool) -> dict[str, bool]:
    if train_arg is None:
        return {}
    return {train_arg: train} if train_arg == "train" else {train_arg: not train}


def model_from_flax(module: nn.Module, example_input: jax.Array, seed: int = 0, name: str | None = None,
                    train_arg: str | None = "auto") -> Model:
    """Wraps a Flax ``linen`` module as a :class:`Model`, initialised with ``PRNGKey(seed)`` on ``example_input``
    (a batch, e.g. ``jnp.zeros((1, *input_shape))``). The model's parameter pytree is Flax's variables dict
    ``{"params": ...}`` (so ``module.apply(params, x)`` works on it, as ``model.apply_fn(params, x)`` does).

    Only the ``params`` collection is trained: a module whose ``init`` returns any other collection (BatchNorm's
    ``batch_stats``, ``cache``, ``intermediates``...) is refused, since those are not parameters and averaging or
    differentiating them would be wrong (use ``nn.GroupNorm`` or ``nn.LayerNorm`` instead of ``nn.BatchNorm``).

    Training and evaluation mode: ``train_arg`` is the keyword of ``module.__call__`` that switches them:
    ``"train"`` (``train=True`` in local training, ``False`` in evaluation), ``"deterministic"`` (the opposite
    values, as ``nn.Dropout`` takes), ``None`` (no mode: the module is called without one and no dropout key is
    drawn), or ``"auto"`` (the default: ``"train"`` or ``"deterministic"`` when ``__call__`` has such an argument,
    else ``None``). With a mode, local training calls ``module.apply(..., rngs={"dropout": key})`` with a key per
    step (see :mod:`asyncfl_jax.client`); evaluation is deterministic and draws no key.
    """
    if not isinstance(module, nn.Module):
        raise ValueError(f"model_from_flax needs a flax.linen Module, got {type(module).__name__}")
    mode = _train_arg(module, train_arg)
    eval_kw, train_kw = _mode_kwargs(mode, False), _mode_kwargs(mode, True)
    variables = module.init({"params": jax.random.PRNGKey(seed)}, jnp.asarray(example_input), **eval_kw)
    others = sorted(set(variables) - {"params"})
    if others:
        raise ValueError(
            f"model_from_flax: {type(module).__name__}.init returns the collection(s) {others} besides 'params'; "
            "only trainable parameters can be simulated (they are averaged and differentiated as one flat vector). "
            "BatchNorm keeps running statistics in 'batch_stats': use nn.GroupNorm or nn.LayerNorm instead.")
    if "params" not in variables:
        raise ValueError(f"model_from_flax: {type(module).__name__} has no parameters")

    def apply_fn(params: Any, x: jax.Array) -> jax.Array:
        return module.apply(params, x, **eval_kw)

    train_apply = None
    if mode is not None:
        def train_apply(params: Any, x: jax.Array, key: jax.Array) -> jax.Array:
            return module.apply(params, x, rngs={"dropout": key}, **train_kw)

    return Model(apply_fn=apply_fn, init_params={"params": variables["params"]}, name=name or type(module).__name__,
                 train_apply=train_apply)


def make_model(
    name: str,
    input_shape: Sequence[int],
    num_classes: int,
    seed: int = 0,
    hidden: Sequence[int] = (200, 200),
) -> Model:
    """Builds one of the built-in Flax models and initialises it with ``PRNGKey(seed)``.

    Args:
      name: one of :data:`MODEL_NAMES`:

        - "logreg": multinomial logistic regression (with bias);
        - "mlp": ReLU MLP with ``hidden`` widths (the default ``(200, 200)`` is the AsyncFedED Synthetic MLP
          60-200-200-10 and the AsynFLC-EF MNIST MLP 784-200-200-10);
        - "cnn": two 5x5 conv layers, two pools, FC 512 (FedAvg-style; any image size);
        - the papers' models (``paper_models.py``): "ca2fl_cnn" (CA2FL's CIFAR CNN), "resnet18_gn" (CIFAR
          ResNet-18 with GroupNorm), "alexnet_cifar" (AsynFLC-EF's AlexNet), "femnist_cnn" (AsyncFedED's FEMNIST
          CNN), "shakespeare_lstm" (AsyncFedED's Shakespeare LSTM; inputs are character ids and the vocabulary is
          ``num_classes``) and "area_logreg" (AREA's logistic regression: no bias, zero initial model).

        ``hidden`` is used by "mlp" only.
      input_shape: shape of one example, e.g. ``(28, 28, 1)``, ``(32, 32, 3)``, ``(60,)`` or ``(80,)``; image models
        need ``[H, W]`` or ``[H, W, C]``.
      num_classes: number of output classes.
      seed: initialisation seed (the same for every replica, so replicas start from the same ``x_0``).
    """
    if name in _IMAGE_MODELS and len(input_shape) not in (2, 3):
        raise ValueError(f"model {name!r} needs image inputs [H, W(, C)], got input shape {tuple(input_shape)}")
    if name == "logreg":
        module = LogisticRegression(num_classes=num_classes)
    elif name == "mlp":
        module = MLP(num_classes=num_classes, hidden=tuple(hidden))
    elif name == "cnn":
        module = CNN(num_classes=num_classes)
    elif name == "ca2fl_cnn":
        module = CA2FLCNN(num_classes=num_classes)
    elif name == "resnet18_gn":
        module = ResNet18GN(num_classes=num_classes)
    elif name == "alexnet_cifar":
        module = AlexNetCIFAR(num_classes=num_classes)
    elif name == "femnist_cnn":
        module = FEMNISTCNN(num_classes=num_classes)
    elif name == "shakespeare_lstm":
        module = ShakespeareLSTM(vocab_size=num_classes, num_classes=num_classes)
    elif name == "area_logreg":
        module = AREALogisticRegression(num_classes=num_classes)
    else:
        raise ValueError(f"model must be one of {list(MODEL_NAMES)}, got {name!r}")
    return model_from_flax(module, jnp.zeros((1, *input_shape), jnp.float32), seed=seed, name=name)

