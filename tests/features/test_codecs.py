"""DAQ + LZ4 (features.quantize, features.codecs): Theorem 2 against measured sizes and
quartile thresholds against plain counts; round trips against per-row error bounds; the blob
checked chunk by chunk with blosc2 itself (LZ4, bit shuffle); bad and corrupted input refused."""

from __future__ import annotations

import zlib

import blosc2
import numpy as np
import pytest

from gnnserve.errors import InvalidInputError
from gnnserve.features.codecs import CorruptBlobError, inspect_blob, pack, unpack
from gnnserve.features.quantize import (
    DaqConfig,
    bits_per_vertex,
    degree_thresholds,
    linear_dequantize,
    linear_quantize,
    quantized_bytes,
    theorem2_ratio,
    uniform_bits,
)

EPS32 = float(np.finfo(np.float32).eps)


def power_law_degrees(n: int, seed: int, a: float = 2.0) -> np.ndarray:
    """Zipf-distributed degrees (minus one, so degree 0 occurs), capped at 10^5."""
    return np.minimum(np.random.default_rng(seed).zipf(a, n) - 1, 100_000)


def plain_bits(degrees: np.ndarray, config: DaqConfig) -> list[int]:
    """The width of each vertex by walking its degree through the intervals in Python."""
    d1, d2, d3 = config.thresholds
    q0, q1, q2, q3 = config.bits
    out = []
    for d in degrees.tolist():
        out.append(q0 if d < d1 else q1 if d < d2 else q2 if d < d3 else q3)
    return out


def sparse_features(n: int, f: int, seed: int, density: float = 0.05) -> np.ndarray:
    rng = np.random.default_rng(seed)
    values = rng.standard_normal((n, f)) * 3
    return np.where(rng.random((n, f)) < density, values, 0.0).astype(np.float32)


def half_step_bound(x: np.ndarray, q: int) -> np.ndarray:
    """Per-row bound on |decoded - x|: half a quantization step plus float32 rounding."""
    x64 = x.astype(np.float64)
    step = (x64.max(axis=1) - x64.min(axis=1)) / (2**q - 1)
    return (step / 2 * (1 + 1e-6) + 2 * EPS32 * np.abs(x64).max(axis=1))[:, None]


CONFIGS = [
    None,  # quartile thresholds, default bits
    DaqConfig((1, 5, 20)),
    DaqConfig((0, 1, 2), (8, 16, 32, 64)),
    DaqConfig((3, 4, 1000), (16, 64, 8, 32)),
]


@pytest.mark.parametrize("config", CONFIGS)
@pytest.mark.parametrize("seed", [0, 1])
def test_theorem2_equals_measured_quantized_size_and_a_per_vertex_sum(
    config: DaqConfig | None, seed: int
) -> None:
    degrees = power_law_degrees(3000, seed, a=1.6 + 0.5 * seed)
    cfg = config or DaqConfig.for_degrees(degrees)
    bits = bits_per_vertex(degrees, cfg)
    expected_bits = plain_bits(degrees, cfg)
    assert bits.tolist() == expected_bits
    n, dim = degrees.size, 24
    for q_src in (64, 32):
        brute = sum(expected_bits) / (n * q_src)
        measured = quantized_bytes(bits, dim) / (n * dim * q_src / 8)
        ratio = theorem2_ratio(degrees, cfg, source_bits=q_src)
        assert ratio == pytest.approx(brute, rel=1e-12)
        assert ratio == pytest.approx(measured, rel=1e-12)


def test_theorem2_on_a_hand_counted_example() -> None:
    degrees = np.arange(8)  # two vertices per interval of (2, 4, 6)
    cfg = DaqConfig((2, 4, 6))
    assert bits_per_vertex(degrees, cfg).tolist() == [64, 64, 32, 32, 16, 16, 8, 8]
    assert theorem2_ratio(degrees, cfg) == 30 / 64  # mean width 30 bits
    assert theorem2_ratio(degrees, cfg, source_bits=32) == 30 / 32
    assert quantized_bytes(bits_per_vertex(degrees, cfg), 10) == 8 * 30 * 10 // 8


