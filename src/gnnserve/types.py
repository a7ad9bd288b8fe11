"""Typed carriers passed between the stages of the request path (see DESIGN.md)."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

import numpy as np
import torch


class OutputKind(str, enum.Enum):
    """What a prediction returns per node."""

    LABEL = "label"  # argmax class id (int)
    PROBS = "probs"  # softmax class probabilities (float per class)
    EMBEDDING = "embedding"  # the hidden representation fed to the last layer


@dataclass(frozen=True)
class InferenceRequest:
    """One caller's request, as admitted by the engine."""

    nodes: np.ndarray  # int64 [n] existing node ids, validated against the store
    output: OutputKind  # what to return per node
    request_id: int  # engine-assigned, monotonic
    arrival_s: float  # time.perf_counter() at admission, seconds
    deadline_s: float | None = None  # perf_counter() time after which it is dropped, or None
    fanouts: tuple[int, ...] | None = None  # per-hop fanouts; None = the server's default


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


@dataclass
class InferenceResult:
    """The answer to one request."""

    request_id: int  # same as the request's
    nodes: np.ndarray  # int64 [n] as requested (order and duplicates kept)
    output: OutputKind  # kind of ``values``
    values: torch.Tensor  # [n] labels, [n, C] probs or [n, H] embeddings
    model_version: str  # checkpoint identity (name@checksum)
    graph_version: str  # store identity (checksum / version)
    timings: StageTimings = field(default_factory=StageTimings)
