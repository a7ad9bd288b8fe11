"""Feature storage: the FeatureStore ABC and its backends (see ``features.base``).

The store API loads on first use (PEP 562), so the upload codecs (``features.codecs``,
``features.column_codec``) import without torch: a sensor gateway's ``gnnserve fog upload``
process starts in a fraction of a second.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gnnserve.features.base import FEATURE_STORES, FeatureStore, open_feature_store

__all__ = ["FEATURE_STORES", "FeatureStore", "open_feature_store"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from gnnserve.features import base, stores  # noqa: F401  (stores registers the backends)

        return getattr(base, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
