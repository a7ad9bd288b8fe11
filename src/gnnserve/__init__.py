"""gnnserve: online graph neural network inference serving.

A request goes HTTP (``server``) -> ``engine`` (admission -> batcher -> executor) -> executor:
``engine.local`` (sampler -> feature gather -> model, in stage threads) or a deployment's
(``deploy.dgs``, ``deploy.cgp`` on Ray workers) -> response.

Layers, top to bottom. A module imports only from the layers below its own (function-level
imports included); modules on one line are independent of each other. Checked by import-linter
(``[tool.importlinter]`` in pyproject.toml, ``make lint``); every module must be in a layer.

 1. ``cli``: the ``gnnserve`` command
 2. ``demo``: ``gnnserve demo``
 3. ``server`` | ``loadgen``: HTTP front end; HTTP load generator
 4. ``deploy``: executors on Ray workers (``ray``: the one Ray start-up; ``dgs``, ``cgp``)
 5. ``engine``: admission, batching, the Executor ABC and EXECUTORS registry, the local executor
 6. ``newnodes``: OMEGA new-node inference (parse, overlay, plan, policies, inference, service)
 7. ``embeddings``: precomputed layer embeddings (stores, precomputation)
 8. ``models``: the GNN stack, one ``models.arch`` module per architecture, checkpoints, training
 9. ``dynamic`` | ``sampling``: the changing graph (store, update log, view); samplers and the
    pre-sampler, which hears of updates through ``graph.events.UpdateListener``
10. ``graph`` | ``features``: GraphStore and FeatureStore ABCs and backends
11. ``data``: store format, importers, generators, checks, the meta-file reader
12. ``config``: ServeConfig (pydantic)
13. ``fanouts`` | ``types`` | ``registry`` | ``urls``: the fanout check, stage carriers, named
    registries, store locations
14. ``errors``: typed errors

The engine never imports a deployment: ``engine.executor.EXECUTORS`` names them by import path.
"""

import os as _os

# GNU OpenMP's default wait policy stalls each numba parallel region ~16 ms on small CPU
# containers (measured: bench/sampling.py); passive waiting costs microseconds and leaves the
# cores to the server. Only effective when gnnserve is imported before torch/numba start OpenMP.
_os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

__version__ = "0.1.0"
