"""The papers' models as Flax modules, as described in the papers and their digests.

Every module here is a pure function of its parameters: no BatchNorm, no dropout, no mutable collections, so
``module.init`` returns only ``{"params": ...}`` and ``module.apply(params, x)`` needs no ``rngs`` and no
``mutable``. That is what the simulator's flat-parameter form (:meth:`asyncfl_jax.models.Model.flat_apply`) needs.

Image models take NHWC batches ``[B, H, W, C]`` (a ``[B, H, W]`` batch gets a channel axis of 1). Parameter counts
below are for the digests' class counts and input shapes; they are checked in ``tests/test_paper_models.py``.

Models (name, paper and digest, input / classes, parameters):

- ``ca2fl_cnn``: CA2FL (003, section 4.1); 32x32x3 / 10; 2,218,314.
- ``resnet18_gn``: CA2FL (003, section 4.1) and ACE (000, section 5.1); 32x32x3 / 10 or 100; 11,173,962 or 11,220,132.
- ``alexnet_cifar``: AsynFLC-EF (004, A4); 32x32x3 / 10; 23,272,266.
- ``femnist_cnn``: AsyncFedED (001, section 6.1); 28x28x1 / 62; 829,886.
- ``shakespeare_lstm``: AsyncFedED (001, section 6.1); 80 characters / 80; 817,872.
- ``area_logreg``: AREA (002, section 4 and A8); 784 / 10; 7,840.

Two of the papers' models are built-in models already (``flax_models.py``, Flax default initialisation):

- ``mlp`` with its default ``hidden=(200, 200)``: the AsyncFedED Synthetic(1,1) MLP 60-200-200-10 (001, section 6.1;
  54,410 parameters) and the AsynFLC-EF MNIST/Fashion-MNIST MLP 784-200-200-10 (004, A4; 199,210 parameters).
- ``cnn`` on 32x32x3: the AsynFLC-EF CIFAR CNN the digest recommends (004, A4: conv5x5(32)-pool-conv5x5(64)-pool-
  FC512-FC10; 2,156,490 parameters).

Initialisation: where a digest names one (the CA2FL CNN) it is followed. Elsewhere PyTorch's defaults are used
(Linear/Conv2d weights and biases uniform in +-1/sqrt(fan_in)), since the papers' code, where the digests know it,
is PyTorch; the ResNet uses torchvision's ResNet initialisation (the ACE digest, section 5.1, says the authors' code
uses the torchvision ``resnet18``), and ``area_logreg`` starts at zero (AREA digest A8).
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

from asyncfl_jax.models.conv import conv_general_dilated
from asyncfl_jax.models.pool import max_pool_2x2

# PyTorch's default for nn.Linear / nn.Conv2d weights: kaiming_uniform(a=sqrt(5)), i.e. U(-1/sqrt(fan_in), +).
_TORCH_DEFAULT_KERNEL = nn.initializers.variance_scaling(1.0 / 3.0, "fan_in", "uniform")
# torch.nn.init.kaiming_normal_(w, nonlinearity="relu") (mode "fan_in", untruncated normal, std sqrt(2 / fan_in)).
_KAIMING_NORMAL_FAN_IN = nn.initializers.variance_scaling(2.0, "fan_in", "normal")
# torchvision ResNet convolutions: kaiming_normal_(w, mode="fan_out", nonlinearity="relu").
_KAIMING_NORMAL_FAN_OUT = nn.initializers.variance_scaling(2.0, "fan_out", "normal")


def _uniform_init(bound: float):
    """``U(-bound, bound)``: PyTorch's default bias initialisation with ``bound = 1 / sqrt(fan_in)``."""

    def init(key: jax.Array, shape: Sequence[int], dtype: Any = jnp.float32) -> jax.Array:
        return jax.random.uniform(key, shape, dtype, -bound, bound)

    return init


def _torch_dense(features: int, fan_in: int, kernel_init=_TORCH_DEFAULT_KERNEL, bias_init=None) -> nn.Dense:
    """``nn.Dense`` initialised like PyTorch's ``nn.Linear`` (unless ``kernel_init`` / ``bias_init`` are given)."""
    if bias_init is None:
        bias_init = _uniform_init(1.0 / math.sqrt(fan_in))
    return nn.Dense(features, kernel_init=kernel_init, bias_init=bias_init)


