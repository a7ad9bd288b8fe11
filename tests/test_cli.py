"""The command line end to end: prepare -> train -> serve as a real process -> graceful SIGTERM."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from gnnserve.cli import SERVE_FLAGS, build_parser, config_field, main, serve_config
from gnnserve.config import ServeConfig
from gnnserve.demo import start_server, stop_server, wait_ready
from gnnserve.ports import free_port


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


# Client-side failures of a request that never reached the application at SIGTERM: uvicorn
# closed the listener (ConnectError: refused); closing a connection still in the listen backlog,
# or an idle keep-alive connection whose new request sat unread in its socket, resets it
# (ReadError / WriteError: connection reset); an idle keep-alive connection closed before the
# request was sent ends without a response (RemoteProtocolError). A request the application did
# read shows in the server's counts, so the test tells these apart from lost answers.
NEVER_ACCEPTED = (httpx.ConnectError, httpx.ReadError, httpx.WriteError, httpx.RemoteProtocolError)
STOPPED = re.compile(r"gnnserve: stopped; answered (\d+) of (\d+) requests received \((.*)\)")


def _prepare_and_train(store: Path, ckpt: Path) -> None:
    assert main(["prepare", "sbm", "--nodes", "3000", "--seed", "1", "--out", str(store)]) == 0
    argv = ["train", "--store", str(store), "--arch", "sage", "--layers", "2", "--hidden", "32"]
    assert main([*argv, "--epochs", "1", "--fanouts", "5,5", "--out", str(ckpt)]) == 0


def _load_until_sigterm(base: str, proc: subprocess.Popen[bytes]) -> tuple[list, float]:
    """8 keep-alive clients send 40 requests each; SIGTERM once 20 are answered.

    Returns ([(sent_s, done_s, status code or exception)], SIGTERM time), monotonic seconds.
    """
    outcomes: list[tuple[float, float, object]] = []
    started = threading.Barrier(9)

    def client(k: int) -> None:
        with httpx.Client(timeout=30) as c:
            started.wait()
            for i in range(40):
                sent = time.monotonic()
                try:
                    r = c.post(f"{base}/v1/predict", json={"nodes": [(k * 40 + i) % 3000]})
                    result: object = r.status_code
                except Exception as exc:  # noqa: BLE001 - every outcome is recorded and judged
                    result = exc
                outcomes.append((sent, time.monotonic(), result))

    threads = [threading.Thread(target=client, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    started.wait()
    while len(outcomes) < 20:
        time.sleep(0.005)
    sigterm = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    for t in threads:
        t.join(60)
    return outcomes, sigterm


@pytest.mark.slow
def test_prepare_train_serve_and_graceful_shutdown(tmp_path: Path) -> None:
    store, ckpt = tmp_path / "store", tmp_path / "ckpt"
    _prepare_and_train(store, ckpt)
    port = free_port()
    with (tmp_path / "serve.out").open("wb") as out:
        # 8 one-node requests never fill a batch: each waits 500 ms, so the requests in flight at
        # SIGTERM outlast uvicorn's reaction to it (up to 0.1 s to notice, 0.1 s before draining)
        batching = ["--max-batch-nodes", "64", "--max-wait-ms", "500"]
        proc = start_server(store, ckpt, port, *batching, stdout=out)
    try:
        wait_ready(f"http://127.0.0.1:{port}", proc)
        outcomes, sigterm = _load_until_sigterm(f"http://127.0.0.1:{port}", proc)
        assert proc.wait(60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    # the server's own account: requests its application received, and how each was answered
    text = (tmp_path / "serve.out").read_text()
    found = [m for m in map(STOPPED.fullmatch, text.splitlines()) if m]
    assert len(found) == 1, text
    answered, received, statuses = int(found[0][1]), int(found[0][2]), found[0][3]
    codes = Counter(r for _, _, r in outcomes if isinstance(r, int))
    failed = [r for _, _, r in outcomes if not isinstance(r, int)]
    assert len(outcomes) == 8 * 40
    # answers are predictions or load shedding (429); 503 would mean the engine stopped first
    assert set(codes) <= {200, 429}, codes
    # no timeout, no other error: a request that failed never reached the application ...
    assert all(isinstance(r, NEVER_ACCEPTED) for r in failed), failed
    # ... for every request the application received was answered, and reached its client
    assert answered == received == codes.total(), (found[0][0], codes, failed)
    assert statuses == ", ".join(f"{c}: {n}" for c, n in sorted(codes.items()))
    ok = [(s, d) for s, d, r in outcomes if r == 200]
    assert any(s < sigterm < d for s, d in ok), "no request was in flight at SIGTERM"
    assert failed and len(ok) >= 20, (codes, failed)


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


# The serve flags users know (README, scripts, tests): flag, a value given, the dotted
# ServeConfig key it must set and the value expected there (None: a flag without a value).
SERVE_FLAG_VALUES = [
    ("--store", "s", "store.path", "s"),
    ("--model", "m", "model_path", "m"),
    ("--host", "0.0.0.0", "server.host", "0.0.0.0"),
    ("--port", "9001", "server.port", 9001),
    ("--grpc-port", "9002", "server.grpc_port", 9002),
    ("--workers", "3", "server.workers", 3),
    ("--name", "sage", "server.model_name", "sage"),
    ("--fanouts", "7,-1", "sampler.fanouts", [7, -1]),
    ("--graph-backend", "mmap", "store.graph_backend", "mmap"),
    ("--feature-backend", "mmap", "store.feature_backend", "mmap"),
    ("--max-batch-nodes", "64", "batcher.max_batch_nodes", 64),
    ("--max-wait-ms", "2.5", "batcher.max_wait_ms", 2.5),
    ("--max-queue", "17", "admission.max_queue_requests", 17),
    ("--max-queue-delay-ms", "50", "admission.max_queue_delay_ms", 50.0),
    ("--timeout-s", "1.5", "admission.timeout_s", 1.5),
    ("--max-nodes", "9", "admission.max_nodes_per_request", 9),
    ("--torch-threads", "2", "compute.torch_threads", 2),
    ("--kernel-threads", "1", "compute.kernel_threads", 1),
    ("--device", "cuda", "compute.device", "cuda"),
    ("--no-warm-up", None, "compute.warm_up", False),
    ("--update-log", "u.log", "store.update_log", "u.log"),
    ("--fsync", "never", "store.fsync", "never"),
    ("--presample", None, "sampler.presample", True),
    ("--routing", "throughput", "sampler.routing", "throughput"),
    ("--calibration", "c.json", "sampler.calibration", "c.json"),
    ("--latency-slo-ms", "10", "batcher.latency_slo_ms", 10.0),
    ("--psgs-bound", "loose", "batcher.psgs_bound", "loose"),
    ("--pipelines", "3", "batcher.pipelines", 3),
    ("--tiers", "ram=1G", "store.tiers", "ram=1G"),
    ("--tier-refresh-s", "60", "store.tier_refresh_s", 60.0),
    ("--feature-servers", "3", "store.feature_servers", 3),
    ("--feature-server-share", "0.4", "store.feature_server_share", 0.4),
    ("--embeddings", "pes", "embeddings.path", "pes"),
    ("--embeddings-backend", "mmap", "embeddings.backend", "mmap"),
    ("--new-node-mode", "ns", "embeddings.mode", "ns"),
    ("--gamma", "0.25", "embeddings.gamma", 0.25),
    ("--policy", "importance", "embeddings.policy", "importance"),
    ("--max-new-nodes", "5", "embeddings.max_new_nodes", 5),
    ("--max-body-bytes", "4096", "server.max_body_bytes", 4096),
    ("--api-keys", "keys.txt", "server.api_keys", "keys.txt"),
    ("--insecure", None, "server.insecure", True),
    ("--deploy", "dgs", "deploy.mode", "dgs"),
    ("--deploy-workers", "3", "deploy.workers", 3),
    ("--deploy-threads", "4", "deploy.threads_per_worker", 4),
    ("--remote", "s3://b/p", "deploy.remote", "s3://b/p"),
    ("--memory-mb", "512", "deploy.memory_mb", 512),
    ("--sample-memory-mb", "384", "deploy.sample_memory_mb", 384),
    ("--keep-alive-s", "30", "deploy.keep_alive_s", 30.0),
    ("--scheduler", "naive", "deploy.scheduler", "naive"),
    ("--fetch", "full", "deploy.fetch", "full"),
    ("--no-cache", None, "deploy.cache", False),
    ("--max-instances", "4", "deploy.max_instances", 4),
    ("--min-instances", "1", "deploy.min_instances", 1),
    ("--launch", "fork", "deploy.launch", "fork"),
    ("--mb-per-cpu", "0", "deploy.mb_per_cpu", 0.0),
    ("--cpu-budget", "8", "deploy.cpu_budget", 8.0),
    ("--nodes", "nodes.yaml", "deploy.nodes", "nodes.yaml"),
    ("--fog-mode", "strawman", "deploy.fog_mode", "strawman"),
    ("--fog-codec", "column", "deploy.fog_codec", "column"),
    ("--fog-accuracy-budget", "0.5", "deploy.fog_accuracy_budget", 0.5),
    ("--fog-gateways", "/tmp/plan", "deploy.fog_gateways", "/tmp/plan"),
    ("--reprofile", None, "deploy.fog_reprofile", True),
    ("--no-pe-refresh", None, "embeddings.refresh", False),
    ("--pe-staleness", "3", "embeddings.pe_staleness", 3),
    ("--result-cache", "64", "compute.result_cache_mb", 64.0),
]


def _at(tree: dict[str, Any], dotted: str) -> tuple[dict[str, Any], str]:
    *sections, leaf = dotted.split(".")
    for name in sections:
        tree = tree[name]
    return tree, leaf


@pytest.mark.parametrize(("flag", "value", "dotted", "want"), SERVE_FLAG_VALUES)
def test_each_serve_flag_sets_its_config_field_only(flag, value, dotted, want) -> None:
    argv = ["serve", flag] if value is None else ["serve", flag, value]
    got = serve_config(build_parser().parse_args(argv)).model_dump()
    expected = ServeConfig().model_dump()
    section, leaf = _at(expected, dotted)
    assert section[leaf] != want  # the value given is not the default
    section[leaf] = want
    assert got == expected
    section, leaf = _at(got, dotted)
    assert type(section[leaf]) is type(want)


def test_every_flag_of_the_table_is_covered() -> None:
    assert sorted(SERVE_FLAGS) == sorted((f, d) for f, _, d, _ in SERVE_FLAG_VALUES)


def _flat(text: str) -> str:
    return re.sub(r"-\s+", "-", " ".join(text.split()))


def test_serve_help_lists_each_flag_once_with_its_field_description(capsys) -> None:
    with pytest.raises(SystemExit) as info:
        main(["serve", "--help"])
    assert info.value.code == 0
    text = capsys.readouterr().out
    options = Counter(re.findall(r"^  (-[-\w]+)", text, flags=re.MULTILINE))
    assert options == Counter(["-h", "--config"] + [flag for flag, _ in SERVE_FLAGS])
    flat = _flat(text)  # argparse wraps lines, also after a hyphen ("start-" / "up")
    for _, dotted in SERVE_FLAGS:
        description = config_field(dotted).description
        assert description and f"{_flat(description)} [{dotted}" in flat


def test_flags_not_given_leave_the_yaml_alone(tmp_path: Path) -> None:
    path = tmp_path / "serve.yaml"
    path.write_text("sampler: {fanouts: [5, 5]}\ncompute: {warm_up: false}\nserver: {port: 9000}\n")
    args = build_parser().parse_args(["serve", "--config", str(path), "--port", "1"])
    c = serve_config(args)
    assert (c.sampler.fanouts, c.compute.warm_up, c.server.port) == ([5, 5], False, 1)


def test_bad_flag_values_exit_2_naming_the_flag(capsys) -> None:
    assert main(["serve", "--fanouts", "25;10"]) == 2
    assert "--fanouts must be comma-separated ints" in capsys.readouterr().err
    assert main(["serve", "--deploy-workers", "0"]) == 2
    assert "deploy.workers" in capsys.readouterr().err
    with pytest.raises(SystemExit) as info:  # a Literal field offers its choices
        main(["serve", "--policy", "best"])
    assert info.value.code == 2
    assert "query_edges_ratio" in capsys.readouterr().err


def test_negative_fanouts_may_follow_the_flag_after_a_space(capsys, tmp_path: Path) -> None:
    """``--fanouts -1,-1`` as faas's own message writes it: serve, train and faas profile take
    it (serve then stops at the missing store, not at argparse)."""
    absent = str(tmp_path / "absent")
    assert main(["serve", "--store", absent, "--model", absent, "--fanouts", "-1,-1"]) == 2
    assert "meta.json missing" in capsys.readouterr().err
    for words in (
        ["train", "--store", "s", "--out", "o", "--fanouts", "-1,-1", "--eval-fanouts", "-1, 5"],
        ["faas", "profile", "--remote", "s", "--model", "m", "--fanouts", "-1,-1"],
    ):
        args, unknown = build_parser(words[0]).parse_known_args(_joined(words))
        assert args.fanouts == "-1,-1" and unknown == [], words
    assert _joined(["--fanouts", "-1,-1", "--seed", "-5"])[-1] == "-5"  # only list flags


def _joined(words: list[str]) -> list[str]:
    from gnnserve.cli import _negative_lists_joined

    return _negative_lists_joined(words)


def test_an_unknown_flag_shows_the_commands_usage_and_help_shows_defaults(capsys) -> None:
    with pytest.raises(SystemExit) as info:
        main(["serve", "--bogus-flag"])
    err = capsys.readouterr().err
    assert info.value.code == 2 and err.startswith("usage: gnnserve serve")
    assert "unrecognized arguments: --bogus-flag" in err
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    out = capsys.readouterr().out
    assert "architecture (default: sage)" in out and "(default: 512)" in out


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


def test_publish_command_to_a_directory_and_refusal(
    small_store: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import json

    out = tmp_path / "pub"
    assert main(["publish", "--store", str(small_store), "--to", out.as_uri()]) == 0
    report = json.loads(capsys.readouterr().out)
    assert sorted(report["files"]) == sorted(p.name for p in out.iterdir())
    for name in report["files"][:-2]:
        assert (out / name).read_bytes() == (small_store / name).read_bytes()
    assert main(["publish", "--store", str(small_store), "--to", str(out)]) == 2
    assert "not empty" in capsys.readouterr().err
    assert main(["publish", "--store", str(small_store), "--to", str(out), "--overwrite"]) == 0


@pytest.mark.distributed
def test_publish_command_to_s3_reads_the_aws_environment(
    object_store: Any,
    small_store: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    import json

    from gnnserve.data.blobs import open_blobs

    for key, value in object_store.env().items():
        monkeypatch.setenv(key, value)
    url = f"s3://{object_store.bucket}/cli/small"
    assert main(["publish", "--store", str(small_store), "--to", url]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["url"] == url and report["files"][-1] == "meta.json"
    blobs = open_blobs(url, object_store.options())
    for name in report["files"][:-2]:
        assert blobs.get(name) == (small_store / name).read_bytes()
    assert main(["publish", "--store", str(small_store), "--to", "s3://Bad_Bucket/x"]) == 2
    assert "bucket name" in capsys.readouterr().err


@pytest.mark.distributed
def test_objstore_command_serves_until_sigterm(tmp_path: Path) -> None:
    import os

    from gnnserve.data.blobs import open_blobs

    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gnnserve.cli",
            "objstore",
            "--dir",
            str(tmp_path),
            "--bucket",
            "cli",
        ],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline()
        assert re.match(r"SeaweedFS S3 endpoint http://127\.0\.0\.1:\d+, bucket cli", first)
        lines = [proc.stdout.readline() for _ in range(4)]
        env = dict(line.removeprefix("export ").strip().split("=", 1) for line in lines)
        assert set(env) == {
            "AWS_ENDPOINT_URL",
            "AWS_ACCESS_KEY_ID",
            "AWS_SECRET_ACCESS_KEY",
            "AWS_REGION",
        }
        options = {
            "endpoint": env["AWS_ENDPOINT_URL"],
            "access_key_id": env["AWS_ACCESS_KEY_ID"],
            "secret_access_key": env["AWS_SECRET_ACCESS_KEY"],
        }
        blobs = open_blobs("s3://cli/x", options)
        blobs.put("a", b"1")
        assert blobs.get("a") == b"1"
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
    from gnnserve.errors import StoreFormatError

    with pytest.raises(StoreFormatError, match=env["AWS_ENDPOINT_URL"]):  # weed went with it
        open_blobs("s3://cli/x", options).size("a")


def test_calibrate_command_writes_the_profile_and_plot(
    small_store: Path, small_ckpt: Path, tmp_path: Path, capsys
) -> None:
    from gnnserve.graph import open_graph_store
    from gnnserve.models.checkpoint import load_checkpoint
    from gnnserve.sampling.calibrate import POINTS, Identity, load_profile

    out = tmp_path / "cal.json"
    argv = ["calibrate", "--store", str(small_store), "--model", str(small_ckpt)]
    small = ["--fanouts", "4,4", "--buckets", "3", "--runs", "2", "--max-seeds", "32"]
    assert main([*argv, *small, "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "bucket 3/3" in text and f"calibration profile {out}" in text
    identity = Identity.here(
        load_checkpoint(small_ckpt).version, open_graph_store(small_store).version, [4, 4]
    )
    profile = load_profile(out, identity)
    for name in POINTS:
        assert f"{name}: PSGS {profile.points[name]:.0f}" in text
    assert out.with_suffix(".png").read_bytes()[:4] == b"\x89PNG"
    assert main([*argv, "--runs", "0"]) == 2  # refused before any work
    assert "--runs" in capsys.readouterr().err
    assert main([*argv, "--fanouts", "4", "--out", str(out)]) == 2  # 1 hop for 2 layers
    assert "fanouts" in capsys.readouterr().err


LIGHT_CHECK = """
import json, sys
from gnnserve.cli import main
try:
    code = main(sys.argv[1:])
