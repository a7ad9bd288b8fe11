"""The changing graph: a mutable graph and its features, kept durable by an update log.

- ``store``: DynamicStore, validate -> log -> apply a batch, one version for graph and features,
  listeners (``graph.events``) told of every batch;
- ``graph`` / ``features``: the mutable adjacency (segments with slack) and feature table;
- ``leftright``: two copies, readers pin the active one and never wait for a batch;
- ``view``: VersionedGraph / VersionedFeatures, the read side handed to the engine (a read pins
  one version);
- ``updates``: parsing and validation of a batch; ``wal``: the append-only update log;
  ``logtool``: ``gnnserve log verify|repair``;
- ``segments``: numba kernels for rows stored as segments (also used by DGS workers);
- ``warmup``: the explicit start-up step that compiles the update kernels.
"""
