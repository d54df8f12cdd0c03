"""Job executors: how the jobs trained together at one server step are laid out in the compiled program.

Every job runs the same local-training function on its own client and key. An executor maps that function over the
jobs' leading axis; the choice is made once per program, before tracing (as the clock, the store and the placement
are), never by an ``if`` inside the step:

* :class:`VmapJobs` (``"vmap"``): one vmapped call. Each layer becomes one batched operation over the jobs (a
  batched matmul; for a convolution, a grouped convolution over the jobs' kernels). The accelerators' form, and the
  fastest on every backend for dense models.
* :class:`UnrolledJobs` (``"unrolled"``): the jobs written out one after another inside the one compiled function (a
  Python loop over the jobs at trace time). Each job's convolutions stay dense; XLA:CPU runs a grouped
  convolution (``vmap`` over per-job kernels) far slower than the same convolutions one by one.
* :class:`GroupedJobs` (``"grouped:G"``): groups of ``G`` jobs, each group vmapped, the groups one after another
  (``G = 1`` is ``unrolled``, ``G >= W`` is ``vmap``).

``"auto"`` (the default, :func:`make_job_executor`) picks ``unrolled`` on the CPU backend for a model with a
convolution or a recurrence (a loop primitive in its forward pass, found from its jaxpr) and ``vmap`` otherwise: the
fastest measured form for each (docs/benchmarks.md, "Convolutional models on CPU"). Results are the same up to float
rounding (a batched operation may sum in another order). The compiled program grows with the number of jobs
written out: the jobs started before step 0 are trained in groups of ``engine.jobs.INIT_BATCH`` inside a loop, so a
program never writes out more than that many jobs (or the widest step's).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp

EXECUTOR_NAMES = ("auto", "vmap", "unrolled", "grouped:G")


def _width(in_axes: Sequence[int | None], args: Sequence[Any]) -> int:
    for axis, arg in zip(in_axes, args):
        if axis is not None:
            return int(jax.tree_util.tree_leaves(arg)[0].shape[0])
    raise ValueError("at least one argument must have a job axis")


def _slice(in_axes: Sequence[int | None], args: Sequence[Any], start: int, stop: int) -> list[Any]:
    return [arg if axis is None else jax.tree_util.tree_map(lambda a: a[start:stop], arg)
            for axis, arg in zip(in_axes, args)]


def _concat(parts: list[Any]) -> Any:
    return jax.tree_util.tree_map(lambda *xs: jnp.concatenate(xs), *parts)


@dataclasses.dataclass(frozen=True)
class VmapJobs:
    """All jobs in one vmapped call."""

    name = "vmap"

    def map(self, fn: Callable[..., Any], in_axes: Sequence[int | None], *args: Any) -> Any:
        """``fn`` over the leading axis of the arguments whose ``in_axes`` entry is 0 (None: shared)."""
        return jax.vmap(fn, in_axes=tuple(in_axes))(*args)


@dataclasses.dataclass(frozen=True)
class GroupedJobs:
    """Groups of ``size`` jobs, each group one vmapped call, the groups written out one after another."""

    size: int

    @property
    def name(self) -> str:
        return f"grouped:{self.size}"

    def map(self, fn: Callable[..., Any], in_axes: Sequence[int | None], *args: Any) -> Any:
        width = _width(in_axes, args)
        if width <= self.size:
            return VmapJobs().map(fn, in_axes, *args)
        return _concat([VmapJobs().map(fn, in_axes, *_slice(in_axes, args, start, min(start + self.size, width)))
                        for start in range(0, width, self.size)])


@dataclasses.dataclass(frozen=True)
class UnrolledJobs:
    """The jobs written out one after another (a trace-time loop over the jobs).

    With ``shards = D > 1`` (``shard_jobs`` over the ``D`` devices of ``mesh``, its one axis named ``"jobs"``) the
    jobs are split into ``D`` equal parts (padded with copies of the first job, whose results are dropped) and each
    device trains its own part one job after another inside a ``shard_map`` over the mesh: every convolution is a
    dense one on its device's thread. (An earlier form vmapped the parts along an axis placed over the devices: each
    convolution became a grouped convolution over the parts' kernels, which XLA:CPU's partitioner did not split, so
    it ran 10x slower than one device; docs/benchmarks.md, "Issue 24 leftovers".)"""

    shards: int = 1
    mesh: Any = None
    name = "unrolled"

    def map(self, fn: Callable[..., Any], in_axes: Sequence[int | None], *args: Any) -> Any:
        if self.shards > 1:
            return self._sharded(fn, in_axes, *args)
        width = _width(in_axes, args)
        outs = [fn(*[arg if axis is None else jax.tree_util.tree_map(lambda a: a[j], arg)  # noqa: B023
                     for axis, arg in zip(in_axes, args)]) for j in range(width)]
        return jax.tree_util.tree_map(lambda *xs: jnp.stack(xs), *outs)

    def _sharded(self, fn: Callable[..., Any], in_axes: Sequence[int | None], *args: Any) -> Any:
        from jax.sharding import PartitionSpec

        if self.mesh is None or self.mesh.size != self.shards:
            raise ValueError(f"UnrolledJobs over {self.shards} devices needs a mesh of as many devices (its axis "
                             f"'jobs'), got {self.mesh!r}")
        width, parts = _width(in_axes, args), self.shards
        padded_width = -(-width // parts) * parts

        def pad(a: jax.Array) -> jax.Array:
            return jnp.concatenate([a, jnp.repeat(a[:1], padded_width - width, axis=0)]) if padded_width > width else a

        padded = [arg if axis is None else jax.tree_util.tree_map(pad, arg) for axis, arg in zip(in_axes, args)]
        specs = tuple(PartitionSpec() if axis is None else PartitionSpec("jobs") for axis in in_axes)
        one_part = UnrolledJobs()
        out = jax.shard_map(lambda *a: one_part.map(fn, in_axes, *a), mesh=self.mesh, in_specs=specs,
                            out_specs=PartitionSpec("jobs"), check_vma=False)(*padded)
        return jax.tree_util.tree_map(lambda o: o[:width], out)


JobExecutor = VmapJobs | GroupedJobs | UnrolledJobs

_LOOP_PRIMITIVES = ("while", "scan")


def _primitives(jaxpr: Any) -> set[str]:
    """Every primitive name of a jaxpr, its sub-jaxprs (loop bodies, calls, custom rules) included."""
    names: set[str] = set()
    for eqn in jaxpr.eqns:
        names.add(eqn.primitive.name)
        for param in eqn.params.values():
            for sub in param if isinstance(param, (list, tuple)) else (param,):
                inner = getattr(sub, "jaxpr", sub)
                if hasattr(inner, "eqns"):
                    names |= _primitives(inner)
    return names


def model_kind(model: Any, example: jax.Array) -> str:
    """``"convolutional"``, ``"recurrent"`` (a loop in the forward pass) or ``"dense"``: what the model's forward pass
    on ``example`` (one batch) is made of, read from its jaxpr."""
    closed = jax.make_jaxpr(model.apply_fn)(model.init_params, example)
    names = _primitives(closed.jaxpr)
    if "conv_general_dilated" in names:
        return "convolutional"
    if names & set(_LOOP_PRIMITIVES):
        return "recurrent"
    return "dense"


def parse_job_executor(spec: str | JobExecutor) -> str | JobExecutor:
    """Checks ``spec`` (``"auto"``, ``"vmap"``, ``"unrolled"``, ``"grouped:G"`` with an integer ``G >= 1``, or an
    executor object); raises ``ValueError`` naming what is allowed."""
    if isinstance(spec, (VmapJobs, GroupedJobs, UnrolledJobs)):
        return spec
    if spec in ("auto", "vmap", "unrolled"):
        return spec
    if isinstance(spec, str) and spec.startswith("grouped:"):
        size = spec.split(":", 1)[1]
        if size.isdigit() and int(size) >= 1:
            return GroupedJobs(int(size))
    raise ValueError(f"job_executor must be one of {list(EXECUTOR_NAMES)} (G an integer >= 1), got {spec!r}")


def auto_executor(backend: str, kind: str) -> JobExecutor:
    """The fastest measured executor for a model of ``kind`` (:func:`model_kind`) on ``backend``."""
    if backend == "cpu" and kind in ("convolutional", "recurrent"):
        return UnrolledJobs()
    return VmapJobs()


def make_job_executor(spec: str | JobExecutor, model: Any, example: jax.Array, backend: str | None = None,
                      shards: int = 1) -> JobExecutor:
    """The executor ``spec`` asks for; ``"auto"`` chooses from ``backend`` (default ``jax.default_backend()``) and
    the model (``example``: one batch of inputs). ``shards``: the devices the jobs are spread over (``shard_jobs``:
    every device, as :func:`~asyncfl_jax.engine.placement.job_sharding` lays them out; see :class:`UnrolledJobs`)."""
    spec = parse_job_executor(spec)
    if spec == "vmap":
        spec = VmapJobs()
    elif spec == "unrolled":
        spec = UnrolledJobs()
    elif spec == "auto":
        spec = auto_executor(backend or jax.default_backend(), model_kind(model, example))
    if isinstance(spec, UnrolledJobs) and shards > 1:
        from asyncfl_jax.engine.placement import job_sharding

        mesh = job_sharding().mesh
        if mesh.size != shards:
            raise ValueError(f"shard_jobs over {shards} devices, but the job mesh has {mesh.size}")
        return UnrolledJobs(shards, mesh)
    return spec
