"""Checkpoints that prove themselves: the record carries a checksum of its own content and is checked against its
state (chunk, step, evaluations, shapes); orphaned temporary files of a killed write are removed at the next start."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from asyncfl_jax import checkpoint as ckpt
from asyncfl_jax import engine
from asyncfl_jax.algorithms import get_algorithm
from asyncfl_jax.checkpoint import CheckpointError, SimulationInterrupted
from asyncfl_jax.client import LocalConfig
from asyncfl_jax.engine import simulate
from asyncfl_jax.timing.delays import DelayModel
from asyncfl_jax.timing.protocols import make_schedule

from support import toy_problem

EVERY, STEPS = 3, 12  # 4 chunks of 3 server steps
IDENTITY = {"eval_every": EVERY, "num_steps": STEPS}


def loop_state(chunk, replicas=2):
    """The loop state after ``chunk`` chunks of EVERY steps: evaluation steps 0, 3, ..., one metric row per
    evaluation, a per-step trace, a small carry whose values depend on ``chunk``."""
    steps = [min(k * EVERY, STEPS) for k in range(chunk + 1)]
    return ckpt.LoopState(
        next_chunk=chunk, eval_steps=steps,
        metrics={"test_accuracy": [np.full(replicas, k / 10, np.float32) for k in range(chunk + 1)]},
        reported=set(), stopped_early=False, compile_seconds=0.25, run_seconds=float(chunk),
        carry={"x": np.full((replicas, 4), chunk, np.float32), "n": np.arange(replicas, dtype=np.int32)},
        traces={"time": [np.full((replicas, EVERY), k, np.float64) for k in range(chunk)]})


def shape_of(state):
    import jax

    return jax.eval_shape(lambda: state.carry)


def read(folder):
    return json.loads((folder / "checkpoint.json").read_text())


def write(folder, record, reseal):
    if reseal:  # a forged record whose checksum was recomputed: the state itself must still disagree
        record[ckpt.CHECKSUM] = ckpt.record_checksum(record)
    (folder / "checkpoint.json").write_text(json.dumps(record))


def test_the_record_checksum_covers_its_whole_content():
    record = {"a": 1, "b": {"c": [1, 2]}}
    digest = ckpt.record_checksum(record)
    assert digest == ckpt.record_checksum({**record, ckpt.CHECKSUM: "anything"})  # its own field left out
    for changed in ({"a": 2, "b": {"c": [1, 2]}}, {"a": 1, "b": {"c": [1, 3]}}, {"a": 1, "b": {"c": [1, 2]}, "d": 0}):
        assert ckpt.record_checksum(changed) != digest


def test_a_saved_state_round_trips_with_its_checksum(tmp_path):
    state = loop_state(2)
    ckpt.save(str(tmp_path), IDENTITY, state, 4)
    record = read(tmp_path)
    assert record[ckpt.CHECKSUM] == ckpt.record_checksum(record)
    loaded = ckpt.load(str(tmp_path), IDENTITY, shape_of(state))
    assert (loaded.next_chunk, loaded.eval_steps) == (2, [0, 3, 6])
    np.testing.assert_array_equal(loaded.carry["x"], state.carry["x"])


@pytest.mark.parametrize("edit,reseal,expected", [
    (lambda r: r.update(next_chunk=r["next_chunk"] + 1), False, "was changed after it was written"),
    (lambda r: r.update(next_chunk=r["next_chunk"] + 1), True, "next_chunk 3 is not the chunk of its state folder"),
    (lambda r: r.update(next_chunk=r["next_chunk"] + 1, state_dir="state-000003"), True, "missing"),
    (lambda r: r.update(next_step=r["next_step"] + 3), True, "the record's next_step is 9"),
    (lambda r: r.update(run_seconds=0.0), False, "was changed after it was written"),
    (lambda r: r["arrays"].update(m000=[[4, 2], "float32"]), True, "array 'm000' is"),
    (lambda r: r.pop(ckpt.CHECKSUM), False, "has no record_sha256"),
])
def test_an_edited_record_is_refused(tmp_path, edit, reseal, expected):
    state = loop_state(2)
    ckpt.save(str(tmp_path), IDENTITY, state, 4)
    record = read(tmp_path)
    edit(record)
    write(tmp_path, record, reseal)
    with pytest.raises(CheckpointError, match=expected):
        ckpt.load(str(tmp_path), IDENTITY, shape_of(state))


def test_evaluation_steps_that_are_not_the_runs_chunks_are_refused(tmp_path):
    identity = {"eval_every": 4, "num_steps": STEPS}  # the run's chunks: 0, 4, 8; the state holds 0, 3, 6
    state = loop_state(2)
    ckpt.save(str(tmp_path), identity, state, 3)
    with pytest.raises(CheckpointError, match=r"are not those of chunks of 4 of 12 steps"):
        ckpt.load(str(tmp_path), identity, shape_of(state))


def test_a_state_swapped_under_its_record_is_refused(tmp_path):
    """The record of chunk 2 made to point to the (intact) state of chunk 1, its file hashes and checksum redone."""
    import shutil

    ckpt.save(str(tmp_path / "one"), IDENTITY, loop_state(1), 4)
    ckpt.save(str(tmp_path / "two"), IDENTITY, loop_state(2), 4)
    shutil.copytree(tmp_path / "one" / "state-000001", tmp_path / "two" / "state-000002-1")
    record = read(tmp_path / "two")
    record.update(state_dir="state-000002-1", state_files=read(tmp_path / "one")["state_files"])
    write(tmp_path / "two", record, reseal=True)
    with pytest.raises(CheckpointError, match="holds 2 evaluations, a state after chunk 2 holds 3"):
        ckpt.load(str(tmp_path / "two"), IDENTITY, shape_of(loop_state(2)))


# ---------------------------------------------------------------------------------------------------- in a run
class InterruptAt:
    """A progress bar that raises KeyboardInterrupt after chunk ``k`` (the checkpoint is saved, the run stops)."""

    def __init__(self, k):
        self.k, self.calls = k, 0

    def update(self, n):
        self.calls += 1
        if self.calls == self.k:
            raise KeyboardInterrupt

    def set_postfix(self, **kwargs):
        pass

    def close(self):
        pass


@pytest.fixture(scope="module")
def problem():
    task, _, _ = toy_problem(4)
    schedule = make_schedule("concurrent", 4, STEPS, DelayModel(), seed=0, concurrency=2, buffer_size=1,
                             refill="immediate")
    return task, schedule


def run(problem, **kwargs):
    task, schedule = problem
    return simulate(task, get_algorithm("fedbuff"), schedule, LocalConfig(steps=1, batch_size=None), seeds=[0],
                    eval_every=EVERY, progress=False, **kwargs)


def test_a_hand_edited_next_chunk_is_refused_and_the_true_checkpoint_resumes_exactly(problem, tmp_path, monkeypatch):
    reference = run(problem)
    folder = tmp_path / "ckpt"
    monkeypatch.setattr(engine.callbacks, "progress_bar", lambda *a, **k: InterruptAt(2))
    with pytest.raises(SimulationInterrupted):
        run(problem, checkpoint_dir=str(folder))
    monkeypatch.undo()
    true = (folder / "checkpoint.json").read_text()
    edited = json.loads(true)
    assert (edited["next_chunk"], edited["next_step"]) == (2, 6)
    edited["next_chunk"] += 1  # would skip the server steps 6..8
    (folder / "checkpoint.json").write_text(json.dumps(edited))
    with pytest.raises(CheckpointError, match="was changed after it was written"):
        run(problem, checkpoint_dir=str(folder), resume=True)
    write(folder, edited, reseal=True)
    with pytest.raises(CheckpointError, match="does not match its record"):
        run(problem, checkpoint_dir=str(folder), resume=True)
    (folder / "checkpoint.json").write_text(true)
    # orphans of a killed write: an orbax temporary state, a temporary record, a finalized state no record names
    (folder / "state-000003.orbax-checkpoint-tmp").mkdir()
    (folder / "state-000003.orbax-checkpoint-tmp" / "x").write_bytes(b"half")
    (folder / ".tmp-abcd1234checkpoint.json").write_text("{")
    (folder / "notes.txt").write_text("mine")
    resumed = run(problem, checkpoint_dir=str(folder), resume=True)
    np.testing.assert_array_equal(resumed.steps, reference.steps)
    assert resumed.final_params.tobytes() == reference.final_params.tobytes()
    for name in reference.metrics:
        assert resumed.metrics[name].tobytes() == reference.metrics[name].tobytes()
    left = sorted(os.listdir(folder))
    assert left == ["checkpoint.json", "notes.txt", "state-000004"], left