def _torch_conv(features: int, kernel: int, in_channels: int, padding: int, stride: int = 1, kernel_init=None,
                bias_init=None) -> nn.Conv:
    """``nn.Conv`` with PyTorch's symmetric zero padding and (by default) PyTorch's ``nn.Conv2d`` initialisation."""
    fan_in = in_channels * kernel * kernel
    return nn.Conv(
        features,
        kernel_size=(kernel, kernel),
        strides=(stride, stride),
        padding=((padding, padding), (padding, padding)),
        kernel_init=_TORCH_DEFAULT_KERNEL if kernel_init is None else kernel_init,
        bias_init=_uniform_init(1.0 / math.sqrt(fan_in)) if bias_init is None else bias_init,
        conv_general_dilated=conv_general_dilated,
    )


def _max_pool2(x: jax.Array) -> jax.Array:
    return max_pool_2x2(x)


def _as_nhwc(x: jax.Array) -> jax.Array:
    return x[..., None] if x.ndim == 3 else x


class CA2FLCNN(nn.Module):
    """The CA2FL paper's CIFAR CNN ("same as in Wang & Ji (2022)"; digest 003, section 4.1).

    conv5x5(32, pad 2)-ReLU-maxpool2 -> conv5x5(64, pad 2)-ReLU-maxpool2 -> FC 512-ReLU -> FC 128-ReLU -> FC classes.
    On 32x32x3 inputs the flattened features are 8*8*64 = 4096 and the model has 2,218,314 parameters (10 classes;
    the digest: "about 2.22M").

    Initialisation as in the digest (the reference code): Kaiming-normal for ReLU (fan-in, std sqrt(2 / fan_in)) on
    both convolutions and the first two FC layers, zero biases; the last FC layer keeps the (PyTorch) default
    initialisation, U(-1/sqrt(128), 1/sqrt(128)) for weights and bias. Flattening is NHWC here and NCHW in PyTorch,
    which only permutes the rows of the first FC layer.
    """

    num_classes: int = 10

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        x = _as_nhwc(x)
        zeros = nn.initializers.zeros
        for f in (32, 64):
            conv = _torch_conv(f, 5, x.shape[-1], padding=2, kernel_init=_KAIMING_NORMAL_FAN_IN, bias_init=zeros)
            x = _max_pool2(nn.relu(conv(x)))
        x = x.reshape((x.shape[0], -1))
        for width in (512, 128):
            x = nn.relu(_torch_dense(width, x.shape[-1], kernel_init=_KAIMING_NORMAL_FAN_IN, bias_init=zeros)(x))
        return _torch_dense(self.num_classes, x.shape[-1])(x)


class _BasicBlockGN(nn.Module):
    """ResNet basic block (two 3x3 convolutions) with GroupNorm; 1x1-conv + GroupNorm shortcut when the shape
    changes."""

    features: int
    stride: int
    num_groups: int

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        def conv(kernel: int, stride: int, padding: int) -> nn.Conv:
            return nn.Conv(self.features, (kernel, kernel), strides=(stride, stride),
                           padding=((padding, padding), (padding, padding)), use_bias=False,
                           kernel_init=_KAIMING_NORMAL_FAN_OUT, conv_general_dilated=conv_general_dilated)

        def norm() -> nn.GroupNorm:
            return nn.GroupNorm(num_groups=self.num_groups, epsilon=1e-5)

        y = nn.relu(norm()(conv(3, self.stride, 1)(x)))
        y = norm()(conv(3, 1, 1)(y))
        if self.stride != 1 or x.shape[-1] != self.features:
            x = norm()(conv(1, self.stride, 0)(x))
        return nn.relu(x + y)


