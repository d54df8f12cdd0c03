"""Device traces as a delay model: per-device compute speed, network bandwidth and on/off availability.

A :class:`DeviceTrace` is a table of devices; each has

* a compute speed: seconds per local step (``seconds_per_step``) or per training example (``seconds_per_example``);
* a network speed: upload and download bandwidth in MB/s (1 MB = 10^6 bytes);
* optionally, availability: on-windows ``[start, end)`` in seconds, repeating with a ``period`` (or not at all).

:class:`TraceDelays` turns it into the timing of a run. Client ``i`` is mapped to a device by a seeded draw
(:func:`assign_devices`) and every job of client ``i`` takes::

    duration_i = work x compute_i + model_mb / upload_i + model_mb / download_i
    work = steps_per_job                         (seconds per step)
    work = steps_per_job x examples_per_step     (seconds per example)

A client is dispatched only while it is on (``start <= t < end`` of one of its windows); a job whose result would
arrive after its client's window ends is discarded when the window ends (a result arriving exactly at ``end`` is
kept), its slot released with the current step's and the job replaced by one of an available idle client, the
semantics of a dropout (:class:`~asyncfl_jax.timing.policies.Availability`); the client comes back at the start of its
next window. The protocols read it through :class:`~asyncfl_jax.timing.policies.Availability` (``windows``).

Two file formats (users download or write the files; nothing is downloaded here):

* :func:`load_device_trace`: a documented CSV or JSON of one's own (see docs/simulator.md, "Device traces");
* :func:`load_fedscale_traces`: FedScale's ``client_device_capacity`` and ``client_behave_trace`` pickles, read with a
  restricted unpickler (:func:`read_plain_pickle`) and converted with FedScale's own arithmetic
  (``ClientMetadata.get_completion_time`` and ``ClientMetadata.is_active``, see :func:`fedscale_device`).
"""

from __future__ import annotations

import csv
import dataclasses
import hashlib
import io
import json
import math
import numbers
import os
import pickle
from typing import Any, Iterator, Mapping, Sequence

import numpy as np

from asyncfl_jax.timing.seeds import timing_rng

TRACE_KEYS = ("device_trace", "fedscale_capacity", "fedscale_behavior")
"""Keys of a ``delays`` dict that make it a trace delay model (see :func:`is_trace_config`)."""
CONFIG_KEYS = (*TRACE_KEYS, "model_mb")
FEDSCALE_AUGMENTATION = 3.0
"""FedScale's ``augmentation_factor``: a training step costs 3x the inference latency (forward + 2x backward)."""
FEDSCALE_KBIT_BYTES = 1024.0 / 8.0
"""Bytes per FedScale "kbit": its model size is ``sys.getsizeof(pickle.dumps(model)) / 1024.0 * 8.0``."""
CAPACITY_STREAM = 8  # timing stream of the client -> device draw (see asyncfl_jax.timing.streams)
BEHAVIOR_STREAM = 9  # ... and of the client -> availability-device draw when availability comes from its own file


class TraceError(ValueError):
    """A trace file that cannot be used; the message names the file, the field and what is allowed."""


