"""Small Flax models for the simulator: multinomial logistic regression, an MLP and a CNN for 28x28 images."""

from __future__ import annotations

from typing import Sequence

import flax.linen as nn
import jax

from asyncfl_jax.models.conv import conv_general_dilated
from asyncfl_jax.models.pool import max_pool_2x2


class LogisticRegression(nn.Module):
    """Multinomial logistic regression: ``logits = W flatten(x) + b``."""

    num_classes: int

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        x = x.reshape((x.shape[0], -1))
        return nn.Dense(self.num_classes)(x)


class MLP(nn.Module):
    """Fully connected ReLU network, e.g. ``hidden=(200, 200)`` gives 784-200-200-10 on Fashion-MNIST."""

    num_classes: int
    hidden: Sequence[int] = (200, 200)

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        x = x.reshape((x.shape[0], -1))
        for width in self.hidden:
            x = nn.relu(nn.Dense(width)(x))
        return nn.Dense(self.num_classes)(x)


class CNN(nn.Module):
    """Small CNN for 28x28x1 images: conv5x5(32)-ReLU-maxpool2 -> conv5x5(64)-ReLU-maxpool2 -> FC(512)-ReLU -> FC.

    The two-conv, two-pool layout of the FedAvg paper's MNIST CNN (about 1.66M parameters for 10 classes).
    """

    num_classes: int
    features: Sequence[int] = (32, 64)
    dense: int = 512

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        if x.ndim == 3:  # [B, H, W] -> [B, H, W, 1]
            x = x[..., None]
        for f in self.features:
            x = nn.relu(nn.Conv(f, kernel_size=(5, 5), padding="SAME", conv_general_dilated=conv_general_dilated)(x))
            x = max_pool_2x2(x)
        x = x.reshape((x.shape[0], -1))
        x = nn.relu(nn.Dense(self.dense)(x))
        return nn.Dense(self.num_classes)(x)
