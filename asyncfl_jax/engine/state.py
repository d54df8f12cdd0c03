"""The host loop's state between two chunks (:class:`LoopState`): what :class:`~asyncfl_jax.engine.loop.HostLoop`
carries from chunk to chunk, what a checkpoint saves (:func:`asyncfl_jax.checkpoint.save`, as arrays under flat keys
and a JSON record, never pickled) and what the History is made of (:func:`~asyncfl_jax.engine.history.make_history`).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np


@dataclasses.dataclass
class LoopState:
    """The host loop's state after a whole number of chunks (what :func:`asyncfl_jax.checkpoint.save` writes and
    :func:`asyncfl_jax.checkpoint.load` returns)."""

    next_chunk: int
    eval_steps: list[int]
    metrics: dict[str, list[np.ndarray]]  # name -> one [R] array per evaluation
    reported: set[int]
    stopped_early: bool
    compile_seconds: float
    run_seconds: float
    carry: Any  # the carry pytree (device arrays when running; host arrays as loaded)
    traces: dict[str, list[np.ndarray]] = dataclasses.field(default_factory=dict)  # name -> [R, steps] per chunk
    checkpoint_seconds: float = 0.0  # wall time the loop waited for checkpoint saves (part of run_seconds)
