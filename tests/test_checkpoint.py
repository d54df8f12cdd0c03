"""Checkpoint and resume, output-folder safety and reproducibility metadata.

A resumed run must give exactly (bit for bit) the History of an uninterrupted one: in process (``simulate`` stopped
by a KeyboardInterrupt or a SIGTERM after some chunk) and through the command line (a real ``asyncfl run`` process
killed with SIGKILL, or stopped with SIGTERM, then continued).
"""

from __future__ import annotations

import hashlib
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
from asyncfl_jax import checkpoint as ckpt
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
TIMINGS = ("compile_seconds", "run_seconds", "checkpoint_seconds")
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
    untimed = [{k: v for k, v in h.summary().items() if k not in TIMINGS} for h in (a, b)]
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
    assert sorted(os.listdir(folder)) == ["checkpoint.json", "state-000003"]  # older states are deleted
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
    state = max((p for p in (copy / record(folder)["state_dir"]).rglob("*") if p.is_file()),
                key=lambda p: p.stat().st_size)  # the largest array data file of the orbax state folder
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


# ---------------------------------------------------------------------------------------------------- the state folder
def small_state(k, n=64):
    """The loop state after chunk ``k``: every carry leaf is derived from ``k`` (so a loaded state shows which save
    it came from): float32, a bfloat16 cache running through many bit patterns (NaN payloads included), an int8
    cache, and a zero-size leaf (which orbax refuses to store)."""
    import jax.numpy as jnp

    bits = (np.arange(2 * n, dtype=np.uint32) * 521 + k).astype(np.uint16)
    carry = {"x": jnp.full((2, n), k, jnp.float32), "cache": jnp.asarray(bits.view(jnp.bfloat16).reshape(2, n)),
             "codes": jnp.asarray(((np.arange(2 * n) + k) % 256 - 128).astype(np.int8).reshape(2, n)),
             "empty": jnp.zeros((2, 0), jnp.float32)}
    return ckpt.LoopState(next_chunk=k, eval_steps=list(range(0, 5 * k + 1, 5)),
                          metrics={"test_accuracy": [np.full(2, i / 10, np.float32) for i in range(k + 1)]},
                          reported={1} if k > 2 else set(), stopped_early=False, compile_seconds=0.5, run_seconds=k,
                          carry=carry, traces={"time": [np.full((2, 5), i, np.float64) for i in range(k)]})


def carry_shape_of(state):
    import jax

    return jax.eval_shape(lambda: state.carry)


def assert_same_state(a, b):
    import jax

    assert (a.next_chunk, a.eval_steps, a.reported, a.stopped_early) == (b.next_chunk, b.eval_steps, b.reported,
                                                                         b.stopped_early)
    for x, y in zip(jax.tree_util.tree_leaves(a.carry), jax.tree_util.tree_leaves(b.carry), strict=True):
        x, y = np.asarray(x), np.asarray(y)
        assert (x.dtype, x.shape, x.tobytes()) == (y.dtype, y.shape, y.tobytes())
    assert {k: np.stack(v).tobytes() for k, v in a.metrics.items()} == \
        {k: np.stack(v).tobytes() for k, v in b.metrics.items()}
    assert {k: np.concatenate(v, axis=1).tobytes() for k, v in a.traces.items()} == \
        {k: np.concatenate(v, axis=1).tobytes() for k, v in b.traces.items()}


