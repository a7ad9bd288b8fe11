"""Choosing the continuous-readings quantizer per deployment by a measured accuracy budget
(issue 28 part 4).

The candidates (:data:`LADDER`) give each degree quartile a width of 4 to 16 bits, from the
fewest bytes to the most. A trial quantizes the start-up readings as the devices would send them
(:func:`~gnnserve.features.column_codec.column_round_trip` per blob of the devices' chunk size,
each blob with its own column ranges), runs the model
on the whole graph and counts the vertices whose answer (argmax) differs from float32's. A
changed answer is the strict measure: accuracy on any labelled set moves by at most the share of
its answers that changed. The choice is the lowest rung within ``budget_pts`` percent, found by
bisection (about log2(49) = 6 full-graph forwards; fewer bits change more answers, up to the
noise of a few vertices). When even the top rung is over budget, uploads are lossless
(float32 + LZ4).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

import numpy as np
import torch

from gnnserve.errors import InvalidInputError
from gnnserve.features.column_codec import column_bits, column_round_trip, pack_columns
from gnnserve.features.quantize import DaqConfig, bits_per_vertex
from gnnserve.models.zoo import GNN

log = logging.getLogger(__name__)
FLOAT32_DAQ_BITS = (32, 32, 16, 8)  # Fograph's <64,32,16,8> with full precision = float32


def _ladder(low: int = 4, high: int = 16) -> tuple[tuple[int, int, int, int], ...]:
    """Widths from ``low`` to ``high`` bits in quarter-bit steps of the mean: each step gives
    one more quartile one more bit, the low-degree quartiles first (a low-degree vertex's own
    reading weighs most in its answer)."""
    out: list[tuple[int, int, int, int]] = []
    for b in range(low, high):
        out += [(b + (k > 0), b + (k > 1), b + (k > 2), b) for k in range(4)]
    return (*out, (high,) * 4)


LADDER: tuple[tuple[int, int, int, int], ...] = _ladder()


@dataclass(frozen=True)
class Trial:
    """One candidate's measurement."""

    widths: tuple[int, int, int, int]  # bits per degree quartile, low degrees first
    changed_pts: float  # percent of vertices whose answer (argmax) differs from float32's
    packed_ratio: float  # float32 bytes / packed bytes of all readings


@dataclass(frozen=True)
class QuantizerChoice:
    """The chosen widths (None: no candidate within budget, upload lossless), the per-row bits
    they give (uint8 [N]) and the bisection's trials in ladder order."""

    widths: tuple[int, int, int, int] | None
    bits: np.ndarray | None
    budget_pts: float
    trials: list[Trial] = field(default_factory=list)
    took_s: float = 0.0

    @property
    def chosen(self) -> Trial | None:
        """The trial of the chosen widths (None: lossless)."""
        return next((t for t in self.trials if t.widths == self.widths), None)

    @property
    def packed_ratio(self) -> float:
        """float32 bytes / packed bytes of the choice (1.0 when lossless was chosen)."""
        return self.chosen.packed_ratio if self.chosen is not None else 1.0


def graph_edges(indptr: np.ndarray, indices: np.ndarray) -> torch.Tensor:
    """int64 [2, E] (source, destination) of a graph given by its in-neighbour CSR."""
    dst = np.repeat(np.arange(indptr.size - 1), np.diff(indptr))
    return torch.from_numpy(np.stack([np.asarray(indices, np.int64), dst]))


def full_graph_answers(model: GNN, edges: torch.Tensor, features: np.ndarray) -> np.ndarray:
    """The model's argmax per vertex on the whole graph (``edges`` from :func:`graph_edges`),
    int64 [N]."""
    with torch.inference_mode():
        out = model.eval()(torch.from_numpy(np.asarray(features, np.float32)), edges)
    return out.argmax(1).numpy()


