"""The command's single error boundary: each class of bad input or environmental fault ends with exit code 2 and a
message naming what is wrong and what to do (1 and "internal error" only for a bug), no traceback unless --debug;
and what cannot fit is refused from the configuration alone, before anything is built."""

from __future__ import annotations

import errno
import gzip
import json
import os
import resource
import time

import pytest

from asyncfl_jax import cli, experiment, preflight
from asyncfl_jax.config import ConfigError, ExperimentConfig, validate
from asyncfl_jax.engine.budget import MemoryRefusal, check_compiled, compiled_bytes
from asyncfl_jax.errors import InputError
from asyncfl_jax.timing.schedule import Schedule, ScheduleFileError

TINY = ["--no-progress", "--no-plot", "--model", "logreg", "--set", "data.num_clients=6",
        "--set", "data.synthetic_max_samples=60", "--set", "runs.protocol.concurrency=4",
        "--set", "runs.protocol.buffer_size=1", "--set", "runs.arrivals=12", "--set", "local.steps=1",
        "--set", "eval_points=2"]


def _exit(capsys, tmp_path, *argv, out="out"):
    argv = ["run", *TINY, *([] if out is None else ["--out", str(tmp_path / out)]), *argv]
    code = cli.main(argv)
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    return code, err


@pytest.fixture
def files(tmp_path):
    (tmp_path / "binary.json").write_bytes(bytes(range(128, 256)))
    (tmp_path / "folder.json").mkdir()
    (tmp_path / "a_file").write_text("not a folder")
    idx = tmp_path / "idx"
    idx.mkdir()
    for name in ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz", "t10k-images-idx3-ubyte.gz",
                 "t10k-labels-idx1-ubyte.gz"):
        (idx / name).write_bytes(gzip.compress(b"\x00\x00\x08\x03\x00\x00\x00\x05")[:-6])  # truncated
    (tmp_path / "schedule.npz").write_bytes(b"PK\x03\x04 truncated")
    return tmp_path


@pytest.mark.parametrize("argv,message", [
    (["--set", 'runs.steps="abc"', "--set", "runs.arrivals=null"], "invalid option runs[0].steps = 'abc'"),
    (["--set", "data.num_clients=[1]"], "invalid option data.num_clients = [1]: must be an integer >= 1"),
    (["--set", "runs=5"], "invalid option runs = 5: must be a non-empty list of runs"),
    (["--set", "runs.hparams=[1]"], "invalid option runs[0].hparams = [1]: must be an object"),
    (["--set", 'runs.protocol="x"'], "option runs[0].protocol must be an object, got 'x'"),
    (["--set", "runs.label=[5]"], "invalid option runs[0].label = [5]: must be null"),
    (["--set", "data.path=5"], "invalid option data.path = 5"),
    (["--set", "data.synthetic_alpha=NaN"], "invalid option data.synthetic_alpha = nan"),
    (["--seeds", "100000000000000000000"], "invalid option seeds = 100000000000000000000"),
    (["--config", "{tmp}/binary.json"], "is not text (it cannot be decoded as UTF-8, UTF-16 or UTF-32)"),
    (["--config", "{tmp}/folder.json"], "is a folder; give the path of a JSON file"),
    (["--config", "{tmp}/missing.json"], "does not exist"),
    (["--dataset", "mnist", "--data-dir", "{tmp}/idx"], "train-images-idx3-ubyte.gz: cannot read"),
    (["--set", 'runs.schedule_files=["{tmp}/schedule.npz"]'], "schedule.npz: not a valid schedule file"),
    (["--dataset", "mnist", "--data-dir", "{tmp}/idx", "--set", "data.num_clients=70000"],
     "mnist has 60000 training examples, fewer than the 70000"),
    (["--out", "{tmp}/a_file/sub"], "a_file is a file, not a folder"),
    (["--out", "{tmp}/" + "x" * 300], "more than the file system allows"),
])
def test_each_class_of_bad_input_ends_with_exit_code_2_and_a_message(capsys, files, argv, message):
    argv = [a.replace("{tmp}", str(files)) for a in argv]
    code, err = _exit(capsys, files, *argv, out=None if "--out" in argv else "out")
    assert code == 2, err
    assert message in err, err
    if "cannot read" not in message:  # refused before anything is written (data files are read once the run starts)
        assert not (files / "out").exists()


def test_a_utf16_config_file_is_read(tmp_path):
    path = tmp_path / "c.json"
    path.write_bytes(json.dumps({"seeds": [3], "data": {"num_clients": 7}}).encode("utf-16"))
    cfg = ExperimentConfig.from_json(str(path))
    assert cfg.seeds == [3] and cfg.data.num_clients == 7


def test_a_schedule_file_that_is_not_one_raises_schedule_file_error(tmp_path):
    path = tmp_path / "s.npz"
    path.write_bytes(b"\x00" * 10)
    with pytest.raises(ScheduleFileError, match="not a valid schedule file") as caught:
        Schedule.load(path)
    assert isinstance(caught.value, InputError)


