"""Independent references for new-node inference: plain PyG full-graph forwards.

``layer_outputs`` replays ``GNN.forward`` layer by layer on a whole graph (PyG's own gcn_norm and
convolutions, nothing from gnnserve's block path). ``srpe_graph`` builds the graph G' on which
SRPE with a recomputed set S is exact for 2-layer models (and for S = all / S = none at any
depth): queries see all their edges, recomputed nodes see their query in-edges, others do not.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch_geometric.nn.conv.gcn_conv import gcn_norm

from gnnserve.models.zoo import GNN
from gnnserve.types import NewNodes


@torch.inference_mode()
def layer_outputs(model: GNN, x: torch.Tensor, edge_index: torch.Tensor) -> list[torch.Tensor]:
    """Every layer's output on the full graph: [h^(1), ..., h^(k)] (ReLU on all but the last)."""
    model.eval()
    weight = None
    if model.config.arch == "gcn":
        edge_index, weight = gcn_norm(edge_index, None, x.size(0), False, True, dtype=x.dtype)
    outs, h = [], x
    for i, conv in enumerate(model.convs):
        h = conv(h, edge_index, weight) if weight is not None else conv(h, edge_index)
        if i < len(model.convs) - 1:
            h = F.relu(h)
        outs.append(h)
    return outs


def request_edges(new: NewNodes, num_nodes: int) -> np.ndarray:
    """int64 [2, E] global directed edges of a request, both directions of every edge."""
    a = np.concatenate([new.edges[:, 0] + num_nodes, new.new_edges[:, 0] + num_nodes])
    b = np.concatenate([new.edges[:, 1], new.new_edges[:, 1] + num_nodes])
    return np.stack([np.concatenate([a, b]), np.concatenate([b, a])]).astype(np.int64)


def srpe_graph(
    edge_index: np.ndarray, num_nodes: int, new: NewNodes, recomputed: np.ndarray | None
) -> torch.Tensor:
    """G': stored edges, every request edge into a query node, and request edges into the
    existing nodes of ``recomputed`` (None = into every existing node, the full graph G+)."""
    extra = request_edges(new, num_nodes)
    into_query = extra[1] >= num_nodes
    keep = into_query if recomputed is not None else np.ones_like(into_query)
    if recomputed is not None:
        keep |= np.isin(extra[1], recomputed)
    return torch.from_numpy(np.concatenate([edge_index, extra[:, keep]], axis=1))
