"""Compressed uploads and error feedback: AsynFL, AsynFLC, AsynFLC-EF (Yang, Hou and Wu; AsynFLC-EF digest) and the
same compression for any algorithm that uploads deltas (FedBuff-EF, CA2FL with compressed uploads, ...).

**Compressors** are pure functions on a flat vector, ``C(v, key, hp) -> C(v)``: the output is a dense float32 vector
of the same shape (sparsity and quantization are in the values). Deterministic compressors ignore ``key`` (the
wrappers pass ``None``). Each one is registered in :data:`COMPRESSORS` with its options and a bit cost per message,
``bits(d, options) -> (payload_bits, index_bits)``:

* ``identity``: ``v``. Cost ``(32 d, 0)``.
* ``top_k``: the k entries of largest ``|v_j|``, exactly k (ties: the lower index), the others 0.
  Cost ``(32 k, k ceil(log2 d))``.
* ``random_k``: k entries drawn uniformly without replacement, times ``d / k`` if ``unbiased`` (default: unscaled,
  a contraction in expectation). Cost ``(32 k, k ceil(log2 d))``.
* ``qsgd``: ``||v||_2 sign(v_j) xi_j / s`` with ``xi_j`` in ``{0, ..., s}`` stochastically rounded from
  ``s |v_j| / ||v||_2`` (unbiased; Alistarh et al. 2017). Cost ``(b d + 32, 0)``.
* ``qsgd_max``: the same with the max-abs scale ``max_j |v_j|`` (unbiased). Cost ``(b d + 32, 0)``.
* ``sign``: ``(||v||_1 / d) sign(v)`` (``scaled``, the default) or ``sign(v)``; ``sign(0) = +1`` as in the paper.
  Cost ``(d + 32, 0)``, or ``(d, 0)`` unscaled.
* ``top_k_qsgd``: the stochastic quantizer on the k values kept by top-k (``norm``: "max" by default, the digest's
  stable choice inside error feedback; "l2" is QSGD; ``basu_scaled`` divides by ``1 + min(k / s^2, sqrt(k) / s)``).
  Cost ``(b k + 32, k ceil(log2 d))``.

The three quantizers take ``quant_rounding``: "stochastic" (the default, unbiased, as above) or "nearest", which
rounds ``s |v_j| / scale`` to the nearest level (``floor(r + 1/2)``, halves up): deterministic and biased, so a run
can be compared step by step with a deterministic reference. With "nearest" the compressor draws no random numbers
(no key stream, no ``compression_seed``) and its cost is unchanged.

k is ``k`` or ``ceil(fraction * d)`` (at least 1; default fraction 0.03, the paper's "top3"). Quantization uses
``s`` levels with ``b = 1 + ceil(log2(s + 1))`` bits per value (sign and magnitude); the option ``quant_bits`` b
(default 4, "Q4b") gives ``s = 2^(b-1) - 1`` (2 -> 1, 4 -> 7, 8 -> 127; digest A6) and ``levels`` sets s directly.
The 32 payload bits of the quantizers and of the scaled sign are the one float32 scale per message; Table III of the
paper counts neither these nor the index bits, which is why they are reported apart.

**Wrappers** turn any algorithm whose client uploads a delta (or a gradient) into its compressed version, without
changing its server rule:

* :func:`compressed` (no memory): the message is ``C(m)``, ``m`` the wrapped algorithm's message (AsynFLC, Eq. 7).
* :func:`error_feedback`: every client keeps a residual ``e_i`` (zeros at the start, n x d on the clients), sends
  ``C(m + e_i)`` and sets ``e_i <- m + e_i - C(m + e_i)`` (Eqs. 8-9, Alg. 1 lines 11-13). The residual changes only
  when its client uploads; the engine runs ``client`` when a job is dispatched (a client has one job in flight, so
  this is the paper's update at upload time, digest A12), in dispatch order.

The wrapped client first runs the wrapped algorithm's own client (AREA's memory, ...), so the client state is the
pair ``(wrapped algorithm's client state, CompressionClientState)``. Name, options and hyper-parameters: the options
gain ``compressor``, the compressor's options, ``error_feedback`` and, for a stochastic compressor,
``compression_seed``; the hyper-parameters are the wrapped algorithm's (compression adds none); the name becomes
``<name>_compressed`` / ``<name>_ef`` (``asynflc`` / ``asynflc_ef`` for ``asynfl``).

**Randomness of stochastic compressors.** ``client`` receives no key, so each client keeps its own key stream in its
client state: a base key ``fold_in(PRNGKey(compression_seed), i)`` for client ``i`` and a count of its jobs. The key
of a job is ``fold_in(fold_in(base_i, jobs_i), h(v))`` where ``h`` is a 32-bit hash of the bits of the vector being
compressed; then ``jobs_i += 1``. Distinct clients and distinct jobs of a client draw independent randomness, runs are
reproducible, and the hash makes replicas whose training differs (other seeds, other hyper-parameters) draw different
randomness even though ``compression_seed`` is one static option for the whole program. Deterministic compressors
keep no key state.

**AsynFL** (Eq. 5): the server adds the arrivals' deltas with weight ``eta_g / n`` (all clients, not ``|S_t|``):
``x_{t+1} = x_t + (eta_g / n) sum_{i in S_t} Delta_i``; ``normalization="arrivals"`` divides by ``|S_t|`` instead
(digest A3). With the "all_active" protocol and a server clock (``aggregation="periodic"``, ``period`` = the waiting
window W) it is the paper's windowed server; with ``"count"`` aggregation every step is one buffer.
"""

