"""Computation-graph construction: k-hop neighbour sampling (numba kernels, ``sampler``), DGS
event-driven pre-sampling (``presample``: an UpdateListener of a changing graph), the PSGS
workload metric (``metrics``) and the pre-sampler's update-kernel warm-up (``warmup``)."""

from gnnserve.sampling.sampler import NeighborSampler

__all__ = ["NeighborSampler"]
