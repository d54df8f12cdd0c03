"""Device traces as a delay model (asyncfl_jax.timing.traces): the file formats, the durations, the seeded
client -> device draw, availability windows in the event loop, and the configuration / CLI options."""

from __future__ import annotations

import json
import math
import pickle

import numpy as np
import pytest

from asyncfl_jax.cli import config_from_argv
from asyncfl_jax.config import ConfigError, ExperimentConfig, validate
from asyncfl_jax.experiment import build_schedules
from asyncfl_jax.timing import Schedule, job_durations_table, make_schedule, schedule_summary
from asyncfl_jax.timing.clock import EventClock
from asyncfl_jax.timing.schedule import _ARRAY_FIELDS
from asyncfl_jax.timing.traces import (TraceDelays, TraceError, Windows, assign_devices, iter_windows,
                                       load_device_trace, load_fedscale_traces)
from support import replay_jobs

# Four devices: one with a daily-like on/off pattern (period 20 s), one on only at night across the period boundary,
# two always on.
DEVICES = {"period": 20, "devices": [
    {"name": "office", "seconds_per_step": 1.0, "upload_mb_per_s": 2.0, "download_mb_per_s": 4.0,
     "availability": [[0, 10]]},
    {"name": "night", "seconds_per_step": 0.5, "upload_mb_per_s": 1.0, "download_mb_per_s": 1.0,
     "availability": [[15, 20], [0, 3]]},
    {"name": "fast", "seconds_per_step": 0.25, "upload_mb_per_s": 8.0, "download_mb_per_s": 8.0},
    {"name": "slow", "seconds_per_step": 2.0, "upload_mb_per_s": 0.5, "download_mb_per_s": 1.0},
]}


def write_json(tmp_path, content, name="devices.json"):
    path = tmp_path / name
    path.write_text(json.dumps(content))
    return str(path)


def write_pickle(tmp_path, content, name):
    path = tmp_path / name
    path.write_bytes(pickle.dumps(content))
    return str(path)


@pytest.fixture
def trace_file(tmp_path):
    return write_json(tmp_path, DEVICES)


# ---------------------------------------------------------------------- durations
def test_durations_match_hand_computed_values(trace_file, tmp_path):
    trace = load_device_trace(trace_file)
    assert trace.unit == "step" and trace.num_devices == 4 and trace.joint
    delays = TraceDelays(trace, steps_per_job=4, model_mb=2.0)
    # work x compute + model / upload + model / download, per device
    by_device = [4 * 1.0 + 2 / 2 + 2 / 4, 4 * 0.5 + 2 / 1 + 2 / 1, 4 * 0.25 + 2 / 8 + 2 / 8, 4 * 2.0 + 2 / 0.5 + 2 / 1]
    devices = delays.devices(4, seed=3)
    assert sorted(devices.tolist()) == [0, 1, 2, 3]
    assert delays.client_durations(4, 3) == pytest.approx([by_device[d] for d in devices], rel=1e-15)
    table = job_durations_table(4, delays, 3)
    assert np.array_equal(table.block(np.arange(4), 5, 3), np.repeat(table.per_client[:, None], 3, axis=1))
    # Per example (CSV): work = steps x examples per step.
    csv = tmp_path / "devices.csv"
    csv.write_text("name,seconds_per_example,upload_mb_per_s,download_mb_per_s,availability,period\n"
                   "a,0.01,1,2,,\nb,0.002,4,4,0:30;50:90,100\n")
    per_example = TraceDelays(load_device_trace(str(csv)), steps_per_job=5, model_mb=1.0, examples_per_step=8)
    d = per_example.devices(2, 0)
    expected = np.array([5 * 8 * 0.01 + 1 / 1 + 1 / 2, 5 * 8 * 0.002 + 1 / 4 + 1 / 4])[d]
    assert per_example.client_durations(2, 0) == pytest.approx(expected, rel=1e-15)
    with pytest.raises(ValueError, match="examples_per_step"):
        TraceDelays(per_example.trace, steps_per_job=5, model_mb=1.0)
    with pytest.raises(ValueError, match="would be ignored"):
        TraceDelays(trace, steps_per_job=5, model_mb=1.0, examples_per_step=8)


