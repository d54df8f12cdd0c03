"""Replicas in groups: the chunk program of a group of replicas, called by the host once per group.

With ``replica_batch = g`` (``simulate``, config ``replica_batch``, CLI ``--replica-batch``) a chunk computes the
replicas ``g`` at a time: the host splits the carry and the per-replica inputs into groups of ``g`` replicas (the last
one shorter when ``g`` does not divide ``R``), calls one compiled program, the vmapped chunk of ``g`` replicas, on
each group, and puts the groups' results back together on the replica axis. Each replica's arithmetic is that of the
vmapped program of ``g`` replicas, so the results equal the plain vmap up to float rounding (a batched matmul may sum
in another order). The initialization (the first jobs, an initialization round) stays one vmapped program over
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


def slice_replicas(args: Sequence[Any], in_axes: Sequence[Any], lo: int, hi: int) -> list[Any]:
    """Replicas ``lo:hi`` of every argument mapped over the replica axis (``in_axes`` entry 0, a pytree prefix as
    ``jax.vmap`` takes it); the shared ones (None) as they are."""
    def part(axes: Any, arg: Any) -> Any:
        return jax.tree_util.tree_map(
            lambda ax, sub: sub if ax is None else jax.tree_util.tree_map(lambda a: a[lo:hi], sub),
            axes, arg, is_leaf=_is_axis)

    return [part(axes, arg) for axes, arg in zip(in_axes, args)]


def join_replicas(groups: Sequence[Any]) -> Any:
    """The groups' outputs back together on the replica axis (every leaf has the replica axis first)."""
    return jax.tree_util.tree_map(lambda *parts: jnp.concatenate(parts, axis=0), *groups)


@dataclasses.dataclass
class GroupedChunk:
    """A chunk function ``fn`` over the replica axis, computed ``size`` replicas at a time by the host: the same
    ``lower(*args).compile()(*args)`` interface as a jitted function, so the host loop treats both alike.

    ``in_axes`` are those of the vmap (0: per replica, None: shared); each group's carry (a slice the split made) is
    donated to its program."""

    fn: Callable[..., Any]
    in_axes: tuple[Any, ...]
    size: int
    num_replicas: int

    def __post_init__(self) -> None:
        self.bounds = group_bounds(self.num_replicas, self.size)
        self.group_fn = jax.jit(jax.vmap(self.fn, in_axes=self.in_axes), donate_argnums=(0,))
        mapped = tuple(i for i, ax in enumerate(self.in_axes) if ax is not None)
        self.mapped = mapped
        axes = tuple(self.in_axes[i] for i in mapped)
        self.split = jax.jit(lambda *args: [slice_replicas(args, axes, lo, hi) for lo, hi in self.bounds])
        self.join = jax.jit(join_replicas)

    def lower(self, *args: Any) -> "_GroupedLowered":
        return _GroupedLowered(self, args)


@dataclasses.dataclass
class _GroupedLowered:
    chunk: GroupedChunk
    args: tuple[Any, ...]

    def compile(self) -> "GroupedCompiled":
        chunk, programs = self.chunk, {}
        for lo, hi in chunk.bounds:
            if hi - lo not in programs:
                group_args = _group_args(chunk, self.args, slice_replicas(
                    [self.args[i] for i in chunk.mapped], [chunk.in_axes[i] for i in chunk.mapped], lo, hi))
                shapes = jax.tree_util.tree_map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), group_args)
                programs[hi - lo] = chunk.group_fn.lower(*shapes).compile()
        return GroupedCompiled(chunk, programs)


def _group_args(chunk: GroupedChunk, args: Sequence[Any], mapped_parts: Sequence[Any]) -> list[Any]:
    """The arguments of one group's call: its slices of the mapped arguments, the shared ones as they are."""
    out, parts = list(args), iter(mapped_parts)
    for i in chunk.mapped:
        out[i] = next(parts)
    return out


@dataclasses.dataclass
class GroupedCompiled:
    """The compiled group programs (one per group size); called like the compiled vmapped chunk."""

    chunk: GroupedChunk
    programs: dict[int, Any]

    def __call__(self, *args: Any) -> Any:
        chunk = self.chunk
        groups = chunk.split(*[args[i] for i in chunk.mapped])
        outputs = [self.programs[hi - lo](*_group_args(chunk, args, parts))
                   for (lo, hi), parts in zip(chunk.bounds, groups)]
        return chunk.join(outputs)

    def memory_analysis(self) -> Any:
        """The largest group program's analysis (the groups run one after another)."""
        return self.programs[max(self.programs)].memory_analysis()