# ---------------------------------------------------------------------- availability windows
@dataclasses.dataclass(frozen=True)
class Windows:
    """On-windows of one device: sorted, disjoint, non-touching half-open intervals ``[start, end)`` within
    ``[0, period]`` that repeat every ``period`` seconds (``period = inf``: they do not repeat; the device is off for
    good after the last one). ``Windows.always()`` is a device that is never off.

    The ``j``-th window of the repeating sequence (:meth:`window`) is computed as ``start + m * period`` with integer
    cycle ``m``, so consecutive events of one client are exact. A window ending at ``period`` followed by one starting
    at ``0`` is one window across the cycle boundary."""

    starts: tuple[float, ...]
    ends: tuple[float, ...]
    period: float = math.inf

    @classmethod
    def always(cls) -> "Windows":
        return cls((0.0,), (math.inf,), math.inf)

    @classmethod
    def from_intervals(cls, intervals: Sequence[tuple[float, float]], period: float, where: str) -> "Windows":
        """Normalizes ``[start, end]`` pairs (already checked: finite, ``0 <= start <= end``): clipped to
        ``[0, period]``, empty ones dropped, overlapping or touching ones merged. Raises :class:`TraceError` (naming
        ``where``) if nothing is left."""
        pairs = sorted((float(a), min(float(b), period)) for a, b in intervals if float(a) < min(float(b), period))
        merged: list[list[float]] = []
        for a, b in pairs:
            if merged and a <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], b)
            else:
                merged.append([a, b])
        if not merged:
            raise TraceError(f"{where}: no availability window of positive length within the period "
                             f"({period:g} s); a device must be on at some time")
        if merged[0][0] == 0.0 and merged[-1][1] == period:  # on for the whole period, or for ever
            if len(merged) == 1:
                return cls.always()
        return cls(tuple(a for a, _ in merged), tuple(b for _, b in merged), float(period))

    @property
    def is_always(self) -> bool:
        return self.starts == (0.0,) and self.ends == (math.inf,)

    def _wraps(self) -> bool:
        return math.isfinite(self.period) and len(self.starts) >= 2 and self.starts[0] == 0.0 \
            and self.ends[-1] == self.period

    def window(self, j: int) -> tuple[float, float]:
        """The ``j``-th on-window ``(start, end)`` in time order (``(inf, inf)``: none any more)."""
        k = len(self.starts)
        if not math.isfinite(self.period):
            return (self.starts[j], self.ends[j]) if j < k else (math.inf, math.inf)
        P = self.period
        if self._wraps():  # cycle m holds windows 1..k-2 and (starts[-1], P + ends[0]); window 0 is (0, ends[0])
            if j == 0:
                return 0.0, self.ends[0]
            m, i = divmod(j - 1, k - 1)
            if i == k - 2:
                return self.starts[-1] + m * P, (m + 1) * P + self.ends[0]
            return self.starts[i + 1] + m * P, self.ends[i + 1] + m * P
        m, i = divmod(j, k)
        return self.starts[i] + m * P, self.ends[i] + m * P

    def is_on(self, t: float) -> bool:
        """Whether the device is on at time ``t`` (``start <= t < end`` of a window); the reference definition,
        FedScale's ``ClientMetadata.is_active`` with half-open windows."""
        if math.isfinite(self.period):
            t = t % self.period
        return any(a <= t < b for a, b in zip(self.starts, self.ends))

    def to_list(self) -> dict[str, Any]:
        return {"windows": [[a, b] for a, b in zip(self.starts, self.ends) if math.isfinite(b)] or None,
                "period": self.period if math.isfinite(self.period) else None}


class ClientWindows:
    """The on-windows of each of ``n`` clients, walked in time order by the event loop: ``cursor[c]`` is the index of
    client ``c``'s current (or next) window."""

    def __init__(self, windows: Sequence[Windows]) -> None:
        self.windows = list(windows)
        self.cursor = [0] * len(self.windows)

    def current(self, c: int) -> tuple[float, float]:
        """Client ``c``'s current or next window ``(start, end)``."""
        return self.windows[c].window(self.cursor[c])

    def advance(self, c: int) -> tuple[float, float]:
        """Moves client ``c`` to its next window and returns it."""
        self.cursor[c] += 1
        return self.current(c)


# ---------------------------------------------------------------------- the table of devices
@dataclasses.dataclass(frozen=True)
class DeviceTrace:
    """Devices' speeds and availability (see the module docstring).

    Attributes:
      compute: float64 [D] seconds per ``unit`` of local work of each device.
      unit: ``"step"`` or ``"example"``.
      upload, download: float64 [D] bandwidth in MB/s.
      availability: per availability-device :class:`Windows`, or ``None`` (always on).
      joint: the availability of device ``d`` is ``availability[d]`` (one file); else availability devices are
        drawn for the clients separately (FedScale's two files).
      source: a description of where the trace came from (format, file names, SHA-256 of their bytes).
    """

    compute: np.ndarray
    unit: str
    upload: np.ndarray
    download: np.ndarray
    availability: tuple[Windows, ...] | None
    joint: bool
    source: dict[str, Any]

    @property
    def num_devices(self) -> int:
        return int(self.compute.shape[0])

    def describe(self) -> dict[str, Any]:
        return {**self.source, "devices": self.num_devices, "unit": self.unit,
                "availability_devices": None if self.availability is None else len(self.availability)}


