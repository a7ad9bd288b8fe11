"""The FastAPI application: /v1/predict, Open Inference Protocol v2, /metrics, health.

``POST /v1/predict`` answers for existing nodes (``nodes``) or for new nodes sent with the
request (``new_nodes``: features and edges, answered with precomputed embeddings).
"""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import json
import logging
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import torch
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from gnnserve.dynamic.bulk import ARROW_STREAM
from gnnserve.dynamic.updates import UpdateRejectedError
from gnnserve.engine.engine import Engine
from gnnserve.engine.placement import tier_stats
from gnnserve.errors import (
    GnnServeError,
    InvalidInputError,
    UnknownModelError,
    echo,
    internal_error,
)
from gnnserve.models.checkpoint import release_freed_heap
from gnnserve.models.heap import IdleHeapTrimmer
from gnnserve.server import oip
from gnnserve.server.auth import ApiKeys, RequireApiKey
from gnnserve.server.counting import CountRequests, RequestCounts
from gnnserve.server.limits import (
    BodyLimit,
    JsonBodyRoute,
    accepts_raw,
    default_body_limit,
    error_json,
    json_fast_path,
    retry_headers,
)
from gnnserve.server.looplag import LoopLag
from gnnserve.server.metrics import ServerMetrics
from gnnserve.server.models import ModelRepository
from gnnserve.server.oip_http import OipErrorShape, flat_error
from gnnserve.server.schemas import (
    ErrorResponse,
    PredictRequest,
    PredictResponse,
    UpdatesRequest,
    UpdatesResponse,
)
from gnnserve.server.shedding import SheddingMiddleware, admission_by_path
from gnnserve.server.workers import WorkerSlot, all_metrics
from gnnserve.types import Result

log = logging.getLogger(__name__)

ARROW_UPDATES_BODY = {  # the second body type of POST /v1/graph/updates, for the OpenAPI schema
    "requestBody": {"content": {ARROW_STREAM: {"schema": {"type": "string", "format": "binary"}}}}
}

_ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorResponse} for code in (400, 401, 403, 404, 409, 413, 429, 500, 503, 504)
}


def error_response(exc: GnnServeError) -> JSONResponse:
    """JSON body ``{"error": {kind, message, field}}`` with the error's HTTP status."""
    return JSONResponse(error_json(exc), status_code=exc.http_status, headers=retry_headers(exc))


def _validation_error(exc: RequestValidationError) -> InvalidInputError:
    err = exc.errors()[0] if exc.errors() else {"loc": ("body",), "msg": "invalid body"}
    # a location may hold a client's key (an unknown field): cut each part short
    loc = [p if len(p) <= 64 else f"{p[:64]}..." for p in map(str, err.get("loc", ()))]
    field = ".".join(p for p in loc if p != "body") or "body"
    msg = str(err.get("msg"))[:300]
    if err.get("type") == "json_invalid":
        return InvalidInputError(f"malformed JSON: {msg}", "body")
    return InvalidInputError(f"{field}: {msg}", field)


def _node_id(text: str) -> int:
    """A node id from a URL path segment: plain decimal digits only (int() would also take
    ``1_000``, ``+1``, `` 1`` and non-ASCII digits); InvalidInputError naming ``node``."""
    if not (text.isascii() and text.isdigit()):
        raise InvalidInputError(f"node must be a decimal node id, got {echo(text)}", "node")
    if len(text) > 18:  # beyond int64 (and any store): the store's check would see a wrapped id
        raise InvalidInputError(f"node {echo(text)} is not a node id of this graph", "node")
    return int(text)


def result_json(model: str, result: Result) -> dict[str, Any]:
    """The /v1/predict answer for one engine result (plus the new-node fields for those)."""
    body: dict[str, Any] = {
        "model": model,
        "model_version": result.model_version,
        "graph_version": result.graph_version,
        "output": result.output.value,
        "nodes": result.nodes.tolist(),
        "predictions": result.values.tolist(),
        "timings": result.timings.as_dict(),
    }
    if result.new_nodes is not None:
        body.update(new_node_fields(result))
    return body


