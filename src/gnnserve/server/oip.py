"""Open Inference Protocol v2 routes: health, model metadata, infer.

Inference takes either the INT64 ``node_ids`` input (existing nodes) or new nodes:
``new_node_features`` (FP32 [m, F]), ``new_node_edges`` (INT64 [E, 2]: new node index, existing
node id) and optionally ``new_node_new_edges`` (INT64 [E2, 2]); the request ``parameters`` may
set ``mode``, ``gamma``, ``policy``, ``seed`` and ``fanouts`` of a new-node request, and
``fanouts`` and ``seed`` of a ``node_ids`` request (any other parameter is refused, 400 naming
``parameters``).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import numpy as np
from fastapi import FastAPI
from fastapi.responses import JSONResponse

from gnnserve.engine.engine import Engine
from gnnserve.errors import InvalidInputError, UnknownModelError, echo
from gnnserve.server.metrics import ServerMetrics
from gnnserve.server.schemas import InferRequest, InferResponse, InferTensor
from gnnserve.types import OutputKind, Result

INPUT_NAME = "node_ids"
FEATURES_INPUT = "new_node_features"
EDGES_INPUT = "new_node_edges"
NEW_EDGES_INPUT = "new_node_new_edges"
NEW_NODE_INPUTS = (FEATURES_INPUT, EDGES_INPUT, NEW_EDGES_INPUT)
NEW_NODE_PARAMETERS = ("mode", "gamma", "policy", "seed", "fanouts")
NODE_IDS_PARAMETERS = ("fanouts", "seed")  # of a node_ids request, as in /v1/predict
# engine error fields -> the OIP input that carried the value
_FIELDS = {
    "new_nodes.features": FEATURES_INPUT,
    "new_nodes.edges": EDGES_INPUT,
    "new_nodes.new_edges": NEW_EDGES_INPUT,
}
_NAMES = [k.value for k in OutputKind]
_DATATYPES = {OutputKind.LABEL: "INT64", OutputKind.PROBS: "FP32", OutputKind.EMBEDDING: "FP32"}


def _check_model(name: str, served: str) -> None:
    if name != served:
        raise UnknownModelError(f"unknown model {echo(name)}; serving {served!r}", "model_name")


def _node_ids(body: InferRequest) -> list[int]:
    """The node ids of the ``node_ids`` input, checked against its declared type and shape."""
    tensors = [t for t in body.inputs if t.name == INPUT_NAME]
    if len(tensors) != 1:
        raise InvalidInputError(f"exactly one input named {INPUT_NAME!r} is required", "inputs")
    t = tensors[0]
    if t.datatype != "INT64":
        raise InvalidInputError(
            f"{INPUT_NAME} datatype must be INT64, got {echo(t.datatype)}", "inputs"
        )
    if len(t.shape) not in (1, 2) or (len(t.shape) == 2 and t.shape[1] != 1):
        raise InvalidInputError(
            f"{INPUT_NAME} shape must be [n] or [n, 1], got {echo(t.shape)}", "inputs"
        )
    if t.shape[0] != len(t.data):
        raise InvalidInputError(
            f"{INPUT_NAME} shape {echo(t.shape)} does not match {len(t.data)} data values",
            "inputs",
        )
    return [int(v) for v in t.data]  # INT64 data is checked to be integers by the schema


def _matrix(t: InferTensor, datatype: str, width: int | None) -> np.ndarray:
    """The data of ``t`` as a [rows, width] array, after checking datatype and shape."""
    if t.datatype != datatype:
        raise InvalidInputError(
            f"{t.name} datatype must be {datatype}, got {echo(t.datatype)}", t.name
        )
    if len(t.shape) != 2 or min(t.shape) < 0 or (width not in (None, t.shape[1])):
        want = f"[n, {width}]" if width is not None else "[n, F]"
        raise InvalidInputError(f"{t.name} shape must be {want}, got {echo(t.shape)}", t.name)
    if t.shape[0] * t.shape[1] != len(t.data):
        raise InvalidInputError(
            f"{t.name} shape {echo(t.shape)} does not match {len(t.data)} data values", t.name
        )
    try:
        arr = np.asarray(t.data, dtype=np.float64 if datatype == "FP32" else np.int64)
    except OverflowError:
        limit = "float32" if datatype == "FP32" else "int64"
        message = f"{t.name} holds a value beyond the {limit} range"
        raise InvalidInputError(message, t.name) from None
    return arr.reshape(t.shape[0], t.shape[1])


def _new_node_inputs(body: InferRequest) -> dict[str, np.ndarray | None] | None:
    """features / edges / new_edges of a new-node request; None when it asks for node_ids."""
    by_name: dict[str, InferTensor] = {}
    for t in body.inputs:
        if t.name in NEW_NODE_INPUTS:
            if t.name in by_name:
                raise InvalidInputError(f"input {t.name!r} is given twice", "inputs")
            by_name[t.name] = t
    if not by_name:
        return None
    if any(t.name == INPUT_NAME for t in body.inputs):
        raise InvalidInputError(
            f"give either {INPUT_NAME!r} (existing nodes) or the new-node inputs "
            f"{list(NEW_NODE_INPUTS)}, not both",
            "inputs",
        )
    for name in (FEATURES_INPUT, EDGES_INPUT):
        if name not in by_name:
            raise InvalidInputError(f"a new-node request needs the input {name!r}", "inputs")
    new_edges = by_name.get(NEW_EDGES_INPUT)
    return {
        "features": _matrix(by_name[FEATURES_INPUT], "FP32", None),
        "edges": _matrix(by_name[EDGES_INPUT], "INT64", 2),
        "new_edges": None if new_edges is None else _matrix(new_edges, "INT64", 2),
    }


async def _infer_node_ids(
    engine: Engine, nodes: list[int], wanted: list[str], body: InferRequest
) -> list[Result]:
    """One engine run per wanted output; ``parameters`` may set ``fanouts`` and ``seed`` (as
    /v1/predict)."""
    params = body.parameters or {}
    _check_parameters(params, NODE_IDS_PARAMETERS, f"an {INPUT_NAME!r} request")
    try:
        requests = [
            engine.request(nodes, output=w, fanouts=params.get("fanouts"), seed=params.get("seed"))
            for w in wanted
        ]
        return list(await asyncio.gather(*(engine.asubmit(r) for r in requests)))
    except InvalidInputError as exc:
        if exc.field == "nodes":  # the engine's name for the ids: the OIP input is node_ids
            exc.field = INPUT_NAME
        raise


def _check_parameters(params: dict[str, object], allowed: tuple[str, ...], what: str) -> None:
    """InvalidInputError naming ``parameters`` when ``params`` holds a name not in ``allowed``."""
    unknown = sorted(set(params) - set(allowed))
    if unknown:
        shown = ", ".join(echo(name) for name in unknown[:4])
        shown += ", ..." if len(unknown) > 4 else ""
        raise InvalidInputError(
            f"unknown parameters {shown}; {what} takes {list(allowed)}", "parameters"
        )


async def _infer_new_nodes(
    engine: Engine, inputs: dict[str, np.ndarray | None], wanted: list[str], body: InferRequest
) -> tuple[list[Any], dict[str, Any]]:
    """One engine run for every wanted output; (output values, response parameters)."""
    params = body.parameters or {}
    _check_parameters(params, NEW_NODE_PARAMETERS, "a new-node request")
    try:
        request = engine.request(
            new_nodes=inputs,
            output=wanted[0],
            mode=params.get("mode"),
            gamma=params.get("gamma"),
            policy=params.get("policy"),
            fanouts=params.get("fanouts"),
            seed=params.get("seed", 0),
        )
        result = await engine.asubmit(request)
    except InvalidInputError as exc:
        exc.field = _FIELDS.get(exc.field or "", exc.field)
        raise
    info = result.new_nodes
    assert info is not None
    rows = np.arange(result.nodes.size, dtype=np.int64)
    shape = engine.runner.shape_output
    values = [result.values]
    values += [shape(OutputKind(w), info.logits, info.embedding, rows) for w in wanted[1:]]
    parameters = {
        "new_nodes": int(result.nodes.size),
        "mode": info.mode,
        "gamma": info.gamma,
        "policy": info.policy,
        "num_candidates": info.num_candidates,
        "recomputed": int(info.recomputed.size),
        "graph_version": result.graph_version,
    }
    return [_tensor(w, v) for w, v in zip(wanted, values, strict=True)], parameters


def _tensor(name: str, values: Any) -> dict[str, Any]:
    """An output tensor: ``values`` of output kind ``name``, flattened row-major."""
    return {
        "name": name,
        "shape": list(values.shape),
        "datatype": _DATATYPES[OutputKind(name)],
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
        "inputs": [
            {"name": INPUT_NAME, "datatype": "INT64", "shape": [-1]},
            {"name": FEATURES_INPUT, "datatype": "FP32", "shape": [-1, cfg.in_dim]},
            {"name": EDGES_INPUT, "datatype": "INT64", "shape": [-1, 2]},
            {"name": NEW_EDGES_INPUT, "datatype": "INT64", "shape": [-1, 2]},
        ],
        "outputs": [
            {"name": "label", "datatype": "INT64", "shape": [-1]},
            {"name": "probs", "datatype": "FP32", "shape": [-1, classes]},
            {"name": "embedding", "datatype": "FP32", "shape": [-1, hidden]},
        ],
    }


def _ready(engine: Engine) -> bool:
    return engine.started and engine.warm and not engine.admission.closed


def add_routes(
    app: FastAPI, engine: Engine, served: str, metrics: ServerMetrics, errors: dict[int | str, Any]
) -> None:
    """Register the OIP v2 endpoints on ``app``."""

    @app.get("/v2/health/live")
    async def live() -> dict[str, bool]:
        return {"live": True}

    @app.get("/v2/health/ready", responses=errors)
    async def ready() -> JSONResponse:
        """200 once the engine runs and its request path is warm (Engine.warm_up), else 503."""
        ok = _ready(engine)
        return JSONResponse({"ready": ok}, status_code=200 if ok else 503)

    @app.get("/v2", responses=errors)
    async def server_metadata() -> dict[str, Any]:
        return {"name": "gnnserve", "version": "0.1.0", "extensions": []}

    @app.get("/v2/models/{name}", responses=errors)
    async def metadata(name: str) -> dict[str, Any]:
        _check_model(name, served)
        return model_metadata(engine, name)

    @app.get("/v2/models/{name}/ready", responses=errors)
    async def model_ready(name: str) -> JSONResponse:
        _check_model(name, served)
        ok = _ready(engine)
        return JSONResponse({"name": name, "ready": ok}, status_code=200 if ok else 503)

    @app.post("/v2/models/{name}/infer", response_model=InferResponse, responses=errors)
    async def infer(name: str, body: InferRequest) -> JSONResponse:
        """Run inference on existing nodes (``node_ids``) or new nodes; outputs default to
        ``label``."""
        _check_model(name, served)
        start = time.perf_counter()
        new_nodes = _new_node_inputs(body)
        nodes = _node_ids(body) if new_nodes is None else []
        wanted = [o.name for o in body.outputs] if body.outputs else ["label"]
        if len(set(wanted)) != len(wanted):
            raise InvalidInputError("outputs lists a name twice", "outputs")
        for w in wanted:
            if w not in _NAMES:
                raise InvalidInputError(
                    f"unknown output {echo(w)}; choose one of {_NAMES}", "outputs"
                )
        answer: dict[str, Any] = {
            "model_name": name,
            "model_version": engine.runner.version,
            "id": body.id,
        }
        if new_nodes is None:
            results = await _infer_node_ids(engine, nodes, wanted, body)
            answer["outputs"] = [_tensor(w, r.values) for w, r in zip(wanted, results, strict=True)]
            endpoint = "infer"
        else:
            answer["outputs"], answer["parameters"] = await _infer_new_nodes(
                engine, new_nodes, wanted, body
            )
            endpoint = "infer_new_nodes"
        metrics.requests.labels(endpoint).inc()
        metrics.request_latency.labels(endpoint).observe(time.perf_counter() - start)
        return JSONResponse(answer)
