"""The sweep that chose the default hyper-parameters, and the dependency-floor check (without its network part)."""

from __future__ import annotations

import importlib.util
import pathlib

import pytest

from asyncfl_jax.algorithms import REGISTRY, get_algorithm
from asyncfl_jax.config import validate
from asyncfl_jax.reproduce import defaults

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _row(value, accuracy, diverged=()):
    return {"algorithm": "x", "hparams": {"server_lr": value}, "final_test_accuracy": accuracy,
            "seeds": [0, 1], "diverged_seeds": list(diverged)}


def test_choose_keeps_a_close_default_and_moves_a_failing_one():
    rows = [_row(0.5, 0.80), _row(1.0, 0.83), _row(2.0, 0.85)]
    assert defaults.choose(rows, {"server_lr": 1.0})["hparams"] == {"server_lr": 1.0}  # within 0.03 of the best
    assert defaults.choose(rows, {"server_lr": 0.5})["hparams"] == {"server_lr": 2.0}  # 0.05 below: moved
    rows = [_row(0.1, 0.5, diverged=[0]), _row(0.01, 0.7)]
    assert defaults.choose(rows, {"server_lr": 0.1})["hparams"] == {"server_lr": 0.01}  # a diverged seed disqualifies
    with pytest.raises(RuntimeError, match="every point"):
        defaults.choose([_row(0.1, None, diverged=[0, 1])], {"server_lr": 0.1})


def test_every_algorithm_has_a_grid_holding_its_default():
    assert set(defaults.GRIDS) == set(REGISTRY)
    for name, grid in defaults.GRIDS.items():
        hyper = dict(get_algorithm(name).hyperparams)
        for hp, values in grid.items():
            assert hyper[hp] in values, f"{name}: the default {hp} = {hyper[hp]} is not in the sweep's grid {values}"
        cfg = defaults.sweep_config(name, 3000, [0, 1])
        validate(cfg)
        assert cfg.runs[0].hparams == {hp: values for hp, values in grid.items()}


@pytest.mark.parametrize("name", ["area", "as_fedavg"])
def test_area_and_as_fedavg_default_to_more_uploads(name):
    """Their model is the mean of all n memories, so the command gives them 12,000 uploads (docs/defaults.md); the
    sweep keeps the command's number unless told otherwise, and --arrivals still overrides it."""
    from asyncfl_jax.cli import AREA_DEFAULT_ARRIVALS, DEFAULT_ARRIVALS, config_from_argv

    assert AREA_DEFAULT_ARRIVALS == 12_000
    assert config_from_argv(["--algorithm", name]).runs[0].arrivals == AREA_DEFAULT_ARRIVALS
    assert defaults.sweep_config(name, None, [0]).runs[0].arrivals == AREA_DEFAULT_ARRIVALS
    assert config_from_argv(["--algorithm", name, "--arrivals", "500"]).runs[0].arrivals == 500
    assert config_from_argv(["--algorithm", "fedbuff"]).runs[0].arrivals == DEFAULT_ARRIVALS == 3000


def test_a_tiny_sweep_reports_each_point_apart():
    rows = defaults.sweep("fedbuff", arrivals=40, seeds=(0,))
    assert [r["hparams"]["server_lr"] for r in rows] == defaults.GRIDS["fedbuff"]["server_lr"]
    for r in rows:
        assert r["seeds"] == [0] and r["diverged_seeds"] == [] and 0.0 <= r["final_test_accuracy"] <= 1.0
    assert "fedbuff" in defaults.table({"fedbuff": rows})


def test_check_floors_pins_every_runtime_dependency_at_its_declared_floor():
    spec = importlib.util.spec_from_file_location("check_floors", ROOT / "scripts" / "check_floors.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    pinned = module.floors(ROOT / "pyproject.toml")
    names = [p.split("==")[0] for p in pinned]
    assert {"jax", "jaxlib", "flax", "optax", "orbax-checkpoint", "numpy"} <= set(names)
    assert all("==" in p and p.split("==")[1][0].isdigit() for p in pinned)
    assert "jax==0.8.0" in pinned  # jax.enable_x64, which every run uses, is new in jax 0.8.0
    with_extras = module.floors(ROOT / "pyproject.toml", module.EXTRAS)
    names = {p.split("==")[0] for p in with_extras}
    assert {"pyarrow", "pillow", "tensorflow-datasets", "tensorboardX", "importlib_resources"} <= names
