"""A CGP worker (a Ray actor process): builds and runs its part of every SRPE computation graph.

Per request (OMEGA §6.1), with every worker running the same steps in lock step over a gloo
process group:

1. candidates: each worker knows exactly the candidates it owns (the reverse direction
   ``u -> q`` of each request edge has source ``u``): their ``|N_Q(u)|``, stored in-degree and
   importance. The workers all-gather their candidate counts, so each knows ``|R|`` and the
   budget ``k``; nothing more when ``k`` is 0. When every candidate is recomputed, or for the
   ``random`` policy (its seeded scores follow the global id order), they all-gather the ids.
   Otherwise (per-node scores) each sends only its local top ``k`` as (id, score): the global
   top ``k`` is among them. Every worker then gets the recomputed set S that
   :func:`select_targets` gives on the whole candidate set; C = Q then S.
2. layers 1..k-1 compute C, layer k computes Q. Per layer each worker aggregates the messages of
   its own sources (features at layer 1; computed rows for sources in C, their PEs otherwise, at
   layers >= 2) into a partial per destination, sends each destination's partial to the
   destination's owner (``all_to_all_single``), and the owner merges them and applies the self
   term, bias and activation. How a layer aggregates and merges is its architecture's
   :class:`~gnnserve.models.arch.cgp.CGPLayer` (:mod:`gnnserve.models.arch`); the worker only
   offers it the rows, blocks, degrees and collectives (:class:`LayerInputs`).

The built-in layers (:mod:`gnnserve.models.arch`): GCN uses the single-process normalisation
``1 / sqrt((d_j + 1)(d_i + 1))`` with ``d`` the in-degree in G' (request in-edges counted for Q
and S); SAGE exchanges (sum, count); GAT first all-gathers each destination's attention term,
then exchanges softmax partials (per head: the log-sum-exp of the local logits and the
softmax-weighted mean, :func:`merge.pack`); the owner adds the self loop. GCN and SAGE aggregate
the source rows in place (one sparse matmul per row table, no per-edge message tensor) and
project the partial when the layer narrows it, so the exchange carries ``min(in, out)`` columns.
Bytes sent to other workers are counted (``Exchange.bytes_sent``, and per step in
``Exchange.bytes_by``).

Workers get each layer's weights as plain tensors (``GNN.cgp_layers``), not the PyG model: the
worker processes then never import torch_geometric (seconds of start-up per actor).
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F

from gnnserve.deploy.cgp.exchange import Exchange
from gnnserve.deploy.cgp.partition import Partition, RequestPart, owner
from gnnserve.deploy.cgp.rows import encoded_nbytes
from gnnserve.deploy.rendezvous import GroupRendezvous
from gnnserve.models.arch import merge
from gnnserve.models.arch.cgp import CGPLayer, Gather, LayerInputs, LocalBlock, Shuffle, SourceRows
from gnnserve.newnodes.policies import (
    POLICIES,
    Candidates,
    PolicyInputs,
    budget,
    select_targets,
)

__all__ = ["CGPWorker", "Layout", "RunSpec", "WorkerOutput"]


@dataclass(frozen=True)
class RunSpec:
    """Validated options of one request (``oracle`` is refused before it reaches a worker)."""

    gamma: float  # recomputation budget in [0, 1]
    policy: str  # query_edges_ratio | importance | random
    seed: int  # random policy seed


@dataclass
class WorkerOutput:
    """One worker's share of a request's answer."""

    queries: np.ndarray  # int64 [m_p] query indices owned by the worker
    logits: torch.Tensor  # float32 [m_p, C]
    embedding: torch.Tensor  # float32 [m_p, H]: layer-k inputs of those queries
    recomputed: np.ndarray  # int64 [s] S (identical on every worker)
    num_candidates: int  # |R|
    bytes_sent: int  # bytes this worker sent to other workers, all collectives together
    bytes_by: dict[str, int]  # the same per step ("candidates", "layer 1 partials", ...)
    plain_by: dict[str, int]  # bytes worker 0 would fetch from this worker (plain scheme)
    compute_ms: float  # wall time of the worker's ``run``, milliseconds


@dataclass(frozen=True)
class Layout:
    """The destinations of one request (C = Q then S), identical on every worker."""

    num_nodes: int  # N
    num_queries: int  # m
    recomputed: np.ndarray  # int64 [s] S ascending
    computed: np.ndarray  # int64 [m + s] C global ids
    owners: np.ndarray  # int64 [m + s] owning worker of each C entry

    def position(self, ids: np.ndarray) -> np.ndarray:
        """int64 position of each id in C, -1 for ids outside C."""
        n, s = self.num_nodes, self.recomputed
        pos = np.full(ids.size, -1, dtype=np.int64)
        query = ids >= n
        pos[query] = ids[query] - n
        if s.size:
            at = np.minimum(np.searchsorted(s, ids[~query]), s.size - 1)
            pos[~query] = np.where(s[at] == ids[~query], self.num_queries + at, -1)
        return pos

    def owned(self, n_dst: int, world: int) -> list[np.ndarray]:
        """Per worker: the positions among the first ``n_dst`` of C it owns, ascending."""
        own = self.owners[:n_dst]
        return [np.flatnonzero(own == r) for r in range(world)]


def _local_block(
    layout: Layout, src_ids: np.ndarray, dst_pos: np.ndarray, n_dst: int
) -> LocalBlock:
    sources, inverse = np.unique(src_ids, return_inverse=True)
    loop = torch.from_numpy(src_ids == layout.computed[dst_pos])
    return LocalBlock(
        sources, torch.from_numpy(inverse.reshape(-1)), torch.from_numpy(dst_pos), loop, n_dst
    )


class CGPWorker:
    """Holds one :class:`Partition` and the model's layers; answers its part of every request.

    Created as a Ray actor (``ray.remote(num_cpus=0)``) by :class:`~.service.CGPService`;
    ``connect`` joins the gloo group, then ``run`` is called on every worker for each request.
    ``layers``: the model's layers, input layer first (ReLU between them, eval mode: no
    dropout); ``threads``: torch intra-op threads of this process.
    """

    def __init__(self, part: Partition, layers: Sequence[CGPLayer], threads: int = 1) -> None:
        torch.set_num_threads(max(1, int(threads)))
        self.part = part
        self.rank, self.world = part.rank, part.num_parts
        with warnings.catch_warnings():  # Ray hands the arrays over read-only; they are only read
            warnings.filterwarnings("ignore", message=".*not writable.*")
            self.features = torch.from_numpy(part.features)
            self.pes = [torch.from_numpy(pe) for pe in part.pes]
        self.layers = list(layers)
        self.num_layers = len(self.layers)
        self._scratch = np.zeros(0)  # importance of candidates, indexed by global id
        self.comm = Exchange(self.rank, self.world)
        self._group = GroupRendezvous(self.rank, self.world)

    def rendezvous(self, timeout_s: float = 60.0) -> tuple[str, int]:
        """Rank 0 only: host the group's rendezvous store on this node's routable address;
        returns (address, port)."""
        return self._group.host(timeout_s)

    def connect(self, address: str, port: int, timeout_s: float = 60.0) -> int:
        """Join the gloo process group rendezvousing at ``address:port`` (rank 0's node);
        returns the rank."""
        return self._group.join(address, port, timeout_s)

    def close(self) -> None:
        """Leave the process group."""
        if dist.is_initialized():
            dist.destroy_process_group()

    # ------------------------------------------------------------------ request

    def run(self, req: RequestPart, spec: RunSpec) -> WorkerOutput:
        """This worker's part of one request; every worker of the group must be called."""
        start = time.perf_counter()
        self.comm.reset()
        with torch.inference_mode():
            targets, num_candidates = self._targets(req, spec)
            layout = self._layout(req.num_queries, targets)
            extra = np.unique(req.src, return_counts=True)
            blocks = self._blocks(req, layout)
            logits, embedding = self._forward(req, layout, blocks, extra)
        compute_ms = (time.perf_counter() - start) * 1e3
        return WorkerOutput(
            req.queries,
            logits,
            embedding,
            targets,
            num_candidates,
            self.comm.bytes_sent,
            dict(self.comm.bytes_by),
            self._plain_bytes(layout, blocks) if self.rank else {},
            compute_ms,
        )

    def _targets(self, req: RequestPart, spec: RunSpec) -> tuple[np.ndarray, int]:
        """(S, |R|): the recomputed set :func:`select_targets` gives on the global candidate
        set, exchanging no more than the policy needs (see the module docstring)."""
        n = self.part.num_nodes
        ids, counts = np.unique(req.src[(req.src < n) & (req.dst >= n)], return_counts=True)
        one = [1] * self.world
        sizes = self.comm.broadcast_rows(torch.tensor([ids.size]), one, "candidates").tolist()
        total = int(sum(sizes))
        k = budget(spec.gamma, total)
        if k == 0:
            return np.empty(0, np.int64), total
        if k == total or spec.policy == "random":
            every = self.comm.broadcast_rows(torch.from_numpy(ids), sizes, "candidates").numpy()
            every = np.sort(every)
            zeros = np.zeros(total, np.int64)
            cands = Candidates(every, zeros, zeros)
            return select_targets(
                spec.policy, spec.gamma, cands, PolicyInputs(seed=spec.seed)
            ), total
        rows = ids // self.world
        local = Candidates(ids, counts.astype(np.int64), self.part.in_degree[rows])
        scores = POLICIES.create(spec.policy, local, self._inputs(spec, ids, rows))
        top = np.lexsort((ids, -scores))[:k]  # highest score first, then lowest id
        pairs = np.stack([ids[top], scores[top].view(np.int64)], axis=1)  # float64 bits as int64
        tops = [min(k, size) for size in sizes]
        got = self.comm.broadcast_rows(torch.from_numpy(pairs), tops, "candidates").numpy()
        order = np.lexsort((got[:, 0], -got[:, 1].copy().view(np.float64)))[:k]
        return np.sort(got[order, 0]), total

    def _inputs(self, spec: RunSpec, ids: np.ndarray, rows: np.ndarray) -> PolicyInputs:
        """Policy side information for the local candidates ``ids`` (local ``rows``)."""
        if spec.policy != "importance":
            return PolicyInputs(seed=spec.seed)
        if self._scratch.size != self.part.num_nodes:
            self._scratch = np.zeros(self.part.num_nodes)
        self._scratch[ids] = self.part.importance[rows]  # the policy reads these entries only
        return PolicyInputs(importance=self._scratch, seed=spec.seed)

    def _layout(self, m: int, targets: np.ndarray) -> Layout:
        n = self.part.num_nodes
        computed = np.concatenate([n + np.arange(m, dtype=np.int64), targets])
        return Layout(n, m, targets, computed, owner(computed, self.world, n))

    def _blocks(self, req: RequestPart, layout: Layout) -> list[LocalBlock]:
        """Local blocks of layers 1..k: the C block (k > 1) repeated, then the Q block."""
        n, m = layout.num_nodes, layout.num_queries
        into_q = req.dst >= n
        q_block = _local_block(layout, req.src[into_q], req.dst[into_q] - n, m)
        if self.num_layers == 1:
            return [q_block]
        stored_src, at = self.part.in_edges(layout.recomputed)
        pos = layout.position(req.dst)
        src = np.concatenate([stored_src, req.src[pos >= 0]])
        dst = np.concatenate([m + at, pos[pos >= 0]])
        c_block = _local_block(layout, src, dst, layout.computed.size)
        return [c_block] * (self.num_layers - 1) + [q_block]

    # ------------------------------------------------------------------ layers

    def _forward(
        self,
        req: RequestPart,
        layout: Layout,
        blocks: list[LocalBlock],
        extra: tuple[np.ndarray, np.ndarray],
    ) -> tuple[torch.Tensor, torch.Tensor]:
        k = self.num_layers
        mine_c = layout.owned(layout.computed.size, self.world)[self.rank]
        h_mine = torch.empty(0)
        embedding = torch.empty(0)
        deg = _Degrees(self.part, layout, extra)
        for layer, block in enumerate(blocks):
            owned = layout.owned(block.n_dst, self.world)
            rows = self._rows(layer, req, layout, mine_c, h_mine)
            h_self = rows.get(layout.computed[owned[self.rank]])
            if layer == k - 1:
                embedding = h_self
            out = self._layer(layer, rows, block, h_self, owned, deg, layout)
            h_mine = F.relu(out) if layer < k - 1 else out
        return h_mine, embedding

    def _rows(
        self,
        layer: int,
        req: RequestPart,
        layout: Layout,
        mine_c: np.ndarray,
        h_mine: torch.Tensor,
    ) -> SourceRows:
        """Where the inputs of layer ``layer`` (0-based) of every owned node are."""
        n, world = layout.num_nodes, self.world

        if layer == 0:

            def stored(ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
                existing = ids < n
                return existing, np.where(existing, ids, ids - n) // world

            return SourceRows(self.features, req.features.decode(), stored)

        def computed(ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
            pos = layout.position(ids)
            in_c = pos >= 0
            return in_c, np.where(in_c, np.searchsorted(mine_c, pos), ids // world)

        return SourceRows(h_mine, self.pes[layer - 1], computed)

    def _shuffle(self, owned: list[np.ndarray], tag: str) -> Shuffle:
        """Send each destination's partial to its owner; the P partials of my destinations."""
        mine = owned[self.rank].size

        def run(partial: merge.Partial) -> list[merge.Partial]:
            packed = merge.pack(partial)
            send = packed[torch.from_numpy(np.concatenate(owned))]
            sizes = [o.size for o in owned]
            recv = self.comm.all_to_all(send, sizes, [mine] * self.world, tag)
            return [merge.unpack(partial, chunk) for chunk in recv.split(mine)]

        return run

    def _gather(self, owned: list[np.ndarray], n_dst: int, layer: int) -> Gather:
        """Owners broadcast rows of their destinations; [n_dst, ...] rows of every one."""
        order = torch.from_numpy(np.concatenate(owned))

        def run(mine: torch.Tensor, what: str) -> torch.Tensor:
            got = self.comm.broadcast_rows(mine, [o.size for o in owned], f"layer {layer} {what}")
            out = torch.empty(n_dst, *mine.shape[1:])
            out[order] = got
            return out

        return run

    def _layer(
        self,
        layer: int,
        rows: SourceRows,
        block: LocalBlock,
        h_self: torch.Tensor,
        owned: list[np.ndarray],
        deg: _Degrees,
        layout: Layout,
    ) -> torch.Tensor:
        """Layer ``layer`` (0-based) of the owned destinations, run by the layer's own
        :class:`CGPLayer` (partials, exchange, merge)."""
        inputs = LayerInputs(
            rows=rows,
            block=block,
            h_self=h_self,
            dst_ids=layout.computed[owned[self.rank]],
            shuffle=self._shuffle(owned, f"layer {layer + 1} partials"),
            gather=self._gather(owned, block.n_dst, layer + 1),
            degree=deg,
        )
        return self.layers[layer].run(inputs)

    # ------------------------------------------------------------------ accounting

    def _plain_bytes(self, layout: Layout, blocks: list[LocalBlock]) -> dict[str, int]:
        """Bytes worker 0 would fetch from this worker to build the SRPE graph itself, by kind:
        ``feature rows`` (dense or sparse, whichever is smaller: :func:`encoded_nbytes`), ``PE
        rows`` and ``adjacency`` entries (8 bytes per edge id) owned here; and, for comparison
        only, ``feature rows if dense`` (float32)."""
        n, k = layout.num_nodes, self.num_layers
        mine_s = layout.recomputed[layout.recomputed % self.world == self.rank]
        first = blocks[0].sources
        rows0 = np.union1d(first[first < n], mine_s if k > 1 else np.empty(0, np.int64))
        width = self.part.features.shape[1]
        out = {
            "feature rows": encoded_nbytes(self.part.feature_nnz[rows0 // self.world], width),
            "feature rows if dense": rows0.size * width * 4,
            "PE rows": 0,
            "adjacency": 0,
        }
        for layer in range(1, k):
            src = blocks[layer].sources
            pe_rows = int(((src < n) & (layout.position(src) < 0)).sum())
            out["PE rows"] += pe_rows * self.part.pes[layer - 1].shape[1] * 4
        if k > 1:
            out["adjacency"] = 8 * int(self.part.in_degree[mine_s // self.world].sum())
        return out


class _Degrees:
    """GCN degree (float32) of owned ids in G': stored in-degree without self loops, plus the
    request in-edges for queries and recomputed nodes (single-process ``_gcn_degree``)."""

    def __init__(
        self, part: Partition, layout: Layout, extra: tuple[np.ndarray, np.ndarray]
    ) -> None:
        self.part, self.layout = part, layout
        self.extra_ids, self.extra_counts = extra  # request edges are symmetric: out = in

    def __call__(self, ids: np.ndarray) -> torch.Tensor:
        n, world = self.layout.num_nodes, self.part.num_parts
        deg = np.zeros(ids.size, dtype=np.float32)
        existing = ids < n
        deg[existing] = self.part.gcn_degree[ids[existing] // world]
        extra = np.zeros(ids.size, dtype=np.int64)
        if self.extra_ids.size:
            at = np.minimum(np.searchsorted(self.extra_ids, ids), self.extra_ids.size - 1)
            extra = np.where(self.extra_ids[at] == ids, self.extra_counts[at], 0)
        in_c = self.layout.position(ids) >= 0
        return torch.from_numpy(deg + np.where(in_c, extra, 0).astype(np.float32))
