"""New-node inference (OMEGA): requests carrying nodes the graph does not hold.

- :mod:`~gnnserve.newnodes.parse`: validation of the new nodes' features and edges;
- :mod:`~gnnserve.newnodes.overlay`: the graph G+ (stored graph plus a request's nodes and edges)
  for the sampler kernels, per request, without copying the graph;
- :mod:`~gnnserve.newnodes.policies`: which precomputed embeddings (PEs) to recompute;
- :mod:`~gnnserve.newnodes.plan`: the SRPE computation graph and its forward pass;
- :mod:`~gnnserve.newnodes.inference`: :class:`NewNodeInference` and its modes
  (full, ns, pe, srpe), single process;
- :mod:`~gnnserve.newnodes.result`: the options and results of one run;
- :mod:`~gnnserve.newnodes.service`: the serving path (admission, one worker thread, PE checks
  under the graph's read lock), built by the engine from its collaborators.

The PEs themselves (storage and precomputation) live in :mod:`gnnserve.embeddings`.
"""
