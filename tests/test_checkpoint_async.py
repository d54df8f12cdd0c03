"""Checkpoints by wall-clock interval, written in the background.

When a save is due (an injected clock, no sleeps); that a background write becomes the checkpoint only once it has
finished (and a failed one leaves the previous checkpoint); that a run which dies while a state is written in the
background, as the next chunk runs on the same buffers, resumes to the uninterrupted History bit for bit; and that a
process killed at random moments of asynchronous saves leaves a whole checkpoint.
"""

from __future__ import annotations

import logging
import os
import random
import signal
import subprocess
import sys
import threading
import time

import pytest

from asyncfl_jax import LocalConfig, ca2fl, cli, engine, make_model, make_schedule, make_task, simulate
from asyncfl_jax import checkpoint as ckpt
from asyncfl_jax.data import synthetic_leaf
from asyncfl_jax.engine.callbacks import Checkpoints
from asyncfl_jax.timing import DelayModel

from test_checkpoint import (REPO, SMALL, _main_error, _wait_for_checkpoint, assert_same_history, assert_same_state,
                             carry_shape_of, record, small_state)

N = 8
LOCAL = LocalConfig(steps=2, batch_size=8)
# ca2fl with an int8 n x d cache, two replicas; 40 steps in 8 chunks of 5.
RUN = dict(seeds=[0, 1], hparams={"client_lr": [0.05, 0.1]}, eval_every=5, progress=False)


@pytest.fixture(scope="module")
def task():
    data = synthetic_leaf(num_clients=N, seed=2, max_samples=80)
    return make_task(data, data.natural_partition, make_model("logreg", data.input_shape, data.num_classes))


@pytest.fixture(scope="module")
def schedule():
    return make_schedule("concurrent", N, 40, DelayModel(), seed=0, concurrency=4, buffer_size=2)


@pytest.fixture(scope="module")
def reference(task, schedule):
    return simulate(task, ca2fl(cache="int8"), schedule, LOCAL, **RUN)


def test_the_cadence_options():
    assert ckpt.cadence() == ckpt.Cadence(interval=ckpt.DEFAULT_INTERVAL) == ckpt.Cadence(interval=60.0)
    assert ckpt.cadence(every=3) == ckpt.Cadence(every=3)
    assert ckpt.cadence(interval=2.5) == ckpt.Cadence(interval=2.5)
    every, interval = ckpt.Cadence(every=3), ckpt.Cadence(interval=60.0)
    assert [every.due(k, 1e9) for k in (1, 2, 3, 4, 6)] == [False, False, True, False, True]
    assert [interval.due(1, s) for s in (0.0, 59.9, 60.0, 61.0)] == [False, False, True, True]
    with pytest.raises(ValueError, match="cannot both be given"):
        ckpt.cadence(every=2, interval=30)
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="checkpoint_every"):
            ckpt.cadence(every=bad)
    for bad in (0, -2.0, float("nan"), float("inf"), True, "60"):
        with pytest.raises(ValueError, match="checkpoint_interval"):
            ckpt.cadence(interval=bad)


def test_options_that_would_be_ignored_are_refused(task, schedule, tmp_path, capsys):
    with pytest.raises(ValueError, match="cannot both be given"):
        simulate(task, ca2fl(), schedule, LOCAL, checkpoint_dir=str(tmp_path), checkpoint_every=1,
                 checkpoint_interval=5, **RUN)
    with pytest.raises(ValueError, match="needs a checkpoint_dir"):
        simulate(task, ca2fl(), schedule, LOCAL, checkpoint_interval=5, **RUN)
    code, cap = _main_error(capsys, "run", "--out", str(tmp_path / "a"), "--checkpoint-every", "2",
                            "--checkpoint-interval", "5", *SMALL)
    assert code == 2 and "cannot both be given" in cap.err and "--checkpoint-interval" in cap.err
    code, cap = _main_error(capsys, "run", "--out", str(tmp_path / "b"), "--no-checkpoint",
                            "--checkpoint-interval", "5", *SMALL)
    assert code == 2 and "--checkpoint-interval cannot be combined with --no-checkpoint" in cap.err
    code, cap = _main_error(capsys, "run", "--out", str(tmp_path / "c"), "--checkpoint-interval", "0", *SMALL)
    assert code == 2 and "--checkpoint-interval = 0.0" in cap.err
    assert not any((tmp_path / name).exists() for name in "abc")


class FakeClock:
    """A clock that a callback advances by ``step`` seconds after each chunk."""

    def __init__(self, step):
        self.now, self.step = 0.0, step

    def __call__(self):
        return self.now

    def on_chunk(self, loop, update):
        del loop, update
        self.now += self.step


def test_saves_by_wall_clock_interval_with_an_injected_clock(task, schedule, reference, tmp_path, monkeypatch,
                                                             caplog):
    started = []
    start_save = ckpt.start_save

    def recording(directory, identity, state, num_chunks, asynchronous=True):
        started.append((state.next_chunk, asynchronous))
        return start_save(directory, identity, state, num_chunks, asynchronous=asynchronous)

    monkeypatch.setattr(ckpt, "start_save", recording)
    run = engine.prepare_run(task, ca2fl(cache="int8"), schedule, LOCAL, RUN["seeds"], RUN["hparams"],
                             RUN["eval_every"])
    clock = FakeClock(25.0)  # 25 s per chunk, a save every 60 s: after chunks 3 (75 s) and 6 (150 s), and the end
    saver = Checkpoints(str(tmp_path), run, interval=60, now=clock)
    with caplog.at_level(logging.INFO, logger="asyncfl_jax"):
        state = engine.HostLoop(run, [clock, engine.ProgressBar(True), saver]).run()
    assert started == [(3, True), (6, True), (8, True)]
    lines = [r.getMessage() for r in caplog.records if ": step " in r.getMessage()]
    assert len(lines) == 8 and all(("saving=" in line) == (i >= 3) for i, line in enumerate(lines))
    assert record(str(tmp_path))["next_chunk"] == 8 and record(str(tmp_path))["complete"]
    history = engine.make_history(run, state)
    assert_same_history(reference, history)
    assert 0 < history.checkpoint_seconds <= history.run_seconds
    assert history.summary()["checkpoint_seconds"] == round(history.checkpoint_seconds, 3)
    assert f"run {history.run_seconds:.1f}s (checkpoints {history.checkpoint_seconds:.1f}s)" in cli.result_lines(
        history)[0]


