"""Build an Engine from a ServeConfig: open the stores, load the checkpoint, check they match.

Precomputed embeddings (PEs) for new-node requests: an explicitly configured directory must
match the served model and graph or the engine is not built; the default directory
(``<store>/embeddings/<checkpoint name>``) is used when present, and when it is stale or
unreadable only new-node requests are refused (409, with the reason).
"""

from __future__ import annotations

import logging
import math
import time

import numpy as np

from gnnserve.config import ServeConfig
from gnnserve.data.blobs import open_blobs
from gnnserve.data.layout import verify_checksum
from gnnserve.dynamic.shared_log import shares_log
from gnnserve.dynamic.store import DynamicStore
from gnnserve.embeddings.affected import BatchChanges
from gnnserve.embeddings.base import EmbeddingStore
from gnnserve.embeddings.chunked import ChunkedEmbeddings
from gnnserve.embeddings.refresher import PeRefresher
from gnnserve.embeddings.stores import default_embeddings_dir, open_embeddings
from gnnserve.engine.engine import Engine
from gnnserve.engine.executor import check_deploy
from gnnserve.engine.placement import TierRefresher, parse_tiers, place
from gnnserve.engine.planner import Planner
from gnnserve.errors import (
    GnnServeError,
    InvalidInputError,
    MissingEmbeddingsError,
    StaleEmbeddingsError,
    StoreFormatError,
)
from gnnserve.fanouts import check_fanouts
from gnnserve.features import open_feature_store
from gnnserve.features.base import FeatureStore
from gnnserve.features.partitioned import RoutedFeatures
from gnnserve.features.remote import RemoteFeatures
from gnnserve.graph import open_graph_store
from gnnserve.graph.base import GraphStore
from gnnserve.graph.remote import RemoteCSR, RemoteGraphStore
from gnnserve.models.checkpoint import load_checkpoint
from gnnserve.models.runner import ModelRunner
from gnnserve.models.zoo import GNN
from gnnserve.newnodes.service import check_embeddings
from gnnserve.sampling.metrics import fap
from gnnserve.urls import resolve

log = logging.getLogger(__name__)


def build_engine(config: ServeConfig) -> Engine:
    """Open ``config.store`` and ``config.model_path`` and wire them into an (unstarted) Engine."""
    check_deploy(config)  # a deploy mode that will refuse does so before anything loads
    if config.deploy.mode == "faas" or config.deploy.remote:
        return build_gateway_engine(config)
    if not config.store.path:
        raise InvalidInputError("no store given (--store DIR)", "store.path")
    if not config.model_path:
        raise InvalidInputError("no model checkpoint given (--model DIR)", "model_path")
    check_locations(config)
    if config.store.verify_checksum:
        verify_checksum(config.store.path)
    check = config.store.check_structure
    graph = open_graph_store(config.store.path, config.store.graph_backend, check)
    features = open_feature_store(
        config.store.path, "mmap" if config.store.tiers else config.store.feature_backend, check
    )
    budgets = parse_tiers(config.store.tiers) if config.store.tiers else None
    ckpt = load_checkpoint(config.model_path)
    if ckpt.config.in_dim != features.dim:
        raise InvalidInputError(
            f"model expects {ckpt.config.in_dim} input features, the store has {features.dim}",
            "model_path",
        )
    if config.store.feature_servers:
        features = _feature_servers(config, graph)
    elif budgets is not None:  # the table was checked above; the tiers read the store themselves
        features = _tiered(config, graph, budgets)
    trained_on = ckpt.meta.get("store_checksum")
    if trained_on and trained_on != graph.version:
        log.warning("model was trained on store %s, serving store %s", trained_on, graph.version)
    runner = ModelRunner(ckpt.model, ckpt.version)
    if not config.store.update_log:
        pes, problem = load_embeddings(config, graph, ckpt.version)
        engine = Engine(graph, features, runner, config, embeddings=pes, embeddings_error=problem)
        if isinstance(features, RoutedFeatures):
            engine.on_stop.append(features.close)  # the feature servers stop with the engine
        if budgets is not None and config.store.tier_refresh_s > 0:
            engine.tiers = TierRefresher(engine, budgets, config.store.tier_refresh_s).start()
        return engine
    store = DynamicStore(
        graph,
        features,
        config.store.update_log,
        config.store.fsync,
        store_path=config.store.path,
        shared=shares_log(),  # a worker of `serve --workers N`
    )
    try:
        pes, problem = load_embeddings(config, store.view, ckpt.version)  # after the replay
        refresher = _refresher(config, ckpt.model, store, pes)
    except BaseException:
        store.close()
        raise
    return _engine(store.view, store.features, runner, config, store, pes, problem, refresher)


