"""bench/fog.py's ``quantizer`` section: the upload codecs' bytes and accuracy per kind of
readings, without the testbed (the bytes are the devices' own blobs; the answers a full-graph
forward on what the fogs would decode).

Per graph (binary, Gaussian, time-series readings) and trained 2-layer GCN: float32's test
accuracy; then for the column codec chosen by a 0.1-point budget of changed answers
(``deploy/fog/quantizer.py``), for every rung of its ladder, for Fograph's DAQ widths and for
lossless: bytes as four fogs' device groups send them (4 fogs x 4 chunks, headers included)
against raw float32, answers changed (percent of all vertices), and test accuracy.
"""

from __future__ import annotations

import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fog_data import KINDS, BenchGraph, load, model
from gnnserve.deploy.fog.quantizer import (
    FLOAT32_DAQ_BITS,
    LADDER,
    choose_widths,
    full_graph_answers,
    graph_edges,
)
from gnnserve.deploy.fog.upload import HEADER, UNPACKERS, codec_id, encode_round
from gnnserve.features.column_codec import column_bits
from gnnserve.features.quantize import DaqConfig, bits_per_vertex
from gnnserve.models.zoo import GNN

FOGS, CHUNKS = 4, 4
GRAPHS = ("facebook_pagepage", "fb100_cornell5", "sbm20k", "sbm20k_ts")
BUDGET_PTS = 0.1


def uploaded(x: np.ndarray, bits: np.ndarray, codec: str) -> tuple[int, np.ndarray]:
    """(bytes on the wire, what the fogs decode) for ``x`` sent by FOGS device groups over
    contiguous vertex ranges, CHUNKS chunks each, decoded chunk by chunk as the receivers do."""
    sent, seen = 0, np.empty_like(x)
    unpack = UNPACKERS[codec_id(codec)]
    bounds = np.linspace(0, x.shape[0], FOGS + 1).astype(int)
    for lo, hi in zip(bounds[:-1], bounds[1:], strict=True):
        for chunk in encode_round(1, x[lo:hi], bits[lo:hi], CHUNKS, int(lo), codec):
            sent += len(chunk)
            start, rows = HEADER.unpack_from(chunk)[5:7]
            seen[start : start + rows] = unpack(chunk[HEADER.size :])
    return sent, seen


def _arm(
    bench: BenchGraph, gnn: GNN, edges: torch.Tensor, bits: np.ndarray, codec: str,
    full: np.ndarray,
) -> dict:  # fmt: skip
    sent, seen = uploaded(bench.x, bits, codec)
    answers = full_graph_answers(gnn, edges, seen)
    row: dict[str, Any] = {
        "bytes": sent,
        "raw_bytes": int(bench.x.nbytes),
        "ratio": bench.x.nbytes / sent,
        "changed_pts": 100.0 * float(np.mean(answers != full)),
        "max_abs_error": float(np.abs(seen - bench.x).max()),
    }
    if bench.y is not None and bench.test is not None:
        row["test_accuracy"] = float(np.mean(answers[bench.test] == bench.y[bench.test]))
    return row


def run_graph(name: str, work: Path) -> dict[str, Any]:
    """Every codec arm on one graph."""
    bench = load(name, work)
    gnn, trained = model(bench, "gcn", work)
    indptr, indices = bench.graph.csr()
    degrees = np.diff(indptr)
    edges = graph_edges(indptr, indices)
    full = full_graph_answers(gnn, edges, bench.x)
    out: dict[str, Any] = {"graph": name, "readings": KINDS[name], "trained_test_acc": trained}
    if bench.y is not None and bench.test is not None:
        out["float32_test_accuracy"] = float(np.mean(full[bench.test] == bench.y[bench.test]))
    t0 = time.perf_counter()
    rows = -(-bench.x.shape[0] // (FOGS * CHUNKS))  # the blobs the devices send
    choice = choose_widths(gnn, indptr, indices, bench.x, BUDGET_PTS, chunk_rows=rows)
    out["choice"] = {
        "widths": choice.widths,
        "took_s": time.perf_counter() - t0,
        "trials": [asdict(t) for t in choice.trials],
    }
    out["ladder"] = {
        str(w): _arm(bench, gnn, edges, column_bits(degrees, w), "column", full) for w in LADDER
    }
    daq = bits_per_vertex(degrees, DaqConfig.for_degrees(degrees, FLOAT32_DAQ_BITS))
    out["daq"] = _arm(bench, gnn, edges, daq, "daq", full)
    out["lossless"] = _arm(bench, gnn, edges, np.full(degrees.size, 32, np.uint8), "daq", full)
    chosen = out["ladder"][str(choice.widths)] if choice.widths else out["lossless"]
    out["chosen"] = chosen
    print(
        f"[fog] quantizer {name} ({KINDS[name]}): chose {choice.widths}: "
        f"{chosen['ratio']:.2f}x, {chosen['changed_pts']:.3f}% answers changed; "
        f"daq {out['daq']['ratio']:.2f}x, {out['daq']['changed_pts']:.3f}%; "
        f"lossless {out['lossless']['ratio']:.2f}x",
        flush=True,
    )
    return out


def run_quantizer(work: Path, graphs: tuple[str, ...] = GRAPHS) -> list[dict[str, Any]]:
    """The section's rows, one per graph."""
    return [run_graph(name, work) for name in graphs]
