"""The command line end to end: prepare -> train -> serve as a real process -> graceful SIGTERM."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
from pathlib import Path

import httpx
import numpy as np
import pytest

from gnnserve.cli import build_parser, main, serve_config
from gnnserve.demo import free_port, start_server, stop_server, wait_ready


def test_prepare_rejects_bad_input_with_a_message(tmp_path: Path, capsys) -> None:
    edges = tmp_path / "e.csv"
    edges.write_text("0,1\n1,7\n")
    np.save(tmp_path / "x.npy", np.zeros((3, 2), np.float32))
    code = main(
        [
            "prepare",
            "csv",
            "--edges",
            str(edges),
            "--features",
            str(tmp_path / "x.npy"),
            "--out",
            str(tmp_path / "s"),
        ]
    )
    assert code == 2
    assert "7" in capsys.readouterr().err


@pytest.mark.slow
def test_prepare_train_serve_and_graceful_shutdown(tmp_path: Path) -> None:
    store, ckpt = tmp_path / "store", tmp_path / "ckpt"
    assert main(["prepare", "sbm", "--nodes", "3000", "--seed", "1", "--out", str(store)]) == 0
    assert (
        main(
            [
                "train",
                "--store",
                str(store),
                "--arch",
                "sage",
                "--layers",
                "2",
                "--hidden",
                "32",
                "--epochs",
                "1",
                "--fanouts",
                "5,5",
                "--out",
                str(ckpt),
            ]
        )
        == 0
    )
    port = free_port()
    proc = start_server(store, ckpt, port, "--max-batch-nodes", "8")
    base = f"http://127.0.0.1:{port}"
    outcomes: list[object] = []
    try:
        wait_ready(base, proc)
        started = threading.Barrier(9)

        def client(k: int) -> None:
            with httpx.Client(timeout=30) as c:
                started.wait()
                for i in range(40):
                    try:
                        outcomes.append(
                            c.post(
                                f"{base}/v1/predict", json={"nodes": [(k * 40 + i) % 3000]}
                            ).status_code
                        )
                    except httpx.ConnectError:
                        outcomes.append("refused")  # after shutdown began: never accepted
                        return

        threads = [threading.Thread(target=client, args=(k,)) for k in range(8)]
        for t in threads:
            t.start()
        started.wait()
        while len(outcomes) < 20:
            threading.Event().wait(0.01)
        proc.send_signal(signal.SIGTERM)
        for t in threads:
            t.join(60)
        assert proc.wait(60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    codes = [o for o in outcomes if o != "refused"]
    assert len(codes) >= 20 and all(c == 200 for c in codes), outcomes


def test_console_script_help() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "gnnserve.cli", "--help"], capture_output=True, text=True, check=True
    ).stdout
    for command in ("prepare", "train", "serve", "bench", "demo"):
        assert command in out


def test_serve_flags_map_to_the_embeddings_config() -> None:
    args = build_parser().parse_args(
        ["serve", "--store", "s", "--model", "m", "--embeddings", "pes", "--gamma", "0.3"]
        + ["--policy", "random", "--new-node-mode", "full", "--embeddings-backend", "mmap"]
        + ["--max-new-nodes", "7"]
    )
    emb = serve_config(args).embeddings
    assert (emb.path, emb.gamma, emb.policy, emb.mode) == ("pes", 0.3, "random", "full")
    assert (emb.backend, emb.max_new_nodes) == ("mmap", 7)
    defaults = serve_config(build_parser().parse_args(["serve"])).embeddings
    assert (defaults.path, defaults.gamma, defaults.mode) == ("", 0.1, "srpe")


def test_serve_rejects_bad_new_node_flags(capsys) -> None:
    assert main(["serve", "--store", "s", "--model", "m", "--gamma", "2"]) == 2
    assert "embeddings.gamma" in capsys.readouterr().err


@pytest.mark.slow
def test_precompute_then_serve_new_nodes(small_store: Path, small_ckpt: Path, tmp_path) -> None:
    pes = tmp_path / "pes"
    argv = ["precompute", "--store", str(small_store), "--model", str(small_ckpt)]
    assert main([*argv, "--out", str(pes), "--no-progress"]) == 0
    port = free_port()
    flags = ["--embeddings", str(pes), "--new-node-mode", "srpe", "--gamma", "1"]
    proc = start_server(small_store, small_ckpt, port, *flags, "--policy", "random")
    base = f"http://127.0.0.1:{port}"
    try:
        wait_ready(base, proc)
        new_nodes = {"features": [[0.1] * 16, [0.2] * 16], "edges": [[0, 3], [1, 4], [1, 3]]}
        r = httpx.post(f"{base}/v1/predict", json={"new_nodes": new_nodes}, timeout=30)
        assert r.status_code == 200, r.text
        body = r.json()
        assert (body["mode"], body["gamma"], body["policy"]) == ("srpe", 1.0, "random")
        assert body["num_candidates"] == body["recomputed"] == 2
        assert len(body["predictions"]) == 2
    finally:
        assert stop_server(proc) == 0
