"""The event loop's lag: measured, exported, and counted against a request's deadline."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import httpx
import pytest

from gnnserve.config import ServeConfig
from gnnserve.engine.loader import build_engine
from gnnserve.server.looplag import LoopLag
from tests.server.conftest import serving


def test_loop_lag_sees_a_blocked_loop() -> None:
    seen: list[float] = []

    async def main() -> LoopLag:
        lag = LoopLag(interval_s=0.005, observe=seen.append)
        lag.start()
        await asyncio.sleep(0.05)
        assert lag.recent_s < 0.04  # an idle loop wakes the sampler (about) on time
        time.sleep(0.12)  # the loop is blocked: the sampler wakes 0.12 s late
        await asyncio.sleep(0.006)
        await lag.stop()
        return lag

    lag = asyncio.run(main())
    assert lag.recent_s >= 0.1 and max(seen) >= 0.1
    assert sum(1 for s in seen if s >= 0.1) == 1  # one late wake-up, the others on time


def test_a_request_that_waited_for_the_loop_counts_the_wait(
    small_store: Path, small_ckpt: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A loop 0.6 s behind: a request with 0.5 s left when sent has none left when the server
    sees it. It must not be answered 200 as if it had just arrived (old: 200 after 0.6 s)."""
    config = ServeConfig.load(
        None, **{"store.path": str(small_store), "model_path": str(small_ckpt)}
    )
    with serving(build_engine(config)) as base:
        url = f"{base}/v1/predict"
        assert httpx.post(url, json={"nodes": [1]}, headers={"X-Timeout-Ms": "500"}).is_success
        metrics = httpx.get(f"{base}/metrics").text
        assert "gnnserve_event_loop_lag_seconds_count" in metrics
        monkeypatch.setattr(LoopLag, "recent_s", property(lambda self: 0.6))
        late = httpx.post(url, json={"nodes": [1]}, headers={"X-Timeout-Ms": "500"})
        assert late.status_code in (429, 504), late.text
        assert late.json()["error"]["kind"] in ("overloaded", "deadline_exceeded")
        ok = httpx.post(url, json={"nodes": [1]}, headers={"X-Timeout-Ms": "5000"})
        assert ok.status_code == 200, ok.text  # a deadline beyond the wait is served
