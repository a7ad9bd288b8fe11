"""The models a server serves over its one graph, by name: look-up, load, swap, unload.

``serve --model NAME=CKPT`` (repeated) serves several models; the first one's engine owns the
graph, features and update log (``engine.loader.build_engine``), the others share them
(``engine.loader.build_model_engine``). The Open Inference Protocol's repository extension
calls :meth:`ModelRepository.load` and :meth:`ModelRepository.unload`:

- **load** builds a fresh engine from the model's checkpoint directory (a new version when the
  checkpoint changed), starts and warms it, then swaps it in: requests arriving from then on go
  to it, requests already admitted by the old engine finish there (it drains), so nothing fails
  or is dropped. A request that picked the old engine just before the swap and is refused by
  its closing admission runs on the new one (:meth:`ModelRepository.run`). One version per
  model is served: the latest loaded.
- **unload** takes the model out of the index (new requests: 404) and drains its engine.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from gnnserve.config import ServeConfig
from gnnserve.engine.engine import Engine
from gnnserve.engine.loader import build_engine, build_model_engine
from gnnserve.errors import (
    GnnServeError,
    InvalidInputError,
    ShuttingDownError,
    StoreFormatError,
    UnknownModelError,
    echo,
)
from gnnserve.models.checkpoint import release_freed_heap

log = logging.getLogger(__name__)

T = TypeVar("T")


class ModelStateError(GnnServeError):
    """A repository action the model's state does not allow (409)."""

    http_status = 409
    kind = "model_state"


class ModelLoadError(GnnServeError):
    """A model's checkpoint could not be loaded (400)."""

    http_status = 400
    kind = "model_load_failed"


@dataclass
class ServedModel:
    """One model of the repository: its checkpoint directory and, when loaded, its engine."""

    name: str
    path: str
    engine: Engine | None


