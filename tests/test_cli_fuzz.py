"""Property-based tests of the command's error boundary: whatever the arguments or the configuration file's bytes,
`asyncfl run` ends with exit code 0 or 2, prints no traceback, and touches no file outside ``--out``.

Each example calls ``cli.main(argv)`` in-process. The experiment itself is replaced by a recorder
(``experiment.run_config``), so every example goes through the whole path before it: parsing, ``--set``,
validation, ``resolve``, the ``--out`` checks and the memory refusal from the configuration alone
(``preflight.check_memory``); ``test_tiny_runs_end_to_end`` runs a few generated configurations for real.
Per run: 120 argument lists + 60 configuration files + 3 real runs = 183 generated inputs.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import tempfile

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from asyncfl_jax import cli, experiment
from asyncfl_jax.config import ConfigError, set_option

TINY = ["--no-progress", "--no-plot", "--model", "logreg", "--set", "data.num_clients=6",
        "--set", "data.synthetic_max_samples=60", "--set", "runs.protocol.concurrency=4",
        "--set", "runs.protocol.buffer_size=1", "--set", "runs.arrivals=12", "--set", "local.steps=1",
        "--set", "eval_points=2"]

JSON = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-10**20, max_value=10**20)
    | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=6)
VALUES = JSON | st.integers(1, 8) | st.sampled_from([0.1, 0.5, 1, 2, 4, "iid", "natural", "logreg", "fedasync",
                                                     "concurrent", None, [0], [0, 1], {}, True])
"""Random JSON and plausible values, so that many examples get past the first check to the later ones."""
KEYS = ["data.num_clients", "data.name", "data.partition", "data.dirichlet_alpha", "data.min_size", "data.seed",
        "data.synthetic_alpha", "data.synthetic_max_samples", "data.examples_per_client", "data.client_test_fraction",
        "data.eval_clients", "data.path", "model.name", "model.hidden", "model.seed", "local.steps",
        "local.batch_size", "local.epochs", "local.lr", "local.momentum", "runs.steps", "runs.arrivals",
        "runs.label", "runs.algorithm", "runs.options", "runs.hparams", "runs.protocol", "runs.protocol.name",
        "runs.protocol.concurrency", "runs.protocol.buffer_size", "runs.protocol.aggregation",
        "runs.schedule_files", "delays.speed", "delays.speed_low", "seeds", "eval_points", "eval_every",
        "lookahead", "shard_clients", "runs", "data", "delays", "nonsense", "data.nonsense", "runs.x.y"]
FLAGS = {  # option -> values (valid and invalid side by side)
    "--num-clients": ["6", "0", "-1", "1000000000", "2.5", "x"],
    "--steps": ["3", "0", "-2", "1000000000000", "nan"],
    "--arrivals": ["12", "0", "1e3"],
    "--seeds": ["0", "0,1", "0,0", "-1", "100000000000000000000", "1.5", ""],
    "--lr": ["0.1", "-0.1", "nan", "inf", "0"],
    "--batch-size": ["4", "0", "-3"],
    "--local-steps": ["1", "0", "huge"],
    "--eval-every": ["1", "0", "-5"],
    "--lookahead": ["1", "2", "0"],
    "--algorithm": ["fedbuff", "fedasync", "ace", "area", "fedavg", "fedbuf", ""],
    "--protocol": ["concurrent", "all_active", "synchronous", "event_clock", "lottery"],
    "--concurrency": ["2", "0", "100"],
    "--buffer-size": ["1", "0", "9"],
    "--hparam": ["server_lr=0.5", "server_lr=-1", "alpha=nan", "x", "client_lr=0.1,0.2"],
    "--option": ["cache=int8", "cache=int9", "rule", "=", "staleness=hinge"],
    "--dataset": ["synthetic", "mnist", "tfds/cifar10", "leaf/femnist", "imagenet"],
    "--data-dir": ["missing-folder", "file.txt", ""],
    "--partition": ["iid", "natural", "dirichlet", "shards", "bogus"],
    "--dirichlet-alpha": ["0.3", "0", "-1", "inf"],
    "--model": ["logreg", "mlp", "cnn", "resnet"],
    "--checkpoint-every": ["1", "0", "-1"],
    "--config": ["missing.json", "file.txt", "folder"],
    "--out": ["out", "", "file.txt/sub", "x" * 300, "folder"],
    "--speed": ["uniform", "warp"],
    "--noise": ["none", "loud"],
    "--preset": ["asyncfeded/synthetic/asyncfeded", "nope/nope"],
    "--num-clientz": ["6"],
}
SWITCHES = ["--overwrite", "--no-checkpoint", "--shard-clients", "--shard-replicas", "--print-config", "--debug",
            "--unknown-switch"]


@st.composite
def argument_lists(draw) -> list[str]:
    argv = list(TINY)
    for flag in draw(st.lists(st.sampled_from(sorted(FLAGS)), max_size=2)):
        value = draw(st.text(max_size=6)) if draw(st.integers(0, 5)) == 0 else draw(st.sampled_from(FLAGS[flag]))
        argv += [flag, value]
    for key in draw(st.lists(st.sampled_from(KEYS), max_size=2)):
        argv += ["--set", f"{key}={json.dumps(draw(VALUES))}"]
    argv += draw(st.lists(st.sampled_from(SWITCHES), max_size=1))
    return argv


def _tree(root: str) -> dict[str, tuple[int, float]]:
    """Every path under ``root`` with its size and modification time."""
    out = {}
    for folder, dirs, files in os.walk(root):
        for name in dirs + files:
            path = os.path.join(folder, name)
            st_ = os.lstat(path)
            out[os.path.relpath(path, root)] = (st_.st_size, st_.st_mtime_ns)
    return out


def _inside(path: str, out: str | None) -> bool:
    return out is not None and out.strip() != "" and (path == out or path.startswith(out.rstrip("/") + "/"))


def _run_in_sandbox(argv: list[str], config_bytes: bytes | None = None) -> tuple[int, str]:
    """``cli.main(["run", *argv])`` in a fresh folder holding a user's file, a folder and (optionally) ``c.json``;
    returns the exit code and stderr after checking that nothing outside ``--out`` changed."""
    with tempfile.TemporaryDirectory() as root:
        with open(os.path.join(root, "file.txt"), "w") as f:
            f.write("the user's own file")
        os.mkdir(os.path.join(root, "folder"))
        if config_bytes is not None:
            with open(os.path.join(root, "c.json"), "wb") as f:
                f.write(config_bytes)
        try:
            out = argv[len(argv) - argv[::-1].index("--out")]  # the value of the last --out
        except (ValueError, IndexError):
            out = "runs"  # a new folder runs/<algorithms>-<time>
        before = _tree(root)
        cwd, err = os.getcwd(), io.StringIO()
        os.chdir(root)
        try:
            with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
                try:
                    code = cli.main(["run", *argv])
                except SystemExit as e:  # argparse's usage errors (2) and --help (0)
                    code = e.code
        finally:
            os.chdir(cwd)
        after = _tree(root)
        changed = {p for p in set(before) | set(after) if before.get(p) != after.get(p) and not _inside(p, out)}
        assert not changed, (argv, sorted(changed))
    return code, err.getvalue()


@pytest.fixture
def recorded_runs(monkeypatch):
    """Replaces the experiment by a recorder: the command's whole path before it still runs."""
    calls = []

    def record(cfg, **kwargs):
        calls.append(cfg)
        return []

    monkeypatch.setattr(experiment, "run_config", record)
    return calls


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(argv=argument_lists())
def test_any_arguments_end_with_0_or_2_and_no_traceback(recorded_runs, argv):
    reached = len(recorded_runs)
    code, err = _run_in_sandbox(argv)
    event("reached the run" if len(recorded_runs) > reached else f"exit {code} before the run")
    assert code in (0, 2), (argv, code, err)
    assert "Traceback" not in err or "--debug" in argv, (argv, err)
    if code == 2:
        assert "error" in err, (argv, err)


