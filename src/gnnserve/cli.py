"""The ``gnnserve`` command: prepare | train | precompute | calibrate | serve | bench | demo |
log | objstore | publish | faas | fog."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import re
import signal
import sys
from collections.abc import Callable, Sequence
from types import UnionType
from typing import TYPE_CHECKING, Any, Literal, Union, cast, get_args, get_origin

from gnnserve.errors import GnnServeError

if TYPE_CHECKING:
    from pydantic.fields import FieldInfo

    from gnnserve.config import ServeConfig
    from gnnserve.server.workers import WorkerSlot


# options whose value may start with a minus: --fanouts -1,-1
LIST_FLAGS = frozenset({"--fanouts", "--eval-fanouts"})

# One row per ``gnnserve serve`` flag: (flag, dotted ServeConfig key). The type, choices, help
# and default shown come from the config field (its annotation and ``Field(description=...)``),
# so a flag is declared here once. A bool field gets ``--x`` (sets true) or ``--no-x`` (sets
# false), a Literal its choices, ``list[int]`` a comma list like ``25,10``.
SERVE_FLAGS: tuple[tuple[str, str], ...] = (
    ("--store", "store.path"),
    ("--model", "model_path"),
    ("--host", "server.host"),
    ("--port", "server.port"),
    ("--grpc-port", "server.grpc_port"),
    ("--workers", "server.workers"),
    ("--name", "server.model_name"),
    ("--fanouts", "sampler.fanouts"),
    ("--graph-backend", "store.graph_backend"),
    ("--feature-backend", "store.feature_backend"),
    ("--max-batch-nodes", "batcher.max_batch_nodes"),
    ("--max-wait-ms", "batcher.max_wait_ms"),
    ("--max-queue", "admission.max_queue_requests"),
    ("--max-queue-delay-ms", "admission.max_queue_delay_ms"),
    ("--timeout-s", "admission.timeout_s"),
    ("--max-nodes", "admission.max_nodes_per_request"),
    ("--torch-threads", "compute.torch_threads"),
    ("--kernel-threads", "compute.kernel_threads"),
    ("--device", "compute.device"),
    ("--no-warm-up", "compute.warm_up"),
    ("--result-cache", "compute.result_cache_mb"),
    ("--update-log", "store.update_log"),
    ("--fsync", "store.fsync"),
    ("--tiers", "store.tiers"),
    ("--tier-refresh-s", "store.tier_refresh_s"),
    ("--feature-servers", "store.feature_servers"),
    ("--feature-server-share", "store.feature_server_share"),
    ("--presample", "sampler.presample"),
    ("--routing", "sampler.routing"),
    ("--calibration", "sampler.calibration"),
    ("--latency-slo-ms", "batcher.latency_slo_ms"),
    ("--psgs-bound", "batcher.psgs_bound"),
    ("--pipelines", "batcher.pipelines"),
    ("--embeddings", "embeddings.path"),
    ("--embeddings-backend", "embeddings.backend"),
    ("--new-node-mode", "embeddings.mode"),
    ("--gamma", "embeddings.gamma"),
    ("--policy", "embeddings.policy"),
    ("--max-new-nodes", "embeddings.max_new_nodes"),
    ("--no-pe-refresh", "embeddings.refresh"),
    ("--pe-staleness", "embeddings.pe_staleness"),
    ("--max-body-bytes", "server.max_body_bytes"),
    ("--api-keys", "server.api_keys"),
    ("--insecure", "server.insecure"),
    ("--deploy", "deploy.mode"),
    ("--deploy-workers", "deploy.workers"),
    ("--deploy-threads", "deploy.threads_per_worker"),
    ("--remote", "deploy.remote"),
    ("--memory-mb", "deploy.memory_mb"),
    ("--sample-memory-mb", "deploy.sample_memory_mb"),
    ("--keep-alive-s", "deploy.keep_alive_s"),
    ("--scheduler", "deploy.scheduler"),
    ("--fetch", "deploy.fetch"),
    ("--no-cache", "deploy.cache"),
    ("--max-instances", "deploy.max_instances"),
    ("--min-instances", "deploy.min_instances"),
    ("--launch", "deploy.launch"),
    ("--mb-per-cpu", "deploy.mb_per_cpu"),
    ("--cpu-budget", "deploy.cpu_budget"),
    ("--nodes", "deploy.nodes"),
    ("--fog-mode", "deploy.fog_mode"),
    ("--fog-codec", "deploy.fog_codec"),
    ("--fog-accuracy-budget", "deploy.fog_accuracy_budget"),
    ("--fog-gateways", "deploy.fog_gateways"),
    ("--reprofile", "deploy.fog_reprofile"),
)


def config_field(dotted: str) -> FieldInfo:
    """The ServeConfig field at a dotted key such as ``"sampler.fanouts"``."""
    from gnnserve.config import ServeConfig

    model: Any = ServeConfig
    *sections, leaf = dotted.split(".")
    for name in sections:
        model = model.model_fields[name].annotation  # a nested config section
    return cast("FieldInfo", model.model_fields[leaf])


def _flag_type(field: FieldInfo) -> Any:
    """The field's annotation without ``| None`` (None is never typed on the command line)."""
    kind = field.annotation
    if get_origin(kind) in (Union, UnionType):
        args = [a for a in get_args(kind) if a is not type(None)]
        kind = args[0] if len(args) == 1 else kind
    return kind