except SystemExit as exc:
    code = exc.code
heavy = sorted({"torch", "numba", "ray", "gnnserve.engine"} & set(sys.modules))
print(json.dumps({"code": code, "heavy": heavy}))
"""


@pytest.mark.parametrize(
    "argv",
    [
        ["--help"],
        ["--version"],
        ["serve", "--help"],
        ["objstore", "--help"],
        ["log", "verify", "{log}"],
        ["publish", "--store", "{store}", "--to", "{out}"],
    ],
)
def test_light_commands_start_without_torch(argv, small_store: Path, tmp_path: Path) -> None:
    (tmp_path / "u.log").write_bytes(b"")
    where = {"log": str(tmp_path / "u.log"), "store": str(small_store), "out": str(tmp_path / "o")}
    words = [a.format(**where) for a in argv]
    done = subprocess.run(
        [sys.executable, "-c", LIGHT_CHECK, *words], capture_output=True, text=True, timeout=120
    )
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result == {"code": 0, "heavy": []}, done.stderr[-2000:]


def test_only_the_command_given_is_configured() -> None:
    from gnnserve.cli import COMMANDS

    parser = build_parser("log")
    assert parser.parse_args(["log", "verify", "x"]).log_command == "verify"
    with pytest.raises(SystemExit):  # another command's arguments were never declared
        parser.parse_args(["publish", "--store", "s", "--to", "t"])
    assert set(COMMANDS) == set(build_parser()._subparsers._group_actions[0].choices)  # type: ignore[union-attr]


def test_deploy_help_names_every_registered_mode(capsys) -> None:
    from gnnserve.engine.executor import EXECUTORS

    with pytest.raises(SystemExit):
        main(["serve", "--help"])
    flat = " ".join(capsys.readouterr().out.split())
    listed = flat[flat.index("--deploy DEPLOY") :].split("[deploy.mode")[0]
    assert all(f" {name} " in listed.replace("|", " ") for name in EXECUTORS.names())


def test_repeated_model_flags_name_each_model(capsys) -> None:
    def config(*argv: str) -> ServeConfig:
        return serve_config(build_parser().parse_args(["serve", *argv]))

    c = config("--model", "ckpt/sage", "--model", "gat=ckpt/gat", "--model=b=ckpt/x=y")
    assert (c.model_path, c.server.model_name) == ("ckpt/sage", "default")
    assert c.models == {"gat": "ckpt/gat", "b": "ckpt/x=y"}
    c = config("--model", "sage=ckpt/sage")  # the first may be named: --name's place
    assert (c.model_path, c.server.model_name, c.models) == ("ckpt/sage", "sage", {})
    assert config("--model", "ckpt/a=b").model_path == "ckpt/a=b"  # a path, not a name
    refused = [
        (["--model", "a", "--model", "b"], "each model after the first is NAME=CKPT"),
        (["--model", "x=a", "--model", "x=b"], "names 'x' twice"),
        (["--model", "x=a", "--name", "y"], "name the same model twice"),
    ]
    for argv, message in refused:
        assert main(["serve", *argv]) == 2
        err = capsys.readouterr().err
        assert message in err and "--model" in err, err


def test_a_taken_grpc_port_exits_2_before_loading(capsys, tmp_path: Path) -> None:
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        argv = ["serve", "--store", str(tmp_path / "none"), "--grpc-port", str(port)]
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert f"--grpc-port {port}: cannot listen on 127.0.0.1:{port}" in err, err
    assert main(["serve", "--port", "9100", "--grpc-port", "9100"]) == 2
    assert "is --port too" in capsys.readouterr().err
