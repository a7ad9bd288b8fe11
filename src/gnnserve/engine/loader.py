"""Build an Engine from a ServeConfig: open the stores, load the checkpoint, check they match."""

from __future__ import annotations

import logging

from gnnserve.config import ServeConfig
from gnnserve.data.layout import verify_checksum
from gnnserve.engine.engine import Engine
from gnnserve.errors import InvalidInputError
from gnnserve.features import open_feature_store
from gnnserve.graph import open_graph_store
from gnnserve.graph.dynamic_store import DynamicStore
from gnnserve.models.checkpoint import load_checkpoint
from gnnserve.models.runner import ModelRunner

log = logging.getLogger(__name__)


def build_engine(config: ServeConfig) -> Engine:
    """Open ``config.store`` and ``config.model_path`` and wire them into an (unstarted) Engine."""
    if not config.store.path:
        raise InvalidInputError("no store given (--store DIR)", "store.path")
    if not config.model_path:
        raise InvalidInputError("no model checkpoint given (--model DIR)", "model_path")
    if config.store.verify_checksum:
        verify_checksum(config.store.path)
    graph = open_graph_store(config.store.path, config.store.graph_backend)
    features = open_feature_store(config.store.path, config.store.feature_backend)
    ckpt = load_checkpoint(config.model_path)
    if ckpt.config.in_dim != features.dim:
        raise InvalidInputError(
            f"model expects {ckpt.config.in_dim} input features, the store has {features.dim}",
            "model_path",
        )
    trained_on = ckpt.meta.get("store_checksum")
    if trained_on and trained_on != graph.version:
        log.warning("model was trained on store %s, serving store %s", trained_on, graph.version)
    runner = ModelRunner(ckpt.model, ckpt.version)
    if not config.store.update_log:
        return Engine(graph, features, runner, config)
    store = DynamicStore(graph, features, config.store.update_log, config.store.fsync)
    return Engine(store.graph, store.features, runner, config, updates=store)
