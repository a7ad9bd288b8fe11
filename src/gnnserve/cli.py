"""The ``gnnserve`` command: prepare | train | precompute | serve | bench | demo | log."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import signal
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from gnnserve.errors import GnnServeError

if TYPE_CHECKING:
    from gnnserve.config import ServeConfig


def _serve_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--store", help="store directory (gnnserve prepare)")
    p.add_argument("--model", help="checkpoint directory (gnnserve train)")
    p.add_argument("--config", help="YAML ServeConfig; flags override it")
    p.add_argument("--host", default=None, help="bind address (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=None, help="port (default 8000; 0 = any free)")
    p.add_argument("--name", default=None, help="model name in the API (default 'default')")
    p.add_argument("--fanouts", default=None, help="per-hop fanouts, e.g. 25,10 (-1 = all)")
    p.add_argument("--graph-backend", default=None, help="memory | mmap")
    p.add_argument("--feature-backend", default=None, help="memory | mmap")
    p.add_argument("--max-batch-nodes", type=int, default=None, help="seed nodes per batch")
    p.add_argument("--max-wait-ms", type=float, default=None, help="batching wait (0 = greedy)")
    p.add_argument("--max-queue", type=int, default=None, help="in-flight requests before 429")
    p.add_argument(
        "--max-queue-delay-ms",
        type=float,
        default=None,
        help="429 when the work ahead of a request is predicted to take longer (default 200)",
    )
    p.add_argument("--timeout-s", type=float, default=None, help="request deadline (default 30)")
    p.add_argument("--max-nodes", type=int, default=None, help="nodes per request before 413")
    p.add_argument("--torch-threads", type=int, default=None, help="torch threads (default 1)")
    p.add_argument(
        "--no-warm-up",
        dest="warm_up",
        action="store_false",
        default=None,
        help="report ready at once, without running the request path first (the first "
        "requests then compile the kernels)",
    )
    p.add_argument(
        "--update-log",
        default=None,
        help="accept graph updates, logged here (replayed at start-up if it exists)",
    )
    p.add_argument("--fsync", choices=["always", "never"], default=None, help="update log fsync")
    p.add_argument(
        "--presample",
        action="store_true",
        default=None,
        help="DGS pre-sampling: keep reservoirs for --fanouts, updated on every graph update",
    )
    p.add_argument(
        "--embeddings",
        default=None,
        help="precomputed embeddings for new-node requests (gnnserve precompute); default: "
        "<store>/embeddings/<model name> when it exists",
    )
    p.add_argument("--embeddings-backend", default=None, help="memory | mmap")
    p.add_argument(
        "--new-node-mode", default=None, help="default new-node mode: srpe | full | ns | pe"
    )
    p.add_argument("--gamma", type=float, default=None, help="default SRPE gamma in [0, 1]")
    p.add_argument(
        "--policy",
        default=None,
        help="default SRPE policy: query_edges_ratio | importance | random | oracle",
    )
    p.add_argument("--max-new-nodes", type=int, default=None, help="new nodes per request")
    p.add_argument(
        "--max-body-bytes",
        type=int,
        default=None,
        help="request bodies above this get 413 (default: 16 MiB + 32 B x max new nodes x width)",
    )
    p.add_argument(
        "--api-keys",
        default=None,
        help="file of API keys, '<read|write|read,write> <token>' per line (or set "
        "GNNSERVE_API_KEYS); every endpoint but /v2/health/* then needs a bearer token",
    )
    p.add_argument(
        "--insecure",
        action="store_true",
        default=None,
        help="allow a non-loopback --host without API keys (anyone reaching it may update)",
    )


def serve_config(args: argparse.Namespace) -> ServeConfig:
    """The ServeConfig of ``gnnserve serve``: ``--config`` YAML, then the flags given."""
    from gnnserve.config import ServeConfig
    from gnnserve.fanouts import parse_fanouts

    return ServeConfig.load(
        args.config,
        **{
            "store.path": args.store,
            "model_path": args.model,
            "server.host": args.host,
            "server.port": args.port,
            "server.model_name": args.name,
            "sampler.fanouts": parse_fanouts(args.fanouts),
            "store.graph_backend": args.graph_backend,
            "store.feature_backend": args.feature_backend,
            "batcher.max_batch_nodes": args.max_batch_nodes,
            "batcher.max_wait_ms": args.max_wait_ms,
            "admission.max_queue_requests": args.max_queue,
            "admission.max_queue_delay_ms": args.max_queue_delay_ms,
            "admission.timeout_s": args.timeout_s,
            "admission.max_nodes_per_request": args.max_nodes,
            "compute.torch_threads": args.torch_threads,
            "compute.warm_up": args.warm_up,
            "store.update_log": args.update_log,
            "store.fsync": args.fsync,
            "sampler.presample": args.presample,
            "embeddings.path": args.embeddings,
            "embeddings.backend": args.embeddings_backend,
            "embeddings.mode": args.new_node_mode,
            "embeddings.gamma": args.gamma,
            "embeddings.policy": args.policy,
            "embeddings.max_new_nodes": args.max_new_nodes,
            "server.max_body_bytes": args.max_body_bytes,
            "server.api_keys": args.api_keys,
            "server.insecure": args.insecure,
        },
    )


def run_serve(args: argparse.Namespace) -> int:
    """Load the store and model, then serve HTTP until SIGINT/SIGTERM (graceful)."""
    import uvicorn

    from gnnserve.engine.loader import build_engine
    from gnnserve.server.app import create_app
    from gnnserve.server.auth import check_exposure, load_api_keys

    config = serve_config(args)
    s = config.server
    keys = load_api_keys(s.api_keys)  # before loading anything: a bad keys file exits at once
    check_exposure(s.host, keys, s.insecure)
    engine = build_engine(config)
    app = create_app(engine, s.model_name, api_keys=keys)
    print(
        f"gnnserve: serving {config.model_path} on {config.store.path} "
        f"at http://{s.host}:{s.port} as model {s.model_name!r}"
        f"{' with API keys' if keys is not None else ''}",
        flush=True,
    )
    # uvicorn drains in-flight requests on SIGTERM, then re-raises the signal; with this no-op
    # handler in place the re-raise returns here and a graceful stop exits 0, not -15.
    signal.signal(signal.SIGTERM, lambda *_: None)
    uvicorn.run(app, host=s.host, port=s.port, log_level=s.log_level, access_log=False)
    # every request the app received was answered before the engine stopped: the two counts match
    print(f"gnnserve: stopped; {app.state.requests.summary()}", flush=True)
    return 0


def _bench_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--url", default="http://127.0.0.1:8000/v1/predict", help="predict endpoint")
    p.add_argument("--num-nodes", type=int, required=True, help="node ids are drawn from [0, N)")
    p.add_argument("--requests", type=int, default=1000, help="closed loop: requests to send")
    p.add_argument("--concurrency", type=int, default=32, help="closed loop: outstanding requests")
    p.add_argument("--rate", type=float, default=None, help="open loop: requests per second")
    p.add_argument("--duration", type=float, default=10.0, help="open loop: seconds")
    p.add_argument("--nodes-per-request", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)


def run_bench(args: argparse.Namespace) -> int:
    """Load a running server and print throughput and latency percentiles as JSON."""
    import numpy as np

    from gnnserve import loadgen

    rng = np.random.default_rng(args.seed)

    def payload(_: int) -> dict[str, object]:
        nodes = rng.integers(0, args.num_nodes, args.nodes_per_request).tolist()
        return {"nodes": nodes}

    if args.rate:
        report = asyncio.run(loadgen.open_loop(args.url, payload, args.rate, args.duration))
    else:
        payloads = [payload(i) for i in range(args.requests)]
        report = asyncio.run(loadgen.closed_loop(args.url, payloads, args.concurrency))
    print(json.dumps(report.summary(), indent=2))
    return 0


def _lazy(module: str, attr: str) -> Callable[..., object]:
    def call(*a: object) -> object:
        import importlib

        return getattr(importlib.import_module(module), attr)(*a)

    return call


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with one sub-command per job."""
    from gnnserve.data import prepare
    from gnnserve.embeddings import precompute
    from gnnserve.graph import logtool
    from gnnserve.models import train

    parser = argparse.ArgumentParser(prog="gnnserve", description=__doc__)
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("prepare", help="import or generate a graph into a store directory")
    prepare.add_arguments(p)
    p.set_defaults(func=prepare.run)
    p = sub.add_parser("train", help="train a model on a store and write a checkpoint")
    train.add_arguments(p)
    p.set_defaults(func=train.run)
    p = sub.add_parser("precompute", help="write every layer's embeddings of a checkpoint")
    precompute.add_arguments(p)
    p.set_defaults(func=precompute.run)
    p = sub.add_parser("serve", help="serve a checkpoint over HTTP")
    _serve_arguments(p)
    p.set_defaults(func=run_serve)
    p = sub.add_parser("bench", help="send load to a running server, print latency/throughput")
    _bench_arguments(p)
    p.set_defaults(func=run_bench)
    p = sub.add_parser("demo", help="the whole job end to end on a generated graph")
    p.add_argument("--workdir", default="demo_data", help="where the store and checkpoint go")
    p.add_argument("--requests", type=int, default=400, help="HTTP requests to send")
    p.set_defaults(func=_lazy("gnnserve.demo", "run"))
    p = sub.add_parser("log", help="verify or repair a graph update log (serve --update-log)")
    logtool.add_arguments(p)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``gnnserve`` console script."""
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO, format="%(levelname)s %(message)s"
    )
    try:
        return int(args.func(args) or 0)
    except GnnServeError as exc:
        print(f"error: {exc.message}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