def test_blob_reports_the_theorem2_quantized_size() -> None:
    degrees = power_law_degrees(500, 3)
    cfg = DaqConfig.for_degrees(degrees)
    bits = bits_per_vertex(degrees, cfg)
    x = sparse_features(500, 16, 3)
    info = inspect_blob(pack(x, bits))
    assert info.quantized_bytes == quantized_bytes(bits, 16)
    assert info.quantized_bytes / (500 * 16 * 8) == pytest.approx(
        theorem2_ratio(degrees, cfg), rel=1e-12
    )
    counts = {q: int(np.sum(bits == q)) for q in (64, 32, 16, 8)}
    assert info.counts == counts
    # values + one width byte per row + float32 (offset, scale) per 16/8-bit row
    assert info.serialized_bytes == info.quantized_bytes + 500 + 8 * (counts[16] + counts[8])


def test_quartile_thresholds_split_a_smooth_distribution_into_quarters() -> None:
    degrees = np.random.default_rng(4).integers(0, 2000, 40_000)
    d1, d2, d3 = degree_thresholds(degrees)
    for k, t in enumerate((d1, d2, d3), start=1):
        assert np.mean(degrees < t) >= k / 4  # at least k/4 below ...
        assert np.mean(degrees < t - 1) < k / 4  # ... and t is the smallest such degree
    shares = np.bincount(bits_per_vertex(degrees, DaqConfig((d1, d2, d3))), minlength=65)
    for q in (64, 32, 16, 8):
        assert shares[q] / degrees.size == pytest.approx(0.25, abs=0.01)


@pytest.mark.parametrize(
    ("degrees", "expected"),
    [
        (np.array([0] * 100), (1, 2, 3)),
        (np.array([1] * 70 + [2] * 20 + [50] * 10), (2, 3, 4)),
        (np.array([7]), (8, 9, 10)),
    ],
)
def test_quartile_thresholds_strictly_increase_on_tied_degrees(
    degrees: np.ndarray, expected: tuple[int, int, int]
) -> None:
    assert degree_thresholds(degrees) == expected
    DaqConfig(degree_thresholds(degrees))  # accepted as a config


def test_power_law_thresholds_are_a_valid_config() -> None:
    t = degree_thresholds(power_law_degrees(10_000, 5))
    assert t[0] < t[1] < t[2]


@pytest.mark.parametrize(
    ("thresholds", "bits", "field"),
    [
        ((5, 5, 6), (64, 32, 16, 8), "thresholds"),
        ((3, 2, 6), (64, 32, 16, 8), "thresholds"),
        ((-1, 2, 6), (64, 32, 16, 8), "thresholds"),
        ((1, 2), (64, 32, 16, 8), "thresholds"),
        ((1.5, 2, 6), (64, 32, 16, 8), "thresholds"),
        ((1, 2, 3), (64, 32, 16, 4), "bits"),
        ((1, 2, 3), (64, 32, 16), "bits"),
    ],
)
def test_config_validation_names_the_bad_field(
    thresholds: tuple[int, ...], bits: tuple[int, ...], field: str
) -> None:
    with pytest.raises(InvalidInputError) as info:
        DaqConfig(thresholds, bits)  # type: ignore[arg-type]
    assert info.value.field == field


def test_bad_degrees_are_refused() -> None:
    for bad in (np.array([1, -2, 3]), np.array([1.5, 2.0]), np.zeros((2, 2), np.int64)):
        with pytest.raises(InvalidInputError) as info:
            degree_thresholds(bad)
        assert info.value.field == "degrees"
    with pytest.raises(InvalidInputError):
        degree_thresholds(np.array([], np.int64))


@pytest.mark.parametrize("q", [64, 32])
def test_64_and_32_bits_are_exact_for_float32(q: int) -> None:
    rng = np.random.default_rng(6)
    x = (rng.standard_normal((300, 20)) * 10.0 ** rng.integers(-30, 30, (300, 1))).astype(
        np.float32
    )
    y = unpack(pack(x, uniform_bits(300, q)))
    assert y.dtype == np.float32
    assert np.array_equal(y, x)