def _dest(flag: str) -> str:
    """The argparse attribute of a flag: ``--no-warm-up`` -> ``warm_up``."""
    return flag[2:].removeprefix("no-").replace("-", "_")


def flag_arguments(flag: str, dotted: str) -> dict[str, Any]:
    """argparse keyword arguments of ``flag`` derived from the config field at ``dotted``.

    Every default is None: a flag not given leaves the YAML (or the field's default) alone.
    TypeError for a field the table cannot express (no description, unsupported type, a bool
    flag that would set the field's own default).
    """
    field = config_field(dotted)
    if not field.description:
        raise TypeError(f"{flag}: config field {dotted} has no description for the help")
    kind, default = _flag_type(field), field.get_default(call_default_factory=True)
    kwargs: dict[str, Any] = {"dest": _dest(flag), "default": None}
    text = field.description
    if kind is bool:
        off = flag.startswith("--no-")
        if off != (default is True):
            raise TypeError(f"{flag}: a bool flag sets the opposite of the default {default}")
        kwargs["action"] = "store_false" if off else "store_true"
        text = f"turn off: {text}" if off else text
    elif get_origin(kind) is Literal:
        kwargs["choices"] = list(get_args(kind))
    elif kind == list[int]:
        kwargs["metavar"] = "N,N"  # parsed in serve_config, whose errors name the flag
    elif kind in (int, float, str):
        kwargs["type"] = kind
    else:
        raise TypeError(f"{flag}: no command-line form for {dotted}: {field.annotation}")
    if isinstance(default, list):
        default = ",".join(map(str, default))
    shown = "" if default in (None, "") or kind is bool else f", default {default}"
    kwargs["help"] = f"{text} [{dotted}{shown}]".replace("%", "%%")
    return kwargs


def _serve_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", help="YAML ServeConfig; flags override it")
    for flag, dotted in SERVE_FLAGS:
        kwargs = flag_arguments(flag, dotted)
        if flag == MODEL_FLAG:  # repeated: one model per NAME=CKPT over the same graph
            kwargs["action"] = "append"
            kwargs["metavar"] = "[NAME=]CKPT"
        p.add_argument(flag, **kwargs)


MODEL_FLAG = "--model"
_MODEL_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")


def model_flags(values: list[str] | None) -> tuple[str | None, str | None, dict[str, str]]:
    """(first checkpoint, its name or None, the other models by name) of ``--model`` values:
    ``CKPT`` or ``NAME=CKPT``, every one after the first named. InvalidInputError naming
    ``--model`` otherwise."""
    from gnnserve.errors import InvalidInputError

    if not values:
        return None, None, {}
    pairs = []
    for i, value in enumerate(values):
        name, sep, path = value.partition("=")
        if sep and path and _MODEL_NAME.fullmatch(name):
            pairs.append((name, path))
        elif i == 0:  # the first may be a bare checkpoint directory, named by --name
            pairs.append(("", value))
        else:
            raise InvalidInputError(
                f"--model {value!r}: each model after the first is NAME=CKPT (NAME: letters, "
                "digits, '_', '.', '-')",
                MODEL_FLAG,
            )
    others: dict[str, str] = {}
    for name, path in pairs[1:]:
        if name in others or name == pairs[0][0]:
            raise InvalidInputError(f"--model names {name!r} twice", MODEL_FLAG)
        others[name] = path
    first_name, first_path = pairs[0]
    return first_path, first_name or None, others


