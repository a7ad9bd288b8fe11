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

import atexit
import os
import sys
import tempfile

from gnnserve.deferred_imports import defer_torch_dynamo

defer_torch_dynamo()


def remove_pyg_template_files() -> list[str]:
    """Remove the files PyG wrote for this process: each conv class's generated
    ``propagate``/``edge_updater`` module, a new ``torch_geometric.*.py`` in the temp dir per
    process that PyG never removes (thousands after a test run). Runs at exit; the loaded
    modules keep working. Returns the paths removed."""
    removed = []
    for name, module in list(sys.modules.items()):
        path = getattr(module, "__file__", None)
        generated = name.startswith("torch_geometric.") and name.endswith(
            ("_propagate", "_edge_updater")
        )
        if generated and path and os.path.dirname(path) == tempfile.gettempdir():
            try:
                os.unlink(path)
            except FileNotFoundError:
                continue
            removed.append(path)
    return removed


atexit.register(remove_pyg_template_files)

from gnnserve.models.arch import gat, gcn, sage  # noqa: E402
from gnnserve.models.arch.base import MODELS, Architecture, register  # noqa: E402

__all__ = ["MODELS", "Architecture", "gat", "gcn", "register", "remove_pyg_template_files", "sage"]
