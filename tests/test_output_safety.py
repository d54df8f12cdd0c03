"""Own files only: the output folder's lock, its manifest, --overwrite, hostile labels, failed starts, edited
config.json with --resume, and an injected OSError during each write (tiny runs: 6 clients, 12 steps, logreg)."""

from __future__ import annotations

import errno
import json
import os
import socket
import subprocess
import sys
import time

import pytest

from asyncfl_jax import cli, experiment, outputs
from asyncfl_jax.config import ConfigError

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = ["--algorithm", "fedbuff", "--set", "data.num_clients=6", "--set", "runs.protocol.concurrency=3",
        "--set", "runs.protocol.buffer_size=1", "--steps", "12", "--set", "local.steps=1", "--model", "logreg",
        "--set", "eval_every=4", "--no-progress", "--no-plot"]  # one run of 12 steps in 3 chunks


def snapshot(root):
    """Every path under ``root`` (links as links) with its bytes or link target: what "untouched" compares."""
    found = {}
    for folder, dirs, files in os.walk(root):
        for name in dirs + files:
            path = os.path.join(folder, name)
            rel = os.path.relpath(path, root)
            if os.path.islink(path):
                found[rel] = ("link", os.readlink(path))
            elif os.path.isfile(path):
                with open(path, "rb") as f:
                    found[rel] = f.read()
            else:
                found[rel] = "folder"
    return found


def without_timings(out):
    summary = json.loads((out / "summary.json").read_text())
    for run in summary["runs"]:
        run.pop("compile_seconds"), run.pop("run_seconds"), run.pop("checkpoint_seconds")
    summary["config"].pop("output")
    return (out / "metrics.csv").read_text(), summary


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A finished run of TINY (its folder is copied, never changed)."""
    out = tmp_path_factory.mktemp("finished") / "out"
    assert cli.main(["run", "--out", str(out), *TINY]) == 0
    return out


def copy_of(folder, tmp_path, name="copy"):
    import shutil

    target = tmp_path / name
    shutil.copytree(folder, target, symlinks=True)
    return target


# ---------------------------------------------------------------------------------------------------- lock
def test_a_lock_of_a_live_pid_is_refused_and_a_stale_one_taken_over(tmp_path, capsys, caplog):
    out = tmp_path / "out"
    out.mkdir()
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        lock = {"pid": sleeper.pid, "host": socket.gethostname(), "started": "earlier"}
        (out / outputs.LOCK_NAME).write_text(json.dumps(lock))
        before = snapshot(out)
        assert cli.main(["run", "--out", str(out), *TINY]) == 2
        err = capsys.readouterr().err
        assert f"in use by another asyncfl run (pid {sleeper.pid} on host" in err and outputs.LOCK_NAME in err
        assert snapshot(out) == before
        with pytest.raises(outputs.OutputLockedError, match=f"pid {sleeper.pid}"):
            outputs.OutputLock(str(out)).acquire()
    finally:
        sleeper.kill()
        sleeper.wait()
    caplog.set_level("INFO", logger="asyncfl_jax")
    with outputs.OutputLock(str(out)) as held:  # the pid is gone: a stale lock, taken over
        assert json.loads((out / outputs.LOCK_NAME).read_text())["pid"] == os.getpid()
        assert held.fd is not None
    assert f"taking over a stale lock (pid {sleeper.pid}" in caplog.text
    assert os.listdir(out) == []  # released: the lock file is gone


def test_a_lock_of_another_host_is_refused_and_a_created_folder_is_removed_again(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / outputs.LOCK_NAME).write_text(json.dumps({"pid": 1, "host": "elsewhere-" + socket.gethostname()}))
    with pytest.raises(outputs.OutputLockedError, match="pid 1 on host elsewhere-"):
        outputs.OutputLock(str(out)).acquire()
    deep = tmp_path / "a" / "b" / "c"
    with outputs.OutputLock(str(deep)):
        assert os.listdir(deep) == [outputs.LOCK_NAME]
    assert not (tmp_path / "a").exists()  # the folders the lock created are removed when left empty


# A run whose progress bar waits after each chunk until the file $RELEASE exists, so that a second process starts
# while the first one holds the lock, however slowly the machine starts processes.
SLOW_CLI = """
import os, sys, time
from asyncfl_jax import cli, engine

make_bar = engine.callbacks.progress_bar

def wait(n):
    while not os.path.exists(os.environ["RELEASE"]):
        time.sleep(0.01)

def slow_bar(*args, **kwargs):
    bar = make_bar(*args, **kwargs)
    update = bar.update
    bar.update = lambda n: (wait(n), update(n))[1]
    return bar

