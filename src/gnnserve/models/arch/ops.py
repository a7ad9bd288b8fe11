"""Tensor operations shared by the architectures' block forwards (no PyG)."""

from __future__ import annotations

import warnings

import torch

# torch warns on every first CSR construction of a process that CSR support is in beta; the
# CSR matmul used here (sparse x dense on CPU and CUDA) is stable and tested against a loop
warnings.filterwarnings("ignore", message="Sparse CSR tensor support is in beta state")

__all__ = ["aggregate_first", "weighted_sum"]


def aggregate_first(n_edges: int, size: tuple[int, int], d_in: int, d_out: int) -> bool:
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
    src, dst = edge_index[0], edge_index[1]
    if not torch.is_grad_enabled() and _ascending(dst):
        # the samplers emit each destination's edges together, in order: the rows of a CSR
        # matrix as they are, where COO would sort them again (and launch more kernels)
        # row i starts at the first edge whose destination is >= i (no device sync, unlike
        # bincount, which reads the largest value to size its output)
        rows = torch.searchsorted(dst, torch.arange(n_dst + 1, device=dst.device, dtype=dst.dtype))
        adj = torch.sparse_csr_tensor(
            rows, src, weight.to(h.dtype), (n_dst, n_src), check_invariants=False
        )
        return torch.sparse.mm(adj, h)
    index = torch.stack([dst, src])
    adj = torch.sparse_coo_tensor(index, weight.to(h.dtype), (n_dst, n_src), check_invariants=False)
    return torch.sparse.mm(adj, h)


def _ascending(values: torch.Tensor) -> bool:
    """Whether ``values`` never decrease (one comparison pass; a host sync on a GPU)."""
    return values.numel() < 2 or bool(torch.all(values[1:] >= values[:-1]))
