"""Shaped links on the kernel's own mechanisms: a device link carries an upload at its tbf rate
from its namespace to the fog; the fog fabric carries the BSP boundary exchange at each fog's
rate, and the answers stay exact. Skipped, with the reason, where netns is forbidden."""

from __future__ import annotations

import re
import subprocess
import time

import numpy as np
import pytest
import torch

from gnnserve.data.generators import sbm
from gnnserve.data.writer import write_store
from gnnserve.deploy.fog.cluster import FogCluster
from gnnserve.deploy.fog.devices import DeviceGroup
from gnnserve.deploy.fog.links import (
    PRESETS,
    FogFabric,
    Link,
    LinkPreset,
    cloud_path,
    measure_rate,
)
from gnnserve.deploy.fog.planner import metis_parts
from gnnserve.deploy.fog.receiver import Receiver
from gnnserve.deploy.fog.slots import claim_slot
from gnnserve.deploy.fog.testbed import probe
from gnnserve.graph import open_graph_store
from gnnserve.models.zoo import GNN, ModelConfig
from tests.embeddings.reference import layer_outputs

SUPPORT = probe()
NO_NETNS = pytest.mark.skipif(
    SUPPORT.netns is not None, reason=f"no network namespaces: {SUPPORT.netns}"
)


def test_presets_compose_as_a_path() -> None:
    assert PRESETS["4g"].then(PRESETS["wifi"]) == LinkPreset("4g+wifi", 10.0, 27.0)
    cloud = cloud_path("4g")  # Fograph: one fog cut 4G collection time by 64% against the cloud
    assert cloud.rate_mbit == pytest.approx(10.0 * 0.36) and cloud.delay_ms == 25.0 + 20.0


@NO_NETNS
def test_uploads_over_a_link_take_its_rate() -> None:
    received = np.zeros((20_000, 32), np.float32)

    def apply(start: int, values: np.ndarray) -> None:
        received[start : start + values.shape[0]] = values

    values = np.random.default_rng(0).standard_normal(received.shape).astype(np.float32)
    with (
        claim_slot() as slot,
        Link(slot.index, 0, LinkPreset("t", 20.0, 30.0), SUPPORT.netem) as link,
    ):
        receiver = Receiver(link.host_ip, apply, {0: (0, 8)}, strict=True)
        group = DeviceGroup(link.host_ip, receiver.port, None, link, chunks=4)
        try:
            group.start_round(1, values[::-1][:8])  # a small first round: the process is up
            receiver.wait(1, timeout_s=60)
            group.finish_round()
            receiver.expect({0: (0, values.shape[0])})
            start = time.perf_counter()
            group.start_round(2, values)
            receiver.wait(2, timeout_s=60)
            took = time.perf_counter() - start
            report = group.finish_round()
            shown = subprocess.run(
                link.argv("tc", "-s", "qdisc", "show", "dev", link.dev),
                capture_output=True, text=True, check=True,
            ).stdout  # fmt: skip
        finally:
            group.close()
            receiver.close()
    np.testing.assert_array_equal(received, values)
    # the kernel's side: a tbf at 20 Mbit/s that sent the upload and held packets back
    tbf = next(line for line in shown.splitlines() if "tbf" in line)
    assert "rate 20Mbit" in tbf, shown
    sent = [int(m) for m in re.findall(r"Sent (\d+) bytes", shown)]
    overlimits = [int(m) for m in re.findall(r"overlimits (\d+)", shown)]
    assert max(sent) >= report["bytes"] and max(overlimits) > 0, shown
    # a lower bound only: a busy machine makes the round slower, never faster than the rate
    ideal = report["bytes"] * 8 / 20e6 + 0.030  # 2.56 MB at 20 Mbit/s plus the delay
    assert took > 0.9 * ideal, (took, ideal)


@NO_NETNS
@pytest.mark.distributed
def test_the_fabric_carries_the_boundary_exchange_at_its_rate(
    tmp_path: object, ray_instance: None
) -> None:
    n, f = 1_500, 64
    data = sbm(num_nodes=n, num_classes=4, feature_dim=f, avg_degree=10.0, seed=3)
    write_store(data, f"{tmp_path}/store")
    graph = open_graph_store(f"{tmp_path}/store")
    torch.manual_seed(0)
    model = GNN(ModelConfig("sage", in_dim=f, hidden_dim=64, out_dim=3, num_layers=2))
    x = np.random.default_rng(0).standard_normal((n, f)).astype(np.float32)
    indptr, indices = graph.csr()
    membership = metis_parts(indptr, indices, 2)
    rate, delay = 2.0, 150.0  # Mbit/s, ms (the delay outweighs the rate's 10% allowance)
    slow = LinkPreset("slow", rate, delay)
    with claim_slot() as slot, FogFabric(slot.index, [slow, slow], SUPPORT.netem) as fabric:
        before = [fabric.sent_bytes(j) for j in range(2)]
        with FogCluster(model, graph, x, membership, 2, fabric=fabric) as cluster:
            result = cluster.run()
            wire = [fabric.sent_bytes(j) - b for j, b in enumerate(before)]
    dst = np.repeat(np.arange(n), np.diff(indptr))
    edges = torch.from_numpy(np.stack([np.asarray(indices, np.int64), dst]))
    with torch.inference_mode():
        want = layer_outputs(model, torch.from_numpy(x), edges)[-1].numpy()
    np.testing.assert_allclose(result.logits, want, rtol=0, atol=1e-5)
    for node, sent in zip(result.nodes, wire, strict=True):
        assert sent >= node.bytes_sent > 50_000  # the exchange went over this fog's link
        # the slowest sender bounds each layer's swap: its bytes at the rate, plus the delay
        transfer = max(r.bytes_sent for r in result.nodes) * 8 / (rate * 1e6) * 1e3
        assert node.exchange_ms >= 0.9 * transfer + 2 * delay  # one delay per layer's swap


@NO_NETNS
def test_a_measured_rate_is_the_shaped_rate() -> None:
    with (
        claim_slot() as slot,
        Link(slot.index, 0, LinkPreset("t", 20.0, 5.0), SUPPORT.netem) as link,
    ):
        fast = measure_rate(link)
        link.set_rate(5.0)
        slow = measure_rate(link)
    assert fast == pytest.approx(20e6 / 8, rel=0.15)
    assert slow == pytest.approx(5e6 / 8, rel=0.15)