def new_node_fields(result: Result) -> dict[str, Any]:
    """What a new-node answer reports beyond the predictions."""
    info = result.new_nodes
    assert info is not None
    return {
        "new_nodes": int(result.nodes.size),
        "mode": info.mode,
        "gamma": info.gamma,
        "policy": info.policy,
        "num_candidates": info.num_candidates,
        "recomputed": int(info.recomputed.size),
        "pe_version": info.pe_version,
        "pe_lag": info.pe_lag if info.pe_version is not None else None,
    }


async def _predict(engine: Engine, body: PredictRequest) -> Result:
    """Run a /v1/predict body: existing nodes, or new nodes (exactly one of them)."""
    if body.min_version is not None:  # its own thread: it may read the others' batches
        await asyncio.to_thread(engine.ensure_version, body.min_version)
    new = None
    if body.new_nodes is not None:
        n = body.new_nodes
        new = {"features": n.features, "edges": n.edges, "new_edges": n.new_edges}
    request = engine.request(
        body.nodes,
        new,
        output=body.output,
        fanouts=body.fanouts,
        mode=body.mode,
        gamma=body.gamma,
        policy=body.policy,
        seed=body.seed,
    )
    return await engine.asubmit(request)


def _limit_and_guard(
    app: FastAPI, engine: Engine, metrics: ServerMetrics, api_keys: ApiKeys | None
) -> None:
    """Body limit and off-loop body parsing for every route; API keys (outermost) when given."""
    app.router.route_class = JsonBodyRoute  # the routes defined after this parse their bodies
    limit = engine.config.server.max_body_bytes or default_body_limit(
        engine.config.embeddings.max_new_nodes, engine.features.dim
    )
    app.state.max_body_bytes = limit
    reject = metrics.errors.labels("payload_too_large").inc
    app.add_middleware(BodyLimit, max_bytes=limit, on_reject=reject)
    if api_keys is not None:
        app.add_middleware(RequireApiKey, keys=api_keys, on_reject=_count(metrics))


def _watch_freshness(metrics: ServerMetrics, engine: Engine) -> None:
    """/metrics for the answer cache and the PE refresher, when they run."""
    cache = engine.answer_cache
    if cache is not None:
        metrics.watch_stats(
            "result_cache",
            lambda: dataclasses.asdict(cache.stats) | {"bytes": cache.bytes, "entries": len(cache)},
        )
    fresh = engine.new_nodes.fresh
    if fresh is not None:
        refresher = fresh.refresher
        metrics.watch_stats(
            "pe_refresh",
            lambda: dataclasses.asdict(refresher.stats) | {"lag_batches": refresher.lag()},
        )


def _count(metrics: ServerMetrics) -> Callable[[str], None]:
    return lambda kind: metrics.errors.labels(kind).inc()


def _warm_up(engines: list[Engine]) -> None:
    """``warm_up`` of each engine (each logs how long it took), then freeze what the compilers
    left."""
    for engine in engines:
        try:
            engine.warm_up()
        except Exception:  # noqa: BLE001 - a bug on the request path: requests will report it
            log.exception("warm-up of the request path failed; serving without it")
    gc.collect()
    gc.freeze()
    release_freed_heap()  # what the warm-up's forwards freed