def assign_devices(num_clients: int, num_devices: int, seed: int, stream: int = CAPACITY_STREAM) -> np.ndarray:
    """int64 [n]: the device of each client, a seeded draw: concatenated independent random permutations of the
    ``D`` devices (``timing_rng(seed, stream).permutation(D)``, as many as ``ceil(n / D)``), the first ``n`` entries.
    So clients get distinct devices when ``n <= D``, and each device serves ``floor(n / D)`` or ``ceil(n / D)``
    clients otherwise."""
    rng = timing_rng(seed, stream)
    rounds = -(-num_clients // num_devices)
    return np.concatenate([rng.permutation(num_devices) for _ in range(rounds)])[:num_clients].astype(np.int64)


# ---------------------------------------------------------------------- the delay model
@dataclasses.dataclass(frozen=True)
class TraceDelays:
    """A delay model read from device traces (see the module docstring): what ``make_schedule``/``simulate`` take
    as ``delays`` in place of a :class:`~asyncfl_jax.timing.delays.DelayModel`.

    Attributes:
      trace: the devices.
      steps_per_job: local steps of one job (``LocalConfig.steps``).
      model_mb: the model's size on the wire in MB (each way); e.g. ``task.num_params * 4 / 1e6`` for float32.
      examples_per_step: examples per local step (the minibatch size); required by a per-example trace, refused by a
        per-step one.
    """

    trace: DeviceTrace
    steps_per_job: int
    model_mb: float
    examples_per_step: int | None = None

    def __post_init__(self) -> None:
        if isinstance(self.steps_per_job, bool) or not isinstance(self.steps_per_job, numbers.Integral) \
                or self.steps_per_job < 1:
            raise ValueError(f"steps_per_job must be an integer >= 1, got {self.steps_per_job!r}")
        if isinstance(self.model_mb, bool) or not isinstance(self.model_mb, numbers.Real) \
                or not math.isfinite(self.model_mb) or self.model_mb < 0:
            raise ValueError(f"model_mb must be a finite number >= 0 (MB each way), got {self.model_mb!r}")
        if self.trace.unit == "example":
            e = self.examples_per_step
            if isinstance(e, bool) or not isinstance(e, numbers.Integral) or e < 1:
                raise ValueError(f"the trace gives seconds per example: examples_per_step (the minibatch size) must "
                                 f"be an integer >= 1, got {e!r}")
        elif self.examples_per_step is not None:
            raise ValueError(f"the trace gives seconds per step: examples_per_step={self.examples_per_step!r} would "
                             "be ignored; leave it out")

    @property
    def work(self) -> float:
        """Units of local work of one job: steps, or steps x examples per step."""
        return float(self.steps_per_job * (self.examples_per_step if self.trace.unit == "example" else 1))

    def devices(self, num_clients: int, seed: int) -> np.ndarray:
        """int64 [n]: each client's device (:func:`assign_devices` with stream 8)."""
        return assign_devices(num_clients, self.trace.num_devices, seed, CAPACITY_STREAM)

    def availability_devices(self, num_clients: int, seed: int) -> np.ndarray | None:
        """int64 [n]: each client's availability device (the same as :meth:`devices` for one file; a separate draw,
        stream 9, for FedScale's behaviour file), or ``None`` without availability."""
        windows = self.trace.availability
        if windows is None:
            return None
        if self.trace.joint:
            return self.devices(num_clients, seed)
        return assign_devices(num_clients, len(windows), seed, BEHAVIOR_STREAM)

    def client_durations(self, num_clients: int, seed: int) -> np.ndarray:
        """float64 [n]: every job's duration per client, ``work x compute + model_mb / upload + model_mb /
        download`` of its device."""
        d = self.devices(num_clients, seed)
        t = self.trace
        return self.work * t.compute[d] + self.model_mb / t.upload[d] + self.model_mb / t.download[d]

    def client_windows(self, num_clients: int, seed: int) -> ClientWindows | None:
        """Each client's availability windows, or ``None`` if every device is always on."""
        d = self.availability_devices(num_clients, seed)
        if d is None:
            return None
        windows = [self.trace.availability[int(i)] for i in d]
        if all(w.is_always for w in windows):
            return None
        return ClientWindows(windows)

    def to_dict(self) -> dict[str, Any]:
        """The description written into a schedule's ``info["delays"]`` (JSON-friendly)."""
        return {"kind": "device_trace", **self.trace.describe(), "steps_per_job": int(self.steps_per_job),
                "examples_per_step": self.examples_per_step, "model_mb": float(self.model_mb)}

    def schedule_info(self, num_clients: int, seed: int) -> dict[str, Any]:
        """Entries of a schedule's ``info``: the client -> device mapping (the event loop adds
        ``offline_discards``, the times at which jobs were discarded because their client went offline)."""
        info: dict[str, Any] = {"trace_devices": self.devices(num_clients, seed).tolist()}
        avail = self.availability_devices(num_clients, seed)
        if avail is not None and not self.trace.joint:
            info["trace_availability_devices"] = avail.tolist()
        return info


class TraceDurations:
    """The :class:`~asyncfl_jax.timing.delays.JobDurations` interface for traces: every job of client ``i`` takes
    ``per_client[i]`` (no per-job noise)."""

    def __init__(self, per_client: np.ndarray) -> None:
        self.per_client = np.asarray(per_client, dtype=np.float64)

    def durations(self, clients: np.ndarray, jobs: np.ndarray) -> np.ndarray:
        clients, jobs = np.broadcast_arrays(np.asarray(clients, dtype=np.int64), np.asarray(jobs, dtype=np.int64))
        return self.per_client[clients]

    compute_times = durations

    def block(self, clients: np.ndarray, first_job: int, count: int) -> np.ndarray:
        clients = np.asarray(clients, dtype=np.int64)
        return np.repeat(self.per_client[clients][:, None], count, axis=1)


# ---------------------------------------------------------------------- checks shared by the readers
def _number(value: Any, where: str, field: str, positive: bool = True) -> float:
    """``value`` as a finite float (> 0 when ``positive``, else >= 0); :class:`TraceError` naming the field."""
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            pass
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(float(value)) \
            or not (value > 0 if positive else value >= 0):
        allowed = "a finite number > 0" if positive else "a finite number >= 0"
        raise TraceError(f"{where}: field {field!r} must be {allowed}, got {value!r}")
    return float(value)


def _digest(path: str) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def _read_bytes(path: Any, what: str) -> bytes:
    if not isinstance(path, (str, os.PathLike)):
        raise TraceError(f"{what} must be a file name, got {path!r}")
    if os.path.isdir(path):
        raise TraceError(f"{what} {os.fspath(path)!r} is a folder; give the file")
    try:
        with open(path, "rb") as f:
            return f.read()
    except FileNotFoundError:
        raise TraceError(f"{what} {os.fspath(path)!r} does not exist") from None
    except OSError as e:
        raise TraceError(f"{what} {os.fspath(path)!r} cannot be read: {e.strerror or e}") from None


# ---------------------------------------------------------------------- format (a): CSV or JSON of one's own
DEVICE_FIELDS = ("name", "seconds_per_step", "seconds_per_example", "upload_mb_per_s", "download_mb_per_s",
                 "availability", "period")


def _parse_windows(text: str, where: str) -> list[tuple[float, float]]:
    """``"0:3600;7200:10800"`` -> ``[(0, 3600), (7200, 10800)]`` (the CSV form of ``availability``)."""
    pairs = []
    for part in text.replace(" ", ";").split(";"):
        if not part.strip():
            continue
        if part.count(":") != 1:
            raise TraceError(f"{where}: field 'availability' must be windows 'start:end' separated by ';' (seconds), "
                             f"got {part!r}")
        a, b = part.split(":")
        pairs.append((a.strip(), b.strip()))
    if not pairs:
        raise TraceError(f"{where}: field 'availability' holds no window; leave it empty for an always-available "
                         "device")
    return pairs


def _device_windows(raw: Any, period: Any, where: str) -> Windows:
    if isinstance(raw, str):
        raw = _parse_windows(raw, where)
    if not isinstance(raw, (list, tuple)) or not raw:
        raise TraceError(f"{where}: field 'availability' must be a non-empty list of [start, end] windows in seconds "
                         f"(omit it for an always-available device), got {raw!r}")
    P = math.inf if period is None or period == "" else _number(period, where, "period")
    intervals = []
    for k, pair in enumerate(raw):
        if not isinstance(pair, (list, tuple)) or len(pair) != 2:
            raise TraceError(f"{where}: availability window {k} must be a pair [start, end], got {pair!r}")
        a = _number(pair[0], where, f"availability[{k}] start", positive=False)
        b = _number(pair[1], where, f"availability[{k}] end", positive=False)
        if b < a:
            raise TraceError(f"{where}: availability window {k} ends before it starts ([{a:g}, {b:g}])")
        if a > P:
            raise TraceError(f"{where}: availability window {k} starts at {a:g} s, after the period {P:g} s")
        intervals.append((a, b))
    return Windows.from_intervals(intervals, P, where)


def _devices_from_rows(rows: list[dict[str, Any]], path: str, default_period: Any) -> DeviceTrace:
    name = os.path.basename(os.fspath(path))
    if not rows:
        raise TraceError(f"device trace {name!r}: no device (one row or entry per device is required)")
    compute, up, down, windows = [], [], [], []
    for i, row in enumerate(rows):
        where = f"device trace {name!r}, device {i}" + (f" ({row['name']!r})" if row.get("name") else "")
        unknown = [k for k in row if k not in DEVICE_FIELDS]
        if unknown:
            raise TraceError(f"{where}: unknown field {unknown[0]!r}; allowed fields are {list(DEVICE_FIELDS)}")
        has_step = row.get("seconds_per_step") not in (None, "")
        has_example = row.get("seconds_per_example") not in (None, "")
        if has_step == has_example:
            raise TraceError(f"{where}: give exactly one of the fields 'seconds_per_step' and 'seconds_per_example' "
                             "(the compute speed)")
        compute.append(_number(row["seconds_per_step" if has_step else "seconds_per_example"], where,
                               "seconds_per_step" if has_step else "seconds_per_example"))
        for field, out in (("upload_mb_per_s", up), ("download_mb_per_s", down)):
            if row.get(field) in (None, ""):
                raise TraceError(f"{where}: field {field!r} is missing (bandwidth in MB/s, > 0)")
            out.append(_number(row[field], where, field))
        period = row.get("period") if row.get("period") not in (None, "") else default_period
        if row.get("availability") in (None, ""):
            if row.get("period") not in (None, ""):
                raise TraceError(f"{where}: field 'period' would be ignored without 'availability'")
            windows.append(Windows.always())
        else:
            windows.append(_device_windows(row["availability"], period, where))
    units = {"step" if row.get("seconds_per_step") not in (None, "") else "example" for row in rows}
    if len(units) != 1:
        raise TraceError(f"device trace {name!r}: all devices must give 'seconds_per_step', or all "
                         "'seconds_per_example', not a mix")
    unit = units.pop()
    if default_period is not None and not any(row.get("availability") not in (None, "") for row in rows):
        raise TraceError(f"device trace {name!r}: field 'period' would be ignored: no device has 'availability'")
    availability = None if all(w.is_always for w in windows) else tuple(windows)
    return DeviceTrace(np.asarray(compute), unit, np.asarray(up), np.asarray(down), availability, True,
                       {"format": "asyncfl_jax", "file": name, "sha256": _digest(path)})


def load_device_trace(path: str | os.PathLike) -> DeviceTrace:
    """Reads a device trace of this package's own format: ``.csv`` or ``.json`` (by the file's extension).

    JSON: ``{"period": 86400, "devices": [{"name": "a", "seconds_per_step": 0.05, "upload_mb_per_s": 1.0,
    "download_mb_per_s": 5.0, "availability": [[0, 3600], [7200, 9000]]}, ...]}`` (``period`` optional, also per
    device; ``name`` optional; ``availability`` optional: always on). CSV: one row per device with a header of the
    same field names; ``availability`` as ``"0:3600;7200:9000"``. Every device gives ``seconds_per_step`` or every
    device ``seconds_per_example``. Errors name the file, the device and the field.
    """
    name = os.path.basename(os.fspath(path)) if isinstance(path, (str, os.PathLike)) else repr(path)
    data = _read_bytes(path, "device trace")
    ext = os.path.splitext(os.fspath(path))[1].lower()
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise TraceError(f"device trace {name!r} is not UTF-8 text (a CSV or JSON file is expected; FedScale's "
                         "pickles go to --device-capacity/--device-behavior)") from None
    if ext == ".json":
        try:
            raw = json.loads(text)
        except json.JSONDecodeError as e:
            raise TraceError(f"device trace {name!r} is not valid JSON: {e}") from None
        if not isinstance(raw, dict) or not isinstance(raw.get("devices"), list):
            raise TraceError(f"device trace {name!r}: the JSON must be an object with a list 'devices' "
                             "(and optionally 'period')")
        unknown = [k for k in raw if k not in ("devices", "period")]
        if unknown:
            raise TraceError(f"device trace {name!r}: unknown top-level field {unknown[0]!r}; allowed: "
                             "['devices', 'period']")
        if not all(isinstance(d, dict) for d in raw["devices"]):
            raise TraceError(f"device trace {name!r}: every entry of 'devices' must be an object")
        return _devices_from_rows(raw["devices"], path, raw.get("period"))
    if ext == ".csv":
        reader = csv.DictReader(io.StringIO(text))
        if reader.fieldnames is None:
            raise TraceError(f"device trace {name!r} is empty (a header row and one row per device are expected)")
        unknown = [k for k in reader.fieldnames if k not in DEVICE_FIELDS]
        if unknown:
            raise TraceError(f"device trace {name!r}: unknown column {unknown[0]!r}; allowed columns are "
                             f"{list(DEVICE_FIELDS)}")
        rows = [{k: (v.strip() if isinstance(v, str) else v) for k, v in row.items()} for row in reader]
        for i, row in enumerate(rows):
            if None in row:
                raise TraceError(f"device trace {name!r}, device {i}: more values than columns")
        return _devices_from_rows(rows, path, None)
    raise TraceError(f"device trace {name!r}: the file name must end in .csv or .json (the format is read from it)")


# ---------------------------------------------------------------------- format (b): FedScale's pickles
class _PlainUnpickler(pickle.Unpickler):
    """Builds only what pickle's own opcodes build (dict, list, tuple, set, str, bytes, int, float, bool, None) and
    numpy scalars; any other global (a class, a function: the way a pickle runs code) is refused."""

    ALLOWED = {("numpy.core.multiarray", "scalar"), ("numpy._core.multiarray", "scalar"), ("numpy", "dtype")}

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in self.ALLOWED:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"refused to load {module}.{name}: only plain containers and numbers are "
                                     "allowed in a trace file")