def test_float64_input_at_64_bits_decodes_to_its_float32_rounding() -> None:
    x = np.random.default_rng(7).standard_normal((50, 9))
    assert np.array_equal(unpack(pack(x, uniform_bits(50, 64))), x.astype(np.float32))


@pytest.mark.parametrize("q", [16, 8])
def test_linear_quantization_error_is_at_most_half_a_step(q: int) -> None:
    rng = np.random.default_rng(8)
    x = rng.standard_normal((400, 33)) * rng.uniform(1e-3, 1e3, (400, 1))
    x += rng.uniform(-1e4, 1e4, (400, 1))  # large offsets, small ranges
    x[::7] = x[::7, :1]  # constant rows
    x = x.astype(np.float32)
    y = unpack(pack(x, uniform_bits(400, q)))
    err = np.abs(y.astype(np.float64) - x.astype(np.float64))
    assert np.all(err <= half_step_bound(x, q))
    assert np.array_equal(y[::7], x[::7])  # constant rows exact
    varying = np.ones(400, bool)
    varying[::7] = False
    step = (x[varying].max(axis=1) - x[varying].min(axis=1)).astype(np.float64) / (2**q - 1)
    assert np.max(err[varying] / step[:, None]) > 0.4  # really quantized, not stored exactly


def test_quantize_codes_span_the_full_range() -> None:
    x = np.array([[-2.0, 1.0, 2.0], [1.0, 1.0, 1.0]], np.float32)
    params, codes = linear_quantize(x, 8)
    assert codes.dtype == np.uint8 and codes.tolist() == [
        [0, 191, 255],
        [0, 0, 0],
    ]  # 3 / (4/255) = 191.25
    assert params.tolist() == [[-2.0, np.float32(4.0 / 255)], [1.0, 0.0]]
    assert linear_quantize(x, 16)[1].dtype == np.uint16
    assert np.array_equal(linear_dequantize(params, codes)[1], x[1])


def test_mixed_widths_keep_row_order() -> None:
    rng = np.random.default_rng(9)
    x = rng.standard_normal((600, 12)).astype(np.float32)
    bits = rng.choice(np.array([64, 32, 16, 8]), 600)
    y = unpack(pack(x, bits))
    for q in (64, 32, 16, 8):
        rows = bits == q
        alone = unpack(pack(x[rows], uniform_bits(int(rows.sum()), q)))
        assert np.array_equal(y[rows], alone)  # each row decoded as in its own group
    exact = bits >= 32
    assert np.array_equal(y[exact], x[exact])
    for q in (16, 8):
        rows = bits == q
        assert np.all(np.abs(y[rows] - x[rows]) <= half_step_bound(x[rows], q))


@pytest.mark.parametrize("shape", [(0, 5), (6, 0), (0, 0)])
def test_empty_shapes_round_trip(shape: tuple[int, int]) -> None:
    x = np.zeros(shape, np.float32)
    bits = np.array([64, 32, 16, 8, 8, 16][: shape[0]])
    y = unpack(pack(x, bits))
    assert y.shape == shape and y.dtype == np.float32
    assert inspect_blob(pack(x, bits)).quantized_bytes == 0


