"""Virtual time for asynchronous FL: delay models, arrival protocols and the resulting :class:`Schedule`."""

from asyncfl_jax.timing.delays import (
    COMBINES,
    NOISES,
    SPEEDS,
    DelayModel,
    JobDurations,
    Suspensions,
    counter_uniforms,
)
from asyncfl_jax.timing.protocols import (
    AGGREGATIONS,
    PROTOCOLS,
    REFILLS,
    all_active,
    client_speeds,
    concurrent,
    dropped_clients,
    job_durations_table,
    make_schedule,
    suspension_table,
    synchronous,
)
from asyncfl_jax.timing.schedule import Schedule
from asyncfl_jax.timing.stats import (
    concurrency_profile,
    max_concurrency,
    num_suspensions,
    participation_counts,
    schedule_summary,
    staleness_histogram,
)
from asyncfl_jax.timing.client_delays import client_delays, delay_statistics
from asyncfl_jax.timing.horizon import build_past, cut_at_horizon, steps_within
from asyncfl_jax.timing.padding import pad_to_common_widths
from asyncfl_jax.timing.rates import PoissonRates, client_rates, draw_rates, poisson_delays, rates_info
from asyncfl_jax.timing.rounds import wait_rounds
from asyncfl_jax.timing.window import window_schedule
from asyncfl_jax.timing.traces import DeviceTrace, TraceDelays, load_device_trace, load_fedscale_traces

__all__ = [
    "AGGREGATIONS",
    "COMBINES",
    "NOISES",
    "PROTOCOLS",
    "REFILLS",
    "SPEEDS",
    "DelayModel",
    "JobDurations",
    "Schedule",
    "Suspensions",
    "all_active",
    "client_speeds",
    "concurrency_profile",
    "concurrent",
    "counter_uniforms",
    "dropped_clients",
    "job_durations_table",
    "make_schedule",
    "max_concurrency",
    "num_suspensions",
    "participation_counts",
    "schedule_summary",
    "staleness_histogram",
    "suspension_table",
    "synchronous",
    "PoissonRates",
    "build_past",
    "client_delays",
    "client_rates",
    "cut_at_horizon",
    "delay_statistics",
    "draw_rates",
    "pad_to_common_widths",
    "poisson_delays",
    "rates_info",
    "steps_within",
    "wait_rounds",
    "window_schedule",
    "DeviceTrace",
    "TraceDelays",
    "load_device_trace",
    "load_fedscale_traces",
]