def _unreadable_folder_is_enforced(path) -> bool:
    return not os.access(path, os.W_OK)


def test_an_unwritable_out_parent_is_refused(capsys, tmp_path):
    parent = tmp_path / "locked"
    parent.mkdir()
    parent.chmod(0o500)
    try:
        if not _unreadable_folder_is_enforced(parent):
            pytest.skip("running as a user whom permissions do not stop (root)")
        code, err = _exit(capsys, tmp_path, "--out", str(parent / "out"), out=None)
        assert code == 2 and "permission denied" in err, err
    finally:
        parent.chmod(0o700)


@pytest.mark.parametrize("error,code,message", [
    (OSError(errno.ENOSPC, "No space left on device", "OUT/metrics.csv"), 2,
     "no space left on the device writing OUT/metrics.csv (No space left on device): free some space, then continue "
     "with: asyncfl run --resume"),
    (PermissionError(errno.EACCES, "Permission denied", "OUT/config.json"), 2,
     "cannot write or read OUT/config.json: Permission denied"),
    (OSError(errno.ENAMETOOLONG, "File name too long", "OUT/x"), 2, "the path OUT/x is too long"),
    (OSError(errno.EIO, "Input/output error", "OUT/y"), 2, "OUT/y: Input/output error"),
    (MemoryError(), 2, "the process ran out of memory"),
    (MemoryRefusal("this run needs about 9 GiB: lower data.num_clients"), 2, "lower data.num_clients"),
    (RuntimeError("RESOURCE_EXHAUSTED: Out of memory while trying to allocate 99 bytes"), 2,
     "the accelerator ran out of memory"),
    (ZeroDivisionError("division by zero"), 1, "internal error (ZeroDivisionError: division by zero). This is a bug"),
])
def test_faults_during_the_run_end_at_the_boundary(capsys, tmp_path, monkeypatch, error, code, message):
    def fail(cfg, **kwargs):
        os.makedirs(cfg.output, exist_ok=True)
        with open(os.path.join(cfg.output, "config.json"), "w") as f:
            f.write("{}")
        raise error

    monkeypatch.setattr(experiment, "run_config", fail)
    got, err = _exit(capsys, tmp_path)
    assert got == code, err
    assert message.replace("OUT", str(tmp_path / "out")) in err or message in err, err
    assert err.count("asyncfl: error:") == 1


def test_a_checkpoint_save_that_fails_for_a_full_disk_says_to_free_space_and_resume(capsys, tmp_path, monkeypatch):
    from asyncfl_jax.checkpoint import CheckpointError

    def fail(cfg, **kwargs):
        os.makedirs(cfg.output, exist_ok=True)  # a run that started (resumable): its config.json is there
        with open(os.path.join(cfg.output, "config.json"), "w") as f:
            f.write("{}")
        try:
            raise OSError(errno.ENOSPC, "No space left on device")
        except OSError as e:
            raise CheckpointError("saving the checkpoint of fedbuff failed") from e

    monkeypatch.setattr(experiment, "run_config", fail)
    code, err = _exit(capsys, tmp_path)
    assert code == 2 and "saving the checkpoint of fedbuff failed; free some space, then continue with: asyncfl run " \
        f"--resume {tmp_path / 'out'}" in err, err


def test_debug_shows_the_traceback(capsys, tmp_path, monkeypatch):
    monkeypatch.setattr(experiment, "run_config", lambda cfg, **kw: 1 / 0)
    assert cli.main(["run", *TINY, "--out", str(tmp_path / "out"), "--debug"]) == 1
    err = capsys.readouterr().err
    assert "Traceback" in err and "ZeroDivisionError" in err and "internal error" in err