CONFIG_SECTIONS = {"data": {"num_clients": 6, "synthetic_max_samples": 60}, "model": {"name": "logreg"},
                   "local": {"steps": 1}, "eval_points": 2,
                   "runs": [{"algorithm": "fedasync", "arrivals": 12,
                             "protocol": {"name": "concurrent", "concurrency": 4, "buffer_size": 1,
                                          "refill": "immediate"}}]}


@st.composite
def config_files(draw) -> bytes:
    """Raw bytes, or a valid configuration with random values put in, in a random encoding, possibly truncated."""
    if draw(st.integers(0, 3)) == 0:
        return draw(st.binary(max_size=64))
    raw = json.loads(json.dumps(CONFIG_SECTIONS))
    for _ in range(draw(st.integers(0, 2))):
        with contextlib.suppress(ConfigError):  # a key under a value that is no longer a section: leave it out
            set_option(raw, f"{draw(st.sampled_from(KEYS))}={json.dumps(draw(VALUES))}")
    text = json.dumps(raw)
    data = text.encode(draw(st.sampled_from(["utf-8", "utf-8", "utf-16", "utf-32"])), errors="surrogatepass")
    cut = draw(st.integers(0, len(data)))
    return data if draw(st.integers(0, 3)) else data[:cut]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=config_files())
def test_any_config_file_ends_with_0_or_2_and_no_traceback(recorded_runs, data):
    reached = len(recorded_runs)
    code, err = _run_in_sandbox(["--config", "c.json", "--out", "out", "--no-progress"], config_bytes=data)
    event("reached the run" if len(recorded_runs) > reached else f"exit {code} before the run")
    assert code in (0, 2), (data[:80], code, err)
    assert "Traceback" not in err, err


def test_the_base_arguments_reach_the_run(recorded_runs):
    """The fuzzed arguments start from a valid command, so that a value's own check is what refuses it."""
    code, err = _run_in_sandbox([*TINY, "--out", "out"])
    assert code == 0 and len(recorded_runs) == 1, err
    code, err = _run_in_sandbox(["--config", "c.json", "--out", "out"], json.dumps(CONFIG_SECTIONS).encode())
    assert code == 0 and len(recorded_runs) == 2, err


@settings(max_examples=3, deadline=None)
@given(algorithm=st.sampled_from(["fedbuff", "fedasync", "ace", "ca2fl"]),
       value=st.sampled_from(["0.05", "-0.05", "nan", "[0.05, 0.1]"]))
def test_tiny_runs_end_to_end(algorithm, value):
    argv = [*TINY, "--algorithm", algorithm, "--protocol", "concurrent", "--concurrency", "4", "--buffer-size", "1",
            "--arrivals", "8", "--set", f"local.lr={value}", "--out", "out"]
    code, err = _run_in_sandbox(argv)
    assert code in (0, 2) and "Traceback" not in err, (argv, code, err)