def _engine(
    graph: GraphStore,
    features: FeatureStore,
    runner: ModelRunner,
    config: ServeConfig,
    store: DynamicStore | None,
    pes: EmbeddingStore | None,
    problem: GnnServeError | None,
    refresher: PeRefresher | None,
    planner: Planner | None = None,
    owns_store: bool = True,
) -> Engine:
    """The Engine over an update log's store (or none), its PE refresher stopped with it;
    ``planner`` and ``owns_store`` (False) for a model served beside another one."""
    engine = Engine(
        graph,
        features,
        runner,
        config,
        updates=store,
        embeddings=pes,
        embeddings_error=problem,
        refresher=refresher,
        planner=planner,
        owns_store=owns_store,
    )
    if refresher is not None:
        engine.on_stop.append(refresher.close)
    return engine


def build_model_engine(base: Engine, model_path: str) -> Engine:
    """An engine for one more model (``model_path``) over ``base``'s graph and features.

    It shares ``base``'s graph, features, update log and, when its layer count matches,
    ``base``'s planner (samplers, PSGS, pre-samples); a model with another layer count samples
    with the fanouts it was trained with. Its batcher, admission, answer cache and precomputed
    embeddings are its own. Local stores only: feature servers, tiers and deployments other
    than ``local`` are refused.
    """
    config = base.config.model_copy(update={"model_path": model_path}, deep=True)
    config.embeddings.path = ""  # --embeddings names the first model's: this one's default dir
    _check_shareable(config)
    check_locations(config)
    ckpt = load_checkpoint(model_path)
    if ckpt.config.in_dim != base.features.dim:
        raise InvalidInputError(
            f"model {model_path!r} expects {ckpt.config.in_dim} input features, the store has "
            f"{base.features.dim}",
            "model_path",
        )
    planner = base.planner if ckpt.config.num_layers == base.planner.num_layers else None
    if planner is None:
        trained = ckpt.meta.get("fanouts")
        if not trained:
            raise InvalidInputError(
                f"model {model_path!r} has {ckpt.config.num_layers} layers and the served "
                f"fanouts {list(base.planner.default)} have {base.planner.num_layers} hops; its "
                "checkpoint records no training fanouts to sample with",
                "model_path",
            )
        config.sampler.fanouts = [int(f) for f in trained]
    runner = ModelRunner(ckpt.model, ckpt.version)
    store = base.updates
    pes, problem = load_embeddings(config, base.graph, ckpt.version)
    refresher = None if store is None else _refresher(config, ckpt.model, store, pes)
    return _engine(
        base.graph, base.features, runner, config, store, pes, problem, refresher,
        planner=planner, owns_store=False,
    )  # fmt: skip


def _check_shareable(config: ServeConfig) -> None:
    """Refuse, naming the option, a set-up whose engines cannot share one store."""
    for flag, field, value in (
        ("--feature-servers", "store.feature_servers", config.store.feature_servers),
        ("--tiers", "store.tiers", config.store.tiers),
        ("--remote", "deploy.remote", config.deploy.remote),
    ):
        if value:
            raise InvalidInputError(
                f"several models (or a model loaded while serving) share one local store: "
                f"not with {flag}",
                field,
            )
    if config.deploy.mode != "local":
        raise InvalidInputError(
            f"several models (or a model loaded while serving) run in the local deployment, "
            f"not {config.deploy.mode!r}",
            "deploy.mode",
        )