def test_fedscale_pickles_are_read_with_fedscale_arithmetic(tmp_path):
    capacity = {1: {"computation": 50.0, "communication": 800.0}, 2: {"computation": 12.5, "communication": 3200.0},
                3: {"computation": 100.0, "communication": 250.0}}
    behave = {7: {"duration": 30, "inactive": [1, 4, 7, 10], "finish_time": 10, "active": [1, 3, 6, 9],
                  "model": "Pixel 4"},
              8: {"duration": 50, "inactive": [40, 200], "finish_time": 100, "active": [0, 90], "model": "iPhone"}}
    trace = load_fedscale_traces(write_pickle(tmp_path, capacity, "client_device_capacity"),
                                 write_pickle(tmp_path, behave, "client_behave_trace"))
    assert trace.unit == "example" and trace.num_devices == 3 and not trace.joint
    assert trace.source["capacity_file"] == "client_device_capacity"
    B, K, model_mb = 20, 5, 1.5
    delays = TraceDelays(trace, steps_per_job=K, model_mb=model_mb, examples_per_step=B)
    # FedScale: ClientMetadata.get_completion_time with sizes in kbit (Aggregator.run: bytes / 1024 * 8).
    kbit = model_mb * 1e6 / 1024 * 8
    fedscale = [3.0 * B * K * c["computation"] / 1000.0 + (kbit + kbit) / c["communication"]
                for c in capacity.values()]
    d = delays.devices(3, 11)
    assert delays.client_durations(3, 11) == pytest.approx(np.array(fedscale)[d], rel=1e-12)
    # ClientMetadata.is_active on FedScale's own test data (cur_time % finish_time, windows [active, inactive]).
    first = trace.availability[0]
    assert [first.is_on(t) for t in (2, 6, 8, 9, 10, 15)] == [False, True, False, True, False, False]
    second = trace.availability[1]  # [0, 40) and [90, 100) wrap into one window [90, 140)
    assert list(iter_windows(second, 250)) == [(0.0, 40.0), (90.0, 140.0), (190.0, 240.0)]
    # Availability devices are a separate draw (stream 9): all clients get one of the two behaviour entries.
    assert set(delays.availability_devices(6, 11).tolist()) == {0, 1}
    s = make_schedule("all_active", 3, 40, delays, 11)
    check_trace_schedule(s, delays, 11)


def test_restricted_unpickler_refuses_classes(tmp_path):
    import datetime

    path = write_pickle(tmp_path, {1: {"computation": datetime.date(2020, 1, 1), "communication": 1.0}}, "evil")
    with pytest.raises(TraceError, match=r"'evil' is not a plain pickle.*refused to load datetime\.date"):
        load_fedscale_traces(path)
    text = tmp_path / "cap.csv"
    text.write_text("name,computation\n")
    with pytest.raises(TraceError, match=r"'cap\.csv' cannot be read as a pickle.*--device-trace"):
        load_fedscale_traces(str(text))
    # numpy scalars are numbers: allowed
    ok = write_pickle(tmp_path, {1: {"computation": np.float64(2.0), "communication": np.float32(8.0)}}, "np")
    assert load_fedscale_traces(ok).compute[0] == pytest.approx(0.006)


# ---------------------------------------------------------------------- the seeded mapping
def test_seeded_mapping_is_reproducible_and_balanced():
    a = assign_devices(10, 4, seed=5)
    assert np.array_equal(a, assign_devices(10, 4, seed=5))
    assert not np.array_equal(a, assign_devices(10, 4, seed=6))
    assert sorted(np.bincount(a, minlength=4).tolist()) == [2, 2, 3, 3]  # floor / ceil of 10 / 4
    few = assign_devices(3, 50, seed=1)
    assert len(set(few.tolist())) == 3  # n <= D: distinct devices
    assert np.array_equal(few, assign_devices(5, 50, seed=1)[:3])  # a prefix for more clients