def test_a_keyboard_interrupt_outside_the_loop_ends_with_130(capsys, tmp_path, monkeypatch):
    def interrupt(cfg, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(experiment, "run_config", interrupt)
    code, err = _exit(capsys, tmp_path)
    assert code == 130 and "interrupted before the run started; nothing was written" in err, err


# ---------------------------------------------------------------------------------------------------- preflight
@pytest.mark.parametrize("argv,message", [
    (["--num-clients", "1000000000"], "lower data.num_clients"),
    (["--steps", "1000000000000"], "lower runs[i].steps or runs[i].arrivals"),
    (["--algorithm", "ace", "--num-clients", "1000000"], "of device memory (twice the simulation state"),
])
def test_what_cannot_fit_is_refused_from_the_configuration_within_a_second(capsys, tmp_path, argv, message):
    from asyncfl_jax.engine.budget import device_memory_bytes, host_memory_bytes

    host, device = host_memory_bytes(), device_memory_bytes()
    if not host or not device or host > 2**40 or device > 2**40:
        pytest.skip("a machine with more than 1 TiB, or one that does not report its memory")
    preflight.model_params(ExperimentConfig())  # JAX's start-up is not the check's time
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t0 = time.perf_counter()
    code = cli.main(["run", "--no-progress", "--out", str(tmp_path / "out"), *argv])
    seconds = time.perf_counter() - t0
    err = capsys.readouterr().err
    assert code == 2 and message in err and "Traceback" not in err, err
    assert seconds < 3, seconds
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 200_000  # KiB: no growth to speak of
    assert not (tmp_path / "out").exists()


def test_the_estimate_is_a_lower_bound_of_the_built_run():
    """The configuration-only estimate never exceeds what the prepared run really holds (so it never refuses a run
    that fits): compared with the exact budget of a small ACE run (n x d cache) and its data."""
    from asyncfl_jax.cli import config_from_argv
    from asyncfl_jax.config import resolve
    from asyncfl_jax.engine.loop import prepare_run
    from asyncfl_jax.experiment import build_schedules, build_task
    from asyncfl_jax.algorithms import get_algorithm
    from asyncfl_jax.client import LocalConfig

    cfg = config_from_argv(["--algorithm", "ace", "--num-clients", "8", "--model", "logreg", "--steps", "5",
                            "--seeds", "0,1", "--set", "data.synthetic_max_samples=60"])
    validate(cfg)
    cfg = resolve(cfg)
    est = preflight.estimate_memory(cfg)
    task = build_task(cfg)
    run_cfg = cfg.runs[0]
    schedules = build_schedules(cfg, run_cfg)
    run = prepare_run(task, get_algorithm(run_cfg.algorithm, **run_cfg.options), schedules, LocalConfig(steps=1),
                      seeds=cfg.seeds, eval_every=5)
    budget = run.budget()
    assert est.params == task.model.flat_params.size
    assert 0 < est.state <= budget.server + budget.clients
    assert est.state >= 2 * 8 * est.params * 4  # two replicas of an n x d float32 cache
    assert 0 < est.data <= budget.data
    assert 0 < est.schedules <= sum(sum(a.nbytes for a in (s.dispatch_clients, s.dispatch_slots, s.dispatch_times,
                                                          s.arrival_clients, s.arrival_slots, s.arrival_versions,
                                                          s.arrival_times, s.step_times)) for s in schedules)


def test_more_clients_than_examples_is_a_config_error():
    cfg = ExperimentConfig()
    cfg.data.name, cfg.data.partition, cfg.data.num_clients = "mnist", "shards", 40_000
    with pytest.raises(ConfigError, match="data.shards_per_client = 2 shards"):
        preflight.check_partition_fits(cfg)
    cfg.data.partition = "dirichlet_sampled"
    preflight.check_partition_fits(cfg)  # any number of clients


class _Stats:
    argument_size_in_bytes, output_size_in_bytes, alias_size_in_bytes, temp_size_in_bytes = 100, 50, 40, 900


class _Compiled:
    def memory_analysis(self):
        return _Stats()


def test_the_compiled_chunk_is_checked_with_xla_memory_analysis():
    assert compiled_bytes(_Compiled()) == 100 + 50 - 40 + 900
    assert check_compiled(_Compiled(), "run", available=10_000) == 1010
    with pytest.raises(MemoryRefusal, match="run: the compiled server-step chunk needs"):
        check_compiled(_Compiled(), "run", available=1000)
    import jax
    import jax.numpy as jnp

    real = jax.jit(lambda x: x * 2).lower(jnp.ones((1000,), jnp.float32)).compile()
    assert compiled_bytes(real) >= 8000  # its argument and its output


# ---------------------------------------------------------------------------------------------------- Python API
@pytest.fixture(scope="module")
def tiny_api():
    import asyncfl_jax as afl

    ds = afl.data.synthetic_leaf(num_clients=4, alpha=1.0, beta=1.0, max_samples=60)
    schedule = afl.make_schedule("concurrent", 4, 3, afl.DelayModel(), seed=0, concurrency=2, buffer_size=1,
                                 refill="immediate")
    return afl, ds, schedule


@pytest.mark.parametrize("classes,kwargs,message", [
    (7, {}, r"task.model \(logreg\) outputs shape \(1, 7\) for one example, but the task has 10 classes"),
    (10, {"hparams": {"client_lr": -0.1}}, r"hparams\['client_lr'\] must be >= 0"),
    (10, {"hparams": {"server_lr": [1.0, float("nan")]}}, r"hparams\['server_lr'\] must be finite"),
    (10, {"seeds": [0.5]}, r"seeds must be integers in \[0, 4294967295\], got 0.5"),
    (10, {"seeds": [1, 1]}, r"seeds must not repeat a seed"),
    (10, {"seeds": [-1]}, r"seeds must be integers in \[0, 4294967295\], got -1"),
])
def test_simulate_names_the_argument_at_fault(tiny_api, classes, kwargs, message):
    afl, ds, schedule = tiny_api
    task = afl.make_task(ds, ds.natural_partition, afl.make_model("logreg", ds.input_shape, classes))
    with pytest.raises(ValueError, match=message):
        afl.simulate(task, afl.fedbuff(), schedule, afl.LocalConfig(steps=1, batch_size=None), eval_every=3,
                     progress=False, **kwargs)
