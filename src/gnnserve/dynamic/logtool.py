"""``gnnserve log verify|repair``: inspect an update log, and recover from a corrupt one.

``verify LOG [--store STORE]`` prints the good records, the last seq and the status (clean / torn
tail / corrupt at an offset). With ``--store`` it also replays every batch against the store as
``serve`` does at start-up and names the first one serve would refuse (an intact record holding,
e.g., a feature beyond float32 or an unknown node). Exit code 0 for clean or a torn tail
(start-up drops it), 1 for corruption or a refused batch.

``repair LOG [--store STORE] --keep-good-prefix`` keeps the records before the damage (or before
the first refused batch, with ``--store``) and drops everything after it, including any valid
records there (they are listed): it hard-links the damaged file to ``LOG.corrupt-<UTC time>``
(kept, never deleted), writes the good prefix to a temporary file, fsyncs it and renames it over
``LOG``, then fsyncs the directory -- so at every moment ``LOG`` is either the damaged log or the
repaired one. It holds the log's writer lock throughout, so it refuses to run while a server
writes the log.
"""

from __future__ import annotations

import argparse
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from gnnserve.dynamic.wal import LogScan, fsync_dir, locked, record_offset, scan_log
from gnnserve.errors import InvalidInputError, StoreFormatError

if TYPE_CHECKING:  # the store replay loads torch; a plain verify does not
    from gnnserve.dynamic.store import InvalidLoggedBatchError

_CHUNK = 1 << 20


def _open_scan(path: Path) -> LogScan:
    if not path.is_file():
        raise StoreFormatError(f"update log {path} not found", "log")
    return scan_log(path)


@dataclass(frozen=True)
class LogCheck:
    """A log's scan plus, when checked against a store, the first batch serve would refuse."""

    scan: LogScan
    store: str | None  # the store the batches were replayed against (None: not checked)
    refused: InvalidLoggedBatchError | None = None

    @property
    def keep_records(self) -> int:
        """Records a repair keeps: the good prefix, cut before a refused batch."""
        return self.refused.seq if self.refused is not None else self.scan.records

    @property
    def bad(self) -> bool:
        """Corrupt, or holding a batch serve refuses."""
        return self.scan.status == "corrupt" or self.refused is not None

    @property
    def needs_repair(self) -> bool:
        """Anything after the records a repair keeps."""
        return self.keep_records < self.scan.records or self.scan.status != "clean"


def check_batches(path: Path, store: str | Path, scan: LogScan) -> InvalidLoggedBatchError | None:
    """Replay the log's good records against ``store`` read-only, as serve's start-up does;
    the first batch it refuses, or None. A log written for another store raises."""
    from gnnserve.dynamic.store import DynamicStore, InvalidLoggedBatchError
    from gnnserve.features import open_feature_store
    from gnnserve.graph import open_graph_store

    graph, features = open_graph_store(store), open_feature_store(store)
    try:
        DynamicStore(graph, features, path, read_only=True, store_path=store).close()
    except InvalidLoggedBatchError as exc:
        return exc
    except StoreFormatError:
        if scan.status != "corrupt":  # the structural damage is reported by the scan
            raise
    return None


def check(path: str | Path, store: str | Path | None = None) -> LogCheck:
    """Scan ``path`` and, with ``store``, replay its batches against it."""
    scan = _open_scan(Path(path))
    refused = None if store is None else check_batches(Path(path), store, scan)
    return LogCheck(scan, None if store is None else str(store), refused)


def _summary(scan: LogScan) -> str:
    seqs = f" (seq 0 to {scan.last_seq})" if scan.records else ""
    return f"{scan.path}: {scan.records} good records{seqs}, {scan.good_end} of {scan.size} bytes"


def verify(path: str | Path, store: str | Path | None = None) -> LogCheck:
    """Check ``path`` (and its batches against ``store``) and print what was found."""
    found = check(path, store)
    _report(found)
    return found


def _report(found: LogCheck) -> None:
    scan = found.scan
    print(_summary(scan))
    print(f"last seq: {scan.last_seq}")
    print(f"status: {scan.describe()}")
    if found.store is None:
        print("batches: not checked (--store STORE replays them as serve does)")
    elif found.refused is not None:
        print(f"batches: refused by {found.store}: {found.refused.message}")
    else:
        print(f"batches: all {max(scan.records - 1, 0)} apply to {found.store}")


@dataclass(frozen=True)
class Repair:
    """What ``repair`` did (sizes in bytes)."""

    aside: Path | None  # where the damaged file went; None when the log was clean
    kept_records: int
    kept_bytes: int  # the repaired log's size
    dropped_bytes: int
    dropped_seqs: tuple[int, ...]  # seqs of the intact records dropped (refused batch on)
    first: str = "damaged record"  # what the first dropped record is: or "refused batch"


