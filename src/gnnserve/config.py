"""Configuration: one pydantic model per component, composed by ServeConfig (YAML + CLI)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from gnnserve.errors import InvalidInputError
from gnnserve.fanouts import check_fanouts


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class StoreConfig(_Strict):
    """Where the graph lives and which storage backends read it."""

    path: str = Field("", description="store directory written by `gnnserve prepare`")
    graph_backend: str = Field("memory", description="GRAPH_STORES name: memory | mmap")
    feature_backend: str = Field("memory", description="FEATURE_STORES name: memory | mmap")
    verify_checksum: bool = False  # recompute the content checksum at start-up (slow on big stores)
    # scan the CSR (row pointers monotone from 0 to E, ids < N) and features (finite) at start-up:
    # seconds per 10^8 edges; off only for a store already checked (data/integrity.py)
    check_structure: bool = True
    update_log: str = Field(
        "",
        description="accept graph updates, logged here (append-only; replayed at start-up if it "
        "exists); empty = a static store",
    )
    fsync: Literal["always", "never"] = Field(
        "always",
        description="update log durability: always (survives power loss) | never (survives a "
        "process crash)",
    )
    tiers: str = Field(
        "",
        description="feature tiers placed by FAP, fastest first, e.g. ram=256M,disk=1G (the rest "
        "is read from the store); empty = the feature backend alone",
    )
    tier_refresh_s: float = Field(
        0.0,
        ge=0.0,
        description="with tiers: re-place them every S seconds from the seeds served (0 = keep "
        "the start-up placement, uniform p0)",
    )
    feature_servers: int = Field(
        0,
        ge=0,
        description="serve features from this many Ray actors (Quiver §5.2: the hottest rows by "
        "FAP on every one, the rest partitioned; a read goes to the server holding most of its "
        "rows); 0 = in this process",
    )
    feature_server_share: float = Field(
        0.5,
        gt=0.0,
        le=1.0,
        description="with feature_servers: rows each server holds, as a share of the nodes "
        "(the replicated hottest plus its partition); times feature_servers must be >= 1",
    )


class SamplerConfig(_Strict):
    """How the computation graph of a batch is built."""

    fanouts: list[int] = Field(
        default_factory=lambda: [25, 10],
        description="per-hop fanouts, nearest hop first, e.g. 25,10 (-1 = every neighbour)",
    )
    seed: int = 0  # sampler RNG seed
    # expected sampled nodes (PSGS) above which the parallel path runs
    parallel_threshold: int = 8192
    routing: Literal["latency", "throughput"] | None = Field(
        None,
        description="take the parallel threshold from the calibration profile (`gnnserve "
        "calibrate`): its latency point (max curves cross) or throughput point (mean curves "
        "cross); unset = the constant parallel_threshold (also when the profile is missing or "
        "stale, with a warning)",
    )
    calibration: str = Field(
        "", description="calibration profile JSON; empty = <store>/calibration.json"
    )
    presample: bool = Field(
        False,
        description="DGS pre-sampling: keep reservoirs for the default fanouts, updated on every "
        "graph update; requests with those fanouts look them up",
    )

    @field_validator("fanouts")
    @classmethod
    def _fanouts(cls, v: list[int]) -> list[int]:
        return check_fanouts(v)


class BatcherConfig(_Strict):
    """Dynamic batching: how concurrent requests are coalesced."""

    max_batch_nodes: int = Field(1024, ge=1, description="seed nodes per batch (before dedupe)")
    max_wait_ms: float = Field(
        0.0, ge=0.0, description="extra batching wait for a fuller batch, ms (0 = greedy)"
    )
    max_batch_cost: float | None = Field(None, gt=0)  # cap on a batch's summed PSGS; None = off
    latency_slo_ms: float | None = Field(
        None,
        gt=0,
        description="PSGS-bounded batching (Quiver Fig. 10): a batch closes before its summed "
        "PSGS passes what the calibration profile's latency curve allows within what is left "
        "of this many ms to its oldest request once the pipeline is free; requests whose "
        "answer is predicted past it are refused (429); needs a current profile (`gnnserve "
        "calibrate`), else the engine is not built",
    )
    psgs_bound: Literal["strict", "loose"] = Field(
        "strict",
        description="with latency_slo_ms: strict bounds batches by the max-latency curve and "
        "refuses answers predicted past the SLO with a margin; loose bounds by the mean curve "
        "and refuses only answers whose mean prediction is past it (more throughput, some "
        "answers over the SLO)",
    )
    pipeline_depth: int = Field(2, ge=1)  # batches in flight from sampling to results
    pipelines: int = Field(
        1,
        ge=1,
        le=64,
        description="sample->gather->compute pipelines pulling from one shared batch queue "
        "(Quiver §4.3): a slow batch holds only its own pipeline; with more than one, each "
        "holds one batch at a time (pipeline_depth applies to a single pipeline)",
    )


class ComputeConfig(_Strict):
    """Model execution."""

    # torch intra-op threads in the serving process; None leaves torch's default. One thread is
    # the default: batches are small and the pipeline stages already use both cores; with two,
    # a batch-1 forward took 1.6 ms instead of 0.2 ms (bench/serving.py machine).
    torch_threads: int | None = Field(1, ge=1, description="torch intra-op threads")
    kernel_threads: int | None = Field(
        None,
        ge=1,
        description="threads of each stage's numba sampling and gather kernels (parallel draws, "
        "parallel gathers); unset: every core. The stages run in threads of their own beside "
        "the event loop: on a small machine shared with clients, 1 keeps the loop responsive",
    )
    device: Literal["cpu", "cuda"] = Field(
        "cpu",
        description="where routed batches (past the inline path) run: cpu, or cuda: sample, "
        "gather and model on the GPU, only the answers copied back (inline batches stay on the "
        "CPU); cuda needs a GPU",
    )
    result_cache_mb: float = Field(
        0.0,
        ge=0,
        description="cache existing nodes' full-neighbourhood answers (every fanout -1) up to "
        "this many MiB, kept valid across graph updates: a batch drops the answers it can "
        "change (0: off)",
    )
    warm_up: bool = Field(
        True,
        description="run the request path once at start-up (numba compiles its kernels for this "
        "store's dtypes, torch allocates) before /v2/health/ready answers 200; off: ready at "
        "once, and the first requests pay for it (seconds with a cold numba cache)",
    )


class AdmissionConfig(_Strict):
    """Admission control: bounded queue, request size limit, predicted queueing delay, deadline.

    A request is refused (429) when the work admitted ahead of it is predicted to take longer
    than ``max_queue_delay_ms``, or when its answer is predicted to come after its deadline
    (``timeout_s``, or the client's ``X-Timeout-Ms`` header when smaller). See engine/delay.py.
    """

    max_queue_requests: int = Field(
        4096, ge=1, description="admitted, unfinished requests before 429"
    )
    max_nodes_per_request: int = Field(4096, ge=1, description="nodes per request before 413")
    timeout_s: float = Field(30.0, gt=0, description="request deadline, seconds")
    max_queue_delay_ms: float | None = Field(
        200.0,
        gt=0,
        description="429 when the work ahead of a request is predicted to take longer, ms "
        "(null = no delay-based shedding)",
    )
    # half-life, in completed batches, of a batch's weight in the service-time model
    service_halflife: float = Field(16.0, gt=0)


NewNodeMode = Literal["srpe", "full", "ns", "pe"]  # gnnserve.newnodes.inference.MODES
NewNodePolicy = Literal["query_edges_ratio", "importance", "random", "oracle"]  # policies.POLICIES


class EmbeddingsConfig(_Strict):
    """New-node requests (OMEGA): the precomputed embeddings (PEs) and the default options."""

    # a stale default directory is refused per request, not at start-up
    path: str = Field(
        "",
        description="precomputed embeddings for new-node requests (`gnnserve precompute`); "
        "empty = <store>/embeddings/<model name> when it exists",
    )
    backend: Literal["memory", "mmap"] = Field("memory", description="EMBEDDING_STORES name")
    mode: NewNodeMode = Field("srpe", description="default mode of a new-node request")
    gamma: float = Field(
        0.1, ge=0.0, le=1.0, description="default SRPE gamma: share of candidates recomputed"
    )
    policy: NewNodePolicy = Field(
        "query_edges_ratio", description="default SRPE policy: which candidates are recomputed"
    )
    max_new_nodes: int = Field(1024, ge=1, description="new nodes per request before 413")
    refresh: bool = Field(
        True,
        description="with --update-log: keep the PEs current in the background as batches "
        "commit (their affected rows recomputed; the PEs are held in memory), instead of "
        "refusing new-node requests as stale (409) after the first batch",
    )
    pe_staleness: int = Field(
        0,
        ge=0,
        description="with the refresher: answer new-node requests with PEs at most this many "
        "batches behind the graph (the answer reports pe_version and pe_lag); a request "
        "beyond it waits for the refresh up to its deadline, then 503",
    )


class ServerConfig(_Strict):
    """HTTP front end."""

    host: str = Field("127.0.0.1", description="bind address")
    port: int = Field(8000, ge=0, le=65535, description="port (0 = any free port)")
    workers: int = Field(
        1,
        ge=1,
        le=256,
        description="server processes answering on the port (one engine each, the store "
        "memory-mapped once: server/workers.py)",
    )
    grpc_port: int | None = Field(
        None,
        ge=0,
        le=65535,
        description="also serve the Open Inference Protocol over gRPC on this port (0 = any "
        "free port; null = no gRPC)",
    )
    model_name: str = Field("default", description="model name in the API (/v2/models/{name})")
    log_level: str = "warning"
    max_body_bytes: int | None = Field(
        None,
        ge=1024,
        description="request bodies above this get 413 unread (null = 16 MiB + 32 B x max new "
        "nodes x feature width: server/limits.py)",
    )
    # "" and no GNNSERVE_API_KEYS: no authentication (loopback host or insecure only)
    api_keys: str = Field(
        "",
        description="file of API keys, '<read|write|read,write> <token>' per line "
        "(server/auth.py; or set GNNSERVE_API_KEYS); every endpoint but /v2/health/* then "
        "needs a bearer token",
    )
    insecure: bool = Field(
        False,
        description="allow a non-loopback host without API keys (anyone reaching it may update)",
    )


class DeployConfig(_Strict):
    """How admitted work is executed: the EXECUTORS backend and its workers (engine/executor.py).

    ``local``: sampling, feature gather and model in this process (the default). ``dgs``:
    existing-node batches sample from DGS serving workers (Ray actors) that keep the reservoirs
    of ``sampler.fanouts`` current; other fanouts sample locally. ``cgp``: new-node SRPE requests
    run on ``workers`` Ray actors with computation graph parallelism (OMEGA); the rest locally.
    ``faas``: serverless function instances (FaaS-GNN) read the store at ``remote`` on demand.
    ``fog``: full-graph rounds on the fog nodes listed in ``nodes`` (Fograph).
    """

    mode: str = Field(
        "local",
        description=(
            "EXECUTORS name: local | dgs | cgp | faas | fog (or one a deployment package "
            "registered)"
        ),
    )
    workers: int = Field(
        2, ge=1, le=64, description="dgs: sampling and serving workers each; cgp: workers"
    )
    threads_per_worker: int = Field(1, ge=1, le=64, description="torch threads per worker (cgp)")
    timeout_s: float = Field(120.0, gt=0)  # start-up and per-request bound on the workers
    remote: str = Field(
        "", description="faas: URL of the published store (s3://bucket/prefix or file:///dir)"
    )
    memory_mb: int = Field(
        0, ge=0, le=1 << 20, description="faas: inference instance capacity in MB (0: no limit)"
    )
    sample_memory_mb: int = Field(
        0, ge=0, le=1 << 20, description="faas: sample instance capacity in MB (0: no limit)"
    )
    keep_alive_s: float = Field(600.0, gt=0, description="faas: idle seconds before scale-down")
    scheduler: Literal["load_aware", "naive"] = Field(
        "load_aware", description="faas: instance scheduling (naive: no load balancing)"
    )
    fetch: Literal["ondemand", "full"] = Field(
        "ondemand",
        description="faas: read feature rows on demand | download the whole store at cold start",
    )
    cache: bool = Field(True, description="faas: adaptive feature cache in inference instances")
    max_instances: int | None = Field(None, ge=1, le=1024, description="faas: per function")
    min_instances: int = Field(
        0,
        ge=0,
        le=1024,
        description="faas: instances of each function kept warm from start-up, even with no "
        "traffic (0: every instance starts cold on demand and scales to zero)",
    )
    launch: Literal["process", "fork"] = Field(
        "process",
        description="faas: process (a new process per instance) | fork (from a warm template)",
    )
    mb_per_cpu: float = Field(
        1769.0,
        ge=0,
        description="faas: instance memory per CPU of quota (AWS Lambda: 1769; 0: no quota)",
    )
    cpu_budget: float | None = Field(
        None,
        ge=0,
        description="faas: cores the instances' CPU quotas may add up to; sets the cap per "
        "function when --max-instances is not given (default: this machine's cores; 0: no cap)",
    )
    nodes: str = Field("", description="fog: YAML of the nodes (name, cores, link, fog_link)")
    fog_codec: Literal["auto", "lossless", "daq", "column"] = Field(
        "auto",
        description="fog: fograph upload codec: lossless (float32 + LZ4, exact) | daq (Fograph's "
        "degree-aware 8/16/32-bit rows + LZ4) | column (per-column 4/8/16-bit codes, widths "
        "chosen at start-up by --fog-accuracy-budget) | auto (lossless when every reading is "
        "an integer, else column)",
    )
    fog_accuracy_budget: float = Field(
        0.1,
        ge=0,
        le=100,
        description="fog: the column codec's budget: the percent of vertices whose answer may "
        "differ from float32 readings' (measured on the start-up readings)",
    )
    fog_gateways: str = Field(
        "",
        description="fog: readings come from sensor gateways (`gnnserve fog upload`), not from "
        "the store: the server writes their plan (plan.json: each group's receiver, rows and "
        "command) to this directory, runs a round whenever every group has uploaded the next "
        "one, and answers requests from the latest round (503 until the first)",
    )
    fog_reprofile: bool = Field(
        False,
        description="fog: measure the nodes and links again at start-up instead of reusing the "
        "profile cached for this graph, model and nodes (~/.cache/gnnserve/fog)",
    )
    fog_mode: Literal["fograph", "strawman", "cloud"] = Field(
        "fograph",
        description="fog: fograph (planned parts, compressed uploads, adaptive scheduler) | "
        "strawman (METIS parts placed at random, raw uploads) | cloud (one server collects "
        "every reading)",
    )


class ServeConfig(_Strict):
    """Everything `gnnserve serve` needs."""

    store: StoreConfig = StoreConfig()
    model_path: str = Field(
        "",
        description="checkpoint directory written by `gnnserve train` (repeat the flag as "
        "NAME=CKPT to serve more models over the same graph: models)",
    )
    models: dict[str, str] = Field(
        default_factory=dict,
        description="more models served over the same graph: name -> checkpoint directory "
        "(`serve --model NAME=CKPT` repeated; server.model_name names model_path's)",
    )
    sampler: SamplerConfig = SamplerConfig()
    batcher: BatcherConfig = BatcherConfig()
    admission: AdmissionConfig = AdmissionConfig()
    compute: ComputeConfig = ComputeConfig()
    embeddings: EmbeddingsConfig = EmbeddingsConfig()
    server: ServerConfig = ServerConfig()
    deploy: DeployConfig = DeployConfig()

    @classmethod
    def load(cls, path: str | Path | None = None, **overrides: Any) -> ServeConfig:
        """Read YAML (when given), then apply dotted-key overrides like ``sampler.fanouts=[5]``."""
        data: dict[str, Any] = {}
        if path:
            try:
                data = yaml.safe_load(Path(path).read_text()) or {}
            except (OSError, yaml.YAMLError) as exc:
                raise InvalidInputError(f"cannot read config {path}: {exc}", "config") from exc
        for dotted, value in overrides.items():
            if value is None:
                continue
            node = data
            *parents, leaf = dotted.split(".")
            for p in parents:
                node = node.setdefault(p, {})
            node[leaf] = value
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            err = exc.errors()[0]
            field = ".".join(str(p) for p in err["loc"])
            raise InvalidInputError(f"config {field}: {err['msg']}", field) from exc
