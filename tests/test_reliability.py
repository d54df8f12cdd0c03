"""Faults a hostile user finds: failed starts followed by the corrected command on the same folder, refusals that
must end with exit code 2 (not "internal error"), and the memory check of the initialization (tiny runs: 6 clients,
12 uploads, logreg)."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from asyncfl_jax import cli
from asyncfl_jax.engine import loop
from asyncfl_jax.engine.budget import MemoryRefusal
from asyncfl_jax.errors import InputError
from asyncfl_jax.timing.schedule import Schedule, ScheduleFileError

TINY = ["--no-progress", "--no-plot", "--model", "logreg", "--algorithm", "fedbuff", "--set", "data.num_clients=6",
        "--set", "data.synthetic_max_samples=60", "--set", "runs.protocol.concurrency=4",
        "--set", "runs.protocol.buffer_size=1", "--arrivals", "12", "--set", "local.steps=1",
        "--set", "eval_points=2"]


def _run(capsys, *argv):
    code = cli.main(["run", *TINY, *argv])
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    return code, err


class XlaRuntimeError(RuntimeError):
    """Stands for jaxlib's error type (the boundary knows it by its name and message)."""


def _trajectory_refused(monkeypatch):
    monkeypatch.setattr(loop, "MAX_TRAJECTORY_BYTES", 100)  # the refusal comes after the data and schedules
    return ["--trajectory"], "the trajectory would take"


def _out_of_memory_at_dispatch(monkeypatch):
    def dispatch(self):
        raise XlaRuntimeError("INTERNAL: Failed to allocate 93096321024 bytes for the chunk's buffers")

    monkeypatch.setattr(loop.HostLoop, "run_chunk", dispatch)
    return [], "ran out of memory"


@pytest.mark.parametrize("failure", [_trajectory_refused, _out_of_memory_at_dispatch])
def test_a_failed_start_leaves_a_folder_the_corrected_command_uses(capsys, tmp_path, monkeypatch, failure):
    out = tmp_path / "out"
    (tmp_path / "mine.txt").write_text("a file beside the folder")
    extra, message = failure(monkeypatch)
    code, err = _run(capsys, "--out", str(out), *extra)
    assert code == 2 and message in err, err
    assert not out.exists(), sorted(os.listdir(out))  # the folder the run created is gone again
    monkeypatch.undo()
    code, err = _run(capsys, "--out", str(out))  # the corrected command, on the same folder
    assert code == 0, err
    assert (out / "metrics.csv").is_file() and (tmp_path / "mine.txt").read_text() == "a file beside the folder"


def test_a_failed_start_in_an_existing_empty_folder_leaves_it_empty(capsys, tmp_path, monkeypatch):
    out = tmp_path / "out"
    out.mkdir()
    extra, message = _trajectory_refused(monkeypatch)
    code, err = _run(capsys, "--out", str(out), *extra)
    assert code == 2 and message in err and os.listdir(out) == [], err


@pytest.mark.parametrize("field", ["num_slots", "num_clients"])
def test_a_schedule_file_with_an_absurd_size_is_refused_as_input(tmp_path, field):
    from asyncfl_jax.timing.delays import DelayModel
    from asyncfl_jax.timing.protocols import make_schedule

    path = tmp_path / "s.npz"
    make_schedule("concurrent", 4, 3, DelayModel(), seed=0, concurrency=2, buffer_size=1).save(path)
    arrays = dict(np.load(path, allow_pickle=False))
    meta = json.loads(str(arrays.pop("meta")))
    meta[field] = 10**12
    np.savez(path, meta=np.array(json.dumps(meta)), **arrays)
    with pytest.raises(ScheduleFileError, match=f"{field} = 1000000000000 is out of range") as caught:
        Schedule.load(path)
    assert isinstance(caught.value, InputError)


@pytest.mark.parametrize("text", ["INTERNAL: Failed to allocate 86.7GB", "RESOURCE_EXHAUSTED: Out of memory",
                                  "INTERNAL: out of memory while trying to allocate 99 bytes"])
def test_an_xla_allocation_failure_is_a_refusal_not_a_bug(text):
    message, code = cli._describe(XlaRuntimeError(text), "out")
    assert code == 2 and "ran out of memory" in message, message