from __future__ import annotations

import functools
import inspect
import math
import numbers
from typing import Any, Callable, Mapping, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from asyncfl_jax.algorithms.base import (
    Algorithm,
    HParams,
    ServerMeta,
    masked_weighted_sum,
    model_of,
    no_client_state,
    send_result,
)

DEFAULT_COMPRESSOR = "top_k"  # the paper's main setting, top3 (digest §1.5, A11)
DEFAULT_FRACTION = 0.03
DEFAULT_QUANT_BITS = 4  # Q4b, s = 7
NORMS = ("l2", "max")
QUANT_ROUNDINGS = ("stochastic", "nearest")
FLOAT_BITS = 32

# ---------------------------------------------------------------------------------------------------- sizes and costs


def num_kept(d: int, fraction: float | None = DEFAULT_FRACTION, k: int | None = None) -> int:
    """k of a sparsifier on R^d: ``k`` if given, else ``ceil(fraction * d)`` (1e-9 tolerance), in [1, d]."""
    if k is not None:
        if k > d:
            raise ValueError(f"k = {k} is larger than the vector's dimension d = {d}")
        return int(k)
    return min(d, max(1, math.ceil(fraction * d - 1e-9)))


def index_bits(d: int) -> int:
    """Bits of one coordinate index in R^d, ``ceil(log2 d)``."""
    return (int(d) - 1).bit_length()


def quant_levels(quant_bits: int | None = DEFAULT_QUANT_BITS, levels: int | None = None) -> int:
    """s, the number of nonzero magnitude levels: ``levels`` if given, else ``2^(quant_bits - 1) - 1``."""
    return int(levels) if levels is not None else 2 ** (int(quant_bits) - 1) - 1


def value_bits(levels: int) -> int:
    """Bits of one quantized value with ``levels`` = s: a sign and a magnitude in {0..s}, ``1 + ceil(log2(s + 1))``."""
    return 1 + int(levels).bit_length()


# ---------------------------------------------------------------------------------------------------- compressors


def identity(v: jax.Array, key: jax.Array | None, hp: HParams) -> jax.Array:
    """No compression."""
    del key, hp
    return v


def _keep(v: jax.Array, idx: jax.Array, values: jax.Array) -> jax.Array:
    return jnp.zeros_like(v).at[idx].set(values)


