"""The papers' models (``asyncfl_jax.models.paper_models``) built through ``make_model``: output shapes, parameter
counts (the digests' numbers or hand-computed below), a gradient step that lowers the loss, and ResNet-18-GN's lack
of batch statistics."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.flatten_util import ravel_pytree

from asyncfl_jax.models import MODEL_NAMES, cross_entropy_loss, make_model
from asyncfl_jax.models.paper_models import FEMNISTCNN, ResNet18GN


def _conv(k: int, c_in: int, c_out: int, bias: bool = True) -> int:
    return k * k * c_in * c_out + (c_out if bias else 0)


def _dense(n_in: int, n_out: int, bias: bool = True) -> int:
    return n_in * n_out + (n_out if bias else 0)


def _resnet18_count(num_classes: int) -> int:
    """CIFAR ResNet-18: bias-free convolutions, 2 parameters per channel per norm layer, FC with bias."""
    norm = lambda c: 2 * c  # noqa: E731  (GroupNorm scale + offset, the same count as BatchNorm's affine part)
    total = _conv(3, 3, 64, bias=False) + norm(64)
    c_in = 64
    for width in (64, 128, 256, 512):
        for block in range(2):
            total += _conv(3, c_in, width, bias=False) + norm(width) + _conv(3, width, width, bias=False) + norm(width)
            if c_in != width:  # 1x1 projection shortcut (first block of stages 2-4)
                total += _conv(1, c_in, width, bias=False) + norm(width)
            c_in = width
    return total + _dense(512, num_classes)


# name, input shape of one example, classes, expected parameter count.
CASES = [
    # CA2FL digest 003 section 4.1: "about 2.22M"; conv5x5(32), conv5x5(64), FC 4096-512-128-10.
    ("ca2fl_cnn", (32, 32, 3), 10,
     _conv(5, 3, 32) + _conv(5, 32, 64) + _dense(8 * 8 * 64, 512) + _dense(512, 128) + _dense(128, 10)),
    # Digests 003/000: "about 11.17M including BatchNorm" (the affine part).
    pytest.param("resnet18_gn", (32, 32, 3), 10, _resnet18_count(10), marks=pytest.mark.slow),
    # AsynFLC-EF digest 004 A4: "about 23M"; 3x3 convs 64(s2)-192-384-256-256, flatten 2*2*256, FC 4096-4096-10.
    pytest.param("alexnet_cifar", (32, 32, 3), 10,
                 _conv(3, 3, 64) + _conv(3, 64, 192) + _conv(3, 192, 384) + _conv(3, 384, 256) + _conv(3, 256, 256)
                 + _dense(2 * 2 * 256, 4096) + _dense(4096, 4096) + _dense(4096, 10), marks=pytest.mark.slow),
    # AsyncFedED digest 001 section 6.1 gives 829,886.
    ("femnist_cnn", (28, 28, 1), 62, 829_886),
    # Digest 001 gives 819,920 with PyTorch's two LSTM bias vectors; Flax has one (2 layers * 4 gates * 256 fewer).
    ("shakespeare_lstm", (80,), 80, 819_920 - 2 * 4 * 256),
    # AREA digest 002: W in R^{10 x 784}, no bias.
    ("area_logreg", (784,), 10, 7_840),
]
NEW_NAMES = [c.values[0] if hasattr(c, "values") else c[0] for c in CASES]


@functools.lru_cache(maxsize=None)
def _model(name: str, input_shape: tuple[int, ...], num_classes: int):
    return make_model(name, input_shape, num_classes, seed=0)


def _batch(name: str, input_shape, num_classes: int, batch: int = 2):
    kx, ky = jax.random.split(jax.random.PRNGKey(7))
    if name == "shakespeare_lstm":  # character ids, stored as floats like every other feature array
        x = jax.random.randint(kx, (batch, *input_shape), 0, num_classes).astype(jnp.float32)
    else:
        x = jax.random.normal(kx, (batch, *input_shape), jnp.float32)
    y = jax.random.randint(ky, (batch,), 0, num_classes)
    return x, y


def test_names_registered():
    assert set(NEW_NAMES) <= set(MODEL_NAMES)
    assert {"logreg", "mlp", "cnn"} <= set(MODEL_NAMES)
    assert len(set(MODEL_NAMES)) == len(MODEL_NAMES)


def test_unknown_name_lists_every_model():
    with pytest.raises(ValueError) as err:
        make_model("vgg16", (32, 32, 3), 10)
    for name in MODEL_NAMES:
        assert repr(name) in str(err.value)


@pytest.mark.parametrize("name", ["ca2fl_cnn", "resnet18_gn", "alexnet_cifar", "femnist_cnn"])
def test_image_models_reject_flat_inputs(name):
    with pytest.raises(ValueError, match="needs image inputs"):
        make_model(name, (784,), 10)


@pytest.mark.parametrize("name,input_shape,num_classes,expected", CASES, ids=NEW_NAMES)
def test_parameter_count_and_pure_params(name, input_shape, num_classes, expected):
    model = _model(name, input_shape, num_classes)
    assert model.num_params == expected
    # Only trainable parameters: the flat vector is the whole model state.
    assert set(model.init_params) == {"params"}


def test_mlp_is_the_synthetic_mlp():
    """The Synthetic(1,1) MLP 60-200-200-10 (digest 001 section 6.1: 54,410) is ``mlp`` with its default widths."""
    assert make_model("mlp", (60,), 10).num_params == _dense(60, 200) + _dense(200, 200) + _dense(200, 10) == 54_410


@pytest.mark.parametrize("name,input_shape,num_classes,expected", CASES, ids=NEW_NAMES)
def test_output_shape_and_gradient_step(name, input_shape, num_classes, expected):
    model = _model(name, input_shape, num_classes)
    x, y = _batch(name, input_shape, num_classes)

    def loss_fn(flat):
        logits = model.flat_apply(flat, x)
        return cross_entropy_loss(logits, y), logits

    value_and_grad = jax.jit(jax.value_and_grad(loss_fn, has_aux=True))
    flat = model.flat_params
    (loss, logits), grad = value_and_grad(flat)
    assert logits.shape == (2, num_classes)
    assert bool(jnp.all(jnp.isfinite(logits)))
    assert grad.shape == flat.shape and bool(jnp.all(jnp.isfinite(grad)))
    assert float(jnp.linalg.norm(grad)) > 0.0
    (new_loss, _), _ = value_and_grad(flat - 0.05 * grad)
    assert float(new_loss) < float(loss)


@pytest.mark.slow
def test_resnet18_gn_has_no_batch_statistics():
    model = _model("resnet18_gn", (32, 32, 3), 10)
    assert set(model.init_params) == {"params"}  # no "batch_stats" collection
    paths = [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_flatten_with_path(model.init_params)[0]]
    assert not any("BatchNorm" in p for p in paths)
    assert sum("GroupNorm" in p for p in paths) == 2 * (1 + 2 * 8 + 3)  # stem + 2 per block + 3 shortcuts
    x, _ = _batch("resnet18_gn", (32, 32, 3), 10)
    # A forward pass with every collection mutable changes nothing and creates no collection besides the parameters
    # (a BatchNorm network in training mode would return updated "batch_stats" here).
    logits, state = ResNet18GN(num_classes=10).apply(model.init_params, x, mutable=True)
    assert set(state) == {"params"}
    unchanged = jax.tree_util.tree_map(lambda a, b: bool(jnp.array_equal(a, b)), state, model.init_params)
    assert all(jax.tree_util.tree_leaves(unchanged))
    # Per-example normalisation: an example's logits do not depend on the rest of the batch.
    alone = jax.jit(model.flat_apply)(model.flat_params, x[:1])
    np.testing.assert_allclose(np.asarray(alone), np.asarray(logits[:1]), rtol=1e-4, atol=1e-5)


def test_resnet18_gn_cifar100_count():
    shapes = jax.eval_shape(ResNet18GN(num_classes=100).init, jax.random.PRNGKey(0), jnp.zeros((1, 32, 32, 3)))
    assert sum(int(np.prod(s.shape)) for s in jax.tree_util.tree_leaves(shapes)) == _resnet18_count(100) == 11_220_132


def test_ca2fl_cnn_initialisation():
    """Digest 003: Kaiming-normal weights and zero biases on the convs and the first two FC layers; the last FC layer
    keeps PyTorch's default U(-1/sqrt(128), 1/sqrt(128))."""
    params = _model("ca2fl_cnn", (32, 32, 3), 10).init_params["params"]
    for layer in ("Conv_0", "Conv_1", "Dense_0", "Dense_1"):
        assert not np.any(np.asarray(params[layer]["bias"]))
    w = np.asarray(params["Dense_0"]["kernel"])  # 4096 x 512, std sqrt(2 / 4096)
    assert abs(w.std() / np.sqrt(2.0 / 4096) - 1.0) < 0.02
    last = params["Dense_2"]
    assert np.any(np.asarray(last["bias"])) and np.abs(np.asarray(last["kernel"])).max() <= 1 / np.sqrt(128)


def test_area_logreg_starts_at_zero_without_bias():
    model = _model("area_logreg", (784,), 10)
    assert not np.any(np.asarray(model.flat_params))
    assert [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_flatten_with_path(model.init_params)[0]] == [
        "['params']['Dense_0']['kernel']"
    ]


def test_femnist_cnn_accepts_images_without_channel_axis():
    shapes = jax.eval_shape(FEMNISTCNN(num_classes=62).init, jax.random.PRNGKey(0), jnp.zeros((1, 28, 28)))
    assert sum(int(np.prod(s.shape)) for s in jax.tree_util.tree_leaves(shapes)) == 829_886


def test_shakespeare_lstm_integer_and_float_ids_agree():
    model = _model("shakespeare_lstm", (80,), 80)
    x, _ = _batch("shakespeare_lstm", (80,), 80)
    apply = jax.jit(model.flat_apply)
    np.testing.assert_array_equal(np.asarray(apply(model.flat_params, x)),
                                  np.asarray(apply(model.flat_params, x.astype(jnp.int32))))
