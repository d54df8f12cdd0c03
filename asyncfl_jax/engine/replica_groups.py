"""Replicas in groups: the chunk program of a group of replicas, called by the host once per group.

With ``replica_batch = g`` (``simulate``, config ``replica_batch``, CLI ``--replica-batch``) a chunk computes the
replicas ``g`` at a time: the host calls one compiled program, the vmapped chunk of ``g`` replicas, once per group of
``g`` replicas (the last one shorter when ``g`` does not divide ``R``). The carry is kept as one carry per group
(:class:`GroupedCarry`, separate buffers from chunk to chunk: each group's program updates its own in place); each
call reads its group's slice of the per-replica inputs. The whole carry is joined only where every replica is read at
once (a checkpoint, the History; the evaluation joins the server states alone).
Each replica's arithmetic is that of the vmapped program of ``g`` replicas, so the results equal the plain vmap up to
float rounding (a batched matmul may sum in another order). The initialization (the first jobs, an initialization
round) stays one vmapped program over every replica: it runs once.

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
import functools
from typing import Any, Callable, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np

# On a CPU, replicas are grouped so that a group's local training per server step is about this many FLOPs: below
# it the vmap's savings on the per-step overhead win, above it the lost threading and cache do. Measured on 2 cores
# (docs/benchmarks.md, "Replicas" and "Issue 24 leftovers"): the MLP (3.8 GFLOP per step) is fastest one replica at a
# time, ACE at n = 1,000 (1.5 MFLOP) with every replica together, and FedBuff logistic regression (about 160 MFLOP)
# one at a time on an idle machine since each group keeps its own carry (R = 8: groups of 1 0.98x one replica, of 2-4
# 0.74-0.84x, all vmapped 0.86x; it had been groups of 4 when every group copied its state in and out).
CPU_GROUP_FLOPS = 1.5e8


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


class GroupedCarry:
    """The carry of a run whose replicas are computed in groups: one carry per group (replica axis first in every
    leaf), kept as separate buffers from chunk to chunk, so that each group's program updates its own carry in place
    (donated) with no copy in or out of a larger one.

    A pytree (its children: the groups' carries), so ``jax.block_until_ready`` and the like take it as it is. Reading
    a field of the carry (``carry.server``, ``carry.diverged_at``, ``carry.clock``, ...) gives that field of every
    replica joined on the replica axis (a fresh copy, what the evaluation, the History and the checkpoint read);
    :func:`whole_carry` joins the whole carry (the structure of ``Run.carry_shape``)."""

    __slots__ = ("groups",)

    def __init__(self, groups: Sequence[Any]) -> None:
        object.__setattr__(self, "groups", tuple(groups))

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        return _join_jit(tuple(getattr(g, name) for g in self.groups))

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("a GroupedCarry is read-only")

    def whole(self) -> Any:
        """The carry of every replica joined on the replica axis (a fresh copy of every leaf)."""
        return _join_jit(self.groups)

    @property
    def sizes(self) -> tuple[int, ...]:
        """The number of replicas of each group."""
        return tuple(int(jax.tree_util.tree_leaves(g)[0].shape[0]) for g in self.groups)

    def tree_flatten(self) -> tuple[tuple[Any, ...], None]:
        return self.groups, None

    @classmethod
    def tree_unflatten(cls, aux: None, children: Sequence[Any]) -> "GroupedCarry":
        del aux
        return cls(children)


jax.tree_util.register_pytree_node_class(GroupedCarry)


def whole_carry(carry: Any) -> Any:
    """``carry`` with every replica in one set of arrays: a :class:`GroupedCarry` joined, any other carry as it is."""
    return carry.whole() if isinstance(carry, GroupedCarry) else carry


_join_jit = jax.jit(join_replicas)


def split_replicas(carry: Any, bounds: Sequence[tuple[int, int]]) -> GroupedCarry:
    """``carry`` (every replica in one set of arrays, replica axis first) as the :class:`GroupedCarry` of the groups
    ``bounds``: done once, at the start of a run or after a restore. ``carry`` is consumed, as a chunk's donated carry
    is: each leaf's buffer is freed as soon as its groups' copies exist, so the split holds the carry and one leaf's
    copies at most (not two carries)."""
    leaves, treedef = jax.tree_util.tree_flatten(carry)
    bounds = tuple(bounds)
    done: dict[int, tuple[Any, ...]] = {}  # a buffer shared by several leaves is split once
    parts = []
    for leaf in leaves:
        if id(leaf) not in done:
            done[id(leaf)] = jax.block_until_ready(_split_leaf(leaf, bounds))
            if isinstance(leaf, jax.Array):
                leaf.delete()
        parts.append(done[id(leaf)])
    return GroupedCarry([jax.tree_util.tree_unflatten(treedef, [p[i] for p in parts]) for i in range(len(bounds))])


@functools.partial(jax.jit, static_argnums=(1,))
def _split_leaf(x: jax.Array, bounds: tuple[tuple[int, int], ...]) -> tuple[jax.Array, ...]:
    return tuple(x[lo:hi] for lo, hi in bounds)


def _group_shapes(carry: Any, size: int) -> Any:
    """The shapes of a carry of ``size`` replicas, from ``carry`` (whole or grouped)."""
    one = carry.groups[0] if isinstance(carry, GroupedCarry) else carry
    return jax.tree_util.tree_map(lambda a: jax.ShapeDtypeStruct((size, *a.shape[1:]), a.dtype), one)


@dataclasses.dataclass
class GroupedChunk:
    """A chunk function ``fn(carry, *args) -> (carry, records)`` over the replica axis, computed ``size`` replicas at a
    time by the host: the same ``lower(*args).compile()(*args)`` interface as a jitted function, so the host loop
    treats both alike.

    ``in_axes`` are those of the vmap (0: per replica, None: shared; the carry's entry is 0). The carry is kept as one
    carry per group (:class:`GroupedCarry`): the compiled chunk takes a whole carry (split once into the groups) or a
    :class:`GroupedCarry` and returns a :class:`GroupedCarry`. Each group's program takes its group's carry (donated,
    so the scan over the chunk's steps updates it in place) and the group's first replica ``lo`` (traced, so one
    program serves every group of a size), from which it reads its replicas' slice of the other per-replica
    arguments; only the small per-group records are joined. (Before, the groups shared the whole carry's buffers:
    each group's program read its slice into the loop and wrote it back, a copy of its state in and out per call
    that cost 15-20% of an MLP replica's chunk; before that, the carry was split and joined around every chunk:
    docs/benchmarks.md, "Issue 24 leftovers".)"""

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
            parts = _take(self.in_axes[1:], args, lo, size)
            return vmapped(carry, *parts)

        return jax.jit(group, donate_argnums=(0,))

    def lower(self, *args: Any) -> "_GroupedLowered":
        return _GroupedLowered(self, args)


@dataclasses.dataclass
class _GroupedLowered:
    chunk: GroupedChunk
    args: tuple[Any, ...]

    def compile(self) -> "GroupedCompiled":
        shapes = jax.tree_util.tree_map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), self.args[1:])
        lo = jax.ShapeDtypeStruct((), jnp.int32)
        programs = {size: fn.lower(_group_shapes(self.args[0], size), lo, *shapes).compile()
                    for size, fn in self.chunk.group_fns.items()}
        one = _group_shapes(self.args[0], 1)
        replica_bytes = sum(int(np.prod(a.shape)) * np.dtype(a.dtype).itemsize for a in jax.tree_util.tree_leaves(one))
        return GroupedCompiled(self.chunk, programs, replica_bytes)


@dataclasses.dataclass
class GroupedCompiled:
    """The compiled group programs (one per group size); called like the compiled vmapped chunk (the carry, argument
    0, is donated: a :class:`GroupedCarry` group by group; a whole carry is first split into the groups) and returns
    the new carry as a :class:`GroupedCarry`."""

    chunk: GroupedChunk
    programs: dict[int, Any]
    replica_bytes: int  # one replica's carry

    def __call__(self, carry: Any, *args: Any) -> Any:
        bounds = self.chunk.bounds
        if not isinstance(carry, GroupedCarry):
            carry = split_replicas(carry, bounds)
        elif carry.sizes != tuple(hi - lo for lo, hi in bounds):
            raise ValueError(f"a grouped carry of groups {carry.sizes} given to a chunk computed in groups of "
                             f"{tuple(hi - lo for lo, hi in bounds)}")
        groups, records = [], []
        for (lo, hi), group_carry in zip(bounds, carry.groups):
            group_carry, group_records = self.programs[hi - lo](group_carry, np.int32(lo), *args)
            groups.append(group_carry)
            records.append(group_records)
        return GroupedCarry(groups), (records[0] if len(records) == 1 else self.chunk.join(records))

    def memory_analysis(self) -> Any:
        """The largest group program's analysis, with the other groups' carries (held between their calls) added to
        its arguments: what the run holds while that group runs."""
        size = max(self.programs)
        stats = self.programs[size].memory_analysis()
        fields = ("argument_size_in_bytes", "output_size_in_bytes", "alias_size_in_bytes", "temp_size_in_bytes")
        if stats is None or not all(hasattr(stats, f) for f in fields):
            return stats
        others = self.replica_bytes * (self.chunk.num_replicas - size)
        return GroupMemory(*(int(getattr(stats, f)) + (others if f == fields[0] else 0) for f in fields))


class GroupMemory(NamedTuple):
    """A group program's memory analysis (the fields ``budget.compiled_bytes`` reads), the other groups' carries
    counted among its arguments."""

    argument_size_in_bytes: int
    output_size_in_bytes: int
    alias_size_in_bytes: int
    temp_size_in_bytes: int
