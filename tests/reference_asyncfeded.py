"""An independent, plain numpy float64 event-by-event reference for AsyncFedED with its own event clock.

AsyncFedED (Wang et al., arXiv 2205.13797, Eq. 5-8) changes how long jobs take: a client's number of local steps
``K_i`` is adapted after each of its uploads, and a job of ``K`` steps lasts ``comm + (K / nominal_steps) * compute``.
So the arrival order depends on the training itself and cannot come from a pre-sampled :class:`Schedule`; this module
runs its own discrete-event loop. It shares with the package only the timing helpers (:func:`job_durations_table`,
:func:`suspension_table`, :func:`dropped_clients`), so that a job's base duration, a suspension and the set of dropped
clients are the same draws the package's protocols use. The model and local training are tests/reference.py's.

Rules (all clients always active, one arrival per server step):

* Time 0: every client ``i`` starts a job from ``x_0`` (version 0) with ``K_i = initial_steps``, in client-id order.
* Job ``k`` of client ``i`` (``k`` counts that client's jobs in start order, lost ones included) started with ``K``
  local steps lasts ``comm + (K / nominal_steps) * (d_ik - comm)``, with ``d_ik = table.durations(i, k)`` and
  ``comm = delays.comm_time``; exactly ``d_ik`` when ``K == nominal_steps``.
* Events are processed in order of ``(time, kind, client id)``, kinds at equal times: dropout (0), arrival (1),
  return from suspension (2) (then in creation order, for a client arriving twice at one instant).
* Arrival of client ``i`` at time ``a`` is server step ``t``. Its job started from ``x_v`` with ``K`` steps:
  ``delta = local_delta(model, x_v, data_i, K, client_lr)``; ``gamma = ||x_t - x_v|| / ||delta||``;
  ``eta = lam / (gamma + epsilon)``; ``x_{t+1} = x_t + eta * delta``; if ``adaptive``,
  ``K_i <- clip(K_i + R(kappa * (target_staleness - gamma)), min_steps, max_steps)`` with ``R`` = floor or
  truncation toward zero. If ``||delta|| < 1e-12`` the step changes nothing (``x_{t+1} = x_t``, ``K_i`` unchanged;
  recorded with ``gamma = nan``, ``eta = 0``).
* Then: a dropped client with ``a >= dropout_time`` leaves for good; else if the suspension after its ``u``-th upload
  is not ``nan`` it returns at ``a + L`` and starts a job from the model current then (every arrival at a time
  ``<= a + L`` applied) with its current ``K_i``; else it starts a job at ``a`` from ``x_{t+1}`` (version ``t+1``).
* Dropout at ``dropout_time`` (when some client is dropped and the time is finite): a dropped client's job in flight
  that would finish after it is lost; a dropped client that is suspended never returns.
* The loop stops right after step ``num_steps - 1`` is applied: the last arriving client's next job is not started
  (as in the package's schedules, whose dispatch rows stop at version ``num_steps - 1``).
"""

from __future__ import annotations

import heapq
import math

import numpy as np

from asyncfl_jax.timing.protocols import dropped_clients, job_durations_table, suspension_table
from reference import LogReg, local_delta

DROPOUT, ARRIVAL, RETURN = 0, 1, 2
ZERO_DELTA = 1e-12

RESULT_KEYS = ("x", "models", "clients", "versions", "arrival_times", "gamma", "eta", "steps_used", "K",
               "job_clients", "job_versions", "job_times", "job_steps", "job_index")


def _round(value: float, rounding: str) -> int:
    if rounding == "floor":
        return int(math.floor(value))
    if rounding == "trunc":
        return int(math.trunc(value))
    raise ValueError(f"rounding must be 'floor' or 'trunc', got {rounding!r}")


