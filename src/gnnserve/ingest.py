"""``gnnserve ingest FILE|-``: stream graph updates from an Arrow or CSV file to a server.

The rows (``dynamic.bulk``: columns op, src, dst, node, features; CSV with f0.. feature columns)
are sent ``--batch-rows`` at a time as Arrow IPC streams to ``POST /v1/graph/updates``. Each
batch is one all-or-nothing update batch, acknowledged once durable in the server's update log;
batches go one after another, so a refused batch stops the run with every earlier one applied
and none after it. The error names the first rows to fix and the ``--skip-rows`` that resumes
after the acknowledged ones. ``-`` reads an Arrow IPC stream or CSV from standard input.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import NoReturn

import httpx

from gnnserve.dynamic import bulk
from gnnserve.errors import GnnServeError, InvalidInputError

TOKEN_ENV = "GNNSERVE_API_KEY"  # the client's key (the server reads GNNSERVE_API_KEYS)


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Declare the command's options."""
    p.add_argument("file", help="an Arrow IPC (stream or file) or .csv file of updates, or -")
    p.add_argument("--url", default="http://127.0.0.1:8000", help="the server (default :8000)")
    p.add_argument("--batch-rows", type=int, default=10_000, help="rows per update batch")
    p.add_argument("--skip-rows", type=int, default=0, help="rows already applied: skip them")
    p.add_argument("--timeout-s", type=float, default=60.0, help="per-batch HTTP timeout")
    p.add_argument("--quiet", action="store_true", help="no progress lines")


def run(args: argparse.Namespace) -> int:
    """Send the file; 0 when every batch was acknowledged, 2 (with the reason) otherwise."""
    if args.batch_rows < 1 or args.skip_rows < 0:
        raise InvalidInputError("--batch-rows must be >= 1 and --skip-rows >= 0", "batch_rows")
    path, cleanup = _source(args.file)
    try:
        return _send_all(args, path)
    finally:
        if cleanup:
            os.unlink(path)


def _source(name: str) -> tuple[Path, bool]:
    """The file to read (standard input is spooled to a temporary file first)."""
    if name != "-":
        if not Path(name).is_file():
            raise InvalidInputError(f"{name}: no such file", "file")
        return Path(name), False
    data = sys.stdin.buffer.read()
    arrow = data[:6] == b"ARROW1" or data[:4] == b"\xff\xff\xff\xff"
    fd, tmp = tempfile.mkstemp(prefix="gnnserve-ingest-", suffix="" if arrow else ".csv")
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)
    return Path(tmp), True


def _send_all(args: argparse.Namespace, path: Path) -> int:
    headers = {"content-type": bulk.ARROW_STREAM}
    token = os.environ.get(TOKEN_ENV)
    if token:
        headers["authorization"] = f"Bearer {token}"
    url = args.url.rstrip("/") + "/v1/graph/updates"
    done, sent_bytes, start = args.skip_rows, 0, time.perf_counter()
    with httpx.Client(timeout=args.timeout_s) as client:
        for table in bulk.read_file(path, args.batch_rows, args.skip_rows):
            body = bulk.to_stream(table)
            try:
                reply = client.post(url, content=body, headers=headers)
            except httpx.HTTPError as exc:
                _stop(f"{url}: {exc}", done)
            if reply.status_code != 200:
                _stop(_refusal(reply, done), done)
            done, sent_bytes = done + table.num_rows, sent_bytes + len(body)
            if not args.quiet:
                _progress(done - args.skip_rows, sent_bytes, start, reply.json())
    if not args.quiet:
        print(f"ingested {done - args.skip_rows:,} rows", file=sys.stderr)
    return 0


def _progress(rows: int, sent: int, start: float, last: dict) -> None:
    spent = max(time.perf_counter() - start, 1e-9)
    print(
        f"{rows:,} rows acknowledged ({rows / spent:,.0f} rows/s, {sent / spent / 1e6:.1f} MB/s); "
        f"graph version {last.get('graph_version')}",
        file=sys.stderr,
    )


def _refusal(reply: httpx.Response, done: int) -> str:
    """The server's reason, with the refused rows numbered in the file."""
    try:
        body = reply.json()
    except ValueError:
        return f"HTTP {reply.status_code}: {reply.text[:200]}"
    error = body.get("error") if isinstance(body, dict) else None
    error = error if isinstance(error, dict) else {"message": str(error or reply.text[:200])}
    errors = body.get("errors", []) if isinstance(body, dict) else []
    first = [f"row {done + e['index']}: {e['message']}" for e in errors[:5]]
    detail = "; ".join(first) if first else str(error.get("message"))
    return f"HTTP {reply.status_code} ({error.get('kind', 'error')}): {detail}"


def _stop(reason: str, done: int) -> NoReturn:
    raise GnnServeError(
        f"{reason}. Rows before {done:,} were applied and none after; fix the file and resume "
        f"with --skip-rows {done}"
    )