def create_app(
    engine: Engine,
    model_name: str = "default",
    api_keys: ApiKeys | None = None,
    models: ModelRepository | None = None,
    workers: WorkerSlot | None = None,
) -> FastAPI:
    """Build the app serving ``engine`` as model ``model_name``; the engine starts with the app.

    ``models``: the repository when several models share ``engine``'s graph (``engine`` its
    first, ``server.models``); None: ``engine`` alone. ``workers``: this process's place among
    the workers of ``serve --workers N`` (/metrics and readiness then speak for all of them:
    server.workers). ``api_keys``: require a bearer token on every endpoint but the health
    probes (server.auth). Request bodies are limited to
    ``server.max_body_bytes`` (server.limits).
    """
    if models is None:
        models = ModelRepository()
        models.add(model_name, engine.config.model_path, engine)
    metrics = ServerMetrics()
    loop_lag = LoopLag(observe=metrics.loop_lag.observe)
    models.on_engine.append(lambda e: e.observers.append(metrics.observe_batch))
    for served in models.engines():
        served.observers.append(metrics.observe_batch)
    metrics.watch_executor(engine.executor.describe)
    _watch_freshness(metrics, engine)
    metrics.watch_routing(engine.planner.parallel_threshold, engine.batcher.config.max_batch_cost)
    metrics.also_render(tier_stats(lambda: engine.features))

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        for served in models.engines():
            served.start()
        loop_lag.start()
        # torch + PyG + FastAPI leave ~380K tracked objects: every full collection scanned them
        # all (220 ms, over 500 ms under load: the p99 spikes of bench/serving.py). Freezing the
        # start-up heap keeps later collections to what requests allocate.
        gc.collect()
        gc.freeze()
        grpc_server = None
        if engine.config.server.grpc_port is not None:  # grpcio loads only when asked for
            from gnnserve.server.oip_grpc import start_grpc

            grpc_server = await start_grpc(app, models, metrics, api_keys, oip.EXTENSIONS)
        # after the port is bound: live answers at once, ready (503 until then) once warm
        warming = asyncio.create_task(asyncio.to_thread(_warm_up, models.engines()))
        trimmer = IdleHeapTrimmer().start()  # activations' pages back once traffic pauses
        yield
        trimmer.stop()
        if grpc_server is not None:  # HTTP has drained: now gRPC's calls in flight
            await grpc_server.stop()
        await warming  # the engine must not close its stores under a running warm-up
        await loop_lag.stop()
        models.stop()  # uvicorn has already finished in-flight requests: this drains the engines

    app = FastAPI(title="gnnserve", version="0.1.0", lifespan=lifespan)
    app.state.engine = engine
    app.state.models = models
    app.state.workers = workers
    app.state.loop_lag = loop_lag
    app.state.metrics = metrics
    app.state.model_name = model_name
    app.state.requests = RequestCounts()  # `gnnserve serve` reports them when it stops
    app.add_middleware(
        SheddingMiddleware,
        admission_for=admission_by_path(models),
        metrics=metrics,
        loop_lag=loop_lag,
    )
    app.add_middleware(CountRequests, counts=app.state.requests)
    _limit_and_guard(app, engine, metrics, api_keys)
    app.add_middleware(OipErrorShape)  # outermost: every /v2 error, auth's and limits' too

    @app.exception_handler(GnnServeError)
    async def _ours(_: Request, exc: GnnServeError) -> JSONResponse:
        metrics.errors.labels(exc.kind).inc()
        return error_response(exc)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        err = _validation_error(exc)
        metrics.errors.labels(err.kind).inc()
        return error_response(err)

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        kind = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
        metrics.errors.labels(kind).inc()
        body = {"error": {"kind": kind, "message": str(exc.detail), "field": None}}
        return JSONResponse(body, status_code=exc.status_code)

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        # a bug, not bad input: the JSON error body still, without the exception's text (it
        # may hold server paths); Starlette re-raises after answering, so the log has the trace.
        # This handler runs outside every middleware: it gives /v2 its error shape itself.
        metrics.errors.labels("internal").inc()
        response = error_response(internal_error(exc))
        if request.url.path.startswith("/v2"):
            return JSONResponse(json.loads(flat_error(bytes(response.body))), status_code=500)
        return response

    @app.post("/v1/predict", response_model=PredictResponse, responses=_ERRORS)
    async def predict(body: PredictRequest) -> JSONResponse:
        """Predict for existing nodes or new ones: labels, class probabilities or embeddings."""
        name = model_name if body.model is None else body.model
        if name not in models.names():
            raise UnknownModelError(
                f"unknown model {echo(name)}; serving {models.names()}", "model"
            )
        start = time.perf_counter()
        result = await models.run(name, None, lambda served: _predict(served, body))
        endpoint = "predict" if body.new_nodes is None else "predict_new_nodes"
        metrics.answered(endpoint, name, time.perf_counter() - start)
        return JSONResponse(result_json(name, result))

    async def bulk_updates(raw: bytes) -> JSONResponse:
        """The same, sent as an Arrow IPC stream (``dynamic.bulk``): one all-or-nothing batch."""
        limit = app.state.max_body_bytes  # what the body may expand to, too
        result = await asyncio.to_thread(engine.apply_bulk_updates, raw, limit)
        metrics.update_batches.labels("arrow").inc()
        metrics.answered("updates", "")
        return JSONResponse(dataclasses.asdict(result))

    async def edge_updates(raw: bytes) -> JSONResponse | None:
        """A JSON body of plain edge operations, read into columns without the GIL
        (``dynamic.json_scan``) and applied as such; None (parse it as JSON) for any other
        body, and for a batch the store refuses (the JSON path names the problems)."""
        batch = engine.scan_edge_updates(raw)
        if batch is None:
            return None
        try:
            result = await asyncio.to_thread(engine.apply_update_columns, batch)
        except UpdateRejectedError:
            return None  # nothing was applied
        metrics.update_batches.labels("edges_scanned").inc()
        metrics.answered("updates", "")
        return JSONResponse(dataclasses.asdict(result))

    @app.post(
        "/v1/graph/updates",
        response_model=UpdatesResponse,
        responses=_ERRORS,
        openapi_extra=ARROW_UPDATES_BODY,
    )
    @accepts_raw(ARROW_STREAM, bulk_updates)
    @json_fast_path(edge_updates)
    async def updates(body: UpdatesRequest) -> JSONResponse:
        """Apply graph updates; acknowledged once durable in the update log. Send JSON, or an
        Arrow IPC stream (Content-Type: application/vnd.apache.arrow.stream) with columns op,
        src, dst, node, features for bulk ingestion."""
        result = await asyncio.to_thread(engine.apply_updates, body.ops)
        metrics.update_batches.labels("json").inc()
        metrics.answered("updates", "")
        return JSONResponse(dataclasses.asdict(result))

    @app.get("/v1/graph/neighbors/{node}", responses=_ERRORS)
    async def neighbors(node: str, min_version: str | None = None) -> dict[str, Any]:
        """In-neighbours of ``node`` (a decimal node id) at the current graph version (sources
        of edges into it); ``min_version``: at least the version a write returned (its seq or
        graph_version), as in /v1/predict."""
        node_id = _node_id(node)
        if min_version is not None:
            await asyncio.to_thread(engine.ensure_version, min_version)
        version = engine.graph.acquire_read()
        try:
            ids = engine.graph.neighbors(node_id).tolist()
        finally:
            engine.graph.release_read()
        return {"node": node_id, "graph_version": version, "in_neighbors": ids}

    @app.get("/metrics", include_in_schema=False)
    async def prometheus(local: bool = False) -> Response:
        """This process's metrics; every worker's (labelled ``worker``) under --workers, unless
        ``?local=1``."""
        metrics.queue_depth.set(sum(e.queue_depth for e in models.engines()))
        text = metrics.render()
        if workers is not None and not local:
            text = await all_metrics(workers, text)
        return Response(text, media_type="text/plain; version=0.0.4")

    app.state.oip_stats = oip.Statistics()  # per model, HTTP and gRPC together
    oip.add_routes(app, models, metrics, _ERRORS, app.state.oip_stats)
    app.state.torch_threads = torch.get_num_threads()
    return app
