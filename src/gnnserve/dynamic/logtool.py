"""``gnnserve log verify|repair``: inspect an update log, and recover from a corrupt one.

``verify LOG`` prints the good records, the last seq and the status (clean / torn tail / corrupt
at an offset); exit code 0 for clean or a torn tail (start-up drops it), 1 for corruption.

``repair LOG --keep-good-prefix`` keeps the records before the damage and drops everything after
it, including any valid records there (they are listed): it hard-links the damaged file to
``LOG.corrupt-<UTC time>`` (kept, never deleted), writes the good prefix to a temporary file,
fsyncs it and renames it over ``LOG``, then fsyncs the directory -- so at every moment ``LOG`` is
either the damaged log or the repaired one. Stop the server that writes the log first.
"""

from __future__ import annotations

import argparse
import os
import time
from dataclasses import dataclass
from pathlib import Path

from gnnserve.dynamic.wal import LogScan, fsync_dir, scan_log
from gnnserve.errors import InvalidInputError, StoreFormatError

_CHUNK = 1 << 20


def _open_scan(path: Path) -> LogScan:
    if not path.is_file():
        raise StoreFormatError(f"update log {path} not found", "log")
    return scan_log(path)


def _summary(scan: LogScan) -> str:
    seqs = f" (seq 0 to {scan.last_seq})" if scan.records else ""
    return f"{scan.path}: {scan.records} good records{seqs}, {scan.good_end} of {scan.size} bytes"


def verify(path: str | Path) -> LogScan:
    """Scan ``path`` and print what was found."""
    scan = _open_scan(Path(path))
    print(_summary(scan))
    print(f"last seq: {scan.last_seq}")
    print(f"status: {scan.describe()}")
    return scan


@dataclass(frozen=True)
class Repair:
    """What ``repair`` did (sizes in bytes)."""

    aside: Path | None  # where the damaged file went; None when the log was clean
    kept_records: int
    dropped_bytes: int
    dropped_seqs: tuple[int, ...]  # seqs of the valid records dropped after the damage


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


def repair(path: str | Path) -> Repair:
    """Keep the good prefix of ``path``, moving the damaged file aside (see module doc)."""
    p = Path(path)
    scan = _open_scan(p)
    if scan.status == "clean":
        return Repair(None, scan.records, 0, ())
    aside = _aside_name(p)
    tmp = p.with_name(f".{p.name}.repair-{os.getpid()}")
    _write_prefix(p, tmp, scan.good_end)
    try:
        os.link(p, aside)  # LOG stays in place until the repaired file replaces it
    except OSError:
        os.rename(p, aside)  # a file system without hard links
    os.replace(tmp, p)
    fsync_dir(p.parent)
    after = scan_log(p)
    if after.status != "clean" or after.records != scan.records:
        raise StoreFormatError(f"{p}: repaired log does not verify: {after.describe()}", "log")
    return Repair(aside, scan.records, scan.tail_bytes, scan.seqs_after)


def run_verify(args: argparse.Namespace) -> int:
    """``gnnserve log verify``: exit 0 when clean or torn (start-up drops it), 1 when corrupt."""
    return 1 if verify(args.log).status == "corrupt" else 0


def run_repair(args: argparse.Namespace) -> int:
    """``gnnserve log repair``: only with ``--keep-good-prefix``, which says what is lost."""
    if not args.keep_good_prefix:
        raise InvalidInputError(
            "repair drops everything after the first damaged record; say so with "
            f"--keep-good-prefix (see `gnnserve log verify {args.log}` first)",
            "keep_good_prefix",
        )
    scan = verify(args.log)
    done = repair(args.log)
    if done.aside is None:
        print("nothing to repair")
        return 0
    seqs = done.dropped_seqs
    valid = f"{len(seqs)} valid records (seq {seqs[0]} to {seqs[-1]})" if seqs else "nothing"
    print(
        f"dropped {done.dropped_bytes} bytes from offset {scan.good_end}: the damaged record "
        f"(seq {scan.last_seq + 1}) and {valid} after it"
    )
    kept = f"(seq 0 to {scan.last_seq})" if done.kept_records else "(start-up writes a new header)"
    print(f"kept {done.kept_records} records {kept} in {args.log}")
    print(f"damaged file kept as {done.aside}")
    return 0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``verify`` and ``repair`` sub-commands of ``gnnserve log``."""
    sub = parser.add_subparsers(dest="log_command", required=True)
    p = sub.add_parser("verify", help="check an update log: clean, torn tail or corrupt")
    p.add_argument("log", help="update log file (serve --update-log)")
    p.set_defaults(func=run_verify)
    p = sub.add_parser("repair", help="keep the good prefix of a damaged update log")
    p.add_argument("log", help="update log file (serve --update-log)")
    p.add_argument(
        "--keep-good-prefix",
        action="store_true",
        help="required: keep the records before the damage, drop the rest (the damaged file "
        "is kept as LOG.corrupt-<UTC time>)",
    )
    p.set_defaults(func=run_repair)
