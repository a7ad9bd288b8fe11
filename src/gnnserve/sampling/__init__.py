"""Computation-graph construction: k-hop neighbour sampling (numba kernels, ``sampler``), DGS
event-driven pre-sampling (``presample``: an UpdateListener of a changing graph), the PSGS
workload metric (``metrics``) and the pre-sampler's update-kernel warm-up (``warmup``)."""

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gnnserve.sampling.sampler import NeighborSampler


def __getattr__(name: str) -> Any:
    # Lazy: the pre-sampler's kernels and the DGS workers import this package without torch,
    # which ``sampler`` needs (PEP 562 module __getattr__).
    if name == "NeighborSampler":
        from gnnserve.sampling.sampler import NeighborSampler

        return NeighborSampler
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["NeighborSampler"]