def serve_config(args: argparse.Namespace) -> ServeConfig:
    """The ServeConfig of ``gnnserve serve``: ``--config`` YAML, then the flags given."""
    from gnnserve.config import ServeConfig
    from gnnserve.errors import InvalidInputError
    from gnnserve.fanouts import parse_fanouts

    overrides = {}
    for flag, dotted in SERVE_FLAGS:
        value = getattr(args, _dest(flag))
        if isinstance(value, str) and _flag_type(config_field(dotted)) == list[int]:
            value = parse_fanouts(value, flag)
        overrides[dotted] = value
    path, name, others = model_flags(overrides.get("model_path"))  # type: ignore[arg-type]
    overrides["model_path"] = path
    if name is not None:
        if overrides.get("server.model_name") not in (None, name):
            raise InvalidInputError(
                f"--model {name}=... and --name {overrides['server.model_name']} name the same"
                " model twice: give one",
                MODEL_FLAG,
            )
        overrides["server.model_name"] = name
    config = ServeConfig.load(args.config, **overrides)
    config.models.update(others)
    return config


def run_serve(args: argparse.Namespace) -> int:
    """Load the store and model, then serve HTTP until SIGINT/SIGTERM (graceful); with
    ``--workers N`` start N worker processes doing so on one port (server/workers.py)."""
    from gnnserve.errors import InvalidInputError
    from gnnserve.ports import check_listen
    from gnnserve.server.app import create_app
    from gnnserve.server.auth import check_exposure, load_api_keys
    from gnnserve.server.models import build_models
    from gnnserve.server.workers import Supervisor, WorkerSlot, check_workers

    config = check_workers(serve_config(args))
    s = config.server
    keys = load_api_keys(s.api_keys)  # before loading anything: a bad keys file exits at once
    check_exposure(s.host, keys, s.insecure)
    slot = WorkerSlot.from_env()
    if s.grpc_port is not None and slot is None:  # before loading anything
        if s.grpc_port == s.port and s.port != 0:
            raise InvalidInputError(f"--grpc-port {s.grpc_port} is --port too", "--grpc-port")
        check_listen(s.host, s.grpc_port, "--grpc-port")
    if s.workers > 1 and slot is None:  # the supervisor: it binds the port, starts the workers
        print(f"gnnserve: {s.workers} workers at http://{s.host}:{s.port}", flush=True)
        return Supervisor(args.argv, config).run()
    if config.store.feature_servers:  # Ray actors, on the cluster in RAY_ADDRESS when set
        from gnnserve.deploy.ray import start_ray

        start_ray(config.store.feature_servers)
    models = build_models(config)
    app = create_app(models.base, s.model_name, api_keys=keys, models=models, workers=slot)
    where = "" if slot is None else f"worker {slot.index} of {slot.count}: "
    print(
        f"gnnserve: {where}serving {config.model_path} on "
        f"{config.store.path or config.deploy.remote} at http://{s.host}:{s.port}"
        f"{f' and grpc://{s.host}:{s.grpc_port}' if s.grpc_port is not None else ''}"
        f" as model {s.model_name!r}"
        f"{f' (and {sorted(config.models)})' if config.models else ''}"
        f"{' with API keys' if keys is not None else ''}",
        flush=True,
    )
    _run_http(app, config, slot)
    # every request the app received was answered before the engine stopped: the counts match
    print(f"gnnserve: {where}stopped; {app.state.requests.summary()}", flush=True)
    return 0


