"""The memory budget counts the activations of local training (issue 29): a CNN run whose local step cannot fit is
refused with exit code 2 before anything is built or compiled, from the configuration alone (batch x layer outputs
per example x jobs trained together), and the prepared run's budget counts them too; the count is a lower bound of
XLA's own analysis of the compiled chunk, so ordinary runs are not refused."""

from __future__ import annotations

import gzip
import math
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import asyncfl_jax as afl
from asyncfl_jax import cli, preflight
from asyncfl_jax.engine import activations
from asyncfl_jax.engine.budget import MemoryRefusal, compiled_bytes, device_memory_bytes


def _write_mnist(folder, n_train=40, n_test=10):
    os.makedirs(folder, exist_ok=True)
    rng = np.random.default_rng(0)
    for stem, arr in {"train-images-idx3-ubyte": rng.integers(0, 256, (n_train, 28, 28), dtype=np.uint8),
                      "train-labels-idx1-ubyte": rng.integers(0, 10, n_train, dtype=np.uint8),
                      "t10k-images-idx3-ubyte": rng.integers(0, 256, (n_test, 28, 28), dtype=np.uint8),
                      "t10k-labels-idx1-ubyte": rng.integers(0, 10, n_test, dtype=np.uint8)}.items():
        header = bytes([0, 0, 0x08, arr.ndim]) + np.array(arr.shape, dtype=">u4").tobytes()
        with gzip.open(os.path.join(folder, stem + ".gz"), "wb") as f:
            f.write(header + arr.tobytes())


def test_layer_outputs_per_example_of_the_built_in_models():
    """The CNN's two convolutions (28x28x32 and 14x14x64 outputs) and its two dense layers (512, 10), float32; the
    model is built on abstract values (nothing computed)."""
    assert preflight._activations_per_example("cnn", (28, 28, 1), 10, ()) == 4 * (28 * 28 * 32 + 14 * 14 * 64 + 512
                                                                                  + 10)
    assert preflight._activations_per_example("mlp", (60,), 10, (200, 200)) == 4 * (200 + 200 + 10)
    assert activations.jobs_in_parallel("vmap", 16) == 16
    assert activations.jobs_in_parallel("grouped:4", 16) == 4 and activations.jobs_in_parallel("grouped:4", 2) == 2
    assert activations.jobs_in_parallel("unrolled", 16) == activations.jobs_in_parallel("auto", 16) == 1


def test_a_cnn_run_whose_local_step_cannot_fit_is_refused_with_exit_2_before_anything_is_built(tmp_path, capsys):
    """The failing case of issue 29 at a size that fits a test: the CNN with a large batch and many jobs trained
    together (the vmap executor) needs twice this machine's memory for its activations alone; the command refuses
    it from the configuration (the data is not even read), exit 2, naming the activations and the options."""
    _write_mnist(tmp_path / "mnist")
    per_example = 4 * (28 * 28 * 32 + 14 * 14 * 64 + 512 + 10)
    jobs = 16
    batch = math.ceil(2 * device_memory_bytes() / (per_example * jobs))
    argv = ["run", "--no-progress", "--no-plot", "--dataset", "mnist", "--data-dir", str(tmp_path / "mnist"),
            "--model", "cnn", "--num-clients", "4", "--set", f"local.batch_size={batch}", "--set",
            f"runs.protocol.concurrency={jobs}", "--set", f"runs.protocol.buffer_size={jobs}", "--set",
            "data.partition=dirichlet_sampled", "--set", "data.num_clients=32", "--job-executor", "vmap",
            "--arrivals", "32", "--seeds", "0", "--out", str(tmp_path / "out")]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert "asyncfl: error: this configuration needs at least" in err, err
    assert "of activations of a local training step" in err and "lower local.batch_size" in err, err
    assert not (tmp_path / "out").exists()


def test_ordinary_cnn_configurations_are_not_refused():
    from asyncfl_jax.cli import config_from_argv
    from asyncfl_jax.config import resolve, validate

    for argv in (["--dataset", "tfds/cifar10", "--model", "cnn"], ["--preset", "ca2fl/cpu_cnn/ca2fl"],
                 ["--dataset", "mnist", "--model", "cnn", "--job-executor", "vmap"]):
        cfg = config_from_argv(argv)
        validate(cfg, check_files=False)
        cfg = resolve(cfg)
        est = preflight.check_memory(cfg)
        assert 0 < est.activations < 2**30, (argv, est.activations)


def _mlp_task(num_clients=4, hidden=256, classes=3):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(num_clients * 6, 60)).astype(np.float32)
    y = rng.integers(0, classes, num_clients * 6).astype(np.int32)
    ds = afl.data.Dataset("tiny", x, y, x[:4], y[:4], classes)
    parts = [np.arange(6 * i, 6 * i + 6) for i in range(num_clients)]
    return afl.make_task(ds, parts, afl.make_model("mlp", (60,), classes, hidden=(hidden,)))


def test_the_prepared_runs_budget_counts_the_activations_and_refuses_before_compiling(monkeypatch):
    """The budget printed before a run counts replicas x jobs x batch x layer outputs per example; it is a lower
    bound of XLA's analysis of the compiled chunk (so it does not refuse a run that fits); with too little memory
    the run is refused before anything is compiled."""
    from asyncfl_jax.engine import budget as budget_module
    from asyncfl_jax.engine.loop import HostLoop, prepare_run

    task = _mlp_task()
    schedule = afl.make_schedule("concurrent", 4, 2, afl.DelayModel(), seed=0, concurrency=4, buffer_size=4)
    local = afl.LocalConfig(steps=1, batch_size=512)
    run = prepare_run(task, afl.fedbuff(), [schedule, schedule], local, seeds=[0, 1], eval_every=2,
                      job_executor="vmap", replica_batch=2)
    budget = run.budget()
    assert budget.activations == 2 * 4 * 512 * 4 * (256 + 3)
    assert f"activations of a local step {budget_module.format_bytes(budget.activations)}" in budget.describe()
    loop = HostLoop(run)
    placed = run.placed
    carry = loop.init_fn(placed.inputs, placed.hp, placed.keys, placed.data)
    part = run.placement.place_chunk(run.timeline.chunk_inputs(placed.inputs, 0, 2, carry), run.timeline.chunk_axes)
    analysed = compiled_bytes(loop.chunk_fns[False].lower(carry, part, placed.hp, placed.keys, placed.data).compile())
    assert analysed is None or analysed >= budget.activations  # a lower bound of XLA's own count

    monkeypatch.setattr(budget_module, "device_memory_bytes", lambda device=None: budget.activations // 8)
    compiled_anything = []
    monkeypatch.setattr("asyncfl_jax.engine.loop.check_compiled", lambda *a, **k: compiled_anything.append(1))
    with pytest.raises(MemoryRefusal, match="the activations of a local training step take"):
        afl.simulate(task, afl.fedbuff(), schedule, local, eval_every=2, job_executor="vmap", progress=False)
    assert not compiled_anything
