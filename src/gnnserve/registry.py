"""Named registries: storage backends, model architectures, new-node modes and policies and
executors are chosen by name, in one place."""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic, TypeVar

from gnnserve.errors import InvalidInputError

T = TypeVar("T")


class Registry(Generic[T]):
    """A mapping from a backend name to a factory, with a clear error for unknown names."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._factories: dict[str, Callable[..., T]] = {}

    def register(self, name: str) -> Callable[[Callable[..., T]], Callable[..., T]]:
        """Decorator registering ``factory`` under ``name``."""

        def decorate(factory: Callable[..., T]) -> Callable[..., T]:
            if name in self._factories:
                raise ValueError(f"{self.kind} backend {name!r} registered twice")
            self._factories[name] = factory
            return factory

        return decorate

    def unregister(self, name: str) -> None:
        """Remove ``name`` (a backend registered for a while, e.g. by a test); unknown names
        raise KeyError."""
        del self._factories[name]

    def names(self) -> list[str]:
        """Registered names, sorted."""
        return sorted(self._factories)

    def create(self, name: str, *args: object, **kwargs: object) -> T:
        """Build the backend called ``name``; unknown names raise InvalidInputError."""
        try:
            factory = self._factories[name]
        except KeyError:
            raise InvalidInputError(
                f"unknown {self.kind} backend {name!r}; choose one of {self.names()}",
                field=self.kind,
            ) from None
        return factory(*args, **kwargs)