def read_plain_pickle(path: str | os.PathLike, what: str) -> Any:
    """Unpickles ``path`` allowing only plain containers and numbers (:class:`_PlainUnpickler`).

    Unpickling an untrusted file can run arbitrary code; this reader refuses every class and function, so a
    file that needs one fails with :class:`TraceError` instead. Still, read only files from a source you trust.
    """
    data = _read_bytes(path, what)
    name = os.path.basename(os.fspath(path))
    try:
        return _PlainUnpickler(io.BytesIO(data)).load()
    except pickle.UnpicklingError as e:
        if str(e).startswith("refused to load"):
            raise TraceError(f"{what} {name!r} is not a plain pickle of dicts and numbers: {e}") from None
        raise TraceError(f"{what} {name!r} cannot be read as a pickle ({e}); FedScale's trace files are pickles, "
                         "a CSV or JSON trace of your own goes to --device-trace (delays.device_trace)") from None
    except (EOFError, ValueError, TypeError, AttributeError, IndexError, KeyError, ImportError,
            UnicodeDecodeError, OverflowError, MemoryError) as e:
        raise TraceError(f"{what} {name!r} cannot be read as a pickle: {type(e).__name__}: {e}") from None


def _sorted_keys(d: Mapping[Any, Any]) -> list[Any]:
    """The dict's keys in a deterministic order (numbers first by value, then the rest by their text)."""
    return sorted(d, key=lambda k: (0, float(k), "") if isinstance(k, numbers.Real) and not isinstance(k, bool)
                  else (1, 0.0, str(k)))