# ---------------------------------------------------------------------- availability in the event loop
def _window_of(windows: Windows, t: float) -> tuple[float, float]:
    for a, b in iter_windows(windows, t + 1):
        if a <= t < b:
            return a, b
    raise AssertionError(f"no window holds {t}")


def check_trace_schedule(s: Schedule, delays: TraceDelays, seed: int) -> None:
    """Every job starts while its client is on and takes the client's duration; a job is applied iff it arrives
    by the end of its window, else it is discarded and the client starts nothing before its next window."""
    s.validate()
    n = s.num_clients
    durations = delays.client_durations(n, seed)
    avail = delays.availability_devices(n, seed)
    jobs = replay_jobs(s)
    for c in range(n):
        windows = Windows.always() if avail is None else delays.trace.availability[avail[c]]
        mine = [j for j in jobs if j["client"] == c]
        for k, job in enumerate(mine):
            assert windows.is_on(job["start"]), f"client {c} dispatched while offline at {job['start']}"
            _, end = _window_of(windows, job["start"])
            finish = job["start"] + durations[c]
            if job["arrival"] is not None:
                assert job["arrival"] == finish and finish <= end
            elif k + 1 < len(mine):  # never applied but followed by another job: discarded when it went offline
                assert finish > end and mine[k + 1]["start"] >= end
            if k + 1 < len(mine) and job["arrival"] is not None:
                assert mine[k + 1]["start"] >= job["arrival"]


@pytest.mark.parametrize("protocol, options", [
    ("all_active", {}),
    ("concurrent", {"concurrency": 3, "buffer_size": 2}),
    ("concurrent", {"concurrency": 3, "buffer_size": 2, "refill": "boundary"}),
    ("concurrent", {"concurrency": 4, "aggregation": "periodic", "period": 3.0}),
    ("synchronous", {"participants": 3}),
])
def test_dispatch_only_while_available(trace_file, protocol, options):
    delays = TraceDelays(load_device_trace(trace_file), steps_per_job=2, model_mb=0.5)
    s = make_schedule(protocol, 8, 150, delays, 4, **options)
    check_trace_schedule(s, delays, 4)
    assert s.info["delays"]["kind"] == "device_trace" and s.info["offline_discards"]  # times of lost jobs
    # a lost job is in flight until it is discarded, not for ever
    assert 1 <= schedule_summary(s)["max_concurrency"] <= options.get("concurrency", options.get("participants", 8))
    assert s.info["trace_devices"] == delays.devices(8, 4).tolist()
    assert s.step_times[-1] > 30  # long enough to cross several periods


def test_offline_mid_job_is_discarded_like_a_dropout(tmp_path):
    """Client on [0, 10) every 20 s with 4 s jobs: jobs at 0, 4 arrive, the one at 8 is discarded at 10; it is back
    at 20. An always-on client with 6 s jobs keeps arriving."""
    path = write_json(tmp_path, {"period": 20, "devices": [
        {"seconds_per_step": 1.0, "upload_mb_per_s": 1, "download_mb_per_s": 1, "availability": [[0, 10]]},
        {"seconds_per_step": 1.5, "upload_mb_per_s": 1, "download_mb_per_s": 1}]})
    delays = TraceDelays(load_device_trace(path), steps_per_job=4, model_mb=0.0)
    seed = next(s for s in range(10) if delays.devices(2, s).tolist() == [0, 1])  # client 0 on the office device
    s = make_schedule("all_active", 2, 9, delays, seed)
    check_trace_schedule(s, delays, seed)
    assert s.arrival_times[:, 0].tolist() == [4, 6, 8, 12, 18, 24, 24, 28, 30]
    assert s.arrival_clients[:, 0].tolist() == [0, 1, 0, 1, 1, 0, 1, 0, 1]
    jobs0 = [j for j in replay_jobs(s) if j["client"] == 0]
    assert [j["start"] for j in jobs0] == [0, 4, 8, 20, 24, 28]
    assert [j["arrival"] for j in jobs0][:5] == [4, 8, None, 24, 28]
    assert schedule_summary(s)["participation"] == [4, 5]
    assert s.info["offline_discards"] == [10.0, 30.0] and schedule_summary(s)["max_concurrency"] == 2
    # With a client to spare, the discarded job is replaced at once, from the current model (a dropout's semantics).
    path = write_json(tmp_path, {"period": 20, "devices": [
        {"seconds_per_step": 2.0, "upload_mb_per_s": 1, "download_mb_per_s": 1, "availability": [[0, 10]]},
        *[{"seconds_per_step": 1.5, "upload_mb_per_s": 1, "download_mb_per_s": 1}] * 3]}, "spare.json")
    delays = TraceDelays(load_device_trace(path), steps_per_job=4, model_mb=0.0)
    s = make_schedule("concurrent", 4, 60, delays, 0, concurrency=2, buffer_size=1)
    check_trace_schedule(s, delays, 0)
    office = int(np.flatnonzero(delays.devices(4, 0) == 0)[0])
    discarded = [j for j in replay_jobs(s) if j["client"] == office and j["arrival"] is None
                 and j["start"] + 8 > _window_of(delays.trace.availability[0], j["start"])[1]]
    assert discarded, "the office client had a job cut by the end of its window"
    starts = s.dispatch_times[s.dispatch_clients >= 0]
    for job in discarded[:-1]:
        end = _window_of(delays.trace.availability[0], job["start"])[1]
        assert end in starts.tolist()  # a replacement started when the job was discarded