def _run_http(app: Any, config: ServeConfig, slot: WorkerSlot | None) -> None:
    """uvicorn until SIGINT/SIGTERM: on the configured port, or a worker's sockets."""
    import uvicorn

    from gnnserve.server.protocol import http_protocol

    s = config.server
    # uvicorn drains in-flight requests on SIGTERM, then re-raises the signal; with this no-op
    # handler in place the re-raise returns here and a graceful stop exits 0, not -15.
    signal.signal(signal.SIGTERM, lambda *_: None)
    options: dict[str, Any] = {
        "log_level": s.log_level,
        "access_log": False,
        "http": http_protocol(),  # a class: uvicorn takes one
    }
    if slot is None:
        uvicorn.run(app, host=s.host, port=s.port, **options)
    else:  # the supervisor's socket and this worker's private one
        uvicorn.Server(uvicorn.Config(app, **options)).run(sockets=slot.sockets())


def _calibrate_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--store", required=True, help="store directory (`gnnserve prepare`)")
    p.add_argument("--model", required=True, help="checkpoint directory (`gnnserve train`)")
    p.add_argument("--fanouts", default=None, help="per-hop fanouts as serve uses them (25,10)")
    p.add_argument("--out", default=None, help="profile JSON (default <store>/calibration.json)")
    p.add_argument("--buckets", type=int, default=12, help="PSGS buckets (geometric)")
    p.add_argument("--runs", type=int, default=10, help="timed batches per bucket and path")
    p.add_argument(
        "--confidence",
        type=float,
        default=None,
        help="run enough batches per bucket that its max bounds the p99 with this probability "
        "(0.5: 69 runs, 0.9: 230; overrides --runs)",
    )
    p.add_argument(
        "--concurrency",
        type=int,
        default=None,
        help="batches measured at once, as a busy server runs them (default: serve's "
        "pipelines x pipeline depth, 2)",
    )
    p.add_argument("--max-seeds", type=int, default=1024, help="seeds of the largest bucket")
    p.add_argument("--torch-threads", type=int, default=1, help="as serve --torch-threads")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--throughput-path",
        default=None,
        help="path measured against inline: parallel | torch | cuda (default: cuda with a "
        "GPU, else parallel)",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


def run_calibrate(args: argparse.Namespace) -> int:
    """Measure the sampling paths' latency curves; write the profile JSON and PNG; print the
    crossover points (summed PSGS; inf: the curves do not cross in the measured range)."""
    from gnnserve.engine.planner import calibrate
    from gnnserve.errors import InvalidInputError
    from gnnserve.fanouts import parse_fanouts

    concurrency = 1 if args.concurrency is None else args.concurrency
    if args.buckets < 2 or min(args.runs, args.max_seeds, args.torch_threads, concurrency) < 1:
        raise InvalidInputError(
            "--buckets must be at least 2, --runs, --max-seeds, --torch-threads and "
            "--concurrency at least 1",
            "calibrate",
        )
    from gnnserve.sampling.calibration_runs import runs_for

    runs = args.runs if args.confidence is None else runs_for(args.confidence)
    from tqdm import tqdm

    from gnnserve.sampling.calibrate import describe_point

    fanouts = parse_fanouts(args.fanouts)
    bar = tqdm(total=args.buckets, desc="calibrate", unit="bucket", disable=args.no_progress)

    def progress(line: str) -> None:
        bar.update(1)
        tqdm.write(line)  # above the bar

    profile, path, png = calibrate(
        args.store,
        args.model,
        fanouts,
        args.out,
        args.buckets,
        runs,
        args.max_seeds,
        args.torch_threads,
        args.seed,
        progress=progress,
        throughput=args.throughput_path,
        concurrency=args.concurrency,
    )
    bar.close()
    for name, point in profile.points.items():
        lo, hi = profile.intervals.get(name, [point, point])
        line = describe_point(name, point, profile.path_a, profile.path_b)
        print(f"{line} [90% of resamples: {lo:.0f}-{hi:.0f}]")
    print(
        f"gnnserve: {runs} runs per bucket, {profile.concurrency} at once: a bucket's max bounds "
        f"its p99 with probability {profile.p99_confidence:.0%}"
    )
    for warning in profile.warnings:
        print(
            f"gnnserve: warning: {warning}; too noisy to place a point reliably (the points use "
            "a monotone fit): rerun with more --runs or on a quieter machine",
            flush=True,
        )
    print(f"gnnserve: calibration profile {path}, plot {png}", flush=True)
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