def fedscale_device(entry: Any, where: str) -> tuple[float, float]:
    """One entry of ``client_device_capacity`` -> ``(seconds per example, MB/s)``.

    FedScale's ``ClientMetadata.get_completion_time(batch_size, local_steps, upload_size, download_size)`` gives
    ``computation = 3.0 * batch_size * local_steps * computation_ms / 1000`` seconds (``computation`` is the inference
    latency in ms per sample; the factor 3 counts the backward pass) and ``communication = (upload_size +
    download_size) / communication`` seconds with sizes in kbit (``Aggregator.run``: ``sys.getsizeof(pickle.dumps(
    model)) / 1024.0 * 8.0``), i.e. ``communication`` is a bandwidth in kbit/s of 1024/8 bytes. So a device takes
    ``3 * computation / 1000`` seconds per example and moves ``communication * 128 / 10^6`` MB/s each way.
    """
    if not isinstance(entry, Mapping):
        raise TraceError(f"{where}: must be a dict with 'computation' and 'communication', got {type(entry).__name__}")
    for field in ("computation", "communication"):
        if field not in entry:
            raise TraceError(f"{where}: field {field!r} is missing (FedScale's layout: {{'computation': ms per "
                             "sample, 'communication': kbit/s}})")
    ms = _number(entry["computation"], where, "computation")
    kbit_s = _number(entry["communication"], where, "communication")
    return FEDSCALE_AUGMENTATION * ms / 1000.0, kbit_s * FEDSCALE_KBIT_BYTES / 1e6