def test_windows_that_end_for_good_give_a_clear_error(tmp_path):
    path = write_json(tmp_path, {"devices": [
        {"seconds_per_step": 1.0, "upload_mb_per_s": 1, "download_mb_per_s": 1, "availability": [[0, 10]]}]})
    delays = TraceDelays(load_device_trace(path), steps_per_job=3, model_mb=0.0)
    with pytest.raises(ValueError, match=r"cannot complete num_steps=50 \(stopped after 3 steps.*device traces"):
        make_schedule("concurrent", 2, 50, delays, 0, concurrency=1, buffer_size=1)
    with pytest.raises(ValueError, match="event clock does not read device traces"):
        EventClock(2, 10, delays, 0)


# ---------------------------------------------------------------------- save and replay
def test_trace_schedules_are_saved_and_replayed(trace_file, tmp_path):
    delays = TraceDelays(load_device_trace(trace_file), steps_per_job=2, model_mb=0.5)
    s = make_schedule("concurrent", 6, 30, delays, 2, concurrency=3, buffer_size=2)
    assert s.info == make_schedule("concurrent", 6, 30, delays, 2, concurrency=3, buffer_size=2).info
    path = tmp_path / "s.npz"
    s.save(path)
    loaded = Schedule.load(path)  # validates, discarded jobs included
    for f in _ARRAY_FIELDS:
        assert np.array_equal(getattr(s, f), getattr(loaded, f), equal_nan=getattr(s, f).dtype.kind == "f"), f
    assert loaded.info == json.loads(json.dumps(s.info))
    # Replayed as recorded schedules by a configuration (no trace needed any more) and trained on.
    cfg = _config({"speed": "constant"})
    cfg.data.num_clients, cfg.runs[0].schedule_files, cfg.runs[0].steps = 6, [str(path)], None
    assert schedule_summary(build_schedules(cfg, cfg.runs[0])[0]) == schedule_summary(s)


def test_cli_run_with_a_device_trace(trace_file, tmp_path):
    from asyncfl_jax import cli

    out = tmp_path / "run"
    assert cli.main(["run", "--out", str(out), "--set", "data.num_clients=8", "--set", "runs.arrivals=40",
                     "--set", "local.steps=2", "--set", "eval_points=2", "--no-progress", "--no-plot",
                     "--algorithm", "fedbuff", "--concurrency", "4", "--buffer-size", "2",
                     "--device-trace", trace_file]) == 0
    assert json.loads((out / "config.json").read_text())["delays"] == {"device_trace": trace_file, "model_mb": None}
    saved = Schedule.load(out / "schedules" / "fedbuff-seed0.npz")
    described = saved.info["delays"]
    assert described["kind"] == "device_trace" and described["file"] == "devices.json"
    assert described["steps_per_job"] == 2 and described["model_mb"] > 0  # the model's float32 size
    check_trace_schedule(saved, TraceDelays(load_device_trace(trace_file), 2, described["model_mb"]), 0)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["runs"][0]["schedule"][0] == schedule_summary(saved)


