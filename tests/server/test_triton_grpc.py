"""The Open Inference Protocol over gRPC as Triton's own client speaks it (tritonclient.grpc,
unchanged) against the shared real server: health, metadata, infer with every output kind equal
to HTTP's answers, errors as the client's exception with our message and the protocol's code,
and what the server does not offer refused as UNIMPLEMENTED."""

from __future__ import annotations

import httpx
import numpy as np
import pytest
import tritonclient.grpc as triton
from tritonclient.utils import InferenceServerException

MODEL = "sage"
OUTPUTS = ("label", "probs", "embedding")


@pytest.fixture
def client(live_grpc: str) -> triton.InferenceServerClient:
    return triton.InferenceServerClient(url=live_grpc)


def _ids(nodes: list[int]) -> triton.InferInput:
    tensor = triton.InferInput("node_ids", [len(nodes)], "INT64")
    tensor.set_data_from_numpy(np.array(nodes, dtype=np.int64))
    return tensor


def _v1(live_server: str, nodes: list[int], output: str, **extra: object) -> np.ndarray:
    body = {"nodes": nodes, "output": output, **extra}
    r = httpx.post(f"{live_server}/v1/predict", json=body, timeout=60)
    assert r.status_code == 200, r.text
    return np.array(r.json()["predictions"])


def test_health_and_metadata(client: triton.InferenceServerClient) -> None:
    assert client.is_server_live() and client.is_server_ready() and client.is_model_ready(MODEL)
    server = client.get_server_metadata()
    assert server.name == "gnnserve" and "binary_tensor_data" in server.extensions
    meta = client.get_model_metadata(MODEL)
    assert meta.name == MODEL and meta.inputs[0].name == "node_ids"
    assert [o.name for o in meta.outputs] == list(OUTPUTS)
    assert list(meta.outputs[1].shape) == [-1, 4]
    assert client.is_model_ready(MODEL, model_version=meta.versions[0])


def test_every_output_kind_equals_the_http_answer(
    client: triton.InferenceServerClient, live_server: str
) -> None:
    nodes = [5, 0, 17, 5]
    outputs = [triton.InferRequestedOutput(k) for k in OUTPUTS]
    result = client.infer(MODEL, [_ids(nodes)], outputs=outputs, request_id="g1")
    assert result.get_response().id == "g1"
    for kind in OUTPUTS:
        got = result.as_numpy(kind)
        assert got.dtype == (np.int64 if kind == "label" else np.float32)
        np.testing.assert_array_equal(got, _v1(live_server, nodes, kind).astype(got.dtype))
    default = client.infer(MODEL, [_ids([3])])  # no outputs named: the label
    np.testing.assert_array_equal(default.as_numpy("label"), _v1(live_server, [3], "label"))


def test_parameters_and_json_typed_contents(live_grpc: str, live_server: str) -> None:
    """A request's fanouts and seed as gRPC parameters (fanouts as "a,b"), answered as HTTP
    answers the same request; typed contents (int64_contents) as raw ones."""
    client = triton.InferenceServerClient(url=live_grpc)
    params = {"fanouts": "2,2", "seed": 11}
    result = client.infer(MODEL, [_ids([1, 2, 3])], parameters=params)
    want = _v1(live_server, [1, 2, 3], "label", fanouts=[2, 2], seed=11)
    np.testing.assert_array_equal(result.as_numpy("label"), want)
    from tritonclient.grpc import service_pb2

    request = service_pb2.ModelInferRequest(model_name=MODEL)
    tensor = request.inputs.add(name="node_ids", datatype="INT64", shape=[2])
    tensor.contents.int64_contents.extend([4, 9])
    response = client._client_stub.ModelInfer(request)
    got = np.frombuffer(response.raw_output_contents[0], dtype="<i8")
    np.testing.assert_array_equal(got, _v1(live_server, [4, 9], "label"))


def test_errors_carry_the_protocols_code_and_our_message(
    client: triton.InferenceServerClient,
) -> None:
    cases = [
        (lambda: client.infer("other", [_ids([1])]), "NOT_FOUND", "unknown model 'other'"),
        (lambda: client.infer(MODEL, [_ids([10**9])]), "INVALID_ARGUMENT", "node_ids holds"),
        (
            lambda: client.infer(MODEL, [_ids([1])], parameters={"fanouts": "2,x"}),
            "INVALID_ARGUMENT",
            "comma-separated",
        ),
        (
            lambda: client.infer(MODEL, [_ids([1])], parameters={"gamma": 0.5}),
            "INVALID_ARGUMENT",
            "unknown parameters 'gamma'",
        ),
        (lambda: client.get_model_metadata(MODEL, "9"), "NOT_FOUND", "no version '9'"),
        (lambda: client.get_model_config(MODEL), "UNIMPLEMENTED", ""),
        (lambda: client.get_inference_statistics(MODEL), "UNIMPLEMENTED", ""),
    ]
    for call, code, message in cases:
        with pytest.raises(InferenceServerException) as info:
            call()
        assert info.value.status() == f"StatusCode.{code}", info.value
        assert message in info.value.message(), info.value


def test_a_message_over_the_body_limit_is_refused(
    client: triton.InferenceServerClient, live_server: str
) -> None:
    limit = httpx.get(f"{live_server}/v2/models/{MODEL}/config").status_code  # still serving
    assert limit == 200
    big = triton.InferInput("node_ids", [3_000_000], "INT64")  # 24 MB over a ~17 MB limit
    big.set_data_from_numpy(np.zeros(3_000_000, dtype=np.int64))
    with pytest.raises(InferenceServerException) as info:
        client.infer(MODEL, [big])
    assert info.value.status() == "StatusCode.RESOURCE_EXHAUSTED", info.value
    assert client.infer(MODEL, [_ids([1])]).as_numpy("label").shape == (1,)
