"""Replicas in groups: the chunk program of a group of replicas, called by the host once per group.

With ``replica_batch = g`` (``simulate``, config ``replica_batch``, CLI ``--replica-batch``) a chunk computes the
replicas ``g`` at a time: the host calls one compiled program, the vmapped chunk of ``g`` replicas, once per group of
``g`` replicas (the last one shorter when ``g`` does not divide ``R``); each call reads its group's slice of the whole
carry and of the per-replica inputs and writes the group's new carry back into the whole carry's buffers in place.
Each replica's arithmetic is that of the vmapped program of ``g`` replicas, so the results equal the plain vmap up to
float rounding (a batched matmul may sum in another order). The initialization (the first jobs, an initialization round) stays one vmapped program over
every replica: it runs once.

Why on a CPU (docs/benchmarks.md, "Replicas"): one replica's chunk already keeps the cores busy through the threading
of its larger operations, while a vmap over replicas turns its matmuls into batched small ones that run on one thread
and a working set that leaves the cache, so R vmapped replicas took 1.2-1.8x the time of the R replicas run one after
another (FedBuff, logistic regression and the MLP); a loop over the groups inside the program
(``lax.map(..., batch_size=g)``) lost the threading as well. Called from the host, a group runs the very program a
lone group would. Where a replica's step is small (ACE: one gradient of B = 32 examples per step) the vmap amortizes
the fixed cost of a step over the replicas and is faster than one by one, so the group size is chosen from the work
of a step (:func:`auto_replica_batch`): groups of about ``CPU_GROUP_FLOPS`` of local training per step.

On an accelerator the default stays the plain vmap (its width is what the replica axis fills).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

# On a CPU, replicas are grouped so that a group's local training per server step is about this many FLOPs: below
# it the vmap's savings on the per-step overhead win, above it the lost threading and cache do. Measured on 2 cores
# (docs/benchmarks.md, "Replicas"): FedBuff logistic regression (150 MFLOP per step) was fastest in groups of 4, the
# MLP (3.8 GFLOP) one replica at a time, ACE at n = 1,000 (1.5 MFLOP) with every replica together.
CPU_GROUP_FLOPS = 6e8


def local_flops_per_step(num_params: int, jobs_per_step: float, steps: int, batch_size: int) -> float:
    """An estimate of the local-training FLOPs of one server step of one replica: ``jobs_per_step`` jobs of
    ``steps`` SGD steps on ``batch_size`` examples, each about ``6 d`` FLOPs per example for a model of ``d``
    parameters (``2 d`` forward, ``4 d`` backward: exact for dense layers)."""
    return 6.0 * num_params * batch_size * steps * jobs_per_step


def auto_replica_batch(num_replicas: int, backend: str, flops_per_step: float) -> int | None:
    """The replica grouping used when ``replica_batch`` is not given: None (all replicas vmapped together) on an
    accelerator, with one replica, or where the groups would hold every replica anyway; on a CPU groups of
    ``max(1, CPU_GROUP_FLOPS // flops_per_step)`` replicas."""
    if backend != "cpu" or num_replicas <= 1:
        return None
    size = max(1, int(CPU_GROUP_FLOPS // max(flops_per_step, 1.0)))
    return None if size >= num_replicas else size


def group_bounds(num_replicas: int, size: int) -> list[tuple[int, int]]:
    """``[lo, hi)`` of each group of ``size`` consecutive replicas (the last one shorter when needed)."""
    return [(lo, min(lo + size, num_replicas)) for lo in range(0, num_replicas, size)]


def _is_axis(a: Any) -> bool:
    return a is None or isinstance(a, int)


def join_replicas(groups: Sequence[Any]) -> Any:
    """The groups' outputs back together on the replica axis (every leaf has the replica axis first)."""
    return jax.tree_util.tree_map(lambda *parts: jnp.concatenate(parts, axis=0), *groups)


def _take(axes: Sequence[Any], args: Sequence[Any], lo: jax.Array, size: int) -> list[Any]:
    """Replicas ``lo:lo + size`` (``lo`` traced) of every argument mapped over the replica axis; the shared ones (None)
    as they are."""
    def part(ax: Any, arg: Any) -> Any:
        return jax.tree_util.tree_map(
            lambda a, sub: sub if a is None else jax.tree_util.tree_map(
                lambda x: jax.lax.dynamic_slice_in_dim(x, lo, size), sub), ax, arg, is_leaf=_is_axis)

    return [part(ax, arg) for ax, arg in zip(axes, args)]


@dataclasses.dataclass
class GroupedChunk:
    """A chunk function ``fn(carry, *args) -> (carry, records)`` over the replica axis, computed ``size`` replicas at a
    time by the host: the same ``lower(*args).compile()(*args)`` interface as a jitted function, so the host loop
    treats both alike.

    ``in_axes`` are those of the vmap (0: per replica, None: shared; the carry's entry is 0). The carry of every
    replica stays one set of buffers: each group's program takes the whole carry (donated) and the group's first
    replica ``lo`` (traced, so one program serves every group of a size), reads its replicas' slice, and writes their
    new carry back into the same buffers in place (``dynamic_update_slice``); only the small per-group records are
    joined. (Splitting the carry into groups and joining it again after each chunk cost 6-10% of an MLP chunk in
    fresh 136 MB allocations and copies at R = 8; docs/benchmarks.md, "Issue 24 leftovers".)"""

    fn: Callable[..., Any]
    in_axes: tuple[Any, ...]
    size: int
    num_replicas: int

    def __post_init__(self) -> None:
        if self.in_axes[0] != 0:
            raise ValueError(f"a grouped chunk's carry (argument 0) must be per replica, got in_axes {self.in_axes!r}")
        self.bounds = group_bounds(self.num_replicas, self.size)
        self.group_fns = {hi - lo: self._group_program(hi - lo) for lo, hi in self.bounds}
        self.join = jax.jit(join_replicas)

    def _group_program(self, size: int) -> Callable[..., Any]:
        vmapped = jax.vmap(self.fn, in_axes=self.in_axes)

        def group(carry: Any, lo: jax.Array, *args: Any) -> tuple[Any, Any]:
            parts = _take(self.in_axes, (carry, *args), lo, size)
            new, records = vmapped(*parts)
            carry = jax.tree_util.tree_map(lambda whole, p: jax.lax.dynamic_update_slice_in_dim(whole, p, lo, 0),
                                           carry, new)
            return carry, records

        return jax.jit(group, donate_argnums=(0,))

    def lower(self, *args: Any) -> "_GroupedLowered":
        return _GroupedLowered(self, args)


@dataclasses.dataclass
class _GroupedLowered:
    chunk: GroupedChunk
    args: tuple[Any, ...]

    def compile(self) -> "GroupedCompiled":
        shapes = jax.tree_util.tree_map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), self.args)
        lo = jax.ShapeDtypeStruct((), jnp.int32)
        programs = {size: fn.lower(shapes[0], lo, *shapes[1:]).compile() for size, fn in self.chunk.group_fns.items()}
        return GroupedCompiled(self.chunk, programs)


@dataclasses.dataclass
class GroupedCompiled:
    """The compiled group programs (one per group size); called like the compiled vmapped chunk (the carry, argument
    0, is donated)."""

    chunk: GroupedChunk
    programs: dict[int, Any]

    def __call__(self, carry: Any, *args: Any) -> Any:
        records = []
        for lo, hi in self.chunk.bounds:
            carry, group_records = self.programs[hi - lo](carry, np.int32(lo), *args)
            records.append(group_records)
        return carry, (records[0] if len(records) == 1 else self.chunk.join(records))

    def memory_analysis(self) -> Any:
        """The largest group program's analysis (the groups run one after another)."""
        return self.programs[max(self.programs)].memory_analysis()
