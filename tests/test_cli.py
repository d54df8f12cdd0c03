"""The command line and configuration: bad options are rejected before compiling, good ones run end to end."""

from __future__ import annotations

import json
import os

import pytest

from asyncfl_jax import cli
from asyncfl_jax.config import ConfigError, ExperimentConfig, set_option, validate

SMALL = ["--set", "data.num_clients=20", "--set", "runs.arrivals=60", "--set", "local.steps=2",
         "--set", "eval_points=3", "--no-progress"]


def _error(capsys, *argv) -> str:
    assert cli.main(list(argv)) == 2
    return capsys.readouterr().err


@pytest.mark.parametrize(
    "argv,expected",
    [
        (["--algorithm", "fedbuf"], "runs[0].algorithm = 'fedbuf': must be one of"),
        (["--algorithm", "fedbuff", "--buffer-size", "30", "--concurrency", "20"],
         "runs[0].protocol.buffer_size = 30: must be <= protocol.concurrency (20)"),
        (["--algorithm", "fedasync", "--hparam", "alpha=0"], "runs[0].hparams.alpha = 0.0: must be in (0, 1]"),
        (["--algorithm", "fedasync", "--hparam", "alpha=-0.5"], "must be in (0, 1]"),
        (["--num-clients", "0"], "data.num_clients = 0: must be an integer >= 1"),
        (["--algorithm", "fedavg", "--protocol", "concurrent"], "fedavg is synchronous"),
        (["--algorithm", "fedasync", "--staleness", "cubic"], "staleness must be one of"),
        (["--algorithm", "fedbuff", "--hparam", "server_lr=1,-1"], "runs[0].hparams.server_lr"),
        (["--algorithm", "fedbuff", "--hparam", "alpha=0.5"], "'alpha' is not used by fedbuff"),
        (["--set", "data.nmu_clients=5"], "unknown option 'data.nmu_clients'"),
        (["--model", "cnn"], "'cnn' needs image data"),
        (["--set", "delays.speed=warp"], "speed"),
        (["--dataset", "fashion_mnist", "--data-dir", "/nonexistent-folder"], "dataset files are missing"),
        (["--seeds", "0,x"], "--seeds"),
        (["--concurrency", "500"], "must be <= data.num_clients (100)"),
        (["--algorithm", "ace", "--option", "cache=int9"], "cache must be one of"),
        (["--algorithm", "ace", "--option", "rule"], "expected NAME=VALUE"),
        (["--algorithm", "aced", "--hparam", "tau_algo=-1"], "runs[0].hparams.tau_algo = -1.0: must be in [0, inf)"),
        (["--shard-clients", "--shard-replicas"], "shard_clients = True: cannot be combined with shard_jobs or "
                                                  "shard_replicas"),
        (["--set", "shard_clients=1"], "shard_clients = 1: must be true or false"),
    ],
)
def test_bad_options_are_rejected_with_a_clear_message(capsys, argv, expected):
    err = _error(capsys, "run", "--no-progress", *argv)
    assert expected in err, err
    assert "Traceback" not in err


def test_missing_dataset_message_says_how_to_get_the_files(capsys):
    err = _error(capsys, "run", "--dataset", "mnist", "--data-dir", "/nonexistent-folder")
    assert "/nonexistent-folder" in err and "--data-dir" in err


def test_unknown_config_key_suggests_the_closest(tmp_path):
    path = tmp_path / "c.json"
    path.write_text(json.dumps({"runs": [{"algorithm": "fedbuff", "arrivals": 10, "hparms": {}}]}))
    with pytest.raises(ConfigError, match=r"unknown option 'runs\[0\]\.hparms'.*did you mean 'runs\[0\]\.hparams'"):
        ExperimentConfig.from_json(str(path))


def test_config_round_trip_and_set_option():
    cfg = ExperimentConfig()
    raw = cfg.to_dict()
    set_option(raw, "runs.protocol.concurrency=10")
    set_option(raw, "local.lr=0.1")
    again = ExperimentConfig.from_dict(raw)
    assert [r.protocol.concurrency for r in again.runs] == [10, 10]
    assert again.local.lr == 0.1
    validate(again)


def test_print_config_is_valid_json(capsys):
    assert cli.main(["run", "--print-config"]) == 0
    raw = json.loads(capsys.readouterr().out)
    assert [r["algorithm"] for r in raw["runs"]] == ["fedbuff", "fedasync"]


def test_each_message_is_printed_once_even_with_a_root_handler(tmp_path, capsys):
    """Importing orbax puts a handler on the root logger; the command's messages must not reach it as well (each
    line would be printed twice), and the logger is left as it was."""
    import io
    import logging

    import orbax.checkpoint  # noqa: F401  (what adds the root handler in a real run)

    root, package = logging.getLogger(), logging.getLogger("asyncfl_jax")
    seen = io.StringIO()
    extra = logging.StreamHandler(seen)
    root.addHandler(extra)
    level = root.level
    root.setLevel(logging.INFO)
    try:
        assert cli.main(["run", "--out", str(tmp_path / "run"), *SMALL, "--no-plot"]) == 0
    finally:
        root.removeHandler(extra)
        root.setLevel(level)
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("asyncfl: fedbuff: ")]
    assert lines and len(lines) == len(set(lines)), err  # each progress / memory line once
    assert "fedbuff: " not in seen.getvalue(), seen.getvalue()  # nothing went up to the root handler
    assert package.propagate and not any(isinstance(h, logging.StreamHandler) for h in package.handlers)


