"""The Open Inference Protocol's model repository extension over HTTP (API-key scope ``admin``).

- ``GET`` or ``POST /v2/repository/index``: every model with its served ``version`` and
  ``state`` (``READY``, or ``UNAVAILABLE`` with the ``reason`` once unloaded).
- ``POST /v2/repository/models/{name}/load``: build the model again from its checkpoint
  directory (a new version when it changed), or from ``{"parameters": {"checkpoint": DIR}}``
  (also a model the server did not serve yet), warm it, then swap it in; requests admitted by
  the version it replaces finish there (``server.models``). Answers ``{name, version}``.
- ``POST /v2/repository/models/{name}/unload``: new requests for it get 404; those admitted
  finish. The last loaded model stays (409).
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from fastapi import FastAPI, Request

from gnnserve.errors import InvalidInputError, echo
from gnnserve.server.models import ModelRepository

LOAD_PARAMETERS = ("checkpoint",)
UNLOAD_PARAMETERS = ("unload_dependents",)  # Triton's; nothing here depends on a model


async def _parameters(request: Request, allowed: tuple[str, ...]) -> dict[str, Any]:
    """The ``parameters`` of an optional JSON body; 400 naming what is wrong."""
    raw = await request.body()
    if not raw.strip():
        return {}
    try:
        body = json.loads(raw)
    except ValueError as exc:
        raise InvalidInputError(f"malformed JSON: {exc}", "body") from None
    if not isinstance(body, dict) or not isinstance(body.get("parameters", {}), dict):
        raise InvalidInputError('the body must be {"parameters": {...}}', "body")
    params: dict[str, Any] = body.get("parameters", {})
    unknown = sorted(set(params) - set(allowed))
    if unknown:
        raise InvalidInputError(
            f"unknown parameters {[echo(u) for u in unknown[:4]]}; this takes {list(allowed)}",
            "parameters",
        )
    return params


def add_repository_routes(
    app: FastAPI, models: ModelRepository, errors: dict[int | str, Any]
) -> None:
    """Register the repository extension's endpoints on ``app``."""

    @app.get("/v2/repository/index", responses=errors)
    @app.post("/v2/repository/index", responses=errors, operation_id="repository_index_post")
    async def index() -> list[dict[str, Any]]:
        """Every model: name, version served, state."""
        return models.index()

    @app.post("/v2/repository/models/{name}/load", responses=errors)
    async def load(name: str, request: Request) -> dict[str, str]:
        """Load (or reload: a new version) model ``name`` with no request failed or dropped."""
        params = await _parameters(request, LOAD_PARAMETERS)
        checkpoint = params.get("checkpoint")
        if checkpoint is not None and (not isinstance(checkpoint, str) or not checkpoint):
            raise InvalidInputError("checkpoint must be a checkpoint directory", "checkpoint")
        version = await asyncio.to_thread(models.load, name, checkpoint)
        return {"name": name, "version": version}

    @app.post("/v2/repository/models/{name}/unload", responses=errors)
    async def unload(name: str, request: Request) -> dict[str, str]:
        """Stop serving model ``name``; the requests it admitted finish first."""
        await _parameters(request, UNLOAD_PARAMETERS)
        await asyncio.to_thread(models.unload, name)
        return {"name": name}