class ModelRepository:
    """The served models by name (the first added is the default of ``/v1/predict``)."""

    def __init__(self) -> None:
        self._models: dict[str, ServedModel] = {}
        self._lock = threading.Lock()  # one load or unload at a time
        self.on_engine: list[Callable[[Engine], None]] = []  # run on every engine added

    def add(self, name: str, path: str, engine: Engine) -> None:
        """Serve ``engine`` (built from checkpoint ``path``) as ``name``."""
        if name in self._models:
            raise ValueError(f"model {name!r} is added twice")
        for hook in self.on_engine:
            hook(engine)
        self._models[name] = ServedModel(name, path, engine)

    @property
    def default(self) -> str:
        """The first model's name."""
        return next(iter(self._models))

    @property
    def base(self) -> Engine:
        """An engine over the shared store (the graph, features and update log): the first
        model's while it is loaded, else another loaded one."""
        engines = self.engines()
        if not engines:
            raise ModelStateError("no model is loaded", "model_name")
        return engines[0]

    def engines(self) -> list[Engine]:
        """The loaded models' engines, in the order the models were added."""
        return [m.engine for m in self._models.values() if m.engine is not None]

    def names(self) -> list[str]:
        """Every model name, loaded or not."""
        return list(self._models)

    def loaded_names(self) -> list[str]:
        """The names of the loaded models."""
        return [name for name, m in self._models.items() if m.engine is not None]

    def get(self, name: str, version: str | None = None) -> Engine:
        """The engine serving ``name`` (and ``version``, when given); 404 otherwise."""
        model = self._models.get(name)
        if model is None:
            raise UnknownModelError(
                f"unknown model {echo(name)}; serving {self.names()}", "model_name"
            )
        if model.engine is None:
            raise UnknownModelError(f"model {echo(name)} is not loaded", "model_name")
        if version is not None and version != model.engine.runner.version:
            raise UnknownModelError(
                f"model {echo(name)} has no version {echo(version)}; serving version "
                f"{model.engine.runner.version!r}",
                "model_version",
            )
        return model.engine

    async def run(self, name: str, version: str | None, job: Callable[[Engine], Awaitable[T]]) -> T:
        """``job(engine)`` on the engine serving ``name``; once more on the new engine when a
        swap closed the one it picked before it was admitted."""
        engine = self.get(name, version)
        try:
            return await job(engine)
        except ShuttingDownError:
            current = self._models[name].engine if name in self._models else None
            if current is None or current is engine:
                raise
            return await job(self.get(name, version))

    def index(self) -> list[dict[str, Any]]:
        """The repository index: name, version and state of every model."""
        return [
            {
                "name": m.name,
                "version": m.engine.runner.version if m.engine is not None else "",
                "state": "READY" if m.engine is not None else "UNAVAILABLE",
                **({} if m.engine is not None else {"reason": "unloaded"}),
            }
            for m in self._models.values()
        ]

    def load(self, name: str, path: str | None = None) -> str:
        """Build ``name`` again from its checkpoint (``path`` when given: also a new model),
        warm it, swap it in and drain the engine it replaces; the version now served.
        Blocking (seconds)."""
        with self._lock:
            model = self._models.get(name)
            if model is None and path is None:
                raise UnknownModelError(
                    f"unknown model {echo(name)}; the repository holds {self.names()} (a new "
                    "one needs the parameter checkpoint)",
                    "model_name",
                )
            start = time.perf_counter()
            engine = self._build(name, path or model.path, given=path is not None)  # type: ignore[union-attr]
            try:
                for hook in self.on_engine:
                    hook(engine)
                engine.start()
                engine.warm_up()
            except BaseException:
                engine.stop()  # never served: its threads go, the shared store stays
                raise
            release_freed_heap()  # what loading and the warm-up's forwards freed
            if model is None:
                model = self._models[name] = ServedModel(name, str(path), None)
            old, model.engine = model.engine, engine
            model.path = path or model.path
            if old is not None:
                self._drain(old, engine)
            log.info(
                "model %r version %s loaded in %.1f s",
                name, engine.runner.version, time.perf_counter() - start,
            )  # fmt: skip
            return engine.runner.version

    def _build(self, name: str, path: str, given: bool) -> Engine:
        """A new engine of model ``name`` from checkpoint ``path``; a checkpoint that cannot be
        loaded is a 400 (its reason shown for a path the client gave, else only in the log)."""
        try:
            return build_model_engine(self.base, path)
        except (StoreFormatError, InvalidInputError) as exc:
            log.warning("model %r could not be loaded from %s: %s", name, path, exc.message)
            reason = f": {exc.message}" if given else " (the server log says why)"
            message = f"model {echo(name)} could not be loaded{reason}"
            raise ModelLoadError(message, "checkpoint") from None

    def unload(self, name: str) -> None:
        """Take ``name`` out of service and drain its engine (requests it admitted finish)."""
        with self._lock:
            model = self._models.get(name)
            if model is None or model.engine is None:
                raise UnknownModelError(f"model {echo(name)} is not loaded", "model_name")
            if len(self.engines()) == 1:
                raise ModelStateError(
                    f"model {echo(name)} is the only one loaded: a server serves at least one",
                    "model_name",
                )
            old, model.engine = model.engine, None
            self._drain(old, self.base)

    def _drain(self, old: Engine, heir: Engine) -> None:
        """Stop ``old`` after its admitted requests; the store it owns passes to ``heir``."""
        if old.owns_store:
            old.owns_store, heir.owns_store = False, True
        old.stop()

    def stop(self) -> None:
        """Drain every loaded engine, the store's owner last."""
        engines = self.engines()
        for engine in sorted(engines, key=lambda e: e.owns_store):
            engine.stop()


def build_models(config: ServeConfig) -> ModelRepository:
    """The repository of ``config``: ``model_path`` as ``server.model_name`` (its engine owns
    the store), then each of ``config.models`` over the same graph."""
    models = ModelRepository()
    base = build_engine(config)
    models.add(config.server.model_name, config.model_path, base)
    try:
        for name, path in config.models.items():
            if name == config.server.model_name:
                raise InvalidInputError(f"model name {name!r} is given twice", "models")
            models.add(name, path, build_model_engine(base, path))
    except BaseException:
        models.stop()
        raise
    return models
