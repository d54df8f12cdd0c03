"""Checkpoint and resume, output-folder safety and reproducibility metadata.

A resumed run must give exactly (bit for bit) the History of an uninterrupted one: in process (``simulate`` stopped
by a KeyboardInterrupt or a SIGTERM after some chunk) and through the command line (a real ``asyncfl run`` process
killed with SIGKILL, or stopped with SIGTERM, then continued).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import warnings

import numpy as np
import pytest

from asyncfl_jax import LocalConfig, ca2fl, cli, engine, fedbuff, make_model, make_schedule, make_task, simulate
from asyncfl_jax.checkpoint import CheckpointError, CheckpointMismatchError, SimulationInterrupted
from asyncfl_jax.config import ExperimentConfig
from asyncfl_jax.data import synthetic_leaf
from asyncfl_jax.results import environment_info, load_history, save_history
from asyncfl_jax.timing import DelayModel

N = 12
DELAYS = DelayModel(speed="uniform", speed_low=1.0, speed_high=5.0, noise="exponential")
LOCAL = LocalConfig(steps=3, batch_size=8)
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# ca2fl with an int8 cache: a server state with an n x d cache of int8 codes and the server's own randomness
# (stochastic rounding), two replicas of a sweep; 40 steps in chunks of 7 (the last chunk has 5 steps).
RUN = dict(seeds=[0, 1], hparams={"client_lr": [0.05, 0.1]}, eval_every=7, progress=False)


def algorithm():
    return ca2fl(cache="int8")


@pytest.fixture(scope="module")
def task():
    data = synthetic_leaf(num_clients=N, seed=1, max_samples=120)
    return make_task(data, data.natural_partition, make_model("logreg", data.input_shape, data.num_classes))


@pytest.fixture(scope="module")
def schedule():
    return make_schedule("concurrent", N, 40, DELAYS, seed=0, concurrency=6, buffer_size=3, refill="boundary")


@pytest.fixture(scope="module")
def reference(task, schedule, tmp_path_factory):
    """The uninterrupted run, checkpointed (its finished checkpoint serves the refusal tests)."""
    folder = str(tmp_path_factory.mktemp("reference"))
    return simulate(task, algorithm(), schedule, LOCAL, checkpoint_dir=folder, **RUN), folder


def assert_same_history(a, b):
    """Bit for bit: steps, metrics, final parameters, divergence; and the same summary apart from timings."""
    np.testing.assert_array_equal(a.steps, b.steps)
    for k in a.metrics:
        assert a.metrics[k].tobytes() == b.metrics[k].tobytes(), k
    assert a.final_params.tobytes() == b.final_params.tobytes()
    np.testing.assert_array_equal(a.diverged_at, b.diverged_at)
    np.testing.assert_array_equal(a.times, b.times)
    np.testing.assert_array_equal(a.uploads, b.uploads)
    assert a.stopped_early == b.stopped_early
    untimed = [{k: v for k, v in h.summary().items() if k not in ("compile_seconds", "run_seconds")} for h in (a, b)]
    assert json.dumps(untimed[0], sort_keys=True) == json.dumps(untimed[1], sort_keys=True)


class StoppingBar:
    """A progress bar whose ``update`` (called once per chunk, after the chunk is done) runs ``action`` at chunk k."""

    def __init__(self, k, action):
        self.k, self.action, self.calls = k, action, 0

    def update(self, n):
        self.calls += 1
        if self.calls == self.k:
            self.action()

    def set_postfix(self, **kwargs):
        pass

    def close(self):
        pass


def raise_keyboard_interrupt():
    raise KeyboardInterrupt


def record(folder):
    with open(os.path.join(folder, "checkpoint.json")) as f:
        return json.load(f)


# ---------------------------------------------------------------------------------------------------- in process
def test_keyboard_interrupt_saves_and_resume_gives_the_same_history(task, schedule, reference, tmp_path,
                                                                    monkeypatch):
    ref, _ = reference
    folder = str(tmp_path / "ckpt")
    monkeypatch.setattr(engine.callbacks, "progress_bar", lambda *a, **k: StoppingBar(3, raise_keyboard_interrupt))
    with pytest.raises(SimulationInterrupted, match=r"interrupted by KeyboardInterrupt; checkpoint saved") as info:
        # checkpoint_every=2 saves after chunk 2; the interrupt after chunk 3 saves chunk 3 as well
        simulate(task, algorithm(), schedule, LOCAL, checkpoint_dir=folder, checkpoint_every=2, **RUN)
    assert isinstance(info.value, KeyboardInterrupt) and info.value.saved and info.value.step == 21
    saved = record(folder)
    assert (saved["next_chunk"], saved["next_step"], saved["complete"]) == (3, 21, False)
    assert sorted(os.listdir(folder)) == ["checkpoint.json", "state-000003.npz"]  # older states are deleted
    monkeypatch.undo()

    resumed = simulate(task, algorithm(), schedule, LOCAL, checkpoint_dir=folder, resume=True, **RUN)
    assert_same_history(ref, resumed)
    assert record(folder)["complete"]
    again = simulate(task, algorithm(), schedule, LOCAL, checkpoint_dir=folder, resume=True, **RUN)  # nothing left
    assert_same_history(ref, again)


def test_sigterm_saves_stops_and_restores_the_handler(task, schedule, reference, tmp_path, monkeypatch):
    ref, _ = reference
    folder = str(tmp_path / "ckpt")
    before = signal.getsignal(signal.SIGTERM)
    monkeypatch.setattr(engine.callbacks, "progress_bar",
                        lambda *a, **k: StoppingBar(2, lambda: os.kill(os.getpid(), signal.SIGTERM)))
    with pytest.raises(SimulationInterrupted, match=r"interrupted by SIGTERM; checkpoint saved .* after server step "
                                                    r"14 of 40") as info:
        simulate(task, algorithm(), schedule, LOCAL, checkpoint_dir=folder, checkpoint_every=100, **RUN)
    assert info.value.reason == "SIGTERM" and record(folder)["next_chunk"] == 2
    assert signal.getsignal(signal.SIGTERM) is before
    monkeypatch.undo()
    resumed = simulate(task, algorithm(), schedule, LOCAL, checkpoint_dir=folder, resume=True, **RUN)
    assert_same_history(ref, resumed)


def test_rng_is_a_function_of_seed_and_step_only(task, schedule):
    """What makes restoring the carry and the chunk index enough: the compiled chunk is a pure function of (carry,
    steps, hyper-parameters, seed key), so running steps [7, 14) from the carry after step 7 gives the same state
    whether that carry was just computed or went through the host."""
    import jax
    import jax.numpy as jnp

    from asyncfl_jax import schedule_arrays, task_arrays
    from asyncfl_jax.engine import build_program, make_replicas, stack_hparams

    alg = algorithm()
    program = build_program(task, alg, LOCAL, schedule.num_slots)
    sched, data = schedule_arrays(schedule), task_arrays(task)
    hp = stack_hparams(make_replicas(alg, [0]))
    keys = jnp.stack([jax.random.PRNGKey(0)])
    init = jax.jit(jax.vmap(program.init, in_axes=(None, 0, 0, None)))
    chunk = jax.jit(jax.vmap(program.chunk, in_axes=(0, None, 0, 0, None)))
    part = lambda a, b: jax.tree_util.tree_map(lambda x: x[a:b], sched.steps)  # noqa: E731
    carry, _ = chunk(init(sched, hp, keys, data), part(0, 7), hp, keys, data)
    direct, _ = chunk(carry, part(7, 14), hp, keys, data)
    via_host = jax.tree_util.tree_map(lambda x: jnp.asarray(np.asarray(x)), carry)
    restored, _ = chunk(via_host, part(7, 14), hp, keys, data)
    for a, b in zip(jax.tree_util.tree_leaves(direct), jax.tree_util.tree_leaves(restored)):
        assert np.asarray(a).tobytes() == np.asarray(b).tobytes()
    other, _ = chunk(via_host, part(7, 14), hp, jnp.stack([jax.random.PRNGKey(1)]), data)
    assert not np.array_equal(np.asarray(other.server.x), np.asarray(direct.server.x))  # the key is used


@pytest.mark.parametrize("change,expected", [
    (dict(hparams={"client_lr": [0.05, 0.2]}), "replicas"),
    (dict(seeds=[0, 2]), "replicas"),
    (dict(eval_every=5), "eval_every"),
    (dict(label="other"), "label"),
])
def test_resume_refuses_a_checkpoint_of_another_run(task, schedule, reference, change, expected):
    _, folder = reference
    with pytest.raises(CheckpointMismatchError, match=rf"belongs to a different run.*differs in: .*{expected}"):
        simulate(task, algorithm(), schedule, LOCAL, checkpoint_dir=folder, resume=True, **{**RUN, **change})


def test_resume_refuses_other_schedules_algorithm_options_and_local_training(task, schedule, reference):
    _, folder = reference
    other = make_schedule("concurrent", N, 40, DELAYS, seed=5, concurrency=6, buffer_size=3, refill="boundary")
    with pytest.raises(CheckpointMismatchError, match="schedules"):
        simulate(task, algorithm(), other, LOCAL, checkpoint_dir=folder, resume=True, **RUN)
    with pytest.raises(CheckpointMismatchError, match="algorithm_options"):
        simulate(task, ca2fl(cache="int8", cache_rounding="nearest"), schedule, LOCAL, checkpoint_dir=folder,
                 resume=True, **RUN)
    with pytest.raises(CheckpointMismatchError, match="local"):
        simulate(task, algorithm(), schedule, LocalConfig(steps=2, batch_size=8), checkpoint_dir=folder, resume=True,
                 **RUN)


def test_a_corrupt_checkpoint_is_refused(task, schedule, reference, tmp_path):
    import shutil

    _, folder = reference
    copy = tmp_path / "copy"
    shutil.copytree(folder, copy)
    state = next(p for p in copy.iterdir() if p.name.startswith("state-"))
    state.write_bytes(state.read_bytes()[:-10] + b"0123456789")
    with pytest.raises(CheckpointError, match="corrupt"):
        simulate(task, algorithm(), schedule, LOCAL, checkpoint_dir=str(copy), resume=True, **RUN)
    with pytest.raises(ValueError, match="checkpoint_every"):
        simulate(task, algorithm(), schedule, LOCAL, checkpoint_dir=str(copy), checkpoint_every=0, **RUN)
    with pytest.raises(ValueError, match="checkpoint_dir"):
        simulate(task, algorithm(), schedule, LOCAL, resume=True, **RUN)


def test_an_early_stop_is_resumed_without_new_warnings(schedule, tmp_path):
    data = synthetic_leaf(num_clients=N, seed=1, max_samples=120)
    mlp = make_task(data, data.natural_partition, make_model("mlp", data.input_shape, data.num_classes, hidden=[16]))
    kw = dict(seeds=[0], hparams={"client_lr": 1e20}, eval_every=5, progress=False, checkpoint_dir=str(tmp_path))
    with pytest.warns(RuntimeWarning, match="diverged"):
        first = simulate(mlp, fedbuff(), schedule, LOCAL, **kw)
    assert first.stopped_early and record(str(tmp_path))["complete"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the divergence was reported already
        again = simulate(mlp, fedbuff(), schedule, LOCAL, resume=True, **kw)
    assert_same_history(first, again)


def test_history_files_round_trip(reference, tmp_path):
    ref, _ = reference
    save_history(ref, str(tmp_path), meta={"run": "x"})
    loaded = load_history(str(tmp_path), meta={"run": "x"})
    assert_same_history(ref, loaded)
    assert loaded.summary() == json.loads(json.dumps(ref.summary()))
    assert load_history(str(tmp_path), meta={"run": "y"}) is None  # saved for another configuration
    assert load_history(str(tmp_path / "missing")) is None


def test_environment_info_has_the_versions_backend_and_devices():
    info = environment_info()
    for key in ("asyncfl_jax", "python", "jax", "jaxlib", "flax", "optax", "numpy", "jax_backend", "device_kinds",
                "device_count", "platform"):
        assert key in info, key
    assert info["jax_backend"] in ("cpu", "gpu", "tpu", "cuda", "rocm", "METAL")
    assert all(isinstance(k, str) for k in info["device_kinds"])


# ---------------------------------------------------------------------------------------------------- the CLI
SMALL = ["--set", "data.num_clients=10", "--set", "runs.protocol.concurrency=5", "--set", "runs.protocol.buffer_size=1",
         "--set", "runs.arrivals=200", "--set", "local.steps=2", "--model", "logreg", "--set", "eval_points=50",
         "--no-progress", "--no-plot"]  # two runs (fedbuff, fedasync) of 200 steps, 50 chunks of 4 steps each
TIMINGS = ("compile_seconds", "run_seconds")


# `asyncfl run` whose progress bar sleeps 20 ms after each chunk, so that a signal reliably lands in the middle of a
# run however fast the machine and its disk are (the chunks of this small configuration take about a millisecond).
SLOW_CLI = """
import sys, time
from asyncfl_jax import cli, engine