def test_run_writes_results(tmp_path, capsys):
    out = tmp_path / "run"
    code = cli.main(["run", "--out", str(out), *SMALL, "--seeds", "0,1"])
    assert code == 0
    assert sorted(os.listdir(out)) == ["accuracy.png", "checkpoints", "config.json", "environment.json",
                                       "manifest.json", "metrics.csv", "schedules", "summary.json"]
    for run in ("fedbuff", "fedasync"):  # the finished runs keep their History, not their checkpoint
        assert sorted(os.listdir(out / "checkpoints" / run)) == ["history.json", "history.npz"]
    assert sorted(os.listdir(out / "schedules")) == ["fedasync-seed0.npz", "fedasync-seed1.npz", "fedbuff-seed0.npz",
                                                     "fedbuff-seed1.npz"]
    summary = json.loads((out / "summary.json").read_text())
    assert [r["run"] for r in summary["runs"]] == ["fedbuff", "fedasync"]
    assert all(len(r["final_test_accuracy"]) == 2 for r in summary["runs"])
    config = json.loads((out / "config.json").read_text())
    assert config["data"]["num_clients"] == 20 and config["seeds"] == [0, 1]
    assert "final test accuracy" in capsys.readouterr().out


def test_run_a_config_file_with_a_sweep(tmp_path):
    cfg = {
        "data": {"num_clients": 8},
        "model": {"name": "logreg"},
        "local": {"steps": 2, "batch_size": None},
        "runs": [{"algorithm": "fedavg", "protocol": {"name": "synchronous", "participants": 4}, "steps": 5,
                  "hparams": {"server_lr": [0.5, 1.0]}}],
        "eval_every": 5,
        "output": str(tmp_path / "sweep"),
    }
    path = tmp_path / "exp.json"
    path.write_text(json.dumps(cfg))
    assert cli.main(["run", "--config", str(path), "--no-progress", "--no-plot"]) == 0
    lines = (tmp_path / "sweep" / "metrics.csv").read_text().splitlines()
    assert lines[0].split(",")[:5] == ["run", "algorithm", "replica", "seed", "server_lr"]
    assert len(lines) == 1 + 2 * 2  # 2 replicas x evaluations at steps 0 and 5


def test_fashion_mnist_from_debian_files(tmp_path):
    from asyncfl_jax.data.idx import DatasetNotFoundError, find_idx_dir

    try:
        find_idx_dir("fashion_mnist")
    except DatasetNotFoundError:
        pytest.skip("Fashion-MNIST IDX files are not installed (apt-get install dataset-fashion-mnist)")
    out = tmp_path / "fmnist"
    code = cli.main(["run", "--dataset", "fashion_mnist", "--partition", "dirichlet", "--dirichlet-alpha", "0.5",
                     "--model", "logreg", "--algorithm", "fedbuff", "--arrivals", "100", "--num-clients", "20",
                     "--local-steps", "2", "--out", str(out), "--no-progress", "--no-plot"])
    assert code == 0
    summary = json.loads((out / "summary.json").read_text())["runs"][0]
    assert summary["final_test_accuracy"][0] > 0.3  # 100 uploads of logistic regression learn something


def test_schedules_are_saved_and_replay_gives_the_same_run(tmp_path):
    first = tmp_path / "first"
    assert cli.main(["run", "--out", str(first), *SMALL, "--no-plot", "--algorithm", "fedbuff",
                     "--concurrency", "8", "--buffer-size", "4"]) == 0
    saved = first / "schedules" / "fedbuff-seed0.npz"
    assert saved.exists()
    config = json.loads((first / "config.json").read_text())
    config["runs"][0].update(schedule_files=[str(saved)], arrivals=None, steps=None)
    config["runs"][0]["protocol"] = {"name": "all_active"}  # ignored when replaying
    config["output"] = str(tmp_path / "replay")
    path = tmp_path / "replay.json"
    path.write_text(json.dumps(config))
    assert cli.main(["run", "--config", str(path), "--no-progress", "--no-plot"]) == 0
    a = (first / "metrics.csv").read_text()
    b = (tmp_path / "replay" / "metrics.csv").read_text()
    assert a == b


def test_bad_schedule_file_is_rejected(tmp_path, capsys):
    bogus = tmp_path / "bogus.npz"
    bogus.write_bytes(b"not a schedule")
    cfg = {"runs": [{"algorithm": "fedbuff", "schedule_files": [str(bogus)]}]}
    path = tmp_path / "c.json"
    path.write_text(json.dumps(cfg))
    assert cli.main(["run", "--config", str(path)]) == 2
    assert "runs[0].schedule_files" in capsys.readouterr().err


@pytest.mark.parametrize("algorithm,options", [("ace", ["--option", "cache=int8"]),
                                               ("aced", ["--option", "active=cache_age"]),
                                               ("area", []),
                                               ("delay_adaptive_asgd", [])])
def test_run_a_bias_correcting_algorithm_with_options(tmp_path, algorithm, options):
    out = tmp_path / "run"
    small = SMALL
    if algorithm != "area":  # gradient uploads train no local steps: local.steps would be refused, not ignored
        k = SMALL.index("local.steps=2")
        small = SMALL[:k - 1] + SMALL[k + 1:]
    assert cli.main(["run", "--out", str(out), *small, "--no-plot", "--algorithm", algorithm, *options]) == 0
    summary = json.loads((out / "summary.json").read_text())
    run = summary["runs"][0]
    assert run["algorithm"] == algorithm and run["memory"]["server_bytes"] > 0
    if algorithm == "ace":
        assert run["algorithm_options"]["cache"] == "int8"
        assert run["schedule"][0]["num_steps"] == 60  # all clients active: one arrival per step
    if algorithm == "delay_adaptive_asgd":  # tau_C defaults to the concurrency: every client (all_active)
        assert run["replicas"][0]["hparams"]["tau_c"] == 20.0
