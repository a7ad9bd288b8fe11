"""Open Inference Protocol v2 routes over HTTP: health, server and model metadata, infer, and
Triton's model configuration and statistics extensions.

Every route also answers under ``/v2/models/{name}/versions/{version}/...`` (the version must
be the served one). A path under ``/v2`` that is not one of these is a 404 naming the
extensions offered (``GET /v2`` lists them); errors take the protocol's shape,
``{"error": "<message>"}`` (``server.oip_http.OipErrorShape``). How a request is run:
``server.oip_infer``; its wire formats: ``server.oip_http``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Awaitable
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from gnnserve.engine.engine import Engine
from gnnserve.errors import GnnServeError, echo
from gnnserve.server import oip_infer
from gnnserve.server.metrics import ServerMetrics
from gnnserve.server.models import ModelRepository
from gnnserve.server.oip_http import answer_response, read_call
from gnnserve.server.oip_repository import add_repository_routes
from gnnserve.server.oip_tensors import InferAnswer, InferCall
from gnnserve.server.schemas import InferRequest
from gnnserve.server.workers import peers_ready

SERVER_NAME = "gnnserve"
SERVER_VERSION = "0.1.0"
EXTENSIONS = ["binary_tensor_data", "model_configuration", "statistics", "model_repository"]
INFER_BODY = {  # the JSON header of POST .../infer, for the OpenAPI schema
    "requestBody": {
        "required": True,
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/InferRequest"}}},
    }
}
_TYPES = {"INT64": "TYPE_INT64", "FP32": "TYPE_FP32"}  # OIP datatype -> Triton config type


@dataclass
class ModelStats:
    """Triton's statistics extension for one model: requests answered and failed, their time."""

    success: int = 0
    success_ns: int = 0
    fail: int = 0
    fail_ns: int = 0
    nodes: int = 0  # inference_count: the nodes (or new nodes) answered
    last_ms: int = 0  # last_inference: milliseconds since the epoch
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def record(self, ok: bool, elapsed_ns: int, nodes: int) -> None:
        """Count one request."""
        with self.lock:
            if ok:
                self.success, self.success_ns = self.success + 1, self.success_ns + elapsed_ns
                self.nodes += nodes
            else:
                self.fail, self.fail_ns = self.fail + 1, self.fail_ns + elapsed_ns
            self.last_ms = int(time.time() * 1000)

    def as_json(self, name: str, version: str) -> dict[str, Any]:
        """The extension's ``model_stats`` entry."""
        with self.lock:
            return {
                "name": name,
                "version": version,
                "last_inference": self.last_ms,
                "inference_count": self.nodes,
                "execution_count": self.success,
                "inference_stats": {
                    "success": {"count": self.success, "ns": self.success_ns},
                    "fail": {"count": self.fail, "ns": self.fail_ns},
                },
            }


