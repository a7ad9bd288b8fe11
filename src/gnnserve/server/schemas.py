"""Request and response bodies of the HTTP API (pydantic), shared by the app and its docs."""

from __future__ import annotations

from typing import Annotated, Any, Literal, TypeVar

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictFloat,
    StrictInt,
    StrictStr,
    model_validator,
)

from gnnserve.errors import echo
from gnnserve.types import OutputKind

OutputName = Literal["label", "probs", "embedding"]

T = TypeVar("T")
# A list that stops at its first invalid item: a body of millions of bad values yields one error,
# not millions (pydantic would spend seconds and GBs building them). The schema is unchanged.
FailFast = Annotated[list[T], Field(fail_fast=True)]


class NewNodesBody(BaseModel):
    """Nodes the graph does not hold, sent with a request (new node i = row i of features)."""

    model_config = ConfigDict(extra="forbid")

    features: FailFast[FailFast[StrictFloat]] = Field(
        ..., description="[m, F] finite feature rows, F = the store's feature width"
    )
    edges: FailFast[FailFast[StrictInt]] = Field(
        default_factory=list,
        description="[E, 2] pairs (new node index, existing node id); undirected",
    )
    new_edges: FailFast[FailFast[StrictInt]] | None = Field(
        None, description="[E2, 2] pairs (new node index, new node index); undirected"
    )


class PredictRequest(BaseModel):
    """POST /v1/predict body: exactly one of ``nodes`` and ``new_nodes``."""

    model_config = ConfigDict(extra="forbid")

    nodes: FailFast[StrictInt] | None = Field(None, description="existing node ids to predict for")
    new_nodes: NewNodesBody | None = Field(
        None, description="new nodes to predict for (needs precomputed embeddings)"
    )
    output: StrictStr = Field("label", description="label | probs | embedding")
    model: StrictStr | None = Field(None, description="model name; defaults to the served one")
    fanouts: FailFast[StrictInt] | None = Field(
        None,
        description="neighbours sampled per hop (nearest first, -1 = all); default: server's. "
        "With new_nodes: the fanouts of mode ns",
    )
    mode: StrictStr | None = Field(
        None, description="new_nodes only: srpe | full | ns | pe; default: server's"
    )
    gamma: StrictFloat | None = Field(
        None, description="new_nodes only, mode srpe: share of candidates recomputed, in [0, 1]"
    )
    policy: StrictStr | None = Field(
        None,
        description="new_nodes only, mode srpe: query_edges_ratio | importance | random | oracle",
    )
    min_version: StrictInt | StrictStr | None = Field(
        None,
        description="answer from a graph holding this write: the seq or graph_version a POST "
        "/v1/graph/updates returned (read-your-writes across --workers); 400 when no write "
        "returned it",
    )
    seed: StrictInt | None = Field(
        None,
        description="the draws, a 64-bit integer in [-2^63, 2^64) (a negative seed draws as "
        "its two's complement). nodes: the sampler's draws, so the same seed gives the same "
        "answer on every deploy mode that samples (unset: fresh draws each request); "
        "new_nodes: mode ns and the random policy (default 0)",
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
    """POST /v1/predict answer; the fields from ``new_nodes`` on come with new-node requests."""

    model: str
    model_version: str
    graph_version: str
    output: OutputName
    nodes: list[int] = Field(..., description="node ids; for new nodes their indices 0..m-1")
    predictions: list[int] | list[list[float]]
    timings: Timings = Field(
        ..., description="for new nodes: sample_ms = plan, batch_size = number of new nodes"
    )
    new_nodes: int | None = Field(None, description="m, the number of new nodes")
    mode: str | None = Field(None, description="mode used")
    gamma: float | None = Field(None, description="gamma used (srpe; 0 for pe; null otherwise)")
    policy: str | None = Field(None, description="policy used (srpe; null otherwise)")
    num_candidates: int | None = Field(
        None, description="existing nodes with an edge from a new node"
    )
    recomputed: int | None = Field(
        None, description="existing nodes whose precomputed embeddings were recomputed"
    )
    pe_version: str | None = Field(
        None,
        description="graph version the precomputed embeddings are of, when they follow the "
        "graph (--update-log with a refresher); null for fixed ones",
    )
    pe_lag: int | None = Field(
        None, description="batches the embeddings were behind graph_version (<= --pe-staleness)"
    )


class ErrorDetail(BaseModel):
    """What went wrong and which field caused it."""

    kind: str
    message: str
    field: str | None = None


class ErrorResponse(BaseModel):
    """Body of every 4xx/5xx answer."""

    error: ErrorDetail


class InferTensor(BaseModel):
    """An Open Inference Protocol v2 input tensor (data flattened row-major).

    Integer datatypes (INT64, ...) take integers only; FP32 takes numbers. ``data`` is absent
    when the tensor's bytes follow the JSON header (``parameters.binary_data_size``).
    """

    name: StrictStr
    shape: FailFast[StrictInt]
    datatype: StrictStr
    data: FailFast[StrictInt | StrictFloat] | None = None
    parameters: dict[str, object] | None = None

    @model_validator(mode="after")
    def _data_matches_datatype(self) -> InferTensor:
        if self.data is not None and self.datatype.upper().lstrip("U").startswith("INT"):
            for i, value in enumerate(self.data):
                if not isinstance(value, int):
                    raise ValueError(
                        f"{echo(self.name)} is {echo(self.datatype)}: data[{i}] = {echo(value)} "
                        "is not an integer"
                    )
        return self


class RequestedOutput(BaseModel):
    """An OIP v2 requested output (label | probs | embedding)."""

    name: StrictStr
    parameters: dict[str, object] | None = None


class InferRequest(BaseModel):
    """OIP v2 POST /v2/models/{name}/infer body."""

    id: StrictStr | None = None
    inputs: FailFast[InferTensor] = Field(..., min_length=1)
    # one entry per output kind at most: bounded before a long list is validated item by item
    outputs: list[RequestedOutput] | None = Field(None, max_length=len(OutputKind))
    parameters: dict[str, object] | None = None


class OutputTensor(BaseModel):
    """An OIP v2 output tensor (data flattened row-major)."""

    name: str
    shape: list[int]
    datatype: str
    data: list[int] | list[float]


class InferResponse(BaseModel):
    """OIP v2 inference answer; ``parameters`` (new-node requests) hold mode, gamma, policy,
    new_nodes, num_candidates, recomputed and graph_version."""

    model_name: str
    model_version: str
    id: str | None = None
    parameters: dict[str, Any] | None = None
    outputs: list[OutputTensor]


class UpdatesRequest(BaseModel):
    """POST /v1/graph/updates body: operations applied in order, all or nothing."""

    model_config = ConfigDict(extra="forbid")

    ops: FailFast[dict[str, Any]] = Field(
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