def top_k(v: jax.Array, key: jax.Array | None, hp: HParams, *, fraction: float | None = DEFAULT_FRACTION,
          k: int | None = None) -> jax.Array:
    """The k entries of largest magnitude, the others zero (exactly k entries; ties go to the lower index)."""
    del key, hp
    _, idx = jax.lax.top_k(jnp.abs(v), num_kept(v.shape[-1], fraction, k))
    return _keep(v, idx, v[idx])


def random_k(v: jax.Array, key: jax.Array, hp: HParams, *, fraction: float | None = DEFAULT_FRACTION,
             k: int | None = None, unbiased: bool = False) -> jax.Array:
    """k entries drawn uniformly without replacement; times ``d / k`` when ``unbiased``."""
    del hp
    d = v.shape[-1]
    kk = num_kept(d, fraction, k)
    idx = jax.random.choice(key, d, (kk,), replace=False)
    return _keep(v, idx, v[idx] * (d / kk) if unbiased else v[idx])


def stochastic_quantize(v: jax.Array, key: jax.Array | None, levels: int, norm: str = "l2",
                        rounding: str = "stochastic") -> jax.Array:
    """``scale * sign(v_j) * xi_j / s`` with ``scale = ||v||_2`` (``norm="l2"``, QSGD) or ``max_j |v_j|`` ("max"):
    ``xi_j`` is ``floor(r_j)`` or ``floor(r_j) + 1`` with ``r_j = s |v_j| / scale``, the upper one with probability
    ``r_j - floor(r_j)``, so ``E[Q(v)] = v`` (``rounding="stochastic"``); ``rounding="nearest"`` takes
    ``xi_j = min(floor(r_j + 1/2), s)`` and needs no key. ``Q(0) = 0``."""
    if norm not in NORMS:
        raise ValueError(f"norm must be one of {list(NORMS)}, got {norm!r}")
    if rounding not in QUANT_ROUNDINGS:
        raise ValueError(f"quant_rounding must be one of {list(QUANT_ROUNDINGS)}, got {rounding!r}")
    s = float(levels)
    scale = jnp.linalg.norm(v) if norm == "l2" else jnp.max(jnp.abs(v))
    safe = jnp.where(scale > 0, scale, 1.0)
    r = jnp.abs(v) / safe * s  # in [0, s]
    if rounding == "nearest":
        level = jnp.minimum(jnp.floor(r + 0.5), s)
    else:
        if key is None:
            raise ValueError("stochastic rounding needs a PRNG key")
        lower = jnp.floor(r)
        u = jax.random.uniform(key, v.shape, v.dtype)
        level = jnp.minimum(lower + (u < r - lower).astype(v.dtype), s)
    return jnp.where(scale > 0, jnp.sign(v) * level * (scale / s), jnp.zeros_like(v))


def qsgd(v: jax.Array, key: jax.Array | None, hp: HParams, *, quant_bits: int | None = DEFAULT_QUANT_BITS,
         levels: int | None = None, norm: str = "l2", quant_rounding: str = "stochastic") -> jax.Array:
    """QSGD with s levels (Alistarh et al. 2017): L2-norm scale, sign, unbiased stochastic rounding (or nearest)."""
    del hp
    return stochastic_quantize(v, key, quant_levels(quant_bits, levels), norm, quant_rounding)


def qsgd_max(v: jax.Array, key: jax.Array | None, hp: HParams, *, quant_bits: int | None = DEFAULT_QUANT_BITS,
             levels: int | None = None, quant_rounding: str = "stochastic") -> jax.Array:
    """The stochastic quantizer scaled by ``max_j |v_j|`` (unbiased; the digest's stable choice inside EF, A6)."""
    return qsgd(v, key, hp, quant_bits=quant_bits, levels=levels, norm="max", quant_rounding=quant_rounding)


