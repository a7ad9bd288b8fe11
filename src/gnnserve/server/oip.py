"""Open Inference Protocol v2 routes: health, model metadata, infer with an INT64 node_ids input."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from fastapi import FastAPI
from fastapi.responses import JSONResponse

from gnnserve.engine.engine import Engine
from gnnserve.errors import InvalidInputError, UnknownModelError
from gnnserve.server.metrics import ServerMetrics
from gnnserve.server.schemas import InferRequest, InferResponse
from gnnserve.types import InferenceResult, OutputKind

INPUT_NAME = "node_ids"
_NAMES = [k.value for k in OutputKind]
_DATATYPES = {OutputKind.LABEL: "INT64", OutputKind.PROBS: "FP32", OutputKind.EMBEDDING: "FP32"}


def _check_model(name: str, served: str) -> None:
    if name != served:
        raise UnknownModelError(f"unknown model {name!r}; serving {served!r}", "model_name")


def _node_ids(body: InferRequest) -> list[int]:
    """The node ids of the ``node_ids`` input, checked against its declared type and shape."""
    tensors = [t for t in body.inputs if t.name == INPUT_NAME]
    if len(tensors) != 1:
        raise InvalidInputError(f"exactly one input named {INPUT_NAME!r} is required", "inputs")
    t = tensors[0]
    if t.datatype != "INT64":
        raise InvalidInputError(f"{INPUT_NAME} datatype must be INT64, got {t.datatype}", "inputs")
    if len(t.shape) not in (1, 2) or (len(t.shape) == 2 and t.shape[1] != 1):
        raise InvalidInputError(
            f"{INPUT_NAME} shape must be [n] or [n, 1], got {t.shape}", "inputs"
        )
    if t.shape[0] != len(t.data):
        raise InvalidInputError(
            f"{INPUT_NAME} shape {t.shape} does not match {len(t.data)} data values", "inputs"
        )
    return t.data


def _tensor(name: str, result: InferenceResult) -> dict[str, Any]:
    values = result.values
    return {
        "name": name,
        "shape": list(values.shape),
        "datatype": _DATATYPES[result.output],
        "data": values.flatten().tolist(),
    }


def model_metadata(engine: Engine, name: str) -> dict[str, Any]:
    """OIP v2 model metadata: inputs and the three outputs with their shapes."""
    cfg = engine.runner.model.config
    classes = cfg.out_dim
    hidden = cfg.hidden_dim if cfg.num_layers > 1 else cfg.in_dim
    return {
        "name": name,
        "versions": [engine.runner.version],
        "platform": "gnnserve",
        "inputs": [{"name": INPUT_NAME, "datatype": "INT64", "shape": [-1]}],
        "outputs": [
            {"name": "label", "datatype": "INT64", "shape": [-1]},
            {"name": "probs", "datatype": "FP32", "shape": [-1, classes]},
            {"name": "embedding", "datatype": "FP32", "shape": [-1, hidden]},
        ],
    }


def add_routes(
    app: FastAPI, engine: Engine, served: str, metrics: ServerMetrics, errors: dict[int | str, Any]
) -> None:
    """Register the OIP v2 endpoints on ``app``."""

    @app.get("/v2/health/live")
    async def live() -> dict[str, bool]:
        return {"live": True}

    @app.get("/v2/health/ready", responses=errors)
    async def ready() -> JSONResponse:
        ok = engine.started and not engine.admission.closed
        return JSONResponse({"ready": ok}, status_code=200 if ok else 503)

    @app.get("/v2", responses=errors)
    async def server_metadata() -> dict[str, Any]:
        return {"name": "gnnserve", "version": "0.1.0", "extensions": []}

    @app.get("/v2/models/{name}", responses=errors)
    async def metadata(name: str) -> dict[str, Any]:
        _check_model(name, served)
        return model_metadata(engine, name)

    @app.get("/v2/models/{name}/ready", responses=errors)
    async def model_ready(name: str) -> dict[str, Any]:
        _check_model(name, served)
        return {"name": name, "ready": engine.started}

    @app.post("/v2/models/{name}/infer", response_model=InferResponse, responses=errors)
    async def infer(name: str, body: InferRequest) -> JSONResponse:
        """Run inference; outputs default to ``label``."""
        _check_model(name, served)
        start = time.perf_counter()
        nodes = _node_ids(body)
        wanted = [o.name for o in body.outputs] if body.outputs else ["label"]
        if len(set(wanted)) != len(wanted):
            raise InvalidInputError("outputs lists a name twice", "outputs")
        for w in wanted:
            if w not in _NAMES:
                raise InvalidInputError(f"unknown output {w!r}; choose one of {_NAMES}", "outputs")
        results = await asyncio.gather(*(engine.apredict(nodes, w) for w in wanted))
        metrics.requests.labels("infer").inc()
        metrics.request_latency.labels("infer").observe(time.perf_counter() - start)
        return JSONResponse(
            {
                "model_name": name,
                "model_version": engine.runner.version,
                "id": body.id,
                "outputs": [_tensor(w, r) for w, r in zip(wanted, results, strict=True)],
            }
        )
