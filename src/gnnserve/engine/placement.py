"""Serving with FAP-placed feature tiers (Quiver §5.1–5.2), placement learned from traffic.

``--tiers ram=256M,disk=1G`` serves the features from a :class:`TieredFeatures`: the rows with
the highest feature access probability (FAP, ``sampling.metrics.fap`` under the default fanouts)
fill the fastest tier first, up to its bytes; the rest stay in the store (a memory map of
``features.bin``). At start the seed distribution p0 is uniform (Quiver's default). With
``--tier-refresh-s S`` a :class:`TierRefresher` counts the seeds the engine serves
(``SeedTraffic``) and, every S seconds when new seeds arrived, recomputes FAP from the learned p0
and swaps a newly placed store in between batches; batches already reading the old store finish
on it (new-node requests keep the first placement: their service holds its store).
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from gnnserve.errors import InvalidInputError
from gnnserve.features.tiered import TIERS, TieredFeatures
from gnnserve.graph.base import GraphStore
from gnnserve.sampling.metrics import fap
from gnnserve.sampling.traffic import SeedTraffic

if TYPE_CHECKING:
    from gnnserve.engine.batcher import Batch
    from gnnserve.engine.engine import Engine

log = logging.getLogger(__name__)
COLD = "remote"  # the unbounded last tier: the store itself
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
_BUDGET = re.compile(r"^\s*(\w+)\s*=\s*([0-9]*\.?[0-9]+)\s*([KMGT]?)i?B?\s*$", re.IGNORECASE)


def parse_tiers(text: str) -> dict[str, float | None]:
    """``"ram=256M,disk=1G"`` -> {"ram": 268435456, "disk": 1073741824, "remote": None}: tier
    budgets in bytes, fastest first, the store itself appended as the unbounded cold tier."""
    budgets: dict[str, float | None] = {}
    for part in text.split(","):
        match = _BUDGET.match(part)
        if match is None:
            raise InvalidInputError(
                f"tier budget {part!r} is not NAME=SIZE (e.g. ram=256M)", "tiers"
            )
        name, number, unit = match.group(1).lower(), float(match.group(2)), match.group(3).upper()
        if name not in TIERS or name == COLD:
            known = [t for t in TIERS if t != COLD]
            raise InvalidInputError(f"unknown tier {name!r}; tiers: {known}", "tiers")
        if name in budgets:
            raise InvalidInputError(f"tier {name!r} given twice", "tiers")
        budgets[name] = number * _UNITS[unit]
    order = [t for t in TIERS if t in budgets]
    if list(budgets) != order:
        raise InvalidInputError(f"tiers must be listed fastest first: {order}", "tiers")
    return {**budgets, COLD: None}


def place(
    store: str,
    graph: GraphStore,
    fanouts: list[int],
    budgets: dict[str, float | None],
    p0: np.ndarray | None = None,
    previous: TieredFeatures | None = None,
) -> TieredFeatures:
    """``store``'s features in tiers filled by FAP (seed distribution ``p0``; None: uniform);
    ``previous``: the placement it replaces (its counters go on, under the next number)."""
    start = time.perf_counter()
    scores = fap(graph, fanouts, p0)
    if previous is None:
        tiered = TieredFeatures.from_scores(store, scores, budgets)
    else:
        number = int(previous.placement) + 1
        tiered = TieredFeatures.from_scores(
            store, scores, budgets, metrics=previous.metrics, placement=number
        )
    sizes = tiered.plan.sizes()
    log.info("placed features by FAP in %.2f s: %s rows", time.perf_counter() - start, sizes)
    return tiered


class TierRefresher:
    """Learns p0 from the engine's batches and re-places its tiers every ``interval_s``."""

    def __init__(self, engine: Engine, budgets: dict[str, float | None], interval_s: float) -> None:
        if not interval_s > 0:
            raise InvalidInputError(f"tier refresh must be > 0 s, got {interval_s}", "tiers")
        self.engine = engine
        self.budgets = budgets
        self.interval_s = float(interval_s)
        self.traffic = SeedTraffic(engine.graph.num_nodes, half_life=1e5)
        self.placements = 0  # stores swapped in so far
        self._placed_at = 0  # seeds seen when the current placement was made
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="gnnserve-tiers", daemon=True)

    def observe(self, batch: Batch) -> None:
        """Engine observer: count the batch's seeds."""
        self.traffic.observe(batch.seeds)

    def start(self) -> TierRefresher:
        """Observe the engine and start the refresh thread (stopped with the engine)."""
        self.engine.observers.append(self.observe)
        self.engine.on_stop.append(self.stop)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop refreshing (the current placement stays)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(30)

    def refresh(self) -> bool:
        """Re-place now if seeds arrived since the last placement; True when it swapped."""
        seen = self.traffic.seen
        if seen == self._placed_at:
            return False
        engine = self.engine
        fanouts = list(engine.planner.default)
        current = engine.features
        tiered = place(
            engine.config.store.path,
            engine.graph,
            fanouts,
            self.budgets,
            self.traffic.distribution(),
            current if isinstance(current, TieredFeatures) else None,
        )
        engine.features = tiered  # the next batch reads the new placement; batches reading
        self._placed_at = seen  # the old one finish on it (it is freed when they drop it)
        self.placements += 1
        return True

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.refresh()
            except Exception:  # noqa: BLE001 - a failed refresh keeps the current placement
                log.exception("feature tier refresh failed; keeping the current placement")


def tier_stats(features: Callable[[], object]) -> Callable[[], bytes]:
    """Exposition text of the current store's tier counters ("" when it is not tiered)."""

    def render() -> bytes:
        store = features()
        if isinstance(store, TieredFeatures):
            from prometheus_client import generate_latest

            return generate_latest(store.metrics.registry)
        return b""

    return render
