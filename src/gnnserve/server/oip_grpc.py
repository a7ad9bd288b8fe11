"""The Open Inference Protocol v2 over gRPC (``serve --grpc-port``), beside HTTP on one loop.

KServe's ``inference.GRPCInferenceService`` (``server/proto/grpc_predict_v2.proto``): health,
metadata and ``ModelInfer``, answered by the same engine with the same checks as HTTP
(``server.oip_infer``), the same body limit (the largest message accepted), the same API keys
(metadata ``authorization: Bearer <token>``, scope ``read``; the health RPCs are open), the same
early shedding (admission asked before the request runs; the call's gRPC deadline is the
request's deadline) and the same ``/metrics`` (endpoints ``grpc_infer`` and
``grpc_infer_new_nodes``). Inputs come as ``raw_input_contents`` or typed contents; outputs
always go out as ``raw_output_contents``. A request parameter ``fanouts`` may be a string
("10,5"): a gRPC parameter cannot hold a list.

The messages and their conversion to and from the transport-free carriers:
``server.oip_grpc_messages``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import grpc

from gnnserve.engine.admission import REQUEST, RequestContext
from gnnserve.engine.engine import Engine
from gnnserve.errors import GnnServeError, OverloadedError
from gnnserve.server import oip_infer
from gnnserve.server.auth import ApiKeys, ForbiddenError, UnauthorizedError
from gnnserve.server.metrics import ServerMetrics
from gnnserve.server.models import ModelRepository
from gnnserve.server.oip import SERVER_NAME, SERVER_VERSION, Statistics, ready, run_counted
from gnnserve.server.oip_grpc_messages import MESSAGES, to_call, to_response
from gnnserve.server.oip_tensors import InferCall

log = logging.getLogger(__name__)

SERVICE = "inference.GRPCInferenceService"
STOP_GRACE_S = 30.0  # in-flight calls finish within this when the server stops
_CODES = {  # HTTP status of a GnnServeError -> gRPC status code
    400: grpc.StatusCode.INVALID_ARGUMENT,
    401: grpc.StatusCode.UNAUTHENTICATED,
    403: grpc.StatusCode.PERMISSION_DENIED,
    404: grpc.StatusCode.NOT_FOUND,
    409: grpc.StatusCode.FAILED_PRECONDITION,
    413: grpc.StatusCode.RESOURCE_EXHAUSTED,
    429: grpc.StatusCode.UNAVAILABLE,  # retry with back-off
    503: grpc.StatusCode.UNAVAILABLE,
    504: grpc.StatusCode.DEADLINE_EXCEEDED,
}


class OipGrpcServer:
    """gRPC front end of the models of a repository."""

    def __init__(
        self,
        models: ModelRepository,
        metrics: ServerMetrics,
        stats: Statistics,
        api_keys: ApiKeys | None,
        max_message_bytes: int,
        extensions: list[str],
        reuse_port: bool = False,
    ) -> None:
        self.models = models
        self.metrics = metrics
        self.stats = stats
        self.api_keys = api_keys
        self.extensions = extensions
        options = [
            ("grpc.max_receive_message_length", max_message_bytes),
            ("grpc.max_send_message_length", -1),
            # a port held by another server is an error, not shared; the workers of
            # serve --workers share theirs
            ("grpc.so_reuseport", int(reuse_port)),
        ]
        self.server = grpc.aio.server(options=options)
        self.server.add_generic_rpc_handlers((self._handlers(),))
        self.port: int | None = None

    async def start(self, host: str, port: int) -> int:
        """Listen on ``host:port`` (0: a free port); the port bound."""
        try:
            self.port = self.server.add_insecure_port(f"{host}:{port}")
        except RuntimeError:  # taken since the check at start-up: say which port
            raise PortInUseError(f"cannot listen for gRPC on {host}:{port}", "grpc_port") from None
        await self.server.start()
        log.info("gRPC (Open Inference Protocol) on %s:%d", host, self.port)
        return self.port

    async def stop(self) -> None:
        """Refuse new calls, let those in flight finish (within STOP_GRACE_S)."""
        await self.server.stop(STOP_GRACE_S)

    def _handlers(self) -> grpc.GenericRpcHandler:
        rpcs: dict[str, tuple[Callable[..., Awaitable[Any]], bool]] = {
            "ServerLive": (self._live, False),
            "ServerReady": (self._server_ready, False),
            "ModelReady": (self._model_ready, True),
            "ServerMetadata": (self._server_metadata, True),
            "ModelMetadata": (self._model_metadata, True),
            "ModelInfer": (self._infer, True),
        }
        handlers = {
            name: grpc.unary_unary_rpc_method_handler(
                self._guarded(fn, needs_key),
                request_deserializer=MESSAGES[f"{name}Request"].FromString,
                response_serializer=MESSAGES[f"{name}Response"].SerializeToString,
            )
            for name, (fn, needs_key) in rpcs.items()
        }
        return grpc.method_handlers_generic_handler(SERVICE, handlers)

    def _guarded(
        self, fn: Callable[..., Awaitable[Any]], needs_key: bool
    ) -> Callable[[Any, grpc.aio.ServicerContext], Awaitable[Any]]:
        """``fn`` behind the API-key check, its GnnServeErrors turned into gRPC statuses."""

        async def call(request: Any, context: grpc.aio.ServicerContext) -> Any:
            try:
                if needs_key:
                    self._check_key(context)
                return await fn(request, context)
            except GnnServeError as exc:
                self.metrics.errors.labels(exc.kind).inc()
                await context.abort(_CODES.get(exc.http_status, grpc.StatusCode.INTERNAL), str(exc))

        return call

    def _check_key(self, context: grpc.aio.ServicerContext) -> None:
        if self.api_keys is None:
            return
        metadata = dict(context.invocation_metadata() or ())
        header = metadata.get("authorization")
        scheme, _, token = str(header or "").strip().partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise UnauthorizedError(
                "this server needs an API key: send the metadata authorization: Bearer <token>",
                "authorization",
            )
        scopes = self.api_keys.scopes_of(token.strip())
        if scopes is None:
            raise UnauthorizedError("unknown API key", "authorization")
        if "read" not in scopes:
            raise ForbiddenError("this API key lacks the 'read' scope this call needs")

    def _engine(self, name: str, version: str) -> Engine:
        return self.models.get(name, version or None)

    async def _live(self, _: Any, __: Any) -> Any:
        return MESSAGES["ServerLiveResponse"](live=True)

    async def _server_ready(self, _: Any, __: Any) -> Any:
        ok = all(ready(e) for e in self.models.engines())
        return MESSAGES["ServerReadyResponse"](ready=ok)

    async def _model_ready(self, request: Any, _: Any) -> Any:
        engine = self._engine(request.name, request.version)
        return MESSAGES["ModelReadyResponse"](ready=ready(engine))

    async def _server_metadata(self, _: Any, __: Any) -> Any:
        return MESSAGES["ServerMetadataResponse"](
            name=SERVER_NAME, version=SERVER_VERSION, extensions=self.extensions
        )

    async def _model_metadata(self, request: Any, _: Any) -> Any:
        engine = self._engine(request.name, request.version)
        meta = oip_infer.model_metadata(engine, request.name)
        return MESSAGES["ModelMetadataResponse"](**meta)

    async def _infer(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        name, version = request.model_name, request.model_version or None
        admission = self._engine(name, request.model_version).admission
        now = time.perf_counter()
        remaining = context.time_remaining()
        deadline = None if remaining is None else now + remaining
        retry_s = None if admission.closed else admission.would_refuse(deadline)
        if retry_s is not None:
            raise OverloadedError(
                "server overloaded: the requests already admitted would not be answered within "
                f"the queueing budget or this call's deadline; retry in {retry_s:.2f} s",
                retry_after_s=retry_s,
            )
        ctx = RequestContext(now, deadline)
        token = REQUEST.set(ctx)

        async def decoded() -> InferCall:
            return to_call(request)

        try:
            _, answer = await run_counted(
                self.models, self.stats, self.metrics, name, version, decoded(), "grpc_"
            )
        finally:
            REQUEST.reset(token)
        response = to_response(answer)
        ctx.answered(time.perf_counter())
        return response


class PortInUseError(GnnServeError):
    """The gRPC port cannot be bound."""

    kind = "port_in_use"


async def start_grpc(
    app: Any,
    models: ModelRepository,
    metrics: ServerMetrics,
    api_keys: ApiKeys | None,
    extensions: list[str],
) -> OipGrpcServer | None:
    """The gRPC front end of ``app`` on ``server.grpc_port`` when set (the port bound goes to
    ``app.state.grpc_port``; the workers of ``serve --workers`` share it)."""
    s = models.base.config.server
    if s.grpc_port is None:
        return None
    server = OipGrpcServer(
        models,
        metrics,
        app.state.oip_stats,
        api_keys,
        app.state.max_body_bytes,
        extensions,
        reuse_port=app.state.workers is not None,
    )
    app.state.grpc_port = await server.start(s.host, s.grpc_port)
    return server
