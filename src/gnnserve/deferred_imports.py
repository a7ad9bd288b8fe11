"""Defer ``torch._dynamo`` to its first use: about 1.7 s off every process that imports PyG.

``torch_geometric`` imports ``torch._dynamo`` when it is imported (``torch_geometric.isinstance``
names ``OptimizedModule`` in one isinstance check). gnnserve never calls ``torch.compile``, yet
that import costs ~1.7 s of CPU per process on this machine (``python -X importtime``), a third
of a local server's start-up. :func:`defer_torch_dynamo` puts a stand-in module under that name
before PyG is imported: ``import torch._dynamo`` then binds the stand-in, and the first attribute
read through it (``torch.compile``, ``torch._dynamo.OptimizedModule``, torch.distributed's
start-up, a submodule import) imports the real module, puts it in ``sys.modules`` and on
``torch``, and answers from it. Nothing changes but when the cost is paid.

``importlib.util.LazyLoader`` cannot do this: the import statement reads ``__spec__`` of a module
it finds in ``sys.modules``, which makes a lazy module load at once.
"""

from __future__ import annotations

import importlib
import sys
import threading
import types
from typing import Any

DYNAMO = "torch._dynamo"
# Re-entrant: while the real module imports, its own code reads ``torch._dynamo.<x>`` through
# ``torch``'s attribute, still the stand-in; that read must get the half-imported real module.
_load_lock = threading.RLock()


class _DeferredModule(types.ModuleType):
    """Stands in for a module not imported yet; any attribute it lacks imports the real one."""

    def __getattr__(self, attr: str) -> Any:
        if attr == "__file__":
            # ``inspect.getmodule`` probes every module in sys.modules for it, also while torch
            # is half-imported (torch.library does, registering ops): loading the real module
            # there is a circular import. A stand-in has no file; the real one, once loaded, has.
            raise AttributeError(attr)
        return getattr(_load_real(self), attr)


def _load_real(stand_in: _DeferredModule) -> types.ModuleType:
    """Import the real module behind ``stand_in`` once (thread-safe) and return it."""
    name = stand_in.__name__
    with _load_lock:
        current = sys.modules.get(name)
        if current is not None and current is not stand_in:
            return current
        del sys.modules[name]
        try:
            real = importlib.import_module(name)
        except BaseException:
            sys.modules[name] = stand_in
            raise
    parent, _, child = name.rpartition(".")
    setattr(sys.modules[parent], child, real)
    return real


def defer_torch_dynamo() -> None:
    """Put a stand-in for ``torch._dynamo`` in place unless it is imported already (or
    deferred); imports ``torch`` itself. Call before the first ``torch_geometric`` import."""
    import torch

    if DYNAMO in sys.modules:
        return
    spec = importlib.util.find_spec(DYNAMO)
    stand_in = _DeferredModule(DYNAMO, "deferred: imported on first use (gnnserve)")
    # __spec__ only, no __path__: a submodule import must load the real package first.
    stand_in.__spec__ = spec
    sys.modules[DYNAMO] = stand_in
    torch._dynamo = stand_in  # type: ignore[attr-defined]


def is_deferred(name: str = DYNAMO) -> bool:
    """Whether ``name`` is still a stand-in (its real module not imported yet)."""
    return isinstance(sys.modules.get(name), _DeferredModule)