def fedscale_windows(entry: Any, where: str) -> Windows:
    """One entry of ``client_behave_trace`` -> :class:`Windows`.

    FedScale's ``ClientMetadata.is_active(cur_time)`` takes ``norm_time = cur_time % finish_time`` and calls the
    client active iff ``active[i] <= norm_time <= inactive[i]`` for its current ``i``: the windows ``[active[i],
    inactive[i]]`` repeat every ``finish_time`` seconds. Here they are half-open ``[active, inactive)`` (a result
    arriving exactly at ``inactive`` still counts; no job starts there), clipped to ``[0, finish_time]`` (parts after
    ``finish_time`` are never reached by ``norm_time``). ``duration`` and ``model`` are not used.
    """
    if not isinstance(entry, Mapping):
        raise TraceError(f"{where}: must be a dict with 'active', 'inactive' and 'finish_time', got "
                         f"{type(entry).__name__}")
    for field in ("active", "inactive", "finish_time"):
        if field not in entry:
            raise TraceError(f"{where}: field {field!r} is missing (FedScale's layout: {{'active': [s], 'inactive': "
                             "[s], 'finish_time': s, 'duration': s, 'model': str}})")
    active, inactive = entry["active"], entry["inactive"]
    for field, value in (("active", active), ("inactive", inactive)):
        if not isinstance(value, (list, tuple)):
            raise TraceError(f"{where}: field {field!r} must be a list of times in seconds, got {value!r}")
    if len(active) != len(inactive) or not active:
        raise TraceError(f"{where}: fields 'active' and 'inactive' must be non-empty lists of the same length, got "
                         f"{len(active)} and {len(inactive)}")
    period = _number(entry["finish_time"], where, "finish_time")
    pairs = []
    for k, (a, b) in enumerate(zip(active, inactive)):
        a = _number(a, where, f"active[{k}]", positive=False)
        b = _number(b, where, f"inactive[{k}]", positive=False)
        if b < a:
            raise TraceError(f"{where}: inactive[{k}] = {b:g} is before active[{k}] = {a:g}")
        pairs.append((a, b))
    return Windows.from_intervals(pairs, period, where)