def sign(v: jax.Array, key: jax.Array | None, hp: HParams, *, scaled: bool = True) -> jax.Array:
    """``(||v||_1 / d) sign(v)`` (``scaled``, Karimireddy et al. 2019, a contraction) or ``sign(v)``; sign(0) = +1."""
    del key, hp
    signs = jnp.where(v >= 0, 1.0, -1.0).astype(v.dtype)
    return signs * (jnp.sum(jnp.abs(v)) / v.shape[-1]) if scaled else signs


def top_k_qsgd(v: jax.Array, key: jax.Array | None, hp: HParams, *, fraction: float | None = DEFAULT_FRACTION,
               k: int | None = None, quant_bits: int | None = DEFAULT_QUANT_BITS, levels: int | None = None,
               norm: str = "max", basu_scaled: bool = False, quant_rounding: str = "stochastic") -> jax.Array:
    """Top-k, then the stochastic quantizer on the k kept values (Q_s(Top_k(v)), Basu et al.); with
    ``basu_scaled`` the result is divided by ``1 + beta``, ``beta = min(k / s^2, sqrt(k) / s)``."""
    del hp
    kk = num_kept(v.shape[-1], fraction, k)
    s = quant_levels(quant_bits, levels)
    _, idx = jax.lax.top_k(jnp.abs(v), kk)
    q = stochastic_quantize(v[idx], key, s, norm, quant_rounding)
    if basu_scaled:
        q = q / (1.0 + min(kk / s**2, math.sqrt(kk) / s))
    return _keep(v, idx, q)


# ---------------------------------------------------------------------------------------------------- registry


def _sparse_bits(d: int, o: Mapping[str, Any], payload_per_value: int, extra: int = 0) -> tuple[int, int]:
    k = num_kept(d, o["fraction"], o["k"])
    return payload_per_value * k + extra, k * index_bits(d)


def _quant_bits(o: Mapping[str, Any]) -> int:
    return value_bits(quant_levels(o["quant_bits"], o["levels"]))


class CompressorSpec(NamedTuple):
    """A registered compressor: ``fn(v, key, hp, **options)``, its options with their defaults, its bit cost
    ``bits(d, options) -> (payload_bits, index_bits)`` and whether it draws random numbers."""

    fn: Callable[..., jax.Array]
    defaults: Mapping[str, Any]
    bits: Callable[[int, Mapping[str, Any]], tuple[int, int]]
    stochastic: bool


_SPARSE = {"fraction": DEFAULT_FRACTION, "k": None}
_QUANT = {"quant_bits": DEFAULT_QUANT_BITS, "levels": None, "quant_rounding": "stochastic"}
COMPRESSORS: dict[str, CompressorSpec] = {
    "identity": CompressorSpec(identity, {}, lambda d, o: (FLOAT_BITS * d, 0), False),
    "top_k": CompressorSpec(top_k, dict(_SPARSE), lambda d, o: _sparse_bits(d, o, FLOAT_BITS), False),
    "random_k": CompressorSpec(random_k, {**_SPARSE, "unbiased": False},
                               lambda d, o: _sparse_bits(d, o, FLOAT_BITS), True),
    "qsgd": CompressorSpec(qsgd, {**_QUANT, "norm": "l2"}, lambda d, o: (_quant_bits(o) * d + FLOAT_BITS, 0), True),
    "qsgd_max": CompressorSpec(qsgd_max, dict(_QUANT), lambda d, o: (_quant_bits(o) * d + FLOAT_BITS, 0), True),
    "sign": CompressorSpec(sign, {"scaled": True}, lambda d, o: (d + (FLOAT_BITS if o["scaled"] else 0), 0), False),
    "top_k_qsgd": CompressorSpec(top_k_qsgd, {**_SPARSE, **_QUANT, "norm": "max", "basu_scaled": False},
                                 lambda d, o: _sparse_bits(d, o, _quant_bits(o), FLOAT_BITS), True),
}
"""Compressors by name (see the module docstring)."""

COMPRESSOR_OPTIONS = tuple(sorted({name for spec in COMPRESSORS.values() for name in spec.defaults}))
"""Every compressor option name (an algorithm built with compression accepts these)."""


