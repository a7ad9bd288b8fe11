"""Admission control: validate a request, bound the number in flight, stamp its deadline."""

from __future__ import annotations

import itertools
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from gnnserve.config import AdmissionConfig
from gnnserve.errors import InvalidInputError, OverloadedError, ShuttingDownError, TooManyNodesError
from gnnserve.graph.base import GraphStore
from gnnserve.types import InferenceRequest, InferenceResult, OutputKind


@dataclass
class Ticket:
    """An admitted request and the future its caller waits on."""

    request: InferenceRequest  # what was asked
    future: Future[InferenceResult] = field(default_factory=Future)  # resolved by the engine


def parse_output(output: str | OutputKind) -> OutputKind:
    """OutputKind from its name; unknown names raise InvalidInputError naming ``output``."""
    try:
        return OutputKind(output)
    except ValueError:
        kinds = [k.value for k in OutputKind]
        raise InvalidInputError(
            f"unknown output {output!r}; choose one of {kinds}", "output"
        ) from None


class Admission:
    """Bounded admission: at most ``max_queue_requests`` admitted and unfinished requests."""

    def __init__(self, graph: GraphStore, config: AdmissionConfig) -> None:
        self.graph = graph
        self.config = config
        self._in_flight = 0
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self._closed = False

    @property
    def in_flight(self) -> int:
        """Admitted requests not yet resolved."""
        return self._in_flight

    @property
    def closed(self) -> bool:
        """True once shutdown began."""
        return self._closed

    def close(self) -> None:
        """Refuse every later request (graceful shutdown)."""
        self._closed = True

    def admit(
        self,
        nodes: object,
        output: str | OutputKind,
        fanouts: tuple[int, ...] | None = None,
    ) -> Ticket:
        """Validate and admit; raises InvalidInputError / TooManyNodesError / OverloadedError.

        ``fanouts`` must already be validated (``Planner.check``).
        """
        if self._closed:
            raise ShuttingDownError("server is shutting down")
        kind = parse_output(output)
        ids = self._check_nodes(nodes)
        future: Future[InferenceResult] = Future()
        self.reserve(future)
        now = time.perf_counter()
        req = InferenceRequest(ids, kind, self.next_id(), now, now + self.config.timeout_s, fanouts)
        return Ticket(req, future)

    def reserve(self, future: Future[Any]) -> None:
        """Count ``future`` as in flight until it is done, or refuse it.

        Raises ShuttingDownError once closed, OverloadedError when ``max_queue_requests`` are
        already in flight (every kind of request shares the bound).
        """
        if self._closed:
            raise ShuttingDownError("server is shutting down")
        with self._lock:
            if self._in_flight >= self.config.max_queue_requests:
                raise OverloadedError(
                    f"queue full ({self.config.max_queue_requests} requests in flight); retry later"
                )
            self._in_flight += 1
        future.add_done_callback(self._release)

    def next_id(self) -> int:
        """A fresh request id (monotonic, shared by every kind of request)."""
        return next(self._ids)

    def _release(self, _: Future[Any]) -> None:
        with self._lock:
            self._in_flight -= 1

    def _check_nodes(self, nodes: object) -> np.ndarray:
        if isinstance(nodes, np.ndarray):
            arr = nodes
        else:
            if not isinstance(nodes, (list, tuple)) or any(
                isinstance(n, bool) or not isinstance(n, (int, np.integer)) for n in nodes
            ):
                raise InvalidInputError("nodes must be a list of integer node ids", "nodes")
            try:
                arr = np.asarray(nodes, dtype=np.int64) if nodes else np.empty(0, np.int64)
            except OverflowError:
                raise InvalidInputError(
                    "nodes holds an id beyond the int64 range", "nodes"
                ) from None
        if arr.size == 0:
            raise InvalidInputError("nodes must not be empty", "nodes")
        limit = self.config.max_nodes_per_request
        if arr.size > limit:
            raise TooManyNodesError(f"{arr.size} nodes requested, the limit is {limit}", "nodes")
        return self.graph.check_nodes(arr, "nodes")
