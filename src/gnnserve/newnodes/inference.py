"""Inference for new nodes (OMEGA): full, sampled, precomputed-embedding and SRPE modes.

Queries Q are the request's new nodes (global ids N..N+m-1); G+ is the stored graph plus both
directions of every request edge. Modes:

- ``full``: the exact k-hop computation graph of Q on G+ (every neighbour, every hop);
- ``ns``: the same with per-hop fanouts, uniform without replacement, reproducible from ``seed``;
- ``pe``: layers 1..k-1 reuse the precomputed embeddings (PEs) of every existing node (SRPE with
  ``gamma = 0``);
- ``srpe``: candidates R are the existing nodes with an in-edge from Q; a policy picks the
  ``ceil(gamma |R|)`` recomputed nodes S (OMEGA §5.2). C = Q + S is computed at layers 1..k-1 from
  its G+ in-edges; every other node reads its PE. The GCN degree of every node is its in-degree
  in G' (stored edges, plus request edges into Q and S).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

import numpy as np
import torch

from gnnserve.embeddings.base import EmbeddingStore, check_importance, check_serving_stores
from gnnserve.errors import InvalidInputError, echo
from gnnserve.features.base import FeatureStore
from gnnserve.graph.base import GraphStore
from gnnserve.models.zoo import GNN
from gnnserve.newnodes.overlay import AdjacencyOverlay, OverlayView
from gnnserve.newnodes.parse import check_new_nodes
from gnnserve.newnodes.plan import SrpePlan, block_to, build_srpe_plan, srpe_forward
from gnnserve.newnodes.policies import (
    DEFAULT_POLICY,
    Candidates,
    PolicyInputs,
    budget,
    importance_scores,
    select_targets,
)
from gnnserve.newnodes.result import (
    DEFAULT_GAMMA,
    DEFAULT_MODE,
    NewNodeResult,
    NewNodeSizes,
    NewNodeTimings,
    RunOptions,
    check_run_options,
    default_fanouts,
)
from gnnserve.registry import Registry
from gnnserve.sampling import kernels
from gnnserve.sampling.sampler import seed_bits, to_subgraph
from gnnserve.types import Block, NewNodes, SampledSubgraph

__all__ = [
    "MODES",
    "NewNodeInference",
    "check_mode",
    "NewNodeResult",
    "NewNodeSizes",
    "NewNodeTimings",
    "default_fanouts",
]

MODES: Registry[NewNodeResult] = Registry("mode")


def check_mode(mode: object) -> str:
    """``mode`` when it names one of :data:`MODES`, else InvalidInputError naming ``mode``."""
    if not isinstance(mode, str) or mode not in MODES.names():
        raise InvalidInputError(f"unknown mode {echo(mode)}; choose one of {MODES.names()}", "mode")
    return mode


def _ms(start: float) -> float:
    return (time.perf_counter() - start) * 1000.0


class NewNodeInference:
    """Answers requests carrying new nodes with one of the :data:`MODES` (single process).

    ``embeddings`` must hold layers 1..k-1 (at least) of this model on this graph. ``importance``
    (float [N]) defaults to :func:`policies.importance_scores` of the graph, computed on first use.
    The model is put in eval mode. Thread-safe: requests share one :class:`AdjacencyOverlay`,
    held only while their computation graph is built.
    """

    def __init__(
        self,
        model: GNN,
        graph: GraphStore,
        features: FeatureStore,
        embeddings: EmbeddingStore,
        *,
        importance: np.ndarray | None = None,
        max_new_nodes: int = 1024,
    ) -> None:
        self.model = model.eval()
        self.graph = graph
        self.features = features
        self.embeddings = embeddings
        self.num_layers = int(model.config.num_layers)
        self.num_nodes = int(graph.num_nodes)
        check_serving_stores(model.config, self.num_nodes, features, embeddings)
        if importance is not None:
            importance = check_importance(importance, self.num_nodes)
        self._importance = importance
        self._importance_lock = threading.Lock()
        self.overlay = AdjacencyOverlay(graph, max_new_nodes=max_new_nodes)
        self.device = next(model.parameters()).device
        self._gcn = model.config.arch == "gcn"

    @property
    def importance(self) -> np.ndarray:
        """float64 [N] importance score of every node (computed once, on first use)."""
        with self._importance_lock:
            if self._importance is None:
                indptr, indices = self.graph.csr()
                self._importance = importance_scores(self.graph.in_degree(), indptr, indices)
            return self._importance

    # ------------------------------------------------------------------ public API

    def candidates(self, new: NewNodes) -> Candidates:
        """Existing nodes with an in-edge from a query, with |N_Q(u)| and stored in-degree."""
        nodes, counts = np.unique(np.asarray(new.edges[:, 1], np.int64), return_counts=True)
        degree = np.asarray(self.graph.in_degree(nodes), dtype=np.int64)
        return Candidates(nodes.astype(np.int64), counts.astype(np.int64), degree)

    def run(
        self,
        new: NewNodes,
        mode: str = DEFAULT_MODE,
        gamma: float = DEFAULT_GAMMA,
        policy: str = DEFAULT_POLICY,
        fanouts: Sequence[int] | None = None,
        seed: int = 0,
    ) -> NewNodeResult:
        """Logits and embeddings of the new nodes of ``new`` computed with ``mode``.

        Checks ``new`` and every option (InvalidInputError naming the field), then :meth:`infer`.
        """
        new = check_new_nodes(new, self.num_nodes, self.model.config.in_dim)
        mode = check_mode(mode)
        return self.infer(new, mode, self._options(gamma, policy, fanouts, seed))

    def infer(self, new: NewNodes, mode: str, options: RunOptions) -> NewNodeResult:
        """:meth:`run` for input already validated (at admission, ``engine.requests``): ``new``
        against this graph, ``mode`` one of :data:`MODES`, ``options`` checked."""
        start = time.perf_counter()
        with torch.inference_mode():
            result = MODES.create(mode, self, new, options)
        result.mode = mode
        result.timings.total_ms = _ms(start)
        return result

    def plan(
        self,
        new: NewNodes,
        gamma: float = DEFAULT_GAMMA,
        policy: str = DEFAULT_POLICY,
        seed: int = 0,
    ) -> SrpePlan:
        """The SRPE computation graph ``run(new, "srpe", gamma, policy, seed=seed)`` executes."""
        new = check_new_nodes(new, self.num_nodes, self.model.config.in_dim)
        opts = self._options(gamma, policy, None, seed)
        with torch.inference_mode(), self.overlay.patched(new) as view:
            return self._plan(view, new, self.candidates(new), opts)

    def sample(
        self, new: NewNodes, fanouts: Sequence[int] | None = None, seed: int = 0
    ) -> SampledSubgraph:
        """The computation graph of the ``ns`` mode (``fanouts`` -1 everywhere: ``full``)."""
        new = check_new_nodes(new, self.num_nodes, self.model.config.in_dim)
        opts = self._options(0.0, DEFAULT_POLICY, fanouts, seed)
        with self.overlay.patched(new) as view:
            return self._sample(view, self._queries(new.count), opts.fanouts, opts.seed)

    def true_errors(self, new: NewNodes, candidates: Candidates) -> np.ndarray:
        """float64 [c] ``sum_{l<k} ||f_u^(l) - p_u^(l)||`` per candidate, f exact on G+."""
        new = check_new_nodes(new, self.num_nodes, self.model.config.in_dim)
        with torch.inference_mode(), self.overlay.patched(new) as view:
            return self._true_errors(view, new, candidates)

    # ------------------------------------------------------------------ helpers

    def _options(self, gamma: object, policy: object, fanouts: object, seed: object) -> RunOptions:
        return check_run_options(gamma, policy, fanouts, seed, self.num_layers)

    def _queries(self, m: int) -> np.ndarray:
        return self.num_nodes + np.arange(m, dtype=np.int64)

    def _gcn_degree(self, view: OverlayView, ids: np.ndarray, extra_mask: np.ndarray) -> np.ndarray:
        """float32 in-degree without self loops of ``ids`` counting request in-edges where
        ``extra_mask``: stored degree (0 for queries) plus request in-edges."""
        existing = ids < self.num_nodes
        deg = np.zeros(ids.size, dtype=np.float32)
        deg[existing] = self.graph.gcn_degree(ids[existing])
        return deg + np.where(extra_mask, view.extra_in(ids), 0).astype(np.float32)

    def _input_rows(self, new: NewNodes, nodes: np.ndarray) -> torch.Tensor:
        """Layer-1 input rows of ``nodes`` whose first m entries are the queries, in order."""
        m = new.count
        rest = nodes[m:]
        if np.any(rest >= self.num_nodes):
            raise AssertionError("queries must lead the input nodes")
        return torch.cat([new.features, self.features.get_valid(rest)])  # planned: valid ids

    def _dev(self, t: torch.Tensor) -> torch.Tensor:
        return t if t.device == self.device else t.to(self.device)

    def _block(self, block: Block) -> Block:
        return block_to(block, self.device)

    def _sample(
        self, view: OverlayView, seeds: np.ndarray, fanouts: Sequence[int], seed: int
    ) -> SampledSubgraph:
        out = kernels.sample_inline(
            view.row_start,
            view.degree,
            view.indices,
            seeds,
            np.asarray(fanouts, dtype=np.int64),
            np.uint64(seed_bits(seed)),
            view.local_id,
        )
        return to_subgraph(out, len(fanouts))

    def _true_errors(self, view: OverlayView, new: NewNodes, cands: Candidates) -> np.ndarray:
        k, c = self.num_layers, cands.count
        total = torch.zeros(c, dtype=torch.float64)
        if k == 1 or c == 0:
            return total.numpy()
        sub = self._sample(view, cands.nodes, [-1] * (k - 1), 0)
        nodes = sub.input_nodes
        is_query = nodes >= self.num_nodes
        x = torch.empty(nodes.size, new.features.size(1), dtype=torch.float32)
        x[torch.from_numpy(is_query)] = new.features[nodes[is_query] - self.num_nodes]
        x[torch.from_numpy(~is_query)] = self.features.get(nodes[~is_query])
        deg = torch.from_numpy(self._gcn_degree(view, nodes, np.ones(nodes.size, bool)))
        h, deg = self._dev(x), self._dev(deg)
        for i in range(k - 1):
            h = self.model.layer_forward(i, h, self._block(sub.blocks[i]), deg)
            exact = h[:c].double().cpu()
            pe = self.embeddings.get(i + 1, cands.nodes).double()
            total += torch.linalg.vector_norm(exact - pe, dim=1)
        return total.numpy()

    def _srpe(self, new: NewNodes, opts: RunOptions) -> NewNodeResult:
        start = time.perf_counter()
        k = self.num_layers
        cands = self.candidates(new)
        with self.overlay.patched(new) as view:
            plan = self._plan(view, new, cands, opts)
            degrees = self._srpe_degrees(view, plan) if self._gcn else None
        plan_ms = _ms(start)

        start = time.perf_counter()
        x = self._input_rows(new, plan.sources(0))
        pes = {layer: self.embeddings.get(layer, plan.pe_ids(layer)) for layer in range(1, k)}
        fetch_ms = _ms(start)

        start = time.perf_counter()
        logits, embedding = srpe_forward(self.model, plan, self._dev(x), pes, degrees)
        compute_ms = _ms(start)
        sizes = NewNodeSizes(
            edges=plan.edges_per_layer(),
            input_rows=int(x.size(0)),
            pe_rows=sum(int(p.size(0)) for p in pes.values()),
            computed=int(plan.computed.size),
        )
        timings = NewNodeTimings(plan_ms=plan_ms, fetch_ms=fetch_ms, compute_ms=compute_ms)
        return NewNodeResult(
            logits, embedding, plan.recomputed, cands.count, "srpe", timings, sizes
        )

    def _plan(
        self, view: OverlayView, new: NewNodes, cands: Candidates, opts: RunOptions
    ) -> SrpePlan:
        inputs = PolicyInputs(seed=opts.seed)
        partial = 0 < budget(opts.gamma, cands.count) < cands.count
        if partial and opts.policy == "importance":
            inputs = PolicyInputs(importance=self.importance, seed=opts.seed)
        elif partial and opts.policy == "oracle":
            inputs = PolicyInputs(errors=self._true_errors(view, new, cands), seed=opts.seed)
        targets = select_targets(opts.policy, opts.gamma, cands, inputs)
        return build_srpe_plan(
            view.row_start,
            view.degree,
            view.indices,
            self.num_nodes,
            new.count,
            targets,
            self.num_layers,
            view.local_id,
        )

    def _srpe_degrees(self, view: OverlayView, plan: SrpePlan) -> dict[str, torch.Tensor]:
        """GCN degrees (in G') of the sources of the C block and the Q block."""
        out = {}
        for name, ids in (("c", plan.c_sources), ("q", plan.q_sources)):
            deg = self._gcn_degree(view, ids, plan.sees_request_edges(ids))
            out[name] = self._dev(torch.from_numpy(deg))
        return out

    def _sampled(self, new: NewNodes, fanouts: Sequence[int], seed: int) -> NewNodeResult:
        start = time.perf_counter()
        m = new.count
        with self.overlay.patched(new) as view:
            sub = self._sample(view, self._queries(m), fanouts, seed)
            nodes = sub.input_nodes
            deg = self._gcn_degree(view, nodes, np.ones(nodes.size, bool)) if self._gcn else None
        plan_ms = _ms(start)

        start = time.perf_counter()
        x = self._input_rows(new, nodes)
        fetch_ms = _ms(start)

        start = time.perf_counter()
        blocks = [self._block(b) for b in sub.blocks]
        in_degree = torch.empty(0) if deg is None else torch.from_numpy(deg)
        logits, embedding = self.model.forward_blocks(self._dev(x), blocks, self._dev(in_degree))
        compute_ms = _ms(start)
        cands = self.candidates(new)
        sizes = NewNodeSizes(
            edges=[int(b.edge_index.size(1)) for b in sub.blocks], input_rows=int(nodes.size)
        )
        timings = NewNodeTimings(plan_ms=plan_ms, fetch_ms=fetch_ms, compute_ms=compute_ms)
        return NewNodeResult(
            logits.cpu(),
            embedding.cpu(),
            np.empty(0, np.int64),
            cands.count,
            "",
            timings,
            sizes,
        )


@MODES.register("full")
def _full(engine: NewNodeInference, new: NewNodes, opts: RunOptions) -> NewNodeResult:
    return engine._sampled(new, [-1] * engine.num_layers, opts.seed)


@MODES.register("ns")
def _ns(engine: NewNodeInference, new: NewNodes, opts: RunOptions) -> NewNodeResult:
    return engine._sampled(new, opts.fanouts, opts.seed)


@MODES.register("pe")
def _pe(engine: NewNodeInference, new: NewNodes, opts: RunOptions) -> NewNodeResult:
    return engine._srpe(new, RunOptions(0.0, opts.policy, opts.fanouts, opts.seed))


@MODES.register("srpe")
def _srpe(engine: NewNodeInference, new: NewNodes, opts: RunOptions) -> NewNodeResult:
    return engine._srpe(new, opts)
