"""TieredFeatures: a FeatureStore whose rows live in the tiers a :class:`TierPlan` gives them.

Tiers, by name (a plan uses any of them, fastest first; see ``features.placement``):

* ``gpu``: rows in a CUDA tensor when ``torch.cuda.is_available()``; on a machine without one
  the tier's rows are held in host memory instead (a warning says so; the counters keep the
  tier's name, :class:`TierCounts` its ``medium``).
* ``ram``: rows copied into host memory (a float32 tensor), gathered by the numba kernel.
* ``disk``: rows copied, in tier order, into a file this class writes (``<tier_dir>/disk.bin``,
  the store's feature dtype) and read through ``np.memmap``.
* ``remote`` (cold): when the store is given as a URL (``s3://`` or ``file://``), the object-store
  backend :class:`RemoteFeatures` (byte-range reads); when it is given as a plain path, the
  store's own ``features.bin`` through a second, separate memory map (no O_DIRECT).

The upper tiers are filled from the same source (the URL's remote backend or the local store).
Reads are exact: each tier's rows are gathered with one vectorised call and scattered into the
output in request order. Every read counts rows and bytes per tier: :meth:`TieredFeatures.stats`
(a dataclass snapshot) and Prometheus counters ``gnnserve_features_tier_hits_total{tier}`` and
``gnnserve_features_tier_bytes_total{tier}`` plus gauges ``gnnserve_features_tier_rows{tier}``
and ``gnnserve_features_tier_resident_bytes{tier}`` (rows and bytes held), in a registry of the
store's own unless one is passed (one tiered store per registry, like ``ServerMetrics``).
"""

from __future__ import annotations

import logging
import shutil
import tempfile
import threading
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest

from gnnserve.data import layout
from gnnserve.data.blobs import open_blobs
from gnnserve.errors import InvalidInputError
from gnnserve.features.base import FeatureStore, open_feature_store
from gnnserve.features.placement import TierPlan, tier_plan
from gnnserve.features.remote import RemoteFeatures
from gnnserve.features.stores import gather_rows
from gnnserve.urls import Location, local_path, resolve

log = logging.getLogger(__name__)

TIERS = ("gpu", "ram", "disk", "remote")  # tier names TieredFeatures knows, fastest first
_CHUNK_ROWS = 1 << 16  # rows copied per step when filling a tier


@dataclass(frozen=True)
class TierCounts:
    """One tier: what it holds and what reads found in it since the store was opened."""

    tier: str  # tier name from the plan
    medium: str  # "cuda" | "host" | "mmap" | "remote" (object store) | "mmap-store" (cold mmap)
    resident_rows: int  # rows the tier holds
    resident_bytes: int  # bytes the tier holds (0 for the cold tier: it is the store itself)
    rows_read: int  # rows served from this tier (duplicates in a request count each time)
    bytes_read: int  # rows_read * row bytes in the tier's dtype


@dataclass(frozen=True)
class TierStats:
    """Snapshot of every tier's counters, fastest tier first."""

    tiers: tuple[TierCounts, ...]
    reads: int  # get / get_valid calls served

    @property
    def rows_read(self) -> int:
        """Rows served by all tiers."""
        return sum(t.rows_read for t in self.tiers)

    def hit_rate(self, tier: str) -> float:
        """Share of the rows read that tier ``tier`` served (0 before any read)."""
        total = self.rows_read
        return sum(t.rows_read for t in self.tiers if t.tier == tier) / total if total else 0.0


class TierMetrics:
    """Prometheus collectors of a server's tiered stores, in ``registry`` or one of their own.

    One instance outlives re-placements (each new store is handed the previous one's):
    the read counters carry a ``placement`` label (0 for the first, then 1, 2, ...), so what an
    earlier placement served stays visible; the held-rows gauges show the current placement.
    """

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        self.hits = Counter(
            "gnnserve_features_tier_hits_total",
            "Feature rows read per tier and placement",
            ["tier", "placement"],
            registry=r,
        )
        self.bytes = Counter(
            "gnnserve_features_tier_bytes_total",
            "Feature bytes read per tier and placement",
            ["tier", "placement"],
            registry=r,
        )
        self.rows = Gauge("gnnserve_features_tier_rows", "Feature rows held", ["tier"], registry=r)
        self.resident = Gauge(
            "gnnserve_features_tier_resident_bytes", "Feature bytes held", ["tier"], registry=r
        )
        self.placement = Gauge(
            "gnnserve_features_placement", "Placement in use (0 = the first)", registry=r
        )

    def render(self) -> bytes:
        """The exposition text."""
        return generate_latest(self.registry)