def run_objstore(args: argparse.Namespace) -> int:
    """SeaweedFS in the foreground: print where it answers, wait for SIGINT/SIGTERM."""
    import signal
    import threading
    from pathlib import Path

    from gnnserve.data.seaweed import ObjectStoreServer

    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    with ObjectStoreServer.start(Path(args.dir), args.bucket, args.port) as server:
        print(
            f"SeaweedFS S3 endpoint {server.endpoint}, bucket {server.bucket} (pid {server.pid},"
            f" ready in {server.started_s:.1f} s, data in {server.data_dir}); use it with:"
        )
        for key, value in server.env().items():
            print(f"export {key}={value}")
        sys.stdout.flush()
        while not stop.is_set() and server.process.poll() is None:
            stop.wait(0.5)
    return 0 if stop.is_set() else 1


def run_publish(args: argparse.Namespace) -> int:
    """Upload a store; print the report as JSON."""
    from dataclasses import asdict

    from gnnserve.data.publish import publish

    report = publish(args.store, args.to, overwrite=args.overwrite, block_bytes=args.block_kb << 10)
    print(json.dumps(asdict(report), indent=2))
    return 0


def _lazy(module: str, attr: str) -> Callable[..., object]:
    def call(*a: object) -> object:
        import importlib

        return getattr(importlib.import_module(module), attr)(*a)

    return call


def _module_arguments(module: str) -> Callable[[argparse.ArgumentParser], None]:
    """A configurer that imports ``module`` (only when its command runs) and calls its
    ``add_arguments``; the module sets its own ``func`` or gets its ``run``."""

    def configure(p: argparse.ArgumentParser) -> None:
        import importlib

        mod = importlib.import_module(module)
        mod.add_arguments(p)
        if hasattr(mod, "run"):
            p.set_defaults(func=mod.run)

    return configure


def _with(
    add: Callable[[argparse.ArgumentParser], None], func: Callable[..., object]
) -> Callable[[argparse.ArgumentParser], None]:
    """A configurer that declares ``add``'s arguments and runs ``func``."""

    def configure(p: argparse.ArgumentParser) -> None:
        add(p)
        p.set_defaults(func=func)

    return configure


def _demo_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--workdir", default="demo_data", help="where the store and checkpoint go")
    p.add_argument("--requests", type=int, default=400, help="HTTP requests to send")


def _objstore_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--dir", default="objstore_data", help="where SeaweedFS keeps its data")
    p.add_argument("--bucket", default="gnnserve", help="bucket created at start-up")
    p.add_argument("--port", type=int, default=None, help="S3 port (default: a free one)")


def _publish_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--store", required=True, help="the prepared store directory")
    p.add_argument("--to", required=True, help="s3://bucket/prefix (AWS_* env) or a directory")
    p.add_argument("--overwrite", action="store_true", help="replace a non-empty destination")
    p.add_argument(
        "--block-kb",
        type=int,
        default=1024,
        help="files above this size go as blocks of it, which keeps range reads cheap on "
        "stores that read whole chunks (SeaweedFS); 0 uploads every file whole (default 1024)",
    )


def _faas_arguments(p: argparse.ArgumentParser) -> None:
    faas = p.add_subparsers(dest="faas_command", required=True)
    q = faas.add_parser("profile", help="train a model's memory predictor on a published store")
    q.add_argument("--remote", required=True, help="published store URL (s3://... or a path)")
    q.add_argument("--model", required=True, help="checkpoint directory (predictor saved there)")
    q.add_argument(
        "--fanouts", default="25,10", help="sampling fanouts, as serve uses them (default 25,10)"
    )
    q.add_argument("--requests", type=int, default=200, help="requests to profile")
    q.add_argument("--seed", type=int, default=0)
    q.add_argument("--no-progress", action="store_true", help="no progress bar")
    q.set_defaults(func=_lazy("gnnserve.deploy.faas.profile", "run"))


def _fog_arguments(p: argparse.ArgumentParser) -> None:
    fog = p.add_subparsers(dest="fog_command", required=True)
    q = fog.add_parser("upload", help="a sensor gateway: send one round of readings to a fog")
    _module_arguments("gnnserve.deploy.fog.gateway")(q)


