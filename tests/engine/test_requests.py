"""engine.requests.validate_request: the one validation entry. Every field's error names that
field, one Request type carries both kinds of request (options normalised, the server's new-node
defaults filled in), a Request built by hand is validated by Engine.submit, and admitted ids are
not checked again down the pipeline."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from gnnserve.config import EmbeddingsConfig, ServeConfig
from gnnserve.data import validate
from gnnserve.engine.loader import build_engine
from gnnserve.engine.requests import MAX_TIMEOUT_MS, RequestLimits, validate_request
from gnnserve.errors import InvalidInputError, TooManyNodesError
from gnnserve.features import base as features_base
from gnnserve.graph import base as graph_base
from gnnserve.graph import open_graph_store
from gnnserve.sampling import presample
from gnnserve.types import NewNodes, OutputKind, Request, RequestOptions, Result

N, F = 2000, 16  # the small store: nodes, feature width (2-layer model)
DEFAULTS = EmbeddingsConfig(mode="pe", gamma=0.3, policy="random", max_new_nodes=4)
ROWS = [[0.5] * F, [-1.0] * F]
NEW = {"features": ROWS, "edges": [[0, 5], [1, 17]], "new_edges": [[0, 1]]}


@pytest.fixture(scope="module")
def limits(small_store: Path) -> RequestLimits:
    return RequestLimits(open_graph_store(small_store), F, 2, 100, DEFAULTS)


# (raw fields, error type, the field it must name): existing-node requests
EXISTING_BAD = [
    ({"nodes": [1], "new_nodes": NEW}, InvalidInputError, "new_nodes"),
    ({}, InvalidInputError, "nodes"),
    ({"nodes": []}, InvalidInputError, "nodes"),
    ({"nodes": [N]}, InvalidInputError, "nodes"),
    ({"nodes": [-1]}, InvalidInputError, "nodes"),
    ({"nodes": [1.0]}, InvalidInputError, "nodes"),
    ({"nodes": [True]}, InvalidInputError, "nodes"),
    ({"nodes": [2**64]}, InvalidInputError, "nodes"),
    ({"nodes": "1,2"}, InvalidInputError, "nodes"),
    ({"nodes": np.array([[1, 2]])}, InvalidInputError, "nodes"),
    ({"nodes": list(range(101))}, TooManyNodesError, "nodes"),
    ({"nodes": [1], "output": "logits"}, InvalidInputError, "output"),
    ({"nodes": [1], "output": None}, InvalidInputError, "output"),
    ({"nodes": [1], "fanouts": [5]}, InvalidInputError, "fanouts"),
    ({"nodes": [1], "fanouts": [5, 0]}, InvalidInputError, "fanouts"),
    ({"nodes": [1], "fanouts": "5,5"}, InvalidInputError, "fanouts"),
    ({"nodes": [1], "mode": "srpe"}, InvalidInputError, "mode"),
    ({"nodes": [1], "gamma": 0.5}, InvalidInputError, "gamma"),
    ({"nodes": [1], "policy": "random"}, InvalidInputError, "policy"),
    ({"nodes": [1], "seed": 1.5}, InvalidInputError, "seed"),
    ({"nodes": [1], "seed": 2**64}, InvalidInputError, "seed"),
    ({"nodes": [1], "timeout_ms": 0}, InvalidInputError, "timeout_ms"),
    ({"nodes": [1], "timeout_ms": float("nan")}, InvalidInputError, "timeout_ms"),
    ({"nodes": [1], "timeout_ms": MAX_TIMEOUT_MS * 2}, InvalidInputError, "timeout_ms"),
    ({"nodes": [1], "timeout_ms": "soon"}, InvalidInputError, "timeout_ms"),
]
# new-node requests: each changes one field of a valid request
NEW_BAD = [
    (
        {"new_nodes": {**NEW, "features": [[0.0] * (F - 1)]}},
        InvalidInputError,
        "new_nodes.features",
    ),
    ({"new_nodes": {**NEW, "features": [[0.0] * F] * 5}}, TooManyNodesError, "new_nodes.features"),
    ({"new_nodes": {**NEW, "edges": [[0, N]]}}, InvalidInputError, "new_nodes.edges"),
    ({"new_nodes": {**NEW, "new_edges": [[1, 1]]}}, InvalidInputError, "new_nodes.new_edges"),
    ({"new_nodes": {**NEW, "extra": 1}}, InvalidInputError, "new_nodes"),
    ({"new_nodes": [ROWS]}, InvalidInputError, "new_nodes"),
    ({"output": "logits"}, InvalidInputError, "output"),
    ({"mode": "exact"}, InvalidInputError, "mode"),
    ({"gamma": 1.5}, InvalidInputError, "gamma"),
    ({"gamma": "0.5"}, InvalidInputError, "gamma"),
    ({"policy": "best"}, InvalidInputError, "policy"),
    ({"fanouts": [5]}, InvalidInputError, "fanouts"),
    ({"fanouts": [5, 2_000_000]}, InvalidInputError, "fanouts"),
    ({"seed": 1.5}, InvalidInputError, "seed"),
    ({"timeout_ms": -5}, InvalidInputError, "timeout_ms"),
]


@pytest.mark.parametrize(("fields", "error", "field"), EXISTING_BAD)
def test_each_existing_node_field_error_names_the_field(limits, fields, error, field) -> None:
    with pytest.raises(error) as info:
        validate_request(**fields, limits=limits)
    assert type(info.value) is error and info.value.field == field and info.value.message


@pytest.mark.parametrize(("change", "error", "field"), NEW_BAD)
def test_each_new_node_field_error_names_the_field(limits, change, error, field) -> None:
    with pytest.raises(error) as info:
        validate_request(**{"new_nodes": NEW, **change}, limits=limits)
    assert type(info.value) is error and info.value.field == field and info.value.message
    assert validate_request(new_nodes=NEW, limits=limits).size == 2  # the unchanged request


def test_existing_node_request_is_normalised(limits) -> None:
    request = validate_request([3, 1, 3], output="probs", fanouts=[4, -1], limits=limits)
    assert isinstance(request, Request) and request.new is None and request.checked_by is limits
    assert request.nodes is not None and request.nodes.dtype == np.int64
    assert request.nodes.tolist() == [3, 1, 3] and request.size == 3
    assert request.options == RequestOptions(OutputKind.PROBS, (4, -1))
    plain = validate_request(np.array([7], np.int32), limits=limits)
    assert plain.options == RequestOptions()  # label, the server's fanouts, no deadline
    assert plain.nodes is not None and plain.nodes.dtype == np.int64


def test_new_node_request_gets_the_server_defaults(limits) -> None:
    request = validate_request(new_nodes=NEW, limits=limits)
    assert isinstance(request, Request) and request.nodes is None and request.size == 2
    assert request.options == RequestOptions(
        OutputKind.LABEL,
        (25, 10),
        "pe",
        0.3,
        "random",
        0,
        None,  # DEFAULTS; ns: (25, 10)
    )
    new = request.new
    assert isinstance(new, NewNodes) and new.features.dtype == torch.float32
    assert torch.equal(new.features, torch.tensor(ROWS, dtype=torch.float32))
    assert new.edges.tolist() == [[0, 5], [1, 17]] and new.new_edges.tolist() == [[0, 1]]
    given = validate_request(
        new_nodes=new,  # a NewNodes is accepted too
        output="embedding",
        mode="ns",
        gamma=0,
        policy="importance",
        fanouts=[3, 2],
        seed=np.int64(9),
        timeout_ms=250,
        limits=limits,
    )
    want = RequestOptions(OutputKind.EMBEDDING, (3, 2), "ns", 0.0, "importance", 9, 250.0)
    assert given.options == want and type(given.options.seed) is int


@pytest.fixture(scope="module")
def engine(pe_store: Path, small_ckpt: Path):  # type: ignore[no-untyped-def]
    config = ServeConfig.load(
        None,
        **{"store.path": str(pe_store), "model_path": str(small_ckpt), "sampler.fanouts": [-1, -1]},
    )
    with build_engine(config) as engine:
        yield engine


def test_one_request_type_and_one_result_type_for_both_paths(engine, reference) -> None:
    logits = reference[0]
    existing = engine.request([4, 9], output="probs")
    new = engine.request(new_nodes=NEW, output="probs", mode="full")
    assert type(existing) is type(new) is Request
    old_result, new_result = (engine.submit(r).result(60) for r in (existing, new))
    assert type(old_result) is type(new_result) is Result
    assert old_result.new_nodes is None  # new-node details only for new nodes
    torch.testing.assert_close(old_result.values, torch.softmax(logits[[4, 9]], 1))
    info = new_result.new_nodes
    assert info is not None and info.mode == "full" and new_result.nodes.tolist() == [0, 1]
    direct = engine.new_nodes.inference().run(new.new, "full")  # the library entry point
    assert torch.equal(new_result.values, torch.softmax(direct.logits, 1))
    assert torch.equal(info.logits, direct.logits) and torch.equal(info.embedding, direct.embedding)
    assert (info.gamma, info.policy, info.recomputed.size) == (None, None, 0)
    assert info.num_candidates == 2  # existing nodes 5 and 17


def test_a_request_built_by_hand_is_validated_at_submit(engine, reference) -> None:
    with pytest.raises(InvalidInputError) as info:
        engine.submit(Request(nodes=np.array([N + 5])))  # out of range: never sampled
    assert info.value.field == "nodes"
    bad = NewNodes(torch.zeros(1, F + 1), np.array([[0, 1]]), np.empty((0, 2), np.int64))
    with pytest.raises(InvalidInputError) as info:
        engine.submit(Request(new=bad))
    assert info.value.field == "new_nodes.features"
    with pytest.raises(InvalidInputError) as info:
        engine.submit(Request(nodes=np.array([1]), options=RequestOptions(mode="srpe")))
    assert info.value.field == "mode"
    by_hand = Request(nodes=np.array([4, 9]), options=RequestOptions(OutputKind.PROBS))
    got = engine.submit(by_hand).result(60)
    torch.testing.assert_close(got.values, torch.softmax(reference[0][[4, 9]], 1))


def test_admitted_ids_are_checked_once(engine, monkeypatch) -> None:
    """Validated at admission, a request's ids are not checked again by the sampler or the
    feature store on its way through the pipeline."""
    checked: list[str] = []
    real = validate.check_node_ids

    def counting(ids: object, num_nodes: int, field: str) -> np.ndarray:
        checked.append(field)
        return real(ids, num_nodes, field)

    for module in (graph_base, features_base, presample):
        monkeypatch.setattr(module, "check_node_ids", counting)
    assert engine.predict([4, 9, 4]).values.shape == (3,)
    assert checked == ["nodes"]
