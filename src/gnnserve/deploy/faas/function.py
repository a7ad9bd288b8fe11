"""The two FaaS-GNN functions (§4.1): sample, then infer; plain classes a Ray actor wraps.

``SampleFunction`` builds a request's computation graph: on demand from the remote CSR
(FaaS-GNN, AWSGNN) or from a full copy downloaded at cold start (DGL-serverless). It returns a
:class:`SampledRequest`, which passes to an ``InferenceFunction``: that one predicts the
request's peak memory, evicts cache entries to fit it under the instance capacity, reads the
input features (cache hits, the rest fetched by byte ranges or from its full copy), runs the
model and returns the seeds' logits and embeddings. The cache may fill the capacity minus what the
instance uses, the predicted peak and a headroom of 10% for prediction errors; a prediction above
the free budget (the capacity less what the instance holds besides the cache) clears the cache
before the request runs (§4.3). Full-fetch downloads go to a scratch directory that is deleted as
soon as the copy is loaded, so no file outlives the instance and no page cache stays charged.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from gnnserve.data import layout
from gnnserve.data.blobs import BlobStore, open_blobs
from gnnserve.errors import InvalidInputError, NeedsMoreMemoryError
from gnnserve.features.adaptive_cache import AdaptiveFeatureCache, CacheStats
from gnnserve.features.base import FeatureStore
from gnnserve.features.remote import RemoteFeatures
from gnnserve.features.stores import InMemoryFeatures
from gnnserve.graph.csr import InMemoryCSR
from gnnserve.graph.remote import RemoteCSR
from gnnserve.models.checkpoint import load_checkpoint
from gnnserve.models.memory import MemoryPredictor, request_features
from gnnserve.models.peakmem import peak_memory, resident_bytes
from gnnserve.models.runner import ModelRunner
from gnnserve.sampling.ondemand import OnDemandSampler
from gnnserve.sampling.sampler import NeighborSampler
from gnnserve.types import Block, MiniBatch, SampledSubgraph

FETCH_MODES = ("ondemand", "full")
HEADROOM = 0.10  # share of the capacity the cache leaves free for prediction errors
WARM_ROWS = 256  # feature rows the cold start reads
_MB = 1 << 20


@dataclass(frozen=True)
class FunctionSpec:
    """How a function instance is built (sent to every actor it launches)."""

    remote: str  # URL of the published store (s3://bucket/prefix, file:///dir or a path)
    model: str  # checkpoint directory (local path)
    fanouts: tuple[int, ...]  # sampling fanouts, hop nearest the seeds first
    fetch: str = "ondemand"  # "ondemand": byte ranges per request | "full": download at start
    cache: bool = True  # adaptive feature cache in inference instances
    memory_mb: int = 0  # instance capacity (cgroup limit); 0: no limit, no cache budget
    options: Mapping[str, str] = field(default_factory=dict)  # object-store settings
    gap: int = 0  # merge byte ranges at most this far apart
    seed: int = 0  # sampler seed

    def __post_init__(self) -> None:
        if self.fetch not in FETCH_MODES:
            raise InvalidInputError(
                f"fetch must be one of {FETCH_MODES}, got {self.fetch!r}", "fetch"
            )
        if self.memory_mb < 0:
            raise InvalidInputError(f"memory_mb must be >= 0, got {self.memory_mb}", "memory_mb")


@dataclass
class SampledRequest:
    """A request's computation graph, passed from a sample instance to an inference instance."""

    subgraph: SampledSubgraph  # blocks with local ids
    degree: np.ndarray  # int64 [n_nodes] full-graph in-degree (cache eviction key)
    gcn_degree: np.ndarray  # float32 [n_input_nodes] in-degree without self loops
    sample_ms: float  # time spent sampling, fetches included
    requests: int  # range requests issued for the topology
    bytes_read: int  # topology bytes read


@dataclass
class InferenceOutput:
    """What an inference instance answers for one request."""

    logits: torch.Tensor  # [num_seeds, C] of the unique seeds
    embedding: torch.Tensor  # [num_seeds, H]
    seed_rows: np.ndarray  # int64 row of each requested seed
    fetch_ms: float  # feature read (cache + remote)
    compute_ms: float  # model forward
    hits: int  # input rows found in the cache
    misses: int  # input rows fetched
    bytes_read: int  # feature bytes read
    predicted_bytes: int  # predicted peak inference memory (0 without a predictor)
    measured_bytes: int  # measured peak resident increase during feature read + forward
    cleared: bool  # the prediction exceeded the free budget: the cache was cleared first
    evicted: int  # cache entries evicted before this request


