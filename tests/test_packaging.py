"""The packaging edges: the version, the launcher in the wheel, the did-you-mean of option values, the message when
tensorflow-datasets is missing, the SPDX license."""

from __future__ import annotations

import importlib
import pathlib
import sys
import tomllib

import pytest

import asyncfl_jax
from asyncfl_jax import cli
from asyncfl_jax.config import ConfigError, ExperimentConfig, validate

ROOT = pathlib.Path(__file__).resolve().parents[1]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def test_version_is_the_packages_and_printed_by_the_command(capsys):
    assert PROJECT["version"] == asyncfl_jax.__version__
    with pytest.raises(SystemExit) as done:
        cli.main(["--version"])
    assert done.value.code == 0 and capsys.readouterr().out.strip() == f"asyncfl_jax {asyncfl_jax.__version__}"


def test_every_console_entry_is_a_function_of_the_package(capsys):
    for name, target in PROJECT["scripts"].items():
        module, function = target.split(":")
        assert module.startswith("asyncfl_jax.") and callable(getattr(importlib.import_module(module), function))
    assert PROJECT["scripts"]["asyncfl-launch-local"] == "asyncfl_jax.launch_local:main"
    from asyncfl_jax.launch_local import main

    with pytest.raises(SystemExit) as done:
        main([])  # no command after --
    assert done.value.code == 2 and "give the command after --" in capsys.readouterr().err


def test_the_license_is_an_spdx_expression_with_a_setuptools_that_reads_it():
    assert PROJECT["license"] == "Apache-2.0"
    build = tomllib.loads((ROOT / "pyproject.toml").read_text())["build-system"]["requires"]
    assert any(r.replace(" ", "").startswith("setuptools>=") and int(r.split(">=")[1].split(".")[0]) >= 77
               for r in build)  # PEP 639 license expressions: setuptools 77


def test_a_misspelt_option_value_gets_a_did_you_mean(capsys):
    assert cli.main(["run", "--algorithm", "fedasync", "--staleness", "hing", "--print-config"]) == 2
    assert "(did you mean 'hinge'?)" in capsys.readouterr().err
    assert cli.main(["run", "--algorithm", "fedasync", "--option", "stalenes=hinge", "--print-config"]) == 2
    assert "did you mean the option 'staleness'" in capsys.readouterr().err


def test_a_missing_tensorflow_datasets_says_how_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorflow_datasets", None)  # makes `import tensorflow_datasets` fail
    cfg = ExperimentConfig.from_dict({"data": {"name": "tfds/mnist", "partition": "iid"}, "model": {"name": "logreg"}})
    with pytest.raises(ConfigError) as refusal:
        validate(cfg)
    message = str(refusal.value)
    assert "pip install tensorflow-datasets" in message and "not prepared" not in message