def choose_widths(
    model: GNN,
    indptr: np.ndarray,
    indices: np.ndarray,
    features: np.ndarray,
    budget_pts: float = 0.1,
    ladder: tuple[tuple[int, int, int, int], ...] = LADDER,
    chunk_rows: int | None = None,
) -> QuantizerChoice:
    """The fewest-bytes widths of ``ladder`` (ordered by bytes) whose answers change on at most
    ``budget_pts`` percent of the vertices, by bisection (see the module doc); logs each
    trial. ``chunk_rows``: the readings are packed in blobs of that many consecutive rows, as
    the device groups send them (each blob has its own column ranges); None: one blob."""
    if not 0 <= budget_pts <= 100:
        raise InvalidInputError(f"budget_pts must be in [0, 100], got {budget_pts}", "budget_pts")
    t0 = time.perf_counter()
    degrees = np.diff(indptr)
    edges = graph_edges(indptr, indices)  # once: every trial runs on the same graph
    reference = full_graph_answers(model, edges, features)
    raw_bytes = features.shape[0] * features.shape[1] * 4
    trials: dict[int, Trial] = {}

    step = max(1, chunk_rows or features.shape[0])
    blobs = [slice(lo, lo + step) for lo in range(0, features.shape[0], step)]

    def fits(rung: int) -> bool:
        bits = column_bits(degrees, ladder[rung])
        seen = np.concatenate([column_round_trip(features[b], bits[b]) for b in blobs])
        changed = 100.0 * float(np.mean(full_graph_answers(model, edges, seen) != reference))
        packed = sum(len(pack_columns(features[b], bits[b])) for b in blobs)
        ratio = raw_bytes / max(1, packed)
        trials[rung] = Trial(ladder[rung], changed, ratio)
        log.info("fog quantizer %s: %.3f%% answers changed, %.2fx", ladder[rung], changed, ratio)
        return changed <= budget_pts

    lo, hi = 0, len(ladder) - 1  # invariant: every rung below lo failed, rung hi fits
    if not fits(hi):
        return QuantizerChoice(
            None, None, budget_pts, list(trials.values()), time.perf_counter() - t0
        )
    while lo < hi:
        mid = (lo + hi) // 2
        if fits(mid):
            hi = mid
        else:
            lo = mid + 1
    order = [trials[r] for r in sorted(trials)]
    bits = column_bits(degrees, ladder[hi])
    return QuantizerChoice(ladder[hi], bits, budget_pts, order, time.perf_counter() - t0)


@dataclass(frozen=True)
class UploadWidths:
    """How the device groups upload: per-vertex widths (None: raw float32), the codec they are
    for (daq | column) and the column codec's calibration when it ran."""

    bits: np.ndarray | None
    codec: str = "daq"
    quantizer: QuantizerChoice | None = None


def upload_widths(
    model: GNN,
    indptr: np.ndarray,
    indices: np.ndarray,
    features: np.ndarray,
    compress: bool,
    codec: str,
    daq_bits: tuple[int, int, int, int] = FLOAT32_DAQ_BITS,
    budget_pts: float = 0.1,
    ladder: tuple[tuple[int, int, int, int], ...] = LADDER,
    chunk_rows: int | None = None,
) -> UploadWidths:
    """The widths for a deployment's ``codec``: raw without ``compress``; DAQ's degree-aware
    widths (``daq``); 32 bits for every row (``lossless``: LZ4 alone); or ``column``, widths
    chosen from ``ladder`` by :func:`choose_widths` on blobs of ``chunk_rows`` rows (lossless
    when none is within ``budget_pts``)."""
    degrees = np.diff(indptr)
    if not compress:
        return UploadWidths(None)
    choice = None
    if codec == "column":
        choice = choose_widths(model, indptr, indices, features, budget_pts, ladder, chunk_rows)
        if choice.chosen is not None:
            log.info(
                "fog: column codec at %s bits, %.2fx fewer bytes, %.3f%% answers changed "
                "(budget %.3f%%; chosen in %.1f s)",
                choice.widths, choice.packed_ratio, choice.chosen.changed_pts, budget_pts,
                choice.took_s,
            )  # fmt: skip
            return UploadWidths(choice.bits, "column", choice)
        log.warning("fog: no column widths within %.3f%% changed answers: lossless", budget_pts)
        codec = "lossless"
    if codec == "lossless":
        return UploadWidths(np.full(degrees.size, 32, dtype=np.uint8), "daq", choice)
    return UploadWidths(bits_per_vertex(degrees, DaqConfig.for_degrees(degrees, daq_bits)))