def model_config(engine: Engine, name: str) -> dict[str, Any]:
    """Triton's model configuration of the served model (inputs, outputs, sampling)."""
    meta = oip_infer.model_metadata(engine, name)

    def tensors(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [
            {"name": e["name"], "data_type": _TYPES[e["datatype"]], "dims": e["shape"]}
            for e in entries
        ]

    fanouts = engine.config.sampler.fanouts
    return {
        "name": name,
        "platform": SERVER_NAME,
        "backend": SERVER_NAME,
        "max_batch_size": 0,  # a request's node_ids are its batch: shapes carry no batch axis
        "input": tensors(meta["inputs"]),
        "output": tensors(meta["outputs"]),
        "parameters": {"fanouts": {"string_value": ",".join(map(str, fanouts))}},
    }


async def run_counted(
    models: ModelRepository,
    stats: Statistics,
    metrics: ServerMetrics,
    name: str,
    version: str | None,
    call: Awaitable[InferCall],
    transport: str,
) -> tuple[InferCall, InferAnswer]:
    """Await ``call`` (the request, decoded) and run it on model ``name`` (``version``); it
    counts in the model's statistics (a failure too, decoding included) and on /metrics as
    endpoint ``<transport>infer`` or ``<transport>infer_new_nodes`` ("" HTTP, "grpc_" gRPC)."""
    start = time.perf_counter_ns()
    answer = None
    try:
        decoded = await call
        answer = await models.run(name, version, lambda e: oip_infer.run_infer(e, decoded))
    finally:
        elapsed = time.perf_counter_ns() - start
        stats.of(name).record(answer is not None, elapsed, answer.rows if answer else 0)
    kind = "infer_new_nodes" if answer.new_nodes else "infer"
    metrics.answered(transport + kind, name, elapsed / 1e9)
    return decoded, answer


def ready(engine: Engine) -> bool:
    """The engine answers requests: started, warm and not stopping."""
    return engine.started and engine.warm and not engine.admission.closed


class Statistics:
    """:class:`ModelStats` per model name (created on first use)."""

    def __init__(self) -> None:
        self._by_name: dict[str, ModelStats] = {}
        self._lock = threading.Lock()

    def of(self, name: str) -> ModelStats:
        """The statistics of model ``name``."""
        with self._lock:
            return self._by_name.setdefault(name, ModelStats())


def _add_openapi_schema(app: FastAPI) -> None:
    """Put InferRequest in the OpenAPI components (the infer route reads its body itself)."""
    build = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = build()
            body = InferRequest.model_json_schema(ref_template="#/components/schemas/{model}")
            components = schema.setdefault("components", {}).setdefault("schemas", {})
            components.update(body.pop("$defs", {}))
            components["InferRequest"] = body
        return app.openapi_schema or schema

    app.openapi = openapi  # type: ignore[method-assign]


def add_routes(
    app: FastAPI,
    models: ModelRepository,
    metrics: ServerMetrics,
    errors: dict[int | str, Any],
    stats: Statistics,
) -> None:
    """Register the OIP v2 endpoints on ``app`` for the models of ``models``."""

    @app.get("/v2/health/live")
    async def live() -> dict[str, bool]:
        return {"live": True}

    @app.get("/v2/health/ready", responses=errors)
    async def server_ready(local: bool = False) -> JSONResponse:
        """200 once every loaded model's engine runs and is warm (Engine.warm_up), in every
        worker under --workers (``?local=1``: this one's), else 503."""
        ok = all(ready(e) for e in models.engines())
        workers = app.state.workers
        if ok and workers is not None and not local:
            ok = await peers_ready(workers)
        return JSONResponse({"ready": ok}, status_code=200 if ok else 503)

    @app.get("/v2", responses=errors)
    async def server_metadata() -> dict[str, Any]:
        return {"name": SERVER_NAME, "version": SERVER_VERSION, "extensions": EXTENSIONS}

    @app.get("/v2/models/stats", responses=errors)
    @app.get("/v2/models/{name}/stats", responses=errors)
    @app.get("/v2/models/{name}/versions/{version}/stats", responses=errors)
    async def statistics(name: str | None = None, version: str | None = None) -> dict[str, Any]:
        """Triton's statistics extension: requests answered and failed, and their time."""
        if name is not None:
            engines = {name: models.get(name, version)}
        else:
            engines = {n: models.get(n) for n in models.loaded_names()}
        return {
            "model_stats": [stats.of(n).as_json(n, e.runner.version) for n, e in engines.items()]
        }

    @app.get("/v2/models/{name}", responses=errors)
    @app.get("/v2/models/{name}/versions/{version}", responses=errors)
    async def metadata(name: str, version: str | None = None) -> dict[str, Any]:
        return oip_infer.model_metadata(models.get(name, version), name)

    @app.get("/v2/models/{name}/ready", responses=errors)
    @app.get("/v2/models/{name}/versions/{version}/ready", responses=errors)
    async def model_ready(name: str, version: str | None = None) -> JSONResponse:
        ok = ready(models.get(name, version))
        return JSONResponse({"name": name, "ready": ok}, status_code=200 if ok else 503)

    @app.get("/v2/models/{name}/config", responses=errors)
    @app.get("/v2/models/{name}/versions/{version}/config", responses=errors)
    async def config(name: str, version: str | None = None) -> dict[str, Any]:
        """Triton's model configuration extension."""
        return model_config(models.get(name, version), name)

    async def infer(request: Request, name: str, version: str | None = None) -> Response:
        """Run inference on existing nodes (``node_ids``) or new nodes; outputs default to
        ``label``. JSON, or the binary tensor data extension (``server.oip_http``)."""
        models.get(name, version)  # 404 before the body is read
        body = read_call(request, name, app.state.max_body_bytes)
        call, answer = await run_counted(models, stats, metrics, name, version, body, "")
        return answer_response(answer, call)

    for path in ("/v2/models/{name}/infer", "/v2/models/{name}/versions/{version}/infer"):
        app.add_api_route(path, infer, methods=["POST"], responses=errors, openapi_extra=INFER_BODY)

    add_repository_routes(app, models, errors)

    @app.api_route("/v2/{rest:path}", methods=["GET", "POST"], include_in_schema=False)
    async def unknown(request: Request, rest: str) -> None:
        raise NotOfferedError(
            f"{request.method} /v2/{echo(rest)} is not an endpoint of this server; it offers "
            f"the core protocol and the extensions {EXTENSIONS}",
            "path",
        )

    _add_openapi_schema(app)


class NotOfferedError(GnnServeError):
    """A /v2 path of an extension (or a route) this server does not offer: 404."""

    http_status = 404
    kind = "not_found"