def test_the_state_folder_round_trips_every_dtype_and_never_overwrites_the_current_state(tmp_path):
    folder = str(tmp_path)
    state = small_state(3)
    ckpt.save(folder, {"run": 1}, state, 10)
    assert sorted(os.listdir(folder)) == ["checkpoint.json", "state-000003"]
    for mine in ("notes.txt", "state-of-the-art.txt"):  # files of others in the folder are never deleted
        (tmp_path / mine).write_text("mine")
    saved = record(folder)
    assert saved["format"] == ckpt.FORMAT == 2 and saved["state_dir"] == "state-000003"
    assert saved["arrays"]["c0002"] == [[2, 0], "float32"] and saved["arrays"]["c0000"] == [[2, 64], "bfloat16"]
    assert any(name.startswith("ocdbt.process_0/") for name in saved["state_files"])  # orbax's array data
    loaded = ckpt.load(folder, {"run": 1}, carry_shape_of(state))
    assert all(isinstance(leaf, np.ndarray) for leaf in loaded.carry.values())  # host arrays without shardings
    assert_same_state(loaded, state)
    # the same chunk again (e.g. a restarted run) goes to another folder, then back: the record's state stays whole
    ckpt.save(folder, {"run": 1}, state, 10)
    assert sorted(os.listdir(folder)) == ["checkpoint.json", "notes.txt", "state-000003-1", "state-of-the-art.txt"]
    ckpt.save(folder, {"run": 1}, small_state(4), 10)
    assert sorted(os.listdir(folder)) == ["checkpoint.json", "notes.txt", "state-000004", "state-of-the-art.txt"]
    assert_same_state(ckpt.load(folder, {"run": 1}, carry_shape_of(state)), small_state(4))
    ckpt.clear(folder)
    assert sorted(os.listdir(folder)) == ["notes.txt", "state-of-the-art.txt"]


