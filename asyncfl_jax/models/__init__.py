"""Models: Flax modules and the pure (apply_fn, params) form the simulator uses."""

from asyncfl_jax.models.core import (MODEL_NAMES, Model, cross_entropy_loss, make_model, model_from_apply,
                                     model_from_flax, model_from_nnx)
from asyncfl_jax.models.flax_models import CNN, MLP, LogisticRegression
from asyncfl_jax.models.paper_models import (
    AlexNetCIFAR,
    AREALogisticRegression,
    CA2FLCNN,
    FEMNISTCNN,
    ResNet18GN,
    ShakespeareLSTM,
)

__all__ = [
    "AREALogisticRegression",
    "AlexNetCIFAR",
    "CA2FLCNN",
    "CNN",
    "FEMNISTCNN",
    "MLP",
    "LogisticRegression",
    "MODEL_NAMES",
    "Model",
    "ResNet18GN",
    "ShakespeareLSTM",
    "cross_entropy_loss",
    "make_model",
    "model_from_apply",
    "model_from_flax",
    "model_from_nnx",
]