class FailAt:
    """A callback that raises at chunk ``k`` (a crash of the process's Python side, after the chunk ran)."""

    def __init__(self, k):
        self.k, self.calls = k, 0

    def on_chunk(self, loop, update):
        self.calls += 1
        if self.calls == self.k:
            raise RuntimeError("the run dies here")


def test_a_state_written_while_the_next_chunk_runs_resumes_bit_for_bit(task, schedule, reference, tmp_path):
    folder = str(tmp_path)
    # saves after chunks 2 and 4 start in the background and chunks 3 and 5 run meanwhile (the carry's buffers are
    # donated to them); the run dies after chunk 5, before its save
    with pytest.raises(RuntimeError, match="dies here"):
        simulate(task, ca2fl(cache="int8"), schedule, LOCAL, checkpoint_dir=folder, checkpoint_every=2,
                 callbacks=[FailAt(5)], **RUN)
    assert (record(folder)["next_chunk"], record(folder)["complete"]) == (4, False)
    assert sorted(os.listdir(folder)) == ["checkpoint.json", "state-000004"]
    resumed = simulate(task, ca2fl(cache="int8"), schedule, LOCAL, checkpoint_dir=folder, resume=True, **RUN)
    assert_same_history(reference, resumed)


def test_a_background_write_becomes_the_checkpoint_only_once_finished(tmp_path, monkeypatch):
    folder = str(tmp_path)
    ckpt.save(folder, {}, small_state(1), 1000)
    release = threading.Event()
    finish_state = ckpt._finish_state

    def held(path, checkpointer):
        assert release.wait(60)
        finish_state(path, checkpointer)

    monkeypatch.setattr(ckpt, "_finish_state", held)
    pending = ckpt.start_save(folder, {}, small_state(2), 1000)
    time.sleep(0.05)
    assert not pending.done()
    assert record(folder)["state_dir"] == "state-000001"  # the record still names the finished state
    release.set()
    assert pending.wait() == os.path.join(folder, "checkpoint.json")
    assert record(folder)["state_dir"] == "state-000002"
    assert_same_state(ckpt.load(folder, {}, carry_shape_of(small_state(2))), small_state(2))
    assert sorted(os.listdir(folder)) == ["checkpoint.json", "state-000002"]


def test_a_failed_background_write_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    folder = str(tmp_path)
    ckpt.save(folder, {}, small_state(1), 1000)
    make = ckpt._async_checkpointer

    class FullDisk:
        def __init__(self):
            self.inner = make()

        def save(self, *args, **kwargs):
            return self.inner.save(*args, **kwargs)

        def wait_until_finished(self):
            self.inner.wait_until_finished()
            raise OSError(28, "No space left on device")

        def close(self):
            self.inner.close()

    monkeypatch.setattr(ckpt, "_async_checkpointer", FullDisk)
    pending = ckpt.start_save(folder, {}, small_state(2), 1000)
    with pytest.raises(ckpt.CheckpointError, match="could not be written .*No space left.* previous checkpoint"):
        pending.wait()
    assert record(folder)["state_dir"] == "state-000001"
    assert sorted(os.listdir(folder)) == ["checkpoint.json", "state-000001"]
    assert_same_state(ckpt.load(folder, {}, carry_shape_of(small_state(1))), small_state(1))


# A process that saves small_state(1), small_state(2)... asynchronously (each save waited for just before the next
# starts, as the Checkpoints callback does), killed by the test.
ASYNC_SAVER = """
import sys
sys.path.insert(0, {tests!r})
from test_checkpoint import small_state
from asyncfl_jax import checkpoint as ckpt

folder, pending = sys.argv[1], None
for k in range(1, 10_000):
    state = small_state(k)
    if pending is not None:
        pending.wait()
    pending = ckpt.start_save(folder, {{}}, state, 10_000)
"""


def test_a_process_killed_during_asynchronous_saves_leaves_a_whole_checkpoint(tmp_path):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([REPO, os.environ.get("PYTHONPATH", "")]),
               JAX_PLATFORMS="cpu")
    script = ASYNC_SAVER.format(tests=os.path.join(REPO, "tests"))
    rng = random.Random(1)
    for trial in range(2):
        folder = tmp_path / f"trial{trial}"
        proc = subprocess.Popen([sys.executable, "-c", script, str(folder)], env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        _wait_for_checkpoint(proc, str(folder), min_chunk=2 + trial)
        time.sleep(rng.uniform(0.0, 0.2))
        os.kill(proc.pid, signal.SIGKILL)
        proc.communicate(timeout=30)
        saved = record(str(folder))
        loaded = ckpt.load(str(folder), {}, carry_shape_of(small_state(1)))
        assert_same_state(loaded, small_state(saved["next_chunk"]))
        assert sorted(os.listdir(folder)) == ["checkpoint.json", saved["state_dir"]]
