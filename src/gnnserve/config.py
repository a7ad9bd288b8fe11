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

    path: str = ""  # store directory written by `gnnserve prepare`
    graph_backend: str = "memory"  # GRAPH_STORES name: memory | mmap
    feature_backend: str = "memory"  # FEATURE_STORES name: memory | mmap
    verify_checksum: bool = False  # recompute the content checksum at start-up (slow on big stores)
    # scan the CSR (row pointers monotone from 0 to E, ids < N) and features (finite) at start-up:
    # seconds per 10^8 edges; off only for a store already checked (data/integrity.py)
    check_structure: bool = True
    update_log: str = ""  # append-only log of graph updates; set = mutable store, replayed at start
    fsync: Literal["always", "never"] = "always"  # log durability: power loss | process crash


class SamplerConfig(_Strict):
    """How the computation graph of a batch is built."""

    fanouts: list[int] = Field(default_factory=lambda: [25, 10])  # per hop, nearest first; -1 = all
    seed: int = 0  # sampler RNG seed
    # expected sampled nodes (PSGS) above which the parallel path runs
    parallel_threshold: int = 65536
    presample: bool = False  # keep DGS reservoirs for ``fanouts``; requests using them look up

    @field_validator("fanouts")
    @classmethod
    def _fanouts(cls, v: list[int]) -> list[int]:
        return check_fanouts(v)


class BatcherConfig(_Strict):
    """Dynamic batching: how concurrent requests are coalesced."""

    max_batch_nodes: int = Field(1024, ge=1)  # seed nodes per batch (before dedupe)
    max_wait_ms: float = Field(0.0, ge=0.0)  # extra wait for a fuller batch; 0 = greedy
    max_batch_cost: float | None = Field(None, gt=0)  # cap on a batch's summed PSGS; None = off
    pipeline_depth: int = Field(2, ge=1)  # batches in flight from sampling to results


class ComputeConfig(_Strict):
    """Model execution."""

    # torch intra-op threads in the serving process; None leaves torch's default. One thread is
    # the default: batches are small and the pipeline stages already use both cores; with two,
    # a batch-1 forward took 1.6 ms instead of 0.2 ms (bench/serving.py machine).
    torch_threads: int | None = Field(1, ge=1)
    # run the request path once at start-up (numba compiles its kernels for this store's dtypes,
    # torch allocates) before /v2/health/ready answers 200; off: ready at once, and the first
    # requests pay for it (seconds with a cold numba cache)
    warm_up: bool = True


class AdmissionConfig(_Strict):
    """Admission control: bounded queue, request size limit, predicted queueing delay, deadline.

    A request is refused (429) when the work admitted ahead of it is predicted to take longer
    than ``max_queue_delay_ms``, or when its answer is predicted to come after its deadline
    (``timeout_s``, or the client's ``X-Timeout-Ms`` header when smaller). See engine/delay.py.
    """

    max_queue_requests: int = Field(4096, ge=1)  # admitted, unfinished requests before 429
    max_nodes_per_request: int = Field(4096, ge=1)  # larger requests get 413
    timeout_s: float = Field(30.0, gt=0)  # queue deadline per request
    # predicted queueing delay beyond which a request gets 429; None = no delay-based shedding
    max_queue_delay_ms: float | None = Field(200.0, gt=0)
    # half-life, in completed batches, of a batch's weight in the service-time model
    service_halflife: float = Field(16.0, gt=0)


NewNodeMode = Literal["srpe", "full", "ns", "pe"]  # gnnserve.newnodes.inference.MODES
NewNodePolicy = Literal["query_edges_ratio", "importance", "random", "oracle"]  # policies.POLICIES


class EmbeddingsConfig(_Strict):
    """New-node requests (OMEGA): the precomputed embeddings (PEs) and the default options."""

    # PE directory written by `gnnserve precompute`; "" = <store>/embeddings/<checkpoint name>
    # when that exists (a stale one is then refused per request, not at start-up)
    path: str = ""
    backend: Literal["memory", "mmap"] = "memory"  # EMBEDDING_STORES name
    mode: NewNodeMode = "srpe"  # default mode of a new-node request
    gamma: float = Field(0.1, ge=0.0, le=1.0)  # default share of candidates recomputed (srpe)
    policy: NewNodePolicy = "query_edges_ratio"  # default choice of the recomputed candidates
    max_new_nodes: int = Field(1024, ge=1)  # new nodes per request before 413


class ServerConfig(_Strict):
    """HTTP front end."""

    host: str = "127.0.0.1"
    port: int = Field(8000, ge=0, le=65535)  # 0 = pick a free port
    model_name: str = "default"  # the name clients use in /v2/models/{name}
    log_level: str = "warning"
    # request bodies above this many bytes get 413 unread; None = 16 MiB + 32 bytes per float of
    # the largest new-node request (embeddings.max_new_nodes x feature width): server/limits.py
    max_body_bytes: int | None = Field(None, ge=1024)
    # file of API keys ("<read|write|read,write> <token>" per line; server/auth.py); "" = the
    # GNNSERVE_API_KEYS environment variable, or no authentication (loopback or insecure only)
    api_keys: str = ""
    insecure: bool = False  # allow a non-loopback host without API keys


class ServeConfig(_Strict):
    """Everything `gnnserve serve` needs."""

    store: StoreConfig = StoreConfig()
    model_path: str = ""  # checkpoint directory written by `gnnserve train`
    sampler: SamplerConfig = SamplerConfig()
    batcher: BatcherConfig = BatcherConfig()
    admission: AdmissionConfig = AdmissionConfig()
    compute: ComputeConfig = ComputeConfig()
    embeddings: EmbeddingsConfig = EmbeddingsConfig()
    server: ServerConfig = ServerConfig()

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