class ResNet18GN(nn.Module):
    """ResNet-18 for CIFAR with GroupNorm instead of BatchNorm (CA2FL digest 003 section 4.1 and item 10; ACE digest
    000 section 5.1, and section 8 items 7 and 21).

    CIFAR stem, as both digests recommend: a 3x3 stride-1 convolution (64) + norm + ReLU and **no max-pool**; then four
    stages of two basic blocks (64, 128, 256, 512 channels; strides 1, 2, 2, 2; 1x1-conv shortcuts where the shape
    changes); global average pooling; FC to the classes. Convolutions have no bias. 11,173,962 parameters for 10
    classes and 11,220,132 for 100, the same as the BatchNorm network's trainable parameters (GroupNorm has the same
    per-channel scale and offset; the digests' "about 11.17M including BatchNorm").

    **Why GroupNorm.** In the simulator a client sends only a model delta or a gradient, and gradient-only federated
    methods (ACE, vanilla asynchronous SGD, ...) never update BatchNorm's running mean and variance, so a BatchNorm
    model would be evaluated with its initial statistics (ACE digest 000, section 8 item 7). BatchNorm statistics are
    also a mutable collection, which the flat-parameter form cannot carry. GroupNorm normalises each example on its
    own, has no batch statistics and no mutable state, and behaves the same in training and evaluation. This is a
    documented deviation from the papers' (likely BatchNorm) ResNet-18; the ACE digest recommends it for all methods,
    and the CA2FL digest (item 8) names it as the alternative.

    ``num_groups = 2`` (2 groups in every normalisation layer), the first of the two options the ACE digest gives
    ("for example 2 groups per layer, or 32"); the digests do not settle it. GroupNorm epsilon 1e-5 (PyTorch's).

    Initialisation follows torchvision's ResNet (the ACE authors' code uses the torchvision ``resnet18``): convolutions
    Kaiming-normal with fan-out, norm scale 1 and offset 0, and the final FC layer PyTorch's ``nn.Linear`` default.
    Padding is PyTorch's symmetric padding (Flax's "SAME" pads stride-2 convolutions asymmetrically).
    """

    num_classes: int = 10
    num_groups: int = 2
    stage_sizes: Sequence[int] = (2, 2, 2, 2)
    widths: Sequence[int] = (64, 128, 256, 512)

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        x = _as_nhwc(x)
        x = nn.Conv(self.widths[0], (3, 3), padding=((1, 1), (1, 1)), use_bias=False,
                    kernel_init=_KAIMING_NORMAL_FAN_OUT, conv_general_dilated=conv_general_dilated)(x)
        x = nn.relu(nn.GroupNorm(num_groups=self.num_groups, epsilon=1e-5)(x))
        for stage, (blocks, width) in enumerate(zip(self.stage_sizes, self.widths)):
            for block in range(blocks):
                stride = 2 if stage > 0 and block == 0 else 1
                x = _BasicBlockGN(width, stride, self.num_groups)(x)
        x = jnp.mean(x, axis=(1, 2))
        return _torch_dense(self.num_classes, x.shape[-1])(x)


class AlexNetCIFAR(nn.Module):
    """The AlexNet-style CIFAR model of the AsynFLC-EF digest (004, A4: the paper gives no architecture; "conv(64, 3x3)
    -> conv(192) -> conv(384) -> conv(256) -> conv(256), with max-pools, then FC 4096-4096-10 (about 23M
    parameters)").

    The digest leaves strides, pool positions and the later kernel sizes open. This layout gives its "about 23M": all
    convolutions 3x3 with padding 1, the first with stride 2, 2x2 max-pools after the first, second and fifth,

      conv(64, s2)-ReLU-pool -> conv(192)-ReLU-pool -> conv(384)-ReLU -> conv(256)-ReLU -> conv(256)-ReLU-pool
      -> flatten (2*2*256 = 1024 on 32x32) -> FC 4096-ReLU -> FC 4096-ReLU -> FC classes,

    23,272,266 parameters for 10 classes. (With a stride-1 first convolution the flattened features would be 4096 and
    the model about 36M, which does not match the digest.) No dropout: the simulator's ``apply_fn`` is deterministic
    and the digest names none. PyTorch default initialisation.
    """

    num_classes: int = 10

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        x = _as_nhwc(x)
        x = _max_pool2(nn.relu(_torch_conv(64, 3, x.shape[-1], padding=1, stride=2)(x)))
        x = _max_pool2(nn.relu(_torch_conv(192, 3, x.shape[-1], padding=1)(x)))
        x = nn.relu(_torch_conv(384, 3, x.shape[-1], padding=1)(x))
        x = nn.relu(_torch_conv(256, 3, x.shape[-1], padding=1)(x))
        x = _max_pool2(nn.relu(_torch_conv(256, 3, x.shape[-1], padding=1)(x)))
        x = x.reshape((x.shape[0], -1))
        for width in (4096, 4096):
            x = nn.relu(_torch_dense(width, x.shape[-1])(x))
        return _torch_dense(self.num_classes, x.shape[-1])(x)


