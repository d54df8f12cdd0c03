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


FLAX_COLLECTIONS_HINT = ("BatchNorm keeps running statistics ('batch_stats'), which are not parameters: averaging "
                         "and differentiating them as parameters would be wrong; use nn.GroupNorm or nn.LayerNorm "
                         "(the built-in models do), or keep the other collections fixed inside apply_fn and pass "
                         "only {'params': variables['params']}")


def check_parameters(params: Any, where: str) -> None:
    """Refuses (``ValueError``) parameters that hold more than trainable parameters, which the simulator would
    otherwise train as parameters without a word: a Flax variables dict with collections besides ``"params"``
    (``batch_stats``, ``cache``...), an NNX module or an NNX state with variables other than ``nnx.Param``
    (BatchNorm's ``BatchStat``, Dropout's RNG streams); and parameters with no array at all."""
    if _is_nnx_module(params):
        raise ValueError(f"{where}: got a Flax NNX module as parameters; wrap it with model_from_flax(module) "
                         "(it is split with nnx.split into its nnx.Param state and the rest)")
    if isinstance(params, dict) and "params" in params and set(params) - {"params"}:
        others = sorted(map(str, set(params) - {"params"}))
        raise ValueError(f"{where}: the parameters are a Flax variables dict with the collection(s) {others} "
                         f"besides 'params'; only trainable parameters can be simulated. {FLAX_COLLECTIONS_HINT}")
    if type(params).__name__ == "State" and type(params).__module__.startswith("flax.nnx"):
        others = _non_param_paths(params)
        if others:
            raise ValueError(f"{where}: the NNX state holds variables other than nnx.Param ({', '.join(others[:4])}"
                             f"{' ...' if len(others) > 4 else ''}); use model_from_flax(module), which splits "
                             "them off and refuses them with the reason")
    if not jax.tree_util.tree_leaves(params):
        raise ValueError(f"{where}: the model has no parameters")


def _is_nnx_module(value: Any) -> bool:
    try:
        from flax import nnx
    except ImportError:  # a Flax without NNX
        return False
    return isinstance(value, nnx.Module)


def _non_param_paths(state: Any) -> list[str]:
    """The paths of the variables of an NNX state that are not ``nnx.Param``."""
    from flax import nnx

    split = getattr(nnx, "split_state", None)  # flax >= 0.11; State.split before
    _, others = split(state, nnx.Param, ...) if split is not None else state.split(nnx.Param, ...)
    return [jax.tree_util.keystr(path) for path, _ in jax.tree_util.tree_leaves_with_path(others)]


def model_from_apply(apply_fn: ApplyFn, params: Any, name: str = "custom",
                     train_apply: TrainApplyFn | None = None) -> Model:
    """Wraps any pure ``(apply_fn, params)`` pair, e.g. a hand-written JAX model, as a :class:`Model`
    (``train_apply(params, x, key)``: an optional training-mode forward pass with a dropout key).

    Every array of ``params`` is trained. A Flax variables dict with collections besides ``"params"`` (BatchNorm's
    ``batch_stats``) is refused, as is an NNX module or state with variables that are not ``nnx.Param``
    (:func:`check_parameters`): they are not parameters. Wrap Flax modules with :func:`model_from_flax`."""
    check_parameters(params, "model_from_apply")
    return Model(apply_fn=apply_fn, init_params=params, name=name, train_apply=train_apply)


def model_from_nnx(module: Any, name: str | None = None) -> Model:
    """Wraps a Flax NNX module (already initialised, e.g. ``MyNet(rngs=nnx.Rngs(0))``) as a :class:`Model`.

    The module is split with ``graphdef, params, rest = nnx.split(module, nnx.Param, ...)``: the parameter pytree is
    the ``nnx.Param`` state, and ``apply_fn(params, x) = nnx.merge(graphdef, params, rest)(x)``. Only ``nnx.Param``
    variables can be simulated: a module with other state (``nnx.BatchNorm``'s ``BatchStat``, ``nnx.Dropout``'s RNG
    streams, any ``nnx.Variable`` subclass) is refused with the paths of those variables; use ``nnx.LayerNorm`` or
    ``nnx.GroupNorm`` instead of BatchNorm, and leave dropout out (or use a linen module, whose dropout key the
    simulator draws: :func:`model_from_flax`). The module is called as ``module(x)`` in training and in evaluation."""
    from flax import nnx

    graphdef, params, rest = nnx.split(module, nnx.Param, ...)
    others = [jax.tree_util.keystr(path) for path, _ in jax.tree_util.tree_leaves_with_path(rest)]
    if others:
        raise ValueError(f"model_from_flax: the NNX module {type(module).__name__} holds state other than nnx.Param "
                         f"at {', '.join(others[:4])}{' ...' if len(others) > 4 else ''}; only trainable parameters "
                         "can be simulated (they are averaged and differentiated as one flat vector). BatchNorm's "
                         "statistics (BatchStat) are not parameters: use nnx.LayerNorm or nnx.GroupNorm; Dropout's "
                         "RNG streams: leave dropout out, or write the model with flax.linen")
    check_parameters(params, "model_from_flax")

    def apply_fn(p: Any, x: jax.Array) -> jax.Array:
        return nnx.merge(graphdef, p, rest)(x)

    return Model(apply_fn=apply_fn, init_params=params, name=name or type(module).__name__)


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
    (a Flax NNX module, already initialised, is wrapped by :func:`model_from_nnx`; ``example_input``, ``seed`` and
    ``train_arg`` are then not used)
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
    if _is_nnx_module(module):
        return model_from_nnx(module, name)
    if not isinstance(module, nn.Module):
        raise ValueError(f"model_from_flax needs a flax.linen Module or a Flax NNX Module, got "
                         f"{type(module).__name__}")
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