def asyncfeded_reference(model: LogReg, client_data, x0: np.ndarray, num_clients: int, num_steps: int, delays,
                         timing_seed: int, *, nominal_steps: int, client_lr: float, lam: float, epsilon: float,
                         target_staleness: float, kappa: float, initial_steps: int, max_steps: int,
                         min_steps: int = 1, adaptive: bool = True, rounding: str = "floor") -> dict:
    """Runs AsyncFedED for ``num_steps`` server steps (see the module docstring) and returns a dict of numpy arrays:

    * ``x`` float64 [d]: the final model ``x_T``; ``models`` float64 [T+1, d]: ``x_0 .. x_T``;
    * per step ``t`` (arrays [T]): ``clients`` (int64, the arriving client), ``versions`` (int64, the version its job
      started from), ``arrival_times`` (float64), ``gamma`` and ``eta`` (float64; nan and 0 for a zero delta),
      ``steps_used`` (int64, the K the job ran);
    * ``K`` int64 [T, n]: every client's K after step t (after the update of the arriving client's K);
    * every job started, in start order (arrays [J]): ``job_clients``, ``job_versions`` (0 at time 0, ``t+1`` after
      step ``t``, the number of steps applied when it started after a suspension), ``job_times`` (start times),
      ``job_steps`` (its K) and ``job_index`` (``k``: the client's job counter used for its duration). Lost jobs (of
      dropped clients) are included; jobs need not arrive in the order of this list.
    """
    _round(0.0, rounding)  # validates rounding
    n, T = int(num_clients), int(num_steps)
    if not (1 <= min_steps <= max_steps):
        raise ValueError(f"need 1 <= min_steps <= max_steps, got {min_steps}, {max_steps}")
    comm = float(delays.comm_time)
    table = job_durations_table(n, delays, timing_seed)
    susp = suspension_table(n, delays, timing_seed) if delays.suspension_prob > 0 else None
    dropped = set(dropped_clients(n, delays, timing_seed).tolist())
    drop_time = float(delays.dropout_time)

    x = np.array(x0, dtype=np.float64)
    models = [x.copy()]  # models[v] = x_v (the GMIS)
    K = [int(initial_steps)] * n
    job_count = [0] * n
    uploads = [0] * n
    gone = [False] * n
    suspended = [False] * n
    current = [None] * n  # the job in flight: (version, K, job id, finish time)
    jobs: list[tuple[int, int, float, int, int]] = []
    heap: list[tuple[float, int, int, int]] = []  # (time, kind, client, sequence number)
    seq = 0

    def push(time: float, kind: int, c: int) -> None:
        nonlocal seq
        heapq.heappush(heap, (time, kind, c, seq))
        seq += 1

    def start(c: int, time: float) -> None:
        k = job_count[c]
        job_count[c] = k + 1
        d = float(table.durations(c, k))
        steps = K[c]
        duration = d if steps == nominal_steps else comm + (steps / nominal_steps) * (d - comm)
        version = len(models) - 1
        current[c] = (version, steps, len(jobs), time + duration)
        jobs.append((c, version, time, steps, k))
        push(time + duration, ARRIVAL, c)

    for c in range(n):
        start(c, 0.0)
    if dropped and math.isfinite(drop_time):
        push(drop_time, DROPOUT, -1)

    rec = {k: [] for k in ("clients", "versions", "arrival_times", "gamma", "eta", "steps_used", "K")}
    t = 0
    while t < T:
        if not heap:
            raise ValueError(f"no event left after {t} steps")
        time, kind, c, _ = heapq.heappop(heap)
        if kind == DROPOUT:
            for c2 in dropped:
                if current[c2] is None:  # suspended (in this protocol a live client is never idle): never returns
                    gone[c2] = True
                elif current[c2][3] > drop_time:  # its job is lost: the arrival event is ignored below
                    current[c2] = None
                    gone[c2] = True
                # else its job finishes exactly at the dropout time: it arrives, then leaves
            continue
        if kind == RETURN:
            if gone[c] or not suspended[c]:
                continue
            suspended[c] = False
            start(c, time)
            continue
        # An arrival: ignore it if its job was lost at the dropout.
        if current[c] is None or current[c][3] != time:
            continue
        version, steps, _, _ = current[c]
        current[c] = None
        start_model = models[version]
        delta = local_delta(model, start_model, client_data[c], steps, client_lr)
        norm = float(np.linalg.norm(delta))
        if norm < ZERO_DELTA:
            gamma, eta = math.nan, 0.0
        else:
            gamma = float(np.linalg.norm(x - start_model)) / norm
            eta = lam / (gamma + epsilon)
            x = x + eta * delta
            if adaptive:
                K[c] = int(min(max(K[c] + _round(kappa * (target_staleness - gamma), rounding), min_steps),
                               max_steps))
        models.append(x.copy())
        for key, value in (("clients", c), ("versions", version), ("arrival_times", time), ("gamma", gamma),
                           ("eta", eta), ("steps_used", steps), ("K", list(K))):
            rec[key].append(value)
        t += 1
        u = uploads[c]
        uploads[c] = u + 1
        if t == T:
            break
        if c in dropped and time >= drop_time:
            gone[c] = True
            continue
        length = float(susp.lengths(c, u)) if susp is not None else math.nan
        if not math.isnan(length):
            suspended[c] = True
            push(time + length, RETURN, c)
        else:
            start(c, time)

    job_arrays = list(zip(*jobs)) if jobs else [(), (), (), (), ()]
    return {
        "x": x,
        "models": np.stack(models),
        "clients": np.asarray(rec["clients"], dtype=np.int64),
        "versions": np.asarray(rec["versions"], dtype=np.int64),
        "arrival_times": np.asarray(rec["arrival_times"], dtype=np.float64),
        "gamma": np.asarray(rec["gamma"], dtype=np.float64),
        "eta": np.asarray(rec["eta"], dtype=np.float64),
        "steps_used": np.asarray(rec["steps_used"], dtype=np.int64),
        "K": np.asarray(rec["K"], dtype=np.int64).reshape(T, n),
        "job_clients": np.asarray(job_arrays[0], dtype=np.int64),
        "job_versions": np.asarray(job_arrays[1], dtype=np.int64),
        "job_times": np.asarray(job_arrays[2], dtype=np.float64),
        "job_steps": np.asarray(job_arrays[3], dtype=np.int64),
        "job_index": np.asarray(job_arrays[4], dtype=np.int64),
    }
