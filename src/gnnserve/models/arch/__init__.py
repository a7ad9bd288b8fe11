"""Model architectures: one module per architecture, each one :data:`MODELS` entry.

An entry (:class:`~gnnserve.models.arch.base.Architecture`) holds everything any path needs:
the layer factory, the full-graph forward preparation, the block forward of one layer (serving,
training, precompute and SRPE), the parameter export to plain tensors for CGP workers and the
CGP layer (partial aggregation on a worker, merge of the partials) those tensors run
(:mod:`~gnnserve.models.arch.cgp`, :mod:`~gnnserve.models.arch.merge`). Adding an architecture
is one new module: a subclass decorated with :func:`~gnnserve.models.arch.base.register`,
imported here (or, for a plug-in, by its user). No module of this package imports
torch_geometric at import time: CGP workers import them. Importing this package defers
``torch._dynamo`` (:mod:`gnnserve.deferred_imports`) before any architecture imports PyG.
"""

from gnnserve.deferred_imports import defer_torch_dynamo

defer_torch_dynamo()

from gnnserve.models.arch import gat, gcn, sage  # noqa: E402
from gnnserve.models.arch.base import MODELS, Architecture, register  # noqa: E402

__all__ = ["MODELS", "Architecture", "gat", "gcn", "register", "sage"]