def load_fedscale_traces(capacity: str | os.PathLike, behavior: str | os.PathLike | None = None) -> DeviceTrace:
    """Reads FedScale's ``client_device_capacity`` (``{client_id: {'computation': ms per sample, 'communication':
    kbit/s}}``, FedScale's ``Aggregator.load_client_profile``) and optionally ``client_behave_trace``
    (``{client_id: {'active': [...], 'inactive': [...], 'finish_time': ..., 'duration': ..., 'model': ...}}``,
    ``ClientManager.__init__``), both pickles, as published in FedScale's ``benchmark/dataset/data/device_info``.

    The devices are the dict's entries in key order; clients are drawn onto them by :func:`assign_devices` (FedScale
    itself maps its ``k``-th client to key ``(k + 1) % len(profiles)`` of the capacities and to the
    ``client_id % len(trace)``-th key of the behaviour trace; a seeded draw replaces both). The files are read with
    :func:`read_plain_pickle` (no class or function is ever loaded).
    """
    cap = read_plain_pickle(capacity, "FedScale device-capacity file")
    cap_name = os.path.basename(os.fspath(capacity))
    if not isinstance(cap, Mapping) or not cap:
        raise TraceError(f"FedScale device-capacity file {cap_name!r} must hold a non-empty dict {{client_id: "
                         f"{{'computation': ..., 'communication': ...}}}}, got {type(cap).__name__}")
    compute, bandwidth = [], []
    for key in _sorted_keys(cap):
        seconds, mb_s = fedscale_device(cap[key], f"FedScale device-capacity file {cap_name!r}, client {key!r}")
        compute.append(seconds)
        bandwidth.append(mb_s)
    source = {"format": "fedscale", "capacity_file": cap_name, "capacity_sha256": _digest(capacity)}
    windows = None
    if behavior is not None:
        beh = read_plain_pickle(behavior, "FedScale behavior file")
        beh_name = os.path.basename(os.fspath(behavior))
        if not isinstance(beh, Mapping) or not beh:
            raise TraceError(f"FedScale behavior file {beh_name!r} must hold a non-empty dict {{client_id: "
                             f"{{'active': [...], 'inactive': [...], 'finish_time': ...}}}}, got {type(beh).__name__}")
        windows = tuple(fedscale_windows(beh[k], f"FedScale behavior file {beh_name!r}, client {k!r}")
                        for k in _sorted_keys(beh))
        source.update(behavior_file=beh_name, behavior_sha256=_digest(behavior))
        if all(w.is_always for w in windows):
            windows = None
    bw = np.asarray(bandwidth)
    return DeviceTrace(np.asarray(compute), "example", bw, bw.copy(), windows, False, source)


