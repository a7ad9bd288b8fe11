"""The Open Inference Protocol over HTTP as Triton's own client speaks it (tritonclient.http,
unchanged) against a real server: every call it has, binary and JSON tensors, compressed
bodies, and errors raised as the client's exception carrying the server's message."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.http as triton
from tritonclient.utils import InferenceServerException

from tests.server.errors import error_of

MODEL = "sage"


@pytest.fixture
def client(live_server: str) -> triton.InferenceServerClient:
    return triton.InferenceServerClient(url=live_server.removeprefix("http://"))


def _ids(nodes: list[int], binary: bool = True) -> triton.InferInput:
    tensor = triton.InferInput("node_ids", [len(nodes)], "INT64")
    tensor.set_data_from_numpy(np.array(nodes, dtype=np.int64), binary_data=binary)
    return tensor


def _v1(live_server: str, nodes: list[int], output: str) -> np.ndarray:
    r = httpx.post(f"{live_server}/v1/predict", json={"nodes": nodes, "output": output})
    assert r.status_code == 200, r.text
    return np.array(r.json()["predictions"])


def test_health_metadata_config_and_statistics(client: triton.InferenceServerClient) -> None:
    assert client.is_server_live() and client.is_server_ready() and client.is_model_ready(MODEL)
    server = client.get_server_metadata()
    assert server["name"] == "gnnserve" and "binary_tensor_data" in server["extensions"]
    meta = client.get_model_metadata(MODEL)
    version = meta["versions"][0]
    assert client.get_model_metadata(MODEL, model_version=version)["name"] == MODEL
    assert client.is_model_ready(MODEL, model_version=version)
    config = client.get_model_config(MODEL)
    assert config["input"][0] == {"name": "node_ids", "data_type": "TYPE_INT64", "dims": [-1]}
    assert [o["name"] for o in config["output"]] == ["label", "probs", "embedding"]
    before = client.get_inference_statistics(MODEL)["model_stats"][0]["inference_stats"]
    client.infer(MODEL, [_ids([1, 2, 3])])
    with pytest.raises(InferenceServerException):
        client.infer(MODEL, [_ids([10**9])])
    after = client.get_inference_statistics(MODEL)["model_stats"][0]["inference_stats"]
    assert after["success"]["count"] == before["success"]["count"] + 1
    assert after["fail"]["count"] == before["fail"]["count"] + 1
    assert after["success"]["ns"] > before["success"]["ns"]


@pytest.mark.parametrize("binary_in", [True, False])
@pytest.mark.parametrize("binary_out", [True, False])
def test_every_output_kind_equals_v1_predict(
    client: triton.InferenceServerClient, live_server: str, binary_in: bool, binary_out: bool
) -> None:
    nodes = [5, 0, 17, 5]
    outputs = [triton.InferRequestedOutput(k, binary_data=binary_out) for k in OUTPUTS]
    result = client.infer(MODEL, [_ids(nodes, binary_in)], outputs=outputs, request_id="r7")
    assert result.get_response()["id"] == "r7"
    for kind in OUTPUTS:
        got = result.as_numpy(kind)
        want = _v1(live_server, nodes, kind)
        assert got.dtype == (np.int64 if kind == "label" else np.float32)
        np.testing.assert_array_equal(got, want.astype(got.dtype))
        sent_binary = "binary_data_size" in result.get_output(kind).get("parameters", {})
        assert sent_binary == binary_out


OUTPUTS = ("label", "probs", "embedding")


def test_no_outputs_named_answers_the_label_as_binary(
    client: triton.InferenceServerClient, live_server: str
) -> None:
    """tritonclient asks every output as binary (``binary_data_output``) when none is named."""
    result = client.infer(MODEL, [_ids([3, 4])])
    assert result.get_output("label")["parameters"]["binary_data_size"] == 16
    np.testing.assert_array_equal(result.as_numpy("label"), _v1(live_server, [3, 4], "label"))


@pytest.mark.parametrize("algorithm", ["gzip", "deflate"])
def test_compressed_requests(
    client: triton.InferenceServerClient, live_server: str, algorithm: str
) -> None:
    result = client.infer(MODEL, [_ids([8, 9])], request_compression_algorithm=algorithm)
    np.testing.assert_array_equal(result.as_numpy("label"), _v1(live_server, [8, 9], "label"))


def test_errors_are_the_clients_exception_with_our_message(
    client: triton.InferenceServerClient,
) -> None:
    cases = [
        (lambda: client.infer("other", [_ids([1])]), "404", "unknown model 'other'"),
        (lambda: client.infer(MODEL, [_ids([10**9])]), "400", "node_ids"),
        (lambda: client.get_model_metadata(MODEL, model_version="9"), "404", "no version '9'"),
        (lambda: client.get_trace_settings(), "404", "model_repository"),
        (lambda: client.get_system_shared_memory_status(), "404", "not an endpoint"),
        (
            lambda: client.infer(MODEL, [_ids([1])], outputs=[triton.InferRequestedOutput("x")]),
            "400",
            "unknown output 'x'",
        ),
        (
            lambda: client.infer(
                MODEL, [_ids([1])], outputs=[triton.InferRequestedOutput("probs", class_count=2)]
            ),
            "400",
            "classification",
        ),
    ]
    for call, status, message in cases:
        with pytest.raises(InferenceServerException) as info:
            call()
        assert info.value.status() == status and message in info.value.message(), info.value


_ID = {"name": "node_ids", "shape": [2], "datatype": "INT64"}


def _post(live_server: str, body: bytes, headers: dict[str, str]) -> httpx.Response:
    return httpx.post(f"{live_server}/v2/models/{MODEL}/infer", content=body, headers=headers)


def test_malformed_binary_bodies_are_400_naming_what_is_wrong(live_server: str) -> None:
    ids = np.array([1, 2], dtype=np.int64).tobytes()

    def body(size: int, tail: bytes) -> tuple[bytes, dict[str, str]]:
        head = {"inputs": [{**_ID, "parameters": {"binary_data_size": size}}]}
        text = json.dumps(head).encode()
        return text + tail, {"Inference-Header-Content-Length": str(len(text))}

    cases = [
        (body(16, ids), None, 200),
        (body(16, ids + b"x"), "bytes follow", 400),  # a stray byte after the inputs
        (body(24, ids), "only 16 follow", 400),
        (body(8, ids[:8]), "needs 16", 400),  # size and shape disagree
        ((b"{}", {"Inference-Header-Content-Length": "99"}), "within the body", 400),
        ((b"{}", {"Inference-Header-Content-Length": "-1"}), "within the body", 400),
        ((json.dumps({"inputs": [{**_ID, "parameters": {}}]}).encode(), {}), "neither data", 400),
        ((gzip.compress(b"{}")[:-4], {"Content-Encoding": "gzip"}), "truncated", 400),
        ((b"{}", {"Content-Encoding": "br"}), "not supported", 400),
    ]
    for (raw, headers), message, status in cases:
        r = _post(live_server, raw, headers)
        assert r.status_code == status, (message, r.text)
        if message is not None:
            assert message in error_of(r)["message"], r.text
            assert isinstance(r.json()["error"], str)


def test_a_gzip_bomb_is_413_before_it_is_inflated(live_server: str) -> None:
    bomb = gzip.compress(b" " * (64 << 20))  # 64 MiB of blanks in ~64 KB
    r = _post(live_server, bomb, {"Content-Encoding": "gzip"})
    assert r.status_code == 413, r.text
    assert "inflates past the limit" in r.json()["error"]
    assert _post(live_server, b'{"inputs": []}', {}).status_code == 400  # still serving


def test_the_tritonclient_example_of_the_api_page_runs(
    live_server: str, live_grpc: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """docs/api.md's example, pointed at the shared server (model 'sage'), prints the labels
    /v1/predict answers, over HTTP and gRPC."""
    text = (Path(__file__).parents[2] / "docs" / "api.md").read_text()
    code = text.split("<!-- tritonclient-example -->\n```python\n", 1)[1].split("```", 1)[0]
    code = code.replace('"localhost:8000"', repr(live_server.removeprefix("http://")))
    code = code.replace('"localhost:8001"', repr(live_grpc)).replace('"default"', repr(MODEL))
    exec(compile(code, "docs/api.md", "exec"), {})
    lines = capsys.readouterr().out.splitlines()
    labels = " ".join(str(v) for v in _v1(live_server, [1, 2, 3], "label").tolist())
    assert len(lines) == 2 and all(f"[{labels}] (3, 4)" in line for line in lines), lines