# name -> (help, configurer). A configurer runs only for the command being parsed, so heavy
# modules (torch, the engine) load only for the commands that use them: `gnnserve --help`,
# `log verify`, `objstore` and `publish` start without torch.
COMMANDS: dict[str, tuple[str, Callable[[argparse.ArgumentParser], None]]] = {
    "prepare": (
        "import or generate a graph into a store directory",
        _module_arguments("gnnserve.data.prepare"),
    ),
    "train": (
        "train a model on a store and write a checkpoint",
        _module_arguments("gnnserve.models.train"),
    ),
    "precompute": (
        "write every layer's embeddings of a checkpoint",
        _module_arguments("gnnserve.embeddings.precompute"),
    ),
    "calibrate": (
        "measure PSGS latency curves of the sampling paths",
        _with(_calibrate_arguments, run_calibrate),
    ),
    "serve": ("serve a checkpoint over HTTP", _with(_serve_arguments, run_serve)),
    "bench": (
        "send load to a running server, print latency/throughput",
        _with(_bench_arguments, run_bench),
    ),
    "demo": (
        "the whole job end to end on a generated graph",
        _with(_demo_arguments, _lazy("gnnserve.demo", "run")),
    ),
    "log": (
        "verify or repair a graph update log (serve --update-log)",
        _module_arguments("gnnserve.dynamic.logtool"),
    ),
    "ingest": (
        "stream graph updates from an Arrow or CSV file to a server",
        _module_arguments("gnnserve.ingest"),
    ),
    "objstore": (
        "run SeaweedFS (S3 API) on 127.0.0.1 until stopped",
        _with(_objstore_arguments, run_objstore),
    ),
    "publish": (
        "upload a prepared store to s3://bucket/prefix or a dir",
        _with(_publish_arguments, run_publish),
    ),
    "faas": ("serverless deployment (serve --deploy faas) tools", _faas_arguments),
    "fog": ("fog deployment (serve --deploy fog) tools", _fog_arguments),
}


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The argument parser with one sub-command per job; only ``command``'s arguments are
    declared (all of them when None), so parsing one command imports only what it needs."""
    from gnnserve import __version__

    parser = argparse.ArgumentParser(prog="gnnserve", description=__doc__)
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    parser.add_argument("--version", action="version", version=f"gnnserve {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, (text, configure) in COMMANDS.items():
        p = sub.add_parser(name, help=text, description=text, formatter_class=_ShowDefaults)
        p.set_defaults(command_parser=p)
        if command is None or command == name:
            configure(p)
    return parser


class _ShowDefaults(argparse.HelpFormatter):
    """Help that states each option's default, where it has one and its text does not."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        default = action.default
        if default in (None, False, argparse.SUPPRESS) or "default" in text:
            return action.help
        return f"{text} (default: %(default)s)" if text else "default: %(default)s"


def _negative_lists_joined(words: list[str]) -> list[str]:
    """``--fanouts -1,-1`` as ``--fanouts=-1,-1``: argparse takes a value that starts with
    ``-`` and is not a plain number for an option, and refuses the flag."""
    out: list[str] = []
    for word in words:
        if out and out[-1] in LIST_FLAGS and re.fullmatch(r"-\d+(,\s*-?\d+)*", word):
            out[-1] = f"{out[-1]}={word}"
        else:
            out.append(word)
    return out


def _command_of(argv: Sequence[str]) -> str | None:
    """The sub-command named in ``argv`` (its first word that is not an option), if any."""
    return next((a for a in argv if not a.startswith("-")), None)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``gnnserve`` console script."""
    words = _negative_lists_joined(sys.argv[1:] if argv is None else list(argv))
    parser = build_parser(_command_of(words) or "")
    args, unknown = parser.parse_known_args(words)
    args.argv = words  # what a supervisor gives its worker processes
    if unknown:  # the command's own usage, not the top-level one
        getattr(args, "command_parser", parser).error(
            f"unrecognized arguments: {' '.join(unknown)}"
        )
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO, format="%(levelname)s %(message)s"
    )
    if not args.verbose:  # libraries that log their own set-up at INFO ("NumExpr defaulting ...")
        logging.getLogger("numexpr").setLevel(logging.WARNING)
        logging.getLogger("httpx").setLevel(logging.WARNING)  # a line per request it sends
    try:
        return int(args.func(args) or 0)
    except GnnServeError as exc:
        print(f"error: {exc.message}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
