"""Typed carriers passed between the stages of the request path (see DESIGN.md)."""

from __future__ import annotations

import enum
from concurrent.futures import Future
from dataclasses import dataclass, field

import numpy as np
import torch


class OutputKind(str, enum.Enum):
    """What a prediction returns per node."""

    LABEL = "label"  # argmax class id (int)
    PROBS = "probs"  # softmax class probabilities (float per class)
    EMBEDDING = "embedding"  # the hidden representation fed to the last layer


@dataclass(frozen=True)
class NewNodes:
    """Nodes the model has never seen, sent with a request: their features and their edges.

    New node ``i`` (0-based, in ``features`` order) takes the global id ``num_nodes + i`` inside a
    computation graph. Every edge is undirected: it is added in both directions.
    """

    features: torch.Tensor  # float32 [m, F]: one row per new node, F = the store's feature width
    edges: np.ndarray  # int64 [E, 2]: (new node index, existing node id)
    new_edges: np.ndarray  # int64 [E2, 2]: (new node index, new node index); may be [0, 2]

    @property
    def count(self) -> int:
        """m: number of new nodes."""
        return int(self.features.size(0))


@dataclass(frozen=True)
class RequestOptions:
    """How to answer a request. Validated at admission (``engine.requests.validate_request``),
    which fills in the server's defaults of a new-node request (mode, gamma, policy, fanouts)."""

    output: OutputKind = OutputKind.LABEL  # what to return per node
    fanouts: tuple[int, ...] | None = None  # per hop, nearest first; None = the server's.
    # Existing nodes: the sampling fanouts; new nodes: those of mode ``ns``
    mode: str | None = None  # new nodes only: srpe | full | ns | pe; None = the server's
    gamma: float | None = None  # new nodes, mode srpe: share of candidates recomputed, [0, 1]
    policy: str | None = None  # new nodes, mode srpe: which candidates are recomputed
    # the draws: of mode ns and the random policy for new nodes (0 when not given); of the
    # sampler for existing nodes (None: fresh draws on every request)
    seed: int | None = None
    timeout_ms: float | None = None  # the client's deadline, ms after admission; None: server's


@dataclass(frozen=True, eq=False)
class Request:
    """One caller's request: existing node ids (``nodes``) or new nodes (``new``), and options.

    Built from raw input by ``engine.requests.validate_request`` (``Engine.request``), which
    checks every field once and marks the result ``checked_by`` its limits: the stages after
    admission trust such a request. ``Engine.submit`` validates a request built any other way.
    """

    nodes: np.ndarray | None = None  # int64 [n] existing node ids
    new: NewNodes | None = None  # nodes the graph does not hold
    options: RequestOptions = field(default_factory=RequestOptions)
    checked_by: object = field(default=None, init=False, repr=False)  # set by validation

    @property
    def size(self) -> int:
        """Nodes answered: n existing nodes or m new ones."""
        if self.new is not None:
            return self.new.count
        return 0 if self.nodes is None else int(self.nodes.size)


@dataclass(frozen=True)
class Block:
    """A bipartite message-flow graph for one layer.

    Local ids: the first ``n_dst`` source nodes are the destination nodes themselves, so a layer's
    output rows line up with the next block's source rows.
    """

    edge_index: torch.Tensor  # int64 [2, E]: row 0 local source id, row 1 local destination id
    n_src: int  # number of source nodes (rows of the layer input)
    n_dst: int  # number of destination nodes (rows of the layer output)


@dataclass(frozen=True)
class SampledSubgraph:
    """The computation graph of a batch of seeds, output of the sampler."""

    nodes: np.ndarray  # int64 [n_nodes] global ids; seeds first, then each hop's new nodes
    blocks: list[Block]  # one per layer, input layer first (outermost hop) to seeds last
    num_seeds: int  # the first num_seeds entries of ``nodes`` are the (deduplicated) seeds
    seed_rows: np.ndarray  # int64 [len(requested seeds)]: output row of each requested seed

    @property
    def input_nodes(self) -> np.ndarray:
        """Global ids whose features the first layer reads (all nodes of the outermost block)."""
        return self.nodes[: self.blocks[0].n_src] if self.blocks else self.nodes


@dataclass(frozen=True)
class MiniBatch:
    """Blocks plus the input features: everything the model needs for one forward pass."""

    subgraph: SampledSubgraph  # structure
    x: torch.Tensor  # float32 [n_input_nodes, F] features of subgraph.input_nodes
    in_degree: torch.Tensor  # float32 [n_input_nodes] full-graph in-degree (GCN normalisation)


@dataclass
class StageTimings:
    """Where a request spent its time, in milliseconds."""

    queue_ms: float = 0.0  # admission to start of sampling
    sample_ms: float = 0.0  # computation-graph construction
    fetch_ms: float = 0.0  # feature gather
    compute_ms: float = 0.0  # model forward
    total_ms: float = 0.0  # admission to result
    batch_size: int = 0  # unique seeds in the batch this request rode in

    def as_dict(self) -> dict[str, float | int]:
        """Plain dict for JSON responses."""
        items = self.__dict__.items()
        return {k: v if isinstance(v, int) else round(float(v), 4) for k, v in items}


@dataclass(frozen=True, eq=False)
class NewNodeInfo:
    """What the answer to a new-node request reports beyond the predictions.

    ``gamma`` and ``policy`` are those the mode used: None where it does not use them (``full``,
    ``ns``; ``pe`` recomputes nothing, gamma 0).
    """

    mode: str  # the mode that answered
    gamma: float | None
    policy: str | None
    num_candidates: int  # |R|: existing nodes with an edge from a new node
    recomputed: np.ndarray  # int64 [s] existing ids whose PEs were recomputed, ascending
    logits: torch.Tensor  # float32 [m, C]: every output kind can be derived from these two
    embedding: torch.Tensor  # float32 [m, H]
    pe_version: str | None = None  # graph version the PEs are of, when they follow the graph
    pe_lag: int = 0  # batches the PEs were behind the graph version answered at


@dataclass
class Result:
    """The answer to one request, existing nodes or new ones.

    For new nodes, ``nodes`` are the request indices 0..m-1; ``timings.sample_ms`` is the plan
    (computation graph) time, ``fetch_ms`` the feature and PE gather, ``batch_size`` m; and
    ``new_nodes`` holds the new-node details (None for existing nodes).
    """

    request_id: int  # engine-assigned, monotonic
    nodes: np.ndarray  # int64 [n] as requested (order and duplicates kept)
    output: OutputKind  # kind of ``values``
    values: torch.Tensor  # [n] labels, [n, C] probs or [n, H] embeddings
    model_version: str  # checkpoint identity (name@checksum)
    graph_version: str  # store identity (checksum / version)
    timings: StageTimings = field(default_factory=StageTimings)
    new_nodes: NewNodeInfo | None = None


@dataclass
class Ticket:
    """An admitted request: when it arrived, its deadline, and the future its caller waits on."""

    request: Request  # validated
    request_id: int  # engine-assigned, monotonic (shared by every kind of request)
    arrival_s: float  # time.perf_counter() at admission, seconds
    deadline_s: float | None = None  # perf_counter() time after which it is dropped, or None
    future: Future[Result] = field(default_factory=Future)  # resolved by the executor

    @property
    def nodes(self) -> np.ndarray:
        """int64 [n]: the existing node ids asked for (existing-node requests only)."""
        assert self.request.nodes is not None, "a new-node request has no node ids"
        return self.request.nodes
