"""The package's error for bad input that the user can fix.

:class:`InputError` is raised for an invalid option (:class:`~asyncfl_jax.config.ConfigError`), a dataset file that
cannot be read (:class:`~asyncfl_jax.data.idx.IdxFormatError`, :class:`~asyncfl_jax.data.leaf.LeafFormatError`), a
partition the data cannot give (:class:`PartitionError`), a schedule file that is not one
(:class:`~asyncfl_jax.timing.schedule.ScheduleFileError`). It is a ``ValueError``; its message names what is wrong and
what to do. The ``asyncfl`` command ends with exit code 2 and that message for every one of them.
"""

from __future__ import annotations


class InputError(ValueError):
    """Bad input the user can fix (an option, a data or schedule file); the message says what and how."""


class ConfigError(InputError):
    """An invalid option: the message names the option, the value and what is allowed (also importable as
    ``asyncfl_jax.config.ConfigError``; defined here so that low modules, such as the output folder's, can raise it
    without importing the configuration)."""


class PartitionError(InputError):
    """The dataset cannot be split over the clients as asked (more clients than examples, a ``min_size`` or a number
    of shards the data cannot give)."""
