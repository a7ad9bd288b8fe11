"""Fograph's degree-aware quantization (DAQ, §III-D step 1): each vertex's feature row gets a
bitwidth from its degree. Thresholds ``D1 < D2 < D3`` split degrees into ``[0, D1)``,
``[D1, D2)``, ``[D2, D3)``, ``[D3, inf)``, which get ``q0..q3`` bits per element (default
64/32/16/8: low-degree rows keep the most precision). 16 and 8 bits are a per-row linear
quantization (offset = row min, scale = range / (2^q - 1)); 32 and 64 bits are float32 /
float64 casts. :func:`theorem2_ratio` is the paper's closed form for the size ratio. The packed,
compressed blob is :mod:`gnnserve.features.codecs`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gnnserve.errors import InvalidInputError

WIDTHS = (64, 32, 16, 8)  # allowed bitwidths, in the blob's group order


@dataclass(frozen=True)
class DaqConfig:
    """DAQ thresholds ``(D1, D2, D3)`` (degrees, strictly increasing, >= 0) and bitwidths
    ``(q0, q1, q2, q3)`` (bits per feature element, each one of 64/32/16/8)."""

    thresholds: tuple[int, int, int]
    bits: tuple[int, int, int, int] = (64, 32, 16, 8)

    def __post_init__(self) -> None:
        t, b = tuple(self.thresholds), tuple(self.bits)
        ints = all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in t)
        if len(t) != 3 or not ints or t[0] < 0 or not t[0] < t[1] < t[2]:
            raise InvalidInputError(
                f"thresholds must be 3 strictly increasing integers >= 0, got {t}", "thresholds"
            )
        if len(b) != 4 or any(v not in WIDTHS for v in b):
            raise InvalidInputError(f"bits must be 4 widths from {WIDTHS}, got {b}", "bits")
        object.__setattr__(self, "thresholds", tuple(int(v) for v in t))
        object.__setattr__(self, "bits", tuple(int(v) for v in b))

    @classmethod
    def for_degrees(
        cls, degrees: np.ndarray, bits: tuple[int, int, int, int] = (64, 32, 16, 8)
    ) -> DaqConfig:
        """The config with :func:`degree_thresholds` of ``degrees`` and the given ``bits``."""
        return cls(degree_thresholds(degrees), bits)


def _degrees(degrees: np.ndarray) -> np.ndarray:
    d = np.asarray(degrees)
    if d.ndim != 1 or (d.size and not np.issubdtype(d.dtype, np.integer)):
        raise InvalidInputError(f"degrees must be a 1-D integer array, got {d.dtype}", "degrees")
    if d.size and d.min() < 0:
        raise InvalidInputError("degrees must be >= 0", "degrees")
    return d.astype(np.int64)


def degree_thresholds(degrees: np.ndarray) -> tuple[int, int, int]:
    """Degree quartiles as DAQ thresholds: ``D_k`` is the smallest integer degree with at least
    ``k/4`` of the vertices below it (degree < D_k), so each interval holds about a quarter.

    Ties (a degree shared by over a quarter of the vertices) would repeat a threshold; then
    ``D_k = D_{k-1} + 1``, which keeps them strictly increasing (an interval may be empty).
    """
    d = np.sort(_degrees(degrees))
    if d.size == 0:
        raise InvalidInputError("degree_thresholds needs at least one degree", "degrees")
    ranks = [(k * d.size + 3) // 4 for k in (1, 2, 3)]  # ceil(k N / 4) >= 1
    d1, d2, d3 = (int(d[m - 1]) + 1 for m in ranks)
    d2 = max(d2, d1 + 1)
    return d1, d2, max(d3, d2 + 1)


def bits_per_vertex(degrees: np.ndarray, config: DaqConfig) -> np.ndarray:
    """The target bitwidth of each vertex, ``uint8 [N]``: ``q_i`` for degree in interval i."""
    interval = np.searchsorted(np.asarray(config.thresholds), _degrees(degrees), side="right")
    return np.asarray(config.bits, dtype=np.uint8)[interval]


def uniform_bits(n: int, q: int = 8) -> np.ndarray:
    """Every one of ``n`` rows at ``q`` bits (the uniform-quantization baseline), ``uint8 [n]``."""
    if q not in WIDTHS or n < 0:
        raise InvalidInputError(f"need n >= 0 and q in {WIDTHS}, got n={n}, q={q}", "bits")
    return np.full(n, q, dtype=np.uint8)


def theorem2_ratio(degrees: np.ndarray, config: DaqConfig, source_bits: int = 64) -> float:
    """Theorem 2: DAQ size / original size = (1/Q)[q3 - sum_i F_D(D_i)(q_i - q_{i-1})].

    ``Q = source_bits`` (bits per input element). The intervals are half-open ``[D_i, D_i+1)``,
    so F_D(D_i) here is ``P(D < D_i) = P(D <= D_i - 1)`` (the paper's ``P(D <= D_i)`` would
    count vertices of degree exactly D_i in the wrong interval); the result then equals
    ``quantized_bytes(bits_per_vertex(degrees, config), F) / (N F Q / 8)`` exactly.
    """
    d = _degrees(degrees)
    if d.size == 0 or source_bits <= 0:
        raise InvalidInputError("theorem2_ratio needs degrees and source_bits > 0", "degrees")
    below = np.array([np.count_nonzero(d < t) for t in config.thresholds]) / d.size
    q = np.asarray(config.bits, dtype=np.float64)
    return float((q[3] - np.sum(below * (q[1:] - q[:-1]))) / source_bits)


def quantized_bytes(bits: np.ndarray, dim: int) -> int:
    """Bytes of the quantized values alone: sum over rows of ``dim * q / 8`` (no metadata)."""
    b = np.asarray(bits)
    b = check_bits(b, len(b) if b.ndim == 1 else -1)
    if dim < 0:
        raise InvalidInputError(f"dim must be >= 0, got {dim}", "dim")
    return int(np.sum(b // 8, dtype=np.int64)) * int(dim)


def linear_quantize(rows: np.ndarray, q: int) -> tuple[np.ndarray, np.ndarray]:
    """Per-row linear quantization to ``q`` in {8, 16} bits.

    Returns ``params`` float32 ``[n, 2]`` (offset = row min, scale = (max - min) / (2^q - 1);
    a constant row gets scale 0) and codes ``uint8/uint16 [n, F]``, rounded to nearest.
    """
    levels = (1 << q) - 1
    x = np.asarray(rows, dtype=np.float64)
    offset = (x.min(axis=1) if x.shape[1] else np.zeros(x.shape[0])).astype(np.float32)
    top = x.max(axis=1) if x.shape[1] else np.zeros(x.shape[0])
    span = np.maximum(top - offset.astype(np.float64), 0.0)
    scale = (span / levels).astype(np.float32)
    safe = np.where(scale > 0, scale, np.float32(1)).astype(np.float64)
    codes = np.rint((x - offset.astype(np.float64)[:, None]) / safe[:, None])
    np.clip(codes, 0, levels, out=codes)
    dtype = np.uint8 if q == 8 else np.uint16
    return np.stack([offset, scale], axis=1), codes.astype(dtype)


def linear_dequantize(params: np.ndarray, codes: np.ndarray) -> np.ndarray:
    """Inverse of :func:`linear_quantize`: ``offset + code * scale`` per row, float32 ``[n, F]``."""
    p = params.astype(np.float64)
    return (p[:, :1] + codes.astype(np.float64) * p[:, 1:]).astype(np.float32)


def check_bits(bits: np.ndarray, n: int, widths: tuple[int, ...] = WIDTHS) -> np.ndarray:
    """``bits`` as uint8 [n], each one of ``widths``; InvalidInputError naming the first bad
    entry otherwise."""
    b = np.asarray(bits)
    if b.ndim != 1 or b.shape[0] != n or (b.size and not np.issubdtype(b.dtype, np.integer)):
        raise InvalidInputError(
            f"bits must be 1-D integers, one per row ({n}), got {b.shape}", "bits"
        )
    bad = ~np.isin(b, widths)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise InvalidInputError(f"bits[{i}] = {b[i]} is not one of {widths}", "bits")
    return b.astype(np.uint8)
