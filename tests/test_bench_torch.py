"""The plain-PyTorch yardstick (scripts/bench_torch.py) does the engine's math: same FedBuff run, same final model.

Runs only where PyTorch is installed (the ``bench`` extra; not part of the CI install). Full-batch local steps make
both sides deterministic: a permuted full batch has the same mean gradient, so the two models agree up to float32
rounding after every server step of a shared schedule.
"""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "scripts"))
import bench_torch  # noqa: E402

from asyncfl_jax.algorithms import fedbuff  # noqa: E402
from asyncfl_jax.client import LocalConfig  # noqa: E402
from asyncfl_jax.data.client_data import Dataset  # noqa: E402
from asyncfl_jax.engine import simulate  # noqa: E402
from asyncfl_jax.models.core import make_model  # noqa: E402
from asyncfl_jax.task import make_task  # noqa: E402
from asyncfl_jax.timing import DelayModel, make_schedule  # noqa: E402


def _tiny_dataset(num_clients: int = 6, per_client: int = 5) -> tuple[Dataset, list[np.ndarray]]:
    rng = np.random.default_rng(0)
    n = num_clients * per_client
    ds = Dataset(name="tiny", train_x=rng.random((n, 28, 28, 1), dtype=np.float32),
                 train_y=rng.integers(0, 10, n).astype(np.int32),
                 test_x=rng.random((8, 28, 28, 1), dtype=np.float32), test_y=rng.integers(0, 10, 8).astype(np.int32),
                 num_classes=10)
    return ds, [np.arange(i * per_client, (i + 1) * per_client) for i in range(num_clients)]


def _dense_layers(model, flat) -> list[dict[str, np.ndarray]]:
    """A flat parameter vector of the Flax model as its Dense layers in order ({"kernel": [in, out], "bias"})."""
    params = model.unravel(flat)["params"]
    return [{k: np.asarray(v) for k, v in params[name].items()}
            for name in sorted(params, key=lambda k: int(k.split("_")[-1]))]


def _torch_state(name: str, model) -> dict[str, "torch.Tensor"]:
    """The Flax model's x_0 as a state_dict of bench_torch's model (Dense kernels [in, out] -> weights [out, in])."""
    layers = _dense_layers(model, model.flat_params)
    names = list(bench_torch.make_torch_model(name).state_dict())
    assert len(names) == 2 * len(layers)
    state = {}
    for i, layer in enumerate(layers):
        state[names[2 * i]] = torch.from_numpy(layer["kernel"].T.copy())
        state[names[2 * i + 1]] = torch.from_numpy(layer["bias"].copy())
    return state


@pytest.mark.parametrize("name", ["logreg", "mlp"])
def test_torch_loop_and_engine_reach_the_same_model(name):
    ds, parts = _tiny_dataset()
    model = make_model(name, ds.input_shape, ds.num_classes, seed=0)
    task = make_task(ds, parts, model, seed=0)
    steps, local_steps, lr, server_lr = 12, 3, 0.1, 0.7
    schedule = make_schedule("concurrent", len(parts), steps, DelayModel(), seed=3, concurrency=4, buffer_size=2,
                             refill="boundary")
    h = simulate(task, fedbuff(), schedule, LocalConfig(steps=local_steps, batch_size=None),
                 hparams={"client_lr": lr, "server_lr": server_lr}, eval_every=steps, progress=False)
    engine_x = np.asarray(h.final_params[0])

    x = torch.from_numpy(np.moveaxis(ds.train_x, -1, 1).copy())
    y = torch.from_numpy(ds.train_y.astype(np.int64))
    offsets = np.concatenate([[0], np.cumsum([len(p) for p in parts])])
    clients = bench_torch.client_tensors(x, y, offsets, np.concatenate(parts))
    sched = {k: getattr(schedule, k) for k in bench_torch.SCHEDULE_FIELDS}
    torch_model, res = bench_torch.run_fedbuff(name, clients, sched, steps, 0, local_steps, batch_size=100, lr=lr,
                                               server_lr=server_lr, initial_state=_torch_state(name, model))
    assert res["timed_arrivals"] == int((schedule.arrival_clients >= 0).sum())
    assert np.max(np.abs(engine_x - np.asarray(model.flat_params))) > 1e-3  # the run moved the model
    torch_params = [p.detach().numpy() for p in torch_model.parameters()]
    for i, layer in enumerate(_dense_layers(model, engine_x)):
        np.testing.assert_allclose(torch_params[2 * i], layer["kernel"].T, rtol=0, atol=2e-5)
        np.testing.assert_allclose(torch_params[2 * i + 1], layer["bias"], rtol=0, atol=2e-5)


def test_torch_cifar_models_have_the_engines_parameter_counts():
    """The yardstick's CA2FL CNN and ResNet-18-GN (``bench_torch.make_torch_model``) are the engine's models
    (``paper_models.py``; their counts are checked there, tests/test_paper_models.py): same parameter counts, logits
    of the right shape on a CIFAR batch."""
    for name, expected in (("ca2fl_cnn", 2_218_314), ("resnet18_gn", 11_173_962)):
        model = bench_torch.make_torch_model(name, 10, (32, 32, 3))
        assert sum(p.numel() for p in model.parameters()) == expected
        assert tuple(model(torch.zeros(2, 3, 32, 32)).shape) == (2, 10)
