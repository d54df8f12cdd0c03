"""The algorithm interface: a small NamedTuple of pure functions over flat parameter vectors (optax style).

An asynchronous FL algorithm is described by what each client sends and how the server folds messages in:

* ``init(x0, num_clients) -> state``: the server state (it contains the global model ``x``; per-client server
  memory such as caches has a leading client axis).
* ``init_clients(x0, num_clients) -> client_state``: per-client memory kept *on the clients* (error-feedback
  residuals, AREA's ``y_i``), a pytree with a leading client axis; ``()`` when there is none.
* ``client(x_start, result, client_state_i, hp) -> (message, client_state_i)``: turns one local-training result
  (a delta or a gradient, see ``upload``) computed from the model ``x_start`` into the message the client uploads,
  and updates that client's memory. It runs once per job.
* ``server(state, messages, meta, hp) -> state``: one server step on the ``M`` messages that arrive at it
  (``messages`` has a leading buffer axis; ``meta.mask`` marks real entries).
* ``params(state) -> x``: the global model the server sends to clients and that is evaluated.

Three more fields say what the engine must know, as data:

* ``upload``: what a client uploads, ``"delta"`` (``x_K - x_start``, the default), ``"gradient"`` (one minibatch
  gradient at ``x_start``: ACE, the ASGDs) or ``"model"`` (its local model ``x_start + delta``: FedAsync, AS-FedAvg).
  Local training returns a gradient for ``"gradient"`` and a delta otherwise (:attr:`Algorithm.local_output`).
* ``init_round``: an :class:`InitRound` when the run starts with an initialization round (ACE, ACED): every client
  computes its result at ``x0`` and the server applies one step with all ``n`` messages; the schedule then starts
  from the model that step produced (it is the schedule's ``x_0``). ``None``: no such round.
* ``jobs``: a :class:`JobPolicy` when the server sets up the jobs it dispatches (AREA's step size, AsyncFedED's
  number of local steps); the default leaves every job to ``hp`` and ``local.steps``.

``hp`` is a dict of scalar arrays (``server_lr``, ``alpha``...), read at call time so replicas can differ in them under
``vmap``; static choices (a staleness function, a normalization rule) are fixed when the algorithm is built.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, NamedTuple

import jax
import jax.numpy as jnp

HParams = Mapping[str, jax.Array]


class ServerMeta(NamedTuple):
    """What the server knows about the messages of one step.

    Attributes:
      clients: int32 [M] ids of the arriving clients (-1 for padding).
      mask: bool [M] real entries.
      staleness: int32 [M] ``t - version`` of each message (0 for padding).
      step: int32 scalar, the server step ``t`` (the model being updated is ``x_t``).
      time: float32 scalar, the virtual time of the step.
      key: a PRNG key of this step for the server's own randomness (stochastic rounding of quantized caches);
        independent of every client's training key.
      sizes: float32 [M], the number of training examples ``n_i`` of each arriving client (0 for padding), as a
        client reports it with its upload (McMahan et al.'s ``n_k``); read by the data-size weighted rules
        (``fedavg(weights="data_size")``). The engine always fills it; ``None`` where a caller builds a meta by hand
        without it, and a rule that needs it then refuses to trace.
    """

    clients: jax.Array
    mask: jax.Array
    staleness: jax.Array
    step: jax.Array
    time: jax.Array
    key: jax.Array | None = None
    sizes: jax.Array | None = None


class ServerState(NamedTuple):
    """Server state of algorithms whose only state is the global model."""

    x: jax.Array


UPLOADS = ("delta", "gradient", "model")


class InitRound(NamedTuple):
    """The initialization round: every client's result at ``x0`` goes to the server before step 0.

    ``absorb(state, messages, meta, hp) -> state``: optional; folds a group of the round's messages into the server's
    memory *without* stepping the model. With it, the engine trains the clients in groups (of ``engine.INIT_BATCH``),
    absorbs every group but the last, and takes the server step (``server``) with the last one, which must equal one
    ``server`` call with all ``n`` messages (true for the cache rules ACE, ACED and MIFA: the groups fill the cache and
    the last call steps from the full cache). No ``n x d`` buffer of messages then exists, which is what lets n =
    100,000 fit in memory. ``None``: the ``n`` messages are gathered and the server takes them in one call.
    """

    absorb: Callable[[Any, Any, "ServerMeta", "HParams"], Any] | None = None


class JobPolicy(NamedTuple):
    """How the server sets up the jobs it dispatches (read with the server state at dispatch).

    Attributes:
      hparams: ``(state, hp) -> hp``, the hyper-parameters the jobs dispatched now train with (AREA's decreasing step
        size reads the server's event counter); ``None`` uses ``hp`` unchanged.
      steps: ``(state, clients, hp) -> steps``, the number of local steps (int32, one per client) of the jobs
        dispatched now, at most ``max_steps`` (AsyncFedED's adaptive K); ``None``: every job runs ``local.steps``.
        Under the in-scan event clock a job's compute time scales with ``steps / local.steps``.
      max_steps: the static upper bound of ``steps`` (needed with ``steps``).
    """

    hparams: Callable[[Any, "HParams"], "HParams"] | None = None
    steps: Callable[[Any, jax.Array, "HParams"], jax.Array] | None = None
    max_steps: int | None = None


class Algorithm(NamedTuple):
    """A federated algorithm as pure functions (see the module docstring)."""

    name: str
    init: Callable[[jax.Array, int], Any]
    client: Callable[[jax.Array, jax.Array, Any, HParams], tuple[Any, Any]]
    server: Callable[[Any, Any, ServerMeta, HParams], Any]
    params: Callable[[Any], jax.Array]
    init_clients: Callable[[jax.Array, int], Any]
    upload: str = "delta"
    hyperparams: Mapping[str, float] = {}
    options: Mapping[str, Any] = {}
    init_round: InitRound | None = None
    jobs: JobPolicy = JobPolicy()

    @property
    def local_output(self) -> str:
        """What local training returns for this algorithm: ``"gradient"`` or ``"delta"``."""
        return "gradient" if self.upload == "gradient" else "delta"


def init_model_only(x0: jax.Array, num_clients: int) -> ServerState:
    del num_clients
    return ServerState(x=x0)


def no_client_state(x0: jax.Array, num_clients: int) -> tuple:
    del x0, num_clients
    return ()


def send_result(x_start: jax.Array, result: jax.Array, client_state: Any, hp: HParams) -> tuple[jax.Array, Any]:
    """The default client: upload the local result (the delta) unchanged, keep no memory."""
    del x_start, hp
    return result, client_state


def model_of(state: Any) -> jax.Array:
    return state.x


def model_only_algorithm(
    name: str,
    server: Callable[[Any, Any, ServerMeta, HParams], Any],
    hyperparams: Mapping[str, float],
    client: Callable[[jax.Array, jax.Array, Any, HParams], tuple[Any, Any]] = send_result,
    options: Mapping[str, Any] | None = None,
    upload: str = "delta",
) -> Algorithm:
    """An :class:`Algorithm` whose server state is only the global model and whose clients keep no memory."""
    return Algorithm(
        upload=upload,
        name=name,
        init=init_model_only,
        client=client,
        server=server,
        params=model_of,
        init_clients=no_client_state,
        hyperparams=dict(hyperparams),
        options=dict(options or {}),
    )


def masked_weighted_sum(messages: jax.Array, weights: jax.Array) -> jax.Array:
    """``sum_i w_i m_i`` over the buffer axis (weights of padding entries must be 0)."""
    return jnp.tensordot(weights.astype(messages.dtype), messages, axes=1)


def after(values: jax.Array, read: jax.Array) -> jax.Array:
    """``values``, unchanged, but computed after all of ``read`` (adds ``0 * all(isfinite(read))``, exactly 0).

    Writing rows of a large per-client buffer in place (``buffer.at[rows].set(values)``) is only O(rows x d) when XLA
    schedules every read of the buffer before the write. If the written values do not depend on what was read, XLA may
    order the write first and copy the whole n x d buffer to keep the old rows readable, every step. Passing the
    values through ``after(values, rows_read)`` orders the read first and keeps the write in place. The dependency is
    a reduction over all of ``read`` (a dependency on a single element would let XLA split the read and move the rest
    after the write).
    """
    finite = jnp.all(jnp.isfinite(read)).astype(values.dtype)
    return values + jnp.zeros((), values.dtype) * finite


def read_rows(buffer: jax.Array, rows: jax.Array) -> jax.Array:
    """``buffer[rows]`` for a buffer that the same step then writes in place (use with :func:`after`).

    A read of a single row becomes a ``dynamic-slice`` in XLA, and XLA:CPU then copies the whole buffer rather than
    order that slice before an in-place write of the buffer (seen in the compiled HLO). Reading through a gather of at
    least two indices (one padding index that is dropped) keeps the write in place.
    """
    if rows.shape[0] >= 2:
        return buffer[rows]
    padded = jnp.concatenate([rows, jnp.zeros((1,), rows.dtype)])
    return buffer[padded][: rows.shape[0]]