# ---------------------------------------------------------------------- the config / CLI form
def is_trace_config(delays: Any) -> bool:
    """Whether a ``delays`` dict (of a configuration) describes device traces (has a key of :data:`TRACE_KEYS`)."""
    return isinstance(delays, Mapping) and any(k in delays for k in TRACE_KEYS)


def check_trace_config(delays: Mapping[str, Any]) -> dict[str, str]:
    """The trace files a configuration's ``delays`` dict names (``{"device_trace": FILE}`` or ``{"fedscale_capacity":
    FILE, "fedscale_behavior": FILE}``, behaviour optional, plus ``model_mb``), checked without reading them. Raises
    ``ValueError`` naming the key for any other key or combination."""
    unknown = [k for k in delays if k not in CONFIG_KEYS]
    if unknown:
        raise ValueError(f"delays.{unknown[0]} cannot be combined with device traces (the trace gives every job's "
                         f"duration, so it would be ignored); allowed keys with a trace are {list(CONFIG_KEYS)}")
    config_model_mb(delays, 0)
    if "device_trace" in delays:
        both = [k for k in ("fedscale_capacity", "fedscale_behavior") if k in delays]
        if both:
            raise ValueError(f"delays.device_trace cannot be combined with delays.{both[0]}: give one trace format")
        return {"device_trace": _path(delays["device_trace"], "delays.device_trace")}
    if "fedscale_capacity" not in delays:
        raise ValueError("delays.fedscale_behavior needs delays.fedscale_capacity (the devices' speeds); give both "
                         "FedScale files")
    files = {"fedscale_capacity": _path(delays["fedscale_capacity"], "delays.fedscale_capacity")}
    if delays.get("fedscale_behavior") is not None:
        files["fedscale_behavior"] = _path(delays["fedscale_behavior"], "delays.fedscale_behavior")
    return files


def trace_from_config(delays: Mapping[str, Any]) -> DeviceTrace:
    """The :class:`DeviceTrace` a configuration's ``delays`` dict names (see :func:`check_trace_config`)."""
    files = check_trace_config(delays)
    if "device_trace" in files:
        return load_device_trace(files["device_trace"])
    return load_fedscale_traces(files["fedscale_capacity"], files.get("fedscale_behavior"))


def _path(value: Any, key: str) -> str:
    if not isinstance(value, str) or not value.strip() or "\x00" in value:
        raise ValueError(f"{key} must name a file, got {value!r}")
    return value


def config_model_mb(delays: Mapping[str, Any], num_params: int) -> float:
    """``delays.model_mb``, or the model's float32 size ``4 * num_params / 10^6`` MB when it is absent or null."""
    value = delays.get("model_mb")
    if value is None:
        return 4.0 * num_params / 1e6
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value) or value < 0:
        raise ValueError(f"delays.model_mb must be a finite number >= 0 (MB each way) or null (the model's float32 "
                         f"size), got {value!r}")
    return float(value)


def iter_windows(windows: Windows, until: float) -> Iterator[tuple[float, float]]:
    """The windows of ``windows`` that start before ``until`` (for plots and tests)."""
    j = 0
    while True:
        a, b = windows.window(j)
        if a >= until:
            return
        yield a, b
        j += 1


__all__ = ["ClientWindows", "DeviceTrace", "TraceDelays", "TraceDurations", "TraceError", "Windows",
           "assign_devices", "check_trace_config", "config_model_mb", "is_trace_config", "iter_windows", "load_device_trace",
           "load_fedscale_traces", "read_plain_pickle", "trace_from_config"]
