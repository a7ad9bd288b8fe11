"""Run an Open Inference Protocol v2 request on the engine, whatever transport carried it.

Inference takes either the INT64 ``node_ids`` input (existing nodes) or new nodes:
``new_node_features`` (FP32 [m, F]), ``new_node_edges`` (INT64 [E, 2]: new node index, existing
node id) and optionally ``new_node_new_edges`` (INT64 [E2, 2]); the request ``parameters`` may
set ``mode``, ``gamma``, ``policy``, ``seed`` and ``fanouts`` of a new-node request, and
``fanouts``, ``seed`` and ``min_version`` of a ``node_ids`` request (any other parameter is
refused, 400 naming ``parameters``).
"""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import torch

from gnnserve.engine.engine import Engine
from gnnserve.errors import InvalidInputError, echo
from gnnserve.server.oip_tensors import InferAnswer, InferCall, Tensor
from gnnserve.types import OutputKind, Result

INPUT_NAME = "node_ids"
FEATURES_INPUT = "new_node_features"
EDGES_INPUT = "new_node_edges"
NEW_EDGES_INPUT = "new_node_new_edges"
NEW_NODE_INPUTS = (FEATURES_INPUT, EDGES_INPUT, NEW_EDGES_INPUT)
NEW_NODE_PARAMETERS = ("mode", "gamma", "policy", "seed", "fanouts")
NODE_IDS_PARAMETERS = ("fanouts", "seed", "min_version")  # of node_ids, as in /v1/predict
OUTPUT_NAMES = [k.value for k in OutputKind]
DEFAULT_OUTPUT = "label"
DATATYPES = {OutputKind.LABEL: "INT64", OutputKind.PROBS: "FP32", OutputKind.EMBEDDING: "FP32"}
_FIELDS = {  # engine error fields -> the OIP input that carried the value
    "new_nodes.features": FEATURES_INPUT,
    "new_nodes.edges": EDGES_INPUT,
    "new_nodes.new_edges": NEW_EDGES_INPUT,
}


async def run_infer(engine: Engine, call: InferCall) -> InferAnswer:
    """Answer ``call`` with ``engine`` (its model name already checked by the caller)."""
    new_nodes = _new_node_inputs(call.inputs)
    wanted = _wanted_outputs(call.outputs)
    if new_nodes is None:
        nodes = _node_ids(call.inputs)
        results = await _infer_node_ids(engine, nodes, wanted, call.parameters)
        outputs = [output_tensor(w, r.values) for w, r in zip(wanted, results, strict=True)]
        parameters: dict[str, Any] = {}
        version = results[0].model_version  # the version that computed it, swaps aside
    else:
        outputs, parameters, version = await _infer_new_nodes(
            engine, new_nodes, wanted, call.parameters
        )
    return InferAnswer(call.model, version, outputs, parameters, call.id)


def _wanted_outputs(names: list[str]) -> list[str]:
    wanted = names or [DEFAULT_OUTPUT]
    if len(set(wanted)) != len(wanted):
        raise InvalidInputError("outputs lists a name twice", "outputs")
    for w in wanted:
        if w not in OUTPUT_NAMES:
            raise InvalidInputError(
                f"unknown output {echo(w)}; choose one of {OUTPUT_NAMES}", "outputs"
            )
    return wanted


def output_tensor(name: str, values: torch.Tensor) -> Tensor:
    """The output tensor of kind ``name`` holding ``values`` (a CPU tensor)."""
    array = values.detach().cpu().numpy()
    return Tensor(name, DATATYPES[OutputKind(name)], tuple(array.shape), array)


def _node_ids(inputs: list[Tensor]) -> np.ndarray:
    """The node ids of the ``node_ids`` input, checked against its declared type and shape."""
    tensors = [t for t in inputs if t.name == INPUT_NAME]
    if len(tensors) != 1:
        raise InvalidInputError(f"exactly one input named {INPUT_NAME!r} is required", "inputs")
    t = tensors[0]
    if t.datatype != "INT64":
        raise InvalidInputError(
            f"{INPUT_NAME} datatype must be INT64, got {echo(t.datatype)}", "inputs"
        )
    if len(t.shape) not in (1, 2) or (len(t.shape) == 2 and t.shape[1] != 1):
        raise InvalidInputError(
            f"{INPUT_NAME} shape must be [n] or [n, 1], got {echo(list(t.shape))}", "inputs"
        )
    return t.values.reshape(-1)