class Compressor(NamedTuple):
    """A compressor with its options bound: ``compressor(v, key, hp)`` and ``compressor.bits(d)``. ``stochastic``:
    whether this instance draws random numbers (a quantizer with ``quant_rounding="nearest"`` does not)."""

    name: str
    options: Mapping[str, Any]
    stochastic: bool
    spec: CompressorSpec

    def __call__(self, v: jax.Array, key: jax.Array | None, hp: HParams) -> jax.Array:
        return self.spec.fn(v, key if self.stochastic else None, hp, **self.options)

    def bits(self, d: int) -> tuple[int, int]:
        """``(payload_bits, index_bits)`` of one compressed d-vector."""
        payload, index = self.spec.bits(int(d), self.options)
        return int(payload), int(index)


def make_compressor(name: str = DEFAULT_COMPRESSOR, **options: Any) -> Compressor:
    """The compressor ``name`` of :data:`COMPRESSORS` with ``options`` (the others take their defaults).

    Sparsifiers take ``fraction`` or ``k`` (giving ``k`` clears the default fraction); quantizers ``quant_bits`` or
    ``levels``. Raises ``ValueError`` for an unknown name, an option the compressor does not have or an invalid value.
    """
    if name not in COMPRESSORS:
        raise ValueError(f"compressor must be one of {sorted(COMPRESSORS)}, got {name!r}")
    spec = COMPRESSORS[name]
    unknown = sorted(set(options) - set(spec.defaults))
    if unknown:
        raise ValueError(f"compressor {name!r} has no option {unknown[0]!r} (its options: {sorted(spec.defaults)})")
    resolved = {**spec.defaults, **options}
    if "k" in spec.defaults:
        if options.get("k") is not None and options.get("fraction") is not None:
            raise ValueError(f"compressor {name!r}: give fraction or k, not both")
        if options.get("k") is not None:
            resolved["fraction"] = None
        if resolved["k"] is None:
            f = resolved["fraction"]
            if not _is_real(f) or not 0 < f <= 1:
                raise ValueError(f"compressor {name!r}: fraction must be in (0, 1], got {f!r}")
            resolved["fraction"] = float(f)
        else:
            resolved["k"] = _integer(name, "k", resolved["k"], 1)
    if "quant_bits" in spec.defaults:
        if options.get("levels") is not None and options.get("quant_bits") is not None:
            raise ValueError(f"compressor {name!r}: give quant_bits or levels, not both")
        if options.get("levels") is not None:
            resolved["quant_bits"] = None
        if resolved["levels"] is None:
            resolved["quant_bits"] = _integer(name, "quant_bits", resolved["quant_bits"], 2, 24)
        else:
            resolved["levels"] = _integer(name, "levels", resolved["levels"], 1)
    if "norm" in spec.defaults and resolved["norm"] not in NORMS:
        raise ValueError(f"compressor {name!r}: norm must be one of {list(NORMS)}, got {resolved['norm']!r}")
    stochastic = spec.stochastic
    if "quant_rounding" in spec.defaults:
        if resolved["quant_rounding"] not in QUANT_ROUNDINGS:
            raise ValueError(f"compressor {name!r}: quant_rounding must be one of {list(QUANT_ROUNDINGS)}, got "
                             f"{resolved['quant_rounding']!r}")
        stochastic = resolved["quant_rounding"] == "stochastic"
    for flag in ("unbiased", "scaled", "basu_scaled"):
        if flag in spec.defaults and not isinstance(resolved[flag], (bool, np.bool_)):
            raise ValueError(f"compressor {name!r}: {flag} must be true or false, got {resolved[flag]!r}")
        if flag in spec.defaults:
            resolved[flag] = bool(resolved[flag])
    return Compressor(name=name, options=resolved, stochastic=stochastic, spec=spec)


def _is_real(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, (bool, np.bool_)) and math.isfinite(value)