def _refresher(
    config: ServeConfig, model: GNN, store: DynamicStore, pes: EmbeddingStore | None
) -> PeRefresher | None:
    """The background PE refresher over ``store`` when PEs are served and it is on (the PEs
    copied into memory chunks). PEs of the base store (load_embeddings checked the store and
    model) are first brought up to the replayed log's version."""
    if pes is None or not config.embeddings.refresh:
        return None
    layers = [pes.layer(layer) for layer in range(1, pes.num_layers + 1)]
    chunked = ChunkedEmbeddings.from_layers(pes.meta, layers)  # new versions get new metas
    log.info("precomputed embeddings follow the update log (refreshed in the background)")
    version = store.graph.version
    if version in (pes.meta.graph_version, f"{pes.meta.graph_version}.0"):
        return PeRefresher(model, store, chunked)
    done = store.replay_changes
    replayed = BatchChanges(
        done.edge_dsts(),
        done.features(),
        np.arange(done.first_new_node, store.graph.num_nodes, dtype=np.int64),
    )
    start = time.perf_counter()
    try:
        refresher = PeRefresher(model, store, chunked, replayed=replayed)
    except Exception:  # noqa: BLE001 - serve existing nodes; new-node requests get 409
        log.exception("precomputed embeddings could not be brought up to the replayed log")
        return None
    log.info(
        "precomputed embeddings (version %s) brought up to the replayed log's %s in %.1f s",
        pes.meta.graph_version,
        version,
        time.perf_counter() - start,
    )
    return refresher


def _tiered(
    config: ServeConfig, graph: GraphStore, budgets: dict[str, float | None]
) -> FeatureStore:
    """The features in FAP-placed tiers (``budgets``, parsed ``store.tiers``), for a static
    store."""
    if config.store.update_log:
        raise InvalidInputError(
            "feature tiers are placed once over a static store: drop --update-log or --tiers",
            "store.tiers",
        )
    fanouts = check_fanouts(config.sampler.fanouts)
    return place(config.store.path, graph, fanouts, budgets)


def _feature_servers(config: ServeConfig, graph: GraphStore) -> FeatureStore:
    """The features on ``store.feature_servers`` Ray actors (Ray started by the caller)
    placed by FAP (uniform p0) with the hottest rows replicated, read through
    :class:`RoutedFeatures`; a static store only."""
    import ray

    from gnnserve.features.partitioned import FeatureCluster
    from gnnserve.features.placement import server_plan

    store, servers = config.store, config.store.feature_servers
    if store.update_log or store.tiers:
        raise InvalidInputError(
            "feature servers are placed once over a static store, without tiers: drop "
            "--update-log / --tiers or --feature-servers",
            "store.feature_servers",
        )
    rows = math.ceil(store.feature_server_share * graph.num_nodes)
    if rows * servers < graph.num_nodes:
        raise InvalidInputError(
            f"{servers} feature servers holding {store.feature_server_share:g} of the nodes "
            "each cannot hold them all: raise --feature-server-share or --feature-servers",
            "store.feature_server_share",
        )
    if not ray.is_initialized():
        raise InvalidInputError(
            "feature servers are Ray actors: start Ray first (`gnnserve serve` does; from "
            "Python, gnnserve.deploy.ray.start_ray)",
            "store.feature_servers",
        )
    scores = fap(graph, check_fanouts(config.sampler.fanouts))
    plan = server_plan(scores, servers, rows)
    start = time.perf_counter()
    cluster = FeatureCluster(store.path, plan.owner, servers)
    log.info(
        "features on %d servers (%d rows replicated, %d rows each) in %.1f s",
        servers, plan.replicated.size, rows, time.perf_counter() - start,
    )  # fmt: skip
    return RoutedFeatures(cluster)


