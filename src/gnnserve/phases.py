"""Wall time of the named steps of a long piece of work (a deployment's start-up), logged as
each step ends so a user watching the log sees progress."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager


class Phases:
    """``with phases("profile"): ...`` times that step; ``seconds`` maps each step to its wall
    time in s (a step entered twice adds up)."""

    def __init__(self, what: str, log: logging.Logger) -> None:
        self.what, self.log = what, log
        self.seconds: dict[str, float] = {}

    @contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            took = time.perf_counter() - start
            self.seconds[name] = self.seconds.get(name, 0.0) + took
            self.log.info("%s: %s took %.1f s", self.what, name, took)

    def total(self) -> float:
        """Seconds over every step."""
        return sum(self.seconds.values())

    def summary(self) -> str:
        """``12.3 s (a 1.0, b 11.3)``: the total and each step, in order."""
        steps = ", ".join(f"{name} {s:.1f}" for name, s in self.seconds.items())
        return f"{self.total():.1f} s ({steps})"