def _integer(compressor: str, option: str, value: Any, low: int, high: int | None = None) -> int:
    if not isinstance(value, numbers.Integral) or isinstance(value, (bool, np.bool_)) or value < low or (
            high is not None and value > high):
        allowed = f"in [{low}, {high}]" if high is not None else f">= {low}"
        raise ValueError(f"compressor {compressor!r}: {option} must be an integer {allowed}, got {value!r}")
    return int(value)


# ---------------------------------------------------------------------------------------------------- wrappers


class CompressionClientState(NamedTuple):
    """What the compression wrappers keep on each client (leading client axis; ``None`` where unused).

    Attributes:
      error: float32 [n, d], the error-feedback residual ``e_i`` (only with error feedback).
      key: uint32 [n, 2], client i's base key ``fold_in(PRNGKey(compression_seed), i)`` (stochastic compressors).
      jobs: int32 [n], the number of messages client i has compressed (stochastic compressors).
    """

    error: jax.Array | None = None
    key: jax.Array | None = None
    jobs: jax.Array | None = None


def content_hash(v: jax.Array) -> jax.Array:
    """A uint32 hash of the bits of ``v`` (``sum_j bits_j * (2j + 1) * 0x9E3779B1`` mod 2^32; exact and
    order-independent, so it is the same however the sum is scheduled)."""
    bits = jax.lax.bitcast_convert_type(v.astype(jnp.float32), jnp.uint32)
    weights = (jnp.arange(v.shape[-1], dtype=jnp.uint32) * jnp.uint32(2) + jnp.uint32(1)) * jnp.uint32(0x9E3779B1)
    return jnp.sum(bits * weights, dtype=jnp.uint32)


def _wrapped_name(name: str, error_feedback: bool) -> str:
    if name == "asynfl":
        return "asynflc_ef" if error_feedback else "asynflc"
    return f"{name}_ef" if error_feedback else f"{name}_compressed"


def _wrap(algorithm: Algorithm, compressor: str | Compressor, with_error_feedback: bool, compression_seed: int,
          name: str | None, options: Mapping[str, Any]) -> Algorithm:
    if isinstance(compressor, Compressor):
        if options:
            raise ValueError("give the compressor's options to make_compressor, not with a Compressor")
        comp = compressor
    else:
        comp = make_compressor(compressor, **options)
    if "compressor" in algorithm.options:
        raise ValueError(f"{algorithm.name} already compresses its uploads (compressor "
                         f"{algorithm.options['compressor']!r}); wrap the uncompressed algorithm")
    if algorithm.upload == "model":
        raise ValueError(f"{algorithm.name} uploads its local model, not a delta: compressing it is not supported")
    if isinstance(compression_seed, bool) or not isinstance(compression_seed, int):
        raise ValueError(f"compression_seed must be an integer, got {compression_seed!r}")
    inner_client, inner_init = algorithm.client, algorithm.init_clients

    def init_clients(x0: jax.Array, num_clients: int):
        own = CompressionClientState()
        if with_error_feedback:
            own = own._replace(error=jnp.zeros((num_clients, x0.shape[-1]), x0.dtype))  # e_0^(i) = 0
        if comp.stochastic:
            base = jax.random.PRNGKey(compression_seed)
            keys = jax.vmap(lambda i: jax.random.fold_in(base, i))(jnp.arange(num_clients, dtype=jnp.uint32))
            own = own._replace(key=keys, jobs=jnp.zeros((num_clients,), jnp.int32))
        return inner_init(x0, num_clients), own

    def client(x_start: jax.Array, result: jax.Array, state, hp: HParams):
        inner_state, own = state
        message, inner_state = inner_client(x_start, result, inner_state, hp)
        if message.ndim != 1:
            raise ValueError(f"compression needs a flat vector message, {algorithm.name} sends shape {message.shape}")
        v = message + own.error if with_error_feedback else message  # Delta + e_i
        key = None
        if comp.stochastic:
            key = jax.random.fold_in(jax.random.fold_in(own.key, own.jobs), content_hash(v))
            own = own._replace(jobs=own.jobs + 1)
        sent = comp(v, key, hp)  # C(Delta + e_i)                               (Eq. 8)
        if with_error_feedback:
            own = own._replace(error=v - sent)  # e_i <- e_i + Delta - C(Delta + e_i)   (Eq. 9)
        return sent, (inner_state, own)

    new_options = {**algorithm.options, "compressor": comp.name, **comp.options,
                   "error_feedback": bool(with_error_feedback)}
    if comp.stochastic:
        new_options["compression_seed"] = compression_seed
    return algorithm._replace(
        name=name or _wrapped_name(algorithm.name, with_error_feedback),
        client=client,
        init_clients=init_clients,
        options=new_options,
        hyperparams=dict(algorithm.hyperparams),
    )