make_bar = engine.callbacks.progress_bar

def slow_bar(*args, **kwargs):
    bar = make_bar(*args, **kwargs)
    update = bar.update
    bar.update = lambda n: (time.sleep(0.02), update(n))[1]
    return bar

engine.callbacks.progress_bar = slow_bar
sys.exit(cli.main(sys.argv[1:]))
"""


def _cli(*argv, slow=False):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([REPO, os.environ.get("PYTHONPATH", "")]),
               JAX_PLATFORMS=os.environ.get("JAX_PLATFORMS", "cpu"))
    command = ["-c", SLOW_CLI] if slow else ["-m", "asyncfl_jax.cli"]
    return subprocess.Popen([sys.executable, *command, "run", *argv], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def _finish(proc, timeout=120):
    out, err = proc.communicate(timeout=timeout)
    return proc.returncode, out, err


def _wait_for_checkpoint(proc, folder, min_chunk, timeout=90):
    path = os.path.join(folder, "checkpoint.json")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, "the run ended before it could be interrupted: " + proc.stderr.read()[-2000:]
        try:
            with open(path) as f:
                if json.load(f)["next_chunk"] >= min_chunk:
                    return
        except (OSError, ValueError, KeyError):
            pass
        time.sleep(0.005)
    raise AssertionError(f"no checkpoint of chunk >= {min_chunk} in {folder} after {timeout} s")


def _comparable_results(out):
    """The result files with the timing fields and the output folder removed."""
    summary = json.loads((out / "summary.json").read_text())
    for run in summary["runs"]:
        for key in TIMINGS:
            run.pop(key)
    summary["config"].pop("output")
    config = json.loads((out / "config.json").read_text())
    config.pop("output")
    schedules = {p.name: dict(np.load(p)) for p in sorted((out / "schedules").iterdir())}
    return (out / "metrics.csv").read_text(), summary, config, schedules


def _histories(out):
    return {p.name: load_history(str(p)) for p in sorted((out / "checkpoints").iterdir())}


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """The reference: the same command run to the end without checkpoints."""
    out = tmp_path_factory.mktemp("cli") / "uninterrupted"
    code, stdout, err = _finish(_cli("--out", str(out), "--no-checkpoint", *SMALL))
    assert code == 0, err[-3000:]
    assert not (out / "checkpoints").exists()
    return out


def assert_same_results(out, reference):
    a, b = _comparable_results(out), _comparable_results(reference)
    assert a[0] == b[0]  # metrics.csv, byte for byte
    assert a[1] == b[1]  # summary.json: final/best accuracies, divergence, schedule statistics, environment...
    assert a[2] == b[2]
    assert a[3].keys() == b[3].keys()
    for name in a[3]:
        for key in a[3][name]:
            np.testing.assert_array_equal(a[3][name][key], b[3][name][key])


def test_cli_killed_with_sigkill_resumes_to_the_same_results(uninterrupted, tmp_path):
    out = tmp_path / "killed"
    proc = _cli("--out", str(out), *SMALL, slow=True)  # checkpoints every chunk by default
    _wait_for_checkpoint(proc, str(out / "checkpoints" / "fedasync"), min_chunk=2)  # mid second run
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    assert (out / "config.json").exists() and not (out / "summary.json").exists()
    assert load_history(str(out / "checkpoints" / "fedbuff")) is not None  # the first run had finished
    assert load_history(str(out / "checkpoints" / "fedasync")) is None
    saved = record(str(out / "checkpoints" / "fedasync"))
    assert 2 <= saved["next_chunk"] < saved["num_chunks"]

    code, stdout, err = _finish(_cli("--resume", str(out), "--no-progress", "--no-plot"))
    assert code == 0, err[-3000:]
    assert_same_results(out, uninterrupted)
    assert not (out / "checkpoints" / "fedasync" / "checkpoint.json").exists()  # the finished run keeps its History
    histories = _histories(out)
    assert set(histories) == {"fedbuff", "fedasync"}
    summary = json.loads((uninterrupted / "summary.json").read_text())
    for run in summary["runs"]:
        assert histories[run["run"]].summary()["final_test_accuracy"] == run["final_test_accuracy"]


def test_cli_sigterm_saves_exits_and_the_same_command_continues(uninterrupted, tmp_path):
    out = tmp_path / "terminated"
    proc = _cli("--out", str(out), *SMALL, "--checkpoint-every", "3", slow=True)
    _wait_for_checkpoint(proc, str(out / "checkpoints" / "fedbuff"), min_chunk=3)  # mid first run
    proc.send_signal(signal.SIGTERM)
    code, stdout, err = _finish(proc)
    assert code == 143, err[-3000:]
    assert "fedbuff: interrupted by SIGTERM; checkpoint saved in" in err
    assert f"asyncfl run --resume {out}" in err
    saved = record(str(out / "checkpoints" / "fedbuff"))
    assert 3 <= saved["next_chunk"] < saved["num_chunks"]  # saved when stopped, not only every 3 chunks

    # the same command again: the folder holds an unfinished run of this configuration, so it continues
    code, stdout, err = _finish(_cli("--out", str(out), *SMALL, "--checkpoint-every", "3"))
    assert code == 0, err[-3000:]
    assert "holds an unfinished run of this configuration: continuing it" in stdout
    assert_same_results(out, uninterrupted)
    environment = json.loads((out / "environment.json").read_text())
    for key in ("asyncfl_jax", "python", "jax", "jaxlib", "flax", "optax", "numpy", "jax_backend", "device_kinds",
                "config"):
        assert key in environment, key
    summary = json.loads((out / "summary.json").read_text())
    assert summary["environment"]["jax"] == environment["jax"]
    assert summary["config"]["data"]["num_clients"] == 10


# ---------------------------------------------------------------------------------------------------- output safety
def _main_error(capsys, *argv):
    code = cli.main(list(argv))
    return code, capsys.readouterr()


def _write_config(folder, **changes):
    folder.mkdir(parents=True, exist_ok=True)
    raw = json.loads(json.dumps(cli._config_from_args(cli._build_parser().parse_args(["run", *SMALL])).to_dict()))
    raw["data"].update(changes)
    raw["output"] = str(folder)
    (folder / "config.json").write_text(json.dumps(raw))
    return raw


def test_a_non_empty_folder_of_something_else_is_refused(tmp_path, capsys):
    out = tmp_path / "busy"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    code, cap = _main_error(capsys, "run", "--out", str(out), *SMALL)
    assert code == 2 and "is not empty and holds no asyncfl results" in cap.err and "--overwrite" in cap.err
    assert os.listdir(out) == ["notes.txt"]


def test_a_folder_of_another_configuration_is_refused(tmp_path, capsys):
    out = tmp_path / "other"
    _write_config(out, num_clients=12)
    code, cap = _main_error(capsys, "run", "--out", str(out), *SMALL)
    assert code == 2
    assert "holds the results of a different configuration" in cap.err and "data.num_clients: 12 -> 10" in cap.err
    assert sorted(os.listdir(out)) == ["config.json"]


def test_finished_results_of_the_same_configuration_are_not_rerun_silently(tmp_path, capsys):
    out = tmp_path / "done"
    _write_config(out)
    (out / "summary.json").write_text("{}")
    code, cap = _main_error(capsys, "run", "--out", str(out), *SMALL)
    assert code == 2 and "already holds the finished results" in cap.err and "--resume" in cap.err


def test_overwrite_deletes_only_what_asyncfl_wrote(tmp_path):
    from asyncfl_jax.experiment import clean_output

    out = tmp_path / "old"
    _write_config(out)
    for name in ("summary.json", "metrics.csv", "notes.txt"):
        (out / name).write_text("x")
    (out / "schedules").mkdir()
    (out / "schedules" / "fedbuff-seed0.npz").write_bytes(b"x")
    (out / "checkpoints" / "fedbuff").mkdir(parents=True)
    for name in ("history.json", "history.npz", "checkpoint.json", "state-000002.npz"):
        (out / "checkpoints" / "fedbuff" / name).write_bytes(b"x")
    clean_output(str(out))
    assert os.listdir(out) == ["notes.txt"]


def test_resume_option_errors(tmp_path, capsys):
    code, cap = _main_error(capsys, "run", "--resume", str(tmp_path / "nothing"))
    assert code == 2 and "config.json does not exist" in cap.err
    _write_config(tmp_path / "r")
    code, cap = _main_error(capsys, "run", "--resume", str(tmp_path / "r"), "--set", "local.lr=0.1")
    assert code == 2 and "cannot be combined with --set" in cap.err
    code, cap = _main_error(capsys, "run", "--resume", str(tmp_path / "r"), "--overwrite")
    assert code == 2 and "--overwrite" in cap.err
    code, cap = _main_error(capsys, "run", "--out", str(tmp_path / "n"), "--checkpoint-every", "0", *SMALL)
    assert code == 2 and "--checkpoint-every = 0" in cap.err
    code, cap = _main_error(capsys, "run", "--resume", str(tmp_path / "r"), "--print-config")
    assert code == 0 and json.loads(cap.out)["output"] == str(tmp_path / "r")


def test_run_config_writes_the_config_first_and_refuses_to_resume_another(tmp_path):
    from asyncfl_jax.config import ConfigError
    from asyncfl_jax.experiment import run_config

    out = tmp_path / "x"
    raw = _write_config(out, num_clients=12)
    raw["data"]["num_clients"] = 10
    cfg = ExperimentConfig.from_dict(raw)
    with pytest.raises(ConfigError, match=r"cannot resume .* different configuration \(data.num_clients: 12 -> 10"):
        run_config(cfg, progress=False, resume=True)