def synthetic_subgraph(fanouts: tuple[int, ...]) -> SampledSubgraph:
    """A computation graph of the shape ``fanouts`` draw for one seed (every node draws
    ``max(fanout, 1)`` fresh neighbours; -1, "all", counts as 10), node ids all 0."""
    widths = [1]
    for fanout in fanouts:
        widths.append(widths[-1] * (10 if fanout < 0 else max(fanout, 1)))
    sizes = np.cumsum(widths)  # nodes up to hop h: the seed, then each hop's new ones
    blocks = []
    for hop in range(len(fanouts), 0, -1):  # input layer first
        n_dst, n_src = int(sizes[hop - 1]), int(sizes[hop])
        src = torch.arange(n_dst, n_src)
        dst = torch.arange(n_src - n_dst) % n_dst
        blocks.append(Block(torch.stack([src, dst]), n_src, n_dst))
    nodes = np.zeros(int(sizes[-1]), dtype=np.int64)
    return SampledSubgraph(nodes, blocks, 1, np.zeros(1, dtype=np.int64))


def scratch_dir(instance: str) -> Path:
    """The scratch directory of instance ``instance`` (its name carries the deployment's id)."""
    return Path(tempfile.gettempdir()) / "gnnserve-faas" / instance


def _download(blobs: BlobStore, names: list[str], scratch: Path | None) -> Path:
    """Copy the named objects (and meta.json) into ``scratch`` (or a fresh directory)
    (DGL-serverless); the caller loads them and deletes the directory."""
    if scratch is None:
        root = Path(tempfile.mkdtemp(prefix="gnnserve-full-"))
    else:
        root = scratch
        root.mkdir(parents=True, exist_ok=True)
    for name in [layout.META, *names]:
        (root / name).write_bytes(blobs.get(name))
    return root


class SampleFunction:
    """Builds computation graphs from the store at ``spec.remote`` (full-fetch downloads go to
    ``scratch``); one warm-up sample during construction loads the kernels."""

    def __init__(self, spec: FunctionSpec, scratch: Path | None = None) -> None:
        self.spec = spec
        self.blobs = open_blobs(spec.remote, spec.options or None)
        self.remote = RemoteCSR(self.blobs, spec.gap)
        fanouts = list(spec.fanouts)
        self._local: NeighborSampler | None = None
        if spec.fetch == "full":
            root = _download(self.blobs, [layout.INDPTR, layout.INDICES], scratch)
            try:
                graph = InMemoryCSR(root, layout.read_meta(root), check_structure=False)
            finally:
                shutil.rmtree(root, ignore_errors=True)
            self._graph = graph
            self._local = NeighborSampler(graph, fanouts, seed=spec.seed)
        self._ondemand = OnDemandSampler(self.remote, fanouts, seed=spec.seed)
        self._warm_up()

    def _warm_up(self) -> None:
        """Part of the cold start: sample vertex 0 once, so that the kernels are compiled or
        loaded (and the store's connection made) before the first request; not counted."""
        if self.remote.num_nodes:
            self.sample(np.zeros(1, dtype=np.int64), rng_seed=0)

    def sample(self, seeds: np.ndarray, rng_seed: int | None = None) -> SampledRequest:
        """The computation graph of ``seeds`` (valid int64 ids)."""
        start = time.perf_counter()
        if self._local is not None:
            subgraph = self._local.sample(seeds, rng_seed)
            degree = self._graph.in_degree(subgraph.nodes)
            gcn = self._graph.gcn_degree(subgraph.input_nodes)
            requests, nbytes = 0, 0
        else:
            fetched = self._ondemand.sample(seeds, rng_seed)
            subgraph, degree, loops = fetched.subgraph, fetched.degree, fetched.loops
            k = subgraph.input_nodes.size
            gcn = self.remote.gcn_degree(
                subgraph.input_nodes, degree[:k], None if loops is None else loops[:k]
            )
            requests, nbytes = fetched.requests, fetched.bytes_read
        return SampledRequest(
            subgraph, degree, gcn, (time.perf_counter() - start) * 1e3, requests, nbytes
        )


