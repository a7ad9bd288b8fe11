"""The update log as DGS's event stream (DGS's Kafka topic), read by byte offset.

The log (``dynamic.wal``) is one file of records, each a batch with its seq. A sampling worker
keeps a :class:`Position` (the last record it applied and where the next one starts) and pulls
the records after it from a :class:`LogFeed`, a Ray actor placed on the node that holds the log
file, so workers on other nodes of a cluster read it too. A worker applies a record only if its
seq is the one after its position, and moves the position with it: every record is applied
exactly once, also by a worker rebuilt from a checkpoint (its position comes with it).
"""

from __future__ import annotations

import mmap
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from gnnserve.dynamic import columns
from gnnserve.dynamic.records import decode_at
from gnnserve.graph.events import DELETE, INSERT

Record = tuple[int, int, bytes]  # (seq, byte offset after it, the record's bytes)


@dataclass(frozen=True)
class Position:
    """Where a consumer of the log stands: record ``seq`` applied, the next at ``offset``."""

    seq: int
    offset: int


@dataclass(frozen=True)
class LogSource:
    """An update log for DGS workers: its file, the position they start at (the batch their
    initial graph reflects), and its feature width (JSON records need it to be read)."""

    path: Path
    start: Position
    dim: int


class LogFeed:
    """Serves the records of the update log at ``path`` by byte offset (a Ray actor)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.bytes_served = 0

    def read(self, position: Position, upto: int, max_bytes: int = 32 << 20) -> list[Record]:
        """The records after ``position`` through seq ``upto``, in order (at least one, then up
        to about ``max_bytes``). RuntimeError when the log holds no intact record where one
        must be (the log was cut or changed under the service)."""
        out: list[Record] = []
        with open(self.path, "rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            if size <= position.offset:
                raise RuntimeError(self._missing(position, upto))
            with mmap.mmap(fh.fileno(), size, access=mmap.ACCESS_READ) as buf:
                at, seq, taken = position.offset, position.seq, 0
                while seq < upto and (not out or taken < max_bytes):
                    found = decode_at(buf, at, size)
                    if found is None or found[0][0] != seq + 1:
                        raise RuntimeError(self._missing(Position(seq, at), upto))
                    out.append((seq + 1, at + found[1], bytes(buf[at : at + found[1]])))
                    seq, at, taken = seq + 1, at + found[1], taken + found[1]
        self.bytes_served += taken
        return out

    def node(self) -> str:
        """The Ray node this feed runs on (the one holding the log file)."""
        import ray

        return str(ray.get_runtime_context().get_node_id())

    def _missing(self, position: Position, upto: int) -> str:
        return (
            f"update log {self.path} has no intact record {position.seq + 1} at byte "
            f"{position.offset} (the service was told batches through {upto} are logged)"
        )


def record_events(raw: bytes, dim: int) -> tuple[int, np.ndarray, np.ndarray, np.ndarray]:
    """(nodes added, kinds, srcs, dsts) of one record's batch (``dim``: feature width, which a
    JSON record's features need to be read)."""
    found = decode_at(raw, 0, len(raw))
    if found is None:
        raise RuntimeError("a record read from the update log no longer decodes")
    ops = found[0][1]
    batch = columns.decode(ops) if isinstance(ops, bytes) else columns.from_ops(ops, dim)
    edges = batch.edge_events()
    if edges is None:
        empty = np.empty(0, dtype=np.int64)
        return batch.added, empty, empty, empty
    inserts, srcs, dsts = edges
    return batch.added, np.where(inserts, INSERT, DELETE).astype(np.int64), srcs, dsts


def events_batch(added: int, kinds: np.ndarray, srcs: np.ndarray, dsts: np.ndarray) -> bytes:
    """The log payload (``columns.encode``) of ``added`` new nodes (no features) followed by
    edge events: what a service without a store writes to its own log."""
    k = added + kinds.size
    op = np.full(k, columns.ADD_NODE, dtype=np.int8)
    op[added:] = np.where(kinds == INSERT, columns.ADD_EDGE, columns.DELETE_EDGE)
    src, dst = np.full(k, -1, dtype=np.int64), np.full(k, -1, dtype=np.int64)
    src[added:], dst[added:] = srcs, dsts
    node = np.full(k, -1, dtype=np.int64)
    features = np.zeros((added, 0), dtype=np.float32)
    return columns.encode(columns.ColumnBatch(op, src, dst, node, features))


def on_this_node() -> dict[str, Any]:
    """Ray options that place an actor on this (the driver's) node, which holds the log."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    node = ray.get_runtime_context().get_node_id()
    return {"scheduling_strategy": NodeAffinitySchedulingStrategy(node, soft=False)}