engine.callbacks.progress_bar = slow_bar
sys.exit(cli.main(sys.argv[1:]))
"""


def _cli(*argv, slow=False, release=""):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([REPO, os.environ.get("PYTHONPATH", "")]), JAX_PLATFORMS="cpu",
               RELEASE=str(release))
    command = ["-c", SLOW_CLI] if slow else ["-m", "asyncfl_jax.cli"]
    return subprocess.Popen([sys.executable, *command, "run", *argv], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def test_two_processes_on_one_folder_one_is_refused_and_the_other_finishes_intact(finished, tmp_path):
    out = tmp_path / "shared"
    release = tmp_path / "release"
    first = _cli("--out", str(out), *TINY, slow=True, release=release)
    deadline = time.monotonic() + 120
    while not (out / "schedules" / "fedbuff-seed0.npz").exists():  # started writing: the lock is held
        if first.poll() is not None or time.monotonic() > deadline:
            first.kill()
            raise AssertionError(first.communicate()[1][-2000:])
        time.sleep(0.01)
    second = _cli("--out", str(out), *TINY)
    _, err2 = second.communicate(timeout=120)
    release.write_text("")
    _, err1 = first.communicate(timeout=120)
    assert first.returncode == 0, err1[-3000:]
    assert second.returncode == 2 and f"in use by another asyncfl run (pid {first.pid}" in err2, err2[-3000:]
    assert "Traceback" not in err2
    assert without_timings(out) == without_timings(finished)
    assert not (out / outputs.LOCK_NAME).exists()


# ---------------------------------------------------------------------------------------------------- overwrite
def test_overwrite_deletes_only_listed_files_and_never_follows_a_link(finished, tmp_path, capsys):
    out = copy_of(finished, tmp_path)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "fedbuff-seed0.npz").write_bytes(b"not yours to delete")  # a listed name, behind a link
    (outside / "keep.txt").write_text("mine")
    (out / "notes.txt").write_text("mine")
    (out / "elsewhere").symlink_to(outside, target_is_directory=True)  # a link of the user's: unlisted
    import shutil

    shutil.rmtree(out / "schedules")
    (out / "schedules").symlink_to(outside, target_is_directory=True)  # a listed folder replaced by a link
    outside_before = snapshot(outside)
    assert cli.main(["run", "--out", str(out), "--overwrite", *TINY]) == 0
    capsys.readouterr()
    assert snapshot(outside) == outside_before
    assert (out / "notes.txt").read_text() == "mine" and os.readlink(out / "elsewhere") == str(outside)
    assert not os.path.islink(out / "schedules") and (out / "schedules" / "fedbuff-seed0.npz").is_file()
    assert without_timings(out) == without_timings(finished)
    listed = json.loads((out / outputs.MANIFEST_NAME).read_text())["entries"]
    assert "notes.txt" not in listed and "elsewhere" not in listed
    assert {"config.json", "metrics.csv", "schedules/fedbuff-seed0.npz", "checkpoints/fedbuff"} <= set(listed)


@pytest.mark.parametrize("mine", ["config.json", "metrics.csv", "schedules/fedbuff-seed0.npz"])
def test_overwrite_never_replaces_a_file_no_manifest_lists(finished, tmp_path, capsys, mine):
    out = tmp_path / "user"
    (out / os.path.dirname(mine)).mkdir(parents=True, exist_ok=True)
    (out / mine).write_text("my own file")
    (out / "notes.txt").write_text("mine")
    before = snapshot(out)
    assert cli.main(["run", "--out", str(out), "--overwrite", *TINY]) == 2
    err = capsys.readouterr().err
    assert mine in err and "listed in no manifest" in err and "nothing was deleted" in err
    assert snapshot(out) == before
    # an older asyncfl folder (results but no manifest) is refused the same way: nothing deleted
    legacy = copy_of(finished, tmp_path, "legacy")
    os.remove(legacy / outputs.MANIFEST_NAME)
    before = snapshot(legacy)
    assert cli.main(["run", "--out", str(legacy), "--overwrite", *TINY]) == 2
    assert "config.json" in capsys.readouterr().err and snapshot(legacy) == before


def test_an_edited_manifest_that_leaves_the_folder_deletes_nothing(finished, tmp_path, capsys):
    out = copy_of(finished, tmp_path)
    victim = tmp_path / "victim.txt"
    victim.write_text("mine")
    manifest = json.loads((out / outputs.MANIFEST_NAME).read_text())
    manifest["entries"]["../victim.txt"] = "file"
    (out / outputs.MANIFEST_NAME).write_text(json.dumps(manifest))
    before = snapshot(out)
    assert cli.main(["run", "--out", str(out), "--overwrite", *TINY]) == 2
    assert "'../victim.txt', which is not a path inside" in capsys.readouterr().err
    assert victim.read_text() == "mine" and snapshot(out) == before


# ---------------------------------------------------------------------------------------------------- paths
@pytest.mark.parametrize("label", ["../../x", "/tmp/abs", "a/b", "a\\b", "a\0b", "..", ".hidden", "x" * 101])
def test_a_hostile_label_is_refused_before_anything_is_written(tmp_path, capsys, label):
    out = tmp_path / "out"
    code = cli.main(["run", "--out", str(out), *TINY, "--set", f"runs.label={json.dumps(label)}"])
    assert code == 2
    err = capsys.readouterr().err
    assert "runs[0].label" in err or "label" in err
    assert os.listdir(tmp_path) == []
    cfg = cli.config_from_argv(["--out", str(out), *TINY])
    cfg.runs[0].label = label
    with pytest.raises(ConfigError):
        experiment.run_config(cfg, progress=False, plot=False)
    assert os.listdir(tmp_path) == []


def test_labels_differing_only_in_case_and_a_nul_in_out_are_refused():
    with pytest.raises(ConfigError, match="only in case"):
        outputs.check_labels(["Fed", "fed"])
    with pytest.raises(ConfigError, match="NUL"):
        outputs.check_output_name("runs/a\0b")
    with pytest.raises(ConfigError, match="does not stay inside"):
        outputs.path_inside("/x", "a/../../b")


def test_writing_through_a_symbolic_link_below_out_is_refused(tmp_path):
    (tmp_path / "out").mkdir()
    (tmp_path / "target").mkdir()
    (tmp_path / "out" / "schedules").symlink_to(tmp_path / "target", target_is_directory=True)
    with pytest.raises(ConfigError, match="is a symbolic link"):
        outputs.path_inside(str(tmp_path / "out"), "schedules/a.npz")


# ---------------------------------------------------------------------------------------------------- failed starts
def test_a_data_error_at_load_time_leaves_the_folder_as_it_was(finished, tmp_path, capsys, monkeypatch):
    def bad_data(cfg):
        raise ConfigError("invalid data: the files are truncated")

    monkeypatch.setattr(experiment, "load_dataset", bad_data)
    new = tmp_path / "new"
    assert cli.main(["run", "--out", str(new), *TINY]) == 2
    assert "the files are truncated" in capsys.readouterr().err
    assert not new.exists()
    empty = tmp_path / "empty"
    empty.mkdir()
    assert cli.main(["run", "--out", str(empty), *TINY]) == 2 and os.listdir(empty) == []
    old = copy_of(finished, tmp_path)
    before = snapshot(old)
    assert cli.main(["run", "--out", str(old), "--overwrite", *TINY]) == 2  # nothing deleted before the data load
    assert snapshot(old) == before


def test_a_folder_killed_during_its_first_write_is_a_new_folder(tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    outputs.Manifest(str(out), {"config.json": "file"}).write()  # listed first, then the kill during the write:
    (out / ".tmp-abcd1234config.json").write_text('{"half": ')
    (out / outputs.LOCK_NAME).write_text(json.dumps({"pid": 2 ** 22 + 12345, "host": socket.gethostname()}))
    (out / "notes.txt").write_text("mine")
    assert experiment.output_status(cli.config_from_argv(["--out", str(out), *TINY])).kind == "foreign"
    os.remove(out / "notes.txt")
    assert experiment.output_status(cli.config_from_argv(["--out", str(out), *TINY])).kind == "new"
    assert cli.main(["run", "--out", str(out), *TINY]) == 0
    capsys.readouterr()
    assert not any(name.startswith(".tmp-") for name in os.listdir(out))
    assert not (out / outputs.LOCK_NAME).exists() and (out / "summary.json").exists()


# ---------------------------------------------------------------------------------------------------- resume
@pytest.mark.parametrize("how", ["resume", "same command"])
def test_resume_after_config_json_was_edited_changes_nothing(finished, tmp_path, capsys, how):
    out = copy_of(finished, tmp_path)
    config = json.loads((out / "config.json").read_text())
    config["local"]["lr"] *= 2
    (out / "config.json").write_text(json.dumps(config, indent=2))
    if how == "same command":  # an unfinished run whose History was computed with another lr
        os.remove(out / "summary.json")
        os.remove(out / outputs.MANIFEST_NAME)  # an older folder: the saved History still records the config
    before = snapshot(out)
    argv = (["--resume", str(out), "--no-progress", "--no-plot"] if how == "resume"
            else ["--out", str(out), *TINY, "--set", f"local.lr={config['local']['lr']}"])
    assert cli.main(["run", *argv]) == 2
    err = capsys.readouterr().err
    assert "was config.json edited?" in err and "local.lr" in err and "Nothing was changed" in err
    assert snapshot(out) == before


# ---------------------------------------------------------------------------------------------------- write faults
FAULTS = ["manifest.json", "config.json", "environment.json", "checkpoint.json", "history.npz", "history.json",
          "metrics.csv", "summary.json"]


@pytest.mark.parametrize("target", FAULTS)
def test_an_oserror_during_each_write_leaves_a_folder_that_continues_to_the_same_results(
        finished, tmp_path, monkeypatch, target):
    """The first atomic write of ``target`` leaves a half-written temporary file (as a kill would) and fails with
    ENOSPC; the same call again (continuing when the folder holds an unfinished run) gives the results of an
    uninterrupted run, and no temporary file is left."""
    real = outputs.atomic.atomic_file  # every file of the package is written through it
    hits = []

    def failing(path):
        if os.path.basename(path) == target and not hits:
            hits.append(path)
            with open(os.path.join(os.path.dirname(path), f".tmp-zz{len(hits):06d}{target}"), "w") as f:
                f.write("half")
            raise OSError(errno.ENOSPC, "No space left on device (injected)")
        return real(path)

    out = tmp_path / "out"
    cfg = cli.config_from_argv(["--out", str(out), *TINY])
    monkeypatch.setattr(outputs.atomic, "atomic_file", failing)
    with pytest.raises(OSError, match="injected"):  # a checkpoint after every chunk: every file is written
        experiment.run_config(cfg, progress=False, plot=False, checkpoint_every=1)
    monkeypatch.undo()
    assert hits, f"no write of {target}"
    assert not (out / outputs.LOCK_NAME).exists()
    resume = experiment.output_status(experiment.resolve(cfg)).kind == "unfinished"
    # a failed start (nothing saved yet: no checkpoint, no finished run) is new again
    assert resume == (target not in ("manifest.json", "config.json", "environment.json", "checkpoint.json"))
    experiment.run_config(cfg, progress=False, plot=False, resume=resume, checkpoint_every=1)
    assert without_timings(out) == without_timings(finished)
    left = [os.path.join(d, n) for d, _, files in os.walk(out) for n in files if n.startswith(".tmp-")]
    assert left == []


def test_the_lock_is_released_when_a_run_is_interrupted(tmp_path, monkeypatch):
    out = tmp_path / "out"
    cfg = cli.config_from_argv(["--out", str(out), *TINY])

    def interrupt(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(experiment, "run_experiment", interrupt)
    with pytest.raises(KeyboardInterrupt):
        experiment.run_config(cfg, progress=False, plot=False)
    # interrupted before anything was saved (no checkpoint, no finished run): the folder holds no run again
    assert not (out / outputs.LOCK_NAME).exists() and not out.exists()


def test_the_output_decision_is_taken_once_and_a_folder_changed_since_is_refused(tmp_path, monkeypatch, capsys):
    """``asyncfl run`` decides what writing to the folder does before anything is loaded; under the lock the decision
    is only confirmed: a file that appeared in between (another program) stops the run before anything is written."""
    out = tmp_path / "out"
    real = cli._check_output

    def then_someone_writes(cfg, overwrite, resume):
        decision = real(cfg, overwrite, resume)
        assert decision.kind == "new"
        out.mkdir()
        (out / "notes.txt").write_text("mine")
        return decision

    monkeypatch.setattr(cli, "_check_output", then_someone_writes)
    assert cli.main(["run", "--out", str(out), *TINY]) == 2
    assert "changed after asyncfl checked it" in capsys.readouterr().err
    assert snapshot(out) == {"notes.txt": b"mine"}  # nothing written, the lock released
    monkeypatch.undo()

    cfg = experiment.prepare_experiment(cli.config_from_argv(["--out", str(out), *TINY]))
    with pytest.raises(ConfigError, match="holds no asyncfl results"):  # the same rules as before
        outputs.output_decision(cfg)
    decision = outputs.output_decision(cfg, overwrite=True)
    assert decision.kind == "overwrite" and decision.confirm(cfg) == "overwrite"
    (out / "notes.txt").write_text("mine, edited")  # a file of someone else counts by its name (a log: > DIR/log)
    assert decision.confirm(cfg) == "overwrite"
    (out / "config.json").write_text("{}")  # what the decision read
    with pytest.raises(ConfigError, match="changed after asyncfl checked it"):
        decision.confirm(cfg)
    (out / "config.json").unlink()
    other = experiment.prepare_experiment(cli.config_from_argv(["--out", str(out), *TINY, "--seeds", "0,1"]))
    with pytest.raises(ValueError, match="another configuration: seeds"):
        outputs.output_decision(cfg, overwrite=True).confirm(other)
    with pytest.raises(ValueError, match="without resume or overwrite"):
        experiment.run_config(cfg, progress=False, overwrite=True, output_decision=decision)
