"""Model zoo: GCN, GraphSAGE and GAT stacks on PyG layers, with a full-graph and a block forward.

The same parameters serve both forward paths. ``forward(x, edge_index)`` is the ordinary PyG
full-graph forward (training reference); ``forward_blocks`` runs layer by layer over the sampled
blocks of a :class:`~gnnserve.types.SampledSubgraph` and, with every neighbour sampled, gives the
full-graph result on the seeds.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import asdict, dataclass, fields
from typing import Any

import torch
import torch.nn.functional as F
from torch_geometric.nn import GATConv, GCNConv, SAGEConv
from torch_geometric.nn.aggr import MeanAggregation
from torch_geometric.nn.conv.gcn_conv import gcn_norm

from gnnserve.errors import InvalidInputError
from gnnserve.registry import Registry
from gnnserve.types import Block

# architecture name -> factory(in_dim, out_dim, is_last, config) building one layer
MODELS: Registry[torch.nn.Module] = Registry("model")


# Bounds of every ModelConfig field; checkpoints and `gnnserve train` flags beyond them are refused
# before anything is allocated (a config.json with hidden_dim 10^9 or num_layers 10^6 would
# otherwise allocate terabytes or build layers for hours).
MAX_DIM = 1 << 20  # in_dim, hidden_dim, out_dim
MAX_LAYERS = 16  # num_layers (= sampled hops; the fanouts product explodes long before)
MAX_HEADS = 64  # GAT heads
MAX_PARAMETERS = 1 << 31  # parameters of the whole model (8 GiB of float32)
_BOUNDS = {
    "in_dim": MAX_DIM,
    "hidden_dim": MAX_DIM,
    "out_dim": MAX_DIM,
    "num_layers": MAX_LAYERS,
    "heads": MAX_HEADS,
}


@dataclass(frozen=True)
class ModelConfig:
    """Architecture and sizes of a GNN; validated on construction (bounds: ``MAX_*`` above)."""

    arch: str  # MODELS name: "gcn" | "sage" | "gat"
    in_dim: int  # input feature width F, 1..MAX_DIM
    hidden_dim: int  # width of every hidden representation (GAT: heads * per-head width)
    out_dim: int  # number of classes C (logit width), 1..MAX_DIM
    num_layers: int = 2  # message-passing layers = sampled hops, 1..MAX_LAYERS
    heads: int = 4  # GAT attention heads of the hidden layers (the last layer uses 1), 1..64
    dropout: float = 0.5  # feature dropout probability before every layer, training only, [0, 1)

    def __post_init__(self) -> None:
        if not isinstance(self.arch, str) or self.arch not in MODELS.names():
            raise InvalidInputError(
                f"unknown architecture {self.arch!r}; choose one of {MODELS.names()}", "arch"
            )
        for name, limit in _BOUNDS.items():
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= limit:
                raise InvalidInputError(
                    f"{name} must be an int in [1, {limit}], got {value!r}", name
                )
        dropout = self.dropout
        if isinstance(dropout, bool) or not isinstance(dropout, int | float):
            raise InvalidInputError(f"dropout must be a number, got {dropout!r}", "dropout")
        if not 0.0 <= float(dropout) < 1.0:
            raise InvalidInputError(f"dropout must be in [0, 1), got {dropout!r}", "dropout")
        if self.arch == "gat" and self.hidden_dim % self.heads:
            raise InvalidInputError(
                f"GAT hidden_dim {self.hidden_dim} must be a multiple of heads {self.heads}",
                "hidden_dim",
            )
        if self.num_parameters() > MAX_PARAMETERS:
            raise InvalidInputError(
                f"this config has {self.num_parameters():,} parameters, more than the limit "
                f"{MAX_PARAMETERS:,} (in_dim {self.in_dim}, hidden_dim {self.hidden_dim}, "
                f"out_dim {self.out_dim}, num_layers {self.num_layers})",
                "hidden_dim",
            )

    def num_parameters(self) -> int:
        """Number of parameters (elements) of ``GNN(self)``, counted without allocating them."""
        return sum(p.numel() for p in skeleton(self).parameters())

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able dict."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ModelConfig:
        """Inverse of :meth:`to_dict`; unknown or missing keys raise InvalidInputError."""
        if not isinstance(data, dict):
            raise InvalidInputError("model config must be a JSON object", "model")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise InvalidInputError(f"unknown model config keys {unknown}", unknown[0])
        try:
            return cls(**data)
        except TypeError as exc:
            raise InvalidInputError(f"incomplete model config: {exc}", "model") from exc


@MODELS.register("gcn")
def _gcn_layer(in_dim: int, out_dim: int, is_last: bool, config: ModelConfig) -> torch.nn.Module:
    # normalize=False: both forward paths supply the symmetric normalisation as edge weights
    return GCNConv(in_dim, out_dim, normalize=False)


@MODELS.register("sage")
def _sage_layer(in_dim: int, out_dim: int, is_last: bool, config: ModelConfig) -> torch.nn.Module:
    return SAGEConv(in_dim, out_dim, aggr="mean")


@MODELS.register("gat")
def _gat_layer(in_dim: int, out_dim: int, is_last: bool, config: ModelConfig) -> torch.nn.Module:
    if is_last:
        return GATConv(in_dim, out_dim, heads=1, concat=False)
    return GATConv(in_dim, out_dim // config.heads, heads=config.heads, concat=True)


def gcn_block_weights(block: Block, in_degree: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """GCN edges and weights of one block, self loops of the destinations included.

    Weight of ``j -> i``: ``(d_i / s_i) / sqrt((d_j + 1)(d_i + 1))`` with ``d`` the full-graph
    in-degree and ``s_i`` the number of sampled (non-loop) edges into ``i``; the self loop gets
    ``1 / (d_i + 1)``. With every neighbour sampled ``s_i = d_i`` and this is exactly PyG's
    ``gcn_norm`` when ``in_degree`` does not count self loops (gcn_norm keeps one loop per node);
    with sampling, ``d_i / s_i`` keeps the aggregate an unbiased estimate of the full one.
    """
    src, dst = block.edge_index[0], block.edge_index[1]
    keep = src != dst  # the self loop is added once below, as gcn_norm does
    src, dst = src[keep], dst[keep]
    deg = in_degree[: block.n_src].to(torch.float32)
    norm = (deg + 1.0).rsqrt()
    sampled = torch.bincount(dst, minlength=block.n_dst).to(torch.float32)
    scale = deg[: block.n_dst] / sampled.clamp(min=1.0)
    weight = norm[src] * norm[dst] * scale[dst]
    loops = torch.arange(block.n_dst, dtype=src.dtype, device=src.device)
    edge_index = torch.stack([torch.cat([src, loops]), torch.cat([dst, loops])])
    return edge_index, torch.cat([weight, norm[: block.n_dst].square()])


def _gcn_block_conv(
    conv: GCNConv,
    h: torch.Tensor,
    edge_index: torch.Tensor,
    weight: torch.Tensor,
    size: tuple[int, int],
) -> torch.Tensor:
    """``A (h W)`` of a GCN layer without bias, in the cheaper order.

    The aggregation and the (bias-free) linear map commute: aggregating first costs
    ``E*in + n_dst*in*out`` multiply-adds, projecting first ``n_src*in*out + E*out``.
    """
    if _aggregate_first(edge_index.size(1), size, h.size(1), conv.out_channels):
        return conv.lin(weighted_sum(edge_index, weight, h, size))
    return weighted_sum(edge_index, weight, conv.lin(h), size)


def _aggregate_first(n_edges: int, size: tuple[int, int], d_in: int, d_out: int) -> bool:
    """Whether aggregating before a (bias-free) linear map is cheaper than projecting first:
    ``E*in + n_dst*in*out`` against ``n_src*in*out + E*out`` multiply-adds."""
    n_src, n_dst = size
    return n_edges * d_in + n_dst * d_in * d_out < n_src * d_in * d_out + n_edges * d_out


def weighted_sum(
    edge_index: torch.Tensor, weight: torch.Tensor, h: torch.Tensor, size: tuple[int, int]
) -> torch.Tensor:
    """[n_dst, width]: ``sum_e weight[e] * h[src[e]]`` per destination, as one sparse matmul.

    Unlike PyG's gather-scatter it never materialises an [E, width] message tensor, which for
    wide raw features (fb100: 4,735 columns) is gigabytes per request.
    """
    n_src, n_dst = size
    index = torch.stack([edge_index[1], edge_index[0]])
    adj = torch.sparse_coo_tensor(index, weight.to(h.dtype), (n_dst, n_src), check_invariants=False)
    return torch.sparse.mm(adj, h)


def _plain_mean_sage(conv: SAGEConv) -> bool:
    return (
        isinstance(conv.aggr_module, MeanAggregation)
        and not conv.project
        and not conv.normalize
        and conv.root_weight
    )


def _sage_block_conv(conv: SAGEConv, h: torch.Tensor, block: Block) -> torch.Tensor:
    """SAGEConv(aggr="mean") over a block: ``W_l mean_j h_j + b_l + W_r h_i``, the mean as a
    sparse matmul (projected first when that is cheaper; the bias is added after the mean)."""
    size = (block.n_src, block.n_dst)
    edge_index = block.edge_index
    count = torch.bincount(edge_index[1], minlength=block.n_dst).clamp(min=1)
    weight = 1.0 / count[edge_index[1]].to(h.dtype)
    lin_l = conv.lin_l
    if _aggregate_first(edge_index.size(1), size, h.size(1), conv.out_channels):
        out = lin_l(weighted_sum(edge_index, weight, h, size))
    else:
        out = weighted_sum(edge_index, weight, F.linear(h, lin_l.weight), size)
        out = out + lin_l.bias if lin_l.bias is not None else out
    return out + conv.lin_r(h[: block.n_dst])


class GNN(torch.nn.Module):
    """A stack of ``num_layers`` PyG convolutions with ReLU (and training-time dropout) between."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        dims = [config.in_dim] + [config.hidden_dim] * (config.num_layers - 1) + [config.out_dim]
        last = config.num_layers - 1
        self.convs = torch.nn.ModuleList(
            MODELS.create(config.arch, dims[i], dims[i + 1], i == last, config)
            for i in range(config.num_layers)
        )

    def _drop(self, h: torch.Tensor) -> torch.Tensor:
        return F.dropout(h, p=self.config.dropout, training=self.training)

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
        """Full-graph forward: logits float32 [N, out_dim] of every node of ``x`` [N, in_dim]."""
        weight = None
        if self.config.arch == "gcn":
            edge_index, weight = gcn_norm(edge_index, None, x.size(0), False, True, dtype=x.dtype)
        h = x
        for i, conv in enumerate(self.convs):
            h = self._drop(h)
            h = conv(h, edge_index, weight) if weight is not None else conv(h, edge_index)
            if i < len(self.convs) - 1:
                h = F.relu(h)
        return h

    def _layer(
        self, conv: torch.nn.Module, h: torch.Tensor, block: Block, in_degree: torch.Tensor
    ) -> torch.Tensor:
        size = (block.n_src, block.n_dst)
        if isinstance(conv, GCNConv):
            edge_index, weight = gcn_block_weights(block, in_degree)
            out = _gcn_block_conv(conv, h, edge_index, weight, size)
            return out + conv.bias if conv.bias is not None else out
        if isinstance(conv, SAGEConv) and _plain_mean_sage(conv):
            return _sage_block_conv(conv, h, block)
        return conv((h, h[: block.n_dst]), block.edge_index, size=size)

    def layer_forward(
        self, index: int, h: torch.Tensor, block: Block, in_degree: torch.Tensor
    ) -> torch.Tensor:
        """Layer ``index`` (0-based) over one block, ReLU after every layer but the last.

        ``h``: float32 [block.n_src, width] inputs in local order (destinations first);
        ``in_degree``: float32 [block.n_src] in-degrees of the same nodes, self loops not counted
        (GCN only). Returns [block.n_dst, out width]. The building block of layer-wise inference
        with precomputed embeddings, where each layer's inputs are assembled from several sources.
        """
        h = self._layer(self.convs[index], self._drop(h), block, in_degree)
        return F.relu(h) if index < len(self.convs) - 1 else h

    def forward_blocks(
        self, x: torch.Tensor, blocks: Sequence[Block], in_degree: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Layer-wise forward over sampled blocks (input layer first).

        ``x``: float32 [blocks[0].n_src, in_dim] input features in local order; ``in_degree``:
        float32 [blocks[0].n_src] full-graph in-degrees of the same nodes, self loops not counted
        (GCN only; on a loop-free graph this is the store's in-degree).
        Returns (logits [n_seeds, out_dim], embedding [n_seeds, hidden_dim]) where n_seeds is the
        last block's ``n_dst`` and the embedding is the representation fed to the last layer.
        """
        self._check_blocks(x, blocks, in_degree)
        h = x
        embedding = x[: blocks[-1].n_dst]
        for i, (conv, block) in enumerate(zip(self.convs, blocks, strict=True)):
            if i == len(blocks) - 1:
                embedding = h[: block.n_dst]
            h = self._layer(conv, self._drop(h), block, in_degree)
            if i < len(blocks) - 1:
                h = F.relu(h)
        return h, embedding

    def _check_blocks(self, x: torch.Tensor, blocks: Sequence[Block], deg: torch.Tensor) -> None:
        if len(blocks) != len(self.convs):
            raise InvalidInputError(
                f"model has {len(self.convs)} layers but got {len(blocks)} blocks", "blocks"
            )
        if x.dim() != 2 or x.size(0) != blocks[0].n_src or x.size(1) != self.config.in_dim:
            raise InvalidInputError(
                f"x must be [{blocks[0].n_src}, {self.config.in_dim}], got {list(x.shape)}", "x"
            )
        if self.config.arch == "gcn" and deg.numel() < blocks[0].n_src:
            raise InvalidInputError(
                f"in_degree has {deg.numel()} entries, need {blocks[0].n_src}", "in_degree"
            )
        for prev, nxt in zip(blocks[:-1], blocks[1:], strict=True):
            if prev.n_dst != nxt.n_src:
                raise InvalidInputError("block n_dst must equal the next block's n_src", "blocks")


@functools.lru_cache(maxsize=64)
def skeleton(config: ModelConfig) -> GNN:
    """``GNN(config)`` on the meta device: parameter shapes, no storage. Shared: do not modify."""
    with torch.device("meta"):
        return GNN(config)
