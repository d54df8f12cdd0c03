"""One behaviour from every entry point: the command line, a configuration file and Python (``simulate``) run the
same experiment with the same per-algorithm defaults (asyncfl_jax/algorithms/defaults.py); the other spellings of
the client learning rate are refused with the right one; ``--out`` defaults to a new folder per run; a refusal for a
folder of another configuration names a few differing options, not the whole JSON."""

from __future__ import annotations

import contextlib
import datetime
import io
import json
import re
import types

import numpy as np
import pytest

import asyncfl_jax as afl
from asyncfl_jax import cli, outputs
from asyncfl_jax.algorithms import REGISTRY
from asyncfl_jax.algorithms.defaults import EVAL_POINTS, RUN_DEFAULTS, run_defaults
from asyncfl_jax.config import ConfigError, ExperimentConfig, RunConfig, validate
from asyncfl_jax.experiment import config_differences, decide_output

TASK = {"data": {"num_clients": 24, "synthetic_max_samples": 60}, "model": {"name": "logreg"},
        "local": {"steps": 2, "batch_size": 8}}
CLI_TASK = ["--num-clients", "24", "--set", "data.synthetic_max_samples=60", "--model", "logreg", "--local-steps", "2",
            "--batch-size", "8"]


def test_every_algorithm_has_a_usual_run_read_alike_by_the_cli_a_config_file_and_python():
    assert set(RUN_DEFAULTS) == set(REGISTRY)
    for name in REGISTRY:
        from_cli = cli.config_from_argv(["--algorithm", name]).runs[0]
        from_file = ExperimentConfig.from_dict({"runs": [{"algorithm": name}]}).runs[0]
        from_python = ExperimentConfig(runs=[RunConfig(algorithm=name)]).runs[0]
        assert from_cli.protocol == from_file.protocol == from_python.protocol, name
        assert from_cli.arrivals == from_file.arrivals == from_python.arrivals == run_defaults(name).arrivals, name
        assert from_cli.protocol.name == RUN_DEFAULTS[name].protocol["name"]
    assert run_defaults("fedasync").protocol["buffer_size"] == 1  # not the generic 10 arrivals per step
    assert ExperimentConfig().eval_points == EVAL_POINTS == 30


def test_a_run_that_gives_part_of_its_protocol_keeps_the_rest_of_the_algorithms():
    run = ExperimentConfig.from_dict({"data": {"num_clients": 50},
                                      "runs": [{"algorithm": "area", "protocol": {"buffer_size": 2}}]}).runs[0]
    assert (run.protocol.concurrency, run.protocol.buffer_size, run.protocol.refill) == (50, 2, "immediate")
    assert run.arrivals == 12_000
    other = ExperimentConfig.from_dict({"runs": [{"algorithm": "ace", "protocol": {"name": "concurrent"}}]}).runs[0]
    assert (other.protocol.concurrency, other.protocol.buffer_size) == (20, 10)  # another protocol: generic defaults
    assert ExperimentConfig.from_dict({"runs": [{"algorithm": "fedasync", "steps": 7}]}).runs[0].arrivals is None


def test_the_same_experiment_from_the_cli_a_config_file_and_python_gives_the_same_results(tmp_path, monkeypatch):
    """FedAsync (one arrival per step, 20 in flight: its own protocol, not the generic 10 per step), two seeds with a
    schedule each, 30 evaluation points by default; the protocol is given nowhere."""
    monkeypatch.chdir(tmp_path)
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
        assert cli.main(["run", "--algorithm", "fedasync", "--arrivals", "60", "--seeds", "0,1", *CLI_TASK,
                         "--no-progress", "--no-plot", "--no-checkpoint"]) == 0
    printed = re.search(r"writing to (runs/fedasync-\d{8}-\d{6}\S*)", stdout.getvalue())
    assert printed, stdout.getvalue()  # a new folder, printed at the start
    (from_cli,) = afl.load_results(printed.group(1))

    config = tmp_path / "exp.json"
    config.write_text(json.dumps({**TASK, "runs": [{"algorithm": "fedasync", "arrivals": 60}], "seeds": [0, 1]}))
    with contextlib.redirect_stdout(io.StringIO()):
        assert cli.main(["run", "--config", str(config), "--out", "from_file", "--no-progress", "--no-plot",
                         "--no-checkpoint"]) == 0
    (from_file,) = afl.load_results("from_file")

    data = afl.data.synthetic_leaf(num_clients=24, alpha=1.0, beta=1.0, max_samples=60)
    task = afl.make_task(data, data.natural_partition, afl.make_model("logreg", data.input_shape, data.num_classes))
    schedules = afl.default_schedules("fedasync", 24, seeds=[0, 1], arrivals=60)
    from_python = afl.simulate(task, afl.fedasync(), schedules, afl.LocalConfig(steps=2, batch_size=8),
                               seeds=[0, 1], progress=False)

    assert schedules[0].buffer_width == 1 and int(from_python.steps[-1]) == 60  # one arrival per step
    assert len(from_python.steps) in (EVAL_POINTS, EVAL_POINTS + 1)  # 30 evaluations, not every 100 steps
    assert from_python.times[0, -1] != from_python.times[1, -1]  # each seed its own schedule
    for other in (from_cli, from_file):
        np.testing.assert_array_equal(other.steps, from_python.steps)
        np.testing.assert_array_equal(other.uploads, from_python.uploads)
        np.testing.assert_array_equal(other.times, from_python.times)
        for metric in ("test_accuracy", "test_loss"):
            np.testing.assert_array_equal(other.metrics[metric], from_python.metrics[metric])


