"""Per-client caches on the server (n x d), stored in full precision, bfloat16, or quantized to 8/4/2 bits.

CA2FL, MF-CA2FL, ACE, ACED and MIFA keep one d-vector per client on the server. A :class:`ClientCache` is the storage
strategy these algorithms are built with (a combinator: the algorithm's rule is written once against ``read`` and
``replace``, and the cache decides how rows are stored):

* ``"float32"``: exact.
* ``"bfloat16"``: rows rounded to bfloat16 (half the memory; kept as their raw uint16 bits).
* ``"int8"``, ``"int4"``, ``"int2"``: b-bit codes with a per-row range (MF-CA2FL, CA2FL digest §2.4; ACE-8bit, ACE
  digest §2.4). For a row ``v``::

      lo = min(v),  scale = (max(v) - lo) / (2^b - 1)
      code = clip(floor((v - lo) / scale + r), 0, 2^b - 1)      r ~ U[0, 1) ("stochastic", unbiased) or r = 1/2
      Q(v) = lo + code * scale                                    ("nearest", deterministic)

  (``Q(v) = v`` for a constant row). Stochastic rounding is unbiased, ``E[Q(v)] = v``, with per-entry variance at most
  ``scale^2 / 4``, as the papers' analyses assume (CA2FL Assumption C.1). Codes are packed ``8 / b`` to a byte, so a
  row costs ``ceil(d b / 8)`` bytes plus two float32 numbers: the 4x / 8x / 16x saving over float32 that the papers
  count. The scale is per row (one per client vector) rather than per layer.

  That is the ``"minmax"`` code (option ``cache_code``, the default). The ``"absmax"`` code is the symmetric one, the
  reading of ACE-8bit's "standard unbiased quantization" in ACE digest §8 item 19 (absmax scale, int8 in
  [-127, 127], the scale in float32)::

      L = 2^(b-1) - 1,  scale = max|v| / L
      q = clip(floor(v / scale + r), -L, L)        r as above
      Q(v) = q * scale                             (Q(0) = 0)

  with the levels ``-L..L`` (int8: -127..127, int4: -7..7, int2: -1..1), stored as the b-bit codes ``q + L`` beside
  one float32 scale: a row costs ``ceil(d b / 8) + 4`` bytes. Stochastic rounding is unbiased here too (``v / scale``
  lies in ``[-L, L]``), with per-entry variance at most ``scale^2 / 4``; zero is represented exactly.

The algorithms keep the running mean of the *stored* rows (``hbar``, ``u``) in float32 beside the cache, so every
read of "the cache" sees the same values the mean was built from.

Writing one client's row costs O(d): ``replace`` reads the old rows through a gather and writes the new ones in place
(see :func:`asyncfl_jax.algorithms.base.after`).
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from asyncfl_jax.algorithms.base import after, read_rows
from asyncfl_jax.precision import float_dtype

CACHE_KINDS = ("float32", "bfloat16", "int8", "int4", "int2")
ROUNDINGS = ("stochastic", "nearest")
CODES = ("minmax", "absmax")
_BITS = {"int8": 8, "int4": 4, "int2": 2}


class QuantizedRows(NamedTuple):
    """Rows stored as packed b-bit codes: ``Q(v)[j] = lo + code[j] * scale``.

    Attributes:
      codes: uint8 [k, ceil(d * bits / 8)], ``8 // bits`` codes per byte (lowest bits first).
      lo: float32 [k], each row's minimum.
      scale: float32 [k], each row's step ``(max - min) / (2^bits - 1)`` (0 for a constant row).
    """

    codes: jax.Array
    lo: jax.Array
    scale: jax.Array


def _rounding_offsets(shape: tuple[int, ...], bits: int, rounding: str, key: jax.Array | None,
                      dtype: Any = jnp.float32) -> jax.Array:
    """``r`` of ``floor(v / scale + r)``: 0.5 for nearest rounding, ``U[0, 1)`` per entry for stochastic (unbiased)
    rounding (drawn in ``dtype``, the run's precision); checks ``bits`` and ``rounding`` first."""
    if bits not in (8, 4, 2):
        raise ValueError(f"bits must be 8, 4 or 2, got {bits!r}")
    if rounding not in ROUNDINGS:
        raise ValueError(f"rounding must be one of {list(ROUNDINGS)}, got {rounding!r}")
    if rounding == "nearest":
        return jnp.asarray(0.5, dtype)
    if key is None:
        raise ValueError("stochastic rounding needs a PRNG key")
    return jax.random.uniform(key, shape, dtype)


def quantize(values: jax.Array, bits: int, rounding: str = "stochastic", key: jax.Array | None = None) -> QuantizedRows:
    """Quantizes each row of ``values`` [k, d] to ``bits`` in {8, 4, 2} bits (see the module docstring)."""
    dtype = float_dtype(values)
    r = _rounding_offsets(values.shape, bits, rounding, key, dtype)
    values = values.astype(dtype)
    levels = 2**bits - 1
    lo = jnp.min(values, axis=1)
    scale = (jnp.max(values, axis=1) - lo) / levels
    safe = jnp.where(scale > 0, scale, 1.0)
    codes = jnp.clip(jnp.floor((values - lo[:, None]) / safe[:, None] + r), 0, levels).astype(jnp.uint8)
    return QuantizedRows(codes=_pack(codes, bits), lo=lo, scale=scale)


def dequantize(q: QuantizedRows, bits: int, dim: int) -> jax.Array:
    """``Q(v) = lo + code * scale`` as float [k, dim] (the dtype of the scales: float32, float64 in a float64 run)."""
    codes = _unpack(q.codes, bits, dim).astype(q.scale.dtype)
    return q.lo[:, None] + codes * q.scale[:, None]


class AbsmaxRows(NamedTuple):
    """Rows stored as packed b-bit symmetric codes: ``Q(v)[j] = (code[j] - L) * scale``, ``L = 2^(bits-1) - 1``.

    Attributes:
      codes: uint8 [k, ceil(d * bits / 8)], the levels ``q + L`` in ``[0, 2L]``, packed as :class:`QuantizedRows`'.
      scale: float32 [k], each row's ``max|v| / L`` (0 for a zero row).
    """

    codes: jax.Array
    scale: jax.Array


def quantize_absmax(values: jax.Array, bits: int, rounding: str = "stochastic",
                    key: jax.Array | None = None) -> AbsmaxRows:
    """Quantizes each row of ``values`` [k, d] to the symmetric ``bits``-bit code (see the module docstring)."""
    dtype = float_dtype(values)
    r = _rounding_offsets(values.shape, bits, rounding, key, dtype)
    values = values.astype(dtype)
    levels = 2 ** (bits - 1) - 1
    scale = jnp.max(jnp.abs(values), axis=1) / levels  # max|v| / L
    safe = jnp.where(scale > 0, scale, 1.0)
    q = jnp.clip(jnp.floor(values / safe[:, None] + r), -levels, levels)  # in {-L, ..., L}
    return AbsmaxRows(codes=_pack((q + levels).astype(jnp.uint8), bits), scale=scale)


def dequantize_absmax(q: AbsmaxRows, bits: int, dim: int) -> jax.Array:
    """``Q(v) = (code - L) * scale`` as float [k, dim] (the dtype of the scales)."""
    levels = 2 ** (bits - 1) - 1
    codes = _unpack(q.codes, bits, dim).astype(q.scale.dtype)
    return (codes - levels) * q.scale[:, None]


def _pack(codes: jax.Array, bits: int) -> jax.Array:
    per = 8 // bits
    if per == 1:
        return codes
    k, d = codes.shape
    padded = jnp.pad(codes, ((0, 0), (0, -d % per)))
    groups = padded.reshape(k, -1, per).astype(jnp.uint32)
    shifts = jnp.arange(per, dtype=jnp.uint32) * bits
    return jnp.sum(groups << shifts, axis=-1).astype(jnp.uint8)


def _unpack(packed: jax.Array, bits: int, dim: int) -> jax.Array:
    per = 8 // bits
    if per == 1:
        return packed[:, :dim]
    shifts = jnp.arange(per, dtype=jnp.uint8) * bits
    codes = (packed[:, :, None] >> shifts) & jnp.uint8(2**bits - 1)
    return codes.reshape(packed.shape[0], -1)[:, :dim]


class ClientCache(NamedTuple):
    """How an algorithm stores its n per-client d-vectors (a pytree ``store`` with a leading client axis).

    * ``init(n, d) -> store``: all rows zero.
    * ``encode(values [k, d], key) -> rows``: the stored form of new rows.
    * ``decode(rows, d) -> float32 [k, d]``: the values the algorithm sees.
    * ``read(store, rows, d) -> float32 [k, d]``: decoded rows ``rows`` (through a gather, see ``read_rows``).
    * ``read_all(store, d) -> float32 [n, d]``: the whole cache, decoded (O(n d); for the direct rules).
    * ``write(store, rows, encoded) -> store``: sets rows (index ``n`` = dropped); to keep the write in place, the
      encoded values must be computed after every read of the store (:func:`replace_rows` does this).
    * ``bytes_per_client(d)``: memory of one row.

    ``code`` ("minmax" or "absmax") is the code of the int kinds (ignored by "float32" and "bfloat16").
    """

    kind: str
    rounding: str
    code: str = "minmax"

    @property
    def bits(self) -> int:
        return _BITS.get(self.kind, 32 if self.kind == "float32" else 16)

    def init(self, n: int, d: int, dtype: Any = jnp.float32) -> Any:
        """All rows zero; ``dtype`` is the run's precision (the "float32" kind's rows and the int kinds' scales)."""
        if self.kind == "float32":
            return jnp.zeros((n, d), dtype)
        if self.kind == "bfloat16":
            return jnp.zeros((n, d), jnp.uint16)  # the bits of bfloat16 values (see encode)
        codes = jnp.zeros((n, _packed_width(d, self.bits)), jnp.uint8)
        if self.code == "absmax":  # all rows zero: scale 0 (the codes are then irrelevant)
            return AbsmaxRows(codes=codes, scale=jnp.zeros((n,), dtype))
        return QuantizedRows(codes=codes, lo=jnp.zeros((n,), dtype), scale=jnp.zeros((n,), dtype))

    def encode(self, values: jax.Array, key: jax.Array | None) -> Any:
        if self.kind == "float32":  # exact: the run's precision (float64 rows in a float64 run)
            return values.astype(float_dtype(values))
        if self.kind == "bfloat16":
            # Stored as the raw 16 bits: XLA:CPU has no bfloat16 arithmetic and would otherwise convert the whole
            # n x d buffer to float32 and back to write one row.
            return jax.lax.bitcast_convert_type(values.astype(jnp.bfloat16), jnp.uint16)
        if self.code == "absmax":
            return quantize_absmax(values, self.bits, self.rounding, key)
        return quantize(values, self.bits, self.rounding, key)

    def decode(self, rows: Any, d: int) -> jax.Array:
        if self.kind == "float32":
            return rows
        if self.kind == "bfloat16":
            return jax.lax.bitcast_convert_type(rows, jnp.bfloat16).astype(jnp.float32)
        if self.code == "absmax":
            return dequantize_absmax(rows, self.bits, d)
        return dequantize(rows, self.bits, d)

    def read(self, store: Any, rows: jax.Array, d: int) -> jax.Array:
        return self.decode(jax.tree_util.tree_map(lambda a: read_rows(a, rows), store), d)

    def read_all(self, store: Any, d: int) -> jax.Array:
        return self.decode(store, d)

    def write(self, store: Any, rows: jax.Array, encoded: Any) -> Any:
        return jax.tree_util.tree_map(lambda a, v: a.at[rows].set(v, mode="drop"), store, encoded)

    def bytes_per_client(self, d: int) -> int:
        if self.kind in ("float32", "bfloat16"):
            return d * self.bits // 8
        return _packed_width(d, self.bits) + (4 if self.code == "absmax" else 8)  # float32 scale (and lo)


def _packed_width(d: int, bits: int) -> int:
    return math.ceil(d * bits / 8)


def make_cache(kind: str = "float32", rounding: str = "stochastic", code: str = "minmax") -> ClientCache:
    """A :class:`ClientCache` of ``kind`` in :data:`CACHE_KINDS`; ``rounding`` and ``code`` (:data:`CODES`) apply to
    the int kinds, and ``code="absmax"`` is refused with a float kind (it would silently mean nothing)."""
    if kind not in CACHE_KINDS:
        raise ValueError(f"cache must be one of {list(CACHE_KINDS)}, got {kind!r}")
    if rounding not in ROUNDINGS:
        raise ValueError(f"cache_rounding must be one of {list(ROUNDINGS)}, got {rounding!r}")
    if code not in CODES:
        raise ValueError(f"cache_code must be one of {list(CODES)}, got {code!r}")
    if code != "minmax" and kind not in _BITS:
        raise ValueError(f"cache_code={code!r} applies to the int caches {sorted(_BITS)}, not to cache={kind!r}")
    return ClientCache(kind=kind, rounding=rounding, code=code)


class Replaced(NamedTuple):
    """Result of :func:`replace_rows`."""

    store: Any  # the cache with the arrivals' rows replaced
    stored: jax.Array  # [M, d] the decoded values now stored for each arrival, Q(values)
    previous: jax.Array  # [M, d] the decoded value each arrival replaced (0 for padding)
    change: jax.Array  # [d] sum over real arrivals of (stored - previous): n times the change of the cache mean
    last: jax.Array  # bool [M] a real arrival that is its client's last of the step (its sum: the distinct clients)


def replace_rows(cache: ClientCache, store: Any, values: jax.Array, clients: jax.Array, mask: jax.Array,
                 key: jax.Array | None) -> Replaced:
    """Sets cache row ``clients[k]`` to ``values[k]`` for the real arrivals, in arrival order, in O(M d).

    A client that arrives twice in one step replaces, the second time, the value stored at its first arrival, and
    its row ends with its last value (the sequential rule). ``change`` is ``sum_k (stored_k - previous_k)``, so the
    mean of the rows moves by ``change / n``.
    """
    n = jax.tree_util.tree_leaves(store)[0].shape[0]
    d = values.shape[-1]
    rows = jnp.where(mask, clients, 0)
    old = cache.read(store, rows, d)
    # Encode values that depend on the read rows (see base.after), so XLA writes the new rows in place. This is done
    # on the float32 values: XLA folds ``x * 0`` for integer codes, which would drop the dependency.
    encoded = cache.encode(after(values.astype(float_dtype(values)), old), key)
    stored = cache.decode(encoded, d)
    earlier, has_later = _duplicates(rows, mask)
    previous = jnp.where((earlier >= 0)[:, None], stored[jnp.maximum(earlier, 0)], old)
    previous = jnp.where(mask[:, None], previous, 0.0)
    keep = mask & ~has_later  # a client's last arrival of the step wins
    store = cache.write(store, jnp.where(keep, rows, n), encoded)
    change = jnp.sum(jnp.where(mask[:, None], stored - previous, 0.0), axis=0)
    return Replaced(store=store, stored=stored, previous=previous, change=change, last=keep)


def _duplicates(rows: jax.Array, mask: jax.Array) -> tuple[jax.Array, jax.Array]:
    """For each arrival k: the index of the last earlier real arrival of the same client (-1 if none), and whether a
    later real arrival of the same client follows. O(M log M) (a stable sort by client), so an initialization round
    with M = n arrivals stays cheap."""
    m = rows.shape[0]
    position = jnp.arange(m)
    keys = jnp.where(mask, rows, jnp.max(rows) + 1 + position)  # padding never matches anything
    order = jnp.argsort(keys, stable=True)  # by client, then by arrival order
    sorted_keys = keys[order]
    same_as_previous = jnp.concatenate([jnp.zeros((1,), bool), sorted_keys[1:] == sorted_keys[:-1]])
    same_as_next = jnp.concatenate([sorted_keys[:-1] == sorted_keys[1:], jnp.zeros((1,), bool)])
    previous = jnp.concatenate([jnp.full((1,), -1, order.dtype), order[:-1]])
    last_earlier = jnp.zeros((m,), order.dtype).at[order].set(jnp.where(same_as_previous, previous, -1))
    has_later = jnp.zeros((m,), bool).at[order].set(same_as_next)
    return last_earlier, has_later