def build_gateway_engine(config: ServeConfig) -> Engine:
    """The engine of a FaaS gateway (``deploy.mode: faas``): the published store at
    ``deploy.remote`` (default: ``store.path`` as a file URL) is opened for its metadata and
    per-node look-ups only; function instances read what requests need."""
    if config.deploy.mode != "faas":
        raise InvalidInputError(
            "deploy.remote is served by the faas deployment: add --deploy faas", "deploy.remote"
        )
    if not config.model_path:
        raise InvalidInputError("no model checkpoint given (--model DIR)", "model_path")
    if config.store.update_log:
        raise InvalidInputError(
            "the faas deployment serves a published snapshot: it takes no update log",
            "store.update_log",
        )
    remote_url = config.deploy.remote or config.store.path
    if not remote_url:
        raise InvalidInputError(
            "the faas deployment needs --remote URL (a store published with `gnnserve publish`) "
            "or --store DIR",
            "deploy.remote",
        )
    config.deploy.remote = remote_url
    blobs = open_blobs(remote_url)
    remote = RemoteCSR(blobs)
    features = RemoteFeatures(blobs, remote.meta)
    ckpt = load_checkpoint(config.model_path)
    if ckpt.config.in_dim != features.dim:
        raise InvalidInputError(
            f"model expects {ckpt.config.in_dim} input features, the store has {features.dim}",
            "model_path",
        )
    refused = MissingEmbeddingsError(
        "new-node requests are not served by the faas deployment", "new_nodes"
    )
    runner = ModelRunner(ckpt.model, ckpt.version)
    return Engine(RemoteGraphStore(remote), features, runner, config, embeddings_error=refused)


def check_locations(config: ServeConfig) -> None:
    """Refuse a configured location that is neither a path nor a supported URL (see ``urls``),
    naming its config key; the openers accept what passes."""
    for field, value in (
        ("store.path", config.store.path),
        ("model_path", config.model_path),
        ("store.update_log", config.store.update_log),
        ("embeddings.path", config.embeddings.path),
    ):
        if value:
            resolve(value, field)


def load_embeddings(
    config: ServeConfig, graph: GraphStore, model_version: str
) -> tuple[EmbeddingStore | None, GnnServeError | None]:
    """The PEs for new-node requests, or None and the error those requests get (409).

    ``config.embeddings.path`` set: open it and check it against ``model_version`` and
    ``graph``; any problem raises (the server must not start). Unset: the default directory,
    when it exists; a problem there is logged and returned.
    """
    cfg = config.embeddings
    if cfg.path:
        pes = open_embeddings(cfg.path, cfg.backend)
        check_embeddings(pes, model_version, graph, config.embeddings.refresh)
        return pes, None
    # the errors below are answered to HTTP clients: the paths go to the log, not to them
    default = default_embeddings_dir(config.store.path, config.model_path)
    if not default.exists():
        log.info(
            "new-node requests will be refused: no precomputed embeddings; run `gnnserve "
            "precompute --store %s --model %s` (writes %s) and restart, or serve with "
            "--embeddings DIR",
            config.store.path,
            config.model_path,
            default,
        )
        return None, MissingEmbeddingsError(
            "new-node requests need precomputed embeddings, and this server has none for its "
            "model: run `gnnserve precompute` for it and restart the server (the server log "
            "has the command)",
            "new_nodes",
        )
    try:
        pes = open_embeddings(default, cfg.backend)
        check_embeddings(pes, model_version, graph, config.embeddings.refresh)
    except StaleEmbeddingsError as exc:
        log.warning("new-node requests will be refused: %s (%s)", exc.message, default)
        return None, exc
    except StoreFormatError as exc:
        log.warning("new-node requests will be refused: %s", exc.message)
        message = (
            "the precomputed embeddings could not be read (the server log says why): run "
            "`gnnserve precompute` again"
        )
        return None, MissingEmbeddingsError(message, "new_nodes")
    log.info("new-node requests use the precomputed embeddings in %s", default)
    return pes, None