# ---------------------------------------------------------------------- bad files
BAD_JSON = [
    ({"devices": [{"seconds_per_step": 1, "download_mb_per_s": 1}]}, r"'bad\.json', device 0: field 'upload_mb_per_s' "
     r"is missing"),
    ({"devices": [{"seconds_per_step": 1, "upload_mb_per_s": 1, "download_mb_per_s": -1}]},
     r"device 0: field 'download_mb_per_s' must be a finite number > 0, got -1"),
    ({"devices": [{"seconds_per_step": 1, "upload_mb_per_s": 1, "download_mb_per_s": 1},
                  {"seconds_per_example": 1, "upload_mb_per_s": 1, "download_mb_per_s": 1}]}, "not a mix"),
    ({"devices": [{"name": "p", "seconds_per_step": 1, "seconds_per_example": 1, "upload_mb_per_s": 1,
                   "download_mb_per_s": 1}]}, r"device 0 \('p'\): give exactly one of"),
    ({"devices": [{"seconds_per_step": 1, "upload_mb_per_s": 1, "download_mb_per_s": 1, "availability": [[5, 2]]}]},
     r"availability window 0 ends before it starts"),
    ({"period": 10, "devices": [{"seconds_per_step": 1, "upload_mb_per_s": 1, "download_mb_per_s": 1,
                                 "availability": [[3, 3]]}]}, "no availability window of positive length"),
    ({"devices": [{"seconds_per_step": 1, "upload_mb_per_s": 1, "download_mb_per_s": 1, "cpu": 2}]},
     r"unknown field 'cpu'; allowed fields are"),
    ({"device": []}, "an object with a list 'devices'"),
    ({"period": 5, "devices": [{"seconds_per_step": 1, "upload_mb_per_s": 1, "download_mb_per_s": 1}]},
     "field 'period' would be ignored"),
]


@pytest.mark.parametrize("content, match", BAD_JSON)
def test_bad_own_files_are_refused_naming_file_and_field(tmp_path, content, match):
    with pytest.raises(TraceError, match=match):
        load_device_trace(write_json(tmp_path, content, "bad.json"))


def test_bad_csv_and_file_names(tmp_path):
    csv = tmp_path / "d.csv"
    csv.write_text("seconds_per_step,upload_mb_per_s,download_mb_per_s,availability\n1,1,1,0-30\n")
    with pytest.raises(TraceError, match=r"'d\.csv', device 0: field 'availability' must be windows 'start:end'"):
        load_device_trace(str(csv))
    csv.write_text("seconds_per_step,upload_mb_per_s,download_mb_per_s,gpu\n1,1,1,2\n")
    with pytest.raises(TraceError, match=r"unknown column 'gpu'"):
        load_device_trace(str(csv))
    other = tmp_path / "d.txt"
    other.write_text("x")
    with pytest.raises(TraceError, match=r"must end in \.csv or \.json"):
        load_device_trace(str(other))
    with pytest.raises(TraceError, match="does not exist"):
        load_device_trace(str(tmp_path / "missing.json"))


@pytest.mark.parametrize("capacity, behave, match", [
    ({1: {"computation": 1.0}}, None, r"'cap', client 1: field 'communication' is missing"),
    ({1: {"computation": 0.0, "communication": 1.0}}, None, r"field 'computation' must be a finite number > 0"),
    ([1, 2], None, r"'cap' must hold a non-empty dict"),
    ({1: {"computation": 1.0, "communication": 1.0}},
     {5: {"active": [4], "inactive": [2], "finish_time": 10}}, r"'beh', client 5: inactive\[0\] = 2 is before"),
    ({1: {"computation": 1.0, "communication": 1.0}},
     {5: {"active": [4], "inactive": [6]}}, r"'beh', client 5: field 'finish_time' is missing"),
])
def test_bad_fedscale_files_are_refused(tmp_path, capacity, behave, match):
    cap = write_pickle(tmp_path, capacity, "cap")
    beh = None if behave is None else write_pickle(tmp_path, behave, "beh")
    with pytest.raises(TraceError, match=match):
        load_fedscale_traces(cap, beh)


