"""The CPU-scale CNN presets (``<paper>/cpu_cnn/<method>``, asyncfl_jax.presets) expand, and each runs a few uploads
on the Debian Fashion-MNIST files (skipped where they are not installed; nothing is downloaded)."""

from __future__ import annotations

import json

import pytest

from asyncfl_jax import cli
from asyncfl_jax.presets import PRESETS

CPU_CNN = sorted(name for name in PRESETS if "/cpu_cnn/" in name)


def test_each_cnn_paper_has_a_cpu_preset_with_its_length():
    assert {name.split("/")[0] for name in CPU_CNN} == {"ca2fl", "ace", "asyncfeded", "asynflc_ef"}  # AREA: no CNN
    for name in CPU_CNN:
        preset = PRESETS[name]
        assert preset["data"]["name"] == "fashion_mnist" and preset["model"]["name"] in ("cnn", "ca2fl_cnn",
                                                                                           "femnist_cnn")
        assert 100 <= preset["arrivals"] <= 1000


def test_a_preset_sets_its_number_of_uploads(capsys):
    assert cli.main(["run", "--print-config", "--preset", "ca2fl/cpu_cnn/ca2fl"]) == 0
    config = json.loads(capsys.readouterr().out)
    assert config["runs"][0]["arrivals"] == PRESETS["ca2fl/cpu_cnn/ca2fl"]["arrivals"]
    assert config["model"]["name"] == "ca2fl_cnn" and config["data"]["partition"] == "dirichlet"


def test_every_cpu_cnn_preset_validates(tmp_path, capsys):
    for name in CPU_CNN:
        assert cli.main(["run", "--print-config", "--preset", name]) == 0
        assert json.loads(capsys.readouterr().out)["runs"][0]["algorithm"] == PRESETS[name]["algorithm"]


# One run per paper (each paper's model); the other presets differ from these only in their server rule.
@pytest.mark.parametrize("name", ["ca2fl/cpu_cnn/ca2fl", "ace/cpu_cnn/ace", "asyncfeded/cpu_cnn/asyncfeded"])
def test_cpu_cnn_preset_runs_a_few_uploads(name, tmp_path):
    from asyncfl_jax.data.idx import DatasetNotFoundError, find_idx_dir

    try:
        find_idx_dir("fashion_mnist")
    except DatasetNotFoundError:
        pytest.skip("Fashion-MNIST IDX files are not installed (apt-get install dataset-fashion-mnist)")
    out = tmp_path / "run"
    few_steps = (["--option", "initial_steps=1", "--option", "max_steps=2"] if name.startswith("asyncfeded/")
                 else ["--local-steps", "1"])  # AsyncFedED sets each job's steps itself (local.steps is refused)
    assert cli.main(["run", "--preset", name, "--arrivals", "5", "--num-clients", "10", *few_steps,
                     "--out", str(out), "--no-progress", "--no-plot", "--no-checkpoint"]) == 0
    summary = json.loads((out / "summary.json").read_text())["runs"][0]
    assert 0.0 <= summary["final_test_accuracy"][0] <= 1.0
