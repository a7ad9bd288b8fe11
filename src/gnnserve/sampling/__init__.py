"""Computation-graph construction: k-hop neighbour sampling and the PSGS/FAP workload metrics."""

from gnnserve.sampling.sampler import NeighborSampler

__all__ = ["NeighborSampler"]
