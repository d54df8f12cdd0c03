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
]