class InferenceFunction:
    """Reads a request's input features (adaptive cache in front of the store) and runs the
    model, keeping the instance under ``spec.memory_mb`` (full-fetch downloads go to
    ``scratch``). ``predictor`` False: ignore a saved memory predictor (profiling one)."""

    def __init__(
        self,
        spec: FunctionSpec,
        usage: Callable[[], int] = resident_bytes,
        scratch: Path | None = None,
        predictor: bool = True,
    ) -> None:
        self.spec = spec
        self.usage = usage  # memory charged against the capacity now, bytes (cgroup or RSS)
        self.blobs = open_blobs(spec.remote, spec.options or None)
        meta = layout.read_blob_meta(self.blobs)
        store: FeatureStore
        if spec.fetch == "full":
            root = _download(self.blobs, [layout.FEATURES], scratch)
            try:
                store = InMemoryFeatures(root, layout.read_meta(root), check_structure=False)
            finally:
                shutil.rmtree(root, ignore_errors=True)
        else:
            store = RemoteFeatures(self.blobs, meta, spec.gap)
        self.store = store
        self.cache = AdaptiveFeatureCache(store) if spec.cache and spec.fetch != "full" else None
        ckpt = load_checkpoint(spec.model)
        self.runner = ModelRunner(ckpt.model, ckpt.version)
        self.predictor = (
            MemoryPredictor.load_if_present(spec.model, spec.fanouts)
            if self.cache is not None and predictor
            else None
        )
        self.capacity = spec.memory_mb * _MB
        self._warm_up()

    def _warm_up(self) -> None:
        """Part of the cold start: one feature read and one forward on a synthetic subgraph of
        the served fanouts, so that one-time costs (lazy library set-up, the allocator's first
        arenas, several MB) land here and not in the first request's measured peak, where they
        would read as a misprediction and clear the cache."""
        n = self.store.num_nodes
        if n:  # through the cache when there is one: its gather kernel loads compiled code
            # rows spread over the table: as many ranges as a large request, so the store
            # client's connections and threads start here, not in the first measured request
            rows = np.unique(np.linspace(0, n - 1, min(n, WARM_ROWS)).astype(np.int64))
            if self.cache is not None:
                self.cache.read(rows, np.ones(rows.size, dtype=np.int64))
                self.cache.clear()
                self.cache.stats = CacheStats()  # the warm-up is no request
            else:
                self.store.get_valid(rows)
        subgraph = synthetic_subgraph(self.spec.fanouts)
        n = subgraph.input_nodes.size
        x = torch.zeros(n, self.store.dim)
        self.runner.forward(MiniBatch(subgraph, x, torch.ones(n)))

    def infer(self, request: SampledRequest) -> InferenceOutput:
        """Run one request; see the module docstring for the memory rules.
        NeedsMoreMemoryError, before anything runs, when its predicted peak exceeds the
        instance's whole capacity."""
        predicted = self._predict(request.subgraph)
        self._check_fits(request, predicted)
        cleared, evicted = self._make_room(request, predicted)
        before = self.blobs.stats.bytes_read
        output, measured = self._measured_run(request)
        output.bytes_read = self.blobs.stats.bytes_read - before
        output.predicted_bytes, output.measured_bytes = predicted, measured
        output.cleared, output.evicted = cleared, evicted
        return output

    def _measured_run(self, request: SampledRequest) -> tuple[InferenceOutput, int]:
        """Run ``request``; its peak memory less what the cache grew by (rows it keeps, which
        the cache budget already counted, not the inference's working memory)."""
        cached = self.cache.nbytes if self.cache is not None else 0
        output, measured = peak_memory(lambda: self._run(request))
        grown = (self.cache.nbytes if self.cache is not None else 0) - cached
        return output, max(0, measured - max(0, grown))

    def _predict(self, subgraph: SampledSubgraph) -> int:
        if self.predictor is None:
            return 0
        return int(self.predictor.predict(request_features(subgraph))[0])

    def _check_fits(self, request: SampledRequest, predicted: int) -> None:
        """A prediction above the whole capacity cannot fit whatever the cache gives up (the
        runtime needs memory too): refused. One between the free budget and the capacity runs
        after the cache is cleared (§4.3); predictions err, so only this bound is certain."""
        if not self.capacity or predicted <= self.capacity:
            return
        nodes = int(request.subgraph.input_nodes.size)
        raise NeedsMoreMemoryError(
            f"this request needs about {predicted / _MB:.0f} MB for inference (the predicted "
            f"peak over its {nodes:,} sampled nodes), more than an inference instance's whole "
            f"--memory-mb {self.spec.memory_mb}: raise --memory-mb (the runtime and model take "
            "memory too) or send fewer nodes per request",
            "memory_mb",
        )

    def free_budget(self) -> int:
        """Bytes the cache and the next request may use: the capacity less the headroom and
        what the instance holds besides the cache."""
        cached = self.cache.nbytes if self.cache is not None else 0
        return int(self.capacity * (1 - HEADROOM)) - (self.usage() - cached)

    def _make_room(self, request: SampledRequest, predicted: int) -> tuple[bool, int]:
        """(cache cleared, entries evicted) before ``request`` runs."""
        if self.cache is None or not self.capacity:
            return False, 0
        budget = self.free_budget() - predicted
        if budget < 0:  # the prediction alone exceeds the free budget (§4.3)
            evicted = len(self.cache)
            self.cache.clear()
            return True, evicted
        ids = request.subgraph.input_nodes
        return False, self.cache.prepare(ids, request.degree[: ids.size], budget)

    def _run(self, request: SampledRequest) -> InferenceOutput:
        subgraph = request.subgraph
        ids = subgraph.input_nodes
        start = time.perf_counter()
        hits = 0
        if self.cache is not None:
            hits_before = self.cache.stats.hits
            x = self.cache.read(ids, request.degree[: ids.size])
            hits = self.cache.stats.hits - hits_before
        else:
            x = self.store.get_valid(ids)
        fetched = time.perf_counter()
        batch = MiniBatch(subgraph, x, torch.tensor(request.gcn_degree))  # Ray's copy is read-only
        logits, embedding = self.runner.forward(batch)
        done = time.perf_counter()
        return InferenceOutput(
            logits,
            embedding,
            subgraph.seed_rows,
            (fetched - start) * 1e3,
            (done - fetched) * 1e3,
            hits,
            int(ids.size) - hits,
            0,
            0,
            0,
            False,
            0,
        )