def test_the_initialization_is_checked_with_xla_memory_analysis_before_it_runs(monkeypatch):
    """Some algorithms train every client at initialization (ACE, AREA): its activations are counted before it
    runs, as the chunk's are."""
    import asyncfl_jax as afl

    checked = []

    def check(compiled, label, available=None, fraction=0.9, what="server-step chunk"):
        checked.append(what)
        if what == "initialization":
            raise MemoryRefusal(f"{label}: the compiled initialization needs 86.7 GiB")

    monkeypatch.setattr(loop, "check_compiled", check)
    ds = afl.data.synthetic_leaf(num_clients=4, alpha=1.0, beta=1.0, max_samples=60)
    task = afl.make_task(ds, ds.natural_partition, afl.make_model("logreg", ds.input_shape, ds.num_classes))
    schedule = afl.make_schedule("concurrent", 4, 3, afl.DelayModel(), seed=0, concurrency=2, buffer_size=1)
    with pytest.raises(MemoryRefusal, match="initialization needs"):
        afl.simulate(task, afl.fedbuff(), schedule, afl.LocalConfig(steps=1), eval_every=3, progress=False)
    assert checked == ["initialization"]


# ---------------------------------------------------------------------------------------------------- dropped input
@pytest.mark.parametrize("argv, message", [
    (["--steps", "1000000000000"], "--steps 1000000000000 and --arrivals 12 cannot be combined"),
    (["--hparam", "client_lr=0.1,,0.2"], "invalid option --hparam client_lr = '0.1,,0.2': values must be numbers "
                                         "separated by commas, without an empty item"),
    (["--hparam", "client_lr=0.1,"], "without an empty item"),
    (["--hparam", "client_lr=0.1", "--hparam", "client_lr=0.2"], "invalid option --hparam: 'client_lr' is given "
                                                                 "twice ('client_lr=0.1' and 'client_lr=0.2')"),
    (["--option", "staleness=hinge", "--option", "staleness=constant"], "invalid option --option: 'staleness' is "
                                                                         "given twice"),
    (["--hparam", "=0.1"], "invalid option --hparam = '=0.1': expected NAME=VALUE"),
    (["--seeds", "0,,1"], "invalid option --seeds = '0,,1': must be comma-separated integers, without an empty"),
    (["--tensorboard", ""], "invalid option --tensorboard = '': give a folder for the event files"),
    (["--config", "{tmp}/twice.json"], "the key 'num_clients' appears twice in one object"),
    (["--out", "{tmp}/dangling"], "is a symbolic link to 'nowhere/at/all', which does not exist (a dangling link)"),
])
def test_input_that_would_be_dropped_is_refused(capsys, tmp_path, argv, message):
    (tmp_path / "twice.json").write_text('{"data": {"num_clients": 6, "num_clients": 600}}')
    os.symlink("nowhere/at/all", tmp_path / "dangling")
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    out = [] if "--out" in argv else ["--out", str(tmp_path / "out")]
    code, err = _run(capsys, *out, *argv)
    assert code == 2 and message in err, err
    assert not (tmp_path / "out").exists() and sorted(os.listdir(tmp_path)) == ["dangling", "twice.json"]


