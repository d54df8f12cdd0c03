"""Histories saved before History's feature data were grouped still load, with every attribute as it was.

``tests/data/history_v1/`` was written by the code before the grouping (``save_history`` and ``write_results`` of a
hand-built History that has every optional feature: per-client evaluation, lookahead windows, the event clock's job
steps, local steps, final parameters): a results folder (``summary.json``, ``metrics.csv``) with the run's saved
History in ``checkpoints/fedbuff/`` (as ``asyncfl run`` leaves it, and as ``--resume`` reuses it).
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil

import numpy as np
import pytest

from asyncfl_jax.results import (ClientEvaluation, EventClockRecord, History, LookaheadWindows, RunCost, load_history,
                                 load_results, save_history)

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


# ---------------------------------------------------------------------------------------------------- the records
def _core(**extra) -> dict:
    steps = np.array([0, 1])
    return dict(label="run", algorithm="fedasync", algorithm_options={}, steps=steps, times=np.zeros((1, 2)),
                uploads=np.array([[0, 1]]), metrics={"test_loss": np.array([[1.0, 0.5]])}, seeds=[0],
                hparams=[{"server_lr": 1.0}], diverged_at=np.array([-1]), schedule_stats=[{}], num_steps=1, **extra)


def test_the_feature_data_are_records_and_none_without_the_feature():
    h = History(**_core())
    assert (h.clients, h.clock, h.windows, h.trajectory) == (None, None, None, None)
    assert h.cost == RunCost() and h.memory is None and h.compile_seconds == 0.0
    assert (h.client_metrics, h.client_ids, h.realized_schedules, h.job_steps, h.lookahead) == (None,) * 5
    windows = LookaheadWindows(4, 2, 2.0, 3, (0, 1, 1, 0))
    clients = ClientEvaluation({"client_loss": np.ones((1, 2, 3))}, np.array([0, 2, 5]))
    h = History(**_core(windows=windows, clients=clients, clock=EventClockRecord(None, np.array([[2, 1]])),
                        cost=RunCost(compile_seconds=2.5, message_bits={"payload": 8, "index": 0})))
    assert h.lookahead == {"L": 4, "num_windows": 2, "mean_window": 2.0, "max_window": 3,
                           "window_histogram": [0, 1, 1, 0]}
    assert h.client_metrics is clients.metrics and h.client_ids is clients.client_ids
    assert h.job_steps.tolist() == [[2, 1]] and h.realized_schedules is None
    assert (h.compile_seconds, h.message_bits) == (2.5, {"payload": 8, "index": 0})
    assert h.summary()["lookahead"] == h.lookahead and h.summary()["compile_seconds"] == 2.5


def test_the_first_layouts_names_are_read_only_and_accepted_as_keywords():
    h = History(**_core(compile_seconds=1.5, memory={"total_bytes": 3}, lookahead={
        "L": 2, "num_windows": 1, "mean_window": 1.0, "max_window": 1, "window_histogram": [1, 0]},
        client_metrics={"client_loss": np.ones((1, 2, 1))}, client_ids=np.array([4]), job_steps=np.array([[1]])))
    assert h.cost == RunCost(compile_seconds=1.5, memory={"total_bytes": 3})
    assert h.windows == LookaheadWindows(2, 1, 1.0, 1, (1, 0))
    assert h.clients.client_ids.tolist() == [4] and h.clock.job_steps.tolist() == [[1]]
    for name in ("compile_seconds", "memory", "lookahead", "client_metrics", "client_ids", "job_steps",
                 "realized_schedules", "message_bits", "run_seconds", "checkpoint_seconds"):
        with pytest.raises(AttributeError):
            setattr(h, name, None)
    # dataclasses.replace with a name of the first layout replaces that part of its record
    without = dataclasses.replace(h, client_metrics=None, client_ids=None)
    assert without.clients is None and without.clock is h.clock and without.cost is h.cost
    slower = dataclasses.replace(h, run_seconds=9.0)
    assert slower.cost == RunCost(compile_seconds=1.5, run_seconds=9.0, memory={"total_bytes": 3})
    with pytest.raises(TypeError, match="unexpected keyword arguments \\['clinet_ids'\\]"):
        History(**_core(clinet_ids=np.array([4])))


def test_the_results_package_exports_every_name_of_the_former_module():
    import asyncfl_jax.results as results
    from asyncfl_jax import atomic, checkpoint, experiment, outputs

    former = ("ENVIRONMENT_PACKAGES HISTORY_FORMAT History INTEGER_COLUMNS METRIC_COLUMNS Point SeedStats "
              "TRAJECTORY_KEY VOLATILE_ENVIRONMENT atomic_file environment_info environment_json git_state "
              "headline_metric histories_dataframe invocation_info load_history load_results lower_is_better "
              "metrics_csv plot_accuracy point_curves point_name read_metrics_csv read_trajectory remove_history "
              "save_figure save_history seed_stats swept_names write_atomic write_client_metrics write_results "
              "write_trajectory").split()
    assert [n for n in former if not hasattr(results, n)] == []
    moved = ("OUTPUT_FILES OutputStatus check_output_paths check_saved_runs check_unchanged checkpoint_dir_for "
             "clean_output config_differences decide_output describe_differences new_output output_status "
             "run_targets save_realized_schedules save_schedules saved_configurations").split()
    assert [n for n in moved if getattr(experiment, n, None) is not getattr(outputs, n)] == []
    assert atomic.atomic_file is outputs.atomic.atomic_file
    assert checkpoint.LoopState.__module__ == "asyncfl_jax.engine.state"


def test_every_field_is_a_parameter_of_the_constructor():
    """History's constructor is written out (it also takes the first layout's names): a new field needs it there."""
    import inspect

    parameters = list(inspect.signature(History.__init__).parameters)[1:-1]
    assert parameters == [f.name for f in dataclasses.fields(History)]
