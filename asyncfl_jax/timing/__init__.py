"""Virtual time for asynchronous FL: delay models, arrival protocols and the resulting :class:`Schedule`."""

from asyncfl_jax.timing.delays import COMBINES, NOISES, SPEEDS, DelayModel, JobDurations, counter_uniforms
from asyncfl_jax.timing.protocols import (
    PROTOCOLS,
    REFILLS,
    all_active,
    client_speeds,
    concurrent,
    job_durations_table,
    make_schedule,
    synchronous,
)
from asyncfl_jax.timing.schedule import Schedule
from asyncfl_jax.timing.stats import (
    concurrency_profile,
    max_concurrency,
    participation_counts,
    schedule_summary,
    staleness_histogram,
)

__all__ = [
    "COMBINES",
    "NOISES",
    "PROTOCOLS",
    "REFILLS",
    "SPEEDS",
    "DelayModel",
    "JobDurations",
    "Schedule",
    "all_active",
    "client_speeds",
    "concurrency_profile",
    "concurrent",
    "counter_uniforms",
    "job_durations_table",
    "make_schedule",
    "max_concurrency",
    "participation_counts",
    "schedule_summary",
    "staleness_histogram",
    "synchronous",
]