def test_sparse_features_compress_with_lz4_and_bitshuffle() -> None:
    n, f = 2000, 128
    x = sparse_features(n, f, 10)
    degrees = power_law_degrees(n, 10, a=1.5)
    bits = bits_per_vertex(degrees, DaqConfig.for_degrees(degrees))
    blob = pack(x, bits)
    info = inspect_blob(blob)
    assert len(blob) == info.packed_bytes < 0.6 * info.serialized_bytes
    assert len(blob) < 0.35 * x.nbytes  # the float32 input
    uniform8 = pack(x, uniform_bits(n, 8))
    assert len(uniform8) < 0.2 * x.nbytes  # vs 0.25 for the 8-bit codes alone
    # every chunk is a blosc2 LZ4 chunk behind the bit-shuffle filter, and together they
    # decompress to exactly the serialized sections, the row widths first
    raw = b""
    for chunk in info.chunks:
        assert blosc2.get_clib(chunk) == "LZ4"
        assert chunk[2] >> 5 == 1  # blosc2 header: compressor format LZ4
        assert blosc2.Filter.BITSHUFFLE.value in chunk[16:22]  # blosc2 header: filter pipeline
        raw += blosc2.decompress2(chunk)
    assert len(raw) == info.serialized_bytes
    assert np.array_equal(np.frombuffer(raw[:n], np.uint8), bits)
    assert np.array_equal(np.frombuffer(raw[n : n + 8 * f * info.counts[64]], "<f8"),
                          x[bits == 64].astype(np.float64).ravel())  # fmt: skip


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_features_are_refused(bad: float) -> None:
    x = np.ones((5, 3), np.float32)
    x[3, 1] = bad
    with pytest.raises(InvalidInputError, match="NaN or inf") as info:
        pack(x, uniform_bits(5))
    assert info.value.field == "features"


def test_bad_features_and_bits_are_refused() -> None:
    x = np.ones((5, 3), np.float32)
    cases = [
        (x, np.full(4, 8), "bits"),
        (x, np.full(6, 8), "bits"),
        (x, np.full((5, 1), 8), "bits"),
        (x, np.array([8, 8, 12, 8, 8]), "bits"),
        (x, np.full(5, 8.0), "bits"),
        (np.ones(5, np.float32), np.full(5, 8), "features"),
        (np.ones((5, 3), np.int64), np.full(5, 8), "features"),
        (np.full((5, 3), 1e300), np.full(5, 8), "features"),  # past float32
    ]
    for features, bits, field in cases:
        with pytest.raises(InvalidInputError) as info:
            pack(features, bits)
        assert info.value.field == field
    with pytest.raises(InvalidInputError):
        uniform_bits(3, 4)
    with pytest.raises(InvalidInputError):
        quantized_bytes(np.array([8, 9]), 3)


@pytest.fixture(scope="module")
def blob() -> bytes:
    rng = np.random.default_rng(11)
    bits = rng.choice(np.array([64, 32, 16, 8]), 300)
    return pack(sparse_features(300, 40, 11, density=0.3), bits)


def test_corrupted_and_truncated_blobs_raise_the_typed_error(blob: bytes) -> None:
    bad_blobs = [b"", b"GDAQ", blob[:40], blob[: len(blob) // 2], blob[:-1], blob + b"\0"]
    for pos in (0, 5, 20, len(blob) // 3, len(blob) // 2, len(blob) - 10, len(blob) - 1):
        flipped = bytearray(blob)
        flipped[pos] ^= 0x5A
        bad_blobs.append(bytes(flipped))
    for bad in bad_blobs:
        with pytest.raises(CorruptBlobError) as info:
            unpack(bad)
        assert info.value.field == "blob" and "packed feature blob" in info.value.message
        with pytest.raises(CorruptBlobError):
            inspect_blob(bad)
    assert issubclass(CorruptBlobError, InvalidInputError)


def with_crc(body: bytes) -> bytes:
    return body + zlib.crc32(body).to_bytes(4, "little")


def test_tampered_blobs_with_a_valid_checksum_never_crash(blob: bytes) -> None:
    body = blob[:-4]
    header_n = bytearray(body)
    header_n[8] ^= 1  # N no longer matches the group counts
    with pytest.raises(CorruptBlobError, match="inconsistent header"):
        unpack(with_crc(bytes(header_n)))
    rng = np.random.default_rng(12)
    outcomes = set()
    for pos in rng.integers(0, len(body), 150):
        tampered = bytearray(body)
        tampered[pos] ^= int(rng.integers(1, 256))
        try:
            y = unpack(with_crc(bytes(tampered)))
        except CorruptBlobError:
            outcomes.add("refused")
        else:  # a flipped value byte can decode; it must still be a finite [N, F] float32
            assert y.shape == (300, 40) and y.dtype == np.float32 and np.isfinite(y).all()
            outcomes.add("decoded")
    assert "refused" in outcomes
