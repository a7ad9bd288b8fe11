"""API keys (read / write scopes), the non-loopback refusal, and path-free error bodies.

The server runs as a real ``gnnserve serve`` process with ``--api-keys FILE`` and an update log.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from gnnserve import cli
from gnnserve.demo import start_server, stop_server, wait_ready
from gnnserve.ports import free_port
from gnnserve.server.auth import ENV_VAR, is_loopback, load_api_keys, parse_api_keys
from tests.server.errors import error_of

READ = "read-token-0123456789abcdef"
WRITE = "write-token-0123456789abcdef"
BOTH = "both-token-0123456789abcdef"
ADMIN = "admin-token-0123456789abcdef"
KEYS = f"# scopes token\nread {READ}\n\nwrite {WRITE}\nread,write {BOTH}\nadmin {ADMIN}\n"
UPDATE = {"ops": [{"op": "add_edge", "src": 3, "dst": 4}]}
PREDICT = {"nodes": [1]}


def _auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@pytest.fixture(scope="module")
def secured(
    small_store: Path, small_ckpt: Path, tmp_path_factory
) -> Iterator[tuple[str, Path, str]]:
    """A server with API keys, an update log and gRPC: (base URL, store path, gRPC target)."""
    work = tmp_path_factory.mktemp("auth")
    keys = work / "keys.txt"
    keys.write_text(KEYS)
    keys.chmod(0o600)
    port, grpc_port = free_port(), free_port()
    proc = start_server(
        small_store,
        small_ckpt,
        port,
        "--api-keys",
        str(keys),
        "--update-log",
        str(work / "updates.log"),
        "--name",
        "sage",
        "--grpc-port",
        str(grpc_port),
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(url, proc)
        yield url, small_store, f"127.0.0.1:{grpc_port}"
    finally:
        stop_server(proc)


READ_ENDPOINTS = [
    ("POST", "/v1/predict", PREDICT),
    ("GET", "/v1/graph/neighbors/1", None),
    ("GET", "/v2/models/sage", None),
    ("GET", "/v2/models/sage/ready", None),
    ("GET", "/v2", None),
    ("GET", "/metrics", None),
    (
        "POST",
        "/v2/models/sage/infer",
        {"inputs": [{"name": "node_ids", "shape": [1], "datatype": "INT64", "data": [1]}]},
    ),
    ("GET", "/no/such/path", None),
]


def _call(url: str, method: str, path: str, body: object, token: str | None) -> httpx.Response:
    headers = {} if token is None else _auth(token)
    return httpx.request(method, f"{url}{path}", json=body, headers=headers, timeout=30)


@pytest.mark.parametrize(
    ("method", "path", "body"), [*READ_ENDPOINTS, ("POST", "/v1/graph/updates", UPDATE)]
)
def test_no_token_or_unknown_token_is_401_json(secured, method, path, body) -> None:
    url, _, _ = secured
    for token, error in ((None, None), ("not-a-known-token-at-all", "invalid_token")):
        r = _call(url, method, path, body, token)
        assert r.status_code == 401, r.text
        assert r.headers["content-type"] == "application/json"
        assert error_of(r)["kind"] == "unauthorized"
        challenge = r.headers["www-authenticate"]
        assert challenge.startswith("Bearer") and (error is None or error in challenge)
        assert "token-0123" not in r.text


@pytest.mark.parametrize(("method", "path", "body"), READ_ENDPOINTS[:-1])
def test_read_token_reaches_the_read_endpoints(secured, method, path, body) -> None:
    url, _, _ = secured
    for token in (READ, BOTH):
        r = _call(url, method, path, body, token)
        assert r.status_code == 200, (path, r.text)
    r = _call(url, method, path, body, WRITE)  # write does not imply read
    assert r.status_code == 403 and error_of(r)["kind"] == "forbidden", r.text
    assert 'error="insufficient_scope"' in r.headers["www-authenticate"]


def test_updates_need_the_write_scope(secured) -> None:
    url, _, _ = secured
    r = httpx.post(f"{url}/v1/graph/updates", json=UPDATE, headers=_auth(READ), timeout=30)
    assert r.status_code == 403, r.text
    assert error_of(r)["kind"] == "forbidden" and "write" in error_of(r)["message"]
    before = httpx.get(f"{url}/v1/graph/neighbors/4", headers=_auth(READ), timeout=30).json()
    assert 3 not in before["in_neighbors"]  # the refused update was not applied
    for token, src in ((WRITE, 3), (BOTH, 5)):
        op = {"ops": [{"op": "add_edge", "src": src, "dst": 4}]}
        r = httpx.post(f"{url}/v1/graph/updates", json=op, headers=_auth(token), timeout=30)
        assert r.status_code == 200, r.text
    after = httpx.get(f"{url}/v1/graph/neighbors/4", headers=_auth(READ), timeout=30).json()
    assert {3, 5} <= set(after["in_neighbors"])


def test_probes_and_api_description_stay_open(secured) -> None:
    url, _, _ = secured
    assert httpx.get(f"{url}/v2/health/live", timeout=30).json() == {"live": True}
    assert httpx.get(f"{url}/v2/health/ready", timeout=30).status_code == 200
    assert "/v1/predict" in httpx.get(f"{url}/openapi.json", timeout=30).json()["paths"]


def test_no_response_body_holds_a_server_path(secured) -> None:
    """Errors reachable over HTTP, answered to an authorised client, name no server path."""
    url, store, _ = secured
    new_nodes = {"features": [[0.0] * 16], "edges": [[0, 1]]}
    requests = [
        ("POST", "/v1/predict", {"new_nodes": new_nodes}),  # 409 no_embeddings
        ("POST", "/v1/predict", {"nodes": [10**9]}),
        ("POST", "/v1/predict", {"nodes": [1], "model": "x"}),
        ("POST", "/v1/graph/updates", {"ops": [{"op": "delete_edge", "src": 1, "dst": 1}]}),
        ("POST", "/v1/graph/updates", {"ops": [{"op": "add_node", "features": [1e39] * 16}]}),
        ("GET", "/v1/graph/neighbors/99999999", None),
        ("GET", "/v2/models/sage", None),
        ("GET", "/metrics", None),
    ]
    tmp_root = str(store.parent.parent)
    for method, path, body in requests:
        r = _call(url, method, path, body, BOTH)
        assert str(store) not in r.text and tmp_root not in r.text, (path, r.text[:500])
        assert os.path.expanduser("~") not in r.text or os.path.expanduser("~") == "/"
    r = _call(url, "POST", "/v1/predict", {"new_nodes": new_nodes}, BOTH)
    assert r.status_code == 409 and error_of(r)["kind"] == "no_embeddings", r.text
    assert "gnnserve precompute" in error_of(r)["message"]


# key files and the start-up checks ------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("", "no keys"),
        ("# only a comment\n", "no keys"),
        (f"owner {READ}", "scopes"),
        (f"read,root {READ}", "scopes"),
        (f"read {READ} extra", "expected"),
        (READ, "expected"),
        ("read short", "16+"),
        ("read " + "a" * 15 + "\u00e9", "16+"),
        (f"read {READ}\nwrite {READ}", "twice"),
    ],
)
def test_bad_key_files_are_refused_without_echoing_tokens(text, problem, tmp_path) -> None:
    path = tmp_path / "keys"
    path.write_text(text)
    with pytest.raises(Exception) as info:
        load_api_keys(str(path), environ={})
    assert problem in str(info.value) and READ not in str(info.value)


def test_keys_from_the_environment_and_their_scopes() -> None:
    keys = load_api_keys("", environ={ENV_VAR: f"read {READ}; read,write {BOTH}"})
    assert keys is not None
    assert keys.scopes_of(READ) == {"read"} and keys.scopes_of(BOTH) == {"read", "write"}
    assert keys.scopes_of(WRITE) is None and keys.scopes_of("") is None
    assert load_api_keys("", environ={}) is None
    assert parse_api_keys(f"write {WRITE}", "x").scopes_of(WRITE) == {"write"}


def _serve(argv: list[str], capsys, env: dict[str, str] | None = None) -> tuple[int, str]:
    old = os.environ.pop(ENV_VAR, None)
    if env:
        os.environ.update(env)
    try:
        code = cli.main(
            ["serve", "--store", "/nonexistent/store", "--model", "/nonexistent", *argv]
        )
    finally:
        os.environ.pop(ENV_VAR, None)
        if old is not None:
            os.environ[ENV_VAR] = old
    return code, capsys.readouterr().err


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.168.1.10", "gnn.example.org"])
def test_non_loopback_bind_without_keys_is_refused(host, capsys) -> None:
    """Exit 2 before anything is loaded or bound (the store and model paths do not exist)."""
    code, err = _serve(["--host", host], capsys)
    assert code == 2 and "refusing to serve" in err and "--insecure" in err, err


def test_bad_key_file_exits_2_and_env_plus_file_is_refused(tmp_path, capsys) -> None:
    bad = tmp_path / "keys"
    bad.write_text("read tooshort\n")
    code, err = _serve(["--api-keys", str(bad)], capsys)
    assert code == 2 and "entry 1" in err and "tooshort" not in err, err
    code, err = _serve(["--api-keys", str(tmp_path / "missing")], capsys)
    assert code == 2 and "cannot read" in err, err
    good = tmp_path / "good"
    good.write_text(f"read {READ}\n")
    code, err = _serve(["--api-keys", str(good)], capsys, {ENV_VAR: f"read {BOTH}"})
    assert code == 2 and "not both" in err, err


def test_insecure_or_keys_or_loopback_pass_the_bind_check(tmp_path, capsys) -> None:
    """These get past the bind check and fail later, loading the (missing) store."""
    good = tmp_path / "good"
    good.write_text(f"read {READ}\n")
    for argv in (
        ["--host", "0.0.0.0", "--insecure"],
        ["--host", "0.0.0.0", "--api-keys", str(good)],
        ["--host", "127.0.0.1"],
        ["--host", "localhost"],
    ):
        code, err = _serve(argv, capsys)
        assert code == 2 and "refusing" not in err and "store" in err, (argv, err)
    assert is_loopback("::1") and is_loopback("127.0.0.2") and not is_loopback("10.0.0.1")


def test_grpc_needs_a_read_key_and_its_health_stays_open(secured) -> None:
    """The same keys over gRPC (metadata ``authorization``): none or unknown is
    UNAUTHENTICATED, a write-only key PERMISSION_DENIED, a read key answers; health is open."""
    import numpy as np
    import tritonclient.grpc as triton
    from tritonclient.utils import InferenceServerException

    _, _, target = secured
    client = triton.InferenceServerClient(url=target)
    assert client.is_server_live() and client.is_server_ready()
    ids = triton.InferInput("node_ids", [1], "INT64")
    ids.set_data_from_numpy(np.array([1], dtype=np.int64))
    refused = [
        (None, "UNAUTHENTICATED", "needs an API key"),
        ("not-a-known-token-at-all", "UNAUTHENTICATED", "unknown API key"),
        (WRITE, "PERMISSION_DENIED", "'read' scope"),
    ]
    for token, code, message in refused:
        headers = None if token is None else {"authorization": f"Bearer {token}"}
        for call in (
            lambda h=headers: client.infer("sage", [ids], headers=h),
            lambda h=headers: client.get_model_metadata("sage", headers=h),
        ):
            with pytest.raises(InferenceServerException) as info:
                call()
            assert info.value.status() == f"StatusCode.{code}", info.value
            assert message in info.value.message() and "token-0123" not in str(info.value)
    for token in (READ, BOTH):
        result = client.infer("sage", [ids], headers={"authorization": f"Bearer {token}"})
        assert result.as_numpy("label").shape == (1,)


def test_the_model_repository_needs_the_admin_scope(secured) -> None:
    url, _, _ = secured
    for token in (READ, WRITE, BOTH):
        r = _call(url, "GET", "/v2/repository/index", None, token)
        assert r.status_code == 403 and "'admin' scope" in r.json()["error"], r.text
        r = _call(url, "POST", "/v2/repository/models/sage/unload", None, token)
        assert r.status_code == 403, r.text
    r = _call(url, "GET", "/v2/repository/index", None, ADMIN)
    assert r.status_code == 200 and r.json()[0]["name"] == "sage", r.text
    assert _call(url, "POST", "/v1/predict", PREDICT, ADMIN).status_code == 403  # not read
