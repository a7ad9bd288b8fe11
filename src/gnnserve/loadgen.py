"""HTTP load generator: closed-loop (fixed concurrency) and open-loop (fixed arrival rate).

Used by ``gnnserve demo``, ``gnnserve bench`` and the HTTP benchmarks in bench/. Latencies are
client-side wall times in milliseconds, measured from the scheduled send time in open loop (so
queueing in the client counts, as it would for a real caller).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import numpy as np

Payload = dict[str, Any] | bytes  # a JSON-able body, or one already encoded as JSON
# the headers of every request, or of request i
Headers = dict[str, str] | Callable[[int], dict[str, str]] | None


@dataclass
class LoadReport:
    """Outcome of one load run."""

    latencies_ms: list[float] = field(default_factory=list)  # successful requests only
    status_counts: dict[int, int] = field(default_factory=dict)  # HTTP status -> count
    responses: list[Any] = field(default_factory=list)  # JSON bodies (when kept), send order
    duration_s: float = 0.0  # wall time of the run
    offered_rps: float = 0.0  # open loop: target rate; closed loop: 0
    # per request, in send order: HTTP status (-1: connection error or client timeout), latency
    # of whatever answer came (ms), and how late the client sent it (open loop; ms)
    statuses: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    answer_ms: np.ndarray = field(default_factory=lambda: np.zeros(0))
    send_lag_ms: np.ndarray = field(default_factory=lambda: np.zeros(0))

    def expect(self, n: int) -> None:
        """Size the per-request arrays for ``n`` requests."""
        self.statuses = np.zeros(n, np.int64)
        self.answer_ms, self.send_lag_ms = np.zeros(n), np.zeros(n)

    @property
    def ok(self) -> int:
        """Number of 200 answers."""
        return self.status_counts.get(200, 0)

    @property
    def throughput_rps(self) -> float:
        """Successful requests per second."""
        return self.ok / self.duration_s if self.duration_s else 0.0

    def percentile(self, q: float) -> float:
        """Latency percentile ``q`` (0-100) in ms; inf when nothing succeeded."""
        return float(np.percentile(self.latencies_ms, q)) if self.latencies_ms else float("inf")

    def summary(self) -> dict[str, float]:
        """Headline numbers for JSON output."""
        return {
            "offered_rps": round(self.offered_rps, 1),
            "throughput_rps": round(self.throughput_rps, 1),
            "p50_ms": round(self.percentile(50), 3),
            "p99_ms": round(self.percentile(99), 3),
            "ok": self.ok,
            "errors": sum(v for k, v in self.status_counts.items() if k != 200),
        }


@contextlib.contextmanager
def frozen_heap() -> Iterator[None]:
    """Freeze the existing heap for a run: a full collection over torch's ~380K objects stalls
    the client for 200+ ms and would be measured as server latency."""
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


_JSON = {"content-type": "application/json"}


async def _send(
    session: aiohttp.ClientSession,
    url: str,
    payload: Payload,
    report: LoadReport,
    keep: bool,
    index: int,
    t0: float,
    headers: dict[str, str] | None = None,
) -> None:
    report.send_lag_ms[index] = (time.perf_counter() - t0) * 1e3
    if isinstance(payload, bytes):
        post = session.post(url, data=payload, headers={**_JSON, **(headers or {})})
    else:
        post = session.post(url, json=payload, headers=headers)
    try:
        async with post as resp:
            body = await resp.json(content_type=None) if keep or resp.status != 200 else None
            await resp.read()
            status = resp.status
    except (aiohttp.ClientError, asyncio.TimeoutError):
        status = -1
        body = None
    elapsed_ms = (time.perf_counter() - t0) * 1e3
    report.status_counts[status] = report.status_counts.get(status, 0) + 1
    report.statuses[index], report.answer_ms[index] = status, elapsed_ms
    if status == 200:
        report.latencies_ms.append(elapsed_ms)
    if keep:
        report.responses[index] = body


async def closed_loop(
    url: str, payloads: Sequence[Payload], concurrency: int, keep_responses: bool = False
) -> LoadReport:
    """Send every payload with ``concurrency`` requests outstanding at a time."""
    report = LoadReport(responses=[None] * len(payloads) if keep_responses else [])
    report.expect(len(payloads))
    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(len(payloads)):
        queue.put_nowait(i)

    async def worker(session: aiohttp.ClientSession) -> None:
        while not queue.empty():
            i = queue.get_nowait()
            t0 = time.perf_counter()
            await _send(session, url, payloads[i], report, keep_responses, i, t0)

    connector = aiohttp.TCPConnector(limit=concurrency)
    with frozen_heap():
        async with aiohttp.ClientSession(connector=connector) as session:
            start = time.perf_counter()
            await asyncio.gather(*(worker(session) for _ in range(concurrency)))
            report.duration_s = time.perf_counter() - start
    return report


async def _schedule(
    session: aiohttp.ClientSession,
    url: str,
    make_payload: Callable[[int], Payload],
    send_at: np.ndarray,
    report: LoadReport,
    headers: Headers,
) -> None:
    """Fire request i at ``start + send_at[i]`` without waiting for earlier replies."""
    start = time.perf_counter()
    tasks = []
    for i, offset in enumerate(send_at):
        delay = start + offset - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        t0 = start + float(offset)
        own = headers(i) if callable(headers) else headers
        send = _send(session, url, make_payload(i), report, False, i, t0, own)
        tasks.append(asyncio.create_task(send))
    await asyncio.gather(*tasks)
    report.duration_s = max(time.perf_counter() - start, float(send_at[-1]))


async def open_loop(
    url: str,
    make_payload: Callable[[int], Payload],
    rate_rps: float,
    duration_s: float,
    seed: int = 0,
    max_connections: int = 512,
    headers: Headers = None,
    timeout_s: float = 30.0,
) -> LoadReport:
    """Poisson arrivals at ``rate_rps`` for ``duration_s``; waits for every reply (at most
    ``timeout_s`` each). ``headers`` go with every request, or ``headers(i)`` with request i."""
    rng = np.random.default_rng(seed)
    n = max(1, int(rate_rps * duration_s))
    send_at = np.cumsum(rng.exponential(1.0 / rate_rps, n))
    report = LoadReport(offered_rps=rate_rps)
    report.expect(n)
    connector = aiohttp.TCPConnector(limit=max_connections)
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    with frozen_heap():
        async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
            await _schedule(session, url, make_payload, send_at, report, headers)
    return report