@dataclass
class _Tier:
    """A tier's reader: ``read(ids, rows)`` -> float32 [n, F] for node ids and tier rows."""

    name: str
    medium: str
    rows: int
    resident_bytes: int
    read: Callable[[np.ndarray, np.ndarray], torch.Tensor]


def _is_url(store: Location) -> bool:
    """True when ``store`` is given as an ``s3://`` or ``file:`` URL (not a plain path)."""
    return isinstance(store, str) and (
        resolve(store, "store").scheme == "s3" or store.startswith("file:")
    )


class TieredFeatures(FeatureStore):
    """The features of ``store`` (a path, or an ``s3://`` / ``file://`` URL) placed by ``plan``.

    ``tier_dir``: where the disk tier's file is written (default: a temporary directory removed
    with the store). ``metrics``: the tier collectors to count into (default: new ones; a
    re-placement passes the previous store's), under placement number ``placement``.
    ``gap``: byte gap merged between ranges by the remote backend; ``options``: blob-store
    settings for an ``s3://`` store (endpoint, credentials; default from the environment).
    Reads after :meth:`close` fail.
    """

    def __init__(
        self,
        store: Location,
        plan: TierPlan,
        tier_dir: str | Path | None = None,
        metrics: TierMetrics | None = None,
        placement: int = 0,
        gap: int = 0,
        options: Mapping[str, str] | None = None,
    ) -> None:
        self.meta, self.source, self._cold_medium = _open_source(store, gap, options)
        if plan.num_nodes != self.meta.num_nodes:
            raise InvalidInputError(
                f"plan places {plan.num_nodes} nodes, the store has {self.meta.num_nodes}", "plan"
            )
        unknown = [t for t in plan.names if t not in TIERS]
        if unknown:
            raise InvalidInputError(f"unknown tiers {unknown}; known: {list(TIERS)}", "plan")
        self.plan = plan
        self._dtype = np.dtype(self.meta.feature_dtype).newbyteorder("<")
        self.row_bytes = self.meta.feature_dim * self._dtype.itemsize  # on disk / remote
        self._tier_dir = self._make_dir(tier_dir)
        self._tiers = [self._build(i, name) for i, name in enumerate(plan.names)]
        self._rows_read = np.zeros(len(self._tiers), dtype=np.int64)
        self._reads = 0
        self._lock = threading.Lock()
        self.metrics = metrics if metrics is not None else TierMetrics()
        self.placement = str(placement)
        self.metrics.placement.set(placement)
        for t in self._tiers:
            self.metrics.rows.labels(t.name).set(t.rows)
            self.metrics.resident.labels(t.name).set(t.resident_bytes)
            self.metrics.hits.labels(t.name, self.placement)  # export 0 before the first read
            self.metrics.bytes.labels(t.name, self.placement)

    @classmethod
    def from_scores(
        cls, store: Location, scores: np.ndarray, budgets: Mapping[str, float | None], **kw: object
    ) -> TieredFeatures:
        """Place ``store``'s rows by ``scores`` (e.g. FAP) over ``budgets`` (tier -> bytes,
        fastest first, see :func:`tier_plan`; row bytes from the store) and open them."""
        meta = _read_meta(store, kw.get("options"))  # type: ignore[arg-type]
        row_bytes = meta.feature_dim * np.dtype(meta.feature_dtype).itemsize
        return cls(store, tier_plan(scores, row_bytes, budgets), **kw)  # type: ignore[arg-type]

    @property
    def num_nodes(self) -> int:
        return self.meta.num_nodes

    @property
    def dim(self) -> int:
        return self.meta.feature_dim

    def _make_dir(self, tier_dir: str | Path | None) -> Path:
        if tier_dir is not None:
            path = Path(tier_dir)
            path.mkdir(parents=True, exist_ok=True)
            return path
        path = Path(tempfile.mkdtemp(prefix="gnnserve-tiers-"))
        self._cleanup = weakref.finalize(self, shutil.rmtree, path, ignore_errors=True)
        return path

    def _build(self, index: int, name: str) -> _Tier:
        nodes = self.plan.nodes[index]
        if name == "remote":
            return _Tier(name, self._cold_medium, nodes.size, 0, self._cold_read)
        if name == "disk":
            table = self._write_tier_file(name, nodes)
            return _Tier(name, "mmap", nodes.size, table.nbytes, lambda _, r: gather_rows(table, r))
        rows = self._copy_rows(nodes)
        if name == "gpu" and nodes.size:
            if torch.cuda.is_available():
                dev = rows.to("cuda")
                read = lambda _, r: dev[torch.from_numpy(r).to(dev.device)].cpu()  # noqa: E731
                return _Tier(name, "cuda", nodes.size, rows.nbytes, read)
            log.warning("tier gpu: no CUDA device, its %d rows are held in host memory", nodes.size)
        host = rows.numpy()
        return _Tier(name, "host", nodes.size, host.nbytes, lambda _, r: gather_rows(host, r))

    def _cold_read(self, ids: np.ndarray, rows: np.ndarray) -> torch.Tensor:
        return self.source.get_valid(ids)

    def _copy_rows(self, nodes: np.ndarray) -> torch.Tensor:
        """float32 [len(nodes), F] rows of ``nodes`` read from the source, in chunks."""
        out = torch.empty((nodes.size, self.dim), dtype=torch.float32)
        for a in range(0, nodes.size, _CHUNK_ROWS):
            out[a : a + _CHUNK_ROWS] = self.source.get_valid(nodes[a : a + _CHUNK_ROWS])
        return out

    def _write_tier_file(self, name: str, nodes: np.ndarray) -> np.ndarray:
        """Rows of ``nodes`` written in tier order to ``<tier_dir>/<name>.bin``, mapped back."""
        shape = (nodes.size, self.dim)
        if nodes.size == 0:
            return np.zeros(shape, dtype=self._dtype)
        path = self._tier_dir / f"{name}.bin"
        out = np.memmap(path, dtype=self._dtype, mode="w+", shape=shape)
        for a in range(0, nodes.size, _CHUNK_ROWS):
            chunk = self.source.get_valid(nodes[a : a + _CHUNK_ROWS]).numpy()
            out[a : a + chunk.shape[0]] = chunk.astype(self._dtype)
        out.flush()
        del out
        return np.memmap(path, dtype=self._dtype, mode="r", shape=shape)

    def _read(self, ids: np.ndarray) -> torch.Tensor:
        tier = self.plan.tier[ids]
        rows = self.plan.row[ids]
        counts = np.bincount(tier, minlength=len(self._tiers))
        present = np.flatnonzero(counts)
        if present.size == 1:  # every row in one tier: no scatter
            out = self._tiers[int(present[0])].read(ids, rows)
        else:
            out = torch.empty((ids.size, self.dim), dtype=torch.float32)
            for t in present.tolist():
                at = np.flatnonzero(tier == t)
                out[torch.from_numpy(at)] = self._tiers[t].read(ids[at], rows[at])
        self._count(counts)
        return out

    def _count(self, counts: np.ndarray) -> None:
        with self._lock:
            self._rows_read += counts
            self._reads += 1
        for t in np.flatnonzero(counts).tolist():
            name = self._tiers[t].name
            self.metrics.hits.labels(name, self.placement).inc(int(counts[t]))
            self.metrics.bytes.labels(name, self.placement).inc(int(counts[t]) * self.row_bytes)

    def stats(self) -> TierStats:
        """Rows held and rows and bytes read per tier, so far."""
        with self._lock:
            read, reads = self._rows_read.copy(), self._reads
        tiers = tuple(
            TierCounts(t.name, t.medium, t.rows, t.resident_bytes, int(n), int(n) * self.row_bytes)
            for t, n in zip(self._tiers, read.tolist(), strict=True)
        )
        return TierStats(tiers, reads)

    def close(self) -> None:
        """Drop the tiers and remove the temporary tier directory (when this store made it)."""
        self._tiers = []
        cleanup = getattr(self, "_cleanup", None)
        if cleanup is not None:
            cleanup()


def _read_meta(store: Location, options: Mapping[str, str] | None = None) -> layout.StoreMeta:
    """The store's meta: from the blob store for a URL, from the directory for a path."""
    if _is_url(store):
        return layout.read_blob_meta(open_blobs(str(store), options))
    return layout.read_meta(local_path(store, "store"))


def _open_source(
    store: Location, gap: int, options: Mapping[str, str] | None
) -> tuple[layout.StoreMeta, FeatureStore, str]:
    """The store's meta, the backend the tiers are filled from (also the cold tier) and the
    cold tier's medium: the remote backend for a URL, a memory map of the store for a path."""
    if _is_url(store):
        blobs = open_blobs(str(store), options)
        meta = layout.read_blob_meta(blobs)
        return meta, RemoteFeatures(blobs, meta, gap), "remote"
    root = local_path(store, "store")
    meta = layout.read_meta(root)
    return meta, open_feature_store(root, "mmap", check_structure=False), "mmap-store"
