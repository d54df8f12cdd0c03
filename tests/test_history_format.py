"""Histories saved before History's feature data were grouped still load, with every attribute as it was.

``tests/data/history_v1/`` was written by the code before the grouping (``save_history`` and ``write_results`` of a
hand-built History that has every optional feature: per-client evaluation, lookahead windows, the event clock's job
steps, local steps, final parameters): a results folder (``summary.json``, ``metrics.csv``) with the run's saved
History in ``checkpoints/fedbuff/`` (as ``asyncfl run`` leaves it, and as ``--resume`` reuses it).
"""

from __future__ import annotations

import json
import os
import shutil

import numpy as np

from asyncfl_jax.results import History, load_history, load_results, save_history

FOLDER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "history_v1")
SAVED = os.path.join(FOLDER, "checkpoints", "fedbuff")
META = {"config": {"seeds": [0, 1], "runs": [{"label": "fedbuff"}]}, "run": "fedbuff"}


def _check_every_attribute(h: History) -> None:
    assert (h.label, h.algorithm, h.algorithm_options) == ("fedbuff", "fedbuff", {"buffer_size": 2})
    np.testing.assert_array_equal(h.steps, [0, 2, 4])
    np.testing.assert_array_equal(h.times, [[0.0, 1.5, 3.25], [0.0, 1.75, 3.5]])
    np.testing.assert_array_equal(h.uploads, [[4, 6, 8], [4, 6, 8]])
    assert sorted(h.metrics) == ["test_accuracy", "test_loss"]
    np.testing.assert_array_equal(h.metrics["test_loss"], [[2.25, 1.5, 1.125], [2.25, 1.625, np.nan]])
    assert h.seeds == [0, 1] and h.hparams == [{"client_lr": 0.1, "server_lr": 1.0}] * 2
    np.testing.assert_array_equal(h.diverged_at, [-1, 4])
    assert h.schedule_stats == [{"staleness_mean": 1.5, "staleness_max": 3}]
    assert (h.num_steps, h.stopped_early, h.precision) == (4, False, "float64")
    assert (h.compile_seconds, h.run_seconds, h.checkpoint_seconds) == (1.25, 0.5, 0.125)
    assert h.memory == {"total_bytes": 1024} and h.message_bits == {"payload": 96, "index": 0}
    assert h.lookahead == {"L": 4, "num_windows": 2, "mean_window": 2.0, "max_window": 3,
                           "window_histogram": [0, 1, 1, 0]}
    np.testing.assert_array_equal(h.job_steps, [[2, 3, 2, 1], [1, 2, 2, -1]])
    np.testing.assert_array_equal(h.local_steps, [[8.0, 12.0, 16.0]] * 2)
    np.testing.assert_array_equal(h.client_ids, [3, 7])
    assert sorted(h.client_metrics) == ["client_accuracy", "client_loss"]
    np.testing.assert_array_equal(h.client_metrics["client_accuracy"], np.arange(12.0).reshape(2, 3, 2) / 16)
    np.testing.assert_array_equal(h.final_params, [[0.5, -1.0, 2.0], [0.25, 0.75, -0.5]])
    assert h.final_params.dtype == np.float32
    assert h.realized_schedules is None and h.trajectory is None  # never in the History file


def test_a_history_saved_in_the_first_layout_loads_with_every_attribute():
    history = load_history(SAVED, META)
    assert history is not None
    _check_every_attribute(history)


def test_a_results_folder_of_the_first_layout_loads_its_saved_history():
    (history,) = load_results(FOLDER)
    _check_every_attribute(history)  # the saved History (final_params, job_steps): it agrees with the files


def test_saving_again_writes_the_first_layout(tmp_path):
    """The History file's layout is unchanged: the same keys in the JSON record and the same arrays in the npz."""
    history = load_history(SAVED, META)
    save_history(history, str(tmp_path), META)
    with open(os.path.join(SAVED, "history.json")) as f:
        old = json.load(f)
    with open(tmp_path / "history.json") as f:
        new = json.load(f)
    old.pop("npz_sha256"), new.pop("npz_sha256")  # the zip entries carry the time of writing
    assert new == old
    with np.load(os.path.join(SAVED, "history.npz")) as a, np.load(tmp_path / "history.npz") as b:
        assert sorted(a.files) == sorted(b.files)
        for key in a.files:
            assert a[key].dtype == b[key].dtype
            np.testing.assert_array_equal(a[key], b[key])
    shutil.copytree(FOLDER, tmp_path / "copy")
    _check_every_attribute(load_results(str(tmp_path / "copy"))[0])