def _matrix(t: Tensor, datatype: str, width: int | None) -> np.ndarray:
    """The data of ``t`` as a [rows, width] array, after checking datatype and shape."""
    if t.datatype != datatype:
        raise InvalidInputError(
            f"{t.name} datatype must be {datatype}, got {echo(t.datatype)}", t.name
        )
    if len(t.shape) != 2 or (width not in (None, t.shape[1])):
        want = f"[n, {width}]" if width is not None else "[n, F]"
        raise InvalidInputError(f"{t.name} shape must be {want}, got {echo(list(t.shape))}", t.name)
    return t.values.reshape(t.shape)


def _new_node_inputs(inputs: list[Tensor]) -> dict[str, np.ndarray | None] | None:
    """features / edges / new_edges of a new-node request; None when it asks for node_ids."""
    by_name: dict[str, Tensor] = {}
    for t in inputs:
        if t.name in NEW_NODE_INPUTS:
            if t.name in by_name:
                raise InvalidInputError(f"input {t.name!r} is given twice", "inputs")
            by_name[t.name] = t
    if not by_name:
        return None
    if any(t.name == INPUT_NAME for t in inputs):
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


def _check_parameters(params: dict[str, object], allowed: tuple[str, ...], what: str) -> None:
    """InvalidInputError naming ``parameters`` when ``params`` holds a name not in ``allowed``."""
    unknown = sorted(set(params) - set(allowed))
    if unknown:
        shown = ", ".join(echo(name) for name in unknown[:4])
        shown += ", ..." if len(unknown) > 4 else ""
        raise InvalidInputError(
            f"unknown parameters {shown}; {what} takes {list(allowed)}", "parameters"
        )


async def _infer_node_ids(
    engine: Engine, nodes: np.ndarray, wanted: list[str], params: dict[str, Any]
) -> list[Result]:
    """One engine run per wanted output; ``params`` may set ``fanouts``, ``seed`` and
    ``min_version``."""
    _check_parameters(params, NODE_IDS_PARAMETERS, f"an {INPUT_NAME!r} request")
    if (min_version := params.get("min_version")) is not None:
        if not isinstance(min_version, int | str) or isinstance(min_version, bool):
            raise InvalidInputError(
                "parameters.min_version must be a seq (int) or a graph_version (string)",
                "min_version",
            )
        await asyncio.to_thread(engine.ensure_version, min_version)
    try:
        requests = [
            engine.request(nodes, output=w, fanouts=params.get("fanouts"), seed=params.get("seed"))
            for w in wanted
        ]
        return list(await asyncio.gather(*(engine.asubmit(r) for r in requests)))
    except InvalidInputError as exc:
        if exc.field == "nodes":  # the engine's name for the ids: the OIP input is node_ids
            exc.field = INPUT_NAME
            if exc.message.startswith("nodes "):
                exc.message = INPUT_NAME + exc.message.removeprefix("nodes")
                exc.args = (exc.message,)
        raise


async def _infer_new_nodes(
    engine: Engine,
    inputs: dict[str, np.ndarray | None],
    wanted: list[str],
    params: dict[str, Any],
) -> tuple[list[Tensor], dict[str, Any], str]:
    """One engine run for every wanted output; (output tensors, response parameters, model
    version)."""
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
    outputs = [output_tensor(w, v) for w, v in zip(wanted, values, strict=True)]
    return outputs, parameters, result.model_version


def model_metadata(engine: Engine, name: str) -> dict[str, Any]:
    """OIP v2 model metadata: inputs and the three outputs with their shapes."""
    cfg = engine.runner.model.config
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
            {"name": "probs", "datatype": "FP32", "shape": [-1, cfg.out_dim]},
            {"name": "embedding", "datatype": "FP32", "shape": [-1, hidden]},
        ],
    }