class FEMNISTCNN(nn.Module):
    """The AsyncFedED paper's FEMNIST CNN, the digest's literal reading (001, section 6.1) of "two convolution layers
    and a pooling layer, as well as one fully connected layer":

      conv5x5(32, pad 2)-ReLU -> conv5x5(64, pad 2)-ReLU -> maxpool2 -> FC classes (14*14*64 = 12544 -> 62),

    829,886 parameters for 28x28x1 inputs and 62 classes (the digest's number). The digest's alternative, the LEAF CNN
    (conv32-pool-conv64-pool-FC2048-FC62, about 6.6M), is not used, as the digest recommends. Initialisation: the
    digest recommends "framework defaults"; PyTorch's defaults are used.
    """

    num_classes: int = 62

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        x = _as_nhwc(x)
        x = nn.relu(_torch_conv(32, 5, x.shape[-1], padding=2)(x))
        x = nn.relu(_torch_conv(64, 5, x.shape[-1], padding=2)(x))
        x = _max_pool2(x)
        x = x.reshape((x.shape[0], -1))
        return _torch_dense(self.num_classes, x.shape[-1])(x)


class ShakespeareLSTM(nn.Module):
    """The AsyncFedED paper's Shakespeare RNN (digest 001, section 6.1: "one embedding layer, two LSTM layers, one
    fully-connected layer"), in the digest's recommended LEAF form:

      Embedding(vocab 80, 8) -> LSTM(256) -> LSTM(256) -> FC 256 -> vocab, on the last time step.

    Input: a batch ``[B, L]`` of character ids (any float or integer dtype; cast to int32), output next-character
    logits. 817,872 parameters for an 80-character vocabulary: the digest's 819,920 minus 2 * 4 * 256 = 2,048,
    because PyTorch's LSTM has two bias vectors per layer (``b_ih`` and ``b_hh``, which only ever appear summed) and
    Flax's has one. Initialisation as PyTorch's ``nn.LSTM``: every weight U(-1/sqrt(256), 1/sqrt(256)); the single
    bias is drawn as the sum of two such uniforms, which is the distribution of PyTorch's ``b_ih + b_hh``. Embedding
    N(0, 1) and FC as PyTorch's defaults.
    """

    vocab_size: int = 80
    num_classes: int = 80
    embed_dim: int = 8
    hidden: int = 256
    num_layers: int = 2

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        tokens = x.reshape((x.shape[0], -1)).astype(jnp.int32)
        h = nn.Embed(self.vocab_size, self.embed_dim, embedding_init=nn.initializers.normal(1.0))(tokens)
        bound = 1.0 / math.sqrt(self.hidden)
        uniform = _uniform_init(bound)

        def summed_bias(key: jax.Array, shape: Sequence[int], dtype: Any = jnp.float32) -> jax.Array:
            k1, k2 = jax.random.split(key)
            return uniform(k1, shape, dtype) + uniform(k2, shape, dtype)

        for _ in range(self.num_layers):
            cell = nn.OptimizedLSTMCell(self.hidden, kernel_init=uniform, recurrent_kernel_init=uniform,
                                        bias_init=summed_bias)
            h = nn.RNN(cell)(h)
        return _torch_dense(self.num_classes, self.hidden)(h[:, -1, :])


class AREALogisticRegression(nn.Module):
    """The AREA paper's model (digest 002, section 4, eq. 4 and A8): multinomial logistic regression ``logits = x W``
    with **no bias** and the initial model ``W = 0`` (7,840 parameters on MNIST). The paper's L2 term (nu = 1e-3) is
    the local training's weight decay, not part of the model. ``logreg`` is the variant with a bias and random
    initialisation.
    """

    num_classes: int = 10

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        x = x.reshape((x.shape[0], -1))
        return nn.Dense(self.num_classes, use_bias=False, kernel_init=nn.initializers.zeros)(x)