def compressed(algorithm: Algorithm, compressor: str | Compressor = DEFAULT_COMPRESSOR, *, compression_seed: int = 0,
               name: str | None = None, **options: Any) -> Algorithm:
    """``algorithm`` with every upload compressed, ``m -> C(m)``, and no client memory (AsynFLC's rule).

    Args:
      algorithm: any algorithm whose client uploads a delta or a gradient (not a local model).
      compressor: a name in :data:`COMPRESSORS` (with its ``options``) or a :class:`Compressor`.
      compression_seed: the base of the clients' key streams (stochastic compressors only).
      name: the new name (default ``<name>_compressed``; ``asynflc`` for ``asynfl``).
    """
    return _wrap(algorithm, compressor, False, compression_seed, name, options)


def error_feedback(algorithm: Algorithm, compressor: str | Compressor = DEFAULT_COMPRESSOR, *,
                   compression_seed: int = 0, name: str | None = None, **options: Any) -> Algorithm:
    """``algorithm`` with compressed uploads and error feedback on the clients (AsynFLC-EF's rule, Eqs. 8-9):
    client i sends ``C(m + e_i)`` and sets ``e_i <- m + e_i - C(m + e_i)`` (``e_i`` zeros at the start, n x d).

    Arguments as in :func:`compressed` (default name ``<name>_ef``; ``asynflc_ef`` for ``asynfl``).
    """
    return _wrap(algorithm, compressor, True, compression_seed, name, options)


def message_bits(algorithm: Algorithm | Mapping[str, Any], d: int) -> tuple[int, int]:
    """``(payload_bits, index_bits)`` of one upload of ``algorithm`` for a model of dimension ``d``.

    ``(32 d, 0)`` for an algorithm that uploads uncompressed float32 vectors; otherwise the cost of its compressor
    (module docstring). ``algorithm`` may also be an algorithm's options (e.g. ``History.algorithm_options``): the
    cost is read from them.
    """
    opts = algorithm.options if isinstance(algorithm, Algorithm) else algorithm
    if "compressor" not in opts:
        return FLOAT_BITS * int(d), 0
    spec = COMPRESSORS[opts["compressor"]]
    return make_compressor(opts["compressor"], **{k: opts[k] for k in spec.defaults if k in opts}).bits(d)


def with_compression_options(make: Callable[..., Algorithm]) -> Callable[..., Algorithm]:
    """A registry constructor that also accepts ``compressor``, the compressor's options, ``error_feedback`` and
    ``compression_seed`` (so a config can ask for e.g. ``{"compressor": "top_k", "fraction": 0.01,
    "error_feedback": true}`` with any delta-uploading algorithm). Without ``compressor`` it is ``make`` unchanged."""
    own = set(inspect.signature(make).parameters)
    clash = own & (set(COMPRESSOR_OPTIONS) | {"compressor", "error_feedback", "compression_seed"})
    if clash:
        raise TypeError(f"{make.__name__} has options named like compression options: {sorted(clash)}")

    @functools.wraps(make)
    def build(*args: Any, compressor: str | None = None, error_feedback: bool = False, compression_seed: int = 0,
              **options: Any) -> Algorithm:
        compression = {k: options.pop(k) for k in list(options) if k in COMPRESSOR_OPTIONS}
        algorithm = make(*args, **options)
        if compressor is None:
            if error_feedback or compression or compression_seed != 0:
                given = sorted([*compression, *(["error_feedback"] if error_feedback else []),
                                *(["compression_seed"] if compression_seed != 0 else [])])
                raise ValueError(f"options {given} need a compressor (one of {sorted(COMPRESSORS)})")
            return algorithm
        if not isinstance(error_feedback, bool):
            raise ValueError(f"error_feedback must be true or false, got {error_feedback!r}")
        return _wrap(algorithm, compressor, error_feedback, compression_seed, None, compression)

    return build