def test_the_other_spellings_of_the_client_learning_rate_point_to_the_right_one(capsys):
    with pytest.raises(TypeError, match="client_lr"):
        afl.LocalConfig(lr=0.1)
    with pytest.raises(TypeError, match="hyper-parameter 'momentum'"):
        afl.LocalConfig(momentum=0.9)
    with pytest.raises(ConfigError, match="'local.lr' here"):
        ExperimentConfig.from_dict({"local": {"client_lr": 0.1}})
    with pytest.raises(ConfigError, match="client learning rate is the hyper-parameter 'client_lr'"):
        validate(ExperimentConfig.from_dict({"runs": [{"algorithm": "fedbuff", "hparams": {"lr": 0.1}}]}),
                 check_files=False)
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["run", "--client-lr", "0.1"])
    assert exit_info.value.code == 2
    assert "on the command line this is --lr" in capsys.readouterr().err


def test_new_output_folders_are_distinct_within_one_second(tmp_path):
    now = datetime.datetime(2026, 1, 2, 3, 4, 5)
    first = outputs.new_output_folder(["fedbuff", "fedasync"], str(tmp_path), now)
    second = outputs.new_output_folder(["fedbuff", "fedasync"], str(tmp_path), now)
    assert first.endswith("fedbuff-fedasync-20260102-030405") and second == first + "-2"
    many = outputs.new_output_folder(["a", "b", "c", "d"], str(tmp_path), now)
    assert many.endswith("a-b-c-etc-20260102-030405")


def test_a_folder_of_another_configuration_is_refused_with_a_few_differences(tmp_path):
    saved = ExperimentConfig(output=str(tmp_path))  # the default FedBuff vs FedAsync
    validate(saved)
    (tmp_path / "config.json").write_text(json.dumps(saved.to_dict()))
    (tmp_path / "summary.json").write_text("{}")
    current = cli.config_from_argv(["--algorithm", "ace", "--out", str(tmp_path)])
    with pytest.raises(ConfigError) as refusal:
        decide_output(current)
    message = str(refusal.value)
    assert "runs: 2 entries -> 1" in message and "more" in message
    assert len(message) < 500, message  # not the whole JSON of the runs
    lines = config_differences(saved.to_dict(), current.to_dict())
    assert all(len(line) < 160 for line in lines), lines


@pytest.mark.parametrize("name, protocol, concurrency", [
    ("fedbuff", {"concurrency": 10}, 10),
    ("delay_adaptive_asgd", {}, 12),  # all_active: tau_c = every client
    ("delay_adaptive_asgd", {"name": "concurrent", "concurrency": 7, "buffer_size": 1}, 7),
])
def test_the_cli_a_config_file_and_python_merge_the_same_hyper_parameters(monkeypatch, name, protocol, concurrency):
    """Local training's defaults < the algorithm's for the run's concurrency < the run's own, merged alike by
    ``asyncfl run``, a configuration file (resolved or not, through ``run_experiment``) and Python
    (``usual_hparams`` for ``simulate``): the replicas' hyper-parameters are equal, delay-adaptive ASGD's ``tau_c``
    following the concurrency."""
    from asyncfl_jax import experiment
    from asyncfl_jax.config import resolve
    from asyncfl_jax.engine import make_replicas

    given = {"server_lr": [0.5, 0.25]}
    seen = []
    monkeypatch.setattr(experiment, "simulate", lambda *a, **k: seen.append(k["hparams"]))

    def through_run_experiment(cfg):
        experiment.run_experiment(cfg, cfg.runs[0], None, [types.SimpleNamespace(num_steps=4)])
        return make_replicas(afl.get_algorithm(name), [0, 1], seen.pop())

    lr = 0.125 if name == "fedbuff" else 0.05  # delay-adaptive ASGD takes no local learning rate (the default)
    lr_flags = ["--lr", str(lr)] if name == "fedbuff" else []
    from_cli = cli.config_from_argv(["--algorithm", name, "--num-clients", "12", *lr_flags, "--seeds", "0,1",
                                     "--hparam", "server_lr=0.5,0.25",
                                     *(f for k, v in protocol.items() for f in ("--set", f"runs.protocol.{k}={v}"))])
    validate(from_cli, check_files=False)
    from_file = ExperimentConfig.from_dict({"data": {"num_clients": 12}, "local": {"lr": lr}, "seeds": [0, 1],
                                            "runs": [{"algorithm": name, "hparams": given, "protocol": protocol}]})
    resolved = resolve(from_cli)
    python = make_replicas(afl.get_algorithm(name), [0, 1],
                           afl.usual_hparams(name, 12, given, protocol=protocol, local={"client_lr": lr}))
    runs = [through_run_experiment(c) for c in (from_cli, resolved, from_file, resolve(from_file))]
    for replicas in runs:
        assert [(r.seed, r.hparams) for r in replicas] == [(r.seed, r.hparams) for r in python]
    assert {r.hparams["client_lr"] for r in python} == {lr}
    assert [r.hparams["server_lr"] for r in python] == [0.5, 0.25, 0.5, 0.25]
    if name == "delay_adaptive_asgd":
        assert {r.hparams["tau_c"] for r in python} == {float(concurrency)}
        assert resolved.runs[0].hparams["tau_c"] == concurrency  # config.json writes the run's default
