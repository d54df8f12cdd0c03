"""Every default written out (``--print-config``, ``config.json``) and presets that carry their task or refuse."""

from __future__ import annotations

import dataclasses
import json

import pytest

from asyncfl_jax import cli
from asyncfl_jax.algorithms import REGISTRY, get_algorithm
from asyncfl_jax.cli import config_from_argv
from asyncfl_jax.config import ConfigError, ExperimentConfig, resolve, validate
from asyncfl_jax.presets import PRESETS, get_preset, unavailable
from asyncfl_jax.timing.delays import DelayModel


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_resolve_writes_every_option_and_is_idempotent(name):
    cfg = config_from_argv(["--algorithm", name])
    validate(cfg)
    resolved = resolve(cfg)
    validate(resolved)
    assert resolve(resolved).to_dict() == resolved.to_dict()
    run = resolved.runs[0]
    algorithm = get_algorithm(name)
    assert run.options == dict(algorithm.options)  # every option, with its default
    assert get_algorithm(name, **run.options).options == algorithm.options  # and it builds the same algorithm
    for hp, default in algorithm.hyperparams.items():  # the algorithm's hyper-parameters, the local ones stay local
        if hp in ("client_lr", "momentum", "weight_decay", "prox_mu"):
            assert hp not in run.hparams
        elif hp != "tau_c":
            assert run.hparams[hp] == default
    assert set(resolved.delays) == {f.name for f in dataclasses.fields(DelayModel)}
    assert DelayModel.from_dict(resolved.delays) == cfg.delay_model()


def test_resolve_keeps_given_values_and_sets_tau_c_to_the_concurrency():
    cfg = config_from_argv(["--algorithm", "delay_adaptive_asgd", "--hparam", "server_lr=0.03,0.04"])
    validate(cfg)
    run = resolve(cfg).runs[0]
    assert run.hparams["server_lr"] == [0.03, 0.04]
    assert run.hparams["tau_c"] == float(cfg.data.num_clients)  # all_active: every client trains at once
    cfg = config_from_argv(["--algorithm", "delay_adaptive_asgd", "--protocol", "concurrent", "--concurrency", "7",
                            "--buffer-size", "1", "--hparam", "tau_c=3"])
    validate(cfg)
    assert resolve(cfg).runs[0].hparams["tau_c"] == 3.0
    cfg = config_from_argv(["--algorithm", "delay_adaptive_asgd", "--protocol", "concurrent", "--concurrency", "7",
                            "--buffer-size", "1"])
    validate(cfg)
    assert resolve(cfg).runs[0].hparams["tau_c"] == 7.0


def test_print_config_prints_every_field_and_is_a_valid_config(capsys, tmp_path):
    assert cli.main(["run", "--print-config", "--algorithm", "ace"]) == 0
    raw = json.loads(capsys.readouterr().out)
    assert len(raw["delays"]) == len(dataclasses.fields(DelayModel))
    assert raw["delays"]["dropout_time"] is None  # inf (never) written as null
    assert raw["runs"][0]["options"] == dict(get_algorithm("ace").options)
    assert raw["runs"][0]["hparams"]["server_lr"] == get_algorithm("ace").hyperparams["server_lr"]
    path = tmp_path / "exp.json"
    path.write_text(json.dumps(raw))
    again = ExperimentConfig.from_json(str(path))
    validate(again)
    assert resolve(again).to_dict() == raw
    # a dataset whose files are not here still prints (the template is for writing a config)
    assert cli.main(["run", "--print-config", "--dataset", "fashion_mnist", "--data-dir", str(tmp_path)]) == 0
    assert json.loads(capsys.readouterr().out)["data"]["name"] == "fashion_mnist"


def test_an_older_config_without_the_defaults_written_out_is_the_same_experiment(tmp_path):
    from asyncfl_jax.experiment import output_status

    cfg = config_from_argv(["--algorithm", "fedbuff", "--out", str(tmp_path)])
    validate(cfg)
    (tmp_path / "config.json").write_text(json.dumps(cfg.to_dict()))  # as written before defaults were resolved
    assert output_status(resolve(cfg)).kind == "unfinished"
    cfg.runs[0].hparams["server_lr"] = 0.5
    status = output_status(resolve(cfg))
    assert status.kind == "different" and any("server_lr" in d for d in status.differences)


def test_synthetic_presets_carry_their_task():
    cfg = config_from_argv(["--preset", "asyncfeded/synthetic/fedasync_hinge"])
    validate(cfg)
    assert (cfg.data.name, cfg.data.num_clients, cfg.data.partition) == ("synthetic", 10, "natural")
    assert (cfg.data.synthetic_alpha, cfg.data.synthetic_beta) == (1.0, 1.0)
    assert (cfg.model.name, cfg.model.hidden) == ("mlp", [200, 200])
    assert (cfg.local.steps, cfg.local.batch_size, cfg.local.lr, cfg.local.momentum) == (10, 10, 0.01, 0.5)


@pytest.mark.parametrize("name", [n for n in PRESETS if PRESETS[n]["data"]["name"].startswith("leaf/")])
def test_leaf_presets_refuse_without_their_files_and_validate_with_them(name, tmp_path, monkeypatch, capsys):
    preset = get_preset(name)
    assert unavailable(preset) is None  # the dataset has a loader; whether its files exist is validate's check
    for var in ("ASYNCFL_FEMNIST_DIR", "ASYNCFL_SHAKESPEARE_DIR", "ASYNCFL_DATA_DIR"):
        monkeypatch.delenv(var, raising=False)
    cfg = config_from_argv(["--preset", name])
    with pytest.raises(ConfigError, match="the dataset files are missing"):
        validate(cfg)
    assert cli.main(["run", "--preset", name, "--out", str(tmp_path / "unused")]) == 2
    err = capsys.readouterr().err
    assert "To get the files" in err and "flwrlabs/" in err and "Traceback" not in err
    for split in ("train", "test"):  # LEAF's layout (the loading itself is tested in test_leaf_data.py)
        (tmp_path / "leaf" / split).mkdir(parents=True)
        (tmp_path / "leaf" / split / "all_data.json").write_text('{"users": [], "num_samples": [], "user_data": {}}')
    cfg = config_from_argv(["--preset", name, "--set", f"data.path={tmp_path / 'leaf'}"])
    validate(cfg)
    assert (cfg.data.name, cfg.data.num_clients, cfg.data.partition) == (preset["data"]["name"], 10, "natural")
    assert cfg.model.name == preset["model"]["name"]


def test_presets_listing_says_which_cannot_run(capsys):
    assert cli.main(["presets"]) == 0
    lines = capsys.readouterr().out.splitlines()
    for line in lines:
        name = line.split(":")[0]
        assert ("not runnable here" in line) == (unavailable(PRESETS[name]) is not None), line
        assert f"model={PRESETS[name]['model']['name']}" in line
