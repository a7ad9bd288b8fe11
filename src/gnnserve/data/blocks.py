"""Large objects as fixed-size blocks: how a published store keeps range reads cheap.

Object stores do not all read a byte range at the cost of the range. SeaweedFS (the store the
project runs) keeps an object above its chunk size as several chunks and reads a whole chunk from
the volume server for every range GET (seaweedfs/seaweedfs#7491, #7056). On the 2-core dev VM,
200 random 18.9 KB rows cost 7.5 ms per range from one 424 MB object and 1.05 ms from 1 MiB
blocks (``bench/faas_wide.py``, median of 3 rounds).

So ``publish`` writes every data file larger than ``block_bytes`` as the objects
``<name>.blocks/<i>`` (block i holds bytes ``[i * block_bytes, (i + 1) * block_bytes)``) and lists
them in :data:`MANIFEST` (``{"block_bytes": B, "objects": {name: size}}``), written before
``meta.json``. :class:`gnnserve.data.blobs.BlobStore` reads the manifest once and turns a read of
a blocked object into reads of its blocks, so callers never see blocks. A store published
without a manifest is read as before.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import numpy as np

from gnnserve.errors import StoreFormatError

__all__ = [
    "DEFAULT_BLOCK_BYTES",
    "MANIFEST",
    "BlockManifest",
    "block_count",
    "block_name",
    "split_ranges",
]

MANIFEST = "blocks.json"
DEFAULT_BLOCK_BYTES = 1 << 20  # 1 MiB: among the fastest of 256 KB-8 MB tried ad hoc, few objects


def block_count(size: int, block_bytes: int) -> int:
    """Blocks of ``block_bytes`` that hold ``size`` bytes (the last one may be short)."""
    return -(-size // block_bytes)


def block_name(name: str, index: int) -> str:
    """Object name of block ``index`` of ``name``."""
    return f"{name}.blocks/{index:08d}"


@dataclass(frozen=True)
class BlockManifest:
    """Which objects are blocked, their sizes in bytes and the block size in bytes."""

    block_bytes: int = DEFAULT_BLOCK_BYTES
    objects: dict[str, int] = field(default_factory=dict)  # name -> size in bytes

    def blocks(self, name: str) -> int:
        """How many blocks object ``name`` has."""
        return block_count(self.objects[name], self.block_bytes)

    def to_json(self) -> bytes:
        """The manifest object's bytes."""
        doc = {"block_bytes": self.block_bytes, "objects": self.objects}
        return json.dumps(doc, indent=2, sort_keys=True).encode()

    @classmethod
    def parse(cls, data: bytes, where: str) -> BlockManifest:
        """The manifest in ``data``; StoreFormatError naming ``where`` when it is malformed."""
        try:
            doc = json.loads(data)
            block_bytes = int(doc["block_bytes"])
            objects = {str(k): int(v) for k, v in dict(doc["objects"]).items()}
        except (ValueError, KeyError, TypeError) as exc:
            raise StoreFormatError(f"{where}: malformed {MANIFEST}: {exc}", "remote") from None
        if block_bytes <= 0 or any(v < 0 for v in objects.values()):
            raise StoreFormatError(f"{where}: {MANIFEST} has a non-positive size", "remote")
        return cls(block_bytes, objects)


def split_ranges(
    starts: np.ndarray, ends: np.ndarray, block_bytes: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Cut byte ranges ``[starts[i], ends[i])`` (non-empty) at block boundaries.

    Returns (block, lo, hi, owner): piece j is bytes ``[lo[j], hi[j])`` of block ``block[j]``
    (offsets inside the block) and belongs to range ``owner[j]``; the pieces of each range are
    consecutive and in order, so joining them per owner gives the range back. Vectorised.
    """
    first = starts // block_bytes
    last = (ends - 1) // block_bytes
    count = last - first + 1
    owner = np.repeat(np.arange(starts.size, dtype=np.int64), count)
    offset = np.arange(owner.size, dtype=np.int64) - np.repeat(np.cumsum(count) - count, count)
    block = first[owner] + offset
    base = block * block_bytes
    lo = np.maximum(starts[owner], base) - base
    hi = np.minimum(ends[owner], base + block_bytes) - base
    return block, lo, hi, owner
