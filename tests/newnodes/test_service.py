"""NewNodeService built from its collaborators, no Engine: answers equal NewNodeInference run
directly, admission and backlog are the ones given, every read is pinned through ``reads``; and
the newnodes package imports nothing above it (engine, server, deploy, front ends)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from gnnserve.config import AdmissionConfig, EmbeddingsConfig
from gnnserve.embeddings.stores import default_embeddings_dir, open_embeddings
from gnnserve.engine.admission import Admission
from gnnserve.engine.delay import Backlog
from gnnserve.engine.requests import RequestLimits, validate_request
from gnnserve.errors import MissingEmbeddingsError, OverloadedError, ShuttingDownError
from gnnserve.features import open_feature_store
from gnnserve.graph import GraphStore, open_graph_store
from gnnserve.models.checkpoint import load_checkpoint
from gnnserve.models.runner import ModelRunner
from gnnserve.newnodes.inference import NewNodeInference
from gnnserve.newnodes.parse import parse_new_nodes
from gnnserve.newnodes.service import NewNodeService
from gnnserve.types import Request
from tests.conftest import python_output

FEATURES = np.random.default_rng(3).standard_normal((3, 16)).astype(np.float32).tolist()
EDGES = [[0, 5], [0, 17], [1, 5], [2, 1999], [1, 42], [0, 100], [2, 17]]
NEW_EDGES = [[0, 1]]
CONFIG = EmbeddingsConfig(gamma=0.5, policy="importance")  # the service's defaults
ABOVE = ("gnnserve.engine", "gnnserve.server", "gnnserve.deploy", "gnnserve.cli", "gnnserve.demo")


def test_newnodes_imports_nothing_above_it() -> None:
    code = (
        "import importlib, pkgutil, sys\n"
        "import gnnserve.newnodes as p\n"
        "names = [m.name for m in pkgutil.iter_modules(p.__path__, p.__name__ + '.')]\n"
        "assert {'gnnserve.newnodes.service', 'gnnserve.newnodes.inference'} <= set(names)\n"
        "for name in names:\n"
        "    importlib.import_module(name)\n"
        f"bad = sorted(m for m in sys.modules if m.startswith({ABOVE!r}))\n"
        "assert not bad, bad\n"
    )
    python_output(code)


class RecordingReads:
    """The graph's own read lock, counting how often it was taken and given back."""

    def __init__(self, graph: GraphStore) -> None:
        self.graph = graph
        self.acquired = self.released = 0

    def acquire_read(self) -> str:
        self.acquired += 1
        return self.graph.acquire_read() + "@reads"

    def release_read(self) -> None:
        self.released += 1
        self.graph.release_read()


def service(pe_store: Path, ckpt: Path, pes: bool = True, **admission: object):  # type: ignore[no-untyped-def]
    graph, feats = open_graph_store(pe_store), open_feature_store(pe_store)
    loaded = load_checkpoint(ckpt)
    store = open_embeddings(default_embeddings_dir(pe_store, ckpt)) if pes else None
    shared = Admission(AdmissionConfig(**admission))  # type: ignore[arg-type]
    reads = RecordingReads(graph)
    svc = NewNodeService(
        ModelRunner(loaded.model, loaded.version),
        graph,
        feats,
        store,
        shared,
        Backlog(None),
        CONFIG,
        reads=reads,
    )
    return svc, shared, reads


def new_request(
    pe_store: Path, new_edges: object = None, output: str = "label", **options: object
) -> Request:
    """A new-node request of FEATURES / EDGES validated as the engine does (the service takes
    validated requests), with the service's defaults."""
    limits = RequestLimits(open_graph_store(pe_store), 16, 2, 1024, CONFIG)
    new = {"features": FEATURES, "edges": EDGES, "new_edges": new_edges}
    return validate_request(new_nodes=new, output=output, limits=limits, **options)  # type: ignore[arg-type]


def test_service_without_engine_equals_inference(pe_store: Path, small_ckpt: Path) -> None:
    svc, shared, reads = service(pe_store, small_ckpt)
    svc.start()
    try:
        first = svc.submit(new_request(pe_store, NEW_EDGES, "probs")).result(60)
        ns = new_request(pe_store, None, "embedding", mode="ns", fanouts=[3, 2], seed=7)
        second = svc.submit(ns).result(60)
    finally:
        shared.close()
        svc.stop()
    graph, feats = open_graph_store(pe_store), open_feature_store(pe_store)
    inference = NewNodeInference(
        load_checkpoint(small_ckpt).model,
        graph,
        feats,
        open_embeddings(default_embeddings_dir(pe_store, small_ckpt)),
    )
    new = parse_new_nodes(FEATURES, EDGES, NEW_EDGES, num_nodes=graph.num_nodes, feature_dim=16)
    want = inference.run(new, "srpe", 0.5, "importance")  # the config's defaults
    assert torch.equal(first.values, torch.softmax(want.logits, 1))
    info = first.new_nodes
    assert info is not None and (info.mode, info.gamma, info.policy) == ("srpe", 0.5, "importance")
    np.testing.assert_array_equal(info.recomputed, want.recomputed)
    new = parse_new_nodes(FEATURES, EDGES, None, num_nodes=graph.num_nodes, feature_dim=16)
    assert torch.equal(second.values, inference.run(new, "ns", fanouts=[3, 2], seed=7).embedding)
    # ids from the shared admission; versions pinned through ``reads`` (warm-up + 2 requests)
    assert (first.request_id, second.request_id, shared.next_id()) == (1, 2, 3)
    assert first.graph_version == graph.version + "@reads"
    assert reads.acquired == reads.released == 3
    assert shared.in_flight == 0 and svc.backlog.idle  # type: ignore[attr-defined]


def test_shared_admission_bound_and_refusals(pe_store: Path, small_ckpt: Path) -> None:
    svc, shared, _ = service(pe_store, small_ckpt, max_queue_requests=1)
    held = shared.admit(Request(nodes=np.array([1, 2])))  # an existing-node request holds the
    with pytest.raises(OverloadedError):  # only slot
        svc.submit(new_request(pe_store))  # not started: nothing would run it, yet nothing queued
    held.future.set_result(None)  # type: ignore[arg-type]
    assert shared.in_flight == 0 and svc._queue.empty()
    shared.close()
    with pytest.raises(ShuttingDownError):
        svc.submit(new_request(pe_store))
    bare, _, _ = service(pe_store, small_ckpt, pes=False)
    with pytest.raises(MissingEmbeddingsError) as err:
        bare.submit(new_request(pe_store))
    assert err.value.field == "new_nodes"


def test_only_base_store_pes_are_caught_up_with_a_log() -> None:
    """A version names a batch count, not its log: PEs at batch 3 of some log must not pass
    for batch 3 of another and be caught up from there."""
    from gnnserve.newnodes.service import base_version

    assert base_version("abc", "abc.5") and base_version("abc.0", "abc.5")
    assert not base_version("abc.3", "abc.5") and not base_version("abd", "abc.5")
    assert not base_version("abc", "abc")  # a fixed store has no log
