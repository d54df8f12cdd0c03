"""The model abstraction: a pure ``apply_fn(params, x) -> logits`` with its initial parameters.

Everything the simulator stores per client or per replica is a flat float32 vector (``jax.flatten_util``), so a model
also carries the ``unravel`` function that turns a flat vector back into the parameter pytree.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import optax
from jax.flatten_util import ravel_pytree

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
    """

    apply_fn: ApplyFn
    init_params: Any
    name: str = "model"

    @property
    def flat_params(self) -> jax.Array:
        """The initial parameters as one float32 vector of length d."""
        return ravel_pytree(self.init_params)[0].astype(jnp.float32)

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


def model_from_apply(apply_fn: ApplyFn, params: Any, name: str = "custom") -> Model:
    """Wraps any pure ``(apply_fn, params)`` pair, e.g. a hand-written JAX model, as a :class:`Model`."""
    return Model(apply_fn=apply_fn, init_params=params, name=name)


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
    dummy = jnp.zeros((1, *input_shape), jnp.float32)
    params = module.init(jax.random.PRNGKey(seed), dummy)
    return Model(apply_fn=module.apply, init_params=params, name=name)


def cross_entropy_loss(logits: jax.Array, labels: jax.Array, weights: jax.Array | None = None) -> jax.Array:
    """Mean softmax cross-entropy; with ``weights`` a weighted mean (padding rows get weight 0)."""
    losses = optax.softmax_cross_entropy_with_integer_labels(logits, labels)
    if weights is None:
        return jnp.mean(losses)
    return jnp.sum(losses * weights) / jnp.maximum(jnp.sum(weights), 1.0)
