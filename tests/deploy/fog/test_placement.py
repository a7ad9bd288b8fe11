"""The planning state of a fog deployment: phi is the packed size per vertex, weighted parts give
every node the same upload + compute time (a plain computation of the shares), the fastest node
gets the largest part, and a re-plan after a load change takes vertices off the loaded node."""

from __future__ import annotations

import numpy as np
import pytest

from gnnserve.deploy.fog.placement import FogPlacement
from gnnserve.deploy.fog.profiler import LatencyModel, cardinality, rows_sent
from gnnserve.features.codecs import pack
from tests.deploy.fog.test_planner import _graph

N, F = 2_000, 16
TRUTHS = [LatencyModel(0.02, 0.0, 0.0), LatencyModel(0.005, 0.0, 0.0)]  # ms per vertex
UPLINKS = [2e6, 2e5]  # bytes/s: the fast computer has the slow uplink


def _placement(bits: np.ndarray | None, weighted: bool = True) -> FogPlacement:
    indptr, indices = _graph(N, 12_000)
    x = np.random.default_rng(0).standard_normal((N, F)).astype(np.float32)
    placement = FogPlacement(indptr, indices, x, bits, 2, "iep", weighted)

    def time_all(vertices: np.ndarray) -> list[float]:
        v, n = cardinality(indptr, indices, vertices)
        return [float(t.predict(v, n)) for t in TRUTHS]

    placement.profile(["slow_cpu", "slow_link"], time_all, UPLINKS)
    return placement


def test_phi_is_the_packed_bytes_per_vertex() -> None:
    assert _placement(None).phi() == F * 4.0
    bits = np.full(N, 8, np.uint8)
    daq = _placement(bits)
    rows = np.sort(np.random.default_rng(0).permutation(N)[:2000])
    assert daq.phi() == len(pack(daq.features[rows], bits[rows])) / rows.size


def test_weighted_parts_even_upload_plus_compute() -> None:
    placement = _placement(None)
    phi = placement.phi()
    per_vertex = np.array([t.beta_v for t in TRUTHS]) + phi / np.array(UPLINKS) * 1e3
    share = (1 / per_vertex) / (1 / per_vertex).sum()  # equal time: share_j * per_vertex_j
    sizes = np.sort(np.bincount(placement.parts(phi), minlength=2)) / N
    np.testing.assert_allclose(sizes, np.sort(share), atol=0.04)
    membership = placement.initial()
    owned = np.bincount(membership, minlength=2) / N
    assert owned[int(np.argmax(share))] == pytest.approx(share.max(), abs=0.04)  # IEP's mapping
    equal = _placement(None, weighted=False)
    np.testing.assert_allclose(np.bincount(equal.parts(phi), minlength=2) / N, 0.5, atol=0.04)


def test_a_replan_after_a_load_change_moves_vertices_off_the_loaded_node() -> None:
    placement = _placement(None)
    membership = placement.initial()
    sizes = np.bincount(membership, minlength=2)
    times = np.array([TRUTHS[j].beta_v * sizes[j] for j in range(2)])
    times[0] *= 4  # background load on node 0
    new, predicted = placement.replan(membership, times)
    assert np.bincount(new, minlength=2)[0] < sizes[0]
    assert placement.specs[0].model.eta == pytest.approx(4.0, rel=0.05)
    assert predicted.shape == (2,)


def test_the_predicted_round_adds_the_boundary_exchange_over_the_fog_links() -> None:
    """Per layer, the slowest sender's rows x width x 4 bytes over its link plus its delay;
    summed over layers, added to the plan's bottleneck. Loopback (no links): nothing added."""
    placement = _placement(None)
    membership = placement.initial()
    bare = placement.predicted_round_ms
    assert bare is not None and placement.exchange_ms(membership) == 0.0
    placement.widths = [F, 64]
    placement.fog_links = [(125e6, 0.25), (12.5e6, 2.0)]  # lan and wifi, bytes/s and ms
    sent = rows_sent(placement.indptr, placement.indices, membership, 2)
    want = sum(
        max(
            sent[j] * w * 4 / rate * 1e3 + delay
            for j, (rate, delay) in enumerate(placement.fog_links)
        )
        for w in (F, 64)
    )
    assert sent.min() > 0 and placement.exchange_ms(membership) == pytest.approx(want)
    membership = placement.initial()
    assert placement.predicted_round_ms == pytest.approx(bare + want)