# ---------------------------------------------------------------------- configuration and CLI
def _config(delays, **protocol):
    return ExperimentConfig.from_dict({
        "data": {"num_clients": 8}, "delays": delays, "seeds": [0, 1],
        "runs": [{"algorithm": "fedbuff", "steps": 20,
                  "protocol": {"name": "concurrent", "concurrency": 4, "buffer_size": 2, **protocol}}]})


def test_config_builds_trace_schedules(trace_file, tmp_path):
    cfg = _config({"device_trace": trace_file, "model_mb": 0.5})
    validate(cfg)
    schedules = build_schedules(cfg, cfg.runs[0])
    assert [s.info["seed"] for s in schedules] == [0, 1]
    expected = TraceDelays(load_device_trace(trace_file), steps_per_job=cfg.local.steps, model_mb=0.5)
    for seed, s in zip(cfg.seeds, schedules):
        check_trace_schedule(s, expected, seed)
    fedscale = write_pickle(tmp_path, {1: {"computation": 5.0, "communication": 1000.0}}, "cap")
    validate(_config({"fedscale_capacity": fedscale, "model_mb": None}))
    with pytest.raises(ConfigError, match="delays.model_mb"):
        build_schedules(_config({"fedscale_capacity": fedscale}), cfg.runs[0])
    cfg.runs[0].schedule_files = ["recorded.npz"]
    with pytest.raises(ConfigError, match=r"delays\.device_trace .*would be ignored: every run replays"):
        validate(cfg, check_files=False)


@pytest.mark.parametrize("delays, protocol, match", [
    ({"device_trace": "T", "speed": "uniform"}, {}, r"delays\.speed cannot be combined with device traces"),
    ({"fedscale_behavior": "T"}, {}, "needs delays.fedscale_capacity"),
    ({"device_trace": "T", "fedscale_capacity": "T"}, {}, "give one trace format"),
    ({"device_trace": "T", "model_mb": -1}, {}, "model_mb must be a finite number >= 0"),
    ({"device_trace": "T"}, {"name": "event_clock"}, r"runs\[0\]\.protocol\.name.*does not read device traces"),
    ({"device_trace": "missing.json"}, {}, r"'missing\.json' does not exist"),
])
def test_config_refuses_ignored_or_bad_trace_options(trace_file, delays, protocol, match):
    delays = {k: (trace_file if v == "T" else v) for k, v in delays.items()}
    with pytest.raises(ConfigError, match=match):
        validate(_config(delays, **protocol))


def test_cli_options(trace_file, tmp_path):
    cfg = config_from_argv(["--device-trace", trace_file])
    assert cfg.delays == {"device_trace": trace_file}
    cap = write_pickle(tmp_path, {1: {"computation": 5.0, "communication": 1000.0}}, "cap")
    cfg = config_from_argv(["--device-capacity", cap, "--device-behavior", cap, "--set", "delays.model_mb=2"])
    assert cfg.delays == {"fedscale_capacity": cap, "fedscale_behavior": cap, "model_mb": 2}
    for argv, match in ((["--device-trace", trace_file, "--speed", "constant"], "--speed cannot be combined"),
                        (["--device-behavior", cap], "needs --device-capacity"),
                        (["--device-trace", trace_file, "--device-capacity", cap], "cannot be combined with")):
        with pytest.raises(ConfigError, match=match):
            config_from_argv(argv)
    custom = write_json(tmp_path, {"delays": {"speed": "constant"}}, "exp.json")
    with pytest.raises(ConfigError, match=r"would ignore the delays section"):
        config_from_argv(["--config", custom, "--device-trace", trace_file])
    assert math.isfinite(load_device_trace(trace_file).compute.sum())