# ---------------------------------------------------------------------------------------------------- other versions
@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A finished run of TINY (copied, never changed)."""
    out = tmp_path_factory.mktemp("finished") / "out"
    assert cli.main(["run", "--out", str(out), *TINY]) == 0
    return out


def _snapshot(root):
    return {os.path.relpath(os.path.join(d, n), root): open(os.path.join(d, n), "rb").read()
            for d, _, names in os.walk(root) for n in names}


def _as_format_1(folder):
    """What an interrupted run of the checkpoint format before orbax left: no manifest, a record of format 1 and a
    ``state-<chunk>.npz`` state, no History."""
    (folder / "manifest.json").unlink()
    run = folder / "checkpoints" / "fedbuff"
    for name in ("history.json", "history.npz"):
        (run / name).unlink()
    (run / "checkpoint.json").write_text(json.dumps({"format": 1, "next_chunk": 1, "state_file": "state-1.npz"}))
    np.savez(run / "state-1.npz", carry=np.zeros(3))


def _history_of_another_format(folder):
    path = folder / "checkpoints" / "fedbuff" / "history.json"
    record = json.loads(path.read_text())
    record["format"] = 0
    path.write_text(json.dumps(record))


@pytest.mark.parametrize("age, message", [(_as_format_1, "checkpoint of format 2 (a .npz checkpoint of asyncfl_jax "
                                                         "before orbax"),
                                          (_history_of_another_format, "cannot be read by this version")])
def test_resume_of_a_folder_of_another_version_is_refused_leaving_every_file(capsys, finished, tmp_path, age,
                                                                               message):
    import shutil

    out = tmp_path / "old"
    shutil.copytree(finished, out)
    age(out)
    before = _snapshot(out)
    code = cli.main(["run", "--resume", str(out), "--no-progress", "--no-plot"])
    err = capsys.readouterr().err
    assert code == 2 and f"cannot resume in {out}: it was written by another version" in err and message in err, err
    assert "Nothing was changed" in err and "Traceback" not in err
    assert _snapshot(out) == before


# ---------------------------------------------------------------------------------------------------- disk full
NO_SPACE = ("RESOURCE_EXHAUSTED: Error writing \"c0000/0.0\" in OCDBT database at local file \"{path}\": Failed to "
            "write 306201 bytes to file 21: No space left on device [os_error_code='28']")


@pytest.mark.parametrize("failing_save", [1, 2])
def test_a_full_disk_inside_orbax_is_one_message_with_what_to_do(capfd, tmp_path, monkeypatch, failing_save):
    """The fault is raised where tensorstore's would be, inside orbax's writing thread (which logs it with its
    traceback, and tensorstore's callbacks print more when the event loop is closed): one message, exit 2, and the
    hint to free space and resume (or, when nothing was saved yet, to run the command again)."""
    from orbax.checkpoint._src.serialization import serialization

    from asyncfl_jax import checkpoint

    if not hasattr(serialization, "estimate_write_memory_footprint"):
        pytest.skip("orbax's writing path changed: no place to inject the fault")
    saves, real_write, real_estimate = [], checkpoint._write_state, serialization.estimate_write_memory_footprint
    real_start = checkpoint._start_state

    def write_state(path, arrays):  # a synchronous save
        saves.append(path)
        return real_write(path, arrays)

    def start_state(path, arrays):  # an asynchronous one (the default): orbax's thread writes it
        saves.append(path)
        return real_start(path, arrays)

    def estimate(array):
        if len(saves) == failing_save:
            raise ValueError(NO_SPACE.format(path=saves[-1]))
        return real_estimate(array)

    monkeypatch.setattr(checkpoint, "_write_state", write_state)
    monkeypatch.setattr(checkpoint, "_start_state", start_state)
    monkeypatch.setattr(serialization, "estimate_write_memory_footprint", estimate)
    out = tmp_path / "out"
    code = cli.main(["run", *TINY, "--out", str(out), "--checkpoint-every", "1"])  # a save after every chunk
    err = capfd.readouterr().err
    assert code == 2 and "Traceback" not in err and "ERROR:absl" not in err, err
    assert len(err.strip().splitlines()) <= 4, err
    assert "asyncfl: error: no space left on the device: the checkpoint state" in err, err
    if failing_save == 1:
        left = sorted(str(p.relative_to(out)) for p in out.rglob("*")) if out.exists() else None
        assert err.rstrip().endswith("free some space, then run the command again") and not out.exists(), (err, left)
    else:
        assert f"free some space, then continue with: asyncfl run --resume {out}" in err, err
        monkeypatch.undo()
        assert cli.main(["run", "--resume", str(out), "--no-progress", "--no-plot"]) == 0


# ---------------------------------------------------------------------------------------------------- relative paths
def test_relative_input_paths_are_stored_absolute(tmp_path, monkeypatch):
    """config.json names the same files whatever folder `asyncfl run --resume` is started from."""
    monkeypatch.chdir(tmp_path)
    cfg = cli.config_from_argv(["--dataset", "fashion_mnist", "--data-dir", "fm",
                                "--set", 'runs.schedule_files=["s/a.npz"]'])
    assert cfg.data.path == str(tmp_path / "fm")
    assert all(run.schedule_files == [str(tmp_path / "s" / "a.npz")] for run in cfg.runs)
