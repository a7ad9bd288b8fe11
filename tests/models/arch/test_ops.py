"""weighted_sum against a plain per-edge loop: destination-ordered edges (the samplers' blocks)
take the CSR matmul, any other order the COO one, and both give the same sums."""

from __future__ import annotations

import numpy as np
import torch

from gnnserve.models.arch import ops


def _plain(edge_index: torch.Tensor, weight: torch.Tensor, h: torch.Tensor, n_dst: int):  # type: ignore[no-untyped-def]
    out = np.zeros((n_dst, h.shape[1]), dtype=np.float64)
    for e in range(edge_index.shape[1]):
        src, dst = int(edge_index[0, e]), int(edge_index[1, e])
        out[dst] += float(weight[e]) * h[src].double().numpy()
    return torch.from_numpy(out).float()


def _block(rng: np.random.Generator, n_src: int, n_dst: int, per_dst: int) -> torch.Tensor:
    """[2, E] edges grouped by destination, ascending, as the samplers emit them (some
    destinations without edges)."""
    counts = rng.integers(0, per_dst + 1, n_dst)
    dst = np.repeat(np.arange(n_dst), counts)
    src = rng.integers(0, n_src, dst.size)
    return torch.from_numpy(np.stack([src, dst]).astype(np.int64))


def test_both_matmuls_equal_a_plain_loop(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    rng = np.random.default_rng(5)
    n_src, n_dst = 40, 12
    edge_index = _block(rng, n_src, n_dst, 6)
    weight = torch.from_numpy(rng.random(edge_index.shape[1]).astype(np.float32))
    h = torch.from_numpy(rng.standard_normal((n_src, 7)).astype(np.float32))
    want = _plain(edge_index, weight, h, n_dst)
    taken: list[str] = []
    real_csr, real_coo = torch.sparse_csr_tensor, torch.sparse_coo_tensor
    monkeypatch.setattr(
        torch, "sparse_csr_tensor", lambda *a, **k: taken.append("csr") or real_csr(*a, **k)
    )
    monkeypatch.setattr(
        torch, "sparse_coo_tensor", lambda *a, **k: taken.append("coo") or real_coo(*a, **k)
    )
    with torch.inference_mode():
        ordered = ops.weighted_sum(edge_index, weight, h, (n_src, n_dst))
        shuffle = torch.from_numpy(rng.permutation(edge_index.shape[1]))
        mixed = ops.weighted_sum(edge_index[:, shuffle], weight[shuffle], h, (n_src, n_dst))
    with torch.enable_grad():  # training: COO, which autograd differentiates
        trained = ops.weighted_sum(edge_index, weight, h.requires_grad_(), (n_src, n_dst))
        trained.sum().backward()
    assert taken == ["csr", "coo", "coo"]
    for got in (ordered, mixed, trained.detach()):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert h.grad is not None


def test_no_edges_gives_zeros() -> None:
    h = torch.ones(3, 2)
    with torch.inference_mode():
        out = ops.weighted_sum(torch.zeros(2, 0, dtype=torch.int64), torch.zeros(0), h, (3, 4))
    assert torch.equal(out, torch.zeros(4, 2))
