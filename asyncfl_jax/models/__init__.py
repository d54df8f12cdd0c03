"""Models: Flax modules and the pure (apply_fn, params) form the simulator uses."""

from asyncfl_jax.models.core import Model, cross_entropy_loss, make_model, model_from_apply, MODEL_NAMES
from asyncfl_jax.models.flax_models import CNN, MLP, LogisticRegression

__all__ = [
    "CNN",
    "MLP",
    "LogisticRegression",
    "MODEL_NAMES",
    "Model",
    "cross_entropy_loss",
    "make_model",
    "model_from_apply",
]