# ---------------------------------------------------------------------------------------------------- AsynFL family

ASYNFL_NORMALIZATIONS = ("clients", "arrivals")


class AsynFLState(NamedTuple):
    """Server state of AsynFL: the global model and n (a float32 scalar, the 1/n of Eq. 5)."""

    x: jax.Array
    num_clients: jax.Array


def asynfl(normalization: str = "clients") -> Algorithm:
    """AsynFL (Eq. 5): the server adds ``(eta_g / n) sum_{i in S_t} Delta_i`` to the model.

    ``normalization="arrivals"`` divides by ``|S_t|`` instead of n. Hyper-parameter: ``server_lr`` (eta_g, 1.0;
    digest A3).
    """
    if normalization not in ASYNFL_NORMALIZATIONS:
        raise ValueError(f"asynfl normalization must be one of {list(ASYNFL_NORMALIZATIONS)}, got {normalization!r}")

    def init(x0: jax.Array, num_clients: int) -> AsynFLState:
        return AsynFLState(x=x0, num_clients=jnp.asarray(num_clients, x0.dtype))

    def server(state: AsynFLState, deltas: jax.Array, meta: ServerMeta, hp: HParams) -> AsynFLState:
        total = masked_weighted_sum(deltas, meta.mask.astype(deltas.dtype))  # sum_{i in S_t} Delta_i
        z = state.num_clients if normalization == "clients" else jnp.maximum(jnp.sum(meta.mask), 1).astype(total.dtype)
        return state._replace(x=state.x + hp["server_lr"] * total / z)  # x + (eta_g / n) sum Delta_i

    return Algorithm(
        name="asynfl",
        init=init,
        client=send_result,
        server=server,
        params=model_of,
        init_clients=no_client_state,
        hyperparams={"server_lr": 10.0},  # with eta_g / n and M = 10 of n = 100: FedBuff's mean step (docs/defaults.md)
        options={"normalization": normalization},
    )


_error_feedback = error_feedback  # asynflc_ef's keyword of the same name hides the function inside it


def asynflc(compressor: str = DEFAULT_COMPRESSOR, normalization: str = "clients", compression_seed: int = 0,
            error_feedback: bool = False, **compressor_options: Any) -> Algorithm:
    """AsynFLC (Eq. 7): AsynFL with compressed uploads ``C(Delta_i)``, no error feedback (default: top-k, 3%).

    ``error_feedback`` is accepted so that the algorithm's own ``options`` build it again; it must be False."""
    if error_feedback is not False:
        raise ValueError("asynflc has no error feedback (error_feedback must be false); use asynflc_ef")
    return compressed(asynfl(normalization), compressor, compression_seed=compression_seed, **compressor_options)


def asynflc_ef(compressor: str = DEFAULT_COMPRESSOR, normalization: str = "clients", compression_seed: int = 0,
               error_feedback: bool = True, **compressor_options: Any) -> Algorithm:
    """AsynFLC-EF (Eqs. 8-10, Alg. 1): AsynFL with error feedback on the clients (default: top-k, 3%).

    ``error_feedback`` is accepted so that the algorithm's own ``options`` build it again; it must be True."""
    if error_feedback is not True:
        raise ValueError("asynflc_ef is AsynFLC with error feedback (error_feedback must be true); use asynflc")
    return _error_feedback(asynfl(normalization), compressor, compression_seed=compression_seed, **compressor_options)
