"""Request and response bodies of the HTTP API (pydantic), shared by the app and its docs."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictInt, StrictStr

OutputName = Literal["label", "probs", "embedding"]


class PredictRequest(BaseModel):
    """POST /v1/predict body."""

    model_config = ConfigDict(extra="forbid")

    nodes: list[StrictInt] = Field(..., description="existing node ids to predict for")
    output: StrictStr = Field("label", description="label | probs | embedding")
    model: StrictStr | None = Field(None, description="model name; defaults to the served one")
    fanouts: list[StrictInt] | None = Field(
        None, description="neighbours sampled per hop (nearest first, -1 = all); default: server's"
    )


class Timings(BaseModel):
    """Per-stage time of a request, milliseconds."""

    queue_ms: float
    sample_ms: float
    fetch_ms: float
    compute_ms: float
    total_ms: float
    batch_size: int


class PredictResponse(BaseModel):
    """POST /v1/predict answer."""

    model: str
    model_version: str
    graph_version: str
    output: OutputName
    nodes: list[int]
    predictions: list[int] | list[list[float]]
    timings: Timings


class ErrorDetail(BaseModel):
    """What went wrong and which field caused it."""

    kind: str
    message: str
    field: str | None = None


class ErrorResponse(BaseModel):
    """Body of every 4xx/5xx answer."""

    error: ErrorDetail


class InferTensor(BaseModel):
    """An Open Inference Protocol v2 input tensor."""

    name: StrictStr
    shape: list[StrictInt]
    datatype: StrictStr
    data: list[StrictInt]
    parameters: dict[str, object] | None = None


class RequestedOutput(BaseModel):
    """An OIP v2 requested output (label | probs | embedding)."""

    name: StrictStr
    parameters: dict[str, object] | None = None


class InferRequest(BaseModel):
    """OIP v2 POST /v2/models/{name}/infer body."""

    id: StrictStr | None = None
    inputs: list[InferTensor] = Field(..., min_length=1)
    outputs: list[RequestedOutput] | None = None
    parameters: dict[str, object] | None = None


class OutputTensor(BaseModel):
    """An OIP v2 output tensor (data flattened row-major)."""

    name: str
    shape: list[int]
    datatype: str
    data: list[int] | list[float]


class InferResponse(BaseModel):
    """OIP v2 inference answer."""

    model_name: str
    model_version: str
    id: str | None = None
    outputs: list[OutputTensor]


class UpdatesRequest(BaseModel):
    """POST /v1/graph/updates body: operations applied in order, all or nothing."""

    model_config = ConfigDict(extra="forbid")

    ops: list[dict[str, Any]] = Field(
        ...,
        description="add_edge {src,dst} | delete_edge {src,dst} | add_node {features} | "
        "upsert_features {node,features}",
    )


class UpdatesResponse(BaseModel):
    """POST /v1/graph/updates answer."""

    graph_version: str
    seq: int
    new_nodes: list[int]
    applied: int