# (orbax, failing to read, leaves a thread that posts to its closed event loop: a warning, not an error)
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_a_corrupt_or_unreadable_orbax_array_file_is_refused(tmp_path):
    import shutil

    folder = tmp_path / "ckpt"
    state = small_state(2, n=4096)
    ckpt.save(str(folder), {}, state, 10)
    saved = record(str(folder))
    name = max(saved["state_files"], key=lambda f: (folder / saved["state_dir"] / f).stat().st_size)
    assert "/d/" in f"/{name}"  # an array data file
    for damage, expected in [("flip", "is corrupt: .* does not match the SHA-256"),
                             ("delete", "is corrupt: ocdbt.* is missing")]:
        copy = tmp_path / damage
        shutil.copytree(folder, copy)
        path = copy / saved["state_dir"] / name
        if damage == "flip":
            data = bytearray(path.read_bytes())
            data[len(data) // 2] ^= 1
            path.write_bytes(bytes(data))
        else:
            path.unlink()
        with pytest.raises(CheckpointError, match=expected):
            ckpt.load(str(copy), {}, carry_shape_of(state))
    # a truncated data file whose SHA-256 was copied into the record: orbax's own error, as a CheckpointError
    copy = tmp_path / "truncated"
    shutil.copytree(folder, copy)
    path = copy / saved["state_dir"] / name
    path.write_bytes(path.read_bytes()[:100])
    edited = record(str(copy))
    edited["state_files"][name] = hashlib.sha256(path.read_bytes()).hexdigest()
    edited["record_sha256"] = ckpt.record_checksum(edited)  # a forged record, sealed again
    (copy / "checkpoint.json").write_text(json.dumps(edited))
    with pytest.raises(CheckpointError, match=r"state-000002 cannot be read \("):
        ckpt.load(str(copy), {}, carry_shape_of(state))
    shutil.rmtree(copy / saved["state_dir"])
    with pytest.raises(CheckpointError, match="state-000002 is missing"):
        ckpt.load(str(copy), {}, carry_shape_of(state))


@pytest.mark.parametrize("edit,expected", [
    (lambda r: r.update(format=1, state_file="state-000002.npz"), r"not a checkpoint of format 2 \(a \.npz"),
    (lambda r: r.pop("state_files"), "incomplete or was edited: missing state_files"),
    (lambda r: r.update(state_dir="../elsewhere"), "is not a state folder's name"),
    (lambda r: r["arrays"].update(c0000=[[2, 64], "no-such-dtype"]), r"arrays\['c0000'\]"),
    (lambda r: r.update(next_chunk="2"), "must be integers"),
    (lambda r: r["arrays"].update(c0000=[[2, 65], "bfloat16"]), "carry array 0 of shape and dtype"),
])
def test_an_old_or_edited_record_is_refused(tmp_path, edit, expected):
    state = small_state(2)
    ckpt.save(str(tmp_path), {}, state, 10)
    edited = record(str(tmp_path))
    edit(edited)
    (tmp_path / "checkpoint.json").write_text(json.dumps(edited))
    with pytest.raises(CheckpointError, match=expected):
        ckpt.load(str(tmp_path), {}, carry_shape_of(state))


# A process that saves the states of small_state(1), small_state(2)... into a folder, SIGKILLed (by itself, when
# ``moment`` is "before-rename" or "after-rename": at that instant of its last save; by the test otherwise) or
# stopped by a file size limit ("full-disk": the last save fails as on a full disk).
SAVER = """
import os, resource, signal, sys
sys.path.insert(0, {tests!r})
from test_checkpoint import small_state
from asyncfl_jax import checkpoint as ckpt

folder, moment, last = sys.argv[1], sys.argv[2], int(sys.argv[3])
for k in range(1, last + 1):
    if k == last and moment in ("before-rename", "after-rename"):
        rename = os.rename
        def killing_rename(src, dst):
            if moment == "after-rename":
                rename(src, dst)
            if str(src).endswith(".orbax-checkpoint-tmp"):
                os.kill(os.getpid(), signal.SIGKILL)
            rename(src, dst)
        os.rename = killing_rename
    if k == last and moment == "full-disk":
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # writes past the limit fail with EFBIG instead
        resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 16, 1 << 16))
        try:
            ckpt.save(folder, {{}}, small_state(k, n=1 << 16), 1000)
        except ckpt.CheckpointError as e:
            print("refused:", e)
        sys.exit(0)
    ckpt.save(folder, {{}}, small_state(k), 1000)
"""


def _saver(folder, moment, last):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([REPO, os.environ.get("PYTHONPATH", "")]),
               JAX_PLATFORMS="cpu")
    script = SAVER.format(tests=os.path.join(REPO, "tests"))
    return subprocess.Popen([sys.executable, "-c", script, str(folder), moment, str(last)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.mark.parametrize("moment,left", [("before-rename", "state-000002.orbax-checkpoint-tmp"),
                                         ("after-rename", "state-000002")])
def test_a_state_folder_left_by_a_killed_save_is_deleted_by_the_next_load_or_save(tmp_path, moment, left):
    import shutil

    proc = _saver(tmp_path / "a", moment, 2)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == -signal.SIGKILL, err[-3000:]
    assert sorted(os.listdir(tmp_path / "a")) == sorted(["checkpoint.json", left, "state-000001"])
    assert record(str(tmp_path / "a"))["state_dir"] == "state-000001"  # the record never saw chunk 2
    shutil.copytree(tmp_path / "a", tmp_path / "b")
    loaded = ckpt.load(str(tmp_path / "a"), {}, carry_shape_of(small_state(1)))
    assert_same_state(loaded, small_state(1))
    assert sorted(os.listdir(tmp_path / "a")) == ["checkpoint.json", "state-000001"]
    ckpt.save(str(tmp_path / "b"), {}, small_state(2), 1000)
    assert sorted(os.listdir(tmp_path / "b")) == ["checkpoint.json", "state-000002"]
    assert_same_state(ckpt.load(str(tmp_path / "b"), {}, carry_shape_of(small_state(2))), small_state(2))


def test_a_full_disk_keeps_the_previous_checkpoint(tmp_path):
    proc = _saver(tmp_path, "full-disk", 3)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err[-3000:]
    assert "refused: the checkpoint state" in out and "could not be written" in out and "File too large" in out
    assert "previous checkpoint, if any, is kept" in out
    # the temporary folder is removed after the error, or (if orbax's threads were still writing to it) by the load
    assert set(os.listdir(tmp_path)) - {"state-000003.orbax-checkpoint-tmp"} == {"checkpoint.json", "state-000002"}
    assert_same_state(ckpt.load(str(tmp_path), {}, carry_shape_of(small_state(2))), small_state(2))
    assert sorted(os.listdir(tmp_path)) == ["checkpoint.json", "state-000002"]


def test_a_save_killed_at_random_moments_leaves_a_whole_checkpoint(tmp_path):
    import random

    rng = random.Random(0)
    for trial in range(4):
        folder = tmp_path / f"trial{trial}"
        proc = _saver(folder, "loop", 10_000)
        _wait_for_checkpoint(proc, str(folder), min_chunk=1 + trial)
        time.sleep(rng.uniform(0.0, 0.2))
        os.kill(proc.pid, signal.SIGKILL)
        proc.communicate(timeout=30)
        saved = record(str(folder))
        loaded = ckpt.load(str(folder), {}, carry_shape_of(small_state(1)))
        assert_same_state(loaded, small_state(saved["next_chunk"]))
        assert sorted(os.listdir(folder)) == ["checkpoint.json", saved["state_dir"]]


SHARDED = """
import os, sys, tempfile
import jax, jax.numpy as jnp, numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
assert jax.device_count() == 4, jax.devices()
sys.path.insert(0, {tests!r})
from test_checkpoint import assert_same_state, small_state
from asyncfl_jax import checkpoint as ckpt

mesh = Mesh(np.array(jax.devices()), ("d",))
rows, everywhere = NamedSharding(mesh, P("d")), NamedSharding(mesh, P())
state = small_state(3, n=64)
host = {{k: np.asarray(v) for k, v in state.carry.items()}}
state.carry = {{"x": jax.device_put(jnp.tile(state.carry["x"], (2, 1)), rows),  # 4 rows, one per device
               "cache": jax.device_put(state.carry["cache"].reshape(4, 32), rows),
               "codes": jax.device_put(state.carry["codes"], everywhere), "empty": state.carry["empty"]}}
folder = tempfile.mkdtemp()
ckpt.save(folder, {{}}, state, 10)
shape = jax.eval_shape(lambda: state.carry)
targets = {{"x": rows, "cache": rows, "codes": everywhere, "empty": everywhere}}
placed = ckpt.load(folder, {{}}, shape, shardings=targets)
for k, leaf in placed.carry.items():
    assert isinstance(leaf, jax.Array) and leaf.sharding.is_equivalent_to(targets[k], leaf.ndim), (k, leaf.sharding)
assert placed.carry["x"].addressable_shards[1].data.shape == (1, 64)
assert_same_state(placed, state)
on_host = ckpt.load(folder, {{}}, shape)
assert all(isinstance(v, np.ndarray) for v in on_host.carry.values())
assert_same_state(on_host, state)
one = ckpt.load(folder, {{}}, shape, shardings=everywhere)  # one sharding for every leaf
assert all(v.sharding.is_equivalent_to(everywhere, v.ndim) for v in one.carry.values())
print("sharded carry saved and placed")

from asyncfl_jax import LocalConfig, ca2fl, engine, make_model, make_schedule, make_task, simulate
from asyncfl_jax.checkpoint import SimulationInterrupted
from asyncfl_jax.data import synthetic_leaf
from asyncfl_jax.timing import DelayModel

data = synthetic_leaf(num_clients=8, seed=1, max_samples=80)
task = make_task(data, data.natural_partition, make_model("logreg", data.input_shape, data.num_classes))
schedule = make_schedule("concurrent", 8, 24, DelayModel(), seed=0, concurrency=4, buffer_size=2)
kw = dict(local=LocalConfig(steps=2, batch_size=8), seeds=[0, 1], hparams={{"client_lr": [0.05, 0.1]}},
          eval_every=8, progress=False, shard_replicas=True)
ref = simulate(task, ca2fl(cache="int8"), schedule, **kw)

class StopAt:
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

folder = tempfile.mkdtemp()
bar, engine.callbacks.progress_bar = engine.callbacks.progress_bar, lambda *a, **k: StopAt(2)
try:
    simulate(task, ca2fl(cache="int8"), schedule, checkpoint_dir=folder, **kw)
except SimulationInterrupted as e:
    assert e.saved and e.step == 16, (e.saved, e.step)
else:
    raise AssertionError("the run should have been interrupted")
engine.callbacks.progress_bar = bar
resumed = simulate(task, ca2fl(cache="int8"), schedule, checkpoint_dir=folder, resume=True, **kw)
assert resumed.final_params.tobytes() == ref.final_params.tobytes()
for k in ref.metrics:
    assert resumed.metrics[k].tobytes() == ref.metrics[k].tobytes(), k
print("sharded replicas resume")
"""


def test_a_carry_sharded_over_four_devices_is_saved_and_placed_back():
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=4", JAX_PLATFORMS="cpu",
               PYTHONPATH=os.pathsep.join([REPO, os.environ.get("PYTHONPATH", "")]))
    script = SHARDED.format(tests=os.path.join(REPO, "tests"))
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "sharded carry saved and placed" in out.stdout and "sharded replicas resume" in out.stdout


# Two processes with 2 CPU devices each, as two hosts: every process writes its shards of a carry spread over the 4
# devices, and reads back only its own.
MULTIHOST = """
import os, sys
import jax
process, port, folder = int(sys.argv[1]), sys.argv[2], sys.argv[3]
jax.distributed.initialize(f"localhost:{{port}}", num_processes=2, process_id=process)
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
sys.path.insert(0, {tests!r})
from test_checkpoint import small_state
from asyncfl_jax import checkpoint as ckpt

assert jax.device_count() == 4 and jax.local_device_count() == 2, jax.devices()
mesh = Mesh(np.array(jax.devices()), ("d",))
rows, everywhere = NamedSharding(mesh, P("d")), NamedSharding(mesh, P())
host = small_state(2, n=64)
full = {{"x": np.tile(np.asarray(host.carry["x"]), (2, 1)), "cache": np.asarray(host.carry["cache"]).reshape(4, 32),
        "codes": np.asarray(host.carry["codes"])}}
targets = {{"x": rows, "cache": rows, "codes": everywhere}}
host.carry = {{k: jax.make_array_from_callback(a.shape, targets[k], lambda i, a=a: a[i]) for k, a in full.items()}}
assert not host.carry["x"].is_fully_addressable
ckpt.save(folder, {{}}, small_state(1), 10)  # a first state, superseded by the sharded one
ckpt.save(folder, {{}}, host, 10)
loaded = ckpt.load(folder, {{}}, jax.eval_shape(lambda: host.carry), shardings=targets)
assert loaded.next_chunk == 2 and loaded.metrics["test_accuracy"][2].tobytes() == np.full(2, 0.2, np.float32).tobytes()
for k, leaf in loaded.carry.items():
    assert leaf.sharding.is_equivalent_to(targets[k], leaf.ndim), k
    for shard in leaf.addressable_shards:
        assert np.asarray(shard.data).tobytes() == full[k][shard.index].tobytes(), k
print(f"process {{process}}: ok", flush=True)
"""


def test_a_carry_spread_over_two_processes_is_saved_and_read_back_shard_by_shard(tmp_path):
    import socket

    with socket.socket() as s:  # a free port for the coordinator
        s.bind(("localhost", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=2", JAX_PLATFORMS="cpu",
               PYTHONPATH=os.pathsep.join([REPO, os.environ.get("PYTHONPATH", "")]))
    script = MULTIHOST.format(tests=os.path.join(REPO, "tests"))
    procs = [subprocess.Popen([sys.executable, "-c", script, str(i), str(port), str(tmp_path)], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in range(2)]
    outputs = [p.communicate(timeout=300) for p in procs]
    for i, (p, (out, err)) in enumerate(zip(procs, outputs)):
        assert p.returncode == 0 and f"process {i}: ok" in out, err[-3000:]
    saved = record(str(tmp_path))
    assert sorted(os.listdir(tmp_path)) == ["checkpoint.json", "state-000002"]
    assert {name.split("/")[0] for name in saved["state_files"]} >= {"ocdbt.process_0", "ocdbt.process_1"}


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
    proc = _cli("--out", str(out), *SMALL, "--checkpoint-every", "1", slow=True)  # a checkpoint after every chunk
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
    from asyncfl_jax.outputs import Manifest

    out = tmp_path / "old"
    _write_config(out)
    Manifest(str(out), {"config.json": "file", "summary.json": "file", "metrics.csv": "file", "schedules": "folder",
                        "schedules/fedbuff-seed0.npz": "file", "checkpoints": "folder",
                        "checkpoints/fedbuff": "checkpoints"}).write()
    for name in ("summary.json", "metrics.csv", "notes.txt"):
        (out / name).write_text("x")
    (out / "schedules").mkdir()
    (out / "schedules" / "fedbuff-seed0.npz").write_bytes(b"x")
    (out / "checkpoints" / "fedbuff").mkdir(parents=True)
    for name in ("history.json", "history.npz", "checkpoint.json", "state-000002.npz"):
        (out / "checkpoints" / "fedbuff" / name).write_bytes(b"x")
    for name in ("state-000003/d", "state-000004.orbax-checkpoint-tmp/d"):  # orbax state folders, finished or not
        (out / "checkpoints" / "fedbuff" / name).mkdir(parents=True)
        (out / "checkpoints" / "fedbuff" / name / "x").write_bytes(b"x")
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