def _aside_name(path: Path) -> Path:
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    aside = path.with_name(f"{path.name}.corrupt-{stamp}")
    n = 1
    while aside.exists():
        n += 1
        aside = path.with_name(f"{path.name}.corrupt-{stamp}-{n}")
    return aside


def _write_prefix(src: Path, dst: Path, length: int) -> None:
    """Copy the first ``length`` bytes of ``src`` to a new file ``dst`` and fsync it."""
    with open(src, "rb") as fin, open(dst, "xb") as fout:
        left = length
        while left:
            chunk = fin.read(min(left, _CHUNK))
            if not chunk:
                raise StoreFormatError(f"{src} shrank while being repaired", "log")
            fout.write(chunk)
            left -= len(chunk)
        fout.flush()
        os.fsync(fout.fileno())


def repair(path: str | Path, store: str | Path | None = None, report: bool = False) -> Repair:
    """Keep the good prefix of ``path`` (before the first batch ``store`` refuses, when given),
    moving the damaged file aside (see module doc); LogInUseError while a server writes it.
    ``report``: print the check first (as ``verify``)."""
    p = Path(path)
    if not p.is_file():
        raise StoreFormatError(f"update log {p} not found", "log")
    with locked(p):
        found = check(p, store)
        if report:
            _report(found)
        if not found.needs_repair:
            return Repair(None, found.keep_records, found.scan.size, 0, ())
        keep = found.keep_records
        end = record_offset(p, keep) if keep < found.scan.records else found.scan.good_end
        aside = _aside_name(p)
        tmp = p.with_name(f".{p.name}.repair-{os.getpid()}")
        _write_prefix(p, tmp, end)
        try:
            os.link(p, aside)  # LOG stays in place until the repaired file replaces it
        except OSError:
            os.rename(p, aside)  # a file system without hard links
        os.replace(tmp, p)
        fsync_dir(p.parent)
    after = scan_log(p)
    if after.status != "clean" or after.records != keep:
        raise StoreFormatError(f"{p}: repaired log does not verify: {after.describe()}", "log")
    dropped = tuple(range(keep, found.scan.records)) + found.scan.seqs_after
    first = "damaged record" if found.refused is None else "refused batch"
    return Repair(aside, keep, end, found.scan.size - end, dropped, first)


def run_verify(args: argparse.Namespace) -> int:
    """``gnnserve log verify``: exit 0 when clean or torn (start-up drops it), 1 when corrupt
    or when a batch is refused by ``--store``."""
    return 1 if verify(args.log, args.store).bad else 0


def run_repair(args: argparse.Namespace) -> int:
    """``gnnserve log repair``: only with ``--keep-good-prefix``, which says what is lost."""
    if not args.keep_good_prefix:
        store = f" --store {args.store}" if args.store else ""
        raise InvalidInputError(
            "repair drops everything after the first damaged record or refused batch; say so "
            f"with --keep-good-prefix (see `gnnserve log verify {args.log}{store}` first)",
            "keep_good_prefix",
        )
    done = repair(args.log, args.store, report=True)
    if done.aside is None:
        print("nothing to repair")
        return 0
    seqs = [seq for seq in done.dropped_seqs if seq != done.kept_records]
    valid = f"{len(seqs)} valid records (seq {seqs[0]} to {seqs[-1]})" if seqs else "nothing"
    print(
        f"dropped {done.dropped_bytes} bytes from offset {done.kept_bytes}: the {done.first} "
        f"(seq {done.kept_records}) and {valid} after it"
    )
    kept = (
        f"(seq 0 to {done.kept_records - 1})"
        if done.kept_records
        else "(start-up writes a new header)"
    )
    print(f"kept {done.kept_records} records {kept} in {args.log}")
    print(f"damaged file kept as {done.aside}")
    return 0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``verify`` and ``repair`` sub-commands of ``gnnserve log``."""
    sub = parser.add_subparsers(dest="log_command", required=True)
    store_help = (
        "the store the log's server serves: replay every batch against it as serve's start-up "
        "does (without it, only the records' checksums and order are checked)"
    )
    p = sub.add_parser("verify", help="check an update log: clean, torn tail or corrupt")
    p.add_argument("log", help="update log file (serve --update-log)")
    p.add_argument("--store", default=None, help=store_help)
    p.set_defaults(func=run_verify)
    p = sub.add_parser("repair", help="keep the good prefix of a damaged update log")
    p.add_argument("log", help="update log file (serve --update-log)")
    p.add_argument("--store", default=None, help=store_help)
    p.add_argument(
        "--keep-good-prefix",
        action="store_true",
        help="required: keep the records before the damage (or the first batch --store "
        "refuses), drop the rest (the damaged file is kept as LOG.corrupt-<UTC time>)",
    )
    p.set_defaults(func=run_repair)
