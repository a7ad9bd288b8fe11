"""Feature storage: the FeatureStore ABC and its backends (see ``features.base``)."""

from gnnserve.features import stores as _stores  # noqa: F401  (registers the backends)
from gnnserve.features.base import FEATURE_STORES, FeatureStore, open_feature_store

__all__ = ["FEATURE_STORES", "FeatureStore", "open_feature_store"]
